"""The fused cast kernels' CPU twin: :data:`reshard.kernels.cast_source.COMMON` (the
arithmetic and each GPU thread's work, ``__host__ __device__``) compiled for the CPU by
the system's C++ compiler, with one entry point per GPU kernel, of the same name and
arguments, that runs every thread of the launch's grid in turn. A
:class:`reshard.kernels.cast_launch.Launch` (what the GPU would get) runs here as
:func:`run`. What the twin cannot run is the device-only part of the kernels (thread
coordinates, the amax's warp reduction and atomics): the GPU tier checks those.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from reshard.kernels.cast_launch import Launch
from reshard.kernels.cast_source import COMMON, KERNELS

_QUANTIZE = re.compile(r"^RESHARD_QUANTIZE_V\((\w+), (\w+), (\w+), (\w+), (\d+)\)", re.MULTILINE)
_AMAX = re.compile(r"^RESHARD_AMAX\((\w+), (\w+), (\d+), (\d+)\)", re.MULTILINE)
_GRID = "i64 gx, i64 gy, i64 bx, i64 by"


def harness() -> str:
    """C++ source: COMMON, then a serial twin of every kernel KERNELS instantiates."""
    out = ["#include <stdint.h>", COMMON, "#define GRID " + _GRID]
    for name, src, t, s, v in _QUANTIZE.findall(KERNELS):
        for vec, suffix in ((1, "_v1"), (int(v), f"_v{v}")):
            out.append(
                f'extern "C" void {name}{suffix}(GRID, u8* dst, const u8* src, '
                f"const float* scales, GEO_PARAMS) {{ Geo p = GEO_MAKE; "
                f"for (i64 y = 0; y < gy * by; ++y) for (i64 x = 0; x < gx * bx; ++x) "
                f"quantize_part<{src}, {t}, {s}, {vec}>(p, dst, src, scales, y, gy * by, "
                f"x, gx * bx); }}")
    for name, src, v, u in _AMAX.findall(KERNELS):
        out.append(
            f'extern "C" void {name}(GRID, u32* amax, const u8* src, GEO_PARAMS) {{ '
            f"Geo p = GEO_MAKE; const i64 nty = p.n[0] * p.tiles, warps = gx * (bx / 32); "
            f"for (i64 y = 0; y < gy; ++y) for (i64 ty = y; ty < nty; ty += gy) "
            f"for (i64 xw = 0; xw < warps; ++xw) for (int lane = 0; lane < 32; ++lane) {{ "
            f"i64 keys[{u}]; u32 vals[{u}]; "
            f"amax_part<{src}, {v}, {u}>(p, src, ty, xw, lane, keys, vals); "
            f"for (int k = 0; k < {u}; ++k) if (keys[k] >= 0 && vals[k] > amax[keys[k]]) "
            f"amax[keys[k]] = vals[k]; }} }}")
    out.append(
        'extern "C" void reshard_scales(GRID, float* out, u8* codes, const u32* amax, i64 n, '
        "i64 mode, i64 top, i64 emax) { for (i64 i = 0; i < n; ++i) "
        "scales_one(out, codes, amax, i, mode, top, emax); }")
    out.append(
        'extern "C" void reshard_e8m0(GRID, u8* out, const u32* in, i64 n) { '
        "for (i64 i = 0; i < n; ++i) out[i] = encode_e8m0(in[i]); }")
    # the element functions alone, for exhaustive tests
    out.append(
        'extern "C" void twin_put(int t, const u32* in, void* out, i64 n) { for (i64 i = 0; '
        "i < n; ++i) { if (t == 0) ((u8*)out)[i] = Target<T_E4M3>::put(in[i]); "
        "else if (t == 1) ((u8*)out)[i] = Target<T_E5M2>::put(in[i]); "
        "else ((u16*)out)[i] = Target<T_BF16>::put(in[i]); } }")
    out.append(
        'extern "C" void twin_encode_f8(int t, const u32* in, u8* out, i64 n) { '
        "for (i64 i = 0; i < n; ++i) out[i] = t == 0 ? encode_f8<7, 3, 0x7Fu, 0x7Fu>(in[i]) "
        ": encode_f8<15, 2, 0x7Cu, 0x7Eu>(in[i]); }")
    out.append(
        'extern "C" void twin_div(const u32* a, const u32* b, u32* out, i64 n) { '
        "for (i64 i = 0; i < n; ++i) out[i] = div_like_host(a[i], b[i]); }")
    return "\n".join(out) + "\n"


def compiler() -> str | None:
    """The C++ compiler the twin builds with (None: none here)."""
    return shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


class Twin:
    """The compiled twin (a shared library) and a way to run launches on it."""

    def __init__(self, folder: Path) -> None:
        cxx = compiler()
        if cxx is None:
            raise RuntimeError("no C++ compiler (g++) to build the cast kernels' twin")
        text = harness()
        tag = hashlib.sha256(text.encode()).hexdigest()[:16]
        src, lib = folder / f"twin_{tag}.cpp", folder / f"twin_{tag}.so"
        if not lib.exists():
            src.write_text(text)
            subprocess.run([cxx, "-std=c++17", "-O2", "-ffp-contract=off", "-fno-fast-math",
                            "-shared", "-fPIC", "-o", str(lib), str(src)], check=True,
                           timeout=300)
        self.lib = ctypes.CDLL(str(lib))

    def run(self, go: Launch) -> None:
        """Every thread of ``go``'s grid, in turn, on host memory."""
        (gx, gy, _), (bx, by, _) = go.grid
        fn = getattr(self.lib, go.kernel)
        args = [ctypes.c_longlong(v) for v in (gx, gy, bx, by)]
        args += [ctypes.c_void_p(p) for p in go.pointers]
        args += [ctypes.c_longlong(v) for v in go.ints]
        fn(*args)

    def put(self, target: str, bits: np.ndarray) -> np.ndarray:
        """Clip and encode float32 bits to ``target``'s bits (the quantize's last step)."""
        t = {"float8_e4m3fn": 0, "float8_e5m2": 1, "bfloat16": 2}[target]
        bits = np.ascontiguousarray(bits, np.uint32)
        out = np.empty(bits.shape, np.uint16 if t == 2 else np.uint8)
        self.lib.twin_put(ctypes.c_int(t), _ptr(bits), _ptr(out), ctypes.c_longlong(bits.size))
        return out

    def encode_f8(self, target: str, bits: np.ndarray) -> np.ndarray:
        """Encode float32 bits to float8 bits without the clip."""
        t = {"float8_e4m3fn": 0, "float8_e5m2": 1}[target]
        bits = np.ascontiguousarray(bits, np.uint32)
        out = np.empty(bits.shape, np.uint8)
        self.lib.twin_encode_f8(ctypes.c_int(t), _ptr(bits), _ptr(out),
                                ctypes.c_longlong(bits.size))
        return out

    def div(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The kernels' division of float32 bits (NaNs as the host makes them)."""
        a, b = np.ascontiguousarray(a, np.uint32), np.ascontiguousarray(b, np.uint32)
        out = np.empty(a.shape, np.uint32)
        self.lib.twin_div(_ptr(a), _ptr(b), _ptr(out), ctypes.c_longlong(a.size))
        return out


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.__array_interface__["data"][0])
