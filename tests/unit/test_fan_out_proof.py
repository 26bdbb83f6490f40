"""The ``fan-out`` pass proved empty before it builds (issue 62, round nine): the search
is told a broadcast's first plan pipelines only where its slices, assembled fanned out,
would split some chain (:meth:`reshard.planner.plan.Builds.fans_out`,
:meth:`reshard.planner.cuts.Slices.splits_chains` over
:meth:`reshard.planner.schedule.work.WorkList.fanned`); elsewhere the fanned plan is
the first one, task for task, which ``fan-out`` (keeping only a faster plan) never
keeps, so the search's plans are the ones found without the proof."""

from __future__ import annotations

import itertools

import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner import cuts
from reshard.planner.builds import Builds
from reshard.planner.cuts import cut_slices
from reshard.planner.plan import _best_plan, planned_tensors
from reshard.planner.schedule.work import WorkList
from reshard.planner.values.strategy import Strategy


def _tensors(src: str, dst: str, shape: tuple[int, int], preset: str, cross: bool):
    """A 4x8 (dgx-h100, one mesh to another or within one) or 4x4 (aws-p3.8xlarge)
    request."""
    a = DeviceMesh((4, 8), range(32)) if preset == "dgx-h100" else DeviceMesh((4, 4), range(16))
    b = DeviceMesh((4, 8), range(32, 64)) if cross else a
    cluster = Cluster.preset(preset, 8 if cross else 4)
    tensors, _ = planned_tensors(
        [(shape, "bfloat16" if cross else "float32", Layout(a, src), Layout(b, dst))],
        cluster, None, None)
    return tensors, cluster


def _no_proof(self, tensors, cluster, strat) -> bool:  # type: ignore[no-untyped-def]
    """The search without the proof: every pipelined first plan may fan out."""
    return True


REQUESTS = [(s, d, shape, preset, cross) for (preset, cross), s, d, shape in itertools.product(
    (("dgx-h100", True), ("dgx-h100", False), ("aws-p3.8xlarge", False)),
    ("RR+P0", "S0R+P1", "RR+P01"), ("RR", "RS0", "S01R"), ((8192, 8192), (2048, 2048)))]


def _every_general(self: WorkList, planned=None):  # type: ignore[no-untyped-def]
    """The reference for ``fanned``: every general slice's tasks, so that
    ``assemble(True)`` always takes its slice-by-slice path (which decides by itself,
    slice by slice, which chains to split)."""
    return list((planned or self._planned).tasks)


def test_no_split_means_the_same_tasks(monkeypatch):
    """The slices say a chain splits exactly where assembling them fanned out (slice by
    slice, the reference) gives other tasks than not fanned out; among the pipelined
    ones both cases occur (the proof fires, and it does not)."""
    seen = set()
    for src, dst, shape, preset, cross in REQUESTS:
        tensors, cluster = _tensors(src, dst, shape, preset, cross)
        slices = cut_slices(tensors, cluster, Strategy.BROADCAST, False, False)
        plain = slices.plan(False)[0].tasks()
        assert slices.work.assemble(False).tasks() == plain
        with monkeypatch.context() as m:
            m.setattr(WorkList, "fanned", _every_general)
            differ = slices.work.assemble(True).tasks() != plain
            assert slices.work.assemble(False).tasks() == plain
        assert slices.splits_chains() == differ, (src, dst, shape, preset)
        seen.add((slices.pipelined(), differ))
    assert (True, False) in seen and (True, True) in seen and (False, False) in seen


def test_fanned_needs_the_slices_planned():
    tensors, cluster = _tensors("RR+P0", "RR", (8192, 8192), "dgx-h100", True)
    with pytest.raises(ValueError, match="planned first"):
        cut_slices(tensors, cluster, Strategy.BROADCAST, False, False).work.fanned()


@pytest.mark.parametrize("src,dst,shape,preset,cross",
                         [r for r in REQUESTS if r[2] == (8192, 8192)])
def test_the_search_keeps_the_same_plan(src, dst, shape, preset, cross, monkeypatch):
    """The plan (tasks and model time) with the proof is the one without it."""
    tensors, cluster = _tensors(src, dst, shape, preset, cross)
    got = _best_plan(tensors, cluster, Strategy.BROADCAST, Builds())
    monkeypatch.setattr(Builds, "fans_out", _no_proof)
    old = _best_plan(tensors, cluster, Strategy.BROADCAST, Builds())
    assert got.tasks == old.tasks and got.estimate() == old.estimate()


def test_fan_out_is_kept_somewhere(monkeypatch):
    """Some of these requests keep the fanned plan (so a proof that said no split
    where one happens would change a plan above)."""
    kept = 0
    for src, dst, shape, preset, cross in [("RR+P0", "RR", (8192, 8192), "dgx-h100", True),
                                           ("S0R+P1", "RS0", (8192, 8192), "aws-p3.8xlarge",
                                            False)]:
        tensors, cluster = _tensors(src, dst, shape, preset, cross)
        got = _best_plan(tensors, cluster, Strategy.BROADCAST, Builds())
        with monkeypatch.context() as m:
            m.setattr(cuts.Slices, "pipelined", lambda self: False)
            kept += got.tasks != _best_plan(tensors, cluster, Strategy.BROADCAST, Builds()).tasks
    assert kept == 2
