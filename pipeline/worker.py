"""The worker side of the pipeline runtime: one device's part of a schedule.

A :class:`StageWorker` is attached to a :class:`reshard.comm.worker.DeviceWorker` in
the worker process. :meth:`StageWorker.run` executes the device's stage program for
one iteration on the compute thread (the calling thread) while one transfer thread
per channel (activations s -> s', gradients s' -> s) runs the reshard plans of that
channel in the order the sender issues them. Sends only hand work to the transfer
thread; receives wait for it. Every channel has its own communication context, so
transfers of different channels run concurrently with each other and with compute.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reshard.comm.worker import DeviceWorker
from reshard.core.errors import ExecutionError
from reshard.pipeline.actions import Action, ActionKind
from reshard.pipeline.schedule import Channel, Schedule
from reshard.pipeline.stage import StageSpec


@dataclass(frozen=True)
class PipelineConfig:
    """What every worker needs to run its part (sent once, pickled).

    Attributes:
        schedule_text: the schedule's text form.
        stages: one spec per virtual stage.
        act_plans: plan id of the activation transfer across each boundary.
        grad_plans: plan id of the gradient transfer across each boundary.
        param_keys: per virtual stage, parameter name -> array key.
        dtype: activation dtype.
        timeout: seconds a receive may wait.
    """

    schedule_text: str
    stages: tuple[StageSpec, ...]
    act_plans: tuple[int, ...]
    grad_plans: tuple[int, ...]
    param_keys: tuple[tuple[tuple[str, str], ...], ...]
    dtype: str
    timeout: float


def act_key(it: int, v: int, k: int) -> str:
    """Key of the input activation of virtual stage ``v``, microbatch ``k``."""
    return f"pp{it}/act/{v}/{k}"


def out_key(it: int, v: int, k: int) -> str:
    """Key of the output activation of virtual stage ``v``."""
    return f"pp{it}/out/{v}/{k}"


def dy_key(it: int, v: int, k: int) -> str:
    """Key of the gradient w.r.t. the output of virtual stage ``v``."""
    return f"pp{it}/dy/{v}/{k}"


def dx_key(it: int, v: int, k: int) -> str:
    """Key of the gradient w.r.t. the input of virtual stage ``v``."""
    return f"pp{it}/dx/{v}/{k}"


def grad_key(v: int, name: str) -> str:
    """Key of the accumulated gradient of parameter ``name`` of virtual stage ``v``."""
    return f"pp/grad/{v}/{name}"


@dataclass
class _Flags:
    """Events between the compute thread and the transfer threads of one iteration."""

    events: dict[str, threading.Event] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    error: list[BaseException] = field(default_factory=list)

    def get(self, key: str) -> threading.Event:
        with self.lock:
            ev = self.events.get(key)
            if ev is None:
                ev = self.events[key] = threading.Event()
            return ev

    def wait(self, key: str, timeout: float, what: str) -> None:
        ev = self.get(key)
        deadline = time.monotonic() + timeout
        while not ev.wait(0.05):
            if self.error:
                raise ExecutionError(f"{what}: a transfer failed: {self.error[0]}")
            if time.monotonic() > deadline:
                raise ExecutionError(f"{what}: nothing arrived within {timeout:g}s")


class StageWorker:
    """Runs one device's stage program.

    Args:
        worker: the device's worker (arrays, loaded plans, backend).
        config: the pipeline description.
    """

    def __init__(self, worker: DeviceWorker, config: PipelineConfig) -> None:
        self.worker = worker
        self.config = config
        self.schedule = Schedule.from_text(config.schedule_text)
        d = worker.device
        self.vstages = [v for v, st in enumerate(config.stages) if d in st.mesh.devices]
        self.stage = None
        if self.vstages:
            self.stage = self.schedule.locate(self.vstages[0])[0]
        self.modules = {v: config.stages[v].build() for v in self.vstages}
        self.keys = {v: dict(config.param_keys[v]) for v in self.vstages}
        self.reporter = {v: config.stages[v].mesh.devices[0] == d for v in self.vstages}

    # ----- helpers -------------------------------------------------------------------
    def _params(self, v: int) -> dict[str, np.ndarray]:
        return {n: self.worker.arrays[k] for n, k in self.keys[v].items()}

    def _channel_items(self, channel: Channel) -> list[tuple[int, int, ActionKind]]:
        """(boundary, microbatch, send kind) in the order the sender issues them."""
        items = []
        for a in self.schedule.stages[channel.src]:
            if a.kind is channel.send_kind and self.schedule.channel(channel.src, a) == channel:
                b = self.schedule.boundary(channel.src, a)
                if b is None:  # a send on a channel always crosses a boundary
                    raise ExecutionError(f"stage {channel.src}: {a} crosses no boundary")
                items.append((b, a.microbatch, a.kind))
        return items

    def _channels(self) -> list[Channel]:
        """Channels whose plans this device takes part in."""
        out: dict[Channel, None] = {}
        for s, program in enumerate(self.schedule.stages):
            for a in program:
                if a.kind.is_send:
                    ch = self.schedule.channel(s, a)
                    if ch is not None and ch not in out:
                        out[ch] = None
        mine = []
        for ch in out:
            for b, _, kind in self._channel_items(ch):
                pid = (self.config.act_plans if kind is ActionKind.SEND_ACT
                       else self.config.grad_plans)[b]
                lp = self.worker.plans.get(pid)
                if lp is not None and (lp.steps or lp.dst_box or lp.src_box):
                    mine.append(ch)
                    break
        return mine

    # ----- one iteration ---------------------------------------------------------------
    def run(self, it: int, input_keys: Sequence[str], target_keys: Sequence[str]) -> dict:
        """Run this device's part of iteration ``it``.

        Args:
            it: iteration number (names the intermediate arrays).
            input_keys: per microbatch, the key of the first stage's input shard.
            target_keys: per microbatch, the key of the last stage's target shard.

        Returns:
            ``{"losses": {microbatch: loss part}, "events": [timeline records]}``.
        """
        cfg = self.config
        run = _Iteration(self, it, tuple(input_keys), tuple(target_keys))
        threads = [threading.Thread(target=run.transfer, args=(ch,), daemon=True,
                                    name=f"reshard-{ch}") for ch in self._channels()]
        for t in threads:
            t.start()
        try:
            stage = self.stage if self.stage is not None else -1
            for a in self.schedule.stages[stage] if stage >= 0 else ():
                v = self.schedule.virtual_stage(stage, a.chunk)
                t0 = time.monotonic()
                _HANDLERS[a.kind](run, a, v)
                if a.kind.is_compute and self.reporter[v]:
                    run.record(stage, "compute", a, t0, time.monotonic())
        finally:
            deadline = time.monotonic() + cfg.timeout
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            if run.flags.error:
                raise ExecutionError(
                    f"device {self.worker.device}: pipeline transfer failed: "
                    f"{run.flags.error[0]}")
            if any(t.is_alive() for t in threads):
                raise ExecutionError(
                    f"device {self.worker.device}: pipeline transfers did not finish "
                    f"within {cfg.timeout:g}s")
        arrays = self.worker.arrays
        for v in self.vstages:
            for name, g in run.grads[v].items():
                arrays[grad_key(v, name)] = g
        for key in [k for k in arrays if k.startswith(f"pp{it}/")]:
            del arrays[key]
        return {"losses": run.losses, "events": run.events}

    def _local_handoff(self, it: int, v: int, k: int) -> None:
        """Consecutive virtual stages on one physical stage pass activations without
        transfer actions: run the boundary's plan inline."""
        if v + 1 in self.modules:
            self.worker.execute(self.config.act_plans[v], [out_key(it, v, k)],
                                [act_key(it, v + 1, k)])

    def _local_handoff_grad(self, it: int, v: int, k: int) -> None:
        if v - 1 in self.modules:
            self.worker.execute(self.config.grad_plans[v - 1], [dx_key(it, v, k)],
                                [dy_key(it, v - 1, k)])

    def sgd(self, lr: float, reduced: Sequence[tuple[int, str, str]]) -> None:
        """``param -= lr * grad`` for each ``(virtual stage, name, key of the gradient
        in the parameter's layout)``."""
        for v, name, key in reduced:
            if v in self.keys:
                pkey = self.keys[v][name]
                self.worker.arrays[pkey] = self.worker.arrays[pkey] - lr * self.worker.arrays[key]


class _Iteration:
    """The state of one iteration on one device: flags between the compute thread and
    the transfer threads, saved forward state, gradients, losses and timeline events.
    Each action kind has one handler (see ``_HANDLERS``)."""

    def __init__(self, sw: StageWorker, it: int, input_keys: tuple[str, ...],
                 target_keys: tuple[str, ...]) -> None:
        self.sw = sw
        self.it = it
        self.input_keys = input_keys
        self.target_keys = target_keys
        self.flags = _Flags()
        self.events: list[dict] = []
        self._ev_lock = threading.Lock()
        self.losses: dict[int, float] = {}
        self.grads: dict[int, dict[str, np.ndarray]] = {v: {} for v in sw.vstages}
        self.saved: dict[tuple[int, int], Any] = {}

    def record(self, stage: int, stream: str, action: Action, t0: float, t1: float) -> None:
        with self._ev_lock:
            self.events.append({"stage": stage, "stream": stream, "action": str(action),
                                "start": t0, "end": t1})

    def _what(self, a: Action) -> str:
        return f"stage {self.sw.stage} {a}"

    # ----- transfer thread (one per channel) ---------------------------------------------
    def transfer(self, channel: Channel) -> None:
        """Run the channel's plans in the order its sender issues them; a failure is
        reported to the compute thread (and from there to the driver)."""
        sw, cfg, it = self.sw, self.sw.config, self.it
        try:
            for b, k, kind in sw._channel_items(channel):
                if kind is ActionKind.SEND_ACT:
                    pid, src, dst = cfg.act_plans[b], out_key(it, b, k), act_key(it, b + 1, k)
                    sv, rv, recv_kind = b, b + 1, ActionKind.RECV_ACT
                else:
                    pid, src, dst = cfg.grad_plans[b], dx_key(it, b + 1, k), dy_key(it, b, k)
                    sv, rv, recv_kind = b + 1, b, ActionKind.RECV_GRAD
                lp = sw.worker.plans[pid]
                sending = bool(lp.src_box)
                if sending:
                    self.flags.wait(src, cfg.timeout, f"device {sw.worker.device} sending {src}")
                t0 = time.monotonic()
                sw.worker.execute(pid, [src], [dst])
                t1 = time.monotonic()
                s_src, c_src = sw.schedule.locate(sv)
                s_dst, c_dst = sw.schedule.locate(rv)
                if sending and sw.reporter.get(sv):
                    self.record(s_src, "send", Action(kind, k, c_src), t0, t1)
                if lp.dst_box:
                    if sw.reporter.get(rv):
                        self.record(s_dst, "recv", Action(recv_kind, k, c_dst), t0, t1)
                    self.flags.get(dst).set()
        except BaseException as e:  # noqa: BLE001 - handed to the compute thread
            self.flags.error.append(e)

    # ----- transfer actions on the compute thread ----------------------------------------
    def recv_act(self, a: Action, v: int) -> None:
        self.flags.wait(act_key(self.it, v, a.microbatch), self.sw.config.timeout,
                        self._what(a))

    def recv_grad(self, a: Action, v: int) -> None:
        self.flags.wait(dy_key(self.it, v, a.microbatch), self.sw.config.timeout,
                        self._what(a))

    def send_act(self, a: Action, v: int) -> None:
        self.flags.get(out_key(self.it, v, a.microbatch)).set()

    def send_grad(self, a: Action, v: int) -> None:
        self.flags.get(dx_key(self.it, v, a.microbatch)).set()

    # ----- compute actions -------------------------------------------------------------
    def forward(self, a: Action, v: int) -> None:
        sw, it, k = self.sw, self.it, a.microbatch
        arrays, cfg = sw.worker.arrays, sw.config
        x = arrays[self.input_keys[k]] if v == 0 else arrays.pop(act_key(it, v, k))
        y, self.saved[(v, k)] = sw.modules[v].forward(sw._params(v), x)
        if v == len(cfg.stages) - 1:
            loss, dy = sw.modules[v].loss(y, arrays[self.target_keys[k]])
            self.losses[k] = loss
            arrays[dy_key(it, v, k)] = np.ascontiguousarray(dy)
        else:
            arrays[out_key(it, v, k)] = np.ascontiguousarray(y, dtype=cfg.dtype)
            sw._local_handoff(it, v, k)

    def _backward_input(self, a: Action, v: int) -> None:
        sw, it, k = self.sw, self.it, a.microbatch
        arrays = sw.worker.arrays
        dy = arrays.pop(dy_key(it, v, k))
        dx, self.saved[(v, k)] = sw.modules[v].backward_input(sw._params(v),
                                                              self.saved[(v, k)], dy)
        if v > 0:
            arrays[dx_key(it, v, k)] = np.ascontiguousarray(dx, dtype=sw.config.dtype)
            sw._local_handoff_grad(it, v, k)

    def backward_weight(self, a: Action, v: int) -> None:
        sw, k = self.sw, a.microbatch
        for name, g in sw.modules[v].backward_weight(sw._params(v),
                                                     self.saved.pop((v, k))).items():
            acc = self.grads[v].get(name)
            self.grads[v][name] = g.copy() if acc is None else acc + g

    def backward_input(self, a: Action, v: int) -> None:
        self._backward_input(a, v)

    def backward(self, a: Action, v: int) -> None:
        """Input and weight gradients of one microbatch together: the input gradient
        is handed on first, then the weight gradient accumulated."""
        self._backward_input(a, v)
        self.backward_weight(a, v)


_HANDLERS: dict[ActionKind, Callable[[_Iteration, Action, int], None]] = {
    ActionKind.FORWARD: _Iteration.forward,
    ActionKind.BACKWARD: _Iteration.backward,
    ActionKind.BACKWARD_INPUT: _Iteration.backward_input,
    ActionKind.BACKWARD_WEIGHT: _Iteration.backward_weight,
    ActionKind.SEND_ACT: _Iteration.send_act,
    ActionKind.RECV_ACT: _Iteration.recv_act,
    ActionKind.SEND_GRAD: _Iteration.send_grad,
    ActionKind.RECV_GRAD: _Iteration.recv_grad,
}
"""One handler per action kind (as torch.distributed.pipelining maps computation types
to functions); every kind has one."""
