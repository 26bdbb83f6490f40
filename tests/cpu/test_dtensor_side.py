"""The DTensor side-by-side benchmark runs end to end (8 gloo processes, a small
tensor): both ways give equal results on every rank, and it prints a ratio per move."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cpu

pytest.importorskip("torch")


@pytest.mark.timeout(300)
def test_side_by_side_runs_and_agrees(capsys):
    from reshard.microbench import dtensor_side

    rc = dtensor_side.main(["--size", "64K", "-n", "1", "-w", "1",
                            "--moves", "P->R,R->S0,PS0->RS1"])
    out = capsys.readouterr().out
    assert rc == 0, out  # 0: no rank's results differ
    rows = [line.split() for line in out.splitlines() if line.startswith(("P->R", "R->S0",
                                                                             "PS0->RS1"))]
    assert [r[0] for r in rows] == ["P->R", "R->S0", "PS0->RS1"]
    assert all(float(r[5]) > 0 and r[6] == "0" for r in rows)  # a ratio, nothing wrong
