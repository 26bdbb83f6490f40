"""Pipeline schedules for cross-mesh resharding: write, validate, simulate, compare.

A :class:`Schedule` lists, per stage, the :class:`Action` values it runs: forwards,
backwards (whole, or split into input and weight grads) and the sends and receives
of activations and gradients between stages. :data:`SCHEDULES` ships GPipe, 1F1B,
eager 1F1B (the overlapping-friendly schedule of Zhuang et al., MLSys 2023),
interleaved 1F1B and ZB-H1; users write their own as text. :func:`validate` finds
missing, duplicated or misordered actions and deadlocks; :func:`simulate` predicts a
:class:`Timeline` from :class:`PipelineCosts` with transfers on their own streams;
:func:`compare_schedules` tabulates schedules side by side; :class:`PipelineRuntime`
runs a schedule on real workers with the cross-mesh transfers on their own threads.
"""

from reshard.pipeline.actions import Action, ActionKind
from reshard.pipeline.compare import compare_schedules, format_table
from reshard.pipeline.costs import CostSpec, PipelineCosts, SupportsEstimate, plan_times
from reshard.pipeline.errors import ScheduleError
from reshard.pipeline.generators import (
    SCHEDULES,
    dualpipe_v,
    eager_one_f_one_b,
    gpipe,
    interleaved_one_f_one_b,
    make_schedule,
    one_f_one_b,
    zero_bubble_h1,
    zero_bubble_v,
)
from reshard.pipeline.runtime import PipelineRuntime, StepResult
from reshard.pipeline.schedule import Channel, Schedule
from reshard.pipeline.simulator import simulate
from reshard.pipeline.stage import ParamSpec, StageModule, StageSpec
from reshard.pipeline.timeline import Stream, Timeline, TimelineEvent
from reshard.pipeline.validate import Problem, ProblemKind, check, format_problems, validate

__all__ = [
    "SCHEDULES",
    "Action",
    "ActionKind",
    "Channel",
    "CostSpec",
    "ParamSpec",
    "PipelineCosts",
    "PipelineRuntime",
    "Problem",
    "ProblemKind",
    "Schedule",
    "ScheduleError",
    "StageModule",
    "StageSpec",
    "StepResult",
    "Stream",
    "SupportsEstimate",
    "Timeline",
    "TimelineEvent",
    "check",
    "compare_schedules",
    "dualpipe_v",
    "eager_one_f_one_b",
    "format_problems",
    "format_table",
    "gpipe",
    "interleaved_one_f_one_b",
    "make_schedule",
    "one_f_one_b",
    "plan_times",
    "simulate",
    "validate",
    "zero_bubble_h1",
    "zero_bubble_v",
]
