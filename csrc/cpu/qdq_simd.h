// SIMD walkers of the block quantize-dequantize ops, for the CPU backend.
//
// qdq_simd.cc is compiled once per instruction set with its own flags and namespace
// (simd8: AVX2, 8 float lanes; simd16: AVX-512 F/BW/VL/DQ, 16 lanes); qdq_cpu.cc picks one
// at run time from what the processor supports (never -march=native). The lanes compute the
// same float32 / integer operations as csrc/common/numerics.h, in the same order, so results
// are bit-identical to the scalar walker; the SIMD files use no standard-library code that
// another translation unit could share (an inline function compiled with AVX-512 must never
// be picked by the linker for baseline code).
#pragma once

#include <cstdint>

#include "../common/numerics.h"

namespace mxops::cpu {

// Everything a SIMD walker needs about one call, as plain data.
struct SimdOp {
  // the op (QdqParams, flattened)
  int method = 0;         // Method: 0 to_bfp, 1 to_bfp_prime, 2 MX
  int rounding_mode = 0;  // 0..2
  int mantissa_bits = 7;
  int sub_block_size = 2;
  int sub_block_shift_bits = 1;
  bool bf16_first = false;
  MxElement element{0, 0, 0, 0.0f, true};
  int dtype = 0;  // DType: 0 float32, 1 float16, 2 bfloat16
  int64_t block_size = 8;
  // the tensor, as [outer, length, inner]
  const void* x = nullptr;
  void* y = nullptr;
  int64_t outer = 0, length = 0, inner = 0;
  // filled by prepare(): work units, and how many of them one task runs
  int64_t units = 0, units_per_task = 1;
};

#define MXOPS_DECLARE_SIMD(ns)                                                   \
  namespace ns {                                                                 \
  /* Fills units / units_per_task; false when this walker does not handle op. */ \
  bool prepare(SimdOp& op);                                                      \
  /* Runs units [begin, end) of a prepared op. */                                \
  void run_units(const SimdOp& op, int64_t begin, int64_t end);                  \
  /* bf16_quantize / bf16_dequantize (bf16_qdq.h) of n elements, one channel. */ \
  void bf16_quantize_run(const float* x, uint16_t* y, int64_t n, float scale,    \
                         uint16_t zero_point);                                   \
  void bf16_dequantize_run(const uint16_t* y, float* x, int64_t n, float scale,  \
                           uint16_t zero_point);                                 \
  }

MXOPS_DECLARE_SIMD(simd8)
MXOPS_DECLARE_SIMD(simd16)

#undef MXOPS_DECLARE_SIMD

}  // namespace mxops::cpu
