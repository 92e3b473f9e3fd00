// The SIMD instantiations of the CPU block walker (block_walker.h), for the CPU backend.
//
// qdq_simd.cc is compiled per instruction set with its own flags and namespace (simd8: AVX2 +
// F16C, 8 float lanes; simd16: AVX-512 F/BW/VL/DQ, 16 lanes), in four object files each that
// build in parallel (float32, float32 streaming, float16, bfloat16; qdq_simd.cc, run_walks);
// qdq_cpu.cc picks one at run time from what the processor supports (never -march=native).
// The walker, the work split and the dispatch are the scalar path's (block_walker.h), with
// vector lanes, so results are bit-identical to the scalar path.
#pragma once

#include <cstdint>

#include "../common/params.h"

namespace mxops::cpu {

#define MXOPS_DECLARE_SIMD(ns)                                                           \
  namespace ns {                                                                         \
  /* Whether this walker handles the op on this geometry (else the scalar one does). */  \
  bool supports(const QdqParams& p, const Geometry& g);                                  \
  /* Work units [u0, u1) of plan_units(p, g, element bytes of t, this width's lanes) */  \
  /* (block_walker.h); */                                                                  \
  /* prefetch_rows: Walker::prefetch_rows. */                                              \
  void run_units(const QdqParams& p, DType t, const void* x, void* y, const Geometry& g,  \
                 int64_t u0, int64_t u1, bool prefetch_rows);                            \
  /* bf16_quantize / _dequantize / _quantize_dequantize (bf16_qdq.h) of n elements,  */ \
  /* one channel. */                                                                     \
  void bf16_quantize_run(const float* x, uint16_t* y, int64_t n, float scale,            \
                         uint16_t zero_point);                                           \
  void bf16_dequantize_run(const uint16_t* y, float* x, int64_t n, float scale,          \
                           uint16_t zero_point);                                         \
  void bf16_quantize_dequantize_run(const float* x, float* y, int64_t n, float scale,    \
                                    uint16_t zero_point);                                \
  }

MXOPS_DECLARE_SIMD(simd8)
MXOPS_DECLARE_SIMD(simd16)

#undef MXOPS_DECLARE_SIMD

}  // namespace mxops::cpu
