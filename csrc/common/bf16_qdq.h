// Per-element BF16 quantize / dequantize (docs/formats.md) of ExtendedQuantizeLinear /
// ExtendedDequantizeLinear with a bfloat16 zero point), shared by every backend. The *_lanes
// forms are templates over the lane type (numerics.h), zp the zero point widened to float.
#pragma once

#include "numerics.h"

namespace mxops {

// kUnitScale: the caller knows scale == 1 and the division is left out (x / 1 is x for
// every x but a NaN, and a NaN becomes 0x7FC1 either way), the same bits without the divide.

// The bfloat16 bits of x / scale + zp, nearest-even; a NaN result becomes 0x7FC1.
template <bool kUnitScale = false, class F>
MXOPS_HD LaneU<F> bf16_quantize_lanes(F x, float scale, float zp) {
  F v = x;
  if constexpr (!kUnitScale) v = v / scale;
  v = v + zp;
  const LaneU<F> u = f2u(v);
  return select((u & 0x7fffffffu) > 0x7f800000u, splat<LaneU<F>>(0x7fc1u), BFloat16::store_bits(v));
}

// (float(y) - zp) * scale, y the bfloat16 bits in a 32-bit lane (kUnitScale: d * 1 is d,
// a NaN's payload included, so the multiply is left out).
template <bool kUnitScale = false, class U>
MXOPS_HD LaneF<U> bf16_dequantize_lanes(U y, float scale, float zp) {
  const LaneF<U> d = BFloat16::load_bits(y) - zp;
  if constexpr (kUnitScale) return d;
  return d * scale;
}

// BF16QuantizeDequantize: the dequantized quantization of x, the pair's arithmetic in its
// order, so the result has the bits the two nodes give.
template <bool kUnitScale = false, class F>
MXOPS_HD F bf16_quantize_dequantize_lanes(F x, float scale, float zp) {
  return bf16_dequantize_lanes<kUnitScale>(bf16_quantize_lanes<kUnitScale>(x, scale, zp), scale, zp);
}

MXOPS_HD uint16_t bf16_quantize(float x, float scale, uint16_t zero_point) {
  return static_cast<uint16_t>(bf16_quantize_lanes(x, scale, BFloat16::load(zero_point)));
}

MXOPS_HD float bf16_dequantize(uint16_t y, float scale, uint16_t zero_point) {
  return bf16_dequantize_lanes(static_cast<uint32_t>(y), scale, BFloat16::load(zero_point));
}

MXOPS_HD float bf16_quantize_dequantize(float x, float scale, uint16_t zero_point) {
  return bf16_quantize_dequantize_lanes(x, scale, BFloat16::load(zero_point));
}

}  // namespace mxops
