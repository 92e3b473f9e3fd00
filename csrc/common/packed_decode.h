// Decoding of packed weights (docs/packed_weights.md): MXDequantize and BFPDequantize, one
// element at a time, for the host (CPU kernel) and the device (CUDA / HIP kernel). Every value
// is formed with the same float32 operations the quantize-dequantize ops end with (numerics.h:
// the element times a power of two, the sign put back on the magnitude), so a packed weight
// decodes to exactly the bits the folded weight holds. ort_mx_ops/packing.py is the numpy twin.
#pragma once

#include <cstdint>

#include "numerics.h"

namespace mxops::packed {

// Every element of a block whose scale / exponent byte is 255 decodes to this NaN.
constexpr uint32_t kNanBlockBits = 0x7fffffffu;

// Code `index` of `width` bits (1..24) from a little-endian bit stream: bit j of the stream is
// bit j % 8 of byte j / 8. Reads only the bytes that hold the code.
MXOPS_HD uint32_t read_code(const uint8_t* stream, int64_t index, int width) {
  const int64_t bit = index * width;
  const uint8_t* p = stream + (bit >> 3);
  const int shift = static_cast<int>(bit & 7);
  const int nbytes = (shift + width + 7) >> 3;  // <= 4
  uint32_t word = 0;
  for (int b = 0; b < nbytes; ++b) word |= static_cast<uint32_t>(p[b]) << (8 * b);
  return (word >> shift) & ((1u << width) - 1u);
}

// The index of the group (block or sub-block of `group` consecutive indices along the axis)
// of element n of a tensor viewed as [outer, length, inner], in a table laid out as
// [outer, ceil(length / group), inner].
MXOPS_HD int64_t group_index(int64_t n, int64_t length, int64_t inner, int64_t group) {
  const int64_t i = n % inner;
  const int64_t rest = n / inner;
  const int64_t l = rest % length;
  const int64_t o = rest / length;
  const int64_t groups = (length + group - 1) / group;
  return (o * groups + l / group) * inner + i;
}

// One MX element type as its code: sign, exponent_bits, mantissa_bits (OCP layout), or int8.
struct MxCode {
  int width;
  int exponent_bits;
  int mantissa_bits;
  int emin;  // 1 - bias
  float max_normal;
  bool is_int;
};

MXOPS_HD MxCode mx_code(const MxElement& f) {
  MxCode c{8, 0, 0, 0, f.max_normal, f.is_int};
  if (!f.is_int) {
    const int bias = 1 - f.emin;
    int eb = 1;
    while ((1 << (eb - 1)) - 1 < bias) ++eb;  // bias = 2^(eb - 1) - 1
    c.exponent_bits = eb;
    c.mantissa_bits = f.mantissa_bits;
    c.emin = f.emin;
    c.width = 1 + eb + f.mantissa_bits;
  }
  return c;
}

// The unscaled value of an element code. int8: two's complement times 2^-6. Floating: the OCP
// encoding; a code above max_normal is +-Inf (exponent field 31, mantissa 0, i.e. fp8_e5m2)
// or NaN (0x7fc00000 with the code's sign), as the OCP formats define them.
MXOPS_HD float mx_code_value(uint32_t code, const MxCode& c) {
  if (c.is_int) return static_cast<float>(static_cast<int8_t>(code & 0xffu)) * 0.015625f;
  const int mb = c.mantissa_bits;
  const uint32_t sign = (code >> (c.width - 1)) & 1u;
  const int e = static_cast<int>((code >> mb) & ((1u << c.exponent_bits) - 1u));
  const uint32_t mant = code & ((1u << mb) - 1u);
  const int bias = 1 - c.emin;
  float mag = e == 0 ? static_cast<float>(mant) * pow2(c.emin - mb)
                     : static_cast<float>(mant + (1u << mb)) * pow2(e - bias - mb);
  if (mag > c.max_normal)
    mag = u2f(c.exponent_bits == 5 && mant == 0 ? 0x7f800000u : 0x7fc00000u);
  return u2f(f2u(mag) | (sign << 31));
}

// MXDequantize of one element: X * value, X = 2^(scale_byte - 127) (E8M0). An Inf / NaN code
// decodes to itself; a scale byte of 255 makes the element kNanBlockBits.
MXOPS_HD float mx_decode(uint32_t code, uint32_t scale_byte, const MxCode& c) {
  if (scale_byte == 255u) return u2f(kNanBlockBits);
  const float v = mx_code_value(code, c);
  if ((f2u(v) & 0x7fffffffu) >= 0x7f800000u) return v;
  return pow2(static_cast<int>(scale_byte) - 127) * v;
}

// The exponent k of the quantum 2^k of a microexponent element: E - shift - 127 + 1 - m.
MXOPS_HD int bfp_prime_quantum_exponent(int E, int shift, int m) { return E - shift - 127 + 1 - m; }

// BFPDequantize of one element: a sign above m magnitude bits, +-(magnitude * 2^k); k from
// bfp_scale_exponent (to_bfp) or bfp_prime_quantum_exponent (to_bfp_prime).
MXOPS_HD float bfp_decode(uint32_t code, int m, int k) {
  const float mag = static_cast<float>(code & ((1u << m) - 1u)) * pow2(k);
  return u2f(f2u(mag) | (((code >> m) & 1u) << 31));
}

// Everything one dequantize node needs besides its buffers, validated by the caller.
struct PackedParams {
  bool mx = true;
  MxCode code{8, 0, 0, 0, 0.0f, true};  // MX
  bool prime = false;                   // BFP: to_bfp_prime
  int mantissa_bits = 7;                // BFP: bit_width - 9
  int width = 8;                        // bits per element code
  int64_t block_size = 32;
  int64_t sub_block_size = 2;
  int shift_bits = 0;
  int64_t length = 1, inner = 1;  // the tensor as [outer, length, inner]
};

struct PackedBuffers {
  const uint8_t* payload;
  const uint8_t* scales;  // MX: E8M0 scales; BFP: exponents
  const uint8_t* shifts;  // to_bfp_prime with shift_bits > 0
};

// Element n of the decoded tensor (before exceptions are applied).
MXOPS_HD float decode_element(const PackedParams& p, const PackedBuffers& b, int64_t n) {
  const uint32_t code = read_code(b.payload, n, p.width);
  const uint32_t E = b.scales[group_index(n, p.length, p.inner, p.block_size)];
  if (p.mx) return mx_decode(code, E, p.code);
  const int m = p.mantissa_bits;
  if (!p.prime) return bfp_decode(code, m, bfp_scale_exponent(static_cast<int>(E), m));
  if (E == 255u) return u2f(kNanBlockBits);
  const int shift = p.shift_bits == 0 ? 0 : static_cast<int>(read_code(
      b.shifts, group_index(n, p.length, p.inner, p.sub_block_size), p.shift_bits));
  return bfp_decode(code, m, bfp_prime_quantum_exponent(static_cast<int>(E), shift, m));
}

}  // namespace mxops::packed
