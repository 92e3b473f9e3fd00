// LaneTypes (numerics.h) for GCC vector extension types of W = MXOPS_SIMD_WIDTH 32-bit lanes,
// host only: with these, every function of numerics.h instantiates for a vector of W
// elements, lane by lane the same operations as for one element.
#pragma once

#include "numerics.h"

namespace mxops {

template <int W>
struct VectorLanes;

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
MXOPS_VECTOR_LANES(MXOPS_SIMD_WIDTH)
#undef MXOPS_VECTOR_LANES

}  // namespace mxops
