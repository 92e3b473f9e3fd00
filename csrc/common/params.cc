#include "params.h"

#include <string>

namespace mxops {
namespace {

[[noreturn]] void fail(const std::string& op, const std::string& attribute,
                       const std::string& got, const std::string& allowed) {
  throw InvalidArgument{op + ": attribute '" + attribute + "' = " + got +
                        " is not supported; allowed: " + allowed};
}

int64_t int_attr(const AttributeSource& attrs, const char* name, int64_t fallback) {
  auto v = attrs.get_int(name);
  return v ? *v : fallback;
}

int checked_range(const std::string& op, const AttributeSource& attrs, const char* name,
                  int64_t fallback, int64_t lo, int64_t hi, const std::string& allowed) {
  const int64_t v = int_attr(attrs, name, fallback);
  if (v < lo || v > hi) fail(op, name, std::to_string(v), allowed);
  return static_cast<int>(v);
}

constexpr int64_t kMaxBlockSize = int64_t{1} << 30;

void parse_common(const std::string& op, const AttributeSource& attrs, int64_t default_block,
                  QdqParams& p) {
  p.axis = int_attr(attrs, "axis", 1);
  p.block_size = checked_range(op, attrs, "block_size", default_block, 1, kMaxBlockSize,
                               "an integer >= 1");
  p.rounding_mode = checked_range(op, attrs, "rounding_mode", 0, 0, 2,
                                  "0 (half away from zero), 1 (half up), 2 (half to even)");
}

}  // namespace

QdqParams parse_bfp_attributes(const std::string& op, const AttributeSource& attrs) {
  QdqParams p;
  parse_common(op, attrs, 8, p);
  const std::string method = attrs.get_string("bfp_method").value_or("to_bfp");
  if (method == "to_bfp") {
    p.method = Method::kToBfp;
  } else if (method == "to_bfp_prime" || method == "to_bfp_prime_shared") {
    p.method = Method::kToBfpPrime;
  } else {
    fail(op, "bfp_method", "\"" + method + "\"",
         "\"to_bfp\", \"to_bfp_prime\" (alias \"to_bfp_prime_shared\")");
  }
  p.mantissa_bits = checked_range(op, attrs, "bit_width", 16, 10, 32, "10..32") - 9;
  p.bf16_first = checked_range(op, attrs, "convert_to_bfloat_before_bfp", 0, 0, 1, "0 or 1") != 0;
  checked_range(op, attrs, "use_compiler_version_cpu_kernel", 0, 0, 0,
                "0 (the compiler-version kernel is not implemented yet)");
  // The sub-block attributes only matter to to_bfp_prime; to_bfp ignores them, as Quark does.
  const int64_t sub = int_attr(attrs, "sub_block_size", 2);
  const int64_t shift_bits = int_attr(attrs, "sub_block_shift_bits", 1);
  if (p.method == Method::kToBfpPrime) {
    if (sub < 1 || sub > p.block_size || p.block_size % sub != 0)
      fail(op, "sub_block_size", std::to_string(sub),
           "a divisor of block_size (" + std::to_string(p.block_size) + ")");
    if (shift_bits < 0 || shift_bits > 8)
      fail(op, "sub_block_shift_bits", std::to_string(shift_bits), "0..8");
    p.sub_block_size = static_cast<int>(sub);
    p.sub_block_shift_bits = static_cast<int>(shift_bits);
  }
  return p;
}

std::optional<MxElement> mx_element_by_name(const std::string& name) {
  // mantissa bits, emin = 1 - bias, emax, max normal, integer (SPEC 2.3 table)
  if (name == "fp8_e5m2") return MxElement{2, -14, 15, 57344.0f, false};
  if (name == "fp8_e4m3") return MxElement{3, -6, 8, 448.0f, false};
  if (name == "fp6_e3m2") return MxElement{2, -2, 4, 28.0f, false};
  if (name == "fp6_e2m3") return MxElement{3, 0, 2, 7.5f, false};
  if (name == "fp4_e2m1") return MxElement{1, 0, 2, 6.0f, false};
  if (name == "int8") return MxElement{0, 0, 0, 127.0f / 64.0f, true};
  return std::nullopt;
}

QdqParams parse_mx_attributes(const std::string& op, const AttributeSource& attrs) {
  QdqParams p;
  p.method = Method::kMx;
  parse_common(op, attrs, 32, p);
  const std::string name = attrs.get_string("element_dtype").value_or("int8");
  auto element = mx_element_by_name(name);
  if (!element)
    fail(op, "element_dtype", "\"" + name + "\"",
         "\"fp8_e5m2\", \"fp8_e4m3\", \"fp6_e3m2\", \"fp6_e2m3\", \"fp4_e2m1\", \"int8\"");
  p.element = *element;
  return p;
}

Geometry make_geometry(const std::string& op, const std::vector<int64_t>& shape, int64_t axis) {
  Geometry g;
  g.num_elements = 1;
  for (int64_t d : shape) g.num_elements *= d;
  const int64_t rank = static_cast<int64_t>(shape.size());
  g.identity = g.num_elements == 1;
  // Rank 0/1: blocked along the only axis; `axis` is ignored. One element: returned as it
  // is before the axis is looked at (SPEC 2.1, as Quark).
  if (rank <= 1 || g.identity) {
    g.outer = 1;
    g.length = g.num_elements;
    g.inner = 1;
    return g;
  }
  if (axis < -rank || axis > rank - 1)
    throw InvalidArgument{op + ": attribute 'axis' = " + std::to_string(axis) +
                          " is out of range for an input of rank " + std::to_string(rank) +
                          "; allowed: [" + std::to_string(-rank) + ", " +
                          std::to_string(rank - 1) + "]"};
  if (axis < 0) axis += rank;
  g.outer = 1;
  g.inner = 1;
  for (int64_t i = 0; i < axis; ++i) g.outer *= shape[i];
  for (int64_t i = axis + 1; i < rank; ++i) g.inner *= shape[i];
  g.length = shape[axis];
  return g;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "?";
}

}  // namespace mxops
