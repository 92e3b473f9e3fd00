// The numeric core of ort-mx-ops: every per-element and per-block function of the ops (docs/formats.md),
// written once and compiled for the host (CPU backends, pybind module) and for the device
// (CUDA and HIP backends). Backends own memory access, threading and launch only; the bits
// come from here, so every backend agrees by construction.
//
// Conventions
//  - All arithmetic is IEEE float32 or 32-bit integer; nothing here depends on the FPU's
//    rounding mode beyond the default (nearest-even), on FMA contraction (builds use
//    -ffp-contract=off / -fmad=false) or on denormal flushing (never enabled).
//  - Division by a power of two is done as a multiplication by its exact reciprocal (split in
//    two factors when the reciprocal is not a float); both give the correctly rounded x / 2^k.
//  - Every function is a template over its lane type: float / uint32_t / int32_t for one
//    element (host and device), or a GCC vector of them for the CPU SIMD walkers (host only,
//    simd_lanes.h). The same source is therefore the scalar and the vector code. It is
//    written branch-free with select() and with & / | on comparison results (a bool for one
//    element, a lane mask for a vector), never && / ||.
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
// Lane types and primitives
// ------------------------------------------------------------------------------------------

// LaneTypes<T>, T any lane type: F, U, I (the float, unsigned and signed lanes of the same
// width) and the primitives that differ between one element and a vector: bit
// reinterpretation, U <-> I, truncating float -> int and int -> float conversion, the
// symmetric clamp (clamp_magnitude), a multiply-add of an exact product (mul_add_exact) and the
// lesser magnitude with a chosen sign (min_magnitude_sign_of); kOneInstructionMagnitudes says
// whether the last two are one instruction each (bfp_prime_element_signed_normal).
template <class T>
struct LaneTypes;

// r clamped to [-m, m] for m > 0 and r finite, r itself (its sign on a zero) inside, by a
// minimum and a maximum: LaneTypes::clamp_magnitude where the lanes have no one-instruction form.
template <class F>
MXOPS_HD F clamp_magnitude_by_compares(F r, F m) {
  r = r > m ? m : r;
  return r < -m ? -m : r;
}

// The lesser of |s| and |r| with the sign of s, by a compare of the magnitudes:
// LaneTypes::min_magnitude_sign_of where the lanes have no one-instruction form (defined below,
// after f2u / u2f, which it uses).
template <class F>
MXOPS_HD F min_magnitude_sign_of_by_compares(F s, F r);

template <>
struct LaneTypes<float> {
  using F = float;
  using U = uint32_t;
  using I = int32_t;
  MXOPS_HD static U f2u(F f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __float_as_uint(f);
#else
    U u;
    std::memcpy(&u, &f, sizeof u);
    return u;
#endif
  }
  MXOPS_HD static F u2f(U u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __uint_as_float(u);
#else
    F f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
  }
  MXOPS_HD static I as_int(U u) { return static_cast<I>(u); }
  MXOPS_HD static U as_uint(I i) { return static_cast<U>(i); }
  MXOPS_HD static I trunc_to_int(F f) { return static_cast<I>(f); }
  MXOPS_HD static F to_float(I i) { return static_cast<F>(i); }
  MXOPS_HD static F clamp_magnitude(F r, F m) { return clamp_magnitude_by_compares(r, m); }
  MXOPS_HD static F mul_add_exact(F a, F b, F c) { return a * b + c; }
  MXOPS_HD static F min_magnitude_sign_of(F s, F r) { return min_magnitude_sign_of_by_compares(s, r); }
  static constexpr bool kOneInstructionMagnitudes = false;
};
template <>
struct LaneTypes<uint32_t> : LaneTypes<float> {};
template <>
struct LaneTypes<int32_t> : LaneTypes<float> {};

template <class T>
using LaneF = typename LaneTypes<T>::F;
template <class T>
using LaneU = typename LaneTypes<T>::U;
template <class T>
using LaneI = typename LaneTypes<T>::I;
// What a comparison gives: bool for one element, a signed lane mask (-1 / 0) for a vector.
template <class T>
using LaneMask = decltype(LaneI<T>{} == LaneI<T>{});

template <class F>
MXOPS_HD LaneU<F> f2u(F f) { return LaneTypes<F>::f2u(f); }
template <class U>
MXOPS_HD LaneF<U> u2f(U u) { return LaneTypes<U>::u2f(u); }
template <class U>
MXOPS_HD LaneI<U> as_int(U u) { return LaneTypes<U>::as_int(u); }
template <class I>
MXOPS_HD LaneU<I> as_uint(I i) { return LaneTypes<I>::as_uint(i); }
template <class F>
MXOPS_HD LaneI<F> trunc_to_int(F f) { return LaneTypes<F>::trunc_to_int(f); }
template <class I>
MXOPS_HD LaneF<I> to_float(I i) { return LaneTypes<I>::to_float(i); }
// The symmetric clamp of the plain forms below: two compares and selects for one element, one
// instruction where the lanes have one (AVX-512's range, simd_lanes.h).
template <class F>
MXOPS_HD F clamp_magnitude(F r, F m) { return LaneTypes<F>::clamp_magnitude(r, m); }

// a * b + c where the product a * b is exact, so that it rounds once whether or not the lanes
// fuse it: one fused multiply-add where they have one (AVX-512, simd_lanes.h), else a
// multiplication and an addition. The bits never depend on which.
template <class F>
MXOPS_HD F mul_add_exact(F a, F b, F c) { return LaneTypes<F>::mul_add_exact(a, b, c); }
// The lesser of |s| and |r| with the sign of s (s, r finite; either where they are equal):
// one instruction where the lanes have one (AVX-512's range, simd_lanes.h; then
// LaneTypes::kOneInstructionMagnitudes), else by a compare of the magnitudes.
template <class F>
MXOPS_HD F min_magnitude_sign_of(F s, F r) { return LaneTypes<F>::min_magnitude_sign_of(s, r); }

template <class F>
MXOPS_HD F min_magnitude_sign_of_by_compares(F s, F r) {
  const F as = u2f(f2u(s) & 0x7fffffffu), ar = u2f(f2u(r) & 0x7fffffffu);
  return u2f(f2u(ar < as ? ar : as) | (f2u(s) & 0x80000000u));
}

// c ? a : b per lane (GCC vectors take a lane mask as the condition).
template <class C, class T>
MXOPS_HD T select(C c, T a, T b) { return c ? a : b; }

// A lane type holding s in every lane. s - 0 is s exactly, -0 included.
template <class V, class S>
MXOPS_HD V splat(S s) { return s - V{}; }

// The comparison stays inside ?: here (not through select) so that GCC still sees a vector
// max / min: a mask passed on to select is materialised first.
template <class I>
MXOPS_HD I imax(I a, I b) { return a > b ? a : b; }
template <class I>
MXOPS_HD I imin(I a, I b) { return a < b ? a : b; }

// input_hardswish (params.h): hard-swish's numerator x * clip(x + 3, 0, 6), each step rounded
// to float32 as an exported hard-swish's Add, Clip and Mul compute it. A NaN t passes the clip
// unchanged, so a NaN x gives x quieted, whatever a Clip node does with NaN (the Mul by x
// gives x's NaN either way); -Inf gives NaN (-Inf * 0), as the nodes do.
MXOPS_HD float hardswish_numerator(float x) {
  const float t = x + 3.0f;
  const float c = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t);
  return x * c;
}

// e(x): the biased float32 exponent field, 0..255.
template <class U>
MXOPS_HD LaneI<U> exponent_field(U u) { return as_int((u >> 23) & 0xffu); }

// The key a block maximum runs over when Inf/NaN must not count (to_bfp and MX): 255 -> 0.
template <class U>
MXOPS_HD LaneI<U> finite_exponent(U u) {
  const LaneI<U> e = exponent_field(u);
  return select(e == 255, splat<LaneI<U>>(0), e);
}

// Block-maximum keys, a cheaper exact form of the maxima above: u << 1 drops the sign and
// keeps the order of |x|'s bits, so its top 8 bits are exponent_field(u) and the maximum of
// the keys over a block decodes to the maximum of exponent_field (exponent_of_key).
template <class U>
MXOPS_HD U exponent_key(U u) { return u << 1; }
template <class U>
MXOPS_HD LaneI<U> exponent_of_key(U k) { return as_int(k >> 24); }

// The same for finite_exponent: adding 1 to the top 8 bits maps e to e + 1 for e <= 254 and
// wraps 255 (Inf/NaN) to 0, below every finite key; a maximum with top bits t decodes to
// max(t, 1) - 1, which is 0 for a block of Inf/NaN only, as finite_exponent's maximum is.
template <class U>
MXOPS_HD U finite_exponent_key(U u) { return (u << 1) + 0x01000000u; }
template <class U>
MXOPS_HD LaneI<U> finite_exponent_of_key(U k) {
  return imax(as_int(k >> 24), splat<LaneI<U>>(1)) - 1;
}

// The same exponent from a block's greatest magnitude instead: `a`, the largest of its bit
// patterns with the sign cleared (as signed), below 0x7f800000 where the block is finite.
// One operation per element fewer than the key, and the value itself is known (see
// direct_round_unclamped), but Inf / NaN must be ruled out first.
template <class I>
MXOPS_HD I finite_exponent_of_magnitude(I a) { return a >> 23; }
template <class I>
MXOPS_HD LaneMask<I> magnitude_finite(I a) { return a < 0x7f800000; }

// e(x) == 255.
template <class U>
MXOPS_HD LaneMask<U> is_inf_or_nan(U u) { return (u & 0x7f800000u) == 0x7f800000u; }

// Exact float32 2^k. k is clamped to [-149, 127] so callers may pass an exponent whose value
// is then unused (masked lanes) without undefined behaviour.
template <class I>
MXOPS_HD LaneF<I> pow2(I k) {
  using U = LaneU<I>;
  k = imin(imax(k, splat<I>(-149)), splat<I>(127));
  const U normal = as_uint(k + 127) << 23;
  const U subnormal = splat<U>(1u) << (as_uint(k + 149) & 31u);
  return u2f(select(k >= -126, normal, subnormal));
}

// 2^k for k in [-126, 127] only (a normal float): pow2 without the clamp and the select.
template <class I>
MXOPS_HD LaneF<I> pow2_normal(I k) { return u2f(as_uint(k + 127) << 23); }

// Where both 2^k and 2^-k are normal floats, so that the NormalOnly forms below apply.
template <class I>
MXOPS_HD LaneMask<I> pow2_pair_normal(I k) { return (k >= -126) & (k <= 126); }

// Multiplying by (a, b) in that order gives x / 2^k correctly rounded, for any k the ops use
// (-127 <= k <= 300): for k >= -127 one factor 2^-k suffices when it is a float; when 2^-k
// overflows (k < -127) both factors scale up, which is exact.
template <class F>
struct Pow2Divisor {
  F a, b;
};

// NormalOnly: the caller knows pow2_pair_normal(k) (every lane); then b = 1.
template <bool NormalOnly = false, class I>
MXOPS_HD Pow2Divisor<LaneF<I>> pow2_divisor(I k) {
  using F = LaneF<I>;
  const I inv = -k;
  Pow2Divisor<F> d;
  if (NormalOnly) {
    d.a = pow2_normal(inv);
    d.b = splat<F>(1.0f);
  } else {
    d.a = pow2(imin(inv, splat<I>(127)));
    d.b = pow2(select(inv > 127, inv - 127, splat<I>(0)));
  }
  return d;
}

template <class F>
MXOPS_HD F divide(F x, const Pow2Divisor<F>& d) { return (x * d.a) * d.b; }

// ------------------------------------------------------------------------------------------
// Rounding to an integer (rounding_mode 0-2), for |v| < 2^31; all values the ops round are below 2^24.
// ------------------------------------------------------------------------------------------

enum RoundingMode : int { kHalfAwayFromZero = 0, kHalfUp = 1, kHalfEven = 2 };

template <class F>
MXOPS_HD F copysign_bits(F magnitude, F sign_source) {
  return u2f((f2u(magnitude) & 0x7fffffffu) | (f2u(sign_source) & 0x80000000u));
}

// floorf(v) for |v| < 2^31, through an integer conversion (vectorises without SSE4.1);
// floor(-0) stays -0.
template <class F>
MXOPS_HD F floor_small(F v) {
  const F t = to_float(trunc_to_int(v));  // truncation
  const F f = select(t > v, t - 1.0f, t);
  return select(f == 0.0f, copysign_bits(f, v), f);
}

// Small (a promise of the caller, used by kHalfEven only): |v| < 2^22. Half to even is then
// one addition, (v + 1.5*2^23) - 1.5*2^23 (the default nearest-even float addition), with
// ±0 passed through so that -0 stays -0 as floor_small keeps it; the result is the same.
template <int Mode, bool Small = false, class F>
MXOPS_HD F round_half(F v) {
  if (Mode == kHalfEven && Small) {
    const F r = (v + 12582912.0f) - 12582912.0f;
    return select(v == 0.0f, v, r);
  }
  if (Mode == kHalfEven) {
    const F f = floor_small(v);
    const F d = v - f;
    const auto f_odd = (trunc_to_int(f) & 1) != 0;
    return select((d > 0.5f) | ((d == 0.5f) & f_odd), f + 1.0f, f);
  }
  // C roundf: floor(|v|) + (frac >= 0.5), with the sign of v (a zero result keeps it).
  const F a = u2f(f2u(v) & 0x7fffffffu);
  const F fa = floor_small(a);
  const F away = copysign_bits(select(a - fa >= 0.5f, fa + 1.0f, fa), v);
  if (Mode == kHalfUp) {
    const F f = floor_small(v);
    // ceil(v) of a negative tie; ceil(-0.5) is -0
    return select((v < 0.0f) & (v - f == 0.5f), copysign_bits(f + 1.0f, v), away);
  }
  return away;
}

// Whether a quotient q with remainder r (half step h) rounds up; negative: mask of x < 0.
template <int Mode, class I, class U, class Mask>
MXOPS_HD auto rounds_up(I r, I h, U q, Mask negative) {
  if constexpr (Mode == kHalfAwayFromZero) return r >= h;
  else if constexpr (Mode == kHalfUp) return (r > h) | ((r == h) & (negative == 0));
  else return (r > h) | ((r == h) & ((q & 1u) != 0));
}

// Drop t low bits of the significand M (< 2^25) with a rounding rule (to_bfp_prime).
// A quotient equal to `keep_at` is kept as it is (microexponents saturate instead of
// carrying); pass 0xffffffff for plain rounding. t <= 0 keeps M; t >= 25 gives 0.
template <int Mode, class U, class Mask>
MXOPS_HD U round_significand(U M, LaneI<U> t, U keep_at, Mask negative) {
  using I = LaneI<U>;
  const I tc = imin(imax(t, splat<I>(0)), splat<I>(25));
  const U q = M >> as_uint(tc);
  const U one_t = splat<U>(1u) << as_uint(tc);
  const I r = as_int(M & (one_t - 1u));  // r, h < 2^25: signed compares suffice
  const I h = as_int(one_t >> 1);
  const auto up = (tc > 0) & rounds_up<Mode>(r, h, q, negative) & (q != keep_at);
  return select(up, q + 1u, q);
}

// ------------------------------------------------------------------------------------------
// to_bfp (BFPQuantizeDequantize)
// ------------------------------------------------------------------------------------------

template <class F>
struct BfpScale {
  Pow2Divisor<F> div;  // x / scale
  F scale;             // 2^(E - (m - 1))
  F max_v;             // (2^m - 1) * scale
};

// The exponent k of scale = 2^k; s: the block maximum of finite_exponent(); m: mantissa bits
// (bit_width - 9, 1..23).
template <class I>
MXOPS_HD I bfp_scale_exponent(I s, int m) { return s - (127 + (m - 1)); }

// NormalOnly: the caller knows pow2_pair_normal(bfp_scale_exponent(s, m)) in every lane.
template <bool NormalOnly = false, class I>
MXOPS_HD BfpScale<LaneF<I>> bfp_scale(I s, int m) {
  const I k = bfp_scale_exponent(s, m);
  BfpScale<LaneF<I>> p;
  p.div = pow2_divisor<NormalOnly>(k);
  p.scale = NormalOnly ? pow2_normal(k) : pow2(k);
  p.max_v = static_cast<float>((1u << m) - 1u) * p.scale;
  return p;
}

// Small: see round_half; holds for m <= 21 (|x / scale| < 2^m).
template <int Mode, bool Small = false, class F>
MXOPS_HD F to_bfp_element(F x, const BfpScale<F>& p) {
  const auto special = is_inf_or_nan(f2u(x));
  F v = divide(x, p.div);
  v = select(special, splat<F>(0.0f), v);  // keep the integer conversion in floor_small defined
  F y = round_half<Mode, Small>(v) * p.scale;
  y = select(y > p.max_v, p.max_v, y);
  const F neg_max = -p.max_v;
  y = select(y < neg_max, neg_max, y);
  return select(special, x, y);
}

// ------------------------------------------------------------------------------------------
// to_bfp_prime, microexponents (BFPQuantizeDequantize)
// ------------------------------------------------------------------------------------------

// s: block maximum of exponent_field() (255 included); sub_max: the sub-block's maximum.
template <class I>
MXOPS_HD I bfp_prime_shift(I s, I sub_max, int shift_bits) {
  return imin(s - sub_max, splat<I>((1 << shift_bits) - 1));
}

// What every element of one sub-block shares.
template <class F>
struct BfpPrimeParams {
  LaneI<F> t_base;      // s - shift + 24 - m: an element of exponent e drops t_base - e bits
  F quantum;            // 2^(s - shift - 127 + 1 - m)
  F add, sat;           // quantum * 2^23 and (2^m - 1) * quantum (bfp_prime_element_by_addition)
  LaneMask<F> nan;      // s == 255: the block holds Inf or NaN
};

template <class I>
MXOPS_HD BfpPrimeParams<LaneF<I>> bfp_prime_params(I s, I sub_max, int shift_bits, int m) {
  const I es = s - bfp_prime_shift(s, sub_max, shift_bits);
  BfpPrimeParams<LaneF<I>> p;
  p.t_base = es + (24 - m);
  p.quantum = pow2(es + (1 - m - 127));
  p.add = p.quantum * 8388608.0f;
  p.sat = p.quantum * static_cast<float>((1u << m) - 1u);
  p.nan = s == 255;
  return p;
}

template <int Mode, class F>
MXOPS_HD F bfp_prime_element(F x, const BfpPrimeParams<F>& p, int m) {
  using U = LaneU<F>;
  const U u = f2u(x);
  const LaneI<F> e = exponent_field(u);
  const U M = select(e == 0, splat<U>(0u), (u & 0x7fffffu) | 0x800000u);  // subnormals flush
  const U Mq = round_significand<Mode>(M, p.t_base - e, splat<U>((1u << m) - 1u), as_int(u) < 0);
  const F magnitude = to_float(as_int(Mq)) * p.quantum;
  const F y = u2f(f2u(magnitude) | (u & 0x80000000u));
  return select(p.nan, u2f(splat<U>(0x7fffffffu)), y);
}

// Where bfp_prime_element_by_addition gives bfp_prime_element<kHalfEven>: quantum * 2^23 is
// a finite float and the block holds no Inf/NaN.
template <class F>
MXOPS_HD LaneMask<F> bfp_prime_addition_exact(const BfpPrimeParams<F>& p) {
  return (p.t_base <= 254) & (p.nan == 0);
}

// The sub-block exponent es = s - shift that bfp_prime_params scales by.
template <class I>
MXOPS_HD I bfp_prime_exponent(I s, I sub_max, int shift_bits) {
  return s - bfp_prime_shift(s, sub_max, shift_bits);
}

// Where bfp_prime_addition_params applies to every sub-block of a block with maximum s: no
// Inf/NaN (s <= 254) and t_base = es + 24 - m <= 254 for every es <= s.
template <class I>
MXOPS_HD LaneMask<I> bfp_prime_addition_block(I s, int m) {
  return (s <= 254) & (s <= 230 + m);
}

// bfp_prime_params' add and sat (all that bfp_prime_element_by_addition reads) from es alone,
// where bfp_prime_addition_block(s, m) holds: es >= 0 and m <= 23 put t_base = es + 24 - m in
// [1, 254], so quantum = 2^(t_base - 150) is exact and quantum * 2^23 is the normal float of
// exponent field t_base; sat = (2^m - 1) * quantum = add * (2^m - 1) * 2^-23 is exact both ways.
template <class I>
MXOPS_HD BfpPrimeParams<LaneF<I>> bfp_prime_addition_params(I es, int m) {
  using F = LaneF<I>;
  BfpPrimeParams<F> p{};
  p.add = u2f(as_uint(es + (24 - m)) << 23);
  p.sat = p.add * (static_cast<float>((1u << m) - 1u) * 1.1920928955078125e-7f);  // 2^-23
  return p;
}

// bfp_prime_element<kHalfEven> by one addition: (|x| + quantum * 2^23) - quantum * 2^23
// rounds |x| (< 2^m quanta) to a multiple of the quantum to nearest even; min() with
// (2^m - 1) * quantum is the saturation (a truncated q of 2^m - 1 is kept).
template <class F>
MXOPS_HD F bfp_prime_element_by_addition(F x, const BfpPrimeParams<F>& p) {
  using U = LaneU<F>;
  const U u = f2u(x);
  const U a_bits = u & 0x7fffffffu;
  const F a = select(a_bits < 0x00800000u, splat<F>(0.0f), u2f(a_bits));  // subnormals flush
  F r = (a + p.add) - p.add;
  r = select(r > p.sat, p.sat, r);
  return u2f(f2u(r) | (u & 0x80000000u));
}

// The same add and sat from exponents kept in place (e << 23, the bits of x & 0x7f800000):
// es = s - min(s - sub, 2^d - 1) = max(sub, s - (2^d - 1)), so es << 23 is one subtraction and
// one maximum of the in-place exponents, and add's bits are (es + 24 - m) << 23.
// It splits into the block's part, the least es it allows (s - (2^d - 1), in place), and the
// sub-block's: a walk over many sub-blocks of one block computes the first once.
template <class I>
MXOPS_HD I bfp_prime_floor_in_place(I s_bits, int shift_bits) {
  return s_bits - (((1 << shift_bits) - 1) << 23);
}

template <class I>
MXOPS_HD BfpPrimeParams<LaneF<I>> bfp_prime_addition_params_floor(I floor_bits, I sub_bits, int m) {
  using F = LaneF<I>;
  BfpPrimeParams<F> p{};
  const I es_bits = imax(sub_bits, floor_bits);
  p.add = u2f(as_uint(es_bits + ((24 - m) << 23)));
  p.sat = p.add * (static_cast<float>((1u << m) - 1u) * 1.1920928955078125e-7f);  // 2^-23
  return p;
}

template <class I>
MXOPS_HD BfpPrimeParams<LaneF<I>> bfp_prime_addition_params_in_place(I s_bits, I sub_bits, int shift_bits, int m) {
  return bfp_prime_addition_params_floor(bfp_prime_floor_in_place(s_bits, shift_bits), sub_bits, m);
}

// bfp_prime_element_by_addition without flushing subnormals, the same bits where every
// sub-block has es >= m + 1, i.e. every block s >= m + 2^shift_bits
// (bfp_prime_addition_normal_block): then half the quantum, 2^(es - m - 127), is at least
// 2^-126, so a subnormal |x| rounds to 0 as the flushed one does (a tie goes to the even 0).
template <class I>
MXOPS_HD LaneMask<I> bfp_prime_addition_normal_block(I s, int m, int shift_bits) {
  return s >= m + (1 << shift_bits);
}

template <class F>
MXOPS_HD F bfp_prime_element_by_addition_normal(F x, const BfpPrimeParams<F>& p) {
  using U = LaneU<F>;
  const U u = f2u(x);
  const F a = u2f(u & 0x7fffffffu);
  F r = (a + p.add) - p.add;
  r = select(r > p.sat, p.sat, r);
  return u2f(f2u(r) | (u & 0x80000000u));
}

// bfp_prime_element_by_addition_normal(x, bfp_prime_addition_params_floor(floor, sub, m)) from
// es_bits = imax(sub, floor) (es << 23), signed, in fewer operations where the lanes have
// mul_add_exact and min_magnitude_sign_of in one instruction each. e = 2^(es - 127) with x's
// sign (es >= m + 1 in the normal form: a normal float), so e * 2^(24 - m) is the addend
// +-quantum * 2^23, exact: x + that rounds once as |x| + add does in the unsigned form, to the
// same multiple of the quantum with x's sign (nearest-even is symmetric), and taking it away
// again is exact (Sterbenz). A negative x that rounds to zero gives +0 there; the sign comes
// back from the saturation bound e * (2^m - 1) * 2^(1 - m) = +-sat, which carries x's sign,
// in min_magnitude_sign_of (the lesser magnitude is the saturation).
template <class F>
MXOPS_HD F bfp_prime_element_signed_normal(F x, LaneI<F> es_bits, int m) {
  using U = LaneU<F>;
  const U u = f2u(x);
  const F e = u2f(as_uint(es_bits) | (u & 0x80000000u));
  const F addend = splat<F>(static_cast<float>(1u << (24 - m)));
  const F t = mul_add_exact(e, addend, x);
  const F r = mul_add_exact(e, -addend, t);
  const F sat = e * splat<F>(static_cast<float>((1u << m) - 1u) / static_cast<float>(1u << (m - 1)));
  return min_magnitude_sign_of(sat, r);
}

// ------------------------------------------------------------------------------------------
// OCP microscaling (MXQuantizeDequantize)
// ------------------------------------------------------------------------------------------

// One element type. Integer: mantissa_bits = 0, is_int = true.
struct MxElement {
  int mantissa_bits;
  int emin;          // 1 - bias
  int emax;
  float max_normal;
  bool is_int;
};

template <class F>
struct MxScale {
  Pow2Divisor<F> div;  // x / X
  F X;                 // 2^(s - 127 - emax), possibly a float32 subnormal
};

template <class I>
MXOPS_HD I mx_scale_exponent(I s, int emax) { return s - (127 + emax); }

// NormalOnly: the caller knows pow2_pair_normal(mx_scale_exponent(s, emax)) in every lane.
template <bool NormalOnly = false, class I>
MXOPS_HD MxScale<LaneF<I>> mx_scale(I s, int emax) {
  const I k = mx_scale_exponent(s, emax);
  MxScale<LaneF<I>> p;
  p.div = pow2_divisor<NormalOnly>(k);
  p.X = NormalOnly ? pow2_normal(k) : pow2(k);
  return p;
}

// Round v to a floating element type: nearest-even, subnormals kept, saturated, zero -> +0.
// The quantum of |v| is 2^(E - 127 - mb), E = max(e(|v|), emin + 127); with
// c = quantum * 2^23, (|v| + c) - c rounds |v| to a multiple of the quantum to nearest even
// (the sum lies in [2^23, 2^24) quanta). Exact for |v| < 2^(emax + 1), all the ops pass.
template <class F>
MXOPS_HD F round_to_element(F v, const MxElement& f) {
  using U = LaneU<F>;
  using I = LaneI<F>;
  const U u = f2u(v);
  const U a_bits = u & 0x7fffffffu;
  const I e = imax(exponent_field(a_bits), splat<I>(f.emin + 127));
  const F c = u2f(as_uint(e + (23 - f.mantissa_bits)) << 23);
  F r = (u2f(a_bits) + c) - c;
  r = select(r > f.max_normal, splat<F>(f.max_normal), r);
  return select(r == 0.0f, splat<F>(0.0f), u2f(f2u(r) | (u & 0x80000000u)));
}

// The integer element (int8, scale 2^-6) of v = x / X: |64 v| < 2^8.
template <int Mode, class F>
MXOPS_HD F round_to_int_element(F v) {
  F q = round_half<Mode, true>(v * 64.0f);
  q = select(q > 127.0f, splat<F>(127.0f), q);
  q = select(q < -128.0f, splat<F>(-128.0f), q);
  return q * 0.015625f;
}

// Kind: which element type, when the caller fixed it at compile time.
enum MxKind : int { kMxAnyElement = 0, kMxIntElement = 1, kMxFloatElement = 2 };

template <int Mode, int Kind = kMxAnyElement, class F>
MXOPS_HD F mx_element(F x, const MxScale<F>& p, const MxElement& f) {
  const auto special = is_inf_or_nan(f2u(x));
  F v = divide(x, p.div);
  v = select(special, splat<F>(0.0f), v);
  const bool is_int = Kind == kMxAnyElement ? f.is_int : Kind == kMxIntElement;
  v = is_int ? round_to_int_element<Mode>(v) : round_to_element(v, f);
  const F y = p.X * v;
  return select(special, x, y);
}

// mx_element of a floating element type without the division by X and the multiplication
// back: where mx_direct_block(s, f) holds (k = mx_scale_exponent(s, f.emax) with
// pow2_pair_normal(k); lo = emin + 127 + k >= 1; s + 23 - mantissa_bits <= 254), rounding |x|
// to a multiple of X * quantum(v) is X * round_to_element(v) exactly: v = x / X is exact when
// normal, and both sums of the rounding are normal floats, so scaling by X commutes with their
// rounding; a subnormal v rounds to 0 either way (|v| < 2^-126, far below half a quantum).
// The quantum's exponent max(e(|v|), emin + 127) + k is max(e(|x|), lo) (e(|x|) <= k for a
// subnormal v), at most s, which keeps c finite; clamping at X * max_normal is the clamp at
// max_normal scaled.
template <class F>
struct MxDirect {
  LaneU<F> lo;  // lo << 23
  F max_v;      // X * max_normal
};

template <class I>
MXOPS_HD LaneMask<I> mx_direct_block(I s, const MxElement& f) {
  const I k = mx_scale_exponent(s, f.emax);
  return pow2_pair_normal(k) & (k >= -126 - f.emin) & (s <= 231 + f.mantissa_bits);
}

template <class I>
MXOPS_HD MxDirect<LaneF<I>> mx_direct_params(I s, const MxElement& f) {
  const I k = mx_scale_exponent(s, f.emax);
  MxDirect<LaneF<I>> p;
  p.lo = as_uint(k + (f.emin + 127)) << 23;
  p.max_v = pow2_normal(k) * f.max_normal;
  return p;
}

template <class F>
MXOPS_HD F mx_float_element_direct(F x, const MxDirect<F>& p, const MxElement& f) {
  using U = LaneU<F>;
  const U u = f2u(x);
  const U a_bits = u & 0x7fffffffu;
  const U c_bits = imax(a_bits & 0x7f800000u, p.lo) + (static_cast<uint32_t>(23 - f.mantissa_bits) << 23);
  const F c = u2f(c_bits);
  F r = (u2f(a_bits) + c) - c;
  r = select(r > p.max_v, p.max_v, r);
  const F y = select(r == 0.0f, splat<F>(0.0f), u2f(f2u(r) | (u & 0x80000000u)));
  return select(as_int(a_bits) > 0x7f7fffff, x, y);  // Inf / NaN pass through
}

// ------------------------------------------------------------------------------------------
// Rounding in place: the forms above that divide by a power of two, round and multiply back,
// as one rounding of x itself to a multiple of the element's quantum (the CPU walkers' fast
// forms; the same bits where the *_block() conditions below hold).
// ------------------------------------------------------------------------------------------

// An integer element: the op computes v = x * 2^-kd (one factor, 2^-kd a normal float),
// rounds v * 2^f to an integer with half to even (round_half<kHalfEven, true>), clamps it to
// [lo_q, hi_q] and multiplies back by 2^(kd - f), the quantum. Where
// direct_round_block(kd, f) holds (f - 126 <= kd <= 23), that is:
//  - for |x| > 2^(kd - 150): (x + c) - c with c = 1.5 * 2^23 quanta, a normal float, rounds x
//    to a multiple of the quantum with half to even (|x| < 2^22 quanta, the sum lies in
//    [2^23, 2^24) quanta where the spacing is one quantum), the same value as the op's, and +0
//    where that is zero as the op's +0 (a nonzero v rounds to +0). v itself may be an inexact
//    subnormal only where |x / quantum| < 2^-126, which rounds to +0 either way;
//  - for |x| <= 2^(kd - 150) (±0 included): x * 2^-kd is ±0, which the op keeps through the
//    rounding and the scaling: the sign of x on a zero. For kd <= 23 the bound is 0 (kd <= 0)
//    or the float32 subnormal 2^(kd - 150), bits 1 << (kd - 1);
//  - clamping the rounded x to [lo_q, hi_q] quanta is clamping the integer, scaled exactly.
// Inf and NaN pass through unchanged, as in the op.
//
// Which bounds of that clamp a block can reach is a property of the format, so the params'
// type carries it (DirectClamp): to_bfp's clamp is symmetric (lo_q = -hi_q), one
// clamp_magnitude; the int8 MX element's lower bound is never reached, so its clamp is the
// upper bound alone (mx_int_direct_params).
enum class DirectClamp { kSymmetric, kUpper };

template <class F, DirectClamp C = DirectClamp::kSymmetric>
struct DirectRound {
  F c;             // 1.5 * 2^23 * quantum
  F hi, lo;        // hi_q and lo_q quanta
  LaneI<F> ntiny;  // 0x80000001 + the bits of 2^(kd - 150) (kd >= 1) or of 0 (kd <= 0)
};

template <class I>
MXOPS_HD LaneMask<I> direct_round_block(I kd, int f) { return (kd >= f - 126) & (kd <= 23); }

template <DirectClamp C, class I>
MXOPS_HD DirectRound<LaneF<I>, C> direct_round_params(I kd, int f, float hi_q, float lo_q) {
  DirectRound<LaneF<I>, C> p;
  const LaneF<I> quantum = pow2_normal(kd - f);  // kd - f >= -126
  p.c = u2f(f2u(quantum) + ((23u << 23) | 0x00400000u));
  p.hi = quantum * hi_q;
  p.lo = quantum * lo_q;
  // 2^(kd - 150) for 1 <= kd <= 23 is the subnormal 1 << (kd - 1), in integers: a float
  // product with a subnormal or underflowing result costs a microcode assist on some x86
  // processors, once per block here.
  using U = LaneU<I>;
  const U tiny = select(kd > 0, splat<U>(1u) << as_uint(imax(kd, splat<I>(1)) - 1), splat<U>(0u));
  p.ntiny = as_int(tiny + 0x80000001u);
  return p;
}

// direct_round_element for a block whose every x is finite and not below ntiny (as signed
// bits): the sign fix-up and the pass-through below change nothing there, so the clamp alone
// gives the same bits. min_key: the block's least finite_exponent_key (below 2^24 exactly for
// Inf / NaN); min_bits: the least of its bit patterns as signed integers.
template <class U>
MXOPS_HD LaneMask<U> keys_all_finite(U min_key) { return min_key >= 0x01000000u; }

template <class I, DirectClamp C>
MXOPS_HD LaneMask<I> direct_round_plain_block(I min_bits, const DirectRound<LaneF<I>, C>& p) {
  return min_bits >= p.ntiny;
}

// A sufficient condition for direct_round_plain_block whatever the block's kd (<= 23 where
// direct_round_block holds, so ntiny <= 0x80400001): no negative zero or subnormal x.
template <class I>
MXOPS_HD LaneMask<I> no_negative_tiny(I min_bits) { return min_bits >= static_cast<int32_t>(0x80800000u); }

// The rounding alone: direct_round_element_plain where the clamp changes nothing.
template <class F, DirectClamp C>
MXOPS_HD F direct_round_element_unclamped(F x, const DirectRound<F, C>& p) { return (x + p.c) - p.c; }

template <class F, DirectClamp C>
MXOPS_HD F direct_round_element_plain(F x, const DirectRound<F, C>& p) {
  const F r = direct_round_element_unclamped(x, p);
  if constexpr (C == DirectClamp::kUpper) return select(r > p.hi, p.hi, r);
  else return clamp_magnitude(r, p.hi);
}

// Whether the clamp changes no element of a block whose greatest magnitude has the bits `a`
// (finite, sign cleared): the rounding is monotonic in |x| and symmetric about 0 (nearest
// even on a grid of quanta), so no element rounds past the greatest one's rounding.
template <class F, DirectClamp C>
MXOPS_HD LaneMask<F> direct_round_unclamped(LaneI<F> a, const DirectRound<F, C>& p) {
  const F r = direct_round_element_unclamped(u2f(as_uint(a)), p);
  return (r <= p.hi) & (-r >= p.lo);
}

// The negative x of x * 2^-kd = -0 are the bit patterns 0x80000000 ... 0x80000000 + tiny,
// i.e. the signed ones below ntiny, and their r is +0 (|x| <= 2^(kd - 150) is below half a
// quantum, and the clamp keeps +0): the result there is -0, so a select replaces r (two
// vector operations, the compare and a blend, where OR-ing a shifted mask into r took three;
// docs/speed-log.md, "Negative zeros in one select"). Inf and NaN are the x with x - x unordered.
template <class F>
MXOPS_HD F with_tiny_sign(F r, F x, LaneI<F> ntiny) {
  return select(ntiny > as_int(f2u(x)), splat<F>(-0.0f), r);
}

// ntiny of every block whose kd is at most 0 (2^(kd - 150) is below the least subnormal): -0
// is then the one x below it, the same for all such blocks, so a walk over several blocks at
// once can compare x with this constant instead of with each block's ntiny (which it would
// first compute and broadcast to the block's lanes).
constexpr int32_t kNtinyOfKdAtMostZero = static_cast<int32_t>(0x80000001u);

// direct_round_element for a block known finite: the plain form, and x's sign back on the zero
// of a negative x below ntiny (-0 among them, as Hardswish gives below -3). ntiny: the
// block's (p.ntiny), or kNtinyOfKdAtMostZero where its kd is known to be at most 0.
template <class F, DirectClamp C>
MXOPS_HD F direct_round_element_finite(F x, const DirectRound<F, C>& p, LaneI<F> ntiny) {
  return with_tiny_sign(direct_round_element_plain(x, p), x, ntiny);
}

template <class F, DirectClamp C>
MXOPS_HD F direct_round_element_finite(F x, const DirectRound<F, C>& p) {
  return direct_round_element_finite(x, p, p.ntiny);
}

// The same where the clamp changes nothing (direct_round_unclamped).
template <class F, DirectClamp C>
MXOPS_HD F direct_round_element_finite_unclamped(F x, const DirectRound<F, C>& p, LaneI<F> ntiny) {
  return with_tiny_sign(direct_round_element_unclamped(x, p), x, ntiny);
}

template <class F, DirectClamp C>
MXOPS_HD F direct_round_element_finite_unclamped(F x, const DirectRound<F, C>& p) {
  return direct_round_element_finite_unclamped(x, p, p.ntiny);
}

template <class F, DirectClamp C>
MXOPS_HD F direct_round_element(F x, const DirectRound<F, C>& p) {
  const F y = direct_round_element_finite(x, p);
  const F d = x - x;
  return select(d != d, x, y);  // Inf / NaN pass through
}

// to_bfp's fast form (Small, kHalfEven): kd = bfp_scale_exponent(s, m), f = 0, the clamp at
// ±(2^m - 1).
template <class I>
MXOPS_HD LaneMask<I> bfp_direct_block(I s, int m) { return direct_round_block(bfp_scale_exponent(s, m), 0); }

// Whether bfp_direct_params(s, m) has kd <= 0 (its ntiny is kNtinyOfKdAtMostZero):
// block maxima below 2^m.
template <class I>
MXOPS_HD LaneMask<I> bfp_direct_tiny_is_zero(I s, int m) { return bfp_scale_exponent(s, m) <= 0; }

template <class I>
MXOPS_HD DirectRound<LaneF<I>> bfp_direct_params(I s, int m) {
  const float top = static_cast<float>((1u << m) - 1u);
  return direct_round_params<DirectClamp::kSymmetric>(bfp_scale_exponent(s, m), 0, top, -top);
}

// The int8 MX element's (kHalfEven): v = x / X with X = 2^kd, kd = mx_scale_exponent(s, 0),
// rounded at 2^-6 (f = 6), clamped to [-128, 127]. The block's greatest |x| is below 2^(kd + 1)
// (its exponent is s - 127 = kd, the element's emax being 0), i.e. below 128 quanta, so no x
// rounds below -128 quanta: the clamp is the upper bound alone (DirectClamp::kUpper).
template <class I>
MXOPS_HD LaneMask<I> mx_int_direct_block(I s, const MxElement& f) {
  return direct_round_block(mx_scale_exponent(s, f.emax), 6);
}

template <class I>
using MxIntDirect = DirectRound<LaneF<I>, DirectClamp::kUpper>;

template <class I>
MXOPS_HD MxIntDirect<I> mx_int_direct_params(I s, const MxElement& f) {
  return direct_round_params<DirectClamp::kUpper>(mx_scale_exponent(s, f.emax), 6, 127.0f, -128.0f);
}

// mx_float_element_direct with the sign in the rounding constant: with c of the sign of x,
// (x + c) - c is ±((|x| + |c|) - |c|) (nearest-even rounding is symmetric), and +0 where that
// is zero (x - x is +0), as mx_float_element_direct gives; the clamp is at ±max_v.
template <class F>
struct MxDirectSigned {
  LaneU<F> lo;  // lo << 23, as MxDirect
  F max_v;      // X * max_normal
};

template <class I>
MXOPS_HD MxDirectSigned<LaneF<I>> mx_direct_signed_params(I s, const MxElement& f) {
  const MxDirect<LaneF<I>> d = mx_direct_params(s, f);
  MxDirectSigned<LaneF<I>> p;
  p.lo = d.lo;
  p.max_v = d.max_v;
  return p;
}

// mx_float_element_direct_signed for a block of finite elements only (keys_all_finite).
// Its rounding alone, where the clamp at ±max_v changes nothing.
template <class F>
MXOPS_HD F mx_float_element_direct_signed_unclamped(F x, const MxDirectSigned<F>& p, const MxElement& f) {
  using U = LaneU<F>;
  const U u = f2u(x);
  const U c_bits = (imax(u & 0x7f800000u, p.lo) + (static_cast<uint32_t>(23 - f.mantissa_bits) << 23)) |
                   (u & 0x80000000u);
  const F c = u2f(c_bits);
  return (x + c) - c;
}

// Whether that is so for every element of a finite block whose greatest magnitude has the
// bits `a`: rounding to the element grid is monotonic in |x| and symmetric about 0.
template <class F>
MXOPS_HD LaneMask<F> mx_float_direct_signed_unclamped(LaneI<F> a, const MxDirectSigned<F>& p,
                                                      const MxElement& f) {
  return mx_float_element_direct_signed_unclamped(u2f(as_uint(a)), p, f) <= p.max_v;
}

template <class F>
MXOPS_HD F mx_float_element_direct_signed_finite(F x, const MxDirectSigned<F>& p, const MxElement& f) {
  return clamp_magnitude(mx_float_element_direct_signed_unclamped(x, p, f), p.max_v);
}

template <class F>
MXOPS_HD F mx_float_element_direct_signed(F x, const MxDirectSigned<F>& p, const MxElement& f) {
  const F r = mx_float_element_direct_signed_finite(x, p, f);
  return select((f2u(x) & 0x7f800000u) == 0x7f800000u, x, r);  // Inf / NaN pass through
}

// ------------------------------------------------------------------------------------------
// Storage types: widen to float32 exactly, narrow with nearest-even. The *_bits
// forms take and give the 16-bit pattern in a 32-bit lane.
// ------------------------------------------------------------------------------------------

// bfloat16 rounding of convert_to_bfloat_before_bfp: integer nearest-even, no special case.
template <class F>
MXOPS_HD F bf16_round_bits(F x) {
  const LaneU<F> u = f2u(x);
  return u2f((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

struct Float32 {
  using T = float;
  MXOPS_HD static float load(float v) { return v; }
  MXOPS_HD static float store(float v) { return v; }
};

struct Float16 {
  using T = uint16_t;
  template <class U>
  MXOPS_HD static LaneF<U> load_bits(U h) {
    const U sign = (h & 0x8000u) << 16;
    const U em = h & 0x7fffu;
    const U normal = (em << 13) + 0x38000000u;                               // rebias 15 -> 127
    const U subnormal = f2u(to_float(as_int(em)) * 5.9604644775390625e-8f);  // 2^-24
    const U special = 0x7f800000u | ((em & 0x3ffu) << 13);                   // Inf / NaN
    const U bits = select(em >= 0x7c00u, special, select(em >= 0x400u, normal, subnormal));
    return u2f(sign | bits);
  }
  template <class F>
  MXOPS_HD static LaneU<F> store_bits(F f) {
    using U = LaneU<F>;
    const U u = f2u(f);
    const U sign = (u >> 16) & 0x8000u;
    const U a = u & 0x7fffffffu;
    const U nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    const U normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
    // Below 2^-14: adding 0.5 (ulp 2^-24) rounds to a whole number of half subnormal steps.
    const U subnormal = f2u(u2f(a) + 0.5f) - 0x3f000000u;
    U h = select(a >= 0x38800000u, normal, subnormal);
    h = select(a >= 0x477ff000u, splat<U>(0x7c00u), h);  // rounds to 65520 or more: Inf
    h = select(a > 0x7f800000u, nan, h);
    return sign | h;
  }
  MXOPS_HD static float load(uint16_t h) { return load_bits(static_cast<uint32_t>(h)); }
  MXOPS_HD static uint16_t store(float f) { return static_cast<uint16_t>(store_bits(f)); }
};

struct BFloat16 {
  using T = uint16_t;
  template <class U>
  MXOPS_HD static LaneF<U> load_bits(U b) { return u2f(b << 16); }
  template <class F>
  MXOPS_HD static LaneU<F> store_bits(F f) {
    using U = LaneU<F>;
    const U u = f2u(f);
    const U rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const U nan = (u >> 16) | 0x40u;
    return select((u & 0x7fffffffu) > 0x7f800000u, nan, rounded);
  }
  MXOPS_HD static float load(uint16_t b) { return load_bits(static_cast<uint32_t>(b)); }
  MXOPS_HD static uint16_t store(float f) { return static_cast<uint16_t>(store_bits(f)); }
};

}  // namespace mxops
