"""The fused cast kernels' CUDA source: a cast to float8 (or bfloat16) in two passes over
the data, one kernel each: the max ``|x|`` per scale block, then quantize + encode.

:data:`COMMON` is the arithmetic, written as ``__host__ __device__`` functions of plain
integers: decoding bfloat16 / float32 bits, the scale of a block's amax (float32
division, powers of two read from the bits), the division of an element by its scale,
the saturating clip and the encoding into float8 / bfloat16 bits (round to nearest
even, integer arithmetic only), and what one GPU thread of each kernel does (which
elements it reads, which block each belongs to, what it writes). :data:`KERNELS` are
the ``__global__`` entry points: each computes its thread's coordinates and calls those
functions (the block amax adds a warp's reduction by block and one ``atomicMax`` per
block and warp). The tests compile :data:`COMMON` for the CPU with a C++ compiler and
run every thread of every kernel's grid through it serially, bit for bit against
:func:`reshard.core.casting.reference_cast` (tests/unit/test_cast_kernels.py); the GPU tier
runs the kernels themselves (tests/gpu/test_fused_casts.py).

Exactness: every float operation is one IEEE operation (``__fdiv_rn`` on the GPU, ``/``
on the CPU; no contraction can apply), so the GPU computes what numpy computes, except
for the NaN a division produces, which numpy's hardware (x86) takes from an operand (or
makes negative, ``inf / inf``) and a GPU makes canonical: :func:`div_like_host` rebuilds
the host's. A block amax is a max of the magnitudes' bits (non-negative floats order as
their bits; NaN above infinity), exact in any order.
"""

from __future__ import annotations

BASICS = r"""
#ifndef __CUDACC__
#define __host__
#define __device__
#define __forceinline__ inline
#endif
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

__host__ __device__ __forceinline__ u32 f2u(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  u32 u; __builtin_memcpy(&u, &f, 4); return u;
#endif
}
__host__ __device__ __forceinline__ float u2f(u32 u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f; __builtin_memcpy(&f, &u, 4); return f;
#endif
}
__host__ __device__ __forceinline__ float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
__host__ __device__ __forceinline__ int clz32(u32 x) {
#ifdef __CUDA_ARCH__
  return __clz(x);
#else
  return x ? __builtin_clz(x) : 32;
#endif
}
template <int BYTES>
__host__ __device__ __forceinline__ void copy_bytes(void* to, const void* from) {
#ifdef __CUDA_ARCH__
  if (BYTES == 16) *(uint4*)to = *(const uint4*)from;
  else if (BYTES == 8) *(uint2*)to = *(const uint2*)from;
  else if (BYTES == 4) *(u32*)to = *(const u32*)from;
  else if (BYTES == 2) *(u16*)to = *(const u16*)from;
  else *(u8*)to = *(const u8*)from;
#else
  __builtin_memcpy(to, from, BYTES);
#endif
}
"""
"""Types, bit casts, IEEE division and loads of 1-16 bytes, for the GPU and the CPU
(shared with the batched box copies, :mod:`reshard.comm.engine.box_batch`)."""

COMMON = BASICS + r"""
__host__ __device__ __forceinline__ bool is_nan(u32 u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

// the float32 bits of a source element: bfloat16 (u16) or float32 (u32)
__host__ __device__ __forceinline__ u32 decode(u16 b) { return (u32)b << 16; }
__host__ __device__ __forceinline__ u32 decode(u32 b) { return b; }

// a / b as the host's IEEE division gives it, NaN included: the first NaN operand,
// quieted; else (inf / inf, 0 / 0) x86's default NaN, negative
__host__ __device__ __forceinline__ u32 div_like_host(u32 a, u32 b) {
  u32 q = f2u(div_rn(u2f(a), u2f(b)));
  if (!is_nan(q)) return q;
  if (is_nan(a)) return a | 0x400000u;
  if (is_nan(b)) return b | 0x400000u;
  return 0xFFC00000u;
}

// clip to [-top, top] (top: the float32 bits of the target's largest finite value);
// NaN stays as it is
__host__ __device__ __forceinline__ u32 clip(u32 u, u32 top) {
  u32 mag = u & 0x7FFFFFFFu;
  return (mag > top && mag <= 0x7F800000u) ? ((u & 0x80000000u) | top) : u;
}

// float32 bits -> float8 bits, round to nearest even; NaN keeps its sign, values past
// the largest finite one become OVER (e4m3fn: its NaN; e5m2: its infinity)
template <int BIAS, int MANT, u32 OVER, u32 NANC>
__host__ __device__ __forceinline__ u8 encode_f8(u32 u) {
  u32 sign = (u >> 24) & 0x80u;
  u32 mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return (u8)(NANC | sign);
  if (mag < ((u32)(128 - BIAS) << 23)) {  // below the smallest normal: a subnormal step
    u32 e = mag >> 23;
    u32 sig = e ? ((mag & 0x7FFFFFu) | 0x800000u) : mag;
    int sh = (1 - BIAS - MANT) - (e ? (int)e - 150 : -149);  // >= 1
    u32 q = 0;
    if (sh < 32) {
      q = sig >> sh;
      u32 rem = sig & ((1u << sh) - 1u), half = 1u << (sh - 1);
      if (rem > half || (rem == half && (q & 1u))) q += 1u;
    }
    return (u8)(q | sign);
  }
  const int shift = 23 - MANT;
  i64 t = (i64)mag - ((i64)(127 - BIAS) << 23);
  i64 code = (t + ((1 << (shift - 1)) - 1) + ((t >> shift) & 1)) >> shift;
  if (code > (i64)OVER) code = OVER;
  return (u8)((u32)code | sign);
}

// float32 bits -> bfloat16 bits, round to nearest even; NaN: its sign | 0x7FC0
__host__ __device__ __forceinline__ u16 encode_bf16(u32 u) {
  if (is_nan(u)) return (u16)(((u >> 16) & 0x8000u) | 0x7FC0u);
  return (u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// the targets: e4m3fn, e5m2 (scaled or not), bfloat16
enum { T_E4M3 = 0, T_E5M2 = 1, T_BF16 = 2 };
#define TOP_E4M3 0x43E00000u  /* 448 */
#define TOP_E5M2 0x47600000u  /* 57344 */

template <int T> struct Target;
template <> struct Target<T_E4M3> {
  typedef u8 out;
  static __host__ __device__ __forceinline__ u8 put(u32 u) {
    return encode_f8<7, 3, 0x7Fu, 0x7Fu>(clip(u, TOP_E4M3));
  }
};
template <> struct Target<T_E5M2> {
  typedef u8 out;
  static __host__ __device__ __forceinline__ u8 put(u32 u) {
    return encode_f8<15, 2, 0x7Cu, 0x7Eu>(clip(u, TOP_E5M2));
  }
};
template <> struct Target<T_BF16> {
  typedef u16 out;
  static __host__ __device__ __forceinline__ u16 put(u32 u) { return encode_bf16(u); }
};

// ---- scales of a block's amax (bits; non-negative or NaN) ----
enum { M_TENSOR = 1, M_BLOCK = 2, M_UE8M0 = 3, M_MX = 4 };

__host__ __device__ __forceinline__ u32 pow2_bits(int k) {  // 2^k, k in [-127, 127]
  return k >= -126 ? (u32)(k + 127) << 23 : 0x00400000u;
}
__host__ __device__ __forceinline__ int floor_log2(u32 x) {  // x > 0, finite
  u32 e = x >> 23;
  return e ? (int)e - 127 : (31 - clz32(x)) - 149;
}
__host__ __device__ __forceinline__ int ceil_log2(u32 x) {  // x > 0, finite
  u32 e = x >> 23, m = x & 0x7FFFFFu;
  if (e) return m ? (int)e - 126 : (int)e - 127;
  int p = 31 - clz32(m);
  return (m == (1u << p)) ? p - 149 : p - 148;
}
// top: the target's largest finite value (bits); emax: its exponent
__host__ __device__ __forceinline__ u32 scale_of(u32 a, int mode, u32 top, int emax) {
  if (mode == M_TENSOR || mode == M_BLOCK)
    return (a != 0u && !is_nan(a)) ? f2u(div_rn(u2f(a), u2f(top))) : 0x3F800000u;
  if (a >= 0x7F800000u) return 0x7FC00000u;  // NaN or infinite: NaN
  int k;
  if (mode == M_UE8M0) {
    u32 x = f2u(div_rn(u2f(a), u2f(top)));
    k = (a == 0u || x == 0u) ? 0 : ceil_log2(x);
  } else {
    k = a == 0u ? -127 : floor_log2(a) - emax;
  }
  k = k < -127 ? -127 : (k > 127 ? 127 : k);
  return pow2_bits(k);
}
// float32 bits -> E8M0 code (as ml_dtypes rounds: the mantissa rounded half up; below
// 2^-126 code 0 up to 2^-127, 1 above; NaN, zero, negatives and overflow 255)
__host__ __device__ __forceinline__ u8 encode_e8m0(u32 u) {
  if (is_nan(u) || (u & 0x80000000u) || u == 0u) return 255;
  u32 code = u < (1u << 23) ? (u > (1u << 22) ? 1u : 0u) : (u + (1u << 22)) >> 23;
  return code > 254u ? 255 : (u8)code;
}

// one element of the scales kernel (and of the E8M0 one)
__host__ __device__ __forceinline__ void scales_one(float* out, u8* codes, const u32* amax,
                                                    i64 i, i64 mode, i64 top, i64 emax) {
  u32 s = scale_of(amax[i], (int)mode, (u32)top, (int)emax);
  out[i] = u2f(s);
  if (codes) codes[i] = encode_e8m0(s);
}

// ---- a cast's view: up to three dims (L, R, C), C innermost ----
struct Geo {
  i64 n[3];    // extents
  i64 ss[3];   // source strides, elements
  i64 ds[3];   // destination strides, elements
  i64 g[3];    // global index of the first element, per dim (for its block)
  i64 sh[3];   // log2 of the block's edge per dim (62: one block)
  i64 st[3];   // strides of the scales (amax) array per block index
  i64 base;    // offset of the scales added to every element's
  i64 tsh;     // amax: log2 of the rows of a row tile (within one block of R)
  i64 t0;      // amax: the first row tile's index (global rows >> tsh)
  i64 tiles;   // amax: row tiles per index of L
};
#define GEO_PARAMS i64 n0, i64 n1, i64 n2, i64 ss0, i64 ss1, i64 ss2, i64 ds0, i64 ds1, \
  i64 ds2, i64 g0, i64 g1, i64 g2, i64 sh0, i64 sh1, i64 sh2, i64 st0, i64 st1, i64 st2, \
  i64 base, i64 tsh, i64 t0, i64 tiles
#define GEO_MAKE {{n0, n1, n2}, {ss0, ss1, ss2}, {ds0, ds1, ds2}, {g0, g1, g2}, \
  {sh0, sh1, sh2}, {st0, st1, st2}, base, tsh, t0, tiles}

// the scales' offset of row `row` (flattened L x R) at column c
__host__ __device__ __forceinline__ i64 row_scale(const Geo& p, i64 l, i64 r) {
  return p.base + ((p.g[0] + l) >> p.sh[0]) * p.st[0] + ((p.g[1] + r) >> p.sh[1]) * p.st[1];
}

// Quantize: one thread's part of rows row0, row0 + rstep, ... and, in each, vectors of
// V elements x0, x0 + xstep, ... (V > 1: C contiguous in both views, vectors inside one
// block, aligned). Without scales (S: false), only clip and encode.
template <typename SRC, int T, bool S, int V>
__host__ __device__ void quantize_part(const Geo& p, u8* dst, const u8* src,
                                       const float* scales, i64 row0, i64 rstep, i64 x0,
                                       i64 xstep) {
  typedef typename Target<T>::out OUT;
  const i64 rows = p.n[0] * p.n[1], nv = p.n[2] / V;
  for (i64 row = row0; row < rows; row += rstep) {
    const i64 l = row / p.n[1], r = row - l * p.n[1];
    const i64 so = l * p.ss[0] + r * p.ss[1], dof = l * p.ds[0] + r * p.ds[1];
    const i64 srow = S ? row_scale(p, l, r) : 0;
    for (i64 x = x0; x < nv; x += xstep) {
      const i64 c = x * V;
      alignas(16) SRC v[V];
      alignas(16) OUT o[V];
      if (V > 1) copy_bytes<V * sizeof(SRC)>(v, src + (so + c) * (i64)sizeof(SRC));
      else copy_bytes<sizeof(SRC)>(v, src + (so + c * p.ss[2]) * (i64)sizeof(SRC));
      u32 s = S ? f2u(scales[srow + ((p.g[2] + c) >> p.sh[2]) * p.st[2]]) : 0u;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        u32 u = decode(v[k]);
        o[k] = Target<T>::put(S ? div_like_host(u, s) : u);
      }
      if (V > 1) copy_bytes<V * sizeof(OUT)>(dst + (dof + c) * (i64)sizeof(OUT), o);
      else copy_bytes<sizeof(OUT)>(dst + (dof + c * p.ds[2]) * (i64)sizeof(OUT), o);
    }
  }
}

// Block amax: one lane's part of row tile `ty` (flattened L x tiles): U vectors of V
// elements (warp `xw`'s k-th round of 32 vectors, at lane `lane`), max |x| over the
// tile's rows, per vector: keys[k] the amax cell it belongs to (-1: past the row),
// vals[k] the max's bits; a vector whose cell equals the next one's hands its max on.
template <typename SRC, int V, int U>
__host__ __device__ void amax_part(const Geo& p, const u8* src, i64 ty, i64 xw, int lane,
                                   i64* keys, u32* vals) {
  const i64 l = ty / p.tiles, t = p.t0 + (ty - l * p.tiles);
  i64 lo = (t << p.tsh) - p.g[1], hi = ((t + 1) << p.tsh) - p.g[1];
  lo = lo < 0 ? 0 : lo;
  hi = hi > p.n[1] ? p.n[1] : hi;
  const i64 nv = p.n[2] / V;
  i64 col[U];
#pragma unroll
  for (int k = 0; k < U; ++k) {
    const i64 x = (xw * U + k) * 32 + lane;
    vals[k] = 0u;
    col[k] = x < nv ? x * V : -1;
    keys[k] = col[k] < 0 ? -1 : row_scale(p, l, lo) + ((p.g[2] + col[k]) >> p.sh[2]) * p.st[2];
  }
  for (i64 r = lo; r < hi; ++r) {
    const i64 so = l * p.ss[0] + r * p.ss[1];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      if (col[k] < 0) continue;
      alignas(16) SRC v[V];
      if (V > 1) copy_bytes<V * sizeof(SRC)>(v, src + (so + col[k]) * (i64)sizeof(SRC));
      else copy_bytes<sizeof(SRC)>(v, src + (so + col[k] * p.ss[2]) * (i64)sizeof(SRC));
#pragma unroll
      for (int e = 0; e < V; ++e) {
        u32 m = decode(v[e]) & 0x7FFFFFFFu;
        vals[k] = m > vals[k] ? m : vals[k];
      }
    }
  }
#pragma unroll
  for (int k = 0; k + 1 < U; ++k) {
    if (keys[k] >= 0 && keys[k] == keys[k + 1]) {
      vals[k + 1] = vals[k] > vals[k + 1] ? vals[k] : vals[k + 1];
      vals[k] = 0u;
    }
  }
}
"""
"""The arithmetic and each thread's work, for the GPU and (in the tests) the CPU."""

KERNELS = r"""
#ifdef __CUDACC__
#define FULL 0xFFFFFFFFu

// quantize: x threads along C's vectors, y threads over rows
template <typename SRC, int T, bool S, int V>
__device__ __forceinline__ void quantize_kernel(u8* dst, const u8* src, const float* scales,
                                                const Geo& p) {
  quantize_part<SRC, T, S, V>(p, dst, src, scales,
                              (i64)blockIdx.y * blockDim.y + threadIdx.y,
                              (i64)gridDim.y * blockDim.y,
                              (i64)blockIdx.x * blockDim.x + threadIdx.x,
                              (i64)gridDim.x * blockDim.x);
}
#define RESHARD_QUANTIZE(NAME, SRC, T, S, V)                                          \
  extern "C" __global__ void NAME(u8* dst, const u8* src, const float* scales,        \
                                  GEO_PARAMS) {                                       \
    Geo p = GEO_MAKE;                                                                 \
    quantize_kernel<SRC, T, S, V>(dst, src, scales, p);                               \
  }
#define RESHARD_QUANTIZE_V(NAME, SRC, T, S, V) \
  RESHARD_QUANTIZE(NAME##_v1, SRC, T, S, 1) RESHARD_QUANTIZE(NAME##_v##V, SRC, T, S, V)
RESHARD_QUANTIZE_V(reshard_quantize_bf16_e4m3_s, u16, T_E4M3, true, 8)
RESHARD_QUANTIZE_V(reshard_quantize_bf16_e5m2_s, u16, T_E5M2, true, 8)
RESHARD_QUANTIZE_V(reshard_quantize_bf16_e4m3_n, u16, T_E4M3, false, 8)
RESHARD_QUANTIZE_V(reshard_quantize_bf16_e5m2_n, u16, T_E5M2, false, 8)
RESHARD_QUANTIZE_V(reshard_quantize_f32_e4m3_s, u32, T_E4M3, true, 4)
RESHARD_QUANTIZE_V(reshard_quantize_f32_e5m2_s, u32, T_E5M2, true, 4)
RESHARD_QUANTIZE_V(reshard_quantize_f32_e4m3_n, u32, T_E4M3, false, 4)
RESHARD_QUANTIZE_V(reshard_quantize_f32_e5m2_n, u32, T_E5M2, false, 4)
RESHARD_QUANTIZE_V(reshard_quantize_f32_bf16_n, u32, T_BF16, false, 4)

// block amax: warps along C (U rounds of 32 vectors each), blocks of the grid's y over
// row tiles; per round, a warp's lanes in one cell combine (their cells rise with the
// lane: a segmented reduction) and the first of each does one atomicMax
template <typename SRC, int V, int U>
__device__ __forceinline__ void amax_kernel(u32* amax, const u8* src, const Geo& p) {
  const int lane = threadIdx.x & 31;
  const i64 xw = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const i64 nty = p.n[0] * p.tiles;
  for (i64 ty = blockIdx.y; ty < nty; ty += gridDim.y) {
    i64 keys[U];
    u32 vals[U];
    amax_part<SRC, V, U>(p, src, ty, xw, lane, keys, vals);
#pragma unroll
    for (int k = 0; k < U; ++k) {
      i64 key = keys[k];
      u32 val = vals[k];
      for (int o = 1; o < 32; o <<= 1) {
        i64 ok = __shfl_down_sync(FULL, key, o);
        u32 ov = __shfl_down_sync(FULL, val, o);
        if (lane + o < 32 && ok == key && ov > val) val = ov;
      }
      i64 prev = __shfl_up_sync(FULL, key, 1);
      if ((lane == 0 || prev != key) && key >= 0 && val) atomicMax(amax + key, val);
    }
  }
}
#define RESHARD_AMAX(NAME, SRC, V, U)                                                 \
  extern "C" __global__ void NAME(u32* amax, const u8* src, GEO_PARAMS) {              \
    Geo p = GEO_MAKE;                                                                 \
    amax_kernel<SRC, V, U>(amax, src, p);                                             \
  }
RESHARD_AMAX(reshard_amax_bf16_v1, u16, 1, 4)
RESHARD_AMAX(reshard_amax_bf16_v8, u16, 8, 4)
RESHARD_AMAX(reshard_amax_f32_v1, u32, 1, 4)
RESHARD_AMAX(reshard_amax_f32_v4, u32, 4, 4)

// scales of n amaxes (float32 values; E8M0 codes too where codes is not null)
extern "C" __global__ void reshard_scales(float* out, u8* codes, const u32* amax, i64 n,
                                          i64 mode, i64 top, i64 emax) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (i64)gridDim.x * blockDim.x)
    scales_one(out, codes, amax, i, mode, top, emax);
}
extern "C" __global__ void reshard_e8m0(u8* out, const u32* in, i64 n) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (i64)gridDim.x * blockDim.x)
    out[i] = encode_e8m0(in[i]);
}
#endif
"""
"""The entry points: ``reshard_quantize_<source>_<target>_<s|n>_v<V>`` (scaled or not;
V elements a thread's vector: 1, or 16 bytes of source), ``reshard_amax_<source>_v<V>``,
``reshard_scales``, ``reshard_e8m0``."""

SOURCE = COMMON + KERNELS
"""What the GPU compiles."""

AMAX_UNROLL = 4
"""Vectors per lane per row of an amax tile (``U`` of the amax kernels)."""

__all__ = ["AMAX_UNROLL", "BASICS", "COMMON", "KERNELS", "SOURCE"]
