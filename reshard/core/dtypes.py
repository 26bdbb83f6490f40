"""The dtype policy: which element types reshard moves, sums and casts, in one place.

Every dtype goes by one name, as numpy with ml_dtypes, torch and JAX spell it
(``"bfloat16"``, ``"float8_e4m3fn"``); numpy arrays of ml_dtypes' types are the CPU
representation (what JAX itself uses). Backends and adapters ask this module; none
keeps a dtype list of its own.

* **Moves**: every dtype of :data:`DTYPES`. Data moves as raw bytes, so the bits
  arrive unchanged whatever the type.
* **Sums** (partial-sum sources): a partial sum is accumulated in :func:`accumulator`
  of its dtype, and rounded once, when the sum is packed for the wire (or read by
  ``Runtime.get``): narrow floats (``float16``, ``bfloat16``) accumulate in
  ``float32``, every other summable dtype in itself. The reduction's messages carry
  the accumulator (so a reduction of bf16 addends moves float32), the delivery the
  tensor's own type. float32 addition is exact while the addends' magnitudes are
  within about ``2**(24 - 8 - log2(addends))`` of each other (bf16 carries 8
  significant bits); beyond that float32's own rounding applies, in the backend's
  order. ``bool`` (no sum) and the float8 kinds (addends of one block carry no common
  scale; sum in bfloat16 or float32, then cast) are refused as partial sources.
* **Casts** (:class:`Cast`): a reshard may deliver another floating dtype than it
  reads. The cast runs at the source, as the bytes are packed, so the wire carries
  the destination type and the cost model counts its bytes. To a float8 type the
  cast saturates to the type's largest finite value (``+-448`` for ``float8_e4m3fn``;
  NaN stays NaN) and may divide by scales first (:class:`ScaleMode`), so that
  ``x ~= q * scale``: one per tensor, or one per 128 x 128 block of the last two dims
  (DeepSeek-V3's weight blocks), each ``amax / max_finite`` in float32 (``1`` where a
  block is all zeros); per 128 x 128 block a power of two,
  ``2^ceil(log2(amax / max_finite))`` stored as ``float8_e8m0fnu`` (``block128-ue8m0``:
  DeepGEMM's and SGLang's scales on Blackwell); or MXFP8 (``mx32``, the OCP
  Microscaling spec v1.0): per 32 consecutive elements of the last dim
  ``2^(floor(log2(amax)) - emax)`` (``emax`` the element type's largest exponent: 8
  for e4m3, 15 for e5m2; ``2^-127`` for an all-zero block), stored as
  ``float8_e8m0fnu``. Exponents are exact (read from the float32's bits, not a
  rounded log) and clamped to E8M0's range ``[-127, 127]``; a NaN amax gives a NaN
  scale. Every conversion to float8 computes in float32 (a float64 source is rounded
  to float32 first); others round once, to nearest even (:mod:`reshard.core.casting` holds
  the kernels and the numpy reference).
* **Folded blocks** (``Cast(..., fold=True)``, the 128 x 128 modes): the blocks are
  those of the tensor's 2-D projection ``[product of the leading dims, last dim]``,
  128 rows by 128 columns, as an engine blocks a weight ``[out, in]`` that reshard
  moves as a grouped view of it (:mod:`reshard.core.packed`'s attention parts,
  ``(groups, rows per group, hidden)``): a block may span several groups
  (:func:`projection_block`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from reshard.core.choice import parse_choice
from reshard.core.errors import DTypeError

INTEGERS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
FLOATS = ("float16", "bfloat16", "float32", "float64")
FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
          "float8_e8m0fnu")
COMPLEX = ("complex64", "complex128")
DTYPES: tuple[str, ...] = ("bool", *INTEGERS, *FLOATS, *FLOAT8, *COMPLEX)
"""Every dtype reshard moves, by name."""

NARROW = ("bfloat16", *FLOAT8)
"""Dtypes plain numpy lacks (ml_dtypes provides them); array libraries without them
(cupy) hold them as unsigned integers of the same width (:func:`storage`)."""

CAST_TARGETS = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
"""Dtypes a cast may deliver (and, with float8 ones, scale to)."""

CAST_SOURCES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
"""Dtypes a cast may read."""

SCALED_TARGETS = ("float8_e4m3fn", "float8_e5m2")
"""Cast targets that take scales."""

BLOCK = 128
"""Edge of a scale block (``ScaleMode.BLOCK128``), on each of the last two dims."""

_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
            "float": "float32", "fp64": "float64", "double": "float64",
            "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def _lookup(name: str) -> np.dtype:
    found: np.dtype = np.dtype(getattr(ml_dtypes, name) if name in NARROW else name)
    return found


_BY_NAME: dict[str, np.dtype] = {n: _lookup(n) for n in DTYPES}
_NAME_OF: dict[np.dtype, str] = {dt: n for n, dt in _BY_NAME.items()}
"""Each supported numpy dtype's name (the executor names every shard's dtype on every
call: this skips :func:`parse_dtype`'s checks for the common case)."""


def is_torch(value: object) -> bool:
    """True for torch's objects (tensors, dtypes), told apart without importing torch."""
    return type(value).__module__.startswith("torch")


def parse_dtype(value: object) -> np.dtype:
    """The numpy dtype of ``value``, one of :data:`DTYPES`.

    Accepts a numpy dtype or scalar type (ml_dtypes' included), a name
    (``"bfloat16"``, ``"float8_e4m3fn"``, common short forms such as ``"bf16"``), a
    torch dtype (``torch.bfloat16``) or a JAX dtype.

    Raises:
        DTypeError: unknown or unsupported, listing the valid names.
    """
    if value is None:
        raise DTypeError(f"dtype is None; pass a dtype such as 'float32' or 'bfloat16' "
                         f"(valid: {list(DTYPES)})")
    if isinstance(value, str):
        text = value.strip().removeprefix("torch.")
        known = _BY_NAME.get(_ALIASES.get(text.lower(), text.lower()))
        if known is not None:
            return known
    elif is_torch(value):
        known = _BY_NAME.get(str(value).removeprefix("torch."))
        if known is None:
            raise DTypeError(f"torch dtype {value} is not supported; valid dtypes: "
                             f"{list(DTYPES)}")
        return known
    try:
        dt: np.dtype = np.dtype(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise DTypeError(f"unknown dtype {value!r}; valid dtypes: {list(DTYPES)}") from None
    if dt.name not in _BY_NAME or _BY_NAME[dt.name] != dt:
        raise DTypeError(
            f"dtype {dt} ({dt.str}) is not supported; valid dtypes: {list(DTYPES)} "
            f"(byte order native; no records, strings or objects)")
    return dt


def dtype_name(value: object) -> str:
    """The canonical name of a dtype (see :func:`parse_dtype`)."""
    if isinstance(value, np.dtype):
        name = _NAME_OF.get(value)
        if name is not None:
            return name
    return parse_dtype(value).name


def itemsize(name: str) -> int:
    """Bytes per element of dtype ``name``."""
    return _BY_NAME[name].itemsize if name in _BY_NAME else parse_dtype(name).itemsize


def accumulator(name: str) -> str | None:
    """The dtype partial sums of ``name`` are accumulated in (module docstring); None
    where a partial sum is refused (bool, float8)."""
    if name == "bool" or name in FLOAT8:
        return None
    if name in ("float16", "bfloat16"):
        return "float32"
    return name


_REDUCE_AS: dict[str, tuple[str, bool]] = {
    "uint32": ("int32", False), "uint64": ("int64", False),  # the same bits wrap alike
    "int16": ("int32", True), "uint16": ("int32", True),  # widened, wrapped back after
}


def reduce_as(name: str) -> tuple[str, bool]:
    """How a backend whose collectives lack ``name``'s sum (torch.distributed's gloo and
    NCCL: unsigned 32/64-bit, 16-bit integers) reduces it: the dtype to reduce in, and
    whether to widen into it (and wrap back after) rather than view the same bytes as
    it; ``(name, False)`` where the sum exists."""
    return _REDUCE_AS.get(name, (name, False))


def summable(name: str) -> bool:
    """True if a partial sum of ``name`` can be reduced."""
    return accumulator(name) is not None


def why_not_summable(name: str) -> str:
    """Why a partial sum of ``name`` is refused, and what to do instead."""
    if name == "bool":
        return "bool has no sum (it would add as logical or); use a numeric dtype"
    return (f"{name} has no sum (float8 addends carry no common scale): sum in bfloat16 "
            f"or float32 and cast to {name} on the way (cast=...)")


def storage(name: str) -> str:
    """The unsigned integer dtype of ``name``'s width (how a library without the type
    holds its bits); ``name`` itself for the dtypes plain numpy has."""
    if name not in NARROW:
        return name
    return {1: "uint8", 2: "uint16"}[itemsize(name)]


def max_exponent(name: str) -> int:
    """The exponent of floating dtype ``name``'s largest finite value (``emax``: 8 for
    float8_e4m3fn, 15 for float8_e5m2), which MX scales subtract."""
    return int(np.frexp(max_finite(name))[1]) - 1


def max_finite(name: str) -> float:
    """The largest finite value of floating dtype ``name`` (float8: the saturation
    bound of a cast)."""
    return float(ml_dtypes.finfo(_BY_NAME[name]).max)  # type: ignore[no-untyped-call]


def is_float8(name: str) -> bool:
    """True for the float8 kinds."""
    return name in FLOAT8


class ReduceOp(enum.Enum):
    """How the addends of a partial source combine: a sum, or (a scaled cast's amax)
    a max."""

    SUM = "sum"
    MAX = "max"


class ScaleMode(enum.Enum):
    """How a cast to float8 scales its values (see the module docstring)."""

    NONE = "none"  # saturate, no scale
    TENSOR = "tensor"  # one scale for the whole tensor
    BLOCK128 = "block128"  # one per 128 x 128 block of the last two dims
    BLOCK128_UE8M0 = "block128-ue8m0"  # the same blocks, powers of two stored as E8M0
    MX32 = "mx32"  # MXFP8: one E8M0 power of two per 32 elements of the last dim

    @property
    def scale_dtype(self) -> str:
        """The dtype of its scales tensor."""
        return "float8_e8m0fnu" if self in _POWER_OF_TWO else "float32"

    @property
    def min_rank(self) -> int:
        """The least tensor rank its blocks need (their dims)."""
        return _MIN_RANK.get(self, 0)

    @classmethod
    def parse(cls, value: str | ScaleMode | None) -> ScaleMode:
        """A ScaleMode or its name (None: NONE); raise listing the valid names."""
        if value is None:
            return cls.NONE
        return parse_choice(cls, value, "scale mode", DTypeError)


_POWER_OF_TWO = frozenset({ScaleMode.BLOCK128_UE8M0, ScaleMode.MX32})
_MIN_RANK = {ScaleMode.BLOCK128: 2, ScaleMode.BLOCK128_UE8M0: 2, ScaleMode.MX32: 1}

MX_BLOCK = 32
"""Elements of the last dim per MX scale block (``ScaleMode.MX32``)."""


_FOLDS = frozenset({ScaleMode.BLOCK128, ScaleMode.BLOCK128_UE8M0})


def projection_block(shape: Sequence[int]) -> tuple[int, ...]:
    """The edge per dim of a 128 x 128 block of the 2-D projection of ``shape``
    (``[product of the leading dims, last dim]``), as a box of ``shape``: 128 rows are
    ``128 / inner`` indices of the dim whose trailing leading dims hold ``inner`` rows.
    ``(g, 64, h)``: ``(2, 64, 128)``; ``(g, 512, h)``: ``(1, 128, 128)``.

    Raises:
        DTypeError: 128 rows of the projection are no box of ``shape`` (a dim's rows
            neither a multiple nor a divisor of 128, e.g. ``(g, 96, h)``).
    """
    dims = tuple(int(n) for n in shape)
    inner = 1
    for j in range(len(dims) - 2, -1, -1):
        if j == 0 or dims[j] * inner >= BLOCK:
            step = BLOCK // inner if BLOCK % inner == 0 else 0
            if step == 0 or (j > 0 and dims[j] % step):
                raise DTypeError(
                    f"a 128 x 128 block of the 2-D projection of shape {dims} (rows: the "
                    f"product of its leading dims) is no box of it: dim {j} holds "
                    f"{dims[j]} x {inner} rows, and 128 rows neither split nor gather "
                    f"them evenly; use a shape whose per-group rows divide or are "
                    f"divided by 128, or fold=False")
            return (1,) * j + (step, *dims[j + 1:-1], BLOCK)
        inner *= dims[j]
    raise DTypeError(f"a folded 128 x 128 block needs rank >= 2, got shape {dims}")


def block_shape(shape: Sequence[int], mode: ScaleMode, fold: bool = False) -> tuple[int, ...]:
    """The edge of one scale block per dim (``mode`` not NONE): the whole tensor for
    TENSOR, ``(1, ..., 1, 128, 128)`` for the 128 x 128 modes (with ``fold``: a block
    of the 2-D projection, :func:`projection_block`), ``(1, ..., 1, 32)`` for MX32."""
    if mode is ScaleMode.TENSOR:
        return tuple(max(int(n), 1) for n in shape)
    if mode in _FOLDS:
        if fold:
            return projection_block(shape)
        return (1,) * (len(shape) - 2) + (BLOCK, BLOCK)
    if mode is ScaleMode.MX32:
        return (1,) * (len(shape) - 1) + (MX_BLOCK,)
    raise DTypeError(f"scale mode {mode.value!r} has no blocks")


def scale_grid(shape: Sequence[int], mode: ScaleMode, fold: bool = False) -> tuple[int, ...]:
    """The shape of the scales tensor: blocks per dim (``fold``: as
    :func:`block_shape`; its row-major order is the 2-D projection's grid's)."""
    return tuple(-(-int(n) // b) for n, b in zip(shape, block_shape(shape, mode, fold)))


@dataclass(frozen=True)
class Cast:
    """A conversion on the wire: deliver ``dtype`` (scaled as ``scale`` says).

    Attributes:
        dtype: the destination dtype name (one of :data:`CAST_TARGETS`).
        scale: the scaling (float8 targets only).
        fold: the 128 x 128 modes' blocks are those of the tensor's 2-D projection
            (:func:`projection_block`; module docstring), not of its last two dims.
    """

    dtype: str
    scale: ScaleMode = ScaleMode.NONE
    fold: bool = False

    @classmethod
    def parse(cls, cast: object, scale: str | ScaleMode | None = None) -> Cast | None:
        """A Cast from a Cast, a dtype (or its name) and a scale mode; None for no cast
        (``cast`` None and no scale).

        Raises:
            DTypeError: an unknown dtype or scale mode, or scales without a dtype.
        """
        mode = ScaleMode.parse(scale)
        if isinstance(cast, Cast):
            if scale is not None and mode is not cast.scale:
                raise DTypeError(f"cast {cast} already names scale {cast.scale.value!r}; "
                                 f"drop scale={mode.value!r}")
            return cast
        if cast is None:
            if mode is not ScaleMode.NONE:
                raise DTypeError(
                    f"scale={mode.value!r} needs a float8 cast to scale to, e.g. "
                    f"cast='float8_e4m3fn'; valid scaled targets: {list(SCALED_TARGETS)}")
            return None
        return cls(dtype_name(cast), mode)

    def __str__(self) -> str:
        if self.scale is ScaleMode.NONE:
            return self.dtype
        return f"{self.dtype}/{self.scale.value}" + ("/fold" if self.fold else "")


def check_cast(src: str, cast: Cast, shape: Sequence[int], partial: bool) -> None:
    """Refuse a cast reshard cannot do, naming the value and the valid choices.

    Args:
        src: the source dtype name.
        cast: the cast.
        shape: the tensor's global shape.
        partial: the source is a partial sum (its scales would need the sum first).

    Raises:
        DTypeError: the rule broken, the value and what would be valid.
    """
    if src not in CAST_SOURCES:
        raise DTypeError(f"cannot cast from {src}: casts convert between floating types; "
                         f"valid sources: {list(CAST_SOURCES)}")
    if cast.dtype not in CAST_TARGETS:
        raise DTypeError(f"cannot cast to {cast.dtype}; valid targets: {list(CAST_TARGETS)}")
    if cast.fold and cast.scale not in _FOLDS:
        raise DTypeError(
            f"fold=True folds the 128 x 128 blocks of {[m.value for m in _FOLDS]}, but the "
            f"cast's scale is {cast.scale.value!r} (its blocks do not span rows); drop "
            f"fold")
    if cast.scale is ScaleMode.NONE:
        return
    if cast.dtype not in SCALED_TARGETS:
        raise DTypeError(
            f"scale={cast.scale.value!r} scales into a float8 type, but the cast is to "
            f"{cast.dtype}; use one of {list(SCALED_TARGETS)} or scale='none'")
    if src in FLOAT8:
        raise DTypeError(
            f"a scaled cast (scale={cast.scale.value!r}) reads the true values, but the "
            f"source is {src}, already quantized with scales reshard does not hold: "
            f"dequantize it first (to bfloat16 or float32), or move it as it is "
            f"(no cast)")
    if len(shape) < cast.scale.min_rank:
        what = (f"{BLOCK} x {BLOCK} blocks of the last two dims"
                if cast.scale.min_rank == 2 else f"blocks of {MX_BLOCK} along the last dim")
        raise DTypeError(
            f"scale={cast.scale.value!r} takes {what}, but the tensor has rank "
            f"{len(shape)} (shape {tuple(shape)}); use scale='tensor'"
            + ("" if cast.scale.min_rank == 2 or len(shape) else " or no scale"))
    if cast.fold:
        projection_block(shape)
    if partial:
        raise DTypeError(
            "a scaled cast of a partial sum needs the sum's amax: reshard it to a "
            "non-partial layout first, or cast without scales (scale='none')")


def numpy_of_torch(tensor: Any) -> np.ndarray:
    """A CPU torch tensor as a numpy array sharing its memory, in reshard's dtype
    (ml_dtypes' for bfloat16 and float8, which torch's ``numpy()`` refuses)."""
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in NARROW:
        return tensor.numpy()  # type: ignore[no-any-return]
    import torch

    bits = getattr(torch, storage(name))
    return tensor.view(bits).numpy().view(_BY_NAME[name])  # type: ignore[no-any-return]


def torch_of_numpy(array: np.ndarray) -> Any:
    """A numpy array as a CPU torch tensor sharing its memory, in torch's own dtype
    (``torch.bfloat16`` for an ml_dtypes bfloat16 array)."""
    import torch

    name = array.dtype.name
    if name not in NARROW:
        return torch.from_numpy(array)
    bits = torch.from_numpy(array.view(_BY_NAME[storage(name)]))
    return bits.view(getattr(torch, name))


def accumulate(addends: Sequence[np.ndarray], name: str) -> np.ndarray:
    """The reference partial sum: the addends summed in :func:`accumulator` (numpy,
    in order), rounded once to ``name``."""
    acc = accumulator(name)
    if acc is None:
        raise DTypeError(f"cannot sum {name}: {why_not_summable(name)}")
    total = np.array(addends[0], dtype=_BY_NAME[acc], copy=True)
    for a in addends[1:]:
        total += np.asarray(a).astype(_BY_NAME[acc])
    return total.astype(_BY_NAME[name])


__all__ = [
    "BLOCK",
    "CAST_SOURCES",
    "CAST_TARGETS",
    "COMPLEX",
    "DTYPES",
    "FLOAT8",
    "FLOATS",
    "INTEGERS",
    "MX_BLOCK",
    "NARROW",
    "SCALED_TARGETS",
    "Cast",
    "ReduceOp",
    "ScaleMode",
    "accumulate",
    "accumulator",
    "block_shape",
    "check_cast",
    "dtype_name",
    "is_float8",
    "itemsize",
    "max_exponent",
    "max_finite",
    "numpy_of_torch",
    "parse_dtype",
    "projection_block",
    "reduce_as",
    "scale_grid",
    "storage",
    "summable",
    "torch_of_numpy",
    "why_not_summable",
]
