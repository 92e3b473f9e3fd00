// GPU kernels of BFPQuantizeDequantize / MXQuantizeDequantize over the numeric core
// (csrc/common/numerics.h through the policies of csrc/common/block_ops.h). This file owns
// memory access and launch only; every bit comes from the shared core, so the GPU agrees with
// the CPU backend by construction. Included by qdq_<dtype>.cu, one translation unit per
// storage type so nvcc/hipcc can build them in parallel.
//
// The tensor is [outer, length, inner] with blocks of block_size along `length` (Geometry).
//
// inner == 1 (blocked axis innermost): a group of G lanes (a power of two <= 32) takes one
//   block; each lane holds V consecutive elements (V = 16 bytes / element size when the
//   block and the row are multiples of V and the buffers are 16-byte aligned, else 1), so
//   a 32-lane group reads 32 * V consecutive elements with one vector load per lane. The
//   block maximum is a butterfly of shuffles over the group, sub-block maxima (to_bfp_prime)
//   are in-thread, a narrower butterfly, or a segmented scan. A block too long for one load
//   per lane is walked by a whole 32-lane group in slices of 32 * V elements, in several
//   passes that re-read the block (from cache).
// inner > 1 (blocked axis outer): neighbouring threads take neighbouring columns, each
//   walking its own block down the column, so every row access of a warp is contiguous.
//   Blocks of up to 32 elements stay in registers; longer ones are re-read per pass.
// Sub-block layouts the contiguous kernels cannot reduce with shuffles (e.g. sub_block_size 3
//   in a block longer than 32) take the per-thread walk of the inner > 1 kernel with inner 1:
//   correct, not coalesced, and not used by any built-in configuration (BFP16, MX9/6/4, MXFP*, MXINT8).
//
// Indexing is 64-bit; kernels allocate nothing and grid-stride, so any size launches.
#pragma once

// gpu_runtime.h first: under HIP it brings in the runtime header that defines the
// __host__ __device__ __forceinline__ qualifiers of the numeric core.
#include "gpu_runtime.h"  // NOLINT(build/include_order)

#include <cstdint>
#include <type_traits>

#include "../common/block_ops.h"
#include "../common/params.h"

namespace mxops::gpu {

constexpr int kThreadsPerCta = 256;
constexpr int kCachedStridedRows = 32;  // inner > 1: blocks this long stay in registers

// How a contiguous kernel finds the maximum of each sub-block (to_bfp_prime).
enum class SubMode : int {
  kNone = 0,       // no sub-blocks (to_bfp, MX)
  kInThread = 1,   // sub_block_size divides V: inside one lane's vector
  kLanes = 2,      // sub_block_size = V * w, w a power of two: butterfly over w lanes
  kSlices = 3,     // sub_block_size a multiple of 32 * V: whole slices (uncached kernel only)
  kSegmented = 4,  // V == 1, any size: segmented max-scan over the group (cached kernel only)
};

struct QdqArgs {
  const void* x;
  void* y;
  int64_t length, inner;
  int64_t num_blocks;    // outer * blocks_along
  int64_t blocks_along;  // blocks per row
  int block_size;
  int sub;               // sub_block_size (block_size when there are none)
  int group;             // lanes per block G, a power of two <= 32 (cached contiguous kernel)
  int lanes_per_sub;     // w of SubMode::kLanes
  SubMode sub_mode;
  bool uniform;          // length % block_size == 0: block b starts at b * block_size
};

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Divides non-negative a by b > 0 in 32 bits when both fit (the common case), else 64.
__device__ __forceinline__ void divmod(int64_t a, int64_t b, int64_t& q, int64_t& r) {
  if (((a | b) >> 31) == 0) {
    const uint32_t q32 = static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
    q = q32;
    r = a - static_cast<int64_t>(q32) * b;
  } else {
    q = a / b;
    r = a - q * b;
  }
}

// Block b of the [outer, blocks_along] grid of blocks: its first element's row index
// (o * length + j0, in rows of `inner` elements) and its element count n <= block_size.
__device__ __forceinline__ void locate_block(const QdqArgs& a, int64_t b, int64_t& start, int& n) {
  if (a.uniform) {
    start = b * a.block_size;
    n = a.block_size;
    return;
  }
  int64_t o, blk;
  divmod(b, a.blocks_along, o, blk);
  const int64_t j0 = blk * a.block_size;
  start = o * a.length + j0;
  const int64_t left = a.length - j0;
  n = left < a.block_size ? static_cast<int>(left) : a.block_size;
}

// Maximum over the aligned group of `width` lanes (a power of two <= 32) around this lane.
__device__ __forceinline__ int group_max(int v, int width) {
  for (int m = 1; m < width; m <<= 1) v = imax(v, port::shfl_xor(v, m));
  return v;
}
__device__ __forceinline__ int group_min(int v, int width) {
  for (int m = 1; m < width; m <<= 1) v = imin(v, port::shfl_xor(v, m));
  return v;
}

// V elements of T at an address aligned to V * sizeof(T): one 16-byte access when V > 1.
struct alignas(16) Bytes16 {
  uint32_t w[4];
};

template <class T, int V>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, T (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = *p;
  } else {
    static_assert(sizeof(T) * V == 16, "vectors are 16 bytes");
    const Bytes16 w = *reinterpret_cast<const Bytes16*>(p);
    __builtin_memcpy(out, &w, sizeof w);
  }
}

template <class T, int V>
__device__ __forceinline__ void store_vec(T* __restrict__ p, const T (&in)[V]) {
  if constexpr (V == 1) {
    *p = in[0];
  } else {
    static_assert(sizeof(T) * V == 16, "vectors are 16 bytes");
    Bytes16 w;
    __builtin_memcpy(&w, in, sizeof w);
    *reinterpret_cast<Bytes16*>(p) = w;
  }
}

// Sub-block maxima of the V elements of one lane, for the in-thread and lane modes.
template <int V>
__device__ __forceinline__ void lane_sub_max(const int (&key)[V], const QdqArgs& a, int (&sm)[V]) {
  if (a.sub_mode == SubMode::kInThread) {
#pragma unroll
    for (int i = 0; i < V; ++i) sm[i] = key[i];
    if (V > 1) {
      // Segments of a.sub (which divides V, a power of two, so is one too: a mask, not a
      // division): running maximum forward, then spread backward.
      const int mask = a.sub - 1;
#pragma unroll
      for (int i = 1; i < V; ++i)
        if ((i & mask) != 0) sm[i] = imax(sm[i], sm[i - 1]);
#pragma unroll
      for (int i = V - 2; i >= 0; --i)
        if (((i + 1) & mask) != 0) sm[i] = sm[i + 1];
    }
  } else {  // kLanes: the lane's maximum, then a butterfly over lanes_per_sub lanes
    int m = 0;
#pragma unroll
    for (int i = 0; i < V; ++i) m = imax(m, key[i]);
    m = group_max(m, a.lanes_per_sub);
#pragma unroll
    for (int i = 0; i < V; ++i) sm[i] = m;
  }
}

// The storage type's conversions as the kernels use them. float16 takes the hardware's
// conversions (one instruction each way where Float16's integer code takes a dozen; both
// round correctly) for every value but NaN, whose payload the hardware does not keep: a NaN
// gets Float16's bits. Every other storage type is the numeric core's Loader itself.
// load_finite / store_finite are the same conversions where the value is finite (the plain
// blocks below); kExactFiniteLoad says whether load_finite also gives load's bits for Inf and
// NaN (where not, a block that turns out not to be finite is loaded again).
template <class Ld>
struct DeviceLoader : Ld {
  static constexpr bool kExactFiniteLoad = true;
  __device__ __forceinline__ static float load_finite(typename Ld::T v) { return Ld::load(v); }
  __device__ __forceinline__ static typename Ld::T store_finite(float f) { return Ld::store(f); }
};

template <bool Bf16First>
struct DeviceLoader<Loader<BFloat16, Bf16First>> : Loader<BFloat16, Bf16First> {
  static constexpr bool kExactFiniteLoad = true;
  __device__ __forceinline__ static float load_finite(uint16_t b) {
    return Loader<BFloat16, Bf16First>::load(b);
  }
  // BFloat16::store without its NaN case: the top half of the nearest-even rounding.
  __device__ __forceinline__ static uint16_t store_finite(float f) {
    return static_cast<uint16_t>(f2u(bf16_round_bits(f)) >> 16);
  }
};

template <bool Bf16First>
struct DeviceLoader<Loader<Float16, Bf16First>> {
  using T = uint16_t;
  // The hardware's NaN (0x7fffffff) would round to -0 in bf16_round_bits: with Bf16First,
  // load_finite is load.
  static constexpr bool kExactFiniteLoad = Bf16First;
  __device__ __forceinline__ static float load_finite(uint16_t h) {
    if constexpr (Bf16First) return load(h);
    return port::half_to_float(h);  // a NaN's payload is lost, not that it is a NaN
  }
  __device__ __forceinline__ static uint16_t store_finite(float f) {
    return port::float_to_half_rn(f);
  }
  __device__ __forceinline__ static float load(uint16_t h) {
    const uint32_t hu = h;
    const uint32_t nan = ((hu & 0x8000u) << 16) | 0x7f800000u | ((hu & 0x3ffu) << 13);
    const float f = (hu & 0x7fffu) > 0x7c00u ? u2f(nan) : port::half_to_float(h);
    return Bf16First ? bf16_round_bits(f) : f;
  }
  __device__ __forceinline__ static uint16_t store(float f) {
    const uint32_t u = f2u(f);
    const uint32_t a = u & 0x7fffffffu;
    const uint32_t nan = ((u >> 16) & 0x8000u) | 0x7e00u | ((a >> 13) & 0x3ffu);
    return a > 0x7f800000u ? static_cast<uint16_t>(nan) : port::float_to_half_rn(f);
  }
};

// The numeric core's cheaper exact forms (numerics.h; the CPU walker takes the same ones),
// chosen per block where its maximum allows them (almost every block of real data): the same
// bits in about half the instructions. FastPolicy<Policy, Form> is Policy with Form's
// ok(s) / params(s, sub) / apply(x, p) taken where ok(s) holds; the flag is uniform per block,
// so lanes of one block never diverge on it.
template <class Policy, class Form>
struct FastPolicy : Policy {
  struct Params {
    typename Policy::Params slow;
    typename Form::Params fast;
    bool is_fast;
  };
  Form form;
  __device__ __forceinline__ Params params(int s, int sub) const {
    Params p{};
    p.is_fast = form.ok(s);
    if (p.is_fast) p.fast = form.params(s, sub);
    else p.slow = Policy::params(s, sub);
    return p;
  }
  __device__ __forceinline__ float apply(float x, const Params& p) const {
    return p.is_fast ? form.apply(x, p.fast) : Policy::apply(x, p.slow);
  }
};

// Each form also has a plain form for blocks of finite elements (numerics.h; the CPU walker's
// apply_plain): plain_block(s, least) says whether it gives the form's bits for a finite block
// with maximum s whose least bit pattern (as signed) is `least` (read only where kNeedsLeast),
// apply_plain(x, p) is the form without its Inf / NaN pass-through and sign fix-ups.

// x rounded in place (DirectRound, nearest-even): to_bfp's with m <= 21 (bfp_direct_params),
// or the MX int8 element's (kMxInt: mx_int_direct_params).
template <bool kMxInt>
struct DirectRoundForm {
  using Params = std::conditional_t<kMxInt, MxIntDirect<int>, DirectRound<float>>;
  static constexpr bool kNeedsLeast = true;  // negative zeros and tiny negatives need the sign fix-up
  int m;              // to_bfp's mantissa bits
  MxElement element;  // the int8 element
  __device__ __forceinline__ bool ok(int s) const {
    return kMxInt ? mx_int_direct_block(s, element) : bfp_direct_block(s, m);
  }
  __device__ __forceinline__ Params params(int s, int) const {
    if constexpr (kMxInt) return mx_int_direct_params(s, element);
    else return bfp_direct_params(s, m);
  }
  __device__ __forceinline__ float apply(float x, const Params& p) const {
    return direct_round_element(x, p);
  }
  __device__ __forceinline__ bool plain_block(int s, int least) const {
    return ok(s) && direct_round_plain_block(least, params(s, 0));
  }
  __device__ __forceinline__ float apply_plain(float x, const Params& p) const {
    return direct_round_element_plain(x, p);
  }
};

// to_bfp_prime, nearest-even: each sub-block by one addition (bfp_prime_addition_params).
struct PrimeAdditionForm {
  using Params = BfpPrimeParams<float>;
  static constexpr bool kNeedsLeast = false;
  int m, shift_bits;
  __device__ __forceinline__ bool ok(int s) const { return bfp_prime_addition_block(s, m); }
  __device__ __forceinline__ Params params(int s, int sub) const {
    return bfp_prime_addition_params(bfp_prime_exponent(s, sub, shift_bits), m);
  }
  __device__ __forceinline__ float apply(float x, const Params& p) const {
    return bfp_prime_element_by_addition(x, p);
  }
  // The addition form has no special case to drop: its own bits on any block it applies to.
  __device__ __forceinline__ bool plain_block(int s, int) const { return ok(s); }
  __device__ __forceinline__ float apply_plain(float x, const Params& p) const { return apply(x, p); }
};

// MX floating elements, any rounding mode (they always round to nearest even).
struct MxFloatDirectForm {
  using Params = MxDirectSigned<float>;
  static constexpr bool kNeedsLeast = false;
  MxElement element;
  __device__ __forceinline__ bool ok(int s) const { return mx_direct_block(s, element); }
  __device__ __forceinline__ Params params(int s, int) const {
    return mx_direct_signed_params(s, element);
  }
  __device__ __forceinline__ float apply(float x, const Params& p) const {
    return mx_float_element_direct_signed(x, p, element);
  }
  __device__ __forceinline__ bool plain_block(int s, int) const { return ok(s); }
  __device__ __forceinline__ float apply_plain(float x, const Params& p) const {
    return mx_float_element_direct_signed_finite(x, p, element);
  }
};

// The policies with a plain form: FastPolicy's, through its Form.
template <class Policy>
struct HasPlainForm : std::false_type {};
template <class Policy, class Form>
struct HasPlainForm<FastPolicy<Policy, Form>> : std::true_type {};

// A block's greatest magnitude (bit pattern with the sign cleared) and least bit pattern (as
// signed), gathered element by element; padding adds +0, which changes neither test.
struct BlockExtremes {
  int magnitude = 0;
  int least = 0x7fffffff;
  __device__ __forceinline__ void add(float v) {
    const int bits = as_int(f2u(v));
    magnitude = imax(magnitude, bits & 0x7fffffff);
    least = imin(least, bits);
  }
  __device__ __forceinline__ bool finite() const { return magnitude_finite(magnitude); }
  // The block maximum of every policy's key where the block is finite.
  __device__ __forceinline__ int exponent() const { return finite_exponent_of_magnitude(magnitude); }
};

// ------------------------------------------------------------------------------------------
// inner == 1, block held in registers: G lanes x V elements per block, U blocks per lane.
// ------------------------------------------------------------------------------------------

// Sub-block maxima of the keys of lane r of a G-lane block (to_bfp_prime): in-thread, over
// lanes, or (V == 1) a segmented scan over lanes [seg, seg + sub) (seg: segment_start).
// Shuffles: every lane of the warp calls this together.
__device__ __forceinline__ int segment_start(const QdqArgs& a, int r) {
  return a.sub_mode == SubMode::kSegmented ? r - r % a.sub : 0;  // once per thread: a division
}

template <int V>
__device__ __forceinline__ void block_sub_maxima(const int (&key)[V], const QdqArgs& a, int r,
                                                 int G, int seg, int (&sm)[V]) {
  if (a.sub_mode == SubMode::kSegmented) {
    int m = key[0];
    for (int d = 1; d < G; d <<= 1) {
      const int t = port::shfl_up(m, d, G);
      if (r - d >= seg) m = imax(m, t);
    }
    const int last = imin(seg + a.sub, G) - 1;
    sm[0] = port::shfl(m, last, G);  // lanes past the block's end hold key 0
#pragma unroll
    for (int i = 1; i < V; ++i) sm[i] = sm[0];
  } else {
    lane_sub_max<V>(key, a, sm);
  }
}

// The unit's U blocks by their fast form's plain form, where every block of the warp's units
// is finite and takes it (one vote, so the warp stays converged); v holds the elements by
// Ld::load_finite, live[u] whether this lane's part of block u exists, block_live[u] whether
// block u does. Returns false, having written nothing, where any block of the warp does not.
template <class Ld, int U, int V, bool kSub, class Form>
__device__ __forceinline__ bool contiguous_plain_unit(const float (&v)[U][V], const int64_t (&off)[U],
                                                      const bool (&live)[U], const bool (&block_live)[U],
                                                      const QdqArgs& a, int r, int seg,
                                                      const Form& form,
                                                      typename Ld::T* __restrict__ y) {
  using T = typename Ld::T;
  const int G = a.group;
  int s[U];
  bool plain = true;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    BlockExtremes ext;
#pragma unroll
    for (int i = 0; i < V; ++i) ext.add(v[u][i]);  // +0 where not live
    ext.magnitude = group_max(ext.magnitude, G);
    if constexpr (Form::kNeedsLeast) ext.least = group_min(ext.least, G);
    s[u] = ext.exponent();
    plain = plain && (!block_live[u] || (ext.finite() && form.plain_block(s[u], ext.least)));
  }
  if (!port::all_lanes(plain)) return false;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    T out[V];
    if constexpr (kSub) {
      int key[V], sm[V];
#pragma unroll
      for (int i = 0; i < V; ++i) key[i] = exponent_field(f2u(v[u][i]));  // 0 where not live
      block_sub_maxima<V>(key, a, r, G, seg, sm);
#pragma unroll
      for (int i = 0; i < V; ++i) out[i] = Ld::store_finite(form.apply_plain(v[u][i], form.params(s[u], sm[i])));
    } else {
      const auto prm = form.params(s[u], 0);
#pragma unroll
      for (int i = 0; i < V; ++i) out[i] = Ld::store_finite(form.apply_plain(v[u][i], prm));
    }
    if (live[u]) store_vec<T, V>(y + off[u], out);
  }
  return true;
}

template <class Ld, class Policy, int V>
__global__ void __launch_bounds__(kThreadsPerCta)
contiguous_cached_kernel(QdqArgs a, Policy pol) {
  using T = typename Ld::T;
  using Params = typename Policy::Params;
  constexpr int U = V == 1 ? 8 : 16 / V;  // blocks in flight per lane
  constexpr bool kPlain = HasPlainForm<Policy>::value;
  const T* __restrict__ x = static_cast<const T*>(a.x);
  T* __restrict__ y = static_cast<T*>(a.y);
  const int lane = static_cast<int>(threadIdx.x) % kGroupLanes;
  const int G = a.group;
  const int groups = kGroupLanes / G;  // blocks side by side in a 32-lane group
  const int gr = lane / G, r = lane % G;
  const int seg = Policy::kSubBlocks ? segment_start(a, r) : 0;
  const int64_t per_unit = static_cast<int64_t>(groups) * U;
  const int64_t units = (a.num_blocks + per_unit - 1) / per_unit;

  // The loop bound is the same for the 32 lanes of a group, which keeps shuffles converged.
  for (int64_t unit = global_thread() / kGroupLanes; unit < units;
       unit += grid_threads() / kGroupLanes) {
    float v[U][V];
    int64_t off[U];
    bool live[U], block_live[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t b = unit * per_unit + static_cast<int64_t>(u) * groups + gr;
      int64_t start = 0;
      int n = 0;
      block_live[u] = b < a.num_blocks;
      if (block_live[u]) locate_block(a, b, start, n);
      live[u] = r * V < n;  // n is a multiple of V when V > 1
      off[u] = start + static_cast<int64_t>(r) * V;
      T raw[V];
      if (live[u]) {
        load_vec<T, V>(x + off[u], raw);
#pragma unroll
        for (int i = 0; i < V; ++i) v[u][i] = kPlain ? Ld::load_finite(raw[i]) : Ld::load(raw[i]);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) v[u][i] = 0.0f;
      }
    }
    if constexpr (kPlain) {
      if (contiguous_plain_unit<Ld, U, V, Policy::kSubBlocks>(v, off, live, block_live, a, r, seg,
                                                              pol.form, y))
        continue;
      if constexpr (!Ld::kExactFiniteLoad) {  // not all finite: the exact conversions
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (!live[u]) continue;
          T raw[V];
          load_vec<T, V>(x + off[u], raw);
#pragma unroll
          for (int i = 0; i < V; ++i) v[u][i] = Ld::load(raw[i]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int key[V];
      int s = 0;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        key[i] = live[u] ? pol.key(v[u][i]) : 0;  // padding never raises a maximum
        s = imax(s, key[i]);
      }
      s = group_max(s, G);
      T out[V];
      if constexpr (Policy::kSubBlocks) {
        int sm[V];
        block_sub_maxima<V>(key, a, r, G, seg, sm);
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = Ld::store(pol.apply(v[u][i], pol.params(s, sm[i])));
      } else {
        const Params prm = pol.params(s, 0);
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = Ld::store(pol.apply(v[u][i], prm));
      }
      if (live[u]) store_vec<T, V>(y + off[u], out);
    }
  }
}

// ------------------------------------------------------------------------------------------
// inner == 1, long blocks: a 32-lane group per block, slices of 32 * V elements, re-read.
// ------------------------------------------------------------------------------------------
template <class Ld, class Policy, int V>
__device__ __forceinline__ int slice_keys(const typename Ld::T* __restrict__ p, int64_t j, int n,
                                          const Policy& pol, int (&key)[V], float (&v)[V]) {
  int m = 0;
  if (j < n) {
    typename Ld::T raw[V];
    load_vec<typename Ld::T, V>(p + j, raw);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      v[i] = Ld::load(raw[i]);
      key[i] = pol.key(v[i]);
      m = imax(m, key[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      v[i] = 0.0f;
      key[i] = 0;
    }
  }
  return m;
}

template <class Ld, class Policy, int V>
__global__ void __launch_bounds__(kThreadsPerCta)
contiguous_long_kernel(QdqArgs a, Policy pol) {
  using T = typename Ld::T;
  const T* __restrict__ x = static_cast<const T*>(a.x);
  T* __restrict__ y = static_cast<T*>(a.y);
  const int lane = static_cast<int>(threadIdx.x) % kGroupLanes;
  constexpr int kSlice = kGroupLanes * V;

  for (int64_t b = global_thread() / kGroupLanes; b < a.num_blocks;
       b += grid_threads() / kGroupLanes) {
    int64_t start;
    int n;
    locate_block(a, b, start, n);
    const T* __restrict__ xb = x + start;
    T* __restrict__ yb = y + start;
    int key[V];
    float v[V];
    int s = 0;
    for (int j0 = 0; j0 < n; j0 += kSlice)
      s = imax(s, slice_keys<Ld, Policy, V>(xb, j0 + lane * V, n, pol, key, v));
    s = group_max(s, kGroupLanes);

    if constexpr (Policy::kSubBlocks) {
      if (a.sub_mode == SubMode::kSlices) {
        for (int q0 = 0; q0 < n; q0 += a.sub) {  // one sub-block of whole slices at a time
          const int q1 = imin(n, q0 + a.sub);
          int sm = 0;
          for (int j0 = q0; j0 < q1; j0 += kSlice)
            sm = imax(sm, slice_keys<Ld, Policy, V>(xb, j0 + lane * V, q1, pol, key, v));
          sm = group_max(sm, kGroupLanes);
          const auto prm = pol.params(s, sm);
          for (int j0 = q0; j0 < q1; j0 += kSlice) {
            const int j = j0 + lane * V;
            slice_keys<Ld, Policy, V>(xb, j, q1, pol, key, v);
            T out[V];
#pragma unroll
            for (int i = 0; i < V; ++i) out[i] = Ld::store(pol.apply(v[i], prm));
            if (j < q1) store_vec<T, V>(yb + j, out);
          }
        }
      } else {  // kInThread / kLanes: sub-blocks lie inside a slice
        for (int j0 = 0; j0 < n; j0 += kSlice) {
          const int j = j0 + lane * V;
          slice_keys<Ld, Policy, V>(xb, j, n, pol, key, v);
          int sm[V];
          lane_sub_max<V>(key, a, sm);
          T out[V];
#pragma unroll
          for (int i = 0; i < V; ++i) out[i] = Ld::store(pol.apply(v[i], pol.params(s, sm[i])));
          if (j < n) store_vec<T, V>(yb + j, out);
        }
      }
    } else {
      const auto prm = pol.params(s, 0);
      for (int j0 = 0; j0 < n; j0 += kSlice) {
        const int j = j0 + lane * V;
        slice_keys<Ld, Policy, V>(xb, j, n, pol, key, v);
        T out[V];
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = Ld::store(pol.apply(v[i], prm));
        if (j < n) store_vec<T, V>(yb + j, out);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// Any inner (used for inner > 1, and as the general fallback for inner == 1): one thread per
// (block, column), walking the block down its column; neighbouring threads take neighbouring
// columns. R > 0: block_size <= R, the block stays in registers; R == 0: re-read per pass.
// ------------------------------------------------------------------------------------------

// Sub-block maxima of a column block of n <= R keys in place: a running maximum that restarts
// at each sub-block's first row (bit j of `starts`), then spread back from each sub-block's
// last row. (`starts` is computed here, per block: hoisted out of the kernel's loop, its 2R
// row tests stayed live across it and took 35-70 more registers.)
template <int R>
__device__ __forceinline__ void column_sub_maxima(int (&key)[R], int n, int sub) {
  uint32_t starts = 0;
  for (int j = 0; j < R; j += sub) starts |= 1u << j;
#pragma unroll
  for (int j = 1; j < R; ++j)
    if (!((starts >> j) & 1u)) key[j] = imax(key[j], key[j - 1]);
#pragma unroll
  for (int j = R - 2; j >= 0; --j)
    if (!((starts >> (j + 1)) & 1u) && j + 1 < n) key[j] = key[j + 1];
}

// A column block of n <= R rows (x and y at its first element, rows `stride` apart) by its
// fast form's plain form, where the block is finite and takes it; returns false, having
// written nothing, where not. kFull: n == R (no row tests). Divergence between threads is
// harmless here (no shuffles).
template <class Ld, int R, bool kSub, bool kFull, class Form>
__device__ __forceinline__ bool column_plain_block(const typename Ld::T* __restrict__ x,
                                                   typename Ld::T* __restrict__ y, int64_t stride,
                                                   int n, int sub, const Form& form) {
  if constexpr (kFull) n = R;
  float v[R];
  BlockExtremes ext;
#pragma unroll
  for (int j = 0; j < R; ++j) {
    v[j] = j < n ? Ld::load_finite(x[j * stride]) : 0.0f;
    ext.add(v[j]);
  }
  const int s = ext.exponent();
  if (!ext.finite() || !form.plain_block(s, ext.least)) return false;
  if constexpr (kSub) {
    int key[R];
#pragma unroll
    for (int j = 0; j < R; ++j) key[j] = exponent_field(f2u(v[j]));
    column_sub_maxima<R>(key, n, sub);
#pragma unroll
    for (int j = 0; j < R; ++j)
      if (j < n) y[j * stride] = Ld::store_finite(form.apply_plain(v[j], form.params(s, key[j])));
  } else {
    const auto prm = form.params(s, 0);
#pragma unroll
    for (int j = 0; j < R; ++j)
      if (j < n) y[j * stride] = Ld::store_finite(form.apply_plain(v[j], prm));
  }
  return true;
}

template <class Ld, class Policy, int R>
__global__ void __launch_bounds__(kThreadsPerCta)
strided_kernel(QdqArgs a, Policy pol) {
  using T = typename Ld::T;
  const T* __restrict__ x = static_cast<const T*>(a.x);
  T* __restrict__ y = static_cast<T*>(a.y);
  const int64_t columns = a.num_blocks * a.inner;
  const int64_t stride = a.inner;

  for (int64_t t = global_thread(); t < columns; t += grid_threads()) {
    int64_t b, col;
    divmod(t, a.inner, b, col);
    int64_t start;
    int n;
    locate_block(a, b, start, n);
    const int64_t base = start * stride + col;

    if constexpr (R > 0) {
      if constexpr (HasPlainForm<Policy>::value) {
        constexpr bool kSub = Policy::kSubBlocks;
        if (n == R ? column_plain_block<Ld, R, kSub, true>(x + base, y + base, stride, n, a.sub, pol.form)
                   : column_plain_block<Ld, R, kSub, false>(x + base, y + base, stride, n, a.sub, pol.form))
          continue;
      }
      float v[R];
      int key[R];
      int s = 0;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        v[j] = j < n ? Ld::load(x[base + j * stride]) : 0.0f;
        key[j] = j < n ? pol.key(v[j]) : 0;
        s = imax(s, key[j]);
      }
      if constexpr (Policy::kSubBlocks) {
        column_sub_maxima<R>(key, n, a.sub);
#pragma unroll
        for (int j = 0; j < R; ++j)
          if (j < n) y[base + j * stride] = Ld::store(pol.apply(v[j], pol.params(s, key[j])));
      } else {
        const auto prm = pol.params(s, 0);
#pragma unroll
        for (int j = 0; j < R; ++j)
          if (j < n) y[base + j * stride] = Ld::store(pol.apply(v[j], prm));
      }
    } else {
      int s = 0;
      for (int j = 0; j < n; ++j) s = imax(s, pol.key(Ld::load(x[base + j * stride])));
      const int sub = Policy::kSubBlocks ? a.sub : n;
      for (int q0 = 0; q0 < n; q0 += sub) {
        const int q1 = imin(n, q0 + sub);
        int sm = 0;
        if constexpr (Policy::kSubBlocks)
          for (int j = q0; j < q1; ++j) sm = imax(sm, pol.key(Ld::load(x[base + j * stride])));
        const auto prm = pol.params(s, sm);
        for (int j = q0; j < q1; ++j)
          y[base + j * stride] = Ld::store(pol.apply(Ld::load(x[base + j * stride]), prm));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------
// Host side: choose a kernel for the geometry and launch it on the stream.
// ------------------------------------------------------------------------------------------

template <class L>
struct LoaderIO;
template <class IO, bool B>
struct LoaderIO<Loader<IO, B>> {
  using type = IO;
};

inline int pow2_ceil(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}
inline bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

inline unsigned grid_for(int64_t threads) {
  int64_t ctas = (threads + kThreadsPerCta - 1) / kThreadsPerCta;
  if (ctas < 1) ctas = 1;
  if (ctas > kMaxCtas) ctas = kMaxCtas;
  return static_cast<unsigned>(ctas);
}

// Picks the sub-block mode of a contiguous kernel with V elements per lane, or returns false
// when that layout cannot find the sub-block maxima (the caller then tries V = 1, then the
// per-thread walk).
inline bool choose_sub_mode(bool has_sub, int sub, int V, bool cached, int G, QdqArgs& a) {
  a.lanes_per_sub = 1;
  if (!has_sub) {
    a.sub_mode = SubMode::kNone;
    return true;
  }
  if (V % sub == 0) {
    a.sub_mode = SubMode::kInThread;
    return true;
  }
  if (sub % V == 0 && is_pow2(sub / V) && sub / V <= G) {
    a.sub_mode = SubMode::kLanes;
    a.lanes_per_sub = sub / V;
    return true;
  }
  if (!cached && sub % (kGroupLanes * V) == 0) {
    a.sub_mode = SubMode::kSlices;
    return true;
  }
  if (cached && V == 1) {
    a.sub_mode = SubMode::kSegmented;
    return true;
  }
  return false;
}

template <class Ld, class Policy, int V>
bool try_contiguous(QdqArgs a, const Policy& pol, cudaStream_t stream) {
  const int chunks = (a.block_size + V - 1) / V;
  const bool cached = chunks <= kGroupLanes;
  const int G = cached ? pow2_ceil(chunks) : kGroupLanes;
  int sub = a.block_size;
  if constexpr (Policy::kSubBlocks) sub = pol.sub_block_size;
  a.sub = sub;
  a.group = G;
  if (!choose_sub_mode(Policy::kSubBlocks, sub, V, cached, G, a)) return false;
  if (cached) {
    constexpr int U = V == 1 ? 8 : 16 / V;
    const int64_t per_unit = static_cast<int64_t>(kGroupLanes / G) * U;
    const int64_t units = (a.num_blocks + per_unit - 1) / per_unit;
    MXOPS_LAUNCH(grid_for(units * kGroupLanes), kThreadsPerCta, stream,
                 contiguous_cached_kernel<Ld, Policy, V>)(a, pol);
  } else {
    MXOPS_LAUNCH(grid_for(a.num_blocks * kGroupLanes), kThreadsPerCta, stream,
                 contiguous_long_kernel<Ld, Policy, V>)(a, pol);
  }
  return true;
}

template <class Ld, class Policy>
void launch_strided(QdqArgs a, const Policy& pol, cudaStream_t stream) {
  a.sub = a.block_size;
  if constexpr (Policy::kSubBlocks) a.sub = pol.sub_block_size;
  const unsigned grid = grid_for(a.num_blocks * a.inner);
  if (a.block_size <= 8)
    MXOPS_LAUNCH(grid, kThreadsPerCta, stream, strided_kernel<Ld, Policy, 8>)(a, pol);
  else if (a.block_size <= 16)
    MXOPS_LAUNCH(grid, kThreadsPerCta, stream, strided_kernel<Ld, Policy, 16>)(a, pol);
  else if (a.block_size <= kCachedStridedRows)
    MXOPS_LAUNCH(grid, kThreadsPerCta, stream,
                 strided_kernel<Ld, Policy, kCachedStridedRows>)(a, pol);
  else
    MXOPS_LAUNCH(grid, kThreadsPerCta, stream, strided_kernel<Ld, Policy, 0>)(a, pol);
}

// The functor dispatch_block_op calls; launches only for storage type IO (the other types
// are instantiated in their own translation units).
template <class IO>
struct QdqLauncher {
  QdqArgs args;
  cudaStream_t stream;

  // Each policy with its fast form where it has one (FastPolicy), then launch().
  template <class Ld, int Mode>
  void run(const ToBfpPolicy<Mode>& pol) const {
    if constexpr (Mode == kHalfEven) {
      if (pol.m <= 21)
        return launch<Ld>(FastPolicy<ToBfpPolicy<Mode>, DirectRoundForm<false>>{pol, {pol.m, {}}});
    }
    launch<Ld>(pol);
  }
  template <class Ld, int Mode>
  void run(const ToBfpPrimePolicy<Mode>& pol) const {
    if constexpr (Mode == kHalfEven) {
      launch<Ld>(FastPolicy<ToBfpPrimePolicy<Mode>, PrimeAdditionForm>{pol,
                                                                       {pol.m, pol.shift_bits}});
    } else {
      launch<Ld>(pol);
    }
  }
  template <class Ld, int Mode>
  void run(const MxPolicy<Mode>& pol) const {
    if (!pol.element.is_int)
      return launch<Ld>(FastPolicy<MxPolicy<Mode>, MxFloatDirectForm>{pol, {pol.element}});
    if constexpr (Mode == kHalfEven) {
      return launch<Ld>(FastPolicy<MxPolicy<Mode>, DirectRoundForm<true>>{pol, {0, pol.element}});
    }
    launch<Ld>(pol);
  }

  template <class Ld, class Policy>
  void launch(const Policy& pol) const {
    if constexpr (std::is_same_v<typename LoaderIO<Ld>::type, IO>) {
      using T = typename Ld::T;
      using DLd = DeviceLoader<Ld>;
      constexpr int kVec = 16 / static_cast<int>(sizeof(T));
      const QdqArgs& a = args;
      if (a.inner == 1) {
        const bool aligned = (reinterpret_cast<uintptr_t>(a.x) % 16 == 0) &&
                             (reinterpret_cast<uintptr_t>(a.y) % 16 == 0);
        if (aligned && a.block_size % kVec == 0 && a.length % kVec == 0 &&
            try_contiguous<DLd, Policy, kVec>(a, pol, stream))
          return;
        if (try_contiguous<DLd, Policy, 1>(a, pol, stream)) return;
      }
      launch_strided<DLd, Policy>(a, pol, stream);
    }
  }
};

// Launches the quantize-dequantize of a non-empty, non-identity tensor of storage type IO.
template <class IO>
void launch_qdq_for(const QdqParams& p, DType t, const void* x, void* y, const Geometry& g,
                    cudaStream_t stream) {
  QdqArgs a{};
  a.x = x;
  a.y = y;
  a.length = g.length;
  a.inner = g.inner;
  a.block_size = p.block_size;
  a.blocks_along = g.blocks_along(p.block_size);
  a.num_blocks = g.outer * a.blocks_along;
  a.uniform = g.length % p.block_size == 0;
  a.sub = p.block_size;
  a.group = 1;
  a.lanes_per_sub = 1;
  a.sub_mode = SubMode::kNone;
  dispatch_block_op(p, t, QdqLauncher<IO>{a, stream});
}

}  // namespace mxops::gpu
