// Per-element BF16 quantize / dequantize of SPEC 2.4 (ExtendedQuantizeLinear /
// ExtendedDequantizeLinear with a bfloat16 zero point), shared by every backend.
#pragma once

#include "numerics.h"

namespace mxops {

// y = bfloat16(x / scale + zp), nearest-even; a NaN result becomes 0x7FC1.
MXOPS_HD uint16_t bf16_quantize(float x, float scale, uint16_t zero_point) {
  const float v = x / scale + BFloat16::load(zero_point);
  const uint32_t u = f2u(v);
  return (u & 0x7fffffffu) > 0x7f800000u ? uint16_t{0x7fc1} : BFloat16::store(v);
}

// x = (float(y) - float(zp)) * scale.
MXOPS_HD float bf16_dequantize(uint16_t y, float scale, uint16_t zero_point) {
  return (BFloat16::load(y) - BFloat16::load(zero_point)) * scale;
}

}  // namespace mxops
