"""The reshard gRPC service (package ``reshard.v1``): ``reshard serve`` and
:class:`Client`.

See docs/service.md. Names load lazily, so that ``python -m reshard.service.regen``
works even while the generated stubs are stale.
"""

from __future__ import annotations

from reshard.lazy import lazy_attributes

__all__ = ["Client", "RemoteArray", "SearchResult", "ServeOptions", "Server", "ServiceError"]

_HOMES = {
    "Client": "reshard.service.client",
    "RemoteArray": "reshard.service.client",
    "SearchResult": "reshard.service.search_codec",
    "ServeOptions": "reshard.service.options",
    "Server": "reshard.service.server",
    "ServiceError": "reshard.service.status",
}

__getattr__ = lazy_attributes(__name__, _HOMES)
