// SIMD lanes for the CPU block walker (see qdq_simd.h). Compiled with -DMXOPS_SIMD_WIDTH=8
// (-mavx2 -mf16c) and =16 (-mavx512f -mavx512bw -mavx512vl -mavx512dq), each in four parts
// (-DMXOPS_SIMD_PART, see run_walks); GCC vector extensions keep one source for both. This
// file owns only what differs between lane widths: vector loads and stores, lane reductions,
// and the bf16 quantize loops.

// GCC 12 reports the placeholder operand inside its own AVX-512 half-precision conversion
// intrinsics (_mm512_cvtph_ps, _mm512_cvtps_ph) as maybe uninitialised wherever the walker
// inlines them into a loop: a false positive about the compiler's header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../common/bf16_qdq.h"
#include "../common/simd_lanes.h"
#include "block_walker.h"
#include "qdq_simd.h"

#ifndef MXOPS_SIMD_WIDTH
#error "compile with -DMXOPS_SIMD_WIDTH=8 or 16"
#endif

#define MXOPS_CAT2(a, b) a##b
#define MXOPS_CAT(a, b) MXOPS_CAT2(a, b)
#define MXOPS_SIMD_NS MXOPS_CAT(simd, MXOPS_SIMD_WIDTH)

namespace mxops::cpu::MXOPS_SIMD_NS {
namespace {

constexpr int W = MXOPS_SIMD_WIDTH;
using F = VectorLanes<W>::F;
using I = VectorLanes<W>::I;
using U = VectorLanes<W>::U;
typedef uint16_t H __attribute__((vector_size(2 * W)));

template <class V, class T>
MXOPS_VINL V load_vec(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V, class T>
MXOPS_VINL void store_vec(T* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

MXOPS_VINL U widen(const uint16_t* p) { return __builtin_convertvector(load_vec<H>(p), U); }
MXOPS_VINL void narrow(uint16_t* p, U v) { store_vec(p, __builtin_convertvector(v, H)); }

MXOPS_VINL I iota() {
#if MXOPS_SIMD_WIDTH == 16
  return I{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#else
  return I{0, 1, 2, 3, 4, 5, 6, 7};
#endif
}

struct VecLanes {
  static constexpr int W = MXOPS_SIMD_WIDTH;
  using F = mxops::cpu::MXOPS_SIMD_NS::F;
  using I = mxops::cpu::MXOPS_SIMD_NS::I;
  using U = mxops::cpu::MXOPS_SIMD_NS::U;

  // True when every lane of a comparison mask is set.
  static MXOPS_VINL bool all(I mask) {
#if MXOPS_SIMD_WIDTH == 16
    return _mm512_movepi32_mask(reinterpret_cast<__m512i>(mask)) == 0xffff;
#else
    return _mm256_movemask_ps(reinterpret_cast<__m256>(mask)) == 0xff;
#endif
  }

  // Maximum over aligned groups of 2^steps lanes: a butterfly of lane swaps (lane i with
  // lane i ^ 2^k).
  // Each step's lane pattern is a constant, so it compiles to an in-lane shuffle where it can.
  template <class V>
  static MXOPS_VINL V group_max(V v, int steps) {
    if (steps > 0) v = imax(v, __builtin_shuffle(v, iota() ^ 1));
    if (steps > 1) v = imax(v, __builtin_shuffle(v, iota() ^ 2));
    if (steps > 2) v = imax(v, __builtin_shuffle(v, iota() ^ 4));
#if MXOPS_SIMD_WIDTH == 16
    if (steps > 3) v = imax(v, __builtin_shuffle(v, iota() ^ 8));
#endif
    return v;
  }

  // Lane i = the maximum over all lanes of v[i], for W vectors (v is overwritten): stages that
  // each pack two vectors' partial maxima into one (in-lane shuffles, then 128-bit blocks),
  // 2 (W - 1) shuffles in all where W group_max calls take W log2(W). The stages' lane
  // patterns leave the vectors in their natural order.
  template <class V>
  static MXOPS_VINL V transpose_max(V* v) {
#if MXOPS_SIMD_WIDTH == 16
    for (int j = 0; j < W / 2; ++j)
      v[j] = imax(__builtin_shuffle(v[2 * j], v[2 * j + 1], kPairsA), __builtin_shuffle(v[2 * j], v[2 * j + 1], kPairsA + 1));
#else
    for (int j = 0; j < W / 2; ++j) v[j] = pairs_max(v[2 * j], v[2 * j + 1]);
#endif
    return transpose_max_after_pairs(v);
  }

  // transpose_max where every v[i] holds its maxima in equal pairs of lanes (2j, 2j + 1), as
  // after group_max(v[i], 1): the first stage is one of its two shuffles, without the maximum
  // (W / 2 shuffles and W / 2 maxima fewer). v is not written.
  template <class V>
  static MXOPS_VINL V transpose_max_of_pairs(const V* v) {
    V t[W / 2];
#if MXOPS_SIMD_WIDTH == 16
    for (int j = 0; j < W / 2; ++j) t[j] = __builtin_shuffle(v[2 * j], v[2 * j + 1], kPairsA);
#else
    for (int j = 0; j < W / 2; ++j) t[j] = as_v<V>(_mm256_shuffle_ps(as_ps(v[2 * j]), as_ps(v[2 * j + 1]), 0x88));
#endif
    return transpose_max_after_pairs(t);
  }

  // The stages of transpose_max after its first, on the W / 2 vectors it left in v.
#if MXOPS_SIMD_WIDTH == 16
  static constexpr I kPairsA = {0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30};
  template <class V>
  static MXOPS_VINL V transpose_max_after_pairs(V* v) {
    const I halves_a = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const I blocks_a = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const I stages[3][2] = {{kPairsA, kPairsA + 1}, {halves_a, halves_a + 8}, {blocks_a, blocks_a + 4}};
    int m = W / 2;
    for (const auto& st : stages) {
      for (int j = 0; j < m / 2; ++j)
        v[j] = imax(__builtin_shuffle(v[2 * j], v[2 * j + 1], st[0]),
                    __builtin_shuffle(v[2 * j], v[2 * j + 1], st[1]));
      m /= 2;
    }
    return v[0];
  }
#else
  // The stages' lane patterns {0, 2, 8, 10, 4, 6, 12, 14} and the same + 1 (pairs, twice),
  // then {0-3, 8-11} and {4-7, 12-15} (halves), each one instruction: shufps 0x88 / 0xdd
  // and permute2f128 0x20 / 0x31, where GCC builds a two-source integer shuffle from three
  // (two vpshufd and a vpblendd). Measured in cache with the walker called directly (one
  // thread, Zen 4, blocked axis innermost, [1, 27648] float32): BFP16 7.5 -> 6.2 us, MX9
  // 6.6 -> 6.0 us.
  static MXOPS_VINL __m256 as_ps(I a) { return reinterpret_cast<__m256>(a); }
  static MXOPS_VINL __m256 as_ps(U a) { return reinterpret_cast<__m256>(a); }
  template <class V>
  static MXOPS_VINL V as_v(__m256 a) { return reinterpret_cast<V>(a); }
  template <class V>
  static MXOPS_VINL V pairs_max(V a, V b) {
    return imax(as_v<V>(_mm256_shuffle_ps(as_ps(a), as_ps(b), 0x88)), as_v<V>(_mm256_shuffle_ps(as_ps(a), as_ps(b), 0xdd)));
  }
  template <class V>
  static MXOPS_VINL V transpose_max_after_pairs(V* v) {
    for (int j = 0; j < 2; ++j) v[j] = pairs_max(v[2 * j], v[2 * j + 1]);
    return imax(as_v<V>(_mm256_permute2f128_ps(as_ps(v[0]), as_ps(v[1]), 0x20)),
                as_v<V>(_mm256_permute2f128_ps(as_ps(v[0]), as_ps(v[1]), 0x31)));
  }
#endif

#if MXOPS_SIMD_WIDTH == 16
  // Lane k = the maximum over block k of v[0..7] taken as 16 blocks of 8 lanes (block k: lanes
  // 8 (k % 2) ... of v[k / 2]; v is overwritten): three stages of the maxima of neighbouring
  // lanes, each packing two vectors into one (the even and the odd lanes of the pair), 14
  // two-source shuffles in all where two AVX2 transpose_max calls over the same 16 blocks
  // take 28. The packing keeps the blocks in order.
  template <class V>
  static MXOPS_VINL V half_transpose_max(V* v) {
    const I even = iota() * 2, odd = even + 1;
    for (int m = 8; m > 1; m /= 2)
      for (int j = 0; j < m / 2; ++j)
        v[j] = imax(__builtin_shuffle(v[2 * j], v[2 * j + 1], even),
                    __builtin_shuffle(v[2 * j], v[2 * j + 1], odd));
    return v[0];
  }

  // Lanes 0-7: lane 2i of v, lanes 8-15: lane 2i + 1 (the two blocks of vector i after
  // half_transpose_max).
  template <class V>
  static MXOPS_VINL V broadcast_pair(V v, int i) {
    return __builtin_shuffle(v, (iota() >> 3) + 2 * i);
  }
#endif

  // a with lane i taken from b; lane i of v in every lane (32-bit lane vectors).
  template <class V>
  static MXOPS_VINL V blend_lane(V a, V b, int i) {
    return iota() == i ? b : a;
  }
  template <class V>
  static MXOPS_VINL V broadcast_lane(V v, int i) {
#if MXOPS_SIMD_WIDTH == 8
    // The walker's loops over lanes unroll, so i is a constant here: the 128-bit half that
    // holds lane i copied to both halves, then an in-lane shuffle. The copies are shared by
    // the calls for all eight lanes, so a broadcast costs one fast shuffle where a general
    // permute first builds its index vector (three instructions more).
    switch (i) {
      case 0: return broadcast_lane_of<0>(v);
      case 1: return broadcast_lane_of<1>(v);
      case 2: return broadcast_lane_of<2>(v);
      case 3: return broadcast_lane_of<3>(v);
      case 4: return broadcast_lane_of<4>(v);
      case 5: return broadcast_lane_of<5>(v);
      case 6: return broadcast_lane_of<6>(v);
      default: return broadcast_lane_of<7>(v);
    }
#else
    return __builtin_shuffle(v, I{} + i);
#endif
  }
#if MXOPS_SIMD_WIDTH == 8
  template <int kLane, class V>
  static MXOPS_VINL V broadcast_lane_of(V v) {
    const __m256 f = reinterpret_cast<__m256>(v);
    const __m256 half = _mm256_permute2f128_ps(f, f, kLane < 4 ? 0x00 : 0x11);
    return reinterpret_cast<V>(_mm256_permute_ps(half, (kLane & 3) * 0x55));
  }
#endif

  template <class IO, bool Exact = false>
  static MXOPS_VINL F load(const typename IO::T* p) {
    if constexpr (std::is_same_v<IO, Float32>) {
      return load_vec<F>(p);
    } else if constexpr (std::is_same_v<IO, BFloat16>) {
      return BFloat16::load_bits(widen(p));
    } else if constexpr (Exact) {
      return Float16::load_bits(widen(p));
    } else {
      // F16C: the same results as Float16's integer code, except that widening quiets a
      // signalling NaN, which no output shows (every NaN is stored with the quiet bit set)
      // unless convert_to_bfloat_before_bfp rounds it first (then Exact is set).
#if MXOPS_SIMD_WIDTH == 16
      return reinterpret_cast<F>(_mm512_cvtph_ps(load_vec<__m256i>(p)));
#else
      return reinterpret_cast<F>(_mm256_cvtph_ps(load_vec<__m128i>(p)));
#endif
    }
  }

  template <class IO>
  static MXOPS_VINL void store(typename IO::T* p, F f) {
    if constexpr (std::is_same_v<IO, Float32>) {
      store_vec(p, f);
    } else if constexpr (std::is_same_v<IO, BFloat16>) {
      narrow(p, BFloat16::store_bits(f));
    } else {
#if MXOPS_SIMD_WIDTH == 16
      store_vec(p, _mm512_cvtps_ph(reinterpret_cast<__m512>(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
      store_vec(p, _mm256_cvtps_ph(reinterpret_cast<__m256>(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    }
  }

  // float32 only (stream_supported); p aligned to the vector's size.
  template <class IO>
  static MXOPS_VINL void stream(typename IO::T* p, F f) {
    static_assert(std::is_same_v<IO, Float32>, "streaming stores are for float32 outputs");
#if MXOPS_SIMD_WIDTH == 16
    _mm512_stream_ps(p, reinterpret_cast<__m512>(f));
#else
    _mm256_stream_ps(p, reinterpret_cast<__m256>(f));
#endif
  }
};

// The walks over elements of type IO with Stream stores, work units [u0, u1).
template <class IO, bool Stream>
void walks(const QdqParams& p, const void* x, void* y, const Geometry& g, int64_t u0, int64_t u1,
           bool prefetch_rows) {
  const UnitPlan plan = plan_units(p, g, sizeof(typename IO::T), VecLanes::W);
  with_walker_for<VecLanes, IO, Stream>(
      p, x, y, g, [&](const auto& walker) { walker.run(plan, u0, u1); }, prefetch_rows);
}

}  // namespace

// The walkers take most of the build's time, so setup.py compiles this source once per part,
// -DMXOPS_SIMD_PART=0..4, and the parts compile in parallel. Each part defines one overload of
// run_walks (walks<IO, Stream>): 0 float32, 1 float32 with non-temporal stores, 2 float16,
// 3 bfloat16, 4 float32 divided by input_divisor as it is loaded; part 0 also the entry
// points of qdq_simd.h, which call all five.
#define MXOPS_WALK_PARAMS                                                                 \
  const QdqParams& p, const void* x, void* y, const Geometry& g, int64_t u0, int64_t u1, \
      bool prefetch_rows
#define MXOPS_WALK_ARGS p, x, y, g, u0, u1, prefetch_rows
void run_walks(Float32, std::false_type, MXOPS_WALK_PARAMS);
void run_walks(Float32, std::true_type, MXOPS_WALK_PARAMS);
void run_walks(Float16, std::false_type, MXOPS_WALK_PARAMS);
void run_walks(BFloat16, std::false_type, MXOPS_WALK_PARAMS);
void run_walks(Float32Divided, std::false_type, MXOPS_WALK_PARAMS);

#if MXOPS_SIMD_PART == 0
void run_walks(Float32, std::false_type, MXOPS_WALK_PARAMS) {
  walks<Float32, false>(MXOPS_WALK_ARGS);
}
#elif MXOPS_SIMD_PART == 1
void run_walks(Float32, std::true_type, MXOPS_WALK_PARAMS) {
  walks<Float32, true>(MXOPS_WALK_ARGS);
}
#elif MXOPS_SIMD_PART == 2
void run_walks(Float16, std::false_type, MXOPS_WALK_PARAMS) {
  walks<Float16, false>(MXOPS_WALK_ARGS);
}
#elif MXOPS_SIMD_PART == 3
void run_walks(BFloat16, std::false_type, MXOPS_WALK_PARAMS) {
  walks<BFloat16, false>(MXOPS_WALK_ARGS);
}
#elif MXOPS_SIMD_PART == 4
void run_walks(Float32Divided, std::false_type, MXOPS_WALK_PARAMS) {
  set_input_divisor(p);  // (on the thread of the walk: block_walker.h)
  walks<Float32Divided, false>(MXOPS_WALK_ARGS);
}
#else
#error "compile with -DMXOPS_SIMD_PART=0, 1, 2, 3 or 4"
#endif

#if MXOPS_SIMD_PART == 0
bool supports(const QdqParams& p, const Geometry& g) { return vector_walk_supported<W>(p, g); }

void run_units(const QdqParams& p, DType t, const void* x, void* y, const Geometry& g,
               int64_t u0, int64_t u1, bool prefetch_rows) {
  const bool divided = p.input_divisor != 0;
  const bool stream = !divided && stream_supported<W>(t, y, g);
  with_element_type<W>(t, stream, [&](auto io, auto stream_tag) {
    run_walks(io, stream_tag, MXOPS_WALK_ARGS);
  }, divided);
  // Non-temporal stores are weakly ordered: make them visible before the task reports done.
  if (stream) _mm_sfence();
}

// The vector loop of the three BF16 runs: vector(unit, in + i, out + i) W elements at a time
// with the next lines prefetched; returns where the caller's scalar tail starts. unit is
// std::true_type where scale == 1: the element functions then leave out the divide and the
// multiply, with the same bits (bf16_qdq.h).
template <class In, class Out, class Vector>
int64_t bf16_vector_loop(const In* in, Out* out, int64_t n, float scale, Vector vector) {
  auto loop = [&](auto unit) {
    int64_t i = 0;
    for (; i + W <= n; i += W) {
      // (kPrefetchBytes ahead in float32 elements, as far in elements for narrower types)
      __builtin_prefetch(reinterpret_cast<const char*>(in + i) + kPrefetchBytes * sizeof(In) / 4,
                         0, 3);
      __builtin_prefetch(reinterpret_cast<char*>(out + i) + kPrefetchBytes * sizeof(Out) / 4, 1,
                         3);
      vector(unit, in + i, out + i);
    }
    return i;
  };
  return scale == 1.0f ? loop(std::true_type{}) : loop(std::false_type{});
}

void bf16_quantize_run(const float* x, uint16_t* y, int64_t n, float scale, uint16_t zero_point) {
  const float zp = BFloat16::load(zero_point);
  int64_t i = bf16_vector_loop(x, y, n, scale, [&](auto unit, const float* p, uint16_t* q) {
    narrow(q, bf16_quantize_lanes<decltype(unit)::value>(load_vec<F>(p), scale, zp));
  });
  for (; i < n; ++i) y[i] = bf16_quantize(x[i], scale, zero_point);
}

void bf16_dequantize_run(const uint16_t* y, float* x, int64_t n, float scale, uint16_t zero_point) {
  const float zp = BFloat16::load(zero_point);
  int64_t i = bf16_vector_loop(y, x, n, scale, [&](auto unit, const uint16_t* p, float* q) {
    store_vec(q, bf16_dequantize_lanes<decltype(unit)::value>(widen(p), scale, zp));
  });
  for (; i < n; ++i) x[i] = bf16_dequantize(y[i], scale, zero_point);
}

void bf16_quantize_dequantize_run(const float* x, float* y, int64_t n, float scale,
                                  uint16_t zero_point) {
  const float zp = BFloat16::load(zero_point);
  int64_t i = bf16_vector_loop(x, y, n, scale, [&](auto unit, const float* p, float* q) {
    store_vec(q, bf16_quantize_dequantize_lanes<decltype(unit)::value>(load_vec<F>(p), scale, zp));
  });
  for (; i < n; ++i) y[i] = bf16_quantize_dequantize(x[i], scale, zero_point);
}

#endif  // MXOPS_SIMD_PART == 0

}  // namespace mxops::cpu::MXOPS_SIMD_NS
