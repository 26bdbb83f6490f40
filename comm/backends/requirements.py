"""What a built-in backend needs on this machine (a package, a GPU), asked before
anything starts so that a command line can say it as a usage error."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from types import MappingProxyType

from reshard.comm.backend import BackendKind


def _needs_torch() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return ("--backend gloo needs torch, which is not installed: pip install -c "
                "constraints.txt 'reshard[gloo]' (a CPU build), or use --backend local")
    return None


def _needs_gpu() -> str | None:
    from reshard.comm.backends.nccl import available

    if not available():
        return ("--backend nccl needs cupy and an NVIDIA GPU with NCCL, and this machine "
                "has none usable: install the cuda12 or cuda13 extra on a GPU machine, or "
                "use --backend gloo (CPU processes)")
    return None


_REQUIREMENTS: Mapping[str, Callable[[], str | None]] = MappingProxyType({
    BackendKind.GLOO.value: _needs_torch,
    BackendKind.NCCL.value: _needs_gpu,
})


def backend_problem(backend: str) -> str | None:
    """Why ``backend`` cannot run on this machine (a missing package, no GPU), or None."""
    check = _REQUIREMENTS.get(backend)
    return check() if check is not None else None


__all__ = ["backend_problem"]
