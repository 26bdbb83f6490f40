"""Closing worker groups at interpreter exit (driver side)."""

from __future__ import annotations

import atexit
import functools
import weakref
from collections.abc import Callable
from typing import Any


def _close(ref: weakref.ref[Any]) -> None:
    group = ref()
    if group is not None:
        group.close()


def close_at_exit(group: Any) -> Callable[[], None]:
    """Run ``group.close()`` at interpreter exit without keeping ``group`` alive.

    Returns the registered handle; pass it to ``atexit.unregister`` once the group
    is closed.
    """
    handle = functools.partial(_close, weakref.ref(group))
    atexit.register(handle)
    return handle
