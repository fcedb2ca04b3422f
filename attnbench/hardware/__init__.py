"""Exact hardware identity and software environment, for every record and manifest.

- ``identity``: ``DeviceIdentity``, the facts about one device (``cpu_identity`` for CPUs).
- ``nvml``: reads them through NVML (``nvidia-ml-py``, optional) without starting CUDA.
- ``nvml_replay``: records NVML's answers on a GPU machine; replays them in tests.
- ``clock_watch``: ``ClockWatch``, NVML's clocks and throttle reasons around a timed window.
- ``kinds``: ``gpu_kind`` / ``kind_from_name`` -> ``GpuKind(kind, family)``, the exact SKU.
- ``peaks``: datasheet dense TFLOP/s per kind and dtype, and memory bandwidth.
- ``matmul_peak``: the worker's own measured matmul peak.
- ``software``: versions, git commit, backend fingerprints, environment differences.
- ``device``: the device a rank process runs cases on (imports torch: rank side only).

Nothing here starts CUDA or measures anything on import.
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "clock_watch": ("ClockWatch", "NOT_THROTTLING", "REASONS", "reason_names", "watch_for"),
    "device": ("backend_env", "device_env", "device_peaks", "interpreter_on_gpu", "peak_memory",
               "pick_device", "release_memory", "sync"),
    "identity": ("DeviceIdentity", "cpu_identity", "host_env"),
    "kinds": ("CPU_KIND", "GpuKind", "KINDS", "KIND_PATTERN", "gpu_kind", "kind_from_name"),
    "matmul_peak": ("measure_matmul_peak",),
    "nvml": ("read_driver", "read_identities", "read_identity"),
    "nvml_replay": ("NVML_ERROR_LIBRARY_NOT_FOUND", "ReplayNvml", "torch_properties"),
    "peaks": ("DTYPES", "PEAKS", "normalize_dtype", "peak_bandwidth_gbs", "peak_tflops"),
    "software": ("backend_fingerprint", "distribution_version", "environment_differences",
                 "git_state", "software_environment"),
})
