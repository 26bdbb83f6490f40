"""A hand-written schedule: read from text, validated, simulated, set against 1F1B.

Run ``python -m reshard.pipeline.examples.custom_schedule [gantt.png]``. The schedule
below is 1F1B for two stages except that stage 1 posts both receives up front.
Receives block, so stage 1 waits for the second activation before it starts the
first forward: with transfers of 0.5 the iteration takes 11 instead of 1F1B's 10.
The broken variant moves stage 0's gradient receive ahead of the activation send
that stage 1 needs first, which :func:`~reshard.pipeline.check` reports as a
deadlock with the cycle of waits.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from reshard.core.cliargs import add_version
from reshard.pipeline import (
    PipelineCosts,
    Schedule,
    ScheduleError,
    check,
    one_f_one_b,
    simulate,
)

CUSTOM = """\
microbatches=2 chunks=1
stage 0: F0 SA0 F1 SA1 RG0 B0 RG1 B1
stage 1: RA0 RA1 F0 B0 SG0 F1 B1 SG1
"""

BROKEN = """\
microbatches=2 chunks=1
stage 0: F0 RG0 SA0 F1 SA1 B0 RG1 B1
stage 1: RA0 F0 B0 SG0 RA1 F1 B1 SG1
"""


def main(argv: Sequence[str] | None = None) -> str:
    """Prints (and returns) the report; writes a Gantt chart if a path is given."""
    ap = argparse.ArgumentParser(prog="python -m reshard.pipeline.examples.custom_schedule",
                                 description="A schedule written as text, checked and "
                                             "simulated next to 1F1B")
    add_version(ap)
    ap.add_argument("plot", nargs="?", metavar="PATH.png",
                    help="also draw the custom schedule's Gantt chart there (matplotlib)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    costs = PipelineCosts(forward=1.0, backward=2.0, activation_transfer=0.5)
    custom = Schedule.from_text(CUSTOM)
    check(custom)
    lines = ["custom schedule:", custom.grid(), simulate(custom, costs).summary(), ""]
    lines += ["1F1B:", simulate(one_f_one_b(2, 2), costs).summary(), ""]
    try:
        check(Schedule.from_text(BROKEN))
    except ScheduleError as err:
        lines += ["broken variant:", str(err)]
    if args.plot:
        simulate(custom, costs).plot(args.plot, title="custom schedule")
        lines.append(f"wrote {args.plot}")
    report = "\n".join(lines)
    print(report)
    return report


if __name__ == "__main__":
    main()
