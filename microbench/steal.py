"""CPU time the hypervisor took from this machine while a benchmark ran (steal).

On a virtual machine the hypervisor may run other guests on this machine's CPUs while
its own processes wait to run: Linux counts that time as *steal* in ``/proc/stat``.
The emulated testbed does its networking (veths, bridge, tc) in the kernel on the
same CPUs as the workers, so a run during which a third of the CPU time was stolen
measured 1.15-1.49x the bound where a quiet run of the same plan measured 1.04-1.09x.
Benchmarks record the stolen share of CPU time over each case, so a reader can tell
a slow plan from a busy neighbour.
"""

from __future__ import annotations

from dataclasses import dataclass

STAT = "/proc/stat"
NOISY = 0.05
"""A stolen share above which a measurement on this machine is not to be trusted."""


@dataclass(frozen=True)
class CpuTimes:
    """The machine's CPU time counters (clock ticks, every CPU together).

    Attributes:
        total: every state's ticks (user, nice, system, idle, iowait, irq, softirq,
            steal).
        steal: ticks the hypervisor gave to others while this machine wanted them.
    """

    total: int
    steal: int

    def stolen_since(self, before: CpuTimes) -> float:
        """The share of CPU time stolen between ``before`` and this reading (0 when no
        time passed)."""
        total = self.total - before.total
        return (self.steal - before.steal) / total if total > 0 else 0.0


def cpu_times(path: str = STAT) -> CpuTimes | None:
    """The counters now; None where the kernel gives none (not Linux, or a kernel
    older than 2.6.11 without the steal column)."""
    try:
        with open(path, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # guest time is already inside user / nice
    return CpuTimes(sum(ticks), ticks[7])


def stolen(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """The share stolen between two readings of :func:`cpu_times` (None where either
    is missing)."""
    return after.stolen_since(before) if before and after else None


def stolen_note(before: CpuTimes | None, after: CpuTimes | None) -> str:
    """``"; stolen CPU 1.2%"`` for the end of a result line (empty without readings)."""
    share = stolen(before, after)
    return "" if share is None else f"; stolen CPU {share:.1%}"


__all__ = ["NOISY", "CpuTimes", "cpu_times", "stolen", "stolen_note"]
