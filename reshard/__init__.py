"""reshard: cross-mesh resharding for distributed deep learning.

Plan a tensor's transfer from one device mesh and sharding to another as a
many-to-many multicast, emit broadcast-based plans (with send/recv and
scatter+all-gather baselines), execute them on NCCL / gloo / a local reference
backend, and schedule them inside a pipeline.
"""

import os

# The core layer lives in core/ and its modules keep their short paths (reshard.errors
# is reshard.core.errors): the modules in _moved/ answer them. Listed before anything
# below imports a planner module, which imports the core by its short paths.
__path__.append(os.path.join(os.path.dirname(__file__), "_moved"))

from reshard.core.cluster import Cluster
from reshard.core.errors import (
    ClusterError,
    DTypeError,
    ExecutionError,
    MeshError,
    MissingDependencyError,
    OptionError,
    PartialError,
    PlanError,
    ReshardBaseError,
    ReshardError,
    SearchError,
    ShapeError,
    SpecError,
    StrategyError,
)
from reshard.core.layout import Layout
from reshard.core.lazy import lazy_attributes
from reshard.core.mesh import DeviceMesh
from reshard.core.presets import PRESETS, LinkFigures, preset_names
from reshard.core.spec import Partial, Replicate, Shard, ShardingSpec
from reshard.core.version import __version__ as __version__
from reshard.planner.estimates import (
    CostCache,
    EstimateError,
    estimate,
    estimate_iter,
    estimate_many,
)
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import plan, plan_many
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import Task, TaskKind, TensorSpec

__all__ = [
    "PRESETS",
    "Cluster",
    "ClusterError",
    "CostCache",
    "DTypeError",
    "DeviceMesh",
    "EstimateError",
    "ExecutionError",
    "Executor",
    "Layout",
    "LinkFigures",
    "MeshError",
    "MissingDependencyError",
    "OptionError",
    "Partial",
    "PartialError",
    "PlanError",
    "Replicate",
    "ReshardBaseError",
    "ReshardError",
    "ReshardPlan",
    "Runtime",
    "SearchError",
    "ShapeError",
    "Shard",
    "ShardingSpec",
    "SpecError",
    "Strategy",
    "StrategyError",
    "Task",
    "TaskKind",
    "TensorSpec",
    "WorkerProgram",
    "builtin_backends",
    "estimate",
    "estimate_iter",
    "estimate_many",
    "plan",
    "plan_many",
    "preset_names",
    "register_backend",
]

# Names that pull in the data plane, imported only when asked for: name -> module.
_LAZY = {
    "Runtime": "reshard.runtime",
    "Executor": "reshard.comm.executor",
    "WorkerProgram": "reshard.comm.program",
    "register_backend": "reshard.comm.backend",
    "builtin_backends": "reshard.comm.backend",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
