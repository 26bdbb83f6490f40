"""How the operating system schedules the worker processes a launcher starts.

A backend may declare :attr:`~reshard.comm.backend.Capabilities.batch_scheduled`:
then the processes the process and Ray launchers start for it run under Linux's
``SCHED_BATCH`` policy (``sched(7)``), which keeps the CFS share of an ordinary
process but never preempts a running thread when one of them wakes up.

Why gloo asks for it: gloo's TCP progress thread handles a connection's events only
when it can take the connection's lock at once, and otherwise returns to a
level-triggered ``epoll_wait`` that reports the same event again. The worker's own
thread holds that lock while it writes a message to the peer, and on loopback the
write wakes the peer on the spot; under the default policy the woken thread preempts
the writer, still holding the lock, and the progress thread that wants it spins.
Measured on 2 cores with perf (a uprobe on ``pthread_mutex_trylock``'s return): tens of
thousands of failed lock attempts a second per worker. Under ``SCHED_BATCH`` the woken
thread waits for the writer's slice instead; ``python -m reshard.microbench.scheduling``
times both policies (16 workers: 8.9-10.3 -> 3.6-5.4 ms per small execute).

``RESHARD_WORKER_SCHED=other`` in the workers' environment keeps the default policy
(for comparisons). The embeddable :class:`~reshard.comm.executor.Executor` never
changes a policy: its process belongs to the caller.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SCHED_ENV = "RESHARD_WORKER_SCHED"
"""Worker environment variable: ``batch`` (the default where the backend asks for
it) or ``other`` (the operating system's default policy)."""

POLICIES = ("batch", "other")


def wanted(batch_scheduled: bool, env: Mapping[str, str]) -> str:
    """The policy a worker of a backend declaring ``batch_scheduled`` runs under, given
    its environment ``env``: ``"batch"`` or ``"other"``.

    Raises:
        ValueError: ``RESHARD_WORKER_SCHED`` names no policy.
    """
    value = env.get(SCHED_ENV, "").strip().lower()
    if value and value not in POLICIES:
        raise ValueError(f"{SCHED_ENV}={env[SCHED_ENV]!r}: expected one of "
                         f"{', '.join(POLICIES)}")
    if value == "other" or not batch_scheduled:
        return "other"
    return "batch"


def for_backend(name: str, env: Mapping[str, str]) -> str:
    """The policy the workers of built-in backend ``name`` run under, given their
    environment ``env`` (:func:`wanted` of its declared ``batch_scheduled``).

    Raises:
        OptionError: no such backend.
        ValueError: ``RESHARD_WORKER_SCHED`` names no policy.
    """
    from reshard.comm.backend import builtin_backends

    return wanted(builtin_backends().entry(name).capabilities.batch_scheduled, env)


APPLY_PASSES = 8
"""The most times :func:`apply` lists the process's threads."""


def apply(policy: str) -> str:
    """Put every thread of this process under ``policy`` (``"batch"``; ``"other"``
    changes nothing); threads started later inherit it. Returns the policy in force:
    ``"other"`` where the system has no ``SCHED_BATCH`` or refuses it (a sandbox's
    seccomp filter), which is not an error: the workers run, only slower."""
    if policy != "batch":
        return "other"
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None or not hasattr(os, "sched_setscheduler"):
        return "other"
    done = False
    seen: set[int] = set()
    # a thread that a thread not yet switched starts while this runs inherits the old
    # policy: list the threads again until a pass finds none new (a few passes at most)
    for _ in range(APPLY_PASSES):
        try:
            threads = {int(t) for t in os.listdir("/proc/self/task")}
        except OSError:
            threads = {0}
        new = threads - seen
        if not new:
            break
        seen |= new
        for tid in new:
            try:
                os.sched_setscheduler(tid, batch, os.sched_param(0))
                done = True
            except OSError:
                continue  # a thread that ended meanwhile, or a refusal
    return "batch" if done else "other"


def policy_of(tid: int) -> str:
    """The policy thread (or process) ``tid`` runs under: ``"batch"``, ``"other"``, or
    the number Linux reports for any other."""
    got = os.sched_getscheduler(tid)
    if got == getattr(os, "SCHED_BATCH", None):
        return "batch"
    if got == os.SCHED_OTHER:
        return "other"
    return str(got)


__all__ = ["APPLY_PASSES", "POLICIES", "SCHED_ENV", "apply", "for_backend", "policy_of",
           "wanted"]
