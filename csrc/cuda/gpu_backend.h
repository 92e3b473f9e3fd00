// The interface every GPU backend implements (csrc/cuda, and the HIP build of the same sources
// in csrc/rocm). The ORT front end (csrc/ort/gpu_backend.h) calls these from the GPU
// kernels' Compute; they launch on `stream` (ORT's compute stream) and never synchronise.
#pragma once

#include <cstdint>
#include <string>

#include "../common/params.h"

namespace mxops::gpu {

// "CUDAExecutionProvider" or "ROCMExecutionProvider".
const char* execution_provider();

// BFP / MX quantize-dequantize of device buffer `x` (type `t`, viewed as `geometry`) into
// device buffer `y`. Returns "" on success, else an error message (e.g. a launch failure).
std::string launch_quantize_dequantize(const QdqParams& params, DType t, const void* x, void* y,
                                       const Geometry& geometry, void* stream);

// ExtendedQuantizeLinear / ExtendedDequantizeLinear with a bfloat16 zero point, as
// cpu::bf16_quantize_linear / bf16_dequantize_linear; scale and zero_point are device buffers.
std::string launch_bf16_quantize_linear(const float* x, const float* scale,
                                        const uint16_t* zero_point, bool per_channel,
                                        const Geometry& geometry, uint16_t* y, void* stream);
std::string launch_bf16_dequantize_linear(const uint16_t* y, const float* scale,
                                          const uint16_t* zero_point, bool per_channel,
                                          const Geometry& geometry, float* x, void* stream);
// BF16QuantizeDequantize, as cpu::bf16_quantize_dequantize.
std::string launch_bf16_quantize_dequantize(const float* x, const float* scale,
                                            const uint16_t* zero_point, bool per_channel,
                                            const Geometry& geometry, float* y, void* stream);

}  // namespace mxops::gpu
