"""Worker calls are typed values: every kind has an entry in the worker's dispatch
table, travels pickled unchanged, and runs what its kind says; anything else is
refused by name."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from reshard import ReshardError
from reshard.comm import calls
from reshard.comm.backends.local import LocalBackend, LocalFabric
from reshard.comm.worker import DISPATCH, DeviceWorker


def test_the_dispatch_table_covers_every_call_kind():
    assert set(DISPATCH) == set(calls.CALLS)
    assert set(calls.CALLS) == set(calls.WorkerCall.__args__)  # type: ignore[attr-defined]


def test_calls_pickle_unchanged():
    for call in (calls.LoadPlan(3, "{}", "link-1", coalesce=False), calls.UnloadPlan(3),
                 calls.Execute(3, ("a", None), ("b", None)), calls.Put("k", np.arange(4)),
                 calls.Get("k"), calls.Drop(("k",)), calls.Ping(), calls.Stats(),
                 calls.Attach("ext", "pkg.mod:Factory", (1, 2)),
                 calls.Invoke("ext", "run", (1,))):
        back = pickle.loads(pickle.dumps(call))
        assert type(back) is type(call)
        assert repr(back) == repr(call)


def test_a_worker_runs_each_call_by_its_kind():
    w = DeviceWorker(0, LocalBackend(0, LocalFabric(5.0)))
    assert w.run(calls.Ping()) == 0
    w.run(calls.Put("x", np.arange(6).reshape(2, 3)))
    assert np.array_equal(w.run(calls.Get("x")), np.arange(6).reshape(2, 3))
    assert w.run(calls.Stats())["arrays"] == 1
    w.run(calls.Drop(("x",)))
    assert w.run(calls.Stats())["arrays"] == 0
    with pytest.raises(ReshardError, match="holds no array 'x'"):
        w.run(calls.Get("x"))
    with pytest.raises(ReshardError, match=r"is not a worker call; valid: \['LoadPlan'"):
        w.run(("get", "x"))  # type: ignore[arg-type]
    with pytest.raises(ReshardError, match="plan 7 is not loaded"):
        w.run(calls.Execute(7, (), ()))
