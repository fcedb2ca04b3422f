"""Exact hardware identity and software environment, for every record and manifest.

- ``identity``: ``DeviceIdentity``, the facts about one device (``cpu_identity`` for CPUs).
- ``nvml``: reads them through NVML (``nvidia-ml-py``, optional) without starting CUDA.
- ``nvml_replay``: records NVML's answers on a GPU machine; replays them in tests.
- ``kinds``: ``gpu_kind`` / ``kind_from_name`` -> ``GpuKind(kind, family)``, the exact SKU.
- ``peaks``: datasheet dense TFLOP/s per kind and dtype, and memory bandwidth.
- ``matmul_peak``: the worker's own measured matmul peak.
- ``software``: versions, git commit, backend fingerprints, environment differences.

Nothing here starts CUDA or measures anything on import.
"""

from attnbench.hardware.identity import DeviceIdentity, cpu_identity
from attnbench.hardware.kinds import (CPU_KIND, KIND_PATTERN, KINDS, GpuKind, gpu_kind,
                                      kind_from_name)
from attnbench.hardware.matmul_peak import measure_matmul_peak
from attnbench.hardware.nvml import read_driver, read_identities, read_identity
from attnbench.hardware.peaks import PEAKS, peak_bandwidth_gbs, peak_tflops
from attnbench.hardware.software import (backend_fingerprint, environment_differences,
                                         git_state, software_environment)

__all__ = [
    "CPU_KIND", "KINDS", "KIND_PATTERN", "PEAKS", "DeviceIdentity", "GpuKind",
    "backend_fingerprint", "cpu_identity", "environment_differences", "git_state", "gpu_kind",
    "kind_from_name", "measure_matmul_peak", "peak_bandwidth_gbs", "peak_tflops",
    "read_driver", "read_identities", "read_identity", "software_environment",
]
