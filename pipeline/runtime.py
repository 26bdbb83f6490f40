"""The pipeline runtime (driver side): runs a schedule on real workers.

Each virtual stage is a mesh with its own layouts; stage compute is a user class on
local shards (:class:`reshard.pipeline.stage.StageModule`); activations and gradients
cross meshes through reshard plans, each link (activations s -> s', gradients s' -> s)
on its own communication channel and transfer thread, so transfers overlap compute.
Every device records its compute and transfer events; :meth:`PipelineRuntime.step`
returns them as a :class:`reshard.pipeline.timeline.Timeline` in the simulator's
format.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from reshard.comm.calls import Attach, Invoke
from reshard.core.errors import ReshardError
from reshard.core.layout import Layout
from reshard.pipeline.actions import Action
from reshard.pipeline.errors import ScheduleError
from reshard.pipeline.schedule import Schedule
from reshard.pipeline.stage import StageSpec
from reshard.pipeline.timeline import Timeline, TimelineEvent
from reshard.pipeline.validate import check
from reshard.pipeline.worker import PipelineConfig, grad_key
from reshard.planner.ir import ReshardPlan
from reshard.planner.plan import plan as make_plan
from reshard.planner.values.strategy import Strategy
from reshard.runtime import DArray, Runtime

EXTENSION = "pipeline"


@dataclass(frozen=True)
class StepResult:
    """One iteration.

    Attributes:
        losses: per microbatch, the loss.
        timeline: measured events, times relative to the iteration's start.
        wall: seconds the iteration took, seen from the driver.
    """

    losses: tuple[float, ...]
    timeline: Timeline
    wall: float

    @property
    def loss(self) -> float:
        """Sum of the microbatch losses."""
        return float(sum(self.losses))


class PipelineRuntime:
    """Runs a pipeline schedule on a :class:`reshard.Runtime`'s workers.

    Args:
        runtime: the runtime whose workers run the stages (any backend / launcher).
        stages: one spec per virtual stage (``schedule.num_virtual_stages``); stages on
            one physical stage share its mesh; different physical stages use disjoint
            devices.
        schedule: the schedule (validated here).
        dtype: activation / gradient dtype.
        strategy: the reshard strategy of the cross-mesh transfers.
        name: names the channels and the stage workers' extension: pipelines of other
            names can share a runtime (each steps in turn, not at once).
    """

    def __init__(self, runtime: Runtime, stages: Sequence[StageSpec], schedule: Schedule,
                 dtype: str = "float64",
                 strategy: str | Strategy = Strategy.BROADCAST,
                 name: str = "pipe") -> None:
        check(schedule)
        stages = tuple(stages)
        if len(stages) != schedule.num_virtual_stages:
            raise ScheduleError(
                f"the schedule has {schedule.num_virtual_stages} virtual stages but "
                f"{len(stages)} stage specs were given")
        owner: dict[int, int] = {}
        for v, st in enumerate(stages):
            s, _ = schedule.locate(v)
            for d in st.mesh.devices:
                if owner.setdefault(d, s) != s:
                    raise ScheduleError(
                        f"device {d} is in the meshes of stages {owner[d]} and {s}; each "
                        f"physical stage needs devices of its own")
        for v in range(len(stages) - 1):
            if stages[v].out_shape != stages[v + 1].in_shape:
                raise ScheduleError(
                    f"stage {v} outputs {stages[v].out_shape} but stage {v + 1} takes "
                    f"{stages[v + 1].in_shape}")
        self.rt = runtime
        self.stages = stages
        self.schedule = schedule
        self.dtype = np.dtype(dtype).name
        self.strategy = Strategy.parse(strategy)
        self.name = name
        self.extension = f"{EXTENSION}/{name}"
        self.devices = tuple(sorted(owner))
        self.act_plans: list[ReshardPlan] = []
        self.grad_plans: list[ReshardPlan] = []
        for v in range(len(stages) - 1):
            a, b = stages[v], stages[v + 1]
            self.act_plans.append(make_plan(a.out_shape, self.dtype, a.layout(a.out_spec),
                                            b.layout(b.in_spec), runtime.cluster, self.strategy))
            self.grad_plans.append(make_plan(b.in_shape, self.dtype, b.layout(b.dx_spec),
                                             a.layout(a.out_spec.split("+")[0]),
                                             runtime.cluster, self.strategy))
        self._iteration = 0
        self.params: list[dict[str, DArray]] | None = None

    # ----- set-up --------------------------------------------------------------------
    def _channel(self, v: int, kind: str) -> str:
        """The channel of a boundary's transfers: one per physical link and direction,
        as the schedule's channels are."""
        s, _ = self.schedule.locate(v)
        t, _ = self.schedule.locate(v + 1)
        return f"{self.name}/{kind}/{s}-{t}" if kind == "act" else f"{self.name}/{kind}/{t}-{s}"

    def set_params(self, params: Sequence[dict[str, np.ndarray]]) -> None:
        """Place every stage's parameters (global arrays) and start the stage workers."""
        if len(params) != len(self.stages):
            raise ReshardError(f"{len(params)} parameter sets for {len(self.stages)} stages")
        placed: list[dict[str, DArray]] = []
        for st, values in zip(self.stages, params):
            names = {p.name for p in st.params}
            if set(values) != names:
                raise ReshardError(f"stage parameters {sorted(values)} != {sorted(names)}")
            placed.append({p.name: self.rt.put(np.asarray(values[p.name], dtype=self.dtype),
                                                 st.layout(p.spec)) for p in st.params})
        act = tuple(self.rt.load(p, self._channel(v, "act"))
                    for v, p in enumerate(self.act_plans))
        grad = tuple(self.rt.load(p, self._channel(v, "grad"))
                     for v, p in enumerate(self.grad_plans))
        config = PipelineConfig(
            self.schedule.to_text(), self.stages, act, grad,
            tuple(tuple((n, x.key) for n, x in sorted(ps.items())) for ps in placed),
            self.dtype, self.rt.timeout)
        self.rt.call({d: Attach(self.extension, "reshard.pipeline.worker:StageWorker", (config,))
                      for d in self.devices}, "start pipeline stages")
        self.params = placed

    # ----- one iteration -------------------------------------------------------------
    def step(self, inputs: Sequence[np.ndarray], targets: Sequence[np.ndarray]) -> StepResult:
        """Run one iteration (forward and backward of every microbatch).

        Args:
            inputs: per microbatch, the first stage's input (global array).
            targets: per microbatch, the last stage's target (global array).
        """
        if self.params is None:
            raise ReshardError("call set_params(...) before step(...)")
        m = self.schedule.num_microbatches
        if len(inputs) != m or len(targets) != m:
            raise ReshardError(f"the schedule runs {m} microbatches; got {len(inputs)} "
                               f"inputs and {len(targets)} targets")
        first, last = self.stages[0], self.stages[-1]
        xs = [self.rt.put(np.asarray(x, dtype=self.dtype), first.layout(first.in_spec))
              for x in inputs]
        ts = [self.rt.put(np.asarray(t, dtype=self.dtype), last.layout(last.out_spec))
              for t in targets]
        it = self._iteration
        self._iteration += 1
        t0 = time.monotonic()
        out = self.rt.call(
            {d: Invoke(self.extension, "run", (it, [x.key for x in xs], [t.key for t in ts]))
             for d in self.devices}, f"pipeline iteration {it}")
        wall = time.monotonic() - t0
        self.rt.free(*xs, *ts)
        # one loss part per distinct output box of the last stage (replicas agree)
        boxes = last.layout(last.out_spec).boxes(last.out_shape)
        seen, losses = set(), [0.0] * m
        for d in last.mesh.devices:
            if boxes[d] in seen:
                continue
            seen.add(boxes[d])
            for k, part in out[d]["losses"].items():
                losses[k] += part
        records = [e for d in self.devices for e in out[d]["events"]]
        origin = min((e["start"] for e in records), default=0.0)
        # A receiver's transfer thread starts waiting as soon as its previous transfer
        # is done; draw the receive from when its sender started.
        sent = {(e["stage"], e["action"]): e["start"] for e in records if e["stream"] == "send"}
        events = []
        for e in records:
            start = e["start"]
            if e["stream"] == "recv":
                peer = self.schedule.peer(e["stage"], Action.parse(e["action"]))
                if peer is not None:
                    start = max(start, sent.get((peer[0], str(peer[1])), start))
            events.append(TimelineEvent(e["stage"], e["stream"], e["action"],
                                        start - origin, e["end"] - origin))
        return StepResult(tuple(losses), Timeline(tuple(events), self.schedule.num_stages), wall)

    # ----- gradients and update --------------------------------------------------------
    def _grad_arrays(self) -> list[dict[str, DArray]]:
        return [{p.name: self.rt.adopt(grad_key(v, p.name), p.shape, self.dtype,
                                       st.layout(p.grad_spec))
                 for p in st.params} for v, st in enumerate(self.stages)]

    def gradients(self) -> list[dict[str, np.ndarray]]:
        """The last iteration's accumulated parameter gradients (global arrays)."""
        return [{n: self.rt.get(g) for n, g in gs.items()} for gs in self._grad_arrays()]

    def parameters(self) -> list[dict[str, np.ndarray]]:
        """Current parameter values (global arrays)."""
        if self.params is None:
            raise ReshardError("no parameters yet; call set_params(...)")
        return [{n: self.rt.get(x) for n, x in ps.items()} for ps in self.params]

    def sgd(self, lr: float) -> None:
        """``param -= lr * grad``: each gradient is first resharded (on its stage's mesh)
        into its parameter's layout, e.g. partial sums reduced and replicated."""
        if self.params is None:
            raise ReshardError("no parameters yet; call set_params(...)")
        reduced = []
        moved = []
        for v, gs in enumerate(self._grad_arrays()):
            for name, g in gs.items():
                target: Layout = self.params[v][name].layout
                y = self.rt.reshard(g, target, self.strategy) if g.layout != target else g
                reduced.append((v, name, y.key))
                if y is not g:
                    moved.append(y)
        self.rt.call({d: Invoke(self.extension, "sgd", (lr, reduced)) for d in self.devices},
                     "pipeline update")
        if moved:
            self.rt.free(*moved)
