"""The reshard gRPC service (package ``reshard.v1``): ``reshard serve`` and
:class:`Client`.

See docs/service.md. Names load lazily, so that ``python -m reshard.service.regen``
works even while the generated stubs are stale.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Client", "RemoteArray", "ServeOptions", "Server", "ServiceError"]

_HOMES = {
    "Client": "reshard.service.client",
    "RemoteArray": "reshard.service.client",
    "ServeOptions": "reshard.service.options",
    "Server": "reshard.service.server",
    "ServiceError": "reshard.service.status",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'reshard.service' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)
