// Attributes of the block quantize-dequantize ops: their defaults, validation (SPEC 2.1) and
// the tensor geometry a kernel runs over. Independent of ONNX Runtime, so the ORT kernels and
// the pybind module parse and check attributes with the same code.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "numerics.h"

namespace mxops {

enum class Method : int { kToBfp = 0, kToBfpPrime = 1, kMx = 2 };

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Everything a kernel needs to know about one node, validated.
struct QdqParams {
  Method method = Method::kToBfp;
  int64_t axis = 1;
  int block_size = 8;
  int rounding_mode = 0;
  // BFP / microexponents
  int mantissa_bits = 7;  // bit_width - 9
  int sub_block_size = 2;
  int sub_block_shift_bits = 1;
  bool bf16_first = false;  // convert_to_bfloat_before_bfp
  // MX
  MxElement element{0, 0, 0, 0.0f, true};
};

// Reads one attribute of the node: returns nullopt when the node does not set it.
struct AttributeSource {
  std::function<std::optional<int64_t>(const char*)> get_int;
  std::function<std::optional<std::string>(const char*)> get_string;
};

// Thrown for a bad attribute, axis or input; the message names the op, the attribute and
// what is allowed. Backends turn it into an ONNX Runtime error status or a Python error.
struct InvalidArgument {
  std::string message;
};

// Parses and validates the attributes of BFPQuantizeDequantize / BFPFixNeuron.
QdqParams parse_bfp_attributes(const std::string& op_name, const AttributeSource& attrs);

// Parses and validates the attributes of MXQuantizeDequantize / MXFixNeuron.
QdqParams parse_mx_attributes(const std::string& op_name, const AttributeSource& attrs);

// The element types of MXQuantizeDequantize, by attribute value (SPEC 2.3); nullopt if unknown.
std::optional<MxElement> mx_element_by_name(const std::string& name);

// The tensor as the kernel sees it: [outer, length, inner] with blocks of block_size along
// `length`. `identity` is set for a one-element tensor, which is returned unchanged (rounded
// to bfloat16 first when bf16_first), as Quark does.
struct Geometry {
  int64_t outer = 0, length = 0, inner = 0;
  int64_t num_elements = 0;
  bool identity = false;

  int64_t blocks_along(int block_size) const { return (length + block_size - 1) / block_size; }
};

// Geometry of a tensor of `shape` blocked along `axis` (SPEC 2.1: rank 0/1 ignore the axis;
// otherwise axis must lie in [-rank, rank-1]). Throws InvalidArgument naming `op_name`.
Geometry make_geometry(const std::string& op_name, const std::vector<int64_t>& shape,
                       int64_t axis);

const char* dtype_name(DType t);

}  // namespace mxops
