"""reshard: cross-mesh resharding for distributed deep learning.

Plan a tensor's transfer from one device mesh and sharding to another as a
many-to-many multicast, emit broadcast-based plans (with send/recv and
scatter+all-gather baselines), execute them on NCCL / gloo / a local reference
backend, and schedule them inside a pipeline.
"""

from reshard.cluster import PRESETS, Cluster, LinkFigures, preset_names
from reshard.errors import (
    ClusterError,
    DTypeError,
    ExecutionError,
    MeshError,
    PartialError,
    PlanError,
    ReshardError,
    ShapeError,
    SpecError,
    StrategyError,
)
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.spec import Partial, Replicate, Shard, ShardingSpec
from reshard.planner.ir import ReshardPlan, Task, TaskKind, TensorSpec
from reshard.planner.plan import plan, plan_many
from reshard.planner.strategy import Strategy

__version__ = "0.1.0"

__all__ = [
    "PRESETS", "Cluster", "LinkFigures", "preset_names",
    "ClusterError", "DTypeError", "ExecutionError", "MeshError", "PartialError", "PlanError",
    "ReshardError", "ShapeError", "SpecError", "StrategyError",
    "Layout", "DeviceMesh", "Partial", "Replicate", "Shard", "ShardingSpec",
    "ReshardPlan", "Task", "TaskKind", "TensorSpec", "Strategy", "plan", "plan_many",
    "Runtime",
]


def __getattr__(name: str):
    # Runtime pulls in the data plane; import it only when asked for.
    if name == "Runtime":
        from reshard.runtime import Runtime

        return Runtime
    raise AttributeError(f"module 'reshard' has no attribute {name!r}")
