"""Package list for setuptools; everything else is in pyproject.toml.

The Triton kernels live in the top-level ``kernels/`` folder (the project's layout) but install as
``attnbench.kernels``: PyPI's ``kernels`` is Hugging Face's package, and nothing here may install
a top-level package of that name. ``find_packages`` keeps new subpackages of attnbench/ in the
list without anyone having to add them (pyproject.toml can map a folder or search, not both).
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["attnbench", "attnbench.*"]) + ["attnbench.kernels"],
    package_dir={"attnbench.kernels": "kernels"},
)
