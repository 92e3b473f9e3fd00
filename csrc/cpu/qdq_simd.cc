// SIMD walkers (see qdq_simd.h). Compiled with -DMXOPS_SIMD_WIDTH=8 (-mavx2) and =16
// (-mavx512f -mavx512bw -mavx512vl -mavx512dq); GCC vector extensions keep one source for both.
//
// Each lane does, in float32 / int32, exactly what the scalar functions of numerics.h do for
// one element; two places use an equivalent, cheaper form, both exact:
//  - round half to even of |v| < 2^22 as (v + 1.5*2^23) - 1.5*2^23 (the FPU's default
//    nearest-even addition), with v = ±0 passed through so -0 stays -0 as floor() keeps it;
//  - an MX floating element rounded as (|v| + c) - c with c = 2^(E - mb + 23), E the element
//    exponent of |v| clamped below at emin: the addition rounds |v| to a multiple of
//    2^(E - mb) to nearest even, which is round_significand(.., kHalfEven, ..) of numerics.h.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../common/bf16_qdq.h"
#include "../common/block_ops.h"
#include "qdq_simd.h"

#ifndef MXOPS_SIMD_WIDTH
#error "compile with -DMXOPS_SIMD_WIDTH=8 or 16"
#endif

#define MXOPS_CAT2(a, b) a##b
#define MXOPS_CAT(a, b) MXOPS_CAT2(a, b)
#define MXOPS_SIMD_NS MXOPS_CAT(simd, MXOPS_SIMD_WIDTH)

#ifndef MXOPS_TILE
#define MXOPS_TILE 128
#endif
#ifndef MXOPS_PF_LOCALITY
#define MXOPS_PF_LOCALITY 2
#endif
#ifndef MXOPS_PREFETCH
#define MXOPS_PREFETCH 2048
#endif
#define VINL inline __attribute__((always_inline))

namespace mxops::cpu::MXOPS_SIMD_NS {
namespace {

constexpr int W = MXOPS_SIMD_WIDTH;
typedef float F __attribute__((vector_size(4 * W)));
typedef int32_t I __attribute__((vector_size(4 * W)));
typedef uint32_t U __attribute__((vector_size(4 * W)));
typedef uint16_t H __attribute__((vector_size(2 * W)));

// Elements per contiguous chunk (a multiple of every power-of-two group up to it), columns
// per strided tile, and elements per parallel task.
constexpr int64_t kChunk = 16384;
constexpr int64_t kTileColumns = MXOPS_TILE;
constexpr int64_t kTileVectors = kTileColumns / W;
constexpr int64_t kElementsPerTask = 1 << 16;
// Software prefetch distance along a stream, in bytes: the per-line work of the block walk is
// long enough that the hardware prefetchers alone leave the loads waiting on memory.
constexpr int64_t kPrefetchBytes = MXOPS_PREFETCH;

VINL int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
VINL int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

VINL I splat(int v) { return I{} + v; }
VINL U splatu(uint32_t v) { return U{} + v; }
VINL F splatf(float v) { return F{} + v; }
VINL U bits(F f) { return (U)f; }
VINL F flt(U u) { return (F)u; }
VINL I vmax(I a, I b) { return a > b ? a : b; }
VINL I vmin(I a, I b) { return a < b ? a : b; }

template <class V, class T>
VINL V load_vec(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V, class T>
VINL void store_vec(T* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

// Lane i <- lane i ^ d.
VINL I xor_lanes(I v, const I& mask) { return __builtin_shuffle(v, mask); }

VINL I iota() {
#if MXOPS_SIMD_WIDTH == 16
  return I{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#else
  return I{0, 1, 2, 3, 4, 5, 6, 7};
#endif
}

// ---------------------------------------------------------------------------------------
// Lane versions of numerics.h
// ---------------------------------------------------------------------------------------

VINL I exponent_v(U u) { return (I)((u >> 23) & 0xffu); }
VINL I finite_exponent_v(U u) {
  const I e = exponent_v(u);
  return e == 255 ? splat(0) : e;
}
VINL I is_special_v(U u) { return (I)((u & 0x7f800000u) == 0x7f800000u); }

VINL F pow2_v(I k) {
  k = vmin(vmax(k, splat(-149)), splat(127));
  const U normal = (U)(k + 127) << 23;
  const U subnormal = splatu(1u) << ((U)(k + 149) & 31u);
  return flt(k >= -126 ? normal : subnormal);
}

// True when every lane of a comparison mask is set.
VINL bool all_lanes(I mask) {
#if MXOPS_SIMD_WIDTH == 16
  return _mm512_movepi32_mask(reinterpret_cast<__m512i>(mask)) == 0xffff;
#else
  return _mm256_movemask_ps(reinterpret_cast<__m256>(mask)) == 0xff;
#endif
}

// 2^k for k in [-126, 127] (normal floats) only.
VINL F pow2_normal_v(I k) { return flt((U)(k + 127) << 23); }

VINL F copysign_v(F magnitude, F sign_source) {
  return flt((bits(magnitude) & 0x7fffffffu) | (bits(sign_source) & 0x80000000u));
}

VINL F floor_small_v(F v) {
  const F t = __builtin_convertvector(__builtin_convertvector(v, I), F);
  const F f = t > v ? t - 1.0f : t;
  return f == 0.0f ? copysign_v(f, v) : f;
}

// round_half<Mode> of numerics.h; Magic: Mode 2 for |v| < 2^22 by one addition.
template <int Mode, bool Magic>
VINL F round_half_v(F v) {
  if constexpr (Mode == kHalfEven && Magic) {
    const F r = (v + 12582912.0f) - 12582912.0f;
    return v == 0.0f ? v : r;
  } else if constexpr (Mode == kHalfEven) {
    const F f = floor_small_v(v);
    const F d = v - f;
    const I f_odd = (__builtin_convertvector(f, I) & 1) != 0;
    return ((d > 0.5f) | ((d == 0.5f) & f_odd)) ? f + 1.0f : f;
  } else {
    const F a = flt(bits(v) & 0x7fffffffu);
    const F fa = floor_small_v(a);
    const F away = copysign_v(a - fa >= 0.5f ? fa + 1.0f : fa, v);
    if constexpr (Mode == kHalfUp) {
      const F f = floor_small_v(v);
      return ((v < 0.0f) & (v - f == 0.5f)) ? copysign_v(f + 1.0f, v) : away;
    }
    return away;
  }
}

struct DivisorV {
  F a, b;
};
VINL DivisorV divisor_v(I k) {
  const I inv = -k;
  return DivisorV{pow2_v(vmin(inv, splat(127))), pow2_v(inv > 127 ? inv - 127 : splat(0))};
}

// (x / 2^k as (x * a) * b, 2^k), with a cheap path when every lane's 2^k and 2^-k are normal.
struct ScaleV {
  DivisorV div;
  F scale;
};
VINL ScaleV scale_v(I k) {
  if (all_lanes((k >= -126) & (k <= 126)))
    return ScaleV{DivisorV{pow2_normal_v(-k), splatf(1.0f)}, pow2_normal_v(k)};
  return ScaleV{divisor_v(k), pow2_v(k)};
}

// ---------------------------------------------------------------------------------------
// Policies: key (the per-element exponent a block maximum runs over), params from the block
// (and sub-block) maxima, apply. `Scalar` is the block_ops.h policy for tails.
// ---------------------------------------------------------------------------------------

template <int Mode, bool Magic>
struct BfpV {
  using Scalar = ToBfpPolicy<Mode>;
  static constexpr bool kSubBlocks = false, kBfp = true;
  struct Params {
    F a, b, scale, max_v;
  };
  Scalar s;
  float max_int;  // 2^m - 1
  VINL I key(F x) const { return finite_exponent_v(bits(x)); }
  VINL Params params(I blk, I) const {
    const ScaleV k = scale_v(blk - (127 + s.m - 1));
    return Params{k.div.a, k.div.b, k.scale, max_int * k.scale};
  }
  VINL F apply(F x, const Params& p) const {
    const I special = is_special_v(bits(x));
    F v = (x * p.a) * p.b;
    v = special ? splatf(0.0f) : v;
    F y = round_half_v<Mode, Magic>(v) * p.scale;
    y = y > p.max_v ? p.max_v : y;
    const F neg_max = -p.max_v;
    y = y < neg_max ? neg_max : y;
    return special ? x : y;
  }
};

template <int Mode>
struct PrimeV {
  using Scalar = ToBfpPrimePolicy<Mode>;
  static constexpr bool kSubBlocks = true, kBfp = true;
  struct Params {
    I t_base, nan;
    F mult;       // the quantum 2^(s - shift - 127 + 1 - m)
    F add, sat;   // fast path: quantum * 2^23 and (2^m - 1) * quantum
    bool fast;
  };
  Scalar s;
  float max_int;  // 2^m - 1
  VINL I key(F x) const { return exponent_v(bits(x)); }
  VINL Params params(I blk, I sub) const {
    const I shift = vmin(blk - sub, splat((1 << s.shift_bits) - 1));
    const I es = blk - shift;
    Params p;
    p.t_base = es + (24 - s.m);
    p.nan = blk == 255;
    p.mult = pow2_v(es + (1 - s.m - 127));
    // Mode 2 by one addition when quantum * 2^23 is a finite float in every lane (and no
    // block is Inf/NaN): (|x| + quantum * 2^23) - quantum * 2^23 rounds |x| to a multiple of
    // the quantum to nearest even, which is round_significand(.., kHalfEven, ..); min() with
    // (2^m - 1) * quantum is the saturation (a truncated q of 2^m - 1 is kept).
    p.fast = Mode == kHalfEven && all_lanes(es <= 230 + s.m);
    p.add = p.mult * 8388608.0f;
    p.sat = p.mult * max_int;
    return p;
  }
  VINL F apply(F x, const Params& p) const {
    const U u = bits(x);
    if (p.fast) {
      const U a_bits = u & 0x7fffffffu;
      const F a = (a_bits < 0x00800000u) ? splatf(0.0f) : flt(a_bits);  // subnormals flush
      F r = (a + p.add) - p.add;
      r = r > p.sat ? p.sat : r;
      return flt(bits(r) | (u & 0x80000000u));
    }
    const I e = exponent_v(u);
    const U M = e == 0 ? splatu(0u) : ((u & 0x7fffffu) | 0x800000u);
    const I tc = vmin(vmax(p.t_base - e, splat(0)), splat(25));
    const U q = M >> (U)tc;
    const U one_t = splatu(1u) << (U)tc;
    const I r = (I)(M & (one_t - 1u));
    const I h = (I)(one_t >> 1);
    I tie_up;
    if constexpr (Mode == kHalfAwayFromZero) tie_up = splat(-1);
    else if constexpr (Mode == kHalfUp) tie_up = (I)u >= 0;
    else tie_up = (I)(q & 1u) != 0;
    const I up = (tc > 0) & ((r > h) | ((r == h) & tie_up)) & ((I)q != ((1 << s.m) - 1));
    const U Mq = q + ((U)up & 1u);
    const F magnitude = __builtin_convertvector((I)Mq, F) * p.mult;
    const F y = flt(bits(magnitude) | (u & 0x80000000u));
    return p.nan ? flt(splatu(0x7fffffffu)) : y;
  }
};

template <int Mode, bool IsInt>
struct MxV {
  using Scalar = MxPolicy<Mode>;
  static constexpr bool kSubBlocks = false, kBfp = false;
  struct Params {
    F a, b, X;
  };
  Scalar s;
  VINL I key(F x) const { return finite_exponent_v(bits(x)); }
  VINL Params params(I blk, I) const {
    const ScaleV k = scale_v(blk - (127 + s.element.emax));
    return Params{k.div.a, k.div.b, k.scale};
  }
  VINL F apply(F x, const Params& p) const {
    const I special = is_special_v(bits(x));
    F v = (x * p.a) * p.b;
    v = special ? splatf(0.0f) : v;
    if constexpr (IsInt) {
      // |v * 64| < 2^8: the one-addition round is exact for mode 2
      F q = round_half_v<Mode, true>(v * 64.0f);
      q = q > 127.0f ? splatf(127.0f) : q;
      q = q < -128.0f ? splatf(-128.0f) : q;
      v = q * 0.015625f;
    } else {
      const MxElement& f = s.element;
      const U u = bits(v);
      const U a_bits = u & 0x7fffffffu;
      const I e = vmax(exponent_v(a_bits), splat(f.emin + 127));
      const F c = flt((U)(e + (23 - f.mantissa_bits)) << 23);
      F r = (flt(a_bits) + c) - c;
      r = r > f.max_normal ? splatf(f.max_normal) : r;
      v = r == 0.0f ? splatf(0.0f) : flt(bits(r) | (u & 0x80000000u));
    }
    const F y = p.X * v;
    return special ? x : y;
  }
};

// ---------------------------------------------------------------------------------------
// Storage types
// ---------------------------------------------------------------------------------------

struct F32V {
  using T = float;
  using Scalar = Float32;
  static VINL F load(const float* p) { return load_vec<F>(p); }
  static VINL void store(float* p, F v) { store_vec(p, v); }
};

struct BF16V {
  using T = uint16_t;
  using Scalar = BFloat16;
  static VINL F load(const uint16_t* p) {
    return flt(__builtin_convertvector(load_vec<H>(p), U) << 16);
  }
  static VINL void store(uint16_t* p, F f) {
    const U u = bits(f);
    const U rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const U nan = (u >> 16) | 0x40u;
    const U out = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    store_vec(p, __builtin_convertvector(out, H));
  }
};

struct F16V {
  using T = uint16_t;
  using Scalar = Float16;
  // F16C conversions: the same results as Float16's integer code, except that widening quiets
  // a signalling NaN, which no output shows (every NaN is stored with the quiet bit set)
  // unless convert_to_bfloat_before_bfp rounds it first (LoaderV uses load_emulated there).
  static VINL F load(const uint16_t* p) {
#if MXOPS_SIMD_WIDTH == 16
    return reinterpret_cast<F>(_mm512_cvtph_ps(load_vec<__m256i>(p)));
#else
    return reinterpret_cast<F>(_mm256_cvtph_ps(load_vec<__m128i>(p)));
#endif
  }
  static VINL void store(uint16_t* p, F f) {
#if MXOPS_SIMD_WIDTH == 16
    store_vec(p, _mm512_cvtps_ph(reinterpret_cast<__m512>(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
    store_vec(p, _mm256_cvtps_ph(reinterpret_cast<__m256>(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  }
  static VINL F load_emulated(const uint16_t* p) {
    const U h = __builtin_convertvector(load_vec<H>(p), U);
    const U sign = (h & 0x8000u) << 16;
    const U em = h & 0x7fffu;
    const U normal = (em << 13) + 0x38000000u;
    const U subnormal = bits(__builtin_convertvector((I)em, F) * 5.9604644775390625e-8f);
    const U special = 0x7f800000u | ((em & 0x3ffu) << 13);
    const U b = em >= 0x7c00u ? special : (em >= 0x400u ? normal : subnormal);
    return flt(sign | b);
  }
  static VINL void store_emulated(uint16_t* p, F f) {
    const U u = bits(f);
    const U sign = (u >> 16) & 0x8000u;
    const U a = u & 0x7fffffffu;
    const U nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    const U normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
    const U subnormal = bits(flt(a) + 0.5f) - 0x3f000000u;
    U h = a >= 0x38800000u ? normal : subnormal;
    h = a >= 0x477ff000u ? splatu(0x7c00u) : h;
    h = a > 0x7f800000u ? nan : h;
    store_vec(p, __builtin_convertvector(sign | h, H));
  }
};

template <class IO, bool Bf16First>
struct LoaderV {
  using T = typename IO::T;
  using Scalar = Loader<typename IO::Scalar, Bf16First>;
  static VINL F load(const T* p) {
    // bfloat16 rounding first can turn a NaN into Inf, so the payload must be exact there
    F f;
    if constexpr (Bf16First && std::is_same_v<IO, F16V>) f = IO::load_emulated(p);
    else f = IO::load(p);
    if constexpr (Bf16First) return flt((bits(f) + 0x7fffu + ((bits(f) >> 16) & 1u)) & 0xffff0000u);
    return f;
  }
  static VINL void store(T* p, F v) { IO::store(p, v); }
};

// ---------------------------------------------------------------------------------------
// Walkers
// ---------------------------------------------------------------------------------------

VINL int log2_exact(int64_t v) {
  int k = 0;
  while ((int64_t{1} << k) < v) ++k;
  return k;
}

template <class Ld, class Pol>
struct Walker {
  using T = typename Ld::T;
  using SLd = typename Ld::Scalar;
  using Params = typename Pol::Params;
  const T* x;
  T* y;
  int64_t outer, length, inner, bs, sub;
  Pol pol;

  // ---- scalar tails: the walk of qdq_cpu.cc, for `n` elements `stride` apart ----
  void scalar_block(int64_t base, int64_t n, int64_t stride) const {
    const auto& sp = pol.s;
    int s = 0;
    for (int64_t j = 0; j < n; ++j) s = imax(s, sp.key(SLd::load(x[base + j * stride])));
    const int64_t step = Pol::kSubBlocks ? sub : n;
    for (int64_t j0 = 0; j0 < n; j0 += step) {
      const int64_t j1 = min64(n, j0 + step);
      int sub_max = 0;
      if constexpr (Pol::kSubBlocks)
        for (int64_t j = j0; j < j1; ++j)
          sub_max = imax(sub_max, sp.key(SLd::load(x[base + j * stride])));
      const auto prm = sp.params(s, sub_max);
      for (int64_t j = j0; j < j1; ++j)
        y[base + j * stride] = SLd::store(sp.apply(SLd::load(x[base + j * stride]), prm));
    }
  }

  // Prefetches the stream `kPrefetchBytes` ahead of p (read) and q (write).
  VINL static void prefetch(const T* p, T* q) {
    if constexpr (kPrefetchBytes > 0) {
      __builtin_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, 0, 3);
      __builtin_prefetch(reinterpret_cast<char*>(q) + kPrefetchBytes, 1, 3);
    }
  }

  // ---- blocked axis innermost: units are (row, chunk of kChunk elements) ----
  int64_t chunks_per_row() const { return (length + kChunk - 1) / kChunk; }

  void contiguous(int64_t u0, int64_t u1) const {
    // Locals: the vector stores (memcpy) may alias anything reachable through `this`, which
    // would reload every policy constant after each store.
    const Pol pol = this->pol;
    const T* const x = this->x;
    T* const y = this->y;
    const int64_t length = this->length, inner = this->inner, bs = this->bs, sub = this->sub;
    (void)inner;
    const int64_t cpr = chunks_per_row();
    const int64_t group = max64(bs, W);
    I masks[8] = {};
    const int steps = log2_exact(min64(bs, W));
    const int sub_steps = Pol::kSubBlocks ? log2_exact(sub) : steps;
    for (int k = 0; k < log2_exact(W); ++k) masks[k] = iota() ^ (1 << k);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t row = u / cpr, c0 = (u % cpr) * kChunk;
      const int64_t c1 = min64(length, c0 + kChunk);
      const int64_t base = row * length;
      const int64_t n_simd = (c1 - c0) / group * group;
      const T* px = x + base + c0;
      T* py = y + base + c0;
      if (bs >= W) {
        const int64_t nv = bs / W;
        for (int64_t g = 0; g < n_simd; g += group) {
          prefetch(px + g, py + g);
          I s = pol.key(Ld::load(px + g));
          for (int64_t i = 1; i < nv; ++i) {
            prefetch(px + g + i * W, py + g + i * W);
            s = vmax(s, pol.key(Ld::load(px + g + i * W)));
          }
          for (int k = 0; k < steps; ++k) s = vmax(s, xor_lanes(s, masks[k]));
          if constexpr (Pol::kSubBlocks) {
            for (int64_t i = 0; i < nv; ++i) {
              const F v = Ld::load(px + g + i * W);
              I sm = pol.key(v);
              for (int k = 0; k < sub_steps; ++k) sm = vmax(sm, xor_lanes(sm, masks[k]));
              Ld::store(py + g + i * W, pol.apply(v, pol.params(s, sm)));
            }
          } else {
            const Params p = pol.params(s, s);
            for (int64_t i = 0; i < nv; ++i)
              Ld::store(py + g + i * W, pol.apply(Ld::load(px + g + i * W), p));
          }
        }
      } else {
        for (int64_t g = 0; g < n_simd; g += W) {
          prefetch(px + g, py + g);
          const F v = Ld::load(px + g);
          const I k0 = pol.key(v);
          I s = k0;
          for (int k = 0; k < steps; ++k) s = vmax(s, xor_lanes(s, masks[k]));
          I sm = s;
          if constexpr (Pol::kSubBlocks) {
            sm = k0;
            for (int k = 0; k < sub_steps; ++k) sm = vmax(sm, xor_lanes(sm, masks[k]));
          }
          Ld::store(py + g, pol.apply(v, pol.params(s, sm)));
        }
      }
      for (int64_t j0 = c0 + n_simd; j0 < c1; j0 += bs)
        scalar_block(base + j0, min64(bs, c1 - j0), 1);
    }
  }

  // ---- blocked axis outer: units are (outer, block, tile of kTileColumns columns) ----
  int64_t tiles_per_row() const { return (inner + kTileColumns - 1) / kTileColumns; }
  int64_t blocks_along() const { return (length + bs - 1) / bs; }

  void strided(int64_t u0, int64_t u1) const {
    // Locals: the vector stores (memcpy) may alias anything reachable through `this`, which
    // would reload every policy constant after each store.
    const Pol pol = this->pol;
    const T* const x = this->x;
    T* const y = this->y;
    const int64_t length = this->length, inner = this->inner, bs = this->bs, sub = this->sub;
    (void)inner;
    const int64_t tpr = tiles_per_row(), ba = blocks_along();
    I s[kTileVectors], sm[kTileVectors];
    Params prm[kTileVectors];
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t tile = u % tpr, block = (u / tpr) % ba, o = u / (tpr * ba);
      const int64_t j0 = block * bs, n = min64(bs, length - j0);
      const int64_t col0 = tile * kTileColumns, cw = min64(kTileColumns, inner - col0);
      const int64_t nv = cw / W;
      const int64_t base = (o * length + j0) * inner + col0;
      const T* px = x + base;
      T* py = y + base;
      // pass 1 reads every row of the block; the next tile of these rows (same rows,
      // kTileColumns further) is prefetched meanwhile, for reading and for writing
      const bool ahead = col0 + 2 * kTileColumns <= inner;
      for (int64_t v = 0; v < nv; ++v) s[v] = pol.key(Ld::load(px + v * W));
      for (int64_t j = 1; j < n; ++j) {
        const T* row = px + j * inner;
        for (int64_t v = 0; v < nv; ++v) s[v] = vmax(s[v], pol.key(Ld::load(row + v * W)));
      }
      if (ahead && kPrefetchBytes > 0) {
        for (int64_t j = 0; j < n; ++j)
          for (int64_t c = 0; c < kTileColumns * int64_t(sizeof(T)); c += 64) {
            __builtin_prefetch(reinterpret_cast<const char*>(px + j * inner + kTileColumns) + c, 0, MXOPS_PF_LOCALITY);
            __builtin_prefetch(reinterpret_cast<char*>(py + j * inner + kTileColumns) + c, 1, MXOPS_PF_LOCALITY);
          }
      }
      const int64_t step = Pol::kSubBlocks ? sub : n;
      for (int64_t a = 0; a < n; a += step) {
        const int64_t b = min64(n, a + step);
        if constexpr (Pol::kSubBlocks) {
          for (int64_t v = 0; v < nv; ++v) sm[v] = pol.key(Ld::load(px + a * inner + v * W));
          for (int64_t j = a + 1; j < b; ++j) {
            const T* row = px + j * inner;
            for (int64_t v = 0; v < nv; ++v) sm[v] = vmax(sm[v], pol.key(Ld::load(row + v * W)));
          }
          for (int64_t v = 0; v < nv; ++v) prm[v] = pol.params(s[v], sm[v]);
        } else {
          for (int64_t v = 0; v < nv; ++v) prm[v] = pol.params(s[v], s[v]);
        }
        for (int64_t j = a; j < b; ++j) {
          const T* row = px + j * inner;
          T* out = py + j * inner;
          for (int64_t v = 0; v < nv; ++v) Ld::store(out + v * W, pol.apply(Ld::load(row + v * W), prm[v]));
        }
      }
      for (int64_t c = nv * W; c < cw; ++c) scalar_block(base + c, n, inner);
    }
  }

  void run(int64_t u0, int64_t u1) const {
    if (inner == 1) contiguous(u0, u1);
    else strided(u0, u1);
  }
};

VINL bool power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

template <class Fn>
void with_walker(const SimdOp& op, Fn&& fn) {
  auto with_loader = [&](auto pol) {
    auto go = [&](auto loader) {
      using Ld = decltype(loader);
      using T = typename Ld::T;
      fn(Walker<Ld, decltype(pol)>{static_cast<const T*>(op.x), static_cast<T*>(op.y), op.outer,
                                   op.length, op.inner, op.block_size, op.sub_block_size, pol});
    };
    constexpr bool kBfp = decltype(pol)::kBfp;
    auto with_io = [&](auto io) {
      using IO = decltype(io);
      if (kBfp && op.bf16_first) go(LoaderV<IO, true>{});
      else go(LoaderV<IO, false>{});
    };
    switch (op.dtype) {
      case 0: with_io(F32V{}); break;
      case 1: with_io(F16V{}); break;
      default: with_io(BF16V{}); break;
    }
  };
  auto with_mode = [&](auto mode_tag) {
    constexpr int kMode = decltype(mode_tag)::value;
    switch (op.method) {
      case 0: {
        const ToBfpPolicy<kMode> sp{op.mantissa_bits};
        const float max_int = static_cast<float>((1u << op.mantissa_bits) - 1u);
        if (kMode == kHalfEven && op.mantissa_bits <= 21)
          with_loader(BfpV<kMode, true>{sp, max_int});
        else
          with_loader(BfpV<kMode, false>{sp, max_int});
        break;
      }
      case 1:
        with_loader(PrimeV<kMode>{
            ToBfpPrimePolicy<kMode>{op.mantissa_bits, op.sub_block_size, op.sub_block_shift_bits},
            static_cast<float>((1u << op.mantissa_bits) - 1u)});
        break;
      default:
        if (op.element.is_int)
          with_loader(MxV<kMode, true>{MxPolicy<kMode>{op.element}});
        else if constexpr (kMode == kHalfEven)  // floating elements ignore the rounding mode
          with_loader(MxV<kMode, false>{MxPolicy<kMode>{op.element}});
        break;
    }
  };
  switch (op.rounding_mode) {
    case 0: with_mode(std::integral_constant<int, 0>{}); break;
    case 1: with_mode(std::integral_constant<int, 1>{}); break;
    default: with_mode(std::integral_constant<int, 2>{}); break;
  }
}

}  // namespace

bool prepare(SimdOp& op) {
  if (op.outer <= 0 || op.length <= 0 || op.inner <= 0 || op.block_size < 1) return false;
  if (op.method == 2 && !op.element.is_int) op.rounding_mode = 2;  // ignored by the math
  int64_t unit_elements;
  if (op.inner == 1) {
    // SIMD groups need power-of-two blocks (and sub-blocks no wider than a vector).
    if (!power_of_two(op.block_size) || op.block_size > kChunk) return false;
    if (op.method == 1 && (!power_of_two(op.sub_block_size) || op.sub_block_size > W))
      return false;
    const int64_t cpr = (op.length + kChunk - 1) / kChunk;
    op.units = op.outer * cpr;
    unit_elements = min64(op.length, kChunk);
  } else {
    if (op.inner < W) return false;
    const int64_t tpr = (op.inner + kTileColumns - 1) / kTileColumns;
    const int64_t ba = (op.length + op.block_size - 1) / op.block_size;
    op.units = op.outer * ba * tpr;
    unit_elements = min64(op.block_size, op.length) * min64(op.inner, kTileColumns);
  }
  op.units_per_task = max64(1, kElementsPerTask / unit_elements);
  return true;
}

void run_units(const SimdOp& op, int64_t begin, int64_t end) {
  with_walker(op, [&](const auto& walker) { walker.run(begin, end); });
}

void bf16_quantize_run(const float* x, uint16_t* y, int64_t n, float scale, uint16_t zero_point) {
  const float zp = BFloat16::load(zero_point);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    __builtin_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, 0, 3);
    __builtin_prefetch(reinterpret_cast<const char*>(y + i) + kPrefetchBytes / 2, 1, 3);
    const F v = load_vec<F>(x + i) / scale + zp;  // as bf16_quantize: x / scale + zp
    const U u = bits(v);
    const U rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const U out = (u & 0x7fffffffu) > 0x7f800000u ? splatu(0x7fc1u) : rounded;
    store_vec(y + i, __builtin_convertvector(out, H));
  }
  for (; i < n; ++i) y[i] = bf16_quantize(x[i], scale, zero_point);
}

void bf16_dequantize_run(const uint16_t* y, float* x, int64_t n, float scale, uint16_t zero_point) {
  const float zp = BFloat16::load(zero_point);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    __builtin_prefetch(reinterpret_cast<const char*>(y + i) + kPrefetchBytes / 2, 0, 3);
    __builtin_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, 1, 3);
    const F f = flt(__builtin_convertvector(load_vec<H>(y + i), U) << 16);
    store_vec(x + i, (f - zp) * scale);
  }
  for (; i < n; ++i) x[i] = bf16_dequantize(y[i], scale, zero_point);
}

}  // namespace mxops::cpu::MXOPS_SIMD_NS
