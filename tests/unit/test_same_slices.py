"""Whether the fine cut's slices are the coarse cut's, shown from the two cuts
(reshard.planner.cuts.same_slices): never where their signatures differ, on every case
here where they are equal, and the planner (Builds._fine_as_coarse, which no longer
cuts the fine slices where the cuts show it) plans as it did."""

from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout
from reshard.planner import builds as builds_module
from reshard.planner import cuts
from reshard.planner import plan as planner
from reshard.planner.cells.decompose import CellTable
from reshard.planner.plan import make_tensor_spec
from reshard.planner.values.strategy import Strategy

CLUSTER = Cluster.preset("dgx-h100", 8)
A, B = DeviceMesh((4, 8), range(32)), DeviceMesh((4, 8), range(32, 64))
REQUESTS = [((8192, 8192), "S0R+P1", "RS0"), ((2048, 2048), "RR+P1", "RS1"),
            ((16384, 4096), "RR+P1", "S0S1"), ((2048, 2048), "RR+P01", "S0R"),
            ((8192, 8192), "S1R+P0", "S01R"), ((2048, 2048), "RS1+P0", "RS10"),
            ((2048, 2048), "S0R", "RS1")]


def _tensors(shape, src, dst):
    return (make_tensor_spec(shape, "bfloat16", Layout(A, src), Layout(B, dst), CLUSTER),)


def _signed(tensors, strat, cut, fine):
    s = cuts.cut_slices(tensors, CLUSTER, strat, fine=fine, cut=cut)
    return s.reduces, s.work.signature()


def test_shown_exactly_where_the_signatures_are_equal():
    answers = set()
    for shape, src, dst in REQUESTS:
        tensors = _tensors(shape, src, dst)
        coarse = cuts.cut_cells(tensors, CLUSTER)
        fine = cuts.cut_cells(tensors, CLUSTER, fine=True, like=coarse)
        for strat in Strategy:
            equal = _signed(tensors, strat, coarse, False) == _signed(tensors, strat, fine, True)
            shown = cuts.same_slices(coarse, fine, CLUSTER, strat, [t.itemsize for t in tensors])
            assert shown == equal, (shape, src, dst, strat)
            answers.add((strat is Strategy.BROADCAST, shown))
    # broadcast (cut for balance) and the others, each both ways: a test that
    # ignored the pieces, or the reductions, fails above
    assert answers == {(True, True), (True, False), (False, True), (False, False)}


@pytest.mark.parametrize("shape,src,dst", REQUESTS[:3])
def test_plans_equal_those_with_the_fine_slices_cut(shape, src, dst):
    tensors = _tensors(shape, src, dst)
    fast = planner.plan_tensors(tensors, CLUSTER, Strategy.BROADCAST, None)
    with mock.patch.object(builds_module, "same_slices", lambda *_: False):
        slow = planner.plan_tensors(tensors, CLUSTER, Strategy.BROADCAST, None)
    assert fast.tasks == slow.tasks and fast.estimate() == slow.estimate()



def _table_cut():
    tensors = _tensors((16384, 4096), "RR+P1", "S0S1")
    coarse = cuts.cut_cells(tensors, CLUSTER)
    i = next(i for i, c in enumerate(coarse.cells) if isinstance(c, CellTable))
    return [t.itemsize for t in tensors], coarse, i


def _with(items, i, item):
    return (*items[:i], item, *items[i + 1:])


def _changed(table, column):
    values = getattr(table, column).copy()
    if column in ("lo", "hi"):
        values.flat[0] += 1
    else:  # another of the distinct sets
        values[0] = (values[0] + 1) % len(getattr(table, column + "_sets"))
    return dataclasses.replace(table, **{column: values})


@pytest.mark.parametrize("column", ["lo", "hi", "holder", "needer"])
def test_tables_differing_in_a_column_are_not_shown_the_same(column):
    items, coarse, i = _table_cut()
    table = coarse.cells[i]
    assert len(getattr(table, column + "_sets", (0, 1))) > 1  # a row can point elsewhere
    other = dataclasses.replace(coarse, cells=_with(coarse.cells, i, _changed(table, column)))
    assert cuts.same_slices(coarse, coarse, CLUSTER, Strategy.SEND_RECV, items)
    assert not cuts.same_slices(coarse, other, CLUSTER, Strategy.SEND_RECV, items)
    # equal columns in other arrays (not the same objects) are shown the same
    copy = dataclasses.replace(table, **{column: getattr(table, column).copy()})
    same = dataclasses.replace(coarse, cells=_with(coarse.cells, i, copy))
    assert cuts.same_slices(coarse, same, CLUSTER, Strategy.SEND_RECV, items)


def test_tables_differing_in_steps_are_not_shown_the_same():
    items, coarse, i = _table_cut()
    steps = np.asarray(coarse.after[i]).copy()
    same = dataclasses.replace(coarse, after=_with(coarse.after, i, steps.copy()))
    assert cuts.same_slices(coarse, same, CLUSTER, Strategy.SEND_RECV, items)
    steps[0] += 1
    later = dataclasses.replace(coarse, after=_with(coarse.after, i, steps))
    assert not cuts.same_slices(coarse, later, CLUSTER, Strategy.SEND_RECV, items)
