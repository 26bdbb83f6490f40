"""The plan IR: the frozen :class:`ReshardPlan`, with its lossless JSON form, digest,
cost and verification (the tasks and tensors it holds, and their execution
semantics, are :mod:`reshard.planner.values.tasks`; this module re-exports them). Costing
(:mod:`reshard.planner.costing.cost`) and verifying (:mod:`reshard.planner.costing.verify`) are
functions over those value types; the plan offers them as methods through a one-way
import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from reshard.cluster import Cluster
from reshard.dtypes import parse_dtype
from reshard.errors import PlanError
from reshard.gcpause import paused
from reshard.layout import Layout
from reshard.planner.values.digest import digest_tasks
from reshard.planner.values.plan_view import Route
from reshard.planner.values.strategy import Strategy

if TYPE_CHECKING:
    from reshard.planner.costing.fluid import Estimate

from reshard.planner.values.tasks import (
    FORMAT_VERSION,
    READABLE_FORMATS,
    Buffer,
    Conversion,
    Derive,
    Task,
    TaskKind,
    TensorSpec,
    _get,
    _list,
    _obj,
    communicator_groups,
    input_indices,
    output_indices,
)


def plan_header(tensors: tuple[TensorSpec, ...], strategy: Strategy, cluster: Cluster) -> dict[str, Any]:
    """A plan's JSON form without its tasks."""
    return {"format": FORMAT_VERSION, "strategy": strategy.value,
            "cluster": cluster.to_dict(), "tensors": [t.to_dict() for t in tensors]}


PORTABLE_CACHE = frozenset({"estimate", "lower_bound"})
"""The cached figures a pickled plan keeps (plain floats, the same in every process)."""

REJECTED = "rejected"
"""A plan's cache key of the answers of :meth:`ReshardPlan.kept` whose simulation
stopped early: per rule, the longest time it was found not to keep the plan against."""


def rejects(rejected: dict[Callable[[float, float], bool], float] | None,
            keep: Callable[[float, float], bool], best: float) -> bool:
    """Whether ``rejected`` (a plan's :data:`REJECTED`) already shows that ``keep`` does
    not keep the plan against ``best``: it did not against a time ``best`` or longer.
    Every search rule keeps a plan against a time when it keeps it against a shorter
    one (``keep(t, b)`` is monotone in ``b``: a plan of ``t`` seconds replaces the best
    when ``t`` is under ``b``, or under or within a share of it), so a rule that did not
    keep it against a longer time does not keep it now: the same answer as the
    simulation, which would stop again (a stopped run is no estimate, its answer
    alone is kept; only the same rule, the same function, is asked)."""
    if rejected is None:
        return False
    longest = rejected.get(keep)
    return longest is not None and best <= longest


@dataclass(frozen=True)
class ReshardPlan:
    """A frozen, serializable resharding plan for one or more tensors.

    Attributes:
        tensors: the planned tensors.
        tasks: the tasks in the global order every worker follows.
        strategy: the strategy that produced the plan.
        cluster: the cluster the plan was balanced for and is costed on.
    """

    tensors: tuple[TensorSpec, ...]
    tasks: tuple[Task, ...]
    strategy: Strategy
    cluster: Cluster
    _cache: dict[Any, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        """What pickling keeps (a plan sent to or from a worker process): the fields, and
        of the caches only the figures found (:data:`PORTABLE_CACHE`); the rest may hold
        this process's hashes, objects keyed by identity, or the callable that finds
        the bound (:meth:`bound_by`), which does not pickle."""
        state = dict(self.__dict__)
        state["_cache"] = {k: v for k, v in self._cache.items() if k in PORTABLE_CACHE}
        return state

    def __hash__(self) -> int:
        """Hashed once (a plan keys the Runtime's caches on every call; its tasks are
        many)."""
        got = self._cache.get("hash")
        if got is None:
            got = self._cache["hash"] = hash((self.tensors, self.tasks, self.strategy,
                                              self.cluster))
        return got

    # ----- single-tensor conveniences ----------------------------------------------------
    def _only(self) -> TensorSpec:
        inputs = self.inputs
        if len(inputs) != 1:
            raise PlanError(
                f"this plan moves {len(inputs)} tensors; use plan.tensors[i] instead"
            )
        return self.tensors[inputs[0]]

    @cached_property
    def inputs(self) -> tuple[int, ...]:
        """Indices of the tensors whose sources the caller gives (not derived), in
        order: a plan's requests. The others (a scaled cast's amax and scales) follow
        them."""
        return input_indices(self.tensors)

    @cached_property
    def outputs(self) -> tuple[int, ...]:
        """Indices of the tensors a caller receives: the inputs, then the scales of
        scaled casts (an amax is internal to the plan)."""
        return output_indices(self.tensors)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the (only) tensor."""
        return self._only().shape

    @property
    def dtype(self) -> np.dtype:
        """dtype of the (only) tensor."""
        return parse_dtype(self._only().dtype)

    @property
    def src(self) -> Layout:
        """Source layout of the (only) tensor."""
        return self._only().src

    @property
    def dst(self) -> Layout:
        """Destination layout of the (only) tensor."""
        return self._only().dst

    # ----- queries -------------------------------------------------------------------------
    @cached_property
    def devices(self) -> tuple[int, ...]:
        """Every device holding a source or destination shard or relaying a task,
        sorted."""
        devs: set[int] = set()
        for t in self.tensors:
            devs.update(t.src.devices)
            devs.update(t.dst.devices)
        for task in self.tasks:
            devs.update(task.through)
        return tuple(sorted(devs))


    @property
    def num_steps(self) -> int:
        """Rounds of the global order."""
        return 1 + max((t.step for t in self.tasks), default=-1)

    def bytes_moved(self) -> int:
        """Bytes that leave a device (copies excluded)."""
        return sum(t.nbytes for t in self.tasks if t.kind is not TaskKind.COPY)

    def communicator_groups(self) -> tuple[tuple[int, ...], ...]:
        """Distinct member sets of the collectives, in first-use order (a broadcast
        summing addends counts as its :meth:`Task.parts`, which a backend that runs them
        apart makes communicators for)."""
        got = self._cache.get("groups")
        if got is None:
            got = self._cache["groups"] = communicator_groups(self.tasks)
        return got

    # ----- cost ----------------------------------------------------------------------------
    def simulate(self) -> Estimate:
        """The cost model's detailed prediction (cached; a plan :meth:`priced_as` another
        reads the other's)."""
        est = self._cache.get("estimate")
        if est is None:
            twin = self._cache.get("twin")
            if twin is not None:
                est = twin.simulate()
            else:
                from reshard.planner.costing.fluid import simulate

                est = simulate(self)
                assert est is not None  # never told to stop
            self._cache["estimate"] = est
        return est

    def kept(self, keep: Callable[[float, float], bool], best: float) -> bool:
        """``keep(self.estimate(), best)``, simulating only as far as needed: where the
        simulation's clock bound already makes ``keep`` false for every longer time
        (``keep`` is false for a time when it is for a shorter one: every search rule),
        it stops early (:func:`~reshard.planner.costing.fluid.simulate`'s ``stop``) and
        only the answer is remembered (:func:`rejects`: a later ask of the same rule
        against a time no longer is answered without simulating); a finished
        simulation is the plan's estimate."""
        plan = self
        while "estimate" not in plan._cache and "twin" in plan._cache:
            plan = plan._cache["twin"]  # priced as its twin: ask the twin
        if "estimate" not in plan._cache:
            if rejects(plan._cache.get(REJECTED), keep, best):
                return False
            from reshard.planner.costing.fluid import simulate

            got = simulate(plan, lambda t: not keep(t, best))
            if got is None:
                rejected = plan._cache.setdefault(REJECTED, {})
                rejected[keep] = max(best, rejected.get(keep, best))
                return False
            plan._cache["estimate"] = got
        return keep(self.estimate(), best)

    def one_at_a_time_time(self) -> float:
        """Seconds no plan of these tasks that runs each device's tasks one at a time can
        beat (:func:`~reshard.planner.costing.cost.one_at_a_time_time`; cached: a plan
        :meth:`priced_as` another reads the other's, which its tasks, tensors and cluster
        decide: the ``least-concurrent`` pass's floor, found once for a planning call's
        twins)."""
        got = self._cache.get("one at a time")
        if got is None:
            twin = self._cache.get("twin")
            if twin is not None:
                got = twin.one_at_a_time_time()
            else:
                from reshard.planner.costing.cost import one_at_a_time_time

                got = one_at_a_time_time(self)
            self._cache["one at a time"] = got
        return got

    def priced_as(self, twin: ReshardPlan) -> ReshardPlan:
        """Price this plan as ``twin``, a plan of the same tensors, tasks and cluster
        (its label may differ; the model reads no label): its prediction, routes and
        latencies are ``twin``'s, found once for both. Returns the plan itself.

        Raises:
            PlanError: ``twin`` is not a plan of the same tensors, tasks and cluster.
        """
        if twin is not self and (twin.tasks != self.tasks or twin.tensors != self.tensors
                                 or twin.cluster != self.cluster):
            raise PlanError("a plan is priced as another only where both have the same "
                            "tensors, tasks and cluster; these differ (plan the tasks anew)")
        if twin is not self:
            self._cache["twin"] = twin
        return self

    def routes(self, known: dict[tuple[object, ...], Any] | None = None
               ) -> tuple[Route, ...]:
        """Per task (plan order) the resources its bytes cross with their fractions, and
        its latency (:func:`reshard.planner.costing.cost.task_routes`; cached). ``known``: a
        memo shared with other plans on the same cluster (the planner's bucketings of
        one plan), filled in."""
        got = self._cache.get("routes")
        if got is None and "twin" in self._cache:
            got = self._cache["routes"] = self._cache["twin"].routes(known)
        if got is None:
            from reshard.planner.costing.cost import task_routes

            if known is None:
                known = self._cache.get("route memo")
            got = self._cache["routes"] = task_routes(self.tasks, self.cluster, known,
                                                      self.tensors)
        return got

    def share_routes(self, known: dict[tuple[object, ...], Any]) -> ReshardPlan:
        """Find this plan's routes, when they are first asked for, in ``known`` (a memo
        of routes on the same cluster, filled in): the candidates of one planning
        call share most of their tasks' routes. Returns the plan itself."""
        self._cache["route memo"] = known
        return self

    def latencies(self) -> np.ndarray:
        """Per task, its route's latency and its wait for conversions
        (:func:`reshard.planner.costing.casts.task_latencies`; cached: the simulation
        and the floors read it)."""
        got = self._cache.get("latencies")
        if got is None and "twin" in self._cache:
            got = self._cache["latencies"] = self._cache["twin"].latencies()
        if got is None:
            from reshard.planner.costing.casts import task_latencies

            got = self._cache["latencies"] = task_latencies(self, self.routes())
            got.setflags(write=False)  # shared by every reader of the plan
        return got

    def priced_on(self, cluster: Cluster) -> ReshardPlan:
        """The same tasks costed on ``cluster`` (the one they were planned for with
        figures measured since, e.g. a cast rate): a plan of its own, whose caches start
        empty."""
        return replace(self, cluster=cluster, _cache={})

    def estimate(self) -> float:
        """Predicted seconds to run the plan on :attr:`cluster`."""
        return self.simulate().time

    def lower_bound(self) -> float:
        """Seconds no plan can beat on :attr:`cluster` (see :mod:`reshard.planner.costing.cost`)."""
        lb = self._cache.get("lower_bound")
        if lb is None:
            found = self._cache.pop("bound of", None)
            if found is not None:
                lb = found()
            else:
                from reshard.planner.costing.bound import lower_bound

                lb = lower_bound(self.tensors, self.cluster)
            self._cache["lower_bound"] = lb
        return lb

    def bound_by(self, found: Callable[[], float]) -> ReshardPlan:
        """Find this plan's lower bound, when it is first asked for, by ``found()``
        (the planner's, from the cells it cut: the bound depends on the tensors and the
        cluster alone). Returns the plan itself."""
        self._cache["bound of"] = found
        return self

    # ----- serialization -------------------------------------------------------------------
    def digest(self) -> bytes:
        """The SHA-256 of the plan's content (format, strategy, cluster, tensors and
        every task field, in order): equal for equal plans in any process, whatever its
        hash seed (cached). Ranks that each plan for themselves compare it
        (:mod:`reshard.comm.spmd`) before any byte moves."""
        got = self._cache.get("digest")
        if got is None:
            with paused():
                got = digest_tasks(self.to_dict_header(), self.tasks)
            self._cache["digest"] = got
        return got

    def to_dict_header(self) -> dict[str, Any]:
        """:meth:`to_dict` without the tasks."""
        return plan_header(self.tensors, self.strategy, self.cluster)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**self.to_dict_header(), "tasks": [t.to_dict() for t in self.tasks]}

    def to_json(self, indent: int | None = None) -> str:
        """Lossless JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Any, verify: bool = True) -> ReshardPlan:
        """Inverse of :meth:`to_dict`.

        Args:
            d: the JSON-ready form.
            verify: check the plan (:meth:`verify`) before returning it; pass False only
                for a plan a verifying party already checked (a driver's own workers).

        Raises:
            PlanError: the form is malformed or the plan breaks a rule of
                :mod:`reshard.planner.costing.verify`; the message names the task and the rule.
        """
        d = _obj(d, "plan")
        if d.get("format") not in READABLE_FORMATS:
            raise PlanError(
                f"plan format {d.get('format')!r:.40} is not supported; this reshard reads "
                f"formats {list(READABLE_FORMATS)}"
            )
        try:
            tensors = tuple(TensorSpec.from_dict(t)
                            for t in _list(_get(d, "tensors", "plan"), "plan tensors"))
            tasks = []
            for i, t in enumerate(_list(_get(d, "tasks", "plan"), "plan tasks")):
                try:
                    tasks.append(Task.from_dict(t))
                except PlanError as e:
                    raise PlanError(f"task #{i}: {e}") from None
            plan = cls(tensors, tuple(tasks), Strategy.parse(_get(d, "strategy", "plan")),
                       Cluster.from_dict(_obj(_get(d, "cluster", "plan"), "plan cluster")))
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlanError(f"malformed plan: {type(e).__name__}: {e}") from e
        if verify:
            plan.verify()
        return plan

    @classmethod
    def from_json(cls, text: str | bytes, verify: bool = True) -> ReshardPlan:
        """Inverse of :meth:`to_json` (``verify``: see :meth:`from_dict`)."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan is not valid JSON: {e}") from e
        except RecursionError:
            raise PlanError("plan JSON nests too deeply to be a plan") from None
        except (TypeError, UnicodeDecodeError) as e:
            raise PlanError(f"plan must be JSON text, got {type(text).__name__}: {e}") from None
        return cls.from_dict(d, verify=verify)

    def verify(self) -> None:
        """Check the plan before any byte moves (cached once it passed): types, ranges,
        every destination element delivered exactly once from a device that holds it.

        Raises:
            PlanError: naming the first task that breaks a rule and the rule.
        """
        if not self._cache.get("verified"):
            from reshard.planner.costing.verify import verify_plan

            verify_plan(self)
            self._cache["verified"] = True

    def assume_verified(self) -> None:
        """Record that this plan was verified where it was made (a driver that ships it
        verified): :meth:`verify` then returns at once."""
        self._cache["verified"] = True

    def checked_for(self, context: Hashable) -> bool:
        """True once :meth:`mark_checked_for` recorded a caller's check of this plan
        against ``context`` (a Runtime's backend, cluster and budget)."""
        return bool(self._cache.get(("checked for", context)))

    def mark_checked_for(self, context: Hashable) -> None:
        """Remember that this plan passed a caller's checks against ``context``."""
        self._cache[("checked for", context)] = True

    def summary(self) -> str:
        """A few lines describing the plan."""
        kinds: dict[str, int] = {}
        for t in self.tasks:
            kinds[t.kind.value] = kinds.get(t.kind.value, 0) + 1
        head = ", ".join(str(t) for t in self.tensors[:3])
        more = f" (+{len(self.tensors) - 3} more)" if len(self.tensors) > 3 else ""
        return (f"ReshardPlan[{self.strategy.value}] {head}{more}: {len(self.tasks)} tasks "
                f"{kinds}, {self.num_steps} steps, {self.bytes_moved()} bytes moved, "
                f"estimate {self.estimate():.6g}s, lower bound {self.lower_bound():.6g}s")

    def __str__(self) -> str:
        return "\n".join([self.summary(), *(str(t) for t in self.tasks)])


__all__ = [
    "FORMAT_VERSION",
    "READABLE_FORMATS",
    "Buffer",
    "Conversion",
    "Derive",
    "ReshardPlan",
    "Task",
    "TaskKind",
    "TensorSpec",
    "input_indices",
    "output_indices",
    "plan_header",
]
