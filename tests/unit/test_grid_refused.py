"""The rows' refusal (planner/cells/grid_runs.py, issue 62 round seventeen): a grid asks
whether every receiver said no both ways (``chain_arrays.refused``) once, then again
only after a cell asked a receiver a new question. After every cell whose questions
say no, ``grid.refused`` is what ``refused`` answers then (the answers only grow, so a
cell that asked no receiver leaves it as it was); the run is the cells planned alone."""

from __future__ import annotations

import random

import pytest

from reshard.planner.cells import cell_tasks, chain_arrays, grid_runs
from tests.unit._regular_clusters import regular_clusters
from tests.unit._twin_loads import assert_same_loads, twin_loads
from tests.unit.test_grid_runs import GPUS, HOSTS, _receivers, _run, _start


def _watched(monkeypatch):
    """Record, after each cell's questions that say no, the grid's refusal and what
    ``refused`` answers then; and each call of ``refused``."""
    seen: list[tuple[bool, bool]] = []
    calls = []
    questions, refused = grid_runs._questions, grid_runs.refused

    def counted(loads, members):
        calls.append(1)
        return refused(loads, members)

    def watched(loads, grid, root, got):
        said = questions(loads, grid, root, got)
        if not said:
            seen.append((grid.refused, chain_arrays.refused(loads, grid.flat)))
        return said

    monkeypatch.setattr(grid_runs, "_questions", watched)
    monkeypatch.setattr(grid_runs, "refused", counted)
    return seen, calls


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", ["rows8", "rows3", "rows2"])
@pytest.mark.parametrize("start", ["preset", "empty", "partial"])
@pytest.mark.parametrize("asked", [False, True])
def test_a_grid_knows_its_refusal_after_every_cell(monkeypatch, seed, layout, start, asked):
    """``asked``: every receiver asked both ways before the run (refused at once)."""
    rng = random.Random(seed)
    cluster = regular_clusters(HOSTS, GPUS)["preset"]
    a, b = twin_loads(rng, cluster, False)
    _start(rng, (a, b), start)
    receivers = _receivers(rng, cluster, layout)
    if asked:
        for loads in (a, b):
            for d in sorted(receivers):
                for way in (grid_runs.NIC_OUT, grid_runs.NIC_IN):
                    assert not loads.may_relay_end(way, d)
    run = _run(rng, cluster, receivers, 40, False)
    want = [cell_tasks.plan_broadcast(c, t, i, a, s) for c, t, i, s in run]
    seen, calls = _watched(monkeypatch)
    got = grid_runs.plan_grid_run(run, b)
    assert got == want
    assert_same_loads(a, b, expected_order=False)
    assert len(seen) == len(run)
    assert all(mine == answer for mine, answer in seen)
    if asked:
        assert all(mine for mine, _ in seen) and len(calls) == 1


def test_the_refusal_is_asked_again_only_after_a_receiver_was(monkeypatch):
    """Not vacuous: from empty tables, rows of two and three come to be refused midway
    (asked again after the cells that asked receivers), with fewer calls than cells."""
    flips = skipped = 0
    for seed, layout in [(0, "rows2"), (1, "rows2"), (0, "rows3")]:
        rng = random.Random(seed)
        cluster = regular_clusters(HOSTS, GPUS)["preset"]
        a, b = twin_loads(rng, cluster, False)
        _start(rng, (a, b), "empty")
        run = _run(rng, cluster, _receivers(rng, cluster, layout), 40, False)
        seen, calls = _watched(monkeypatch)
        grid_runs.plan_grid_run(run, b)
        monkeypatch.undo()
        states = [mine for mine, _ in seen]
        flips += not states[0] and states[-1]
        skipped += len(calls) < len(run)
    assert flips == skipped == 3
