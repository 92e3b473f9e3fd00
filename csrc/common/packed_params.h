// Attributes and inputs of MXDequantize / BFPDequantize (docs/packed_weights.md): parsed and
// checked once here for every front end (ONNX Runtime kernels, tests), ORT-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "packed_decode.h"
#include "params.h"

namespace mxops::packed {

// One dequantize node: its decode parameters, output shape and the input sizes they imply.
struct PackedOp {
  PackedParams params;
  std::vector<int64_t> shape;  // the output's shape (attribute 'shape')
  int64_t num_elements = 0;
  int64_t payload_bytes = 0;   // ceil(num_elements * width / 8)
  int64_t scale_count = 0;     // outer * ceil(length / block_size) * inner
  int64_t shift_bytes = 0;     // to_bfp_prime: ceil(sub-blocks * shift_bits / 8); else 0
};

// The first exception input: after payload, scales (and shifts, BFPDequantize only).
inline size_t exception_input(bool mx) { return mx ? 2 : 3; }

// The buffers a node decodes, on whatever device they live, and its exceptions.
struct PackedInputs {
  PackedBuffers buffers{};
  const int64_t* exception_indices = nullptr;
  const float* exception_values = nullptr;
  int64_t exception_count = 0;
};

// mx: MXDequantize (element_dtype, block_size, axis), else BFPDequantize (bfp_method,
// bit_width, block_size, sub_block_size, sub_block_shift_bits, axis); `shape` is the node's
// 'shape' attribute. Throws InvalidArgument naming `op` and the attribute.
PackedOp parse_packed_op(const std::string& op, bool mx, const AttributeSource& attrs,
                         const std::vector<int64_t>& shape);

// Checks the sizes of the node's inputs against `p` (shift_bytes < 0: input absent; the
// exception counts must agree). Throws InvalidArgument naming `op` and the input.
void check_packed_inputs(const std::string& op, const PackedOp& p, int64_t payload_bytes,
                         int64_t scale_count, int64_t shift_bytes, int64_t exception_indices,
                         int64_t exception_values);

// Checks that every exception index lies in [0, num_elements).
void check_exception_indices(const std::string& op, const PackedOp& p, const int64_t* indices,
                             int64_t count);

}  // namespace mxops::packed
