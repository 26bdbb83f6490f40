"""Fixtures of the pure unit tier (checks and random problems: tests/common.py)."""

from __future__ import annotations

import pytest

import reshard


@pytest.fixture
def local_runtime():
    with reshard.Runtime(backend="local") as rt:
        yield rt
