// The numeric core of ort-mx-ops: every per-element and per-block function of SPEC section 2,
// written once and compiled for the host (CPU backend, pybind module) and for the device
// (CUDA and HIP backends). Backends own memory access, threading and launch only; the bits
// come from here, so every backend agrees by construction.
//
// Conventions
//  - All arithmetic is IEEE float32 or 32-bit integer; nothing here depends on the FPU's
//    rounding mode beyond the default (nearest-even), on FMA contraction (builds use
//    -ffp-contract=off / -fmad=false) or on denormal flushing (never enabled).
//  - Division by a power of two is done as a multiplication by its exact reciprocal (split in
//    two factors when the reciprocal is not a float); both give the correctly rounded x / 2^k.
//  - Functions are branch-free selects where the hot path needs it, so loops vectorise.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MXOPS_HD __host__ __device__ __forceinline__
#else
#define MXOPS_HD inline __attribute__((always_inline))
#endif

namespace mxops {

// ------------------------------------------------------------------------------------------
// Bit access
// ------------------------------------------------------------------------------------------

MXOPS_HD uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MXOPS_HD float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

MXOPS_HD int imax(int a, int b) { return a > b ? a : b; }
MXOPS_HD int imin(int a, int b) { return a < b ? a : b; }

// e(x): the biased float32 exponent field, 0..255.
MXOPS_HD int exponent_field(uint32_t u) { return static_cast<int>((u >> 23) & 0xffu); }

// The key a block maximum runs over when Inf/NaN must not count (to_bfp and MX): 255 -> 0.
MXOPS_HD int finite_exponent(uint32_t u) {
  const int e = exponent_field(u);
  return e == 255 ? 0 : e;
}

// Exact float32 2^k. k is clamped to [-149, 127] so callers may pass an exponent whose value
// is then unused (masked lanes) without undefined behaviour.
MXOPS_HD float pow2(int k) {
  k = imin(imax(k, -149), 127);
  const uint32_t normal = static_cast<uint32_t>(k + 127) << 23;
  const uint32_t subnormal = 1u << imax(k + 149, 0) % 32;
  return u2f(k >= -126 ? normal : subnormal);
}

// Multiplying by (a, b) in that order gives x / 2^k correctly rounded, for any k the ops use
// (-127 <= k <= 300): for k >= -127 one factor 2^-k suffices when it is a float; when 2^-k
// overflows (k < -127) both factors scale up, which is exact.
struct Pow2Divisor {
  float a, b;
};

MXOPS_HD Pow2Divisor pow2_divisor(int k) {
  const int inv = -k;
  Pow2Divisor d;
  d.a = pow2(inv > 127 ? 127 : inv);
  d.b = pow2(inv > 127 ? inv - 127 : 0);
  return d;
}

MXOPS_HD float divide(float x, Pow2Divisor d) { return (x * d.a) * d.b; }

// ------------------------------------------------------------------------------------------
// Rounding to an integer (SPEC 2.1), for |v| < 2^31; all values the ops round are below 2^24.
// ------------------------------------------------------------------------------------------

enum RoundingMode : int { kHalfAwayFromZero = 0, kHalfUp = 1, kHalfEven = 2 };

MXOPS_HD float copysign_bits(float magnitude, float sign_source) {
  return u2f((f2u(magnitude) & 0x7fffffffu) | (f2u(sign_source) & 0x80000000u));
}

// floorf(v) for |v| < 2^31, through an integer conversion (vectorises without SSE4.1);
// floor(-0) stays -0.
MXOPS_HD float floor_small(float v) {
  const float t = static_cast<float>(static_cast<int32_t>(v));  // truncation
  const float f = t > v ? t - 1.0f : t;
  return f == 0.0f ? copysign_bits(f, v) : f;
}

template <int Mode>
MXOPS_HD float round_half(float v) {
  if (Mode == kHalfEven) {
    const float f = floor_small(v);
    const float d = v - f;
    const bool f_odd = (static_cast<int32_t>(f) & 1) != 0;
    return (d > 0.5f || (d == 0.5f && f_odd)) ? f + 1.0f : f;
  }
  // C roundf: floor(|v|) + (frac >= 0.5), with the sign of v (a zero result keeps it).
  const float a = u2f(f2u(v) & 0x7fffffffu);
  const float fa = floor_small(a);
  const float away = copysign_bits(a - fa >= 0.5f ? fa + 1.0f : fa, v);
  if (Mode == kHalfUp) {
    const float f = floor_small(v);
    // ceil(v) of a negative tie; ceil(-0.5) is -0
    return (v < 0.0f && v - f == 0.5f) ? copysign_bits(f + 1.0f, v) : away;
  }
  return away;
}

// Drop t low bits of the significand M (< 2^25) with a rounding rule (SPEC 2.2 step 3).
// A quotient equal to `keep_at` is kept as it is (microexponents saturate instead of
// carrying); pass 0xffffffff for plain rounding. t == 0 keeps M; t >= 25 gives 0.
template <int Mode>
MXOPS_HD uint32_t round_significand(uint32_t M, int t, uint32_t keep_at, bool negative) {
  const int tc = imin(imax(t, 0), 25);
  const uint32_t q = M >> tc;
  const uint32_t r = M & ((1u << tc) - 1u);
  const uint32_t h = (1u << tc) >> 1;
  bool tie_up;
  if (Mode == kHalfAwayFromZero) tie_up = true;
  else if (Mode == kHalfUp) tie_up = !negative;
  else tie_up = (q & 1u) != 0;
  const bool up = tc > 0 && (r > h || (r == h && tie_up));
  return (up && q != keep_at) ? q + 1u : q;
}

// ------------------------------------------------------------------------------------------
// to_bfp (SPEC 2.2)
// ------------------------------------------------------------------------------------------

struct BfpScale {
  Pow2Divisor div;  // x / scale
  float scale;      // 2^(E - (m - 1))
  float max_v;      // (2^m - 1) * scale
};

// s: the block maximum of finite_exponent(); m: mantissa bits (bit_width - 9, 1..23).
MXOPS_HD BfpScale bfp_scale(int s, int m) {
  const int k = s - 127 - (m - 1);
  BfpScale p;
  p.div = pow2_divisor(k);
  p.scale = pow2(k);
  p.max_v = static_cast<float>((1u << m) - 1u) * p.scale;
  return p;
}

template <int Mode>
MXOPS_HD float to_bfp_element(float x, const BfpScale& p) {
  const bool special = exponent_field(f2u(x)) == 255;
  float v = divide(x, p.div);
  v = special ? 0.0f : v;  // keep the integer conversion in floor_small defined
  float y = round_half<Mode>(v) * p.scale;
  y = y > p.max_v ? p.max_v : y;
  y = y < -p.max_v ? -p.max_v : y;
  return special ? x : y;
}

// ------------------------------------------------------------------------------------------
// to_bfp_prime, microexponents (SPEC 2.2)
// ------------------------------------------------------------------------------------------

// s: block maximum of exponent_field() (255 included); sub_max: the sub-block's maximum.
MXOPS_HD int bfp_prime_shift(int s, int sub_max, int shift_bits) {
  return imin(s - sub_max, (1 << shift_bits) - 1);
}

template <int Mode>
MXOPS_HD float bfp_prime_element(float x, int s, int shift, int m) {
  const uint32_t u = f2u(x);
  const int e = exponent_field(u);
  const bool negative = (u >> 31) != 0;
  const uint32_t M = e == 0 ? 0u : ((u & 0x7fffffu) | 0x800000u);  // subnormals flush
  const int t = s - shift - e + 24 - m;
  const uint32_t Mq = round_significand<Mode>(M, t, (1u << m) - 1u, negative);
  const float magnitude = static_cast<float>(Mq) * pow2(s - 127 - shift + 1 - m);
  const float y = u2f(f2u(magnitude) | (u & 0x80000000u));
  return s == 255 ? u2f(0x7fffffffu) : y;
}

// ------------------------------------------------------------------------------------------
// OCP microscaling (SPEC 2.3)
// ------------------------------------------------------------------------------------------

// One element type. Integer: mantissa_bits = 0, is_int = true.
struct MxElement {
  int mantissa_bits;
  int emin;          // 1 - bias
  int emax;
  float max_normal;
  bool is_int;
};

struct MxScale {
  Pow2Divisor div;  // x / X
  float X;          // 2^(s - 127 - emax), possibly a float32 subnormal
};

MXOPS_HD MxScale mx_scale(int s, int emax) {
  const int k = s - 127 - emax;
  MxScale p;
  p.div = pow2_divisor(k);
  p.X = pow2(k);
  return p;
}

// Round v to a floating element type: nearest-even, subnormals kept, saturated, zero -> +0.
MXOPS_HD float round_to_element(float v, const MxElement& f) {
  const uint32_t u = f2u(v);
  const uint32_t a = u & 0x7fffffffu;
  const int e = exponent_field(a);
  const int e_eff = imax(e, 1);  // float32 subnormals: value = fraction * 2^(1 - 150)
  const uint32_t M = (a & 0x7fffffu) | (e == 0 ? 0u : 0x800000u);
  const int t = 23 - f.mantissa_bits + imax(0, f.emin + 127 - e_eff);
  const uint32_t Mq = round_significand<kHalfEven>(M, t, 0xffffffffu, false);
  float r = static_cast<float>(Mq) * pow2(e_eff - 150 + t);
  r = r > f.max_normal ? f.max_normal : r;
  return r == 0.0f ? 0.0f : u2f(f2u(r) | (u & 0x80000000u));
}

template <int Mode>
MXOPS_HD float mx_element(float x, const MxScale& p, const MxElement& f) {
  const bool special = exponent_field(f2u(x)) == 255;
  float v = divide(x, p.div);
  v = special ? 0.0f : v;
  if (f.is_int) {
    float q = round_half<Mode>(v * 64.0f);
    q = q > 127.0f ? 127.0f : q;
    q = q < -128.0f ? -128.0f : q;
    v = q * 0.015625f;
  } else {
    v = round_to_element(v, f);
  }
  const float y = p.X * v;
  return special ? x : y;
}

// ------------------------------------------------------------------------------------------
// Storage types: widen to float32 exactly, narrow with nearest-even (SPEC 2.1)
// ------------------------------------------------------------------------------------------

// bfloat16 rounding of convert_to_bfloat_before_bfp: integer nearest-even, no special case.
MXOPS_HD float bf16_round_bits(float x) {
  const uint32_t u = f2u(x);
  return u2f((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

struct Float32 {
  using T = float;
  MXOPS_HD static float load(float v) { return v; }
  MXOPS_HD static float store(float v) { return v; }
};

struct Float16 {
  using T = uint16_t;
  MXOPS_HD static float load(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    const uint32_t normal = (em << 13) + 0x38000000u;                    // rebias 15 -> 127
    const uint32_t subnormal = f2u(static_cast<float>(em) * 5.9604644775390625e-8f);  // 2^-24
    const uint32_t special = 0x7f800000u | ((em & 0x3ffu) << 13);        // Inf / NaN
    const uint32_t bits = em >= 0x7c00u ? special : (em >= 0x400u ? normal : subnormal);
    return u2f(sign | bits);
  }
  MXOPS_HD static uint16_t store(float f) {
    const uint32_t u = f2u(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7fffffffu;
    const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    const uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
    // Below 2^-14: adding 0.5 (ulp 2^-24) rounds to a whole number of half subnormal steps.
    const uint32_t subnormal = f2u(u2f(a) + 0.5f) - 0x3f000000u;
    uint32_t h = a >= 0x38800000u ? normal : subnormal;
    h = a >= 0x477ff000u ? 0x7c00u : h;  // rounds to 65520 or more: Inf
    h = a > 0x7f800000u ? nan : h;
    return static_cast<uint16_t>(sign | h);
  }
};

struct BFloat16 {
  using T = uint16_t;
  MXOPS_HD static float load(uint16_t b) { return u2f(static_cast<uint32_t>(b) << 16); }
  MXOPS_HD static uint16_t store(float f) {
    const uint32_t u = f2u(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = (u >> 16) | 0x40u;
    return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
};

}  // namespace mxops
