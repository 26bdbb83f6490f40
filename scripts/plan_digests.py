"""The suites' plan digests: one line per suite and one over all (111 plans).

Every planner change that claims "plans unchanged" is checked with this script: run it
before and after and compare the lines. The suites are the paper's n-to-m cases (8), the
realistic suite (18), the weight-sync suite (4) and the testbed's realistic cases (7),
each planned with the three strategies on the case's own cluster.

    python scripts/plan_digests.py            # totals
    python scripts/plan_digests.py --each     # one line per plan too
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence

from reshard.microbench.suites import SUITES
from reshard.microbench.testbed_bench import realistic_cases as testbed_cases
from reshard.planner.plan import plan_many

STRATEGIES = ("send_recv", "allgather", "broadcast")


def suites() -> dict[str, Sequence]:
    """The four suites' cases by name."""
    return {"paper": SUITES["n-to-m"](), "realistic": SUITES["realistic"](),
            "weight-sync": SUITES["weight-sync"](), "testbed": testbed_cases()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--each", action="store_true", help="print every plan's digest")
    args = ap.parse_args(argv)
    total = hashlib.sha256()
    count = 0
    for name, cases in suites().items():
        h = hashlib.sha256()
        for case in cases:
            requests, cluster = case.build_many()
            for strategy in STRATEGIES:
                d = plan_many(requests, cluster=cluster, strategy=strategy).digest()
                h.update(d)
                total.update(d)
                count += 1
                if args.each:
                    print(f"  {name:12s} {case.name:28s} {strategy:10s} {d.hex()[:16]}")
        print(f"{name:12s} {len(cases):3d} cases  {h.hexdigest()[:16]}")
    print(f"all          {count:3d} plans  {total.hexdigest()[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
