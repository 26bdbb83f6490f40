"""SPMD: every rank plans for itself and keeps only its program.

An embedded reshard (a torch.distributed rank, a JAX process, an RL trainer rank) has
no driver to plan and ship programs. Each rank is given the same *request* (shapes,
dtypes, layouts, cluster, strategy), plans it (the planner is deterministic: the same
plan bit for bit in every process, whatever its hash seed), cuts its own program and
drops the rest. Before any byte moves, the ranks compare what they planned: one
all-gather of a small fixed-size record per rank (the plan's digest, the request's
digest, the digest of the world and channel the rank plans over, reshard's version,
whether planning failed). Ranks that disagree, given different requests, worlds or
channels, or running different reshard versions, all raise one
:class:`~reshard.core.errors.PlanError` naming the ranks and what differs, instead of
hanging on mismatched messages; a rank whose planning failed reports it to every rank
the same way (Megatron-Core's resharding builds the same plan on every rank from shared
metadata; vLLM's NCCL M2N integration compares a plan digest across ranks).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np

from reshard.comm.backend import Backend
from reshard.comm.program import WorkerProgram, share_program
from reshard.core.cluster import Cluster
from reshard.core.errors import PlanError, ReshardError
from reshard.core.version import __version__
from reshard.planner.share import PlanShare, plan_share
from reshard.planner.values.strategy import Strategy
from reshard.planner.values.tasks import TensorSpec

DIGEST = 32
VERSION = 24
RECORD = 3 * DIGEST + VERSION + 1
"""Bytes each rank contributes: plan digest, request digest, world-and-channel digest,
version, a failure flag."""
_WHERE = slice(2 * DIGEST, 3 * DIGEST)
_VERSION = slice(3 * DIGEST, 3 * DIGEST + VERSION)


def where_digest(world: Sequence[int], channel: str | None) -> bytes:
    """The SHA-256 of the world (in its order) and channel a rank plans over."""
    text = json.dumps({"world": [int(d) for d in world], "channel": channel or ""})
    return hashlib.sha256(text.encode()).digest()


def request_digest(requests: Sequence[tuple], cluster: Cluster, strategy: Strategy,
                   memory_budget: int | None = None) -> bytes:
    """The SHA-256 of a request (``plan_many``'s arguments) in a canonical form."""
    parts = []
    for r in requests:
        shape, dtype, src, dst = r[:4]
        cast = r[4] if len(r) > 4 else None
        parts.append([list(shape), str(dtype), src.to_dict(), dst.to_dict(), repr(cast)])
    text = json.dumps({"tensors": parts, "cluster": cluster.to_dict(),
                       "strategy": strategy.value, "memory_budget": memory_budget},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).digest()


def _record(plan_digest: bytes, req_digest: bytes, where: bytes, failed: bool) -> np.ndarray:
    version = __version__.encode()[:VERSION].ljust(VERSION, b"\0")
    raw = (plan_digest.ljust(DIGEST, b"\0") + req_digest + where + version
           + bytes([int(failed)]))
    return np.frombuffer(raw, dtype=np.uint8).copy()


class _Groups:
    """What ``Backend.prepare`` takes: member sets to create communicators for."""

    def __init__(self, *groups: tuple[int, ...]) -> None:
        self.groups = groups

    def communicator_groups(self) -> tuple[tuple[int, ...], ...]:
        return self.groups


def exchange(backend: Backend, world: Sequence[int], record: np.ndarray) -> np.ndarray:
    """Every rank of ``world``'s record (rows in ``world`` order), by one all-gather."""
    group = tuple(world)
    backend.prepare(_Groups(group))
    inp = backend.asarray(record)
    out = backend.empty(len(group) * RECORD, np.uint8).reshape(len(group), RECORD)
    backend.all_gather(out, inp, group)
    backend.synchronize()
    return np.asarray(backend.to_host(out), dtype=np.uint8).reshape(len(group), RECORD)


def _disagreement(world: Sequence[int], rows: np.ndarray, where: str = "") -> str | None:
    """What the ranks' records say, when they do not all agree (None when they do);
    ``where``: this rank's world and channel, for the message."""
    places: dict[bytes, list[int]] = {}
    for d, row in zip(world, rows):
        places.setdefault(row[_WHERE].tobytes(), []).append(d)
    if len(places) > 1:
        groups = "; ".join(f"devices {_ranges(ds)} one ({k.hex()[:12]})"
                           for k, ds in places.items())
        return (f"ranks disagree on the world or channel they plan over: {groups}"
                f"{f' (this rank: {where})' if where else ''}; give every rank the same "
                f"world= (in one order) and channel=")
    failed = [d for d, row in zip(world, rows) if row[-1]]
    if failed:
        return (f"planning failed on devices {failed} (each raised its own error); no rank "
                f"moves a byte")
    kinds: dict[bytes, list[int]] = {}
    for d, row in zip(world, rows):
        kinds.setdefault(row[:DIGEST].tobytes(), []).append(d)
    if len(kinds) == 1:
        return None
    first = {row[:DIGEST].tobytes(): row for row in rows}

    def say(digest: bytes) -> str:
        row = first[digest]
        version = row[_VERSION].tobytes().rstrip(b"\0").decode(errors="replace")
        return (f"devices {_ranges(kinds[digest])} planned {digest.hex()[:12]} (request "
                f"{row[DIGEST:2 * DIGEST].tobytes().hex()[:12]}, reshard {version})")

    what = "; ".join(say(k) for k in kinds)
    requests = {first[k][DIGEST:2 * DIGEST].tobytes() for k in kinds}
    versions = {first[k][_VERSION].tobytes() for k in kinds}
    if len(requests) > 1:
        why = ("their requests differ (shapes, dtypes, layouts, cast, cluster, strategy or "
               "memory budget): "
               "give every rank the same request")
    elif len(versions) > 1:
        why = "their requests agree but their reshard versions differ: install one version"
    else:
        why = "their requests and versions agree but their plans differ: a planner bug, " \
              "please report it"
    return f"ranks disagree on the plan: {what}; {why}"


def _ranges(devices: list[int]) -> str:
    if len(devices) <= 8:
        return str(devices)
    return f"[{', '.join(map(str, devices[:6]))}, ... +{len(devices) - 6} more]"


def world_of(backend: Backend, world: Sequence[int] | None) -> tuple[int, ...]:
    """The ranks that plan together: ``world``, or the backend's own world."""
    members = tuple(int(d) for d in world) if world is not None else backend.world
    if not members:
        raise ReshardError(f"backend {backend.name!r} names no world; pass world= (the "
                           f"devices of every rank that plans this request)")
    if backend.device not in members:
        raise ReshardError(f"device {backend.device} is not in the world {list(members)}")
    return tuple(members)


class LocalPlan:
    """One rank's share of the plan of a request (:func:`reshard.planner.share.
    plan_share`: a large plan's other tasks are never built), or the error planning it
    raised, and the record it shares with its peers.

    Args:
        requests: :func:`reshard.plan_many`'s ``(shape, dtype, src, dst[, cast])`` each.
        cluster: the cluster every rank plans for.
        device: this rank's device.
        strategy: the strategy.
        verify: build and verify the whole plan before cutting this rank's program
            (default: check only the program; the plan is this process's own, and the
            ranks' digests agree; the whole plan's verification costs about ten times
            the cut).
        memory_budget: plan within this many bytes of staging per device (None:
            unbounded); part of the request the ranks compare.
        world: the ranks that plan together, in the order the records are gathered.
        channel: the channel they exchange records on (None: the main one).
    """

    def __init__(self, requests: Sequence[tuple], cluster: Cluster, device: int,
                 strategy: str | Strategy = Strategy.BROADCAST, verify: bool = False,
                 memory_budget: int | None = None, world: Sequence[int] = (),
                 channel: str | None = None) -> None:
        self.share: PlanShare | None = None
        self.error: ReshardError | None = None
        req = b"\0" * DIGEST
        try:
            strat = Strategy.parse(strategy)
            req = request_digest(requests, cluster, strat, memory_budget)
            self.share = plan_share(requests, device, cluster, strat,
                                    memory_budget=memory_budget, whole=verify)
            if verify:
                assert self.share.plan is not None  # whole=True builds it
                self.share.plan.verify()
        except ReshardError as e:
            self.error = e
        self.where = f"world {list(world)}, channel {channel or 'main'!r}"
        self.record = _record(self.share.digest if self.share is not None else b"", req,
                              where_digest(world, channel), self.error is not None)

    @property
    def tensors(self) -> tuple[TensorSpec, ...]:
        """The plan's tensors (the requests, then any a scaled cast adds)."""
        if self.share is None:
            raise ReshardError("planning failed on this rank; there are no tensors")
        return self.share.tensors

    def program(self, world: Sequence[int], rows: np.ndarray,
                all_groups: bool) -> WorkerProgram:
        """This rank's program, once every rank's record (``rows``, in ``world``
        order) agrees with this one.

        Raises:
            ReshardError: planning failed here (the error it raised).
            PlanError: the ranks disagree, or planning failed on another rank.
        """
        problem = _disagreement(world, rows, self.where)
        if self.error is not None and (problem is None or "planning failed" in problem):
            raise self.error
        if problem is not None:
            raise PlanError(problem)
        assert self.share is not None
        return share_program(self.share, all_groups)


__all__ = ["RECORD", "LocalPlan", "exchange", "request_digest", "where_digest", "world_of"]
