// The three block methods as policy objects over the numeric core, and the one dispatch from
// runtime parameters (method, rounding mode, storage type) to compile-time instantiations.
// Every backend walks blocks the same way with these:
//
//   s      = max over the block of policy.key(x)
//   (prime only) sub = max over each sub-block of policy.key(x)
//   params = policy.params(s, sub)
//   y      = policy.apply(x, params)      for each element of the (sub-)block
//
// Elements are loaded through a Loader, which widens the storage type to float32 and applies
// convert_to_bfloat_before_bfp in registers (never in the input buffer).
#pragma once

#include "numerics.h"
#include "params.h"

namespace mxops {

template <class IO, bool Bf16First>
struct Loader {
  using T = typename IO::T;
  MXOPS_HD static float load(T v) {
    const float f = IO::load(v);
    return Bf16First ? bf16_round_bits(f) : f;
  }
  MXOPS_HD static T store(float f) { return IO::store(f); }
};

template <int Mode>
struct ToBfpPolicy {
  static constexpr bool kSubBlocks = false;
  using Params = BfpScale<float>;
  int m;
  MXOPS_HD int key(float x) const { return finite_exponent(f2u(x)); }
  MXOPS_HD Params params(int s, int /*sub*/) const { return bfp_scale(s, m); }
  MXOPS_HD float apply(float x, const Params& p) const { return to_bfp_element<Mode>(x, p); }
};

template <int Mode>
struct ToBfpPrimePolicy {
  static constexpr bool kSubBlocks = true;
  using Params = BfpPrimeParams<float>;
  int m, sub_block_size, shift_bits;
  MXOPS_HD int key(float x) const { return exponent_field(f2u(x)); }
  MXOPS_HD Params params(int s, int sub) const { return bfp_prime_params(s, sub, shift_bits, m); }
  MXOPS_HD float apply(float x, const Params& p) const {
    return bfp_prime_element<Mode>(x, p, m);
  }
};

template <int Mode>
struct MxPolicy {
  static constexpr bool kSubBlocks = false;
  using Params = MxScale<float>;
  MxElement element;
  MXOPS_HD int key(float x) const { return finite_exponent(f2u(x)); }
  MXOPS_HD Params params(int s, int /*sub*/) const { return mx_scale(s, element.emax); }
  MXOPS_HD float apply(float x, const Params& p) const { return mx_element<Mode>(x, p, element); }
};

// Calls fn.template run<Loader, Policy>(policy) with the instantiation that `p` and `t` select.
// The sub-block size of a policy without sub-blocks is the block size.
template <class Fn>
void dispatch_block_op(const QdqParams& p, DType t, Fn&& fn) {
  auto with_io = [&](auto io_tag) {
    using IO = decltype(io_tag);
    auto with_mode = [&](auto mode_tag) {
      constexpr int kMode = decltype(mode_tag)::value;
      switch (p.method) {
        case Method::kToBfp:
          if (p.bf16_first)
            fn.template run<Loader<IO, true>>(ToBfpPolicy<kMode>{p.mantissa_bits});
          else
            fn.template run<Loader<IO, false>>(ToBfpPolicy<kMode>{p.mantissa_bits});
          break;
        case Method::kToBfpPrime: {
          ToBfpPrimePolicy<kMode> pol{p.mantissa_bits, p.sub_block_size, p.sub_block_shift_bits};
          if (p.bf16_first)
            fn.template run<Loader<IO, true>>(pol);
          else
            fn.template run<Loader<IO, false>>(pol);
          break;
        }
        case Method::kMx:
          fn.template run<Loader<IO, false>>(MxPolicy<kMode>{p.element});
          break;
      }
    };
    switch (p.rounding_mode) {
      case 0: with_mode(std::integral_constant<int, 0>{}); break;
      case 1: with_mode(std::integral_constant<int, 1>{}); break;
      default: with_mode(std::integral_constant<int, 2>{}); break;
    }
  };
  switch (t) {
    case DType::kFloat32: with_io(Float32{}); break;
    case DType::kFloat16: with_io(Float16{}); break;
    case DType::kBFloat16: with_io(BFloat16{}); break;
  }
}

}  // namespace mxops
