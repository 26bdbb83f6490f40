"""The benchmarks' shared measurement pieces (microbench/measure.py, report.table)."""

from __future__ import annotations

import numpy as np
import pytest

from reshard import Cluster, DeviceMesh, Layout, Runtime
from reshard.microbench.measure import (
    count_wrong,
    measure_strategies,
    measured_row,
    sample_value,
    time_execute,
)
from reshard.microbench.report import scaled, table
from reshard.microbench.suites.paper import n_to_m_cases


class _Out:
    """What Runtime.execute returns of a tensor: a DArray (no scales delivered)."""

    def __init__(self, n: int):
        self.n = n
        self.scales = None


class _Runtime:
    """Records execute / free / check in order."""

    def __init__(self):
        self.log: list[tuple] = []

    def execute(self, plan, xs):
        self.log.append(("execute",))
        return [_Out(sum(1 for e in self.log if e[0] == "execute"))]

    def free(self, *ys):
        self.log.append(("free", *(y.n for y in ys)))


def test_time_execute_runs_frees_and_checks_the_chosen_run():
    rt = _Runtime()
    median, times, got = time_execute(rt, None, [], runs=3, warmup=2,
                                      check=lambda ys: ys[0].n, check_run=-1)
    assert len(times) == 3 and median == sorted(times)[1]
    assert got == 5  # the last run, checked before its free
    assert rt.log == [("execute",), ("free", 1), ("execute",), ("free", 2), ("execute",),
                      ("free", 3), ("execute",), ("free", 4), ("execute",), ("free", 5)]
    _, _, first = time_execute(_Runtime(), None, [], runs=1, warmup=0,
                               check=lambda ys: ys[0].n)
    assert first == 1
    assert time_execute(_Runtime(), None, [], runs=1, warmup=1)[2] is None
    ticks: list[int] = []
    rt = _Runtime()
    time_execute(rt, None, [], runs=2, warmup=1, on_run=lambda: ticks.append(len(rt.log)))
    assert ticks == [2, 4, 6]  # after each run's free, warm-ups included


def test_measure_strategies_on_local_backend():
    case = n_to_m_cases()[0].narrowed(1).with_shape((4, 6, 2))
    cluster = Cluster.regular(4, 1)
    src, dst = case.layouts_on(cluster)
    value = sample_value(case.shape, case.dtype)
    assert np.array_equal(value, sample_value(case.shape, case.dtype))  # seeded
    with Runtime("local", cluster, "thread") as rt:
        got = list(measure_strategies(rt, value, src, dst, ["send_recv", "broadcast"],
                                      runs=2, warmup=1))
        assert [m.strategy for m in got] == ["send_recv", "broadcast"]
        assert all(m.wrong == 0 and len(m.times) == 2 and m.load_seconds is not None
                   for m in got)
        row = measured_row(case, src, dst, got[0], extra=1)
        assert row["shape"] == [4, 6, 2] and row["tensor_bytes"] == case.nbytes
        assert list(row)[-2:] == ["extra", "wrong"] and row["wrong"] == 0
        assert measured_row(case, src, dst, got[0], wrong="n/a")["wrong"] == "n/a"
        x = rt.put(value, src)
        y = rt.reshard(x, Layout(DeviceMesh((2,), [2, 3]), "RS0R"))
        assert count_wrong(rt, y, value) == 0
        assert count_wrong(rt, y, value + 1) == value.size


def test_table_formats_scaled_columns():
    text = table([{"b": 2_500_000, "s": 0.5}], [("b", "size MB", scaled(1e-6, ".1f")),
                                                ("s", "time s")])
    assert text.splitlines() == ["size MB  time s", "-------  ------", "    2.5   0.500"]


def test_cpu_steal_from_proc_stat(tmp_path):
    from reshard.microbench.steal import CpuTimes, cpu_times

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 10 0 5 30 0 0\ncpu0 50 2 25 400 5 0 2 15 0 0\n")
    before = cpu_times(str(stat))
    assert before == CpuTimes(total=1000, steal=30)
    stat.write_text("cpu  200 5 90 900 10 0 5 90 7 0\n")  # guest ticks already in user
    after = cpu_times(str(stat))
    assert after == CpuTimes(total=1300, steal=90)
    assert after.stolen_since(before) == pytest.approx(60 / 300)
    assert after.stolen_since(after) == 0.0
    assert cpu_times(str(tmp_path / "missing")) is None
    stat.write_text("intr 1 2 3\n")
    assert cpu_times(str(stat)) is None
