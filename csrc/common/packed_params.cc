#include "packed_params.h"

#include <string>

namespace mxops::packed {
namespace {

[[noreturn]] void bad_input(const std::string& op, const std::string& input, int64_t got,
                            const std::string& expected) {
  throw InvalidArgument{op + ": input '" + input + "' has " + std::to_string(got) +
                        " elements; " + expected};
}

}  // namespace

PackedOp parse_packed_op(const std::string& op, bool mx, const AttributeSource& attrs,
                         const std::vector<int64_t>& shape) {
  PackedOp p;
  for (int64_t d : shape)
    if (d < 0)
      throw InvalidArgument{op + ": attribute 'shape' has a negative dimension; allowed: "
                            "sizes >= 0"};
  const QdqParams q = parse_block_attributes(mx ? OpKind::kMx : OpKind::kBfp, op, attrs);
  if (!mx && q.bf16_first)
    throw InvalidArgument{op + ": attribute 'convert_to_bfloat_before_bfp' does not apply to "
                          "packed weights; allowed: 0"};
  if (q.nchwc_block != 0)
    throw InvalidArgument{op + ": attribute 'nchwc_block' does not apply to packed weights; "
                          "allowed: 0"};
  if (q.input_divisor != 0)
    throw InvalidArgument{op + ": attribute 'input_divisor' does not apply to packed weights; "
                          "allowed: 0"};
  if (q.input_hardswish)
    throw InvalidArgument{op + ": attribute 'input_hardswish' does not apply to packed "
                          "weights; allowed: 0"};
  const Geometry g = make_geometry(op, shape, q.axis);
  PackedParams& pp = p.params;
  pp.mx = mx;
  pp.block_size = q.block_size;
  pp.length = g.length;
  pp.inner = g.inner;
  if (mx) {
    pp.code = mx_code(q.element);
    pp.width = pp.code.width;
  } else {
    pp.prime = q.method == Method::kToBfpPrime;
    pp.mantissa_bits = q.mantissa_bits;
    pp.width = q.mantissa_bits + 1;
    if (pp.prime) {
      pp.sub_block_size = q.sub_block_size;
      pp.shift_bits = q.sub_block_shift_bits;
    }
  }
  p.shape = shape;
  p.num_elements = g.num_elements;
  p.payload_bytes = (g.num_elements * pp.width + 7) / 8;
  const int64_t length = g.length > 0 ? g.length : 0;
  p.scale_count = g.outer * ((length + pp.block_size - 1) / pp.block_size) * g.inner;
  if (pp.prime && pp.shift_bits > 0) {
    const int64_t subs = g.outer * ((length + pp.sub_block_size - 1) / pp.sub_block_size) * g.inner;
    p.shift_bytes = (subs * pp.shift_bits + 7) / 8;
  }
  return p;
}

void check_packed_inputs(const std::string& op, const PackedOp& p, int64_t payload_bytes,
                         int64_t scale_count, int64_t shift_bytes, int64_t exception_indices,
                         int64_t exception_values) {
  if (payload_bytes != p.payload_bytes)
    bad_input(op, "payload", payload_bytes,
              "the attributes need " + std::to_string(p.payload_bytes) + " bytes");
  if (scale_count != p.scale_count)
    bad_input(op, "scales", scale_count,
              "one byte per block needs " + std::to_string(p.scale_count));
  if (p.shift_bytes > 0 && shift_bytes != p.shift_bytes)
    bad_input(op, "shifts", shift_bytes < 0 ? 0 : shift_bytes,
              "the sub-block shifts need " + std::to_string(p.shift_bytes) + " bytes");
  if (exception_indices != exception_values)
    throw InvalidArgument{op + ": inputs 'exception_indices' (" +
                          std::to_string(exception_indices) + ") and 'exception_values' (" +
                          std::to_string(exception_values) + ") must have the same length"};
}

void check_exception_indices(const std::string& op, const PackedOp& p, const int64_t* indices,
                             int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (indices[i] < 0 || indices[i] >= p.num_elements)
      throw InvalidArgument{op + ": exception index " + std::to_string(indices[i]) +
                            " is out of range; allowed: [0, " + std::to_string(p.num_elements) +
                            ")"};
}

}  // namespace mxops::packed
