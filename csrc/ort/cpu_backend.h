// The CPU execution provider's backend for the kernels of kernels.h: the CPU kernels of
// csrc/cpu on ONNX Runtime's intra-op thread pool.
#pragma once

#include "../cpu/qdq_cpu.h"
#include "kernels.h"

namespace mxops::ort {

// ORT's intra-op thread pool as a TaskRunner; runs serially if ORT cannot parallelise.
cpu::TaskRunner ort_thread_pool(OrtKernelContext* context);

struct CpuBackend {
  static const char* provider() { return "CPUExecutionProvider"; }

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
};

}  // namespace mxops::ort
