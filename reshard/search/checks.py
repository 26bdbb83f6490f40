"""What a search takes, checked once at its edge: numbers (numpy's scalars included),
layers' specs against the submeshes they run on, the layers a cluster can hold.

Every refusal is a :class:`reshard.SearchError` that names the argument, the layer or
the candidate, the bad value and what would be valid.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence

from reshard.errors import ReshardBaseError, SearchError
from reshard.layout import Layout
from reshard.mesh import DeviceMesh
from reshard.spec import ShardingSpec


def integer(value: object, what: str, low: int | None = None) -> int:
    """``value`` as an ``int`` (a Python or numpy integer; not a bool, a float or a
    string), at least ``low`` where given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SearchError(f"{what} must be an integer"
                          + ("" if low is None else f" >= {low}") + f", got {value!r}")
    out = operator.index(value)
    if low is not None and out < low:
        raise SearchError(f"{what} must be an integer >= {low}, got {out}")
    return out


def real(value: object, what: str, *, positive: bool = False) -> float:
    """``value`` as a finite ``float`` (a Python or numpy number; not a bool), ``> 0``
    where ``positive`` else ``>= 0``."""
    bad = isinstance(value, bool) or not isinstance(value, numbers.Real)
    out = math.nan if bad else float(value)  # type: ignore[arg-type]
    if bad or not math.isfinite(out) or out < 0 or (positive and out == 0):
        raise SearchError(f"{what} must be a finite number {'> 0' if positive else '>= 0'},"
                          f" got {value!r}")
    return out


def optional_limit(value: object, what: str) -> int | None:
    """A byte limit: None or an integer >= 0."""
    return None if value is None else integer(value, what, 0)


def shape_key(value: object, where: str) -> tuple[int, int]:
    """A submesh shape ``(hosts, devices per host)``, each an integer >= 1."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise SearchError(f"{where}: a submesh shape is (hosts, devices per host), got "
                          f"{value!r}")
    return (integer(value[0], f"{where}: the submesh's hosts", 1),
            integer(value[1], f"{where}: the submesh's devices per host", 1))


def spec_rank(text: object, where: str) -> int:
    """The rank of a candidate's layout ``text`` (a SearchError naming ``where`` if it
    is no ShardingSpec)."""
    if not isinstance(text, str):
        raise SearchError(f"{where} must be ShardingSpec text such as 'S0RR', got {text!r}")
    try:
        return ShardingSpec.parse(text).ndim
    except ReshardBaseError as e:
        raise SearchError(f"{where}: {e}") from None


def fits_submesh(text: str, shape: tuple[int, int], where: str,
                 seen: dict[tuple[str, tuple[int, int]], None]) -> None:
    """A SearchError naming ``where`` unless layout ``text`` fits a 2-d submesh of
    ``shape`` (every mesh axis it names exists); ``seen`` remembers those checked."""
    if (text, shape) in seen:
        return
    try:
        Layout(DeviceMesh(shape), text)
    except ReshardBaseError as e:
        raise SearchError(f"{where}: {e}") from None
    seen[(text, shape)] = None


__all__ = ["fits_submesh", "integer", "optional_limit", "real",
           "shape_key", "spec_rank"]
