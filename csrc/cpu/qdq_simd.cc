// SIMD walkers (see qdq_simd.h). Compiled with -DMXOPS_SIMD_WIDTH=8 (-mavx2) and =16
// (-mavx512f -mavx512bw -mavx512vl -mavx512dq); GCC vector extensions keep one source for both.
//
// The numeric work is numerics.h's, instantiated for vectors (simd_lanes.h); this file owns
// loads and stores, prefetching, the block and tile walk and the lane reductions, and picks the
// cheaper exact forms of numerics.h (one-addition rounding, normal-only powers of two) where
// every lane of a vector allows them.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../common/bf16_qdq.h"
#include "../common/block_ops.h"
#include "../common/simd_lanes.h"
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
using F = VectorLanes<W>::F;
using I = VectorLanes<W>::I;
using U = VectorLanes<W>::U;
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
// Policies: the block_ops.h policies with the lane type F. key, params and apply are the
// numerics.h functions instantiated for vectors; what is the backend's is choosing the
// cheaper exact form when every lane allows it (all_lanes). `Scalar` is the block_ops.h
// policy, for tails.
// ---------------------------------------------------------------------------------------

// True when every lane of a comparison mask is set.
VINL bool all_lanes(I mask) {
#if MXOPS_SIMD_WIDTH == 16
  return _mm512_movepi32_mask(reinterpret_cast<__m512i>(mask)) == 0xffff;
#else
  return _mm256_movemask_ps(reinterpret_cast<__m256>(mask)) == 0xff;
#endif
}

// Small: m <= 21, the one-addition round of round_half (kHalfEven).
template <int Mode, bool Small>
struct BfpV {
  using Scalar = ToBfpPolicy<Mode>;
  using Params = BfpScale<F>;
  static constexpr bool kSubBlocks = false, kBfp = true;
  Scalar s;
  VINL I key(F x) const { return finite_exponent(f2u(x)); }
  VINL Params params(I blk, I) const {
    if (all_lanes(pow2_pair_normal(bfp_scale_exponent(blk, s.m)))) return bfp_scale<true>(blk, s.m);
    return bfp_scale(blk, s.m);
  }
  VINL F apply(F x, const Params& p) const { return to_bfp_element<Mode, Small>(x, p); }
};

template <int Mode>
struct PrimeV {
  using Scalar = ToBfpPrimePolicy<Mode>;
  static constexpr bool kSubBlocks = true, kBfp = true;
  struct Params {
    BfpPrimeParams<F> core;
    bool by_addition;  // kHalfEven and bfp_prime_addition_exact in every lane
  };
  Scalar s;
  VINL I key(F x) const { return exponent_field(f2u(x)); }
  VINL Params params(I blk, I sub) const {
    Params p;
    p.core = bfp_prime_params(blk, sub, s.shift_bits, s.m);
    p.by_addition = Mode == kHalfEven && all_lanes(bfp_prime_addition_exact(p.core));
    return p;
  }
  VINL F apply(F x, const Params& p) const {
    if (p.by_addition) return bfp_prime_element_by_addition(x, p.core);
    return bfp_prime_element<Mode>(x, p.core, s.m);
  }
};

template <int Mode, bool IsInt>
struct MxV {
  using Scalar = MxPolicy<Mode>;
  using Params = MxScale<F>;
  static constexpr bool kSubBlocks = false, kBfp = false;
  Scalar s;
  VINL I key(F x) const { return finite_exponent(f2u(x)); }
  VINL Params params(I blk, I) const {
    const int emax = s.element.emax;
    if (all_lanes(pow2_pair_normal(mx_scale_exponent(blk, emax)))) return mx_scale<true>(blk, emax);
    return mx_scale(blk, emax);
  }
  VINL F apply(F x, const Params& p) const {
    return mx_element<Mode, IsInt ? kMxIntElement : kMxFloatElement>(x, p, s.element);
  }
};

// ---------------------------------------------------------------------------------------
// Storage types: vector loads and stores, widening / narrowing 16-bit lanes to 32-bit ones;
// the conversions of the bits are numerics.h's (or the F16C instructions, same results).
// ---------------------------------------------------------------------------------------

VINL U widen(const uint16_t* p) { return __builtin_convertvector(load_vec<H>(p), U); }
VINL void narrow(uint16_t* p, U v) { store_vec(p, __builtin_convertvector(v, H)); }

struct F32V {
  using T = float;
  using Scalar = Float32;
  static VINL F load(const float* p) { return load_vec<F>(p); }
  static VINL void store(float* p, F v) { store_vec(p, v); }
};

struct BF16V {
  using T = uint16_t;
  using Scalar = BFloat16;
  static VINL F load(const uint16_t* p) { return BFloat16::load_bits(widen(p)); }
  static VINL void store(uint16_t* p, F f) { narrow(p, BFloat16::store_bits(f)); }
};

struct F16V {
  using T = uint16_t;
  using Scalar = Float16;
  // F16C conversions: the same results as Float16's integer code, except that widening quiets
  // a signalling NaN, which no output shows (every NaN is stored with the quiet bit set)
  // unless convert_to_bfloat_before_bfp rounds it first (LoaderV uses load_exact there).
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
  static VINL F load_exact(const uint16_t* p) { return Float16::load_bits(widen(p)); }
};

template <class IO, bool Bf16First>
struct LoaderV {
  using T = typename IO::T;
  using Scalar = Loader<typename IO::Scalar, Bf16First>;
  static VINL F load(const T* p) {
    // bfloat16 rounding first can turn a NaN into Inf, so the payload must be exact there
    F f;
    if constexpr (Bf16First && std::is_same_v<IO, F16V>) f = IO::load_exact(p);
    else f = IO::load(p);
    if constexpr (Bf16First) return bf16_round_bits(f);
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
            s = imax(s, pol.key(Ld::load(px + g + i * W)));
          }
          for (int k = 0; k < steps; ++k) s = imax(s, xor_lanes(s, masks[k]));
          if constexpr (Pol::kSubBlocks) {
            for (int64_t i = 0; i < nv; ++i) {
              const F v = Ld::load(px + g + i * W);
              I sm = pol.key(v);
              for (int k = 0; k < sub_steps; ++k) sm = imax(sm, xor_lanes(sm, masks[k]));
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
          for (int k = 0; k < steps; ++k) s = imax(s, xor_lanes(s, masks[k]));
          I sm = s;
          if constexpr (Pol::kSubBlocks) {
            sm = k0;
            for (int k = 0; k < sub_steps; ++k) sm = imax(sm, xor_lanes(sm, masks[k]));
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
        for (int64_t v = 0; v < nv; ++v) s[v] = imax(s[v], pol.key(Ld::load(row + v * W)));
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
            for (int64_t v = 0; v < nv; ++v) sm[v] = imax(sm[v], pol.key(Ld::load(row + v * W)));
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
        if (kMode == kHalfEven && op.mantissa_bits <= 21)
          with_loader(BfpV<kMode, true>{sp});
        else
          with_loader(BfpV<kMode, false>{sp});
        break;
      }
      case 1:
        with_loader(PrimeV<kMode>{
            ToBfpPrimePolicy<kMode>{op.mantissa_bits, op.sub_block_size, op.sub_block_shift_bits}});
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
    narrow(y + i, bf16_quantize_lanes(load_vec<F>(x + i), scale, zp));
  }
  for (; i < n; ++i) y[i] = bf16_quantize(x[i], scale, zero_point);
}

void bf16_dequantize_run(const uint16_t* y, float* x, int64_t n, float scale, uint16_t zero_point) {
  const float zp = BFloat16::load(zero_point);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    __builtin_prefetch(reinterpret_cast<const char*>(y + i) + kPrefetchBytes / 2, 0, 3);
    __builtin_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, 1, 3);
    store_vec(x + i, bf16_dequantize_lanes(widen(y + i), scale, zp));
  }
  for (; i < n; ++i) x[i] = bf16_dequantize(y[i], scale, zero_point);
}

}  // namespace mxops::cpu::MXOPS_SIMD_NS
