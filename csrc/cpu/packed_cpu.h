// CPU backend of MXDequantize / BFPDequantize: decodes a packed weight (csrc/common/
// packed_decode.h) into float32, spread over the caller's threads.
#pragma once

#include <cstdint>

#include "../common/packed_decode.h"
#include "qdq_cpu.h"

namespace mxops::cpu {

// Writes the n decoded elements to y, then the exception values at their indices (already
// checked to lie in [0, n)).
void packed_dequantize(const packed::PackedParams& params, const packed::PackedBuffers& in,
                       int64_t n, const int64_t* exception_indices, const float* exception_values,
                       int64_t exception_count, float* y, const TaskRunner& run);

}  // namespace mxops::cpu
