"""Packaging for reshard.

One distribution, ``reshard``. The top-level folders planner/, comm/, pipeline/
and microbench/ install as subpackages of ``reshard`` (``reshard.planner`` ...)
through ``package_dir``; none of them installs as a top-level package (a
top-level ``comm`` would shadow Jupyter's ``comm``).
"""

import os
import pathlib

from setuptools import setup

SUBPACKAGES = ("planner", "comm", "pipeline", "microbench")


def _packages(root: str, name: str) -> list[str]:
    """``name`` and every folder below ``root`` that holds an ``__init__.py``."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        if "__init__.py" in files:
            rel = os.path.relpath(folder, root)
            found.append(name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}")
    return found


package_dir = {"reshard": "reshard"}
package_dir.update({f"reshard.{sub}": sub for sub in SUBPACKAGES})
packages = _packages("reshard", "reshard")
for sub in SUBPACKAGES:
    packages += _packages(sub, f"reshard.{sub}")

setup(
    name="reshard",
    version="0.1.0",
    description="Cross-mesh resharding: plan, execute and schedule tensor transfers between device meshes",
    long_description=pathlib.Path("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",  # tomllib, typing.Self (tests/unit/test_python_requires.py)
    package_dir=package_dir,
    packages=packages,
    package_data={"reshard": ["py.typed", "*.pyi", "core/presets.toml", "service/v1/*.proto", "service/v1/*.pyi"]},
    # What a compiler using only the planner (or the service) needs; the data plane's
    # heavy parts are extras.
    install_requires=[
        "numpy>=1.24",
        # bfloat16 and the float8 kinds as numpy dtypes (what JAX uses): reshard.dtypes
        "ml_dtypes>=0.5",
        # floors of the checked-in stubs' version guard (reshard/service/v1): newer
        # generated code is refused by an older protobuf / grpcio runtime
        "grpcio>=1.85.1",
        "protobuf>=7.35.1,<8",
        "grpcio-health-checking>=1.85.1",
    ],
    extras_require={
        "ray": ["ray>=2.52"],  # token authentication (the testbed's RayCluster)
        "gloo": ["torch>=2.1"],
        # NVIDIA's transfer library (the nixl backend): host memory over UCX, no GPU needed
        "nixl": ["nixl>=1.5.1"],
        "cuda12": ["cupy-cuda12x>=13", "nvidia-nccl-cu12"],
        "cuda13": ["cupy-cuda13x>=13.6", "nvidia-nccl-cu13"],
        "plot": ["matplotlib>=3.7"],
        "bench": ["tqdm>=4.66"],
        "docs": ["mkdocs>=1.6", "mkdocstrings[python]>=0.26"],
        "jax": ["jax[cpu]>=0.10.2"],
        # what the tests run with; the README's test command adds dev (its lint, type
        # and stub tests skip without it)
        "test": ["pytest>=7", "hypothesis>=6.80", "pytest-timeout>=2.2", "torchao>=0.18"],
        # lint, type-check, protobuf stub generation
        "dev": ["ruff>=0.17", "mypy>=2.4", "grpcio-tools>=1.85.1"],
    },
    entry_points={
        "console_scripts": [
            "reshard-bench=reshard.microbench.cli:main",
            "reshard=reshard.cli:main",
        ],
    },
)
