"""Plan verification: every plan is checked before any byte moves.

A plan may come from anywhere: this planner, JSON from another process, the service,
a caller's own code, a tampered file. Executing a wrong plan gives silently wrong
data or a hang, so :func:`verify_plan` replays the plan's data flow symbolically, box
by box, step by step in the plan's global order, and rejects the first task that
breaks a rule:

* Tensors: a dtype of :mod:`reshard.dtypes` (and a cast it allows), a shape of
  non-negative integers, layouts that fit the tensor's rank, devices in the plan's
  cluster, partial sums only of summable dtypes; a scaled cast's amax and scales
  exactly as the planner makes them (:mod:`reshard.planner.values.scales`), the amax's tasks
  before all others.
* Tasks: a known tensor; a box of the tensor's rank inside its shape; ``nbytes`` =
  elements x itemsize of what the task carries (a reduction: the accumulator; every
  other task: the destination dtype); a sum fused with its delivery only where it
  converts nothing; ``step`` >= 0 and never decreasing along the plan;
  kind-specific form (``SEND`` one receiver, ``COPY`` onto its root, ``ALLGATHER``
  rootless with one piece per member, no root among its receivers, no receiver twice,
  at least one receiver).
* Data flow (a step's tasks run concurrently, so a task sees only what earlier steps
  completed; what its own step delivers or reduces counts from the next step on):
  - a task reads its box from a device that holds all of it: in its source shard
    (complete: a partial source must have been reduced there first) or, for a relay
    (``source=dst``), in what that device already received;
  - a broadcast's relay-only receivers (``through``) keep nothing and need no shard;
    never the chain's last (in a tree: never a leaf);
  - a broadcast tree (``parents``): one parent per receiver, the root or an earlier
    receiver (so every receiver is reached, and no cycle);
  - ``REDUCE`` sums one whole partial group of a partial source, each addend once (an
    ``ALLREDUCE`` likewise, its sum delivered to every member whose destination shard
    holds the box, kept in the source copy of the others); so
    does a broadcast with ``addends`` (root and addends: the group), whose receivers
    get the sum in the same task; its ``addend_parents`` (a tree of the sum): one per
    addend, the root or another addend, every addend reaching the root;
  - every device's destination shard receives every element exactly once (partial
    destinations: the leaders do; the other addends receive nothing and stay zero).

The replay works on boxes, not elements, so it costs about as much as reading the
plan. :func:`reshard.comm.backend.check_dtypes` adds what one backend can do (which
dtypes it moves, sums and converts); a :class:`~reshard.Runtime` runs both before it
loads a plan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reshard.dtypes import Cast, ScaleMode, parse_dtype
from reshard.errors import PlanError, ReshardError
from reshard.layout import Box, Layout, box_size, box_within
from reshard.planner.costing.coverage import covered, find_overlap, overlap, tiles
from reshard.planner.values.plan_view import PlanView
from reshard.planner.values.request import make_tensor_spec
from reshard.planner.values.scales import expected_scales
from reshard.planner.values.tasks import (
    SUMMING,
    Buffer,
    Derive,
    Task,
    TaskKind,
    TensorSpec,
    delivers,
    sum_hops,
)


class _Replay:
    """The symbolic state of a plan: what each device holds, task by task."""

    def __init__(self, plan: PlanView) -> None:
        self.plan = plan
        self.src: list[dict[int, Box]] = []
        self.dst: list[dict[int, Box]] = []
        self.leaders: list[frozenset[int]] = []
        self.group_of: list[dict[int, tuple[int, ...]]] = []  # partial sources only
        # many tensors share layouts and shapes
        boxes: dict[tuple[Any, ...], dict[int, Box]] = {}
        leaders: dict[Layout, frozenset[int]] = {}
        groups: dict[Layout, dict[int, tuple[int, ...]]] = {}
        for t in plan.tensors:
            for lay, out in ((t.src, self.src), (t.dst, self.dst)):
                key = (lay, t.shape)
                if key not in boxes:
                    boxes[key] = lay.boxes(t.shape)
                out.append(boxes[key])
            if t.dst not in leaders:
                leaders[t.dst] = t.dst.partial_leaders()
            self.leaders.append(leaders[t.dst])
            if t.src not in groups:
                groups[t.src] = ({d: g for g in t.src.partial_groups() for d in g}
                                 if t.src.spec.is_partial else {})
            self.group_of.append(groups[t.src])
        self.reduced: dict[tuple[int, int], list[Box]] = {}
        for i, group_of in enumerate(self.group_of):
            for d, g in group_of.items():
                if len(g) == 1:  # a sum of one addend is the value
                    self.reduced[(i, d)] = [self.src[i][d]]
        self.received: dict[tuple[int, int], list[Box]] = {}
        self.received_set: dict[tuple[int, int], set[Box]] = {}
        # what the current step delivers / reduces, visible from the next step on
        self._new_received: list[tuple[tuple[int, int], Box]] = []
        self._new_reduced: list[tuple[tuple[int, int], Box]] = []

    def end_step(self) -> None:
        """Make what the step delivered and reduced visible to later steps."""
        for key, box in self._new_received:
            self.received.setdefault(key, []).append(box)
            self.received_set.setdefault(key, set()).add(box)
        for key, box in self._new_reduced:
            self.reduced.setdefault(key, []).append(box)
        self._new_received.clear()
        self._new_reduced.clear()

    # ----- reads --------------------------------------------------------------------
    def read_src(self, i: int, device: int, box: Box) -> str | None:
        """Why ``device`` cannot read ``box`` of tensor ``i`` from its source shard."""
        outside = _not_held(self.src[i].get(device), i, device, box, "source")
        if outside:
            return outside
        if self.group_of[i] and box_size(box):
            done = self.reduced.get((i, device), [])
            if not covered(box, done, set(done)):
                return (f"the source is a partial sum and device {device} has not reduced "
                        f"the box in an earlier step (it holds one addend)")
        return None

    def read_dst(self, i: int, device: int, box: Box) -> str | None:
        """Why ``device`` cannot relay ``box`` of tensor ``i`` from its destination shard."""
        have = self.dst[i].get(device)
        if have is None or not box_within(box, have):
            return f"device {device}'s destination shard does not hold the box"
        key = (i, device)
        if box_size(box) and not covered(box, self.received.get(key, []),
                                          self.received_set.get(key, set())):
            return (f"device {device} relays the box before it received all of it in an "
                    f"earlier step")
        return None

    # ----- writes -------------------------------------------------------------------
    def write(self, i: int, device: int, box: Box) -> str | None:
        """Record ``box`` of tensor ``i`` delivered to ``device``'s destination shard."""
        outside = _not_held(self.dst[i].get(device), i, device, box, "destination")
        if outside:
            return outside
        if not box_size(box):
            return None
        if device not in self.leaders[i]:
            return (f"device {device} holds a non-leading addend of a partial destination, "
                    f"which must stay zero")
        self._new_received.append(((i, device), box))
        return None

    def reduce(self, i: int, task: Task) -> str | None:
        """Record a REDUCE of tensor ``i`` (an ALLREDUCE: the sum kept by every member)."""
        groups = self.group_of[i]
        if not groups:
            return f"tensor {i}'s source is not a partial sum; nothing to reduce"
        every = task.kind is TaskKind.ALLREDUCE
        members = task.receivers if every else (task.root, *task.receivers)
        group = groups.get(members[0])
        if group is None or set(members) != set(group):
            return (f"a reduce sums one whole partial group of the source once; devices "
                    f"{sorted(members)} are not one (groups: {sorted(set(groups.values()))})")
        for d in members:
            have = self.src[i][d]
            if not box_within(task.box, have):
                return f"device {d}'s source shard {_fmt(have)} does not hold the box"
            if any(overlap(task.box, b) for b in self.reduced.get((i, d), [])) or any(
                    key == (i, d) and overlap(task.box, b) for key, b in self._new_reduced):
                return f"device {d} already holds a reduced sum of part of the box"
        if not box_size(task.box):
            return None
        if not every:
            self._new_reduced.append(((i, task.root), task.box))
            return None
        for d in members:  # the sum lands in the destination shard where it holds the box
            if delivers(self.dst[i].get(d), task.box):
                why = self.write(i, d, task.box)
                if why:
                    return why
            else:
                self._new_reduced.append(((i, d), task.box))
        return None

    # ----- the end ------------------------------------------------------------------
    def check_complete(self) -> None:
        """Every destination element delivered exactly once."""
        for i, t in enumerate(self.plan.tensors):
            for d, have in self.dst[i].items():
                if d not in self.leaders[i]:
                    continue
                got = self.received.get((i, d), [])
                if tiles(got, have, len(t.shape)):
                    continue  # every element of the shard exactly once
                missing = box_size(have) - sum(box_size(b) for b in got)
                pair = find_overlap(got)
                if pair is not None or missing <= 0:
                    which = (f"boxes {_fmt(pair[0])} and {_fmt(pair[1])} overlap" if pair
                             else "two of its boxes overlap")
                    raise PlanError(
                        f"plan delivers part of tensor {i} to device {d} twice: {which}; "
                        f"every destination element must be delivered exactly once")
                if missing:
                    raise PlanError(
                        f"plan leaves {missing} element(s) of device {d}'s destination shard "
                        f"{_fmt(have)} of tensor {i} ({t.shape} {t.dtype} {t.src} -> {t.dst}) "
                        f"undelivered; is a task missing?")


def _not_held(have: Box | None, i: int, device: int, box: Box, which: str) -> str | None:
    """Why ``box`` of tensor ``i`` is not inside ``device``'s ``which`` shard ``have``
    (None: it is)."""
    if have is None:
        return f"device {device} holds no {which} shard of tensor {i}"
    if not box_within(box, have):
        return f"device {device}'s {which} shard {_fmt(have)} does not hold the box"
    return None


def _fmt(box: Box) -> str:
    return "[" + ",".join(f"{a}:{b}" for a, b in box) + "]"


# ----- per-kind rules ---------------------------------------------------------------------
def _copy(r: _Replay, task: Task) -> str | None:
    if task.through:
        return "only a broadcast has relay-only receivers (through)"
    if task.receivers != (task.root,):
        return "a copy's receivers must be exactly (root,)"
    if task.source is not Buffer.SRC:
        return "a copy reads its root's source shard (source=src)"
    return r.read_src(task.tensor, task.root, task.box) or \
        r.write(task.tensor, task.root, task.box)


def _send(r: _Replay, task: Task) -> str | None:
    if task.through:
        return "only a broadcast has relay-only receivers (through)"
    if len(task.receivers) != 1:
        return f"a send has exactly one receiver, got {len(task.receivers)}"
    return _deliver(r, task)


def _broadcast(r: _Replay, task: Task) -> str | None:
    if task.addends:
        return _tree(task) or _fused(r, task)
    return _tree(task) or _deliver(r, task)


def _fused(r: _Replay, task: Task) -> str | None:
    """A broadcast summing its addends: one whole partial group reduced into the root
    (as a ``REDUCE``), its sum delivered to the receivers in the same task."""
    if task.source is not Buffer.SRC:
        return "a broadcast that sums addends reads source shards (source=src)"
    if len(set(task.addends)) != len(task.addends) or task.root in task.addends or \
            set(task.addends) & set(task.receivers):
        return ("a broadcast's addends are distinct devices other than its root and its "
                "receivers")
    why = _sum_tree(task) or r.reduce(task.tensor, task.parts()[0])
    if task.through:
        why = why or _relays(r, task)
    for d in task.receivers:
        if d not in task.through:
            why = why or r.write(task.tensor, d, task.box)
    return why


def _sum_tree(task: Task) -> str | None:
    """A fused sum's addend parents: one per addend, each the root or another addend,
    every addend's running sum reaching the root (no cycle)."""
    if not task.addend_parents:
        return None
    if len(task.addend_parents) != len(task.addends):
        return (f"a sum's tree has one parent per addend: {len(task.addends)} addends, "
                f"{len(task.addend_parents)} addend parents")
    parent = dict(zip(task.addends, task.addend_parents))
    for a, p in parent.items():
        if p != task.root and (p not in parent or p == a):
            return f"addend {a}'s parent {p} is neither the root nor another addend"
    for a in parent:
        if sum_hops(task.root, parent, a) is None:
            return f"addend {a}'s running sum never reaches the root (a cycle)"
    return None


def _tree(task: Task) -> str | None:
    """A broadcast tree's parents: one per receiver, each the root or an earlier
    receiver (a tree reaching every receiver, with no cycle)."""
    if not task.parents:
        return None
    if len(task.parents) != len(task.receivers):
        return (f"a broadcast tree has one parent per receiver: {len(task.receivers)} "
                f"receivers, {len(task.parents)} parents")
    seen = {task.root}
    for d, p in zip(task.receivers, task.parents):
        if p not in seen:
            return (f"receiver {d}'s parent {p} is neither the root nor an earlier "
                    f"receiver")
        seen.add(d)
    return None


def _deliver(r: _Replay, task: Task) -> str | None:
    i = task.tensor
    read = r.read_src if task.source is Buffer.SRC else r.read_dst
    why = read(i, task.root, task.box)
    if task.through:
        why = why or _relays(r, task)
    for d in task.receivers:
        if d not in task.through:
            why = why or r.write(i, d, task.box)
    return why


def _relays(r: _Replay, task: Task) -> str | None:
    """Relay-only receivers: of a broadcast, listed once among its receivers, never
    its last, devices of the cluster."""
    if task.kind is not TaskKind.BROADCAST:
        return "only a broadcast has relay-only receivers (through)"
    if len(set(task.through)) != len(task.through) or not set(task.through) <= set(
            task.receivers):
        return "relay-only receivers (through) must be distinct receivers of the task"
    if task.parents:
        leaves = set(task.through) - set(task.parents)
        if leaves:
            return (f"relay-only receiver(s) {sorted(leaves)} are leaves of the tree (they "
                    f"would pass nothing on)")
    elif task.receivers[-1] in task.through:
        return "the last receiver of a chain cannot be relay-only (it passes nothing on)"
    hosts = r.plan.cluster
    for d in task.through:
        try:
            hosts.host_of(d)
        except ReshardError:
            return f"relay device {d} is not in the plan's cluster"
    return None


def _reduce(r: _Replay, task: Task) -> str | None:
    if task.through:
        return "only a broadcast has relay-only receivers (through)"
    if task.source is not Buffer.SRC:
        return "a reduce sums source shards (source=src)"
    return r.reduce(task.tensor, task)


def _allgather(r: _Replay, task: Task) -> str | None:
    if task.through:
        return "only a broadcast has relay-only receivers (through)"
    if task.root != -1:
        return f"an all-gather has no root (-1), got {task.root}"
    if len(task.pieces) != len(task.receivers):
        return (f"an all-gather has one piece per member: {len(task.receivers)} members, "
                f"{len(task.pieces)} pieces")
    if len(task.receivers) < 2:
        return "an all-gather needs at least two members"
    i = task.tensor
    for m, piece in zip(task.receivers, task.pieces):
        if len(piece) != len(task.box) or not box_within(piece, task.box):
            return f"piece {_fmt(piece)} of device {m} is not inside the box"
        why = r.read_dst(i, m, piece)
        if why:
            return why
    for m, piece in zip(task.receivers, task.pieces):
        for other in task.receivers:
            if other != m:
                why = r.write(i, other, piece)
                if why:
                    return why
    return None


def _allreduce(r: _Replay, task: Task) -> str | None:
    if task.through or task.pieces:
        return "an all-reduce has neither relay-only receivers (through) nor pieces"
    if task.root != -1:
        return f"an all-reduce has no root (-1), got {task.root}"
    if len(task.receivers) < 2:
        return "an all-reduce needs at least two members"
    if task.source is not Buffer.SRC:
        return "an all-reduce sums source shards (source=src)"
    return r.reduce(task.tensor, task)


_RULES: dict[TaskKind, Callable[[_Replay, Task], str | None]] = {
    TaskKind.COPY: _copy,
    TaskKind.SEND: _send,
    TaskKind.BROADCAST: _broadcast,
    TaskKind.REDUCE: _reduce,
    TaskKind.ALLGATHER: _allgather,
    TaskKind.ALLREDUCE: _allreduce,
}


def _form(task: Task, t: TensorSpec) -> str | None:
    """Rules on one task alone (its tensor known)."""
    if len(task.box) != len(t.shape):
        return f"the box has {len(task.box)} dims, tensor {task.tensor} has {len(t.shape)}"
    want = t.sum_itemsize if task.kind in SUMMING else t.itemsize
    for (a, b), n in zip(task.box, t.shape):  # the box's size, checking each dim
        if not 0 <= a <= b <= n:
            return _outside(task.box, t.shape)
        want *= b - a
    if task.nbytes != want:
        carried = t.sum_dtype if task.kind in SUMMING else t.out_dtype
        return (f"nbytes is {task.nbytes}, but the box holds {want} bytes of {carried} (what "
                f"a {task.kind.value} of this tensor carries)")
    if task.step < 0:
        return f"step must be >= 0, got {task.step}"
    if not task.receivers:
        return "a task needs at least one receiver"
    if len(set(task.receivers)) != len(task.receivers):
        return "a receiver is listed twice"
    if task.kind is not TaskKind.COPY and task.root in task.receivers:
        return "the root is also a receiver"
    if task.parents and task.kind is not TaskKind.BROADCAST:
        return "only a broadcast has a tree (parents)"
    if task.addend_parents and not task.addends:
        return "addend parents without addends"
    if task.addends and task.kind is not TaskKind.BROADCAST:
        return "only a broadcast sums addends on its way (a reduce lists them as receivers)"
    if task.addends and not t.fuses:
        return (f"tensor {task.tensor} ({t}) converts its partial sum (accumulated in "
                f"{t.sum_dtype}, or reduced with {t.reduce_op.value}), so its reduction cannot be "
                f"fused with its delivery; reduce it apart (a REDUCE task)")
    return None


def _outside(box: Box, shape: tuple[int, ...]) -> str:
    """Why ``box`` is not a box of ``shape`` (one of its dims is not)."""
    d, (a, b), n = next((d, ab, n) for d, (ab, n) in enumerate(zip(box, shape))
                        if not 0 <= ab[0] <= ab[1] <= n)
    return f"box dim {d} is {a}:{b}, outside 0:{n} of the tensor's shape {shape} (or reversed)"


def _check_tensor(index: int, t: TensorSpec, plan: PlanView) -> None:
    try:
        if not isinstance(t.shape, tuple) or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in t.shape):
            raise PlanError(f"shape must be a tuple of integers, got {t.shape!r}")
        cast = Cast(parse_dtype(t.cast).name, t.scale, t.fold) if t.cast else None
        if t.scale is not ScaleMode.NONE and not t.cast:
            raise PlanError(f"scale {t.scale.value!r} without a cast (scales are of a cast "
                            f"to float8)")
        again = make_tensor_spec(t.shape, t.dtype, t.src, t.dst, plan.cluster, cast)
    except ReshardError as e:
        raise PlanError(f"plan tensor {index}: {e}") from None
    if (again.dtype, again.cast) != (t.dtype, t.cast):
        raise PlanError(f"plan tensor {index}: dtype {t.dtype!r} (cast {t.cast!r}) is spelled "
                        f"{again.dtype!r} (cast {again.cast!r}); write that")


def _check_links(plan: PlanView) -> None:
    """A scaled cast's amax and scales are exactly what the planner makes for it
    (:mod:`reshard.planner.values.scales`), each serving one scaled tensor; an amax's tasks all
    come before any other task (their steps are the plan's first phase)."""
    tensors = plan.tensors
    n = len(tensors)
    served: dict[int, int] = {}
    for i, t in enumerate(tensors):
        if t.scale is ScaleMode.NONE:
            if t.derive is Derive.NONE and t.link != -1:
                raise PlanError(f"plan tensor {i} ({t}) links tensor {t.link} but is neither "
                                f"scaled nor derived; drop the link")
            continue
        if t.derive is not Derive.NONE:
            raise PlanError(f"plan tensor {i} ({t}) is derived and scaled; only a caller's "
                            f"tensor is cast with scales")
        want = expected_scales(tensors, i) if 0 <= t.link < n else []
        at = range(t.link - len(want) + 1, t.link + 1)
        if not want or at.start < 0 or [tensors[k] for k in at] != want:
            raise PlanError(
                f"plan tensor {i} ({t}) is scaled by tensor {t.link}, but its amax and "
                f"scales must be {[str(w) for w in want]} at the link (plan tensors "
                f"{list(at)}); plan it with reshard.plan(..., scale=...)")
        for k in at:
            if k in served:
                raise PlanError(f"plan tensor {k} serves tensors {served[k]} and {i}; each "
                                f"scaled tensor has its own amax and scales")
            served[k] = i
    for k, t in enumerate(tensors):
        if t.derive is not Derive.NONE and k not in served:
            raise PlanError(f"plan tensor {k} ({t}) is derived but serves no scaled "
                            f"tensor; drop it, or link a scaled tensor to it")
    first = [task.step for task in plan.tasks if tensors[task.tensor].derive is Derive.AMAX]
    later = [task.step for task in plan.tasks if tensors[task.tensor].needs_scales]
    if first and later and min(later) <= max(first):
        raise PlanError(
            f"the amax tasks (to step {max(first)}) must all come before every task of a "
            f"scaled tensor or its scales (from step {min(later)}): scaled values and "
            f"scales are computed from the reduced amax")


def verify_plan(plan: PlanView) -> None:
    """Check ``plan`` (see the module docstring); the plan is fine if it returns.

    Raises:
        PlanError: the first broken rule, naming the task (index and text) and the rule.
    """
    seen: set[TensorSpec] = set()
    for i, t in enumerate(plan.tensors):
        if t not in seen:
            _check_tensor(i, t, plan)
            seen.add(t)
    n = len(plan.tensors)
    if any(t.link != -1 or t.derive is not Derive.NONE for t in plan.tensors):
        bad = [task for task in plan.tasks
               if not (isinstance(task, Task) and isinstance(task.tensor, int)
                       and 0 <= task.tensor < n)]
        if not bad:
            _check_links(plan)
    replay = _Replay(plan)
    n = len(plan.tensors)
    step = 0
    for index, task in enumerate(plan.tasks):
        if not isinstance(task, Task):
            raise PlanError(f"plan task #{index} is a {type(task).__name__}, not a Task")
        if isinstance(task.step, int) and task.step > step:
            replay.end_step()
            step = task.step
        if not 0 <= task.tensor < n:
            why: str | None = f"tensor index {task.tensor} is out of range 0..{n - 1}"
        elif 0 <= task.step < step:
            why = (f"step {task.step} comes after step {step}; steps never decrease along "
                   f"the plan")
        else:
            why = _form(task, plan.tensors[task.tensor]) or _RULES[task.kind](replay, task)
        if why:
            raise PlanError(f"plan task #{index} ({task}): {why}")
    replay.end_step()
    replay.check_complete()


__all__ = ["verify_plan"]
