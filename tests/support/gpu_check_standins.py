"""Stand-ins for the gpu-check tests: a warm module (``variants`` / ``compile_variant``, the
compile lane's contract) that checks what it is given, and steps that hang or do nothing.

Imports neither torch nor triton: a stand-in compile process starts in a tenth of a second, so
a test can tell parallel compiles from serial ones by the wall time.
"""

import json
import os
import subprocess
import sys
import time

COMPILE_S = 1.0
"""What one stand-in variant takes to "compile"."""
HANG = "ATTNBENCH_TEST_HANG_VARIANT"
"""Names a variant whose compile never ends."""
PIDS = "ATTNBENCH_TEST_PIDS"
"""Where the hanging step writes its own pid and its child's."""
FAIL = "ATTNBENCH_TEST_FAIL_VARIANT"
"""Names a variant whose compile raises."""
REHEARSE = "ATTNBENCH_TEST_REHEARSE"
"""Set: the stand-in compiles nothing (the pre-warm rehearses, several variants a process)."""
CONTRACT_KEYS = {"kernels", "dtype", "head_dim", "mask", "config_mode"}


# -- the warm module ---------------------------------------------------------------------------

def variants(cases):
    """One variant per (dtype, mask, decode, packed) of the triton cases, as JSON-able dicts."""
    cases = list(cases)
    assert cases and all(c.backend == "triton" for c in cases), "variants() gets triton cases"
    found = {}
    for c in cases:
        key = (c.dtype, c.mask, c.decode, c.is_packed)
        found.setdefault(key, {
            "name": f"{c.dtype} {c.mask}{' decode' if c.decode else ''}"
                    f"{' packed' if c.is_packed else ''}",
            "kernels": ["decode_split", "decode_merge"] if c.decode else ["forward"],
            "dtype": c.dtype, "head_dim": c.head_dim, "mask": c.mask,
            "config_mode": os.environ.get("ATTNBENCH_KERNEL_CONFIGS", "autotune")})
    return list(found.values())


def compiles_here():
    return not os.environ.get(REHEARSE)


def compile_variant(variant):
    """Checks the contract's argument (a dict as variants() made it, JSON round-tripped),
    "compiles" for COMPILE_S, or forever for the variant named by HANG."""
    assert isinstance(variant, dict) and CONTRACT_KEYS <= set(variant), variant
    json.dumps(variant)
    if variant["name"] == os.environ.get(HANG):
        time.sleep(3600)
    if variant["name"] == os.environ.get(FAIL):
        raise RuntimeError("a stand-in launch that fails")
    began = time.time()
    time.sleep(COMPILE_S)
    return {"variant": variant, "seconds": COMPILE_S, "kernels": len(variant["kernels"]),
            "began": began, "ended": time.time(),
            "configs": {k: {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
                        for k in variant["kernels"]}}


# -- steps ---------------------------------------------------------------------------------------

def hang(config):
    """A step that never ends, with a child of its own (both must die at the timeout)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(os.environ[PIDS], "w") as out:  # outside the result folder: it counts files
        out.write(f"{os.getpid()} {child.pid}")
    print("hanging", flush=True)
    time.sleep(3600)


def noop(config):
    print(f"noop step in {config.folder}", flush=True)


def fail(config):
    raise RuntimeError("a stand-in step that fails")
