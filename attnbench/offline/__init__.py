"""Offline installs: wheels for a box with no index, installed there into a prefix.

``make wheelhouse PYTHON_VERSION=3.12`` (:mod:`~attnbench.offline.wheelhouse`) writes ``.whl/``:
attnbench's wheel and what a fresh GPU box lacks (:mod:`~attnbench.offline.box`,
:mod:`~attnbench.offline.closure`), never torch, triton or CUDA's wheels. On the box,
``python3 -m attnbench.offline install --prefix DIR`` (:mod:`~attnbench.offline.install`) puts
them into ``DIR`` with ``pip --no-index --no-deps --target`` and checks that every requirement is
met there; ``PYTHONPATH=DIR`` then adds them in front of the box's own packages. Standard library
only (and ``packaging``, or pip's copy of it): these run before anything else is installed.
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "box": ("BOX_HAS", "BOX_LACKS", "PLATFORMS", "PYTHON_VERSION", "never_carried",
            "target_environment"),
    "closure": ("Pin", "carried"),
    "install": ("install_wheelhouse", "wheels_of"),
    "verify": ("Verdict", "check_environment"),
    "wheelhouse": ("build",),
})
