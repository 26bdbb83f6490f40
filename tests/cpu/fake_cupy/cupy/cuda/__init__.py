"""Fake ``cupy.cuda``: one device, streams that are always done."""

from __future__ import annotations

from . import runtime  # noqa: F401


class Event:
    done = True


class Stream:
    def __init__(self, non_blocking: bool = False) -> None:
        self.ptr = 0

    def record(self, event=None):
        return Event()

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass


_CURRENT = Stream()


def get_current_stream():
    return _CURRENT


class Device:
    def __init__(self, index: int = 0) -> None:
        self.id = index

    def use(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass
