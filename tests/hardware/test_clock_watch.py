"""Per-case clocks from NVML (issue 43 item 6): the window's SM clock, throttle reasons,
violation time and energy, read at its ends; nothing where NVML is absent."""

from types import SimpleNamespace

from attnbench.hardware.clock_watch import ClockWatch, reason_names, watch_for
from attnbench.results.schema import check_record
from helpers import simulated_record
from attnbench.sweep.case import make_case


class ThrottlingNvml:
    """A pynvml stand-in for one card that hits its power cap after the first reading."""

    NVMLError = RuntimeError

    def __init__(self, old_driver: bool = False, energy: bool = True):
        self.readings = 0
        self.open = 0
        if old_driver:  # before 535: the bitmask under its old name
            self.nvmlDeviceGetCurrentClocksThrottleReasons = self._reasons
        else:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._reasons
        if not energy:
            self.nvmlDeviceGetTotalEnergyConsumption = self._unsupported

    def nvmlInit(self):
        self.open += 1

    def nvmlShutdown(self):
        self.open -= 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return "h0"

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return 1980

    def nvmlDeviceGetClockInfo(self, handle, clock):
        self.readings += 1
        return 1980 if self.readings == 1 else 1605

    def _reasons(self, handle):
        return 0x1 if self.readings <= 1 else 0x4 | 0x2  # idle, then power cap (+ app clocks)

    def nvmlDeviceGetViolationStatus(self, handle, policy):
        ns = {0: 0, 1: 0} if self.readings <= 1 else {0: 12_500_000, 1: 0}
        return SimpleNamespace(referenceTime=0, violationTime=ns[policy])

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return 1_000_000 if self.readings <= 1 else 1_003_100

    def _unsupported(self, handle):
        raise RuntimeError("Not Supported")


def test_a_window_that_hit_the_power_cap_says_so(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = ThrottlingNvml()
    watch = ClockWatch(0, nvml=nvml)
    start = watch.read()
    window = watch.window(start, watch.read())
    assert window == {"sm_mhz": [1980, 1605], "sm_mhz_max": 1980, "reasons": "sw_power_cap",
                      "power_violation_ms": 12.5, "thermal_violation_ms": 0.0,
                      "energy_j": 3.1, "throttled": True}
    watch.close()
    assert nvml.open == 0


def test_an_old_driver_and_a_missing_counter_leave_fields_out(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    watch = ClockWatch(0, nvml=ThrottlingNvml(old_driver=True, energy=False))
    window = watch.window(watch.read(), watch.read())
    assert window["reasons"] == "sw_power_cap" and "energy_j" not in window


def test_a_quiet_window_is_not_throttled(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    watch = ClockWatch(0, nvml=ThrottlingNvml())
    first = watch.read()
    assert watch.window(first, first)["throttled"] is False  # idle is not a slowdown


def test_without_nvml_there_is_no_clocks_section():
    class NoDriver:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")
    watch = ClockWatch(0, nvml=NoDriver())
    assert not watch.available and watch.read() == {} and watch.window({}, {}) is None
    assert watch_for(SimpleNamespace(type="cpu", index=None)) is None


def test_reason_names_keep_unknown_bits():
    assert reason_names(0x1 | 0x2) == []
    assert reason_names(0x8 | 0x40 | 0x1000) == ["hw_slowdown", "hw_thermal_slowdown", "0x1000"]


def test_a_record_with_clocks_passes_the_schema(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    watch = ClockWatch(0, nvml=ThrottlingNvml())
    rec = simulated_record(make_case("t", {"backend": "sdpa"}), "timed")
    rec["timing"] = {"clock": "cuda_events", "mode": "eager",
                     "fwd": {"median_ms": 1.0, "n": 5},
                     "clocks_fwd": watch.window(watch.read(), watch.read())}
    assert check_record("r:1: ", rec) is rec
    rec["timing"]["clocks_fwd"]["sm_mhz"] = "fast"
    try:
        check_record("r:1: ", rec)
    except Exception as exc:  # RunDirError naming the field
        assert "clocks_fwd" in str(exc) and "sm_mhz" in str(exc), exc
    else:
        raise AssertionError("a clocks section of the wrong kind passed the schema")
