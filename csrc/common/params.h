// The catalogue of the ops (names, domains, attributes with their types, defaults and ranges,
// MX element formats, bfp_method names), the validation that reads it, and the tensor
// geometry a kernel runs over. Independent of ONNX Runtime and of every backend: the ORT
// front end (csrc/ort), the pybind module (csrc/python, which also exports the catalogue as
// ort_mx_ops._native.catalogue()) and the GPU test entry points parse attributes with this
// code. The arithmetic the attributes select is documented in docs/formats.md.
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

// Everything a kernel needs to know about one BFP / MX node, validated.
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
  // nchwc_block (our extension): 0 for the plain layout; L > 0: the input is stored in
  // onnxruntime's blocked NCHWc layout with blocks of L channels (see make_block_geometry).
  int nchwc_block = 0;
  // nchwc_channels (our extension, with nchwc_block): the input's real channels (0: all of
  // them); the others are the NCHWc layout's padding (see make_block_geometry).
  int64_t nchwc_channels = 0;
  // input_divisor (our extension): 0, or d > 0: the op quantizes X / d (each element divided
  // by the float32 d, correctly rounded, as an ONNX Div node before it computes), so one node
  // does what a Div by a constant followed by the op does, with the same bits (CPU kernels,
  // float32 inputs only; docs/formats.md, "A divisor before the blocks").
  int64_t input_divisor = 0;
  // input_hardswish (our extension): each element x is first replaced by
  // x * min(max(x + 3, 0), 6), every step rounded to float32 as the Add, Clip and Mul nodes of
  // an exported hard-swish compute it (a NaN stays that NaN, quieted), then divided by
  // input_divisor where set (CPU kernels, float32 inputs only; docs/formats.md, "Hard-swish
  // before the blocks").
  bool input_hardswish = false;
};

// ------------------------------------------------------------------------------------------
// The catalogue
// ------------------------------------------------------------------------------------------

// What an op computes; every registered name maps to one kind.
enum class OpKind : int {
  kBfp = 0,
  kMx = 1,
  kBf16Quantize = 2,
  kBf16Dequantize = 3,
  kBf16QuantizeDequantize = 4,  // the pair in one node, our own op
};

struct OpSpec {
  const char* name;
  const char* domain;
  OpKind kind;
};

// Every registered op name, in both domains (com.amd.quark and the legacy com.vai.quantize).
const std::vector<OpSpec>& op_catalogue();

// "BFP", "MX", "BF16_QUANTIZE" or "BF16_DEQUANTIZE".
const char* op_kind_name(OpKind kind);

enum class AttrType : int { kInt = 0, kString = 1 };

// One attribute of an op kind. Integer ranges are inclusive; `allowed` lists the accepted
// strings of a string attribute (empty: no list). `meaning` is added to range errors.
struct AttrSpec {
  std::string name;
  AttrType type;
  int64_t int_default;
  std::string string_default;
  std::optional<int64_t> min, max;
  std::vector<std::string> allowed;
  std::string meaning;
};

const std::vector<AttrSpec>& attributes_of(OpKind kind);

// One MX element type. Integer (int8): exponent_bits = mantissa_bits = 0.
struct MxFormatSpec {
  std::string name;
  int exponent_bits, mantissa_bits, emax;
  float max_normal;
  MxElement element() const;
};

const std::vector<MxFormatSpec>& mx_formats();

// bfp_method values and the method each stands for ("to_bfp_prime_shared" is an old alias).
struct BfpMethodSpec {
  std::string name;
  std::string canonical;
  Method method;
};

const std::vector<BfpMethodSpec>& bfp_methods();

// ------------------------------------------------------------------------------------------
// Reading a node's attributes
// ------------------------------------------------------------------------------------------

// The type an attribute was found with (ONNX attribute types the sources can tell apart).
enum class FoundType : int { kAbsent, kInt, kFloat, kString, kInts, kFloats, kOther };

const char* found_type_name(FoundType t);

struct AttributeValue {
  FoundType type = FoundType::kAbsent;
  int64_t i = 0;   // kInt
  std::string s;   // kString
};

// A node's attributes as one front end sees them.
struct AttributeSource {
  // The attribute `name` with the type it has on the node (kAbsent when not set).
  std::function<AttributeValue(const std::string& name)> get;
  // Names the node sets that are not in `known` (the front end finds what it can).
  std::function<std::vector<std::string>(const std::vector<std::string>& known)> unknown;
};

// Thrown for a bad attribute, axis or input; the message names the op, the attribute and
// what is allowed. Front ends turn it into an ONNX Runtime error status or a Python error.
struct InvalidArgument {
  std::string message;
};

// Parses and validates the attributes of an op of kind kBfp / kMx. `op` names the op (and
// node) in error messages.
QdqParams parse_block_attributes(OpKind kind, const std::string& op, const AttributeSource& attrs);

// The `axis` of ExtendedQuantizeLinear / ExtendedDequantizeLinear, validated likewise.
int64_t parse_linear_attributes(OpKind kind, const std::string& op, const AttributeSource& attrs);

// ------------------------------------------------------------------------------------------
// Geometry
// ------------------------------------------------------------------------------------------

// The tensor as the kernel sees it: [outer, length, inner] with blocks of block_size along
// `length`. `identity` is set for a one-element tensor, which is returned unchanged (rounded
// to bfloat16 first when bf16_first), as Quark does.
//
// lanes > 1 (nchwc_block = L with block_size a multiple of L): the memory is [outer = N,
// length = C / L, inner = pixels * L], channel c of a pixel at row c / L, lane c % L of the
// pixel's L adjacent columns; a block is block_size / L consecutive rows (fewer for the last)
// times the L aligned columns of one pixel. Only the CPU kernels walk this view.
// The padding channels of an NCHWc input (nchwc_channels = c below the channel count C):
// memory [batches, groups = C / lanes, pixels, lanes], in which the last group's lanes from
// `real` = c - (groups - 1) * lanes on are padding. real == 0: no padding.
struct NchwcPadding {
  int64_t batches = 0, groups = 0, pixels = 0, lanes = 0, real = 0;
};

struct Geometry {
  int64_t outer = 0, length = 0, inner = 0;
  int64_t num_elements = 0;
  bool identity = false;
  int64_t lanes = 1;
  NchwcPadding padding;  // only the CPU kernels take padding (quantize_dequantize, qdq_cpu.cc)

  int64_t blocks_along(int block_size) const { return (length + block_size - 1) / block_size; }
};

// Geometry of a tensor of `shape` blocked along `axis`: rank 0/1 ignore the axis; otherwise
// axis must lie in [-rank, rank-1]. Throws InvalidArgument naming `op_name`.
Geometry make_geometry(const std::string& op_name, const std::vector<int64_t>& shape,
                       int64_t axis);

// Geometry of the input of a BFP / MX node with parameters `p` and logical `shape`: that of
// make_geometry without nchwc_block. With nchwc_block = L > 0 the input must have rank >= 2,
// `axis` must be 1 (after counting a negative one from the end) and the channel count
// shape[1] a multiple of L; blocks of block_size consecutive channels of one pixel are then
// read in the NCHWc memory order [N, C / L, d2, ..., L]: a view with lanes = L when
// block_size is a multiple of L larger than L, else (L a multiple of block_size) the plain
// flat view, in which every block is block_size consecutive floats already. With
// nchwc_channels = c (C - L < c <= C) below C, `padding` describes the C - c padding channels
// of the last group; the view is that of all C channels (the CPU kernel zeroes the padding
// first: zeros change no block of the real channels, and blocks of zeros give +0). Throws
// InvalidArgument naming `op_name`.
Geometry make_block_geometry(const std::string& op_name, const std::vector<int64_t>& shape,
                             const QdqParams& p);

const char* dtype_name(DType t);

}  // namespace mxops
