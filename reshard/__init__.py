"""reshard: cross-mesh resharding for distributed deep learning.

Plan a tensor's transfer from one device mesh and sharding to another as a
many-to-many multicast, emit broadcast-based plans (with send/recv and
scatter+all-gather baselines), execute them on NCCL / gloo / a local reference
backend, and schedule them inside a pipeline.
"""

from reshard.cluster import Cluster
from reshard.errors import (
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
from reshard.layout import Layout
from reshard.lazy import lazy_attributes
from reshard.mesh import DeviceMesh
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
from reshard.presets import PRESETS, LinkFigures, preset_names
from reshard.spec import Partial, Replicate, Shard, ShardingSpec
from reshard.version import __version__ as __version__

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
