"""The cost model's floor from a plan's steps alone (:func:`stepped_floor`): a bound on
its prediction without simulating the sharing, which the planner asks before it
simulates a plan that may not beat another (offered by
:mod:`reshard.planner.costing.cost`)."""

from __future__ import annotations

import collections

import numpy as np

from reshard.cluster import Cluster
from reshard.planner.costing.fairshare import FairShare
from reshard.planner.costing.stepgate import StepGate
from reshard.planner.values.plan_view import PlanView
from reshard.planner.values.resources import COPY, DEV_IN, DEV_OUT, NIC_IN, NIC_OUT, Resource


def stepped_floor(plan: PlanView) -> float:
    """Seconds the cost model cannot predict below for ``plan``, from its steps alone,
    without simulating the sharing (a bound on :func:`simulate`, cheaper by far).

    The model runs a device's steps in order, and every task of a device's step lies
    inside that device's window for the step (it starts after the device entered the
    step, which ends when the task has). So a window lasts at least the least latency of
    its tasks plus, for each resource of the device (its links, its copy engine, its
    NIC where the device is alone on it), the bytes its step's tasks put there over the
    resource's capacity; and a task ends no earlier than its latency plus its bytes over
    its slowest resource after the last of its devices entered its step. Run through the
    steps in order, those give each device's earliest exit; the latest is the floor.
    Resources other devices share (a NIC of several devices, the shared bandwidth) add
    to the tasks' own times only, so the floor stays below the model's prediction.
    """
    tasks = plan.tasks
    n = len(tasks)
    if not n:
        return 0.0
    routes = plan.routes()
    flows = FairShare([p for p, _ in routes], plan.cluster)
    lat = plan.latencies()
    nbytes = np.array([float(t.nbytes) for t in tasks])
    seconds = flows.frac * nbytes[flows.task] / flows.capacity[flows.res]  # per edge
    alone = np.zeros(n)
    np.maximum.at(alone, flows.task, seconds)
    alone += lat
    step = np.array([t.step for t in tasks], dtype=np.int64)
    gate = StepGate(tasks)
    member_task, member_dev = gate.member_task, gate.member_dev
    pair_step, pair_dev, window = _step_windows(flows, _owners(plan.cluster, flows), step,
                                                gate, seconds, lat)
    exit_at = np.zeros(int(max(member_dev.max(initial=0), pair_dev.max(initial=0))) + 1)
    member_step = step[member_task]
    for s in np.unique(step):  # each device's exit from the last step it ran
        m = member_step == s
        who, dev = member_task[m], member_dev[m]
        start = np.zeros(n)
        np.maximum.at(start, who, exit_at[dev])
        ends = start[who] + alone[who]
        leave = exit_at.copy()
        np.maximum.at(leave, dev, ends)
        here = pair_step == s
        d = pair_dev[here]
        leave[d] = np.maximum(leave[d], exit_at[d] + window[here])
        exit_at = leave
    return float(exit_at.max())


def _owners(cluster: Cluster, flows: FairShare) -> np.ndarray:
    """Per resource of ``flows``, the device whose step window bounds its load: a
    device's links and copy engine, a NIC that device alone uses (-1: none alone)."""
    nic_devices = collections.Counter(cluster.nic_map.values())
    nic_device = {nic: d for d, nic in cluster.nic_map.items() if nic_devices[nic] == 1}

    def owned_by(res: Resource) -> int:
        kind, i = res
        if kind in (DEV_IN, DEV_OUT, COPY):
            return i
        return nic_device.get(i, -1) if kind in (NIC_IN, NIC_OUT) else -1

    return np.array([owned_by(r) for r in flows.resources] or [-1], dtype=np.int64)


def _step_windows(flows: FairShare, owner: np.ndarray, step: np.ndarray, gate: StepGate,
                  seconds: np.ndarray, lat: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (step, device) that has tasks: the step, the device, and the least its window
    lasts: the least latency of its tasks there plus its busiest own resource's
    seconds (``seconds``: per edge of ``flows``)."""
    member_task, member_dev = gate.member_task, gate.member_dev
    ndev = int(max(member_dev.max(initial=0), owner.max())) + 1
    nres = len(flows.resources)
    mine = owner[flows.res] >= 0
    key = (step[flows.task[mine]] * ndev + owner[flows.res[mine]]) * nres + flows.res[mine]
    keys, at = np.unique(key, return_inverse=True)
    busy = np.bincount(at, weights=seconds[mine], minlength=len(keys))
    pairs, pair_at = np.unique(np.concatenate([keys // nres,
                                               step[member_task] * ndev + member_dev]),
                               return_inverse=True)
    window = np.zeros(len(pairs))
    np.maximum.at(window, pair_at[:len(keys)], busy)
    least = np.full(len(pairs), np.inf)
    np.minimum.at(least, pair_at[len(keys):], lat[member_task])
    window += np.where(np.isfinite(least), least, 0.0)
    return pairs // ndev, pairs % ndev, window


__all__ = ["stepped_floor"]
