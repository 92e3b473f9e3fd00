// The CPU execution provider's backend for the kernels of kernels.h: the CPU kernels of
// csrc/cpu on ONNX Runtime's intra-op thread pool.
#pragma once

#include <algorithm>
#include <cstring>

#include "../common/packed_params.h"
#include "../cpu/packed_cpu.h"
#include "../cpu/qdq_cpu.h"
#include "kernels.h"

namespace mxops::ort {

// ORT's intra-op thread pool as a TaskRunner; runs serially if ORT cannot parallelise.
cpu::TaskRunner ort_thread_pool(OrtKernelContext* context);

struct CpuBackend {
  static const char* provider() { return "CPUExecutionProvider"; }
  static constexpr bool kDecodeOnce = true;  // packed_ops.h
  static constexpr bool kNchwc = true;       // BFP / MX nodes with nchwc_block (block_walker.h)
  static constexpr bool kInputDivisor = true;  // BFP / MX nodes with input_divisor (block_walker.h)
  // BFP / MX and BF16QuantizeDequantize nodes may write their output into their input's
  // buffer where onnxruntime offers it (kernels.h, may_run_in_place).
  static constexpr bool kInPlace = true;

  // context nullptr (at kernel creation): on the calling thread.
  static void packed_dequantize(OrtKernelContext* context, const std::string& label,
                                const packed::PackedOp& op, const packed::PackedInputs& in,
                                float* y) {
    packed::check_exception_indices(label, op, in.exception_indices, in.exception_count);
    cpu::packed_dequantize(op.params, in.buffers, op.num_elements, in.exception_indices,
                           in.exception_values, in.exception_count, y,
                           context ? ort_thread_pool(context) : cpu::TaskRunner(cpu::run_serial));
  }
  // In chunks over ORT's threads: a large weight copies faster on several cores.
  static void copy_floats(OrtKernelContext* context, const float* src, float* y, int64_t n) {
    constexpr int64_t kChunk = int64_t{1} << 16;
    cpu::run_tasks(ort_thread_pool(context), (n + kChunk - 1) / kChunk, [&](int64_t t) {
      const int64_t begin = t * kChunk;
      std::memcpy(y + begin, src + begin,
                  static_cast<size_t>(std::min(kChunk, n - begin)) * sizeof(float));
    });
  }

  static void quantize_dequantize(OrtKernelContext* context, const std::string& /*label*/,
                                  const QdqParams& p, DType t, const void* x, void* y,
                                  const Geometry& g) {
    cpu::quantize_dequantize(p, t, x, y, g, ort_thread_pool(context));
  }
  static void bf16_quantize_linear(OrtKernelContext* context, const std::string& /*label*/,
                                   const float* x, const float* scale, const uint16_t* zero_point,
                                   bool per_channel, const Geometry& g, uint16_t* y) {
    cpu::bf16_quantize_linear(x, scale, zero_point, per_channel, g, y, ort_thread_pool(context));
  }
  static void bf16_dequantize_linear(OrtKernelContext* context, const std::string& /*label*/,
                                     const uint16_t* y, const float* scale,
                                     const uint16_t* zero_point, bool per_channel,
                                     const Geometry& g, float* x) {
    cpu::bf16_dequantize_linear(y, scale, zero_point, per_channel, g, x, ort_thread_pool(context));
  }
  static void bf16_quantize_dequantize(OrtKernelContext* context, const std::string& /*label*/,
                                       const float* x, const float* scale,
                                       const uint16_t* zero_point, bool per_channel,
                                       const Geometry& g, float* y) {
    cpu::bf16_quantize_dequantize(x, scale, zero_point, per_channel, g, y, ort_thread_pool(context));
  }
};

}  // namespace mxops::ort
