"""The ETA from measured case times per (backend, GPU kind) (issue 40, item 4): the old
``left / (done / elapsed)`` counted the cluster's start and the first compiles against every
case left (first ETAs of 677 s, 1080 s, 4298 s for runs of 28 s, 35 s, 362 s)."""

from __future__ import annotations

import pytest

from attnbench.dispatch.eta import CaseTimes
from attnbench.sweep.case import Case


def _record(case: Case, seconds) -> dict:
    return {"case": case.to_dict(), "duration_s": seconds, "verdict": "pass"}


FLEX = [Case(backend="flex", seed=s) for s in range(4)]
SDPA = [Case(backend="sdpa", seed=s) for s in range(20)]


def test_no_eta_before_a_case_is_measured():
    times = CaseTimes()
    times.plan(FLEX)
    assert times.eta_s(slots=2) is None  # shown as "ETA ?", not a guess
    times.finished({"case": FLEX[0].to_dict(), "verdict": "skipped"})  # took no time
    assert times.eta_s(slots=2) is None


def test_each_backend_is_estimated_from_its_own_cases():
    times = CaseTimes()
    times.plan(FLEX + SDPA)
    times.finished(_record(FLEX[0], 60.0))  # a compile
    times.finished(_record(SDPA[0], 0.5))
    # 3 flex left x 60 s + 19 sdpa x 0.5 s, over 2 devices. The old rate (2 cases in, say, 70 s
    # elapsed) said 22 x 35 = 770 s; a single mean over both backends says 22 x 30.25 / 2.
    assert times.eta_s(slots=2) == pytest.approx((3 * 60.0 + 19 * 0.5) / 2)


def test_a_key_not_measured_yet_takes_the_mean_of_every_case():
    times = CaseTimes()
    times.plan(FLEX[:2] + SDPA[:2])
    times.finished(_record(SDPA[0], 1.0))
    times.finished(_record(SDPA[1], 3.0))
    assert times.mean_s(("flex", "any")) == pytest.approx(2.0)
    assert times.eta_s(slots=1) == pytest.approx(4.0)


def test_fewer_cases_left_than_devices_run_no_faster_than_one_each():
    times = CaseTimes()
    times.plan(SDPA[:2])
    times.finished(_record(SDPA[0], 10.0))
    assert times.eta_s(slots=8) == pytest.approx(10.0)  # one case left: 10 s, not 10 / 8
    times.finished(_record(SDPA[1], 10.0))
    assert times.eta_s(slots=8) == 0.0


def test_gpu_kinds_are_apart():
    h100, cpu = Case(backend="triton", gpu="H100"), Case(backend="triton", gpu="cpu")
    times = CaseTimes()
    times.plan([h100, h100.replace(seed=1), cpu, cpu.replace(seed=1)])
    times.finished(_record(h100, 0.1))
    times.finished(_record(cpu, 30.0))
    assert times.eta_s(slots=2) == pytest.approx((0.1 + 30.0) / 2)
