"""torch.distributed.pipelining's own schedules, converted into reshard's schedule IR.

torch computes every rank's compute order in its schedule classes
(``Schedule1F1B._get_pipeline_order``, ``_calculate_single_rank_operations`` of
``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV``). Those methods read only the
rank count and the microbatch count, so they run here on instances built without
stages or a process group (torch is imported when a function is called). Each rank's
compute actions become a stage program (torch's stage index is the virtual stage:
its chunk follows reshard's placement, V for the V schedules); idle slots and
gradient reductions are dropped; an overlapped forward + backward runs as the forward,
then the backward, as reshard's :func:`~reshard.pipeline.generators.dualpipe_v` does.
Then the boundary transfers are written out as for reshard's own schedules, so both
validate and simulate alike (:func:`compare_with_torch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reshard.pipeline.actions import Action, ActionKind
from reshard.pipeline.costs import PipelineCosts
from reshard.pipeline.errors import ScheduleError
from reshard.pipeline.generators import make_schedule
from reshard.pipeline.programs import with_transfers
from reshard.pipeline.schedule import Schedule
from reshard.pipeline.simulator import simulate

TORCH_SCHEDULES = {"zb-v": ("ScheduleZBVZeroBubble", 2),
                   "dualpipe-v": ("ScheduleDualPipeV", 2), "1f1b": ("Schedule1F1B", 1)}
"""reshard's schedule name -> (torch's class, chunks per stage). torch 2.13's
``Schedule1F1B._get_pipeline_order`` (its IR form, which its own execution does not
use) gives the last rank forwards 1..n_mb instead of 0..n_mb-1: reshard's validator
refuses it, so 1f1b is left out of :func:`compare_with_torch` by default."""

_KINDS = {"F": ActionKind.FORWARD, "B": ActionKind.BACKWARD,
          "I": ActionKind.BACKWARD_INPUT, "W": ActionKind.BACKWARD_WEIGHT}


def torch_order(name: str, n_stages: int, n_mb: int) -> dict[int, list[Any]]:
    """torch's per-rank compute order for the schedule reshard calls ``name``."""
    from torch.distributed.pipelining import schedules

    if name not in TORCH_SCHEDULES:
        raise ScheduleError(f"no torch counterpart of {name!r}; known: "
                            f"{', '.join(TORCH_SCHEDULES)}")
    cls_name, chunks = TORCH_SCHEDULES[name]
    cls = getattr(schedules, cls_name)
    obj = cls.__new__(cls)
    obj._n_microbatches = n_mb
    obj._num_stages = n_stages * chunks
    obj.num_stages = n_stages * chunks
    obj.pp_group_size = n_stages
    if chunks == 1:
        return dict(obj._get_pipeline_order())
    return {rank: obj._calculate_single_rank_operations(rank) for rank in range(n_stages)}


def torch_schedule(name: str, n_stages: int, n_mb: int) -> Schedule:
    """torch's schedule ``name`` (a key of :data:`TORCH_SCHEDULES`) in reshard's IR."""
    _, chunks = TORCH_SCHEDULES.get(name, ("", 1))
    placement = "v" if chunks == 2 else "interleaved"
    shape = Schedule.layout(n_stages, chunks, placement)
    programs: list[list[Action]] = []
    for rank, actions in sorted(torch_order(name, n_stages, n_mb).items()):
        program = []
        for a in actions:
            if a is None:
                continue
            for part in (a.sub_actions or (a,)):
                kind = _KINDS.get(str(part.computation_type.value))
                if kind is None:
                    continue  # communication, resharding, gradient reduction
                stage, chunk = shape.locate(part.stage_index)
                if stage != rank:
                    raise ScheduleError(f"torch's {name} runs virtual stage "
                                        f"{part.stage_index} on rank {rank}, but reshard's "
                                        f"{placement} placement puts it on stage {stage}")
                program.append(Action(kind, part.microbatch_index, chunk))
        programs.append(program)
    return with_transfers(programs, n_mb, chunks, placement)


def compare_with_torch(n_stages: int, n_mb: int, fwd: float, bwd: float,
                       transfers: Sequence[float],
                       names: Sequence[str] = ("zb-v", "dualpipe-v")) -> list[dict[str, Any]]:
    """reshard's and torch's schedule of each name, simulated on the same costs: every
    stage ``fwd`` per forward and ``bwd`` per backward (I and W halves), a chunk of a V
    schedule half of that, each boundary transfer ``transfer`` (one row per name,
    source and transfer time)."""
    rows = []
    for transfer in transfers:
        for name in names:
            chunks = TORCH_SCHEDULES[name][1]
            costs = PipelineCosts(forward=fwd / chunks, backward=bwd / chunks,
                                  activation_transfer=transfer)
            # reshard's zb-v is built for the transfer (units of a chunk's forward)
            options = {"transfer": transfer / (fwd / chunks)} if name == "zb-v" else {}
            ours = make_schedule(name, n_stages, n_mb, **options)
            for source, schedule in (("reshard", ours),
                                     ("torch", torch_schedule(name, n_stages, n_mb))):
                timeline = simulate(schedule, costs)
                rows.append({"transfer": transfer, "schedule": name, "source": source,
                             "iteration_time": timeline.iteration_time,
                             "bubble_fraction": timeline.mean_bubble_fraction,
                             "peak_activations": max(timeline.peak_activations) / chunks})
    return rows


__all__ = ["TORCH_SCHEDULES", "compare_with_torch", "torch_order", "torch_schedule"]
