// LaneTypes (numerics.h) for GCC vector extension types of W = MXOPS_SIMD_WIDTH 32-bit lanes,
// host only: with these, every function of numerics.h instantiates for a vector of W
// elements, lane by lane the same operations as for one element.
#pragma once

#include "numerics.h"

#if defined(__AVX512DQ__)
#include <immintrin.h>
#endif

namespace mxops {

template <int W>
struct VectorLanes;

// LaneTypes::min_magnitude_sign_of for vectors: AVX-512DQ's range instruction (imm 0x02: the
// lesser magnitude, with the sign of the first operand); elsewhere
// min_magnitude_sign_of_by_compares.
template <class F>
inline __attribute__((always_inline)) F min_magnitude_sign_of_lanes(F s, F r) {
#if defined(__AVX512DQ__)
  if constexpr (sizeof(F) == 64) {
    return reinterpret_cast<F>(_mm512_range_ps(reinterpret_cast<__m512>(s), reinterpret_cast<__m512>(r), 0x02));
  }
#endif
  return min_magnitude_sign_of_by_compares(s, r);
}

// LaneTypes::clamp_magnitude for vectors: r clamped to [-m, m] (m > 0, r finite). Where the
// range instruction does it in one operation, that is min_magnitude_sign_of(r, m): r, or m with
// r's sign where |r| >= m; elsewhere clamp_magnitude_by_compares.
template <class F>
inline __attribute__((always_inline)) F clamp_magnitude_lanes(F r, F m) {
#if defined(__AVX512DQ__)
  if constexpr (sizeof(F) == 64) return min_magnitude_sign_of_lanes(r, m);
#endif
  return clamp_magnitude_by_compares(r, m);
}

// LaneTypes::mul_add_exact for vectors: AVX-512's fused multiply-add (the product is exact, so
// the bits are those of a multiplication and an addition).
template <class F>
inline __attribute__((always_inline)) F mul_add_exact_lanes(F a, F b, F c) {
#if defined(__AVX512DQ__)
  if constexpr (sizeof(F) == 64) {
    return reinterpret_cast<F>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b),
                                               reinterpret_cast<__m512>(c)));
  }
#endif
  return a * b + c;
}

#define MXOPS_VECTOR_LANES(W)                                                                 \
  template <>                                                                                 \
  struct VectorLanes<W> {                                                                     \
    typedef float F __attribute__((vector_size(4 * W)));                                      \
    typedef uint32_t U __attribute__((vector_size(4 * W)));                                   \
    typedef int32_t I __attribute__((vector_size(4 * W)));                                    \
    static inline __attribute__((always_inline)) U f2u(F f) { return (U)f; }                  \
    static inline __attribute__((always_inline)) F u2f(U u) { return (F)u; }                  \
    static inline __attribute__((always_inline)) I as_int(U u) { return (I)u; }               \
    static inline __attribute__((always_inline)) U as_uint(I i) { return (U)i; }              \
    static inline __attribute__((always_inline)) I trunc_to_int(F f) {                        \
      return __builtin_convertvector(f, I);                                                   \
    }                                                                                         \
    static inline __attribute__((always_inline)) F to_float(I i) {                            \
      return __builtin_convertvector(i, F);                                                   \
    }                                                                                         \
    static inline __attribute__((always_inline)) F clamp_magnitude(F r, F m) {                \
      return clamp_magnitude_lanes(r, m);                                                     \
    }                                                                                         \
    static inline __attribute__((always_inline)) F mul_add_exact(F a, F b, F c) {             \
      return mul_add_exact_lanes(a, b, c);                                                    \
    }                                                                                         \
    static inline __attribute__((always_inline)) F min_magnitude_sign_of(F s, F r) {         \
      return min_magnitude_sign_of_lanes(s, r);                                               \
    }                                                                                         \
    static constexpr bool kOneInstructionMagnitudes = MXOPS_ONE_INSTRUCTION_MAGNITUDES(W);    \
  };                                                                                          \
  template <>                                                                                 \
  struct LaneTypes<VectorLanes<W>::F> : VectorLanes<W> {};                                    \
  template <>                                                                                 \
  struct LaneTypes<VectorLanes<W>::U> : VectorLanes<W> {};                                    \
  template <>                                                                                 \
  struct LaneTypes<VectorLanes<W>::I> : VectorLanes<W> {};
// Only the width of this translation unit: a wider vector type in a unit compiled without
// the instructions for it would change the calling convention.
#ifndef MXOPS_SIMD_WIDTH
#error "define MXOPS_SIMD_WIDTH (8 or 16) before including simd_lanes.h"
#endif
#if defined(__AVX512DQ__)
#define MXOPS_ONE_INSTRUCTION_MAGNITUDES(W) ((W) == 16)
#else
#define MXOPS_ONE_INSTRUCTION_MAGNITUDES(W) false
#endif
MXOPS_VECTOR_LANES(MXOPS_SIMD_WIDTH)
#undef MXOPS_VECTOR_LANES
#undef MXOPS_ONE_INSTRUCTION_MAGNITUDES

}  // namespace mxops
