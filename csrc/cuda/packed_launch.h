// The GPU launcher of MXDequantize / BFPDequantize (csrc/cuda/packed_dequantize.cu, compiled
// for CUDA and for HIP): every buffer on the device, launched on `stream`, no synchronisation.
#pragma once

#include <cstdint>
#include <string>

#include "../common/packed_decode.h"

namespace mxops::gpu {

// Decodes n elements into y, then writes the exception values at their indices (an index
// outside [0, n) is skipped). Returns "" on success, else the launch error.
std::string launch_packed_dequantize(const packed::PackedParams& params,
                                     const packed::PackedBuffers& in, int64_t n,
                                     const int64_t* exception_indices,
                                     const float* exception_values, int64_t exception_count,
                                     float* y, void* stream);

}  // namespace mxops::gpu
