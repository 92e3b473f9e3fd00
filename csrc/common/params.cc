#include "params.h"

#include <string>

namespace mxops {

// ------------------------------------------------------------------------------------------
// The tables
// ------------------------------------------------------------------------------------------

const std::vector<OpSpec>& op_catalogue() {
  static const std::vector<OpSpec> ops = {
      {"BFPQuantizeDequantize", "com.amd.quark", OpKind::kBfp},
      {"MXQuantizeDequantize", "com.amd.quark", OpKind::kMx},
      {"ExtendedQuantizeLinear", "com.amd.quark", OpKind::kBf16Quantize},
      {"ExtendedDequantizeLinear", "com.amd.quark", OpKind::kBf16Dequantize},
      {"BFPFixNeuron", "com.vai.quantize", OpKind::kBfp},
      {"MXFixNeuron", "com.vai.quantize", OpKind::kMx},
      {"VitisQuantizeLinear", "com.vai.quantize", OpKind::kBf16Quantize},
      {"VitisDequantizeLinear", "com.vai.quantize", OpKind::kBf16Dequantize},
      {"BF16QuantizeDequantize", "com.ort_mx_ops", OpKind::kBf16QuantizeDequantize},
  };
  return ops;
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kBfp: return "BFP";
    case OpKind::kMx: return "MX";
    case OpKind::kBf16Quantize: return "BF16_QUANTIZE";
    case OpKind::kBf16Dequantize: return "BF16_DEQUANTIZE";
    case OpKind::kBf16QuantizeDequantize: return "BF16_QDQ";
  }
  return "?";
}

const std::vector<MxFormatSpec>& mx_formats() {
  static const std::vector<MxFormatSpec> formats = {
      {"fp8_e5m2", 5, 2, 15, 57344.0f}, {"fp8_e4m3", 4, 3, 8, 448.0f},
      {"fp6_e3m2", 3, 2, 4, 28.0f},     {"fp6_e2m3", 2, 3, 2, 7.5f},
      {"fp4_e2m1", 2, 1, 2, 6.0f},      {"int8", 0, 0, 0, 127.0f / 64.0f},
  };
  return formats;
}

MxElement MxFormatSpec::element() const {
  const bool is_int = exponent_bits == 0;
  const int bias = is_int ? 1 : (1 << (exponent_bits - 1)) - 1;
  return MxElement{mantissa_bits, 1 - bias, emax, max_normal, is_int};
}

const std::vector<BfpMethodSpec>& bfp_methods() {
  static const std::vector<BfpMethodSpec> methods = {
      {"to_bfp", "to_bfp", Method::kToBfp},
      {"to_bfp_prime", "to_bfp_prime", Method::kToBfpPrime},
      {"to_bfp_prime_shared", "to_bfp_prime", Method::kToBfpPrime},
  };
  return methods;
}

namespace {

constexpr int64_t kMaxBlockSize = int64_t{1} << 30;

AttrSpec int_attr(const char* name, int64_t def, std::optional<int64_t> lo = std::nullopt,
                  std::optional<int64_t> hi = std::nullopt, const char* meaning = "") {
  return AttrSpec{name, AttrType::kInt, def, "", lo, hi, {}, meaning};
}

AttrSpec string_attr(const char* name, const char* def, std::vector<std::string> allowed) {
  return AttrSpec{name, AttrType::kString, 0, def, std::nullopt, std::nullopt, std::move(allowed), ""};
}

std::vector<std::string> bfp_method_names() {
  std::vector<std::string> v;
  for (const auto& m : bfp_methods()) v.push_back(m.name);
  return v;
}

std::vector<std::string> mx_format_names() {
  std::vector<std::string> v;
  for (const auto& f : mx_formats()) v.push_back(f.name);
  return v;
}

AttrSpec block_size_attr(int64_t def) {
  return int_attr("block_size", def, 1, kMaxBlockSize, "an integer from 1 to 1073741824 (2^30)");
}

AttrSpec rounding_mode_attr() {
  return int_attr("rounding_mode", 0, 0, 2, "0 (half away from zero), 1 (half up), 2 (half to even)");
}

// Our extension, not a Quark attribute: the input is in onnxruntime's NCHWc layout.
constexpr int64_t kMaxNchwcBlock = 128;

AttrSpec nchwc_block_attr() {
  return int_attr("nchwc_block", 0, 0, kMaxNchwcBlock,
                  "0 (the plain layout) or a power of two from 1 to 128 (the channel block of "
                  "onnxruntime's NCHWc layout)");
}

AttrSpec nchwc_channels_attr() {
  return int_attr("nchwc_channels", 0, 0, std::nullopt,
                  "0 (every channel), or with nchwc_block the input's real channel count (the "
                  "others are padding of onnxruntime's NCHWc layout)");
}

// Our extension: the input divided by this integer first (0: not divided). Integers up to 2^24
// are exact in float32, so the divisor is the float the Div node it replaces divides by.
constexpr int64_t kMaxInputDivisor = int64_t{1} << 24;

AttrSpec input_divisor_attr() {
  return int_attr("input_divisor", 0, 0, kMaxInputDivisor,
                  "0 (the input as it is) or an integer from 1 to 16777216 (2^24) that every "
                  "element is divided by first");
}

// Our extension: hard-swish's numerator x * clip(x + 3, 0, 6) first (0: the input as it is).
AttrSpec input_hardswish_attr() {
  return int_attr("input_hardswish", 0, 0, 1,
                  "0 (the input as it is) or 1 (each element x replaced by "
                  "x * min(max(x + 3, 0), 6) first)");
}

}  // namespace

const std::vector<AttrSpec>& attributes_of(OpKind kind) {
  static const std::vector<AttrSpec> bfp = {
      string_attr("bfp_method", "to_bfp", bfp_method_names()),
      int_attr("axis", 1),
      int_attr("bit_width", 16, 10, 32),
      block_size_attr(8),
      rounding_mode_attr(),
      // The sub-block attributes matter to to_bfp_prime only; to_bfp ignores their values.
      int_attr("sub_block_size", 2, 1, std::nullopt, "a divisor of block_size"),
      int_attr("sub_block_shift_bits", 1, 0, 8),
      int_attr("convert_to_bfloat_before_bfp", 0, 0, 1, "0 or 1"),
      int_attr("use_compiler_version_cpu_kernel", 0, 0, 0,
               "0 (the compiler-version kernel is not implemented yet)"),
      nchwc_block_attr(),
      nchwc_channels_attr(),
      input_divisor_attr(),
      input_hardswish_attr(),
  };
  static const std::vector<AttrSpec> mx = {
      string_attr("element_dtype", "int8", mx_format_names()),
      int_attr("axis", 1),
      block_size_attr(32),
      rounding_mode_attr(),
      nchwc_block_attr(),
      nchwc_channels_attr(),
      input_divisor_attr(),
      input_hardswish_attr(),
  };
  static const std::vector<AttrSpec> linear = {int_attr("axis", 1)};
  switch (kind) {
    case OpKind::kBfp: return bfp;
    case OpKind::kMx: return mx;
    default: return linear;
  }
}

// ------------------------------------------------------------------------------------------
// Validation against the tables
// ------------------------------------------------------------------------------------------

const char* found_type_name(FoundType t) {
  switch (t) {
    case FoundType::kAbsent: return "absent";
    case FoundType::kInt: return "int";
    case FoundType::kFloat: return "float";
    case FoundType::kString: return "string";
    case FoundType::kInts: return "list of ints";
    case FoundType::kFloats: return "list of floats";
    case FoundType::kOther: return "a type other than int, float or string";
  }
  return "?";
}

namespace {

[[noreturn]] void fail(const std::string& op, const std::string& attribute,
                       const std::string& got, const std::string& allowed) {
  throw InvalidArgument{op + ": attribute '" + attribute + "' = " + got +
                        " is not supported; allowed: " + allowed};
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s;
}

std::string allowed_text(const AttrSpec& a) {
  if (!a.meaning.empty()) return a.meaning;
  if (a.type == AttrType::kString) return quoted_list(a.allowed);
  if (a.min && a.max) return std::to_string(*a.min) + ".." + std::to_string(*a.max);
  if (a.min) return "an integer >= " + std::to_string(*a.min);
  return "an integer";
}

// The node's attributes, typed and checked against the kind's table.
class Reader {
 public:
  Reader(OpKind kind, const std::string& op, const AttributeSource& attrs)
      : specs_(attributes_of(kind)), op_(op) {
    std::vector<std::string> known;
    for (const auto& a : specs_) known.push_back(a.name);
    const std::vector<std::string> unknown = attrs.unknown ? attrs.unknown(known) : std::vector<std::string>{};
    if (!unknown.empty()) {
      std::string names;
      for (const auto& k : known) names += (names.empty() ? "" : ", ") + k;
      throw InvalidArgument{op + ": unknown attribute '" + unknown.front() + "'; allowed: " + names};
    }
    for (const auto& a : specs_) {
      AttributeValue v = attrs.get(a.name);
      const FoundType want = a.type == AttrType::kInt ? FoundType::kInt : FoundType::kString;
      if (v.type != FoundType::kAbsent && v.type != want)
        throw InvalidArgument{op + ": attribute '" + a.name + "' has type " +
                              found_type_name(v.type) + "; expected " + found_type_name(want)};
      values_.push_back(std::move(v));
    }
  }

  const AttrSpec& spec(const char* name, size_t* index) const {
    for (size_t i = 0; i < specs_.size(); ++i)
      if (specs_[i].name == name) {
        *index = i;
        return specs_[i];
      }
    throw InvalidArgument{op_ + ": internal error: no attribute '" + std::string(name) + "'"};
  }

  // The value (or default), unchecked.
  int64_t raw_int(const char* name) const {
    size_t i;
    const AttrSpec& a = spec(name, &i);
    return values_[i].type == FoundType::kAbsent ? a.int_default : values_[i].i;
  }

  // The value (or default), checked against the table's range.
  int64_t checked_int(const char* name) const {
    size_t i;
    const AttrSpec& a = spec(name, &i);
    const int64_t v = raw_int(name);
    if ((a.min && v < *a.min) || (a.max && v > *a.max)) fail(op_, a.name, std::to_string(v), allowed_text(a));
    return v;
  }

  // The value (or default), checked against the table's allowed strings.
  std::string checked_string(const char* name) const {
    size_t i;
    const AttrSpec& a = spec(name, &i);
    const std::string v = values_[i].type == FoundType::kAbsent ? a.string_default : values_[i].s;
    bool ok = a.allowed.empty();
    for (const auto& s : a.allowed) ok = ok || s == v;
    if (!ok) fail(op_, a.name, "\"" + v + "\"", allowed_text(a));
    return v;
  }

 private:
  const std::vector<AttrSpec>& specs_;
  std::string op_;
  std::vector<AttributeValue> values_;
};

}  // namespace

QdqParams parse_block_attributes(OpKind kind, const std::string& op, const AttributeSource& attrs) {
  const Reader r(kind, op, attrs);
  QdqParams p;
  p.axis = r.raw_int("axis");
  p.block_size = static_cast<int>(r.checked_int("block_size"));
  p.rounding_mode = static_cast<int>(r.checked_int("rounding_mode"));
  const int64_t nchwc = r.checked_int("nchwc_block");
  if (nchwc > 0) {
    if ((nchwc & (nchwc - 1)) != 0)
      fail(op, "nchwc_block", std::to_string(nchwc),
           "0 (the plain layout) or a power of two from 1 to " + std::to_string(kMaxNchwcBlock));
    if (p.block_size % nchwc != 0 && nchwc % p.block_size != 0)
      fail(op, "nchwc_block", std::to_string(nchwc),
           "0, or a power of two that divides block_size (" + std::to_string(p.block_size) +
               ") or is a multiple of it");
  }
  p.nchwc_block = static_cast<int>(nchwc);
  p.nchwc_channels = r.checked_int("nchwc_channels");
  p.input_divisor = r.checked_int("input_divisor");
  p.input_hardswish = r.checked_int("input_hardswish") != 0;
  if (p.nchwc_channels > 0 && nchwc == 0)
    fail(op, "nchwc_channels", std::to_string(p.nchwc_channels),
         "0 without nchwc_block (it counts the real channels of an NCHWc input)");
  if (kind == OpKind::kMx) {
    p.method = Method::kMx;
    const std::string name = r.checked_string("element_dtype");
    for (const auto& f : mx_formats())
      if (f.name == name) p.element = f.element();
    return p;
  }
  const std::string method = r.checked_string("bfp_method");
  for (const auto& m : bfp_methods())
    if (m.name == method) p.method = m.method;
  p.mantissa_bits = static_cast<int>(r.checked_int("bit_width")) - 9;
  p.bf16_first = r.checked_int("convert_to_bfloat_before_bfp") != 0;
  r.checked_int("use_compiler_version_cpu_kernel");
  if (p.method == Method::kToBfpPrime) {
    const int64_t sub = r.raw_int("sub_block_size");
    if (sub < 1 || sub > p.block_size || p.block_size % sub != 0)
      fail(op, "sub_block_size", std::to_string(sub),
           "a divisor of block_size (" + std::to_string(p.block_size) + ")");
    p.sub_block_size = static_cast<int>(sub);
    p.sub_block_shift_bits = static_cast<int>(r.checked_int("sub_block_shift_bits"));
    // Blocks across NCHWc blocks: a sub-block must be whole lanes of one row or whole rows.
    const int64_t L = p.nchwc_block;
    if (L > 1 && p.block_size > L && sub % L != 0 && L % sub != 0)
      fail(op, "sub_block_size", std::to_string(sub),
           "with nchwc_block = " + std::to_string(L) + " and block_size " +
               std::to_string(p.block_size) + ", a divisor of block_size that divides " +
               std::to_string(L) + " or is a multiple of it");
  }
  return p;
}

int64_t parse_linear_attributes(OpKind kind, const std::string& op, const AttributeSource& attrs) {
  return Reader(kind, op, attrs).raw_int("axis");
}

// ------------------------------------------------------------------------------------------
// Geometry
// ------------------------------------------------------------------------------------------

Geometry make_geometry(const std::string& op, const std::vector<int64_t>& shape, int64_t axis) {
  Geometry g;
  g.num_elements = 1;
  for (int64_t d : shape) g.num_elements *= d;
  const int64_t rank = static_cast<int64_t>(shape.size());
  g.identity = g.num_elements == 1;
  // Rank 0/1: blocked along the only axis; `axis` is ignored. One element: returned as it
  // is before the axis is looked at, as Quark does.
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

Geometry make_block_geometry(const std::string& op, const std::vector<int64_t>& shape,
                             const QdqParams& p) {
  const int64_t L = p.nchwc_block;
  if (L == 0) return make_geometry(op, shape, p.axis);
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank < 2)
    throw InvalidArgument{op + ": attribute 'nchwc_block' = " + std::to_string(L) +
                          " needs an input of rank >= 2 ([N, C, ...] in NCHWc memory order); "
                          "the input has rank " + std::to_string(rank) + "; allowed: 0"};
  if (p.axis != 1 && p.axis != 1 - rank)
    throw InvalidArgument{op + ": attribute 'axis' = " + std::to_string(p.axis) +
                          " with nchwc_block = " + std::to_string(L) +
                          " (an input of rank " + std::to_string(rank) +
                          "); allowed: 1 (the channels), or " + std::to_string(1 - rank)};
  if (shape[1] % L != 0)
    throw InvalidArgument{op + ": attribute 'nchwc_block' = " + std::to_string(L) +
                          " needs a channel count (input dimension 1) that is a multiple of it; "
                          "the input has " + std::to_string(shape[1]) + " channels"};
  const int64_t C = shape[1];
  const int64_t real = p.nchwc_channels > 0 ? p.nchwc_channels : C;
  if (real <= C - L || real > C)
    throw InvalidArgument{op + ": attribute 'nchwc_channels' = " + std::to_string(p.nchwc_channels) +
                          " must be more than " + std::to_string(C - L) + " and at most " +
                          std::to_string(C) + " (the input has " + std::to_string(C) +
                          " channels, nchwc_block = " + std::to_string(L) + ")"};
  Geometry g = make_geometry(op, shape, 1);
  if (real < C) {
    g.padding.batches = shape[0];
    g.padding.groups = C / L;
    g.padding.lanes = L;
    g.padding.real = real - (C / L - 1) * L;
    g.padding.pixels = 1;
    for (size_t i = 2; i < shape.size(); ++i) g.padding.pixels *= shape[i];
  }
  if (g.num_elements == 0 || g.identity || L == 1) return g;
  if (p.block_size <= L) {
    // Every block is block_size consecutive floats of one NCHWc block, in channel order
    // (measured: for block_size == L as fast as the lanes view, or faster).
    g.outer = 1;
    g.length = g.num_elements;
    g.inner = 1;
    return g;
  }
  g.length = shape[1] / L;
  g.inner *= L;
  g.lanes = L;
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
