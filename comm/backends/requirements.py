"""What a built-in backend needs on this machine (a package, a GPU), asked before
anything starts so that a command line can say it as a usage error."""

from __future__ import annotations

import importlib.util

from reshard.comm.backend import builtin_backends


def needs_torch() -> str | None:
    """Why gloo cannot run here (no torch), or None."""
    if importlib.util.find_spec("torch") is None:
        return ("--backend gloo needs torch, which is not installed: pip install -c "
                "constraints.txt 'reshard[gloo]' (a CPU build), or use --backend local")
    return None


def needs_gpu() -> str | None:
    """Why nccl cannot run here (no cupy or no usable GPU), or None."""
    from reshard.comm.backends.nccl import available

    if not available():
        return ("--backend nccl needs cupy and an NVIDIA GPU with NCCL, and this machine "
                "has none usable: install the cuda12 or cuda13 extra on a GPU machine, or "
                "use --backend gloo (CPU processes)")
    return None


def needs_nixl() -> str | None:
    """Why nixl cannot run here (the package missing), or None."""
    from reshard.comm.backends.nixl import available

    return available()


def backend_problem(backend: str) -> str | None:
    """Why ``backend`` cannot run on this machine (a missing package, no GPU), or None
    (the registry's :attr:`~reshard.comm.backend.BackendEntry.requires`)."""
    registry = builtin_backends()
    return registry.entry(backend).problem() if backend in registry else None


__all__ = ["backend_problem", "needs_gpu", "needs_nixl", "needs_torch"]
