// The GPU execution provider's backend (CUDA, or ROCm for the HIP build) for the kernels of
// kernels.h: the launchers of csrc/cuda/gpu_backend.h on ORT's compute stream.
#pragma once

#include "../common/packed_params.h"
#include "../cuda/gpu_backend.h"
#include "../cuda/packed_launch.h"
#include "kernels.h"

namespace mxops::ort {

struct GpuBackend {
  static const char* provider() { return gpu::execution_provider(); }
  static constexpr bool kDecodeOnce = false;  // packed_ops.h: decode on every run
  static constexpr bool kNchwc = false;       // the NCHWc layout is onnxruntime's CPU provider's
  static constexpr bool kInputDivisor = false;  // the GPU kernels do not divide first
  static constexpr bool kInPlace = false;     // the GPU kernels are not checked in place

  // Exception indices outside the tensor are skipped on the device (they live there).
  static void packed_dequantize(OrtKernelContext* context, const std::string& label,
                                const packed::PackedOp& op, const packed::PackedInputs& in,
                                float* y) {
    check(label, gpu::launch_packed_dequantize(op.params, in.buffers, op.num_elements,
                                               in.exception_indices, in.exception_values,
                                               in.exception_count, y, stream(context)));
  }

  static void quantize_dequantize(OrtKernelContext* context, const std::string& label,
                                  const QdqParams& p, DType t, const void* x, void* y,
                                  const Geometry& g) {
    check(label, gpu::launch_quantize_dequantize(p, t, x, y, g, stream(context)));
  }
  static void bf16_quantize_linear(OrtKernelContext* context, const std::string& label,
                                   const float* x, const float* scale, const uint16_t* zero_point,
                                   bool per_channel, const Geometry& g, uint16_t* y) {
    check(label, gpu::launch_bf16_quantize_linear(x, scale, zero_point, per_channel, g, y,
                                                  stream(context)));
  }
  static void bf16_dequantize_linear(OrtKernelContext* context, const std::string& label,
                                     const uint16_t* y, const float* scale,
                                     const uint16_t* zero_point, bool per_channel,
                                     const Geometry& g, float* x) {
    check(label, gpu::launch_bf16_dequantize_linear(y, scale, zero_point, per_channel, g, x,
                                                    stream(context)));
  }
  static void bf16_quantize_dequantize(OrtKernelContext* context, const std::string& label,
                                       const float* x, const float* scale,
                                       const uint16_t* zero_point, bool per_channel,
                                       const Geometry& g, float* y) {
    check(label, gpu::launch_bf16_quantize_dequantize(x, scale, zero_point, per_channel, g, y,
                                                      stream(context)));
  }

 private:
  static void* stream(OrtKernelContext* context) {
    void* s = nullptr;
    Ort::ThrowOnError(api().KernelContext_GetGPUComputeStream(context, &s));
    return s;
  }
  static void check(const std::string& label, const std::string& error) {
    if (!error.empty()) throw InvalidArgument{label + ": GPU launch failed: " + error};
  }
};

}  // namespace mxops::ort
