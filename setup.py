"""Packaging for reshard.

One distribution, ``reshard``. The top-level folders planner/, comm/, pipeline/
and microbench/ install as subpackages of ``reshard`` (``reshard.planner`` ...)
through ``package_dir``; none of them installs as a top-level package (a
top-level ``comm`` would shadow Jupyter's ``comm``).
"""

from setuptools import setup

SUBPACKAGES = ("planner", "comm", "pipeline", "microbench")

package_dir = {"reshard": "reshard"}
package_dir.update({f"reshard.{name}": name for name in SUBPACKAGES})

packages = [
    "reshard",
    "reshard.service",
    "reshard.adapters",
    *(f"reshard.{name}" for name in SUBPACKAGES),
    "reshard.comm.backends",
    "reshard.comm.launchers",
    "reshard.pipeline.examples",
    "reshard.microbench.suites",
]

setup(
    name="reshard",
    version="0.1.0",
    description="Cross-mesh resharding: plan, execute and schedule tensor transfers between device meshes",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    package_dir=package_dir,
    packages=packages,
    package_data={"reshard.service": ["*.proto"]},
    install_requires=[
        "numpy>=1.24",
        "ray>=2.9",
        "grpcio>=1.60",
        "protobuf>=4.25",
    ],
    extras_require={
        "gloo": ["torch>=2.1"],
        "cuda12": ["cupy-cuda12x>=13", "nvidia-nccl-cu12"],
        "cuda13": ["cupy-cuda13x>=13.6", "nvidia-nccl-cu13"],
        "plot": ["matplotlib>=3.7"],
        "test": ["pytest>=7", "hypothesis>=6.80", "pytest-timeout>=2.2"],
    },
    entry_points={
        "console_scripts": [
            "reshard-bench=reshard.microbench.cli:main",
            "reshard=reshard.cli:main",
        ],
    },
)
