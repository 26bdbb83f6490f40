"""A process's memory as Linux reports it (``/proc/<pid>/status``): what benchmarks
print next to their timings."""

from __future__ import annotations


def memory_mib(pid: int) -> dict[str, float]:
    """``{"VmRSS": ..., "VmHWM": ...}`` of process ``pid`` in MiB (resident now, and its
    peak); empty when the process is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "VmHWM"):
                    out[name] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def reset_peak(pid: int) -> None:
    """Start process ``pid``'s peak (VmHWM) over from its resident size now."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


__all__ = ["memory_mib", "reset_peak"]
