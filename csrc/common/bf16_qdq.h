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

// r = a (op) b where r is not NaN; where it is, the NaN an x86 processor gives (the CPU
// backend's arithmetic and so Quark's CPU outputs): a NaN operand with its quiet bit set, the
// left one where both are NaN, else (Inf - Inf, 0 x Inf) the default NaN 0xFFC00000. GPUs
// return one canonical NaN (0x7FFFFFFF) instead, so the formulas that can pass a NaN on spell
// these out. b's bits are taken without arithmetic, which would drop its payload on a GPU.
template <class F>
MXOPS_HD F with_x86_nan(F r, F a, float b) {
  using U = LaneU<F>;
  const U ur = f2u(r), ua = f2u(a), ub = splat<U>(f2u(b));
  const U quiet_a = ua | 0x400000u, quiet_b = ub | 0x400000u;
  const U nan = select((ua & 0x7fffffffu) > 0x7f800000u, quiet_a,
                       select((ub & 0x7fffffffu) > 0x7f800000u, quiet_b, splat<U>(0xffc00000u)));
  return u2f(select((ur & 0x7fffffffu) > 0x7f800000u, nan, ur));
}

// (float(y) - zp) * scale, y the bfloat16 bits in a 32-bit lane, NaN results as x86 gives
// them (with_x86_nan; kUnitScale: d * 1 is d, a NaN's payload included, so the multiply is
// left out).
template <bool kUnitScale = false, class U>
MXOPS_HD LaneF<U> bf16_dequantize_lanes(U y, float scale, float zp) {
  const LaneF<U> v = BFloat16::load_bits(y);
  const LaneF<U> d = with_x86_nan(v - zp, v, zp);
  if constexpr (kUnitScale) return d;
  return with_x86_nan(d * scale, d, scale);
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
