// The CPU block walker: one source for the scalar path (qdq_cpu.cc, one element per lane)
// and the SIMD paths (qdq_simd.cc, compiled once per instruction set with a vector of W
// float lanes). The numeric work is numerics.h's through the lane-generic policies below;
// this file owns the walk over blocks, the split of a tensor into work units, loads and
// stores, and the choice of numerics.h's cheaper exact forms where every lane allows them.
//
// A lane set L provides: W (lanes), F / I / U (float, signed, unsigned lane types), all(mask),
// group_max(v, steps) (maximum over aligned groups of 2^steps lanes, in every lane of the
// group), blend_lane(a, b, i) (a with lane i from b) and broadcast_lane(v, i) (lane i of v in
// every lane) for 32-bit lane vectors, and load<IO, Exact>(const T*) / store<IO>(T*, F) for
// the storage types of
// numerics.h (Float32, Float16, BFloat16; Exact: bit-exact widening of float16 NaNs); vector
// lanes also stream<Float32>(float*, F): the same store bypassing the caches (a non-temporal
// store; the address aligned to the vector's size), and transpose_max(V* v) (lane i = the
// maximum over the lanes of v[i], for W vectors).
//
// Everything here has internal linkage (an anonymous namespace): the SIMD translation units
// are compiled with AVX2 / AVX-512 flags, and an inline function they emit must never be
// picked by the linker for baseline code.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "../common/numerics.h"
#include "../common/params.h"

#define MXOPS_VINL inline __attribute__((always_inline))
// A lambda's call operator forced inline: `[&](...) MXOPS_LAMBDA_INL { ... }`. in_form's element
// functions and rows_in_form's wrappers use it: left to GCC, the extra lambda layer changed
// which of the 16-bit walks' row loops it outlined (one AVX2 object 67 KB smaller); forced,
// the objects stay within 0.2 % of the dispatch written out at each call site.
#define MXOPS_LAMBDA_INL __attribute__((always_inline))

namespace mxops::cpu {

// The element type of a float32 input divided by the op's input_divisor as it is loaded
// (QdqParams): the walker loads and stores it as Float32 and divides what it loads
// (Walker::as_loaded), each quotient correctly rounded as a Div node's, so the walk sees the
// bits that node would have written. The lane sets never see this type. A tag with no code
// (named by the SIMD parts' run_walks overloads, so outside the anonymous namespace below).
// The divisor is a thread-local variable that the walk's caller sets on the thread that runs
// the walk (set_input_divisor): the walks' static loads have no walker to read it from.
struct Float32Divided {
  using T = float;
};
inline thread_local float input_divisor_of_thread = 1.0f;

// How the CPU kernels split a tensor into work units; shared by every lane width.
// Blocked axis innermost: a unit is a chunk of whole blocks of one row, about kChunk
// elements. Blocked axis outer: a unit is one block (down the axis) of a tile of
// kTileColumns neighbouring columns, so rows stay contiguous in memory.
constexpr int64_t kChunk = 16384;
constexpr int64_t kTileColumns = 128;
// Blocked axis outer, rows a multiple of row_walk_stride_bytes() apart, blocks of at least
// kRowWalkRows rows: a unit is one block down the axis across kRowColumns columns, walked a
// whole row at a time (Walker::row_walk; exceptions: takes_row_walk). float32 from rows 2 KiB
// apart, the 16-bit types from 4 KiB: at 2 KiB ([1024, 1024]) bfloat16 measured 17-25 %
// slower than with the column walk, float16 from 5 % faster to 22 % slower.
constexpr int64_t kRowWalkRows = 16;
constexpr int64_t kRowColumns = 1024;
constexpr int64_t row_walk_stride_bytes(int64_t element_bytes) { return element_bytes == 4 ? 2048 : 4096; }
// Software prefetch distance along a stream, in bytes.
constexpr int64_t kPrefetchBytes = 2048;
// Blocked axis outer, float32: outputs of at least this many bytes are written with
// non-temporal stores. Such an output does not stay in the caches anyway, and the walk over
// a block's rows side by side (block_size input rows, as many output rows, whose ordinary
// stores first read each line) is too many streams for the hardware prefetchers; streaming
// stores cut the memory traffic by a third.
// Smaller outputs are stored normally so that the next node finds them in the cache.
constexpr int64_t kStreamBytes = int64_t{16} << 20;
// Blocked axis outer: inputs of at least this many bytes have the next tile's rows prefetched
// while a tile is computed (prefetch_next_tile). A smaller tensor is in the L2 or L3 cache
// already, where the prefetches (two per line of a tile's rows, one or two per vector) only
// take load slots, and a tile's worth of lines (up to 32 KiB for 32 rows, input and output)
// evicts the rows that the second pass reads again. Measured on Zen 4 (AVX-512, 1 MiB L2,
// one thread; the kernel called directly, ratios to a negation loop in the same run), with
// against without these prefetches: the classifier's 16 activation shapes of 18-150 KiB
// 0.52 -> 0.56 (MXINT8), 0.44 -> 0.47 (MXFP8E4M3, MXFP4E2M1), 0.48 -> 0.51 (BFP16) on the
// AVX-512 path and as much on the AVX2 one; [256, 256], [512, 512] and [1024, 1024] (4 MiB)
// 0.25-0.48 -> 0.27-0.52 for the three. But [1536, 1536] (9 MiB) ran at 0.33-0.53 without
// them against 0.39-0.63 with them, so larger inputs keep them.
constexpr int64_t kPrefetchTileBytes = int64_t{8} << 20;

namespace {

struct UnitPlan {
  int64_t units = 0;       // work units of the tensor
  int64_t unit_elements;   // elements of a full unit
  int64_t chunk = 0;       // blocked axis innermost: elements per unit along a row
  int64_t tile_columns = kTileColumns;  // blocked axis outer: columns per unit
};

// The blocks of `p` along the walk's `length`: block_size elements, or block_size / lanes
// rows of lanes columns each in the NCHWc view (Geometry::lanes > 1).
MXOPS_VINL int64_t walk_block_size(const QdqParams& p, const Geometry& g) {
  return g.lanes > 1 ? p.block_size / g.lanes : p.block_size;
}

// The first four letters of the processor's CPUID vendor name as a little-endian word
// ("Auth" of AuthenticAMD, "Genu" of GenuineIntel), 0 where CPUID does not say.
inline unsigned cpu_vendor_word() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d)) return b;
#endif
  return 0;
}
inline bool amd_processor() {
  static const bool amd = cpu_vendor_word() == 0x68747541u;  // "Auth"
  return amd;
}
inline bool intel_processor() {
  static const bool intel = cpu_vendor_word() == 0x756e6547u;  // "Genu"
  return intel;
}

// The ways of the L1 data cache, as the processor reports them (CPUID leaf 4 on Intel,
// 0x8000001D on AMD: the first level-1 data or unified cache's ways), 8 where it does not say.
inline int64_t l1d_ways() {
  static const int64_t ways = [] {
    int64_t w = 8;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool amd = amd_processor();
    const unsigned leaf = amd ? 0x8000001Du : 4u;
    if (cpu_vendor_word() == 0 || __get_cpuid_max(amd ? 0x80000000u : 0u, nullptr) < leaf) return w;
    for (unsigned i = 0; i < 8; ++i) {
      __cpuid_count(leaf, i, a, b, c, d);
      const unsigned type = a & 0x1fu, level = (a >> 5) & 0x7u;
      if (type == 0) break;                        // no more caches
      if (level == 1 && (type == 1 || type == 3))  // level-1 data or unified
        return int64_t((b >> 22) & 0x3ffu) + 1;
    }
#endif
    return w;
  }();
  return ways;
}
// Whether the AVX-512 walker (`lanes` 16) takes the plain column walk (column_walk,
// ColumnWalk::kColumns: two column vectors at a time, a pair's block maxima down the rows, then
// its rows again beside the next pair's first pass) for blocks of `bs` rows of `element_bytes`
// `stride_bytes` apart, in place of the row walk (takes_row_walk): blocks of 32 float32 rows
// exactly 2 KiB apart ([N, 512] tensors blocked along axis 0) where the L1 has 12 ways or more,
// on Intel's processors.
// Such a block (64 KiB) does not stay in the L1 between the passes whichever way it is walked,
// and a column pair at a time ran faster than whole rows. Measured on a 2-core Xeon (family 6
// model 167, 48 KiB 12-way L1, 2 MiB L2), libraries with and without this in one process,
// one node through onnxruntime, xNeg, medians of 1000 interleaved runs, one thread, two runs:
// [512, 512] MXINT8 0.75-0.77 -> 0.81-0.82, MXFP8E4M3 0.78-0.79 -> 0.83-0.84, MXFP4E2M1 0.79 ->
// 0.85-0.86; [256, 512] 0.69-0.78 -> 0.83-0.87; [1024, 512] 0.74-0.81 -> 0.82-0.91; [2048, 512]
// 0.74-0.80 -> 0.82-0.88. ort-mx-bench at 256 Ki elements ([512, 512]), two threads: MXINT8
// 0.70-0.75 -> 0.78-0.82, the MXFP formats 0.75-0.76 -> 0.82-0.89. Not at other strides (1, 3,
// 6 and 10 KiB measured mixed there, the MXFP formats up to 0.13 slower at 10 KiB) nor for the
// AVX2 walker (the MXFP formats 0.03-0.07 slower at [512, 512] and [1024, 512]); policies
// without the plain form keep the kept columns (column_walk). Intel's processors only: on a
// 2-core AMD Zen 5 (family 1Ah model 2, 48 KiB 12-way L1, 1 MiB L2) the row walk was faster
// (the walker called directly, one thread, x a negation loop in the same run, three runs,
// these columns -> the row walk: [512, 512] MXINT8 0.41 -> 0.52-0.54, MXFP8E4M3 0.42-0.47 ->
// 0.51-0.53, MXFP4E2M1 0.41-0.55 -> 0.52-0.59; [256, 512], [1024, 512], [2048, 512] 0.37-0.49
// -> 0.47-0.61), as `ort-mx-bench --walk-bound` has it there (rows 0.62, columns 0.42).
MXOPS_VINL bool columns_at_2k(int64_t lanes, int64_t bs, int64_t stride_bytes, int64_t element_bytes) {
  return lanes == 16 && element_bytes == 4 && bs == 32 && stride_bytes == 2048 && l1d_ways() >= 12 &&
         intel_processor();
}

// Whether the AVX-512 walker takes the kept tile (column_walk, ColumnWalk::kKeptTile: the first
// pass copies a tile's rows, 512 bytes of each, into a local buffer, which the second pass
// reads) in place of the row walk (takes_row_walk) for blocks of 16 or 32 float32 rows a
// multiple of 4 KiB apart in inputs below kPrefetchTileBytes, on AMD's processors with an
// 8-way L1 (Zen 4); MX with integer elements (MXINT8) only: the caller.
// A block of 32 such rows (128 KiB) does not stay in the L1 between the row walk's passes, so
// its rows come into the L1 twice, and the output's lines a third time (their reads for
// ownership), where a negation's loop brings two lines per line of output; the kept tile
// brings each row once. On a 2-core Zen 4 (family 25 model 17): the walks' structure alone
// (ort-mx-bench --walk-bound, blocks of 32, the output in the input's sets) xnegation, rows ->
// tiles_kept: [512, 1024] 0.47 -> 0.51, [1024, 1024] 0.47 -> 0.50, [256, 2048] 0.52 -> 0.54
// (a standalone loop with the output elsewhere: 0.59-0.63 -> 0.74-0.79); MXINT8 through onnxruntime at
// [1024, 1024] (ort-mx-bench, two threads, xNeg, this library against the one before in the
// same rounds, six runs, the two libraries' roles swapped in two): 0.58-0.63 -> 0.64-0.68,
// one run 0.67 -> 0.64; the walker called directly (one thread, [1024, 1024], [512, 1024],
// [256, 2048], [64, 1024]): 0.78-1.01x the time. Not the MXFP formats (the same measurements:
// within +-0.02xNeg through onnxruntime, 0.90-1.04x the time directly), nor MX9 / MX6 / MX4
// (0.96-1.05x at [1024, 1024]), nor BFP16's 8 rows (kept tile against kept columns 1.02-1.22x
// the time), nor at 8 MiB and more ([2048, 1024]: 1.04-1.10x the time; there the tile walk
// prefetches the next tile), nor at 2 KiB strides ([512, 512]: kept tile 0.58-0.60xNeg against
// the row walk's 0.63-0.67).
MXOPS_VINL bool kept_tiles_at_4k(int64_t lanes, int64_t stride_bytes, int64_t input_bytes, int64_t element_bytes) {
  return lanes == 16 && element_bytes == 4 && stride_bytes % 4096 == 0 && input_bytes < kPrefetchTileBytes &&
         l1d_ways() == 8 && amd_processor();
}

// Whether a block of `bs` rows of `element_bytes` each, `g.inner` apart, takes the row walk
// (plan_units) in the walker of `lanes` lanes. Not where columns_at_2k; not to_bfp_prime's
// sub-blocks (MX9, MX6, MX4) in float32 at strides of 2 KiB that are not a multiple of 4 KiB
// where the L1 has 12 ways or more (48 KiB on Intel's recent cores): they take the column walk
// with kept rows (column_walk). Measured on the 2-core Xeon
// (12 ways; the walker called directly, one thread, xNeg, MX9 / MX6 / MX4, two runs each,
// row walk -> kept columns): AVX-512 [512, 512] 0.63-0.79 -> 0.76-0.80, [1024, 512] 0.75-0.83
// -> 0.89-0.90, [2048, 512] 0.74-0.83 -> 0.89-0.91, [256, 512] 0.52-0.59 -> 0.57-0.63; AVX2
// [512, 512] 0.43-0.56 -> 0.58-0.60, [1024, 512] and [2048, 512] 0.67-0.70 -> 0.75-0.78. On
// Zen 3 (8 ways) the row walk had measured faster there (fc643dd), and the plain form's
// policies (MXINT8, the MXFP formats) keep it on the Xeon too, but for columns_at_2k (kept
// columns: [512, 512] MXINT8 0.64-0.67 -> 0.52-0.58 on family 6 model 207). On a Zen 5 (12
// ways) the two measured within their runs' spread for MX9 / MX6 / MX4 at [256 ... 2048,
// 512] (the walker called directly, one thread, three runs: kept columns 0.53-0.80, row walk
// 0.57-0.75), so the exclusion stays there too.
MXOPS_VINL bool takes_row_walk(const QdqParams& q, const Geometry& g, int64_t bs, int64_t element_bytes,
                               int64_t lanes) {
  const int64_t stride = g.inner * element_bytes;
  if (g.lanes != 1 || stride % row_walk_stride_bytes(element_bytes) != 0 || bs < kRowWalkRows) return false;
  if (columns_at_2k(lanes, bs, stride, element_bytes)) return false;
  if (q.method == Method::kMx && q.element.is_int &&
      kept_tiles_at_4k(lanes, stride, g.num_elements * element_bytes, element_bytes))
    return false;
  return !(q.method == Method::kToBfpPrime && element_bytes == 4 && stride % 4096 != 0 && l1d_ways() >= 12);
}

// The work units of the walker of `lanes` lanes (1, 8 or 16) over g.
MXOPS_VINL UnitPlan plan_units(const QdqParams& q, const Geometry& g, int64_t element_bytes, int64_t lanes) {
  UnitPlan p;
  const int64_t bs = walk_block_size(q, g);
  if (g.inner == 1) {
    p.chunk = bs >= kChunk ? bs : kChunk / bs * bs;
    const int64_t per_row = (g.length + p.chunk - 1) / p.chunk;
    p.units = g.outer * per_row;
    p.unit_elements = p.chunk < g.length ? p.chunk : g.length;
  } else {
    // The NCHWc view: a block is only block_size / lanes rows, so a unit of kTileColumns
    // columns would hold a few hundred elements; a unit of whole kTileColumns-column tiles
    // side by side holds about kChunk (lanes_tile walks them in one pass).
    if (g.lanes > 1 && bs < kChunk / kTileColumns) p.tile_columns = kChunk / bs / kTileColumns * kTileColumns;
    // A blocked axis shorter than a block (an image's 3 channels in blocks of 16 or 32) has
    // blocks of its length in rows, and the row walk is for blocks of kRowWalkRows rows or
    // more: with 3 rows its parameters serve 3 rows each, and its passes read the rows 4 KiB
    // at a time, where the column walk reads 128 columns of the next rows during the last.
    // Measured on a 2-core Xeon (family 6 model 167, one thread), [1, 3, 224, 224] (rows
    // 196 KiB apart): the orientation classifier's input node (onnxruntime's profile, median
    // of 300 runs, the input fed from numpy as in a model) MXINT8 89 -> 50 us, MXFP8E4M3 76 ->
    // 49, MX9 74 -> 58, against a Neg there of 46; the walker alone on the inputs in cache
    // ([1, 3 or 1, 224 / 48, 224 / 192 / 320]) MXINT8 1.60x, MXFP8E4M3 1.42x, MX9 1.15x faster.
    const int64_t rows = bs < g.length ? bs : g.length;
    if (takes_row_walk(q, g, rows, element_bytes, lanes)) p.tile_columns = kRowColumns;
    const int64_t tw = p.tile_columns;
    const int64_t tiles = (g.inner + tw - 1) / tw;
    const int64_t blocks = (g.length + bs - 1) / bs;
    p.units = g.outer * blocks * tiles;
    p.unit_elements = rows * (g.inner < tw ? g.inner : tw);
  }
  return p;
}


MXOPS_VINL int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

MXOPS_VINL bool power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
constexpr int log2_exact(int64_t v) {
  int k = 0;
  while ((int64_t{1} << k) < v) ++k;
  return k;
}

// Sets the divisor of Float32Divided's loads for the walks this thread runs next.
MXOPS_VINL void set_input_divisor(const QdqParams& p) {
  input_divisor_of_thread = static_cast<float>(p.input_divisor);
}

// One element per lane.
struct ScalarLanes {
  static constexpr int W = 1;
  using F = float;
  using I = int32_t;
  using U = uint32_t;
  static MXOPS_VINL bool all(bool m) { return m; }
  template <class V>
  static MXOPS_VINL V group_max(V v, int /*steps*/) { return v; }
  template <class V>
  static MXOPS_VINL V blend_lane(V a, V /*b*/, int /*i*/) { return a; }
  template <class V>
  static MXOPS_VINL V broadcast_lane(V v, int /*i*/) { return v; }
  template <class IO, bool Exact = false>
  static MXOPS_VINL F load(const typename IO::T* p) { return IO::load(*p); }
  template <class IO>
  static MXOPS_VINL void store(typename IO::T* p, F v) { *p = IO::store(v); }
};

// ------------------------------------------------------------------------------------------
// Policies over lanes: key / params / apply of block_ops.h, choosing the cheaper exact forms
// of numerics.h when every lane allows them (the results are the same bits). A block's
// maximum runs over key() (an unsigned lane, numerics.h's block-maximum keys) and
// exponent() decodes it to the exponent params() takes.
// ------------------------------------------------------------------------------------------

// Every policy also has a fast form: fast(s) says whether every lane of blocks with maxima s
// allows it, fast_params(s, sub) / apply_fast(x, p) compute it; the walker decides once per
// tile or group of blocks, so the loops over elements carry no branch.

// The shared exponent of blocks known finite from their greatest magnitude `a` (the first
// passes that read magnitudes): a's exponent, but 127 (that of 1.0) for a block of zeros
// (a == 0: every element +0 or -0). With the exponent 0 of such a block no policy's fast form
// holds, so the block, and every block decided with it (a span of W blocks, a tile's column
// vectors, a group of W pixels), took the general form: with 1/8 of the blocks all zero (ReLU
// outputs; the padding channels of an NCHWc tensor) the walks ran 1.5-3x slower (AVX2, Zen 3,
// [64, 1024] float32). The op's result on a zero element is the same for every shared
// exponent (the sign kept, or +0: numerics.h), and 127 passes every fast_mask of these
// policies, so the bits are the same.
template <class I>
MXOPS_VINL I exponent_of_magnitude_or_one(I a) {
  return select(a == 0, splat<I>(127), finite_exponent_of_magnitude(a));
}

// Small: m <= 21, the one-addition round of round_half (kHalfEven); its fast form rounds x in
// place (bfp_direct_params), the others' divide with NormalOnly scales.
template <class L, int Mode, bool Small>
struct BfpLanes {
  using F = typename L::F;
  using I = typename L::I;
  using K = typename L::U;
  using Params = BfpScale<F>;
  static constexpr bool kDirect = Small && Mode == kHalfEven;
  using Fast = std::conditional_t<kDirect, DirectRound<F>, BfpScale<F>>;
  static constexpr bool kSubBlocks = false;
  int m;
  MXOPS_VINL K key(F x) const { return finite_exponent_key(f2u(x)); }
  MXOPS_VINL I exponent(K k) const { return finite_exponent_of_key(k); }
  MXOPS_VINL Params params(I s, I) const { return bfp_scale(s, m); }
  MXOPS_VINL F apply(F x, const Params& p) const { return to_bfp_element<Mode, Small>(x, p); }
  MXOPS_VINL auto fast_mask(I s) const {
    if constexpr (kDirect) return bfp_direct_block(s, m);
    else return pow2_pair_normal(bfp_scale_exponent(s, m));
  }
  MXOPS_VINL bool fast(I s) const { return __builtin_expect(L::all(fast_mask(s)), 1); }
  MXOPS_VINL Fast fast_params(I s, I) const {
    if constexpr (kDirect) return bfp_direct_params(s, m);
    else return bfp_scale<true>(s, m);
  }
  MXOPS_VINL F apply_fast(F x, const Fast& p) const {
    if constexpr (kDirect) return direct_round_element(x, p);
    else return to_bfp_element<Mode, Small>(x, p);
  }
  // The plain form (the clamp alone, numerics.h) of a block that allows it: kPlain 0 none,
  // 1 decided on the block's least key, 2 on that and its least bit pattern (as signed);
  // plain_any() for any parameters of the fast form.
  static constexpr int kPlain = kDirect ? 2 : 0;
  MXOPS_VINL bool plain_any(K min_key, I min_bits) const {
    return L::all(keys_all_finite(min_key) & no_negative_tiny(min_bits));
  }
  MXOPS_VINL F apply_plain(F x, const Fast& p) const { return direct_round_element_plain(x, p); }
  // Blocks known finite from their greatest magnitude `a` (the outer walks' first pass):
  // exponent and plain_finite() from it, and unclamped(): the plain form without its clamp.
  MXOPS_VINL I exponent_of_magnitude(I a) const { return exponent_of_magnitude_or_one(a); }
  MXOPS_VINL bool plain_finite(const Fast& p, I min_bits) const {
    return L::all(direct_round_plain_block(min_bits, p));
  }
  MXOPS_VINL bool unclamped(const Fast& p, I a) const { return L::all(direct_round_unclamped(a, p)); }
  MXOPS_VINL F apply_unclamped(F x, const Fast& p) const { return direct_round_element_unclamped(x, p); }
  // kPlain > 1, blocks known finite that the plain form refuses (a -0 or a negative tiny x):
  // the plain form, without or with its clamp, and the sign on those zeros.
  MXOPS_VINL F apply_finite_unclamped(F x, const Fast& p) const { return direct_round_element_finite_unclamped(x, p); }
  MXOPS_VINL F apply_finite(F x, const Fast& p) const { return direct_round_element_finite(x, p); }
  // kTinyZeroSpans: the plain spans (blocks_plain) take the finite forms only for blocks of
  // kd <= 0 (tiny_is_zero), where -0 is the one negative tiny x, and refuse the others to the
  // walks that compute each block's ntiny. A BFP block's kd exceeds 0 only for maxima of 2^m
  // or more (256 for BFP16), rare in activations. Not MxLanes': the int8 element's kd exceeds
  // 0 from maxima of 2.
  static constexpr bool kTinyZeroSpans = kDirect;
  MXOPS_VINL bool tiny_is_zero(I s) const { return L::all(bfp_direct_tiny_is_zero(s, m)); }
  MXOPS_VINL F apply_finite_zero_unclamped(F x, const Fast& p) const {
    return direct_round_element_finite_unclamped(x, p, splat<I>(kNtinyOfKdAtMostZero));
  }
  MXOPS_VINL F apply_finite_zero(F x, const Fast& p) const {
    return direct_round_element_finite(x, p, splat<I>(kNtinyOfKdAtMostZero));
  }
  MXOPS_VINL BfpLanes<ScalarLanes, Mode, Small> scalar() const { return {m}; }
};

template <class L, int Mode>
struct PrimeLanes {
  using F = typename L::F;
  using I = typename L::I;
  using K = typename L::U;
  struct Params {
    BfpPrimeParams<F> core;
    bool by_addition;  // kHalfEven and bfp_prime_addition_exact in every lane
  };
  static constexpr bool kSubBlocks = true;
  static constexpr bool kFastMode = Mode == kHalfEven;  // (fast_mask alone does not say it)
  int m, sub_block_size, shift_bits;
  // The exponent field in place (e << 23) is both the key and what exponent() gives: the fast
  // form's sub-block parameters come from it without shifting (bfp_prime_addition_params_in_place).
  MXOPS_VINL K key(F x) const { return f2u(x) & 0x7f800000u; }
  MXOPS_VINL I exponent(K k) const { return as_int(k); }
  static MXOPS_VINL I field(I e) { return e >> 23; }
  using Fast = BfpPrimeParams<F>;
  MXOPS_VINL Params params(I s, I sub) const {
    Params p;
    p.core = bfp_prime_params(field(s), field(sub), shift_bits, m);
    p.by_addition = Mode == kHalfEven && L::all(bfp_prime_addition_exact(p.core));
    return p;
  }
  MXOPS_VINL F apply(F x, const Params& p) const {
    if (p.by_addition) return bfp_prime_element_by_addition(x, p.core);
    return bfp_prime_element<Mode>(x, p.core, m);
  }
  // Every sub-block by one addition, its add and sat straight from its exponent.
  MXOPS_VINL auto fast_mask(I s) const { return bfp_prime_addition_block(field(s), m); }
  MXOPS_VINL bool fast(I s) const { return kFastMode && L::all(fast_mask(s)); }
  MXOPS_VINL Fast fast_params(I s, I sub) const {
    return bfp_prime_addition_params_in_place(s, sub, shift_bits, m);
  }
  // fast_params(s, sub) == fast_params_floor(sub_floor(s), sub): the block's part alone.
  MXOPS_VINL I sub_floor(I s) const { return bfp_prime_floor_in_place(s, shift_bits); }
  MXOPS_VINL Fast fast_params_floor(I floor, I sub) const { return bfp_prime_addition_params_floor(floor, sub, m); }
  MXOPS_VINL F apply_fast(F x, const Fast& p) const { return bfp_prime_element_by_addition(x, p); }
  // Within the fast form, blocks whose subnormals round to 0 without the flush.
  MXOPS_VINL auto normal_mask(I s) const { return bfp_prime_addition_normal_block(field(s), m, shift_bits); }
  MXOPS_VINL bool normal(I s) const { return L::all(normal_mask(s)); }
  // That form of x in a sub-block with maximum sub (in place) of a block whose sub_floor is
  // floor, or whose maximum is s: where the lanes clamp a signed magnitude and fuse a
  // multiply-add in one instruction each (AVX-512), the signed form, two operations a vector
  // fewer (bfp_prime_element_signed_normal); else the unsigned one. Sub-blocks of several
  // vectors call it once per vector: the parameters' arithmetic common to them is computed once.
  MXOPS_VINL F apply_normal_floor(F x, I floor, I sub) const {
    if constexpr (LaneTypes<F>::kOneInstructionMagnitudes) return bfp_prime_element_signed_normal(x, imax(sub, floor), m);
    else return bfp_prime_element_by_addition_normal(x, fast_params_floor(floor, sub));
  }
  MXOPS_VINL F apply_normal(F x, I s, I sub) const { return apply_normal_floor(x, sub_floor(s), sub); }
  static constexpr int kPlain = 0;
  MXOPS_VINL PrimeLanes<ScalarLanes, Mode> scalar() const { return {m, sub_block_size, shift_bits}; }
};

// Fast: floating elements by mx_float_element_direct_signed, integer ones (kHalfEven) rounded in
// place (mx_int_direct_params), else with NormalOnly scales.
template <class L, int Mode, int Kind>
struct MxLanes {
  using F = typename L::F;
  using I = typename L::I;
  using K = typename L::U;
  using Params = MxScale<F>;
  static constexpr bool kDirect = Kind == kMxFloatElement;
  static constexpr bool kIntDirect = Kind == kMxIntElement && Mode == kHalfEven;
  using Fast = std::conditional_t<kDirect, MxDirectSigned<F>,
                                  std::conditional_t<kIntDirect, MxIntDirect<I>, MxScale<F>>>;
  static constexpr bool kSubBlocks = false;
  MxElement element;
  MXOPS_VINL K key(F x) const { return finite_exponent_key(f2u(x)); }
  MXOPS_VINL I exponent(K k) const { return finite_exponent_of_key(k); }
  MXOPS_VINL Params params(I s, I) const { return mx_scale(s, element.emax); }
  MXOPS_VINL F apply(F x, const Params& p) const { return mx_element<Mode, Kind>(x, p, element); }
  MXOPS_VINL auto fast_mask(I s) const {
    if constexpr (kDirect) return mx_direct_block(s, element);
    else if constexpr (kIntDirect) return mx_int_direct_block(s, element);
    else return pow2_pair_normal(mx_scale_exponent(s, element.emax));
  }
  MXOPS_VINL bool fast(I s) const { return __builtin_expect(L::all(fast_mask(s)), 1); }
  MXOPS_VINL Fast fast_params(I s, I) const {
    if constexpr (kDirect) return mx_direct_signed_params(s, element);
    else if constexpr (kIntDirect) return mx_int_direct_params(s, element);
    else return mx_scale<true>(s, element.emax);
  }
  MXOPS_VINL F apply_fast(F x, const Fast& p) const {
    if constexpr (kDirect) return mx_float_element_direct_signed(x, p, element);
    else if constexpr (kIntDirect) return direct_round_element(x, p);
    else return mx_element<Mode, Kind>(x, p, element);
  }
  static constexpr int kPlain = kDirect ? 1 : kIntDirect ? 2 : 0;
  MXOPS_VINL bool plain_any(K min_key, I min_bits) const {
    if constexpr (kIntDirect) return L::all(keys_all_finite(min_key) & no_negative_tiny(min_bits));
    else return L::all(keys_all_finite(min_key));
  }
  MXOPS_VINL F apply_plain(F x, const Fast& p) const {
    if constexpr (kIntDirect) return direct_round_element_plain(x, p);
    else return mx_float_element_direct_signed_finite(x, p, element);
  }
  MXOPS_VINL I exponent_of_magnitude(I a) const { return exponent_of_magnitude_or_one(a); }
  MXOPS_VINL bool plain_finite(const Fast& p, I min_bits) const {
    if constexpr (kIntDirect) return L::all(direct_round_plain_block(min_bits, p));
    else return true;
  }
  MXOPS_VINL bool unclamped(const Fast& p, I a) const {
    if constexpr (kIntDirect) return L::all(direct_round_unclamped(a, p));
    else return L::all(mx_float_direct_signed_unclamped(a, p, element));
  }
  MXOPS_VINL F apply_unclamped(F x, const Fast& p) const {
    if constexpr (kIntDirect) return direct_round_element_unclamped(x, p);
    else return mx_float_element_direct_signed_unclamped(x, p, element);
  }
  // As BfpLanes' (kIntDirect only).
  MXOPS_VINL F apply_finite_unclamped(F x, const Fast& p) const { return direct_round_element_finite_unclamped(x, p); }
  MXOPS_VINL F apply_finite(F x, const Fast& p) const { return direct_round_element_finite(x, p); }
  static constexpr bool kTinyZeroSpans = false;  // (see BfpLanes')
  MXOPS_VINL MxLanes<ScalarLanes, Mode, Kind> scalar() const { return {element}; }
};

// ------------------------------------------------------------------------------------------
// The walker
// ------------------------------------------------------------------------------------------

// Stream: every vector store of the walk is non-temporal (float32, blocked axis outer; see
// kStreamBytes); the caller checks the alignment (stream_supported) and fences afterwards.
template <class L, class IO, bool Bf16First, class Pol, bool Stream = false>
struct Walker {
  using T = typename IO::T;
  using F = typename L::F;
  using I = typename L::I;
  using K = typename Pol::K;
  using Params = typename Pol::Params;
  static constexpr int W = L::W;
  // blocks_plain's and spans' kNv for blocks of half a vector (AVX-512, blocks of 8).
  static constexpr int kHalfVector = 0;
  // Whether this walker takes blocks of half a vector W at a time (blocks_plain<kHalfVector>):
  // 16 lanes and a policy with the plain form (qdq_cpu.cc's avx512_takes_half_vector_blocks
  // sends exactly those ops to the AVX-512 walker).
  static constexpr bool kHalfVectorBlocks = W == 16 && Pol::kPlain > 0 && !Pol::kSubBlocks;
  static constexpr int64_t kTileVectors = kTileColumns / W;

  // The element functions of the fast form's parameters: the plain form without its clamp,
  // the plain form, apply_fast, or (kPlain > 1) the first two with the sign fix-up of a -0 or
  // negative tiny x (apply_finite_unclamped, apply_finite).
  enum class FastForm : uint8_t { kUnclamped, kPlain, kFast, kFiniteUnclamped, kFinite };

  const T* x;
  T* y;
  int64_t length, inner, bs, sub;
  Pol pol;
  // Geometry::lanes: > 1 for the NCHWc view, where bs counts rows of `lanes` columns (a
  // block is bs rows x lanes aligned columns) and sub still counts channels.
  int64_t lanes = 1;
  // The outer walks prefetch the next tile (the input is at least kPrefetchTileBytes).
  bool prefetch_tiles = false;
  // The innermost walks prefetch their streams kPrefetchBytes ahead (prefetch): on the AVX2
  // development machine the hardware prefetchers alone left the loads waiting; on AMD Zen 4
  // the same prefetches made a 16 Mi-element walk take 5-44 % longer, and in cache they do
  // not help (prefetch_rows_for_call, qdq_cpu.cc).
  bool prefetch_rows = true;
  // Inputs of kStreamBytes or more: blocks_plain takes the least bit pattern of blocks of
  // several vectors in its second pass where it runs out of place (kMinAfter), and so does
  // the tile walk of full tiles (whole_block_rows<true>).
  bool min_after = false;

  // Float32Divided: loaded and stored as Float32 (the lane sets' types), divided by as_loaded.
  static constexpr bool kDivided = std::is_same_v<IO, Float32Divided>;
  using Stored = std::conditional_t<kDivided, Float32, IO>;

  // bfloat16 rounding first can turn a NaN into Inf, so float16 NaNs are widened exactly there.
  static MXOPS_VINL F load(const T* p) {
    if constexpr (kDivided) {
      return as_loaded(load_raw(p));
    } else {
      const F f = L::template load<IO, Bf16First && std::is_same_v<IO, Float16>>(p);
      if constexpr (Bf16First) return bf16_round_bits(f);
      return f;
    }
  }
  static MXOPS_VINL void store(T* p, F v) {
    if constexpr (Stream) L::template stream<Stored>(p, v);
    else L::template store<Stored>(p, v);
  }

  // Float32Divided: the walks that read a block twice (its maximum, then its results) and
  // whose block size is fixed at compile time keep the first pass's quotients in a local
  // array, and the second pass reads them there, so each element is divided once (a vector
  // division costs several times a load from the L1). For the other element types the array
  // has one unused element and the second pass loads again, as before. Quotients<N>: such an
  // array for N vectors; keep_quotient / quotient_or_load: the first pass's store of vector
  // i, the second pass's read of it (p: its address in the input). The column walks keep
  // the rows (column_walk: kKeptColumns), which are the quotients too.
  static constexpr bool kKeepQuotients = kDivided;
  template <int64_t N>
  using Quotients = F[kKeepQuotients && N > 0 ? N : 1];
  static MXOPS_VINL void keep_quotient([[maybe_unused]] F* kept, [[maybe_unused]] int64_t i,
                                       [[maybe_unused]] F v) {
    if constexpr (kKeepQuotients) kept[i] = v;
  }
  static MXOPS_VINL F quotient_or_load([[maybe_unused]] const F* kept, [[maybe_unused]] int64_t i,
                                       const T* p) {
    if constexpr (kKeepQuotients)
      if (kept != nullptr) return kept[i];
    return load(p);
  }

  // The first pass of the NCHWc pixel walk of the plain form's policies (pixel_group_finite),
  // which takes only order statistics of a block (its greatest magnitude, its least bit
  // pattern), reads Float32Divided inputs undivided (load_raw) and divides the statistics
  // (as_loaded, which load() applies to every element it reads): one division per vector of
  // W blocks' statistics instead of one per element in that pass, and the second pass
  // divides each element as it loads it, where the division overlaps the rest of the
  // arithmetic. Exact because what load() makes of an element, v -> v / d correctly rounded
  // (d >= 1), then bfloat16 rounding where convert_to_bfloat_before_bfp, is monotonic and
  // odd (f(-v) = -f(v)), so it maps a block's greatest magnitude to the greatest magnitude
  // of its results, and its least bit pattern as signed (the negative element nearest zero,
  // else the least positive one, -0 included) to theirs; it keeps Inf and NaN, and where it
  // turns a finite element into Inf (bfloat16 rounding) it does so to the greatest magnitude
  // too. For the other element types load_raw is load() and as_loaded the identity.
  static MXOPS_VINL F load_raw(const T* p) {
    if constexpr (kDivided) return L::template load<Float32>(p);
    else return load(p);
  }
  static MXOPS_VINL F as_loaded(F v) {
    if constexpr (kDivided) {
      // (vdivps / divss: correctly rounded, as a Div node's)
      const F f = v / input_divisor_of_thread;
      if constexpr (Bf16First) return bf16_round_bits(f);
      return f;
    } else {
      return v;
    }
  }
  // as_loaded of the value whose bit pattern (as signed) is b.
  static MXOPS_VINL I as_loaded_bits(I b) {
    if constexpr (kDivided) return as_int(f2u(as_loaded(u2f(as_uint(b)))));
    else return b;
  }

  MXOPS_VINL void prefetch(const T* p, T* q) const {
    if (!prefetch_rows) return;
    __builtin_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, 0, 3);
    __builtin_prefetch(reinterpret_cast<char*>(q) + kPrefetchBytes, 1, 3);
  }

  // The walker of the same op one element per lane, for the tails of a vector walk.
  auto scalar() const {
    return Walker<ScalarLanes, IO, Bf16First, decltype(pol.scalar())>{
        x, y, length, inner, bs, sub, pol.scalar(), lanes, prefetch_tiles, prefetch_rows,
        min_after};
  }

  // One block of `n` elements `stride` apart from `base`, a lane per element (W == 1).
  void block(int64_t base, int64_t n, int64_t stride) const {
    K k = 0;
    for (int64_t j = 0; j < n; ++j) k = imax(k, pol.key(load(x + base + j * stride)));
    const I s = pol.exponent(k);
    const int64_t step = Pol::kSubBlocks ? sub : n;
    for (int64_t j0 = 0; j0 < n; j0 += step) {
      const int64_t j1 = min64(n, j0 + step);
      K km = 0;
      if constexpr (Pol::kSubBlocks)
        for (int64_t j = j0; j < j1; ++j) km = imax(km, pol.key(load(x + base + j * stride)));
      const Params prm = pol.params(s, pol.exponent(km));
      for (int64_t j = j0; j < j1; ++j) store(y + base + j * stride, pol.apply(load(x + base + j * stride), prm));
    }
  }

  // W blocks of one vector each (bs == W, no sub-blocks) from p: their maxima in one vector
  // (transpose_max), their parameters once, each block's broadcast to its vector. (The plain
  // form's W blocks come here only where blocks_plain refused them: then the plain form does
  // not apply to all W either.)
  MXOPS_VINL void blocks_of_vectors(const Pol& pol, const T* p, T* q) const {
    K keys[W];
    Quotients<W> kept;
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i) {
      if ((i * W * sizeof(T)) % 64 == 0) prefetch(p + i * W, q + i * W);  // once per cache line
      const F xv = load(p + i * W);
      keep_quotient(kept, i, xv);
      keys[i] = pol.key(xv);
    }
    const I s = pol.exponent(L::transpose_max(keys));
    __asm__ volatile("" ::: "memory");  // (as in column_blocks)
    auto each = [&](const auto& prm, auto apply) {
#pragma GCC unroll 16
      for (int i = 0; i < W; ++i)
        store(q + i * W, apply(quotient_or_load(kept, i, p + i * W), broadcast_lane(prm, i)));
    };
    if (pol.fast(s))
      each(pol.fast_params(s, s), [&](F v, const auto& pi) { return pol.apply_fast(v, pi); });
    else
      each(pol.params(s, s), [&](F v, const auto& pi) { return pol.apply(v, pi); });
  }

  // What blocks_plain's second pass takes from its first (plain_first): the W blocks'
  // parameters, their form (kMinAfter: the form without the sign fix-up, which the second pass
  // adds where its minimum shows a -0 or a negative tiny x) and whether the clamp applies.
  template <class Prm>
  struct PlainSpan {
    Prm prm;
    FastForm form;
    bool unclamped;
  };
  template <int kNv>
  using PlainGroups = std::integral_constant<int, kNv == kHalfVector ? W / 2 : W>;
  template <int kNv>
  using PlainPer = std::integral_constant<int, kNv == kHalfVector ? 1 : kNv>;  // vectors a group
  template <int kNv>
  using PlainQuotients = Quotients<PlainGroups<kNv>::value * PlainPer<kNv>::value>;
  using PlainPrm = decltype(std::declval<const Pol&>().fast_params(I{}, I{}));
  using PlainSpanOf = PlainSpan<PlainPrm>;
  // The elements of a span of W blocks of kNv vectors (kHalfVector: of half a vector).
  static constexpr int64_t span_elements(int kNv) { return kNv == kHalfVector ? W / 2 * W : kNv * W * W; }
  // Whether blocks of several vectors from p to q take kMinAfter (see blocks_plain).
  MXOPS_VINL bool takes_min_after(const T* p, const T* q) const {
    return Pol::kPlain > 1 && min_after && p != q;
  }

  // W blocks of kNv vectors each from p (bs == kNv * W) for the plain form's policies
  // (Pol::kPlain > 0), as column_blocks takes a column: their greatest magnitudes first (3
  // operations per vector where the keys take 4-5), the W maxima in one vector
  // (transpose_max) and the parameters once; then, where all W blocks are finite and allow the
  // fast form, each element by the rounding alone where no block rounds past its clamp
  // (unclamped: 2 operations), else with the clamp (plain: 3, or 4 for a symmetric clamp without
  // AVX-512's range instruction: numerics.h, clamp_magnitude), where the fast form takes about
  // 12 and the block-at-a-time walk a maximum across lanes per block; for kPlain > 1, where a
  // block holds a negative zero or subnormal (no_negative_tiny), with the sign fix-up too
  // (apply_finite*: 3 operations more; Hardswish gives -0 below -3). Measured in cache (256 x 1024
  // float32, one thread, Zen 4): MXINT8 1.85x (AVX2) and 2.1x (AVX-512) faster, MXFP 1.45x and
  // 1.7x. false, nothing stored, for any other W blocks.
  // kNv == kHalfVector (AVX-512, blocks of 8: BFP16 with the blocked axis innermost, or the
  // NCHWc view of 16-channel groups): W blocks of half a vector, W / 2 vectors of two blocks
  // each, the same way: the W maxima by half_transpose_max, each vector's two blocks'
  // parameters broadcast to its halves (broadcast_pair).
  // kMinAfter (kPlain > 1, out of place; span_blocks takes it for blocks of 2 or 4 vectors in
  // inputs of kStreamBytes or more): the least bit pattern taken in the second pass from the
  // vectors it reads anyway, the W blocks computed in the plain form and, where that minimum
  // shows a -0 or negative tiny x, computed again from p with the sign fix-up (the same bits;
  // in place the first pass must decide, as p is overwritten). In the first pass GCC read each
  // vector twice, once for the maximum and once for the minimum (a load folded into each
  // operation), and at 16 Mi elements those loads held back the walk: Zen 4, two threads,
  // AVX2, `ort-mx-bench --sizes 4Mi,16Mi --layouts innermost` against the library without
  // it, three runs: MXINT8 16 Mi 0.79-0.85 -> 0.96-0.98x Neg, 4 Mi 0.75-0.81 -> 0.79-0.81. In
  // cache the first pass is the faster one (1.10-1.14x the time with kMinAfter at [64 ...
  // 512, 1024] and [128, 4096], the walker called directly), as for BFP16's blocks of one
  // vector at 4 Mi (0.68-0.74 -> 0.64-0.71), which keep it.
  // kTinyZero (BFP16): the finite forms compare x with -0 alone (apply_finite_zero*), so
  // neither pass computes or broadcasts the blocks' ntiny, and W blocks any of which has kd > 0
  // are refused where they need a finite form (plain_spans_pipelined's kZeros: all of them).
  // Measured on Zen 4 (one thread, `ort-mx-bench --kernel --nchwc`, the orientation
  // classifier's five activation shapes, --other-native): 0.855x the time with Hardswish
  // inputs (152 -> 130 us), 0.91x with normal ones (129 -> 117 us); AVX-512 (blocks of half a
  // vector) 0.85x and 0.90x.
  template <int kNv, bool kMinAfter = false>
  MXOPS_VINL bool blocks_plain(const Pol& pol, const T* p, T* q) const {
    PlainQuotients<kNv> kept;
    PlainSpanOf span;
    if (!plain_first<kNv, kMinAfter>(pol, p, q, kept, span)) return false;
    plain_second<kNv, kMinAfter>(pol, span, p, q, kept);
    return true;
  }

  // Whether blocks_plain takes its finite forms with -0 as the one bound (Pol::kTinyZeroSpans;
  // kMinAfter decides the form in the second pass, after the first has taken the span).
  template <bool kMinAfter>
  static constexpr bool kTinyZero = Pol::kPlain > 1 && Pol::kTinyZeroSpans && !kMinAfter;

  // blocks_plain's first pass over the W blocks from p: their parameters and form into
  // `span`; false where they do not all take the fast form.
  // kZeros (kTinyZero only): the finite form without the least bit pattern, for spans that
  // hold a -0 anyway (plain_spans_pipelined).
  template <int kNv, bool kMinAfter, bool kZeros = false>
  MXOPS_VINL bool plain_first(const Pol& pol, const T* p, T* q, PlainQuotients<kNv>& kept,
                              PlainSpanOf& span) const {
    static_assert(kNv > 0 || kHalfVectorBlocks, "blocks of half a vector: 16 lanes, the plain form");
    static_assert(!kZeros || kTinyZero<kMinAfter>, "kZeros: the finite forms with -0 as their bound");
    constexpr bool kMin = Pol::kPlain > 1 && !kMinAfter && !kZeros;  // the least bit pattern here
    constexpr bool kHalves = kNv == kHalfVector;
    constexpr int kGroups = PlainGroups<kNv>::value;  // vector groups: a block, or a vector of two
    constexpr int kPer = PlainPer<kNv>::value;
    I a[kGroups];
    I bmin{};
#pragma GCC unroll 16
    for (int b = 0; b < kGroups; ++b) {
      I m{};
#pragma GCC unroll 4
      for (int i = 0; i < kPer; ++i) {
        const int64_t off = (b * kPer + i) * W;
        if ((off * int64_t(sizeof(T))) % 64 == 0) prefetch(p + off, q + off);  // once per line
        const F xv = load(p + off);
        keep_quotient(kept, b * kPer + i, xv);
        m = i == 0 ? magnitude_bits(xv) : imax(m, magnitude_bits(xv));
        if constexpr (kMin) bmin = off == 0 ? as_int(f2u(xv)) : imin(bmin, as_int(f2u(xv)));
      }
      a[b] = m;
    }
    // lane b: block b's greatest magnitude
    I amax;
    if constexpr (kHalves) amax = L::half_transpose_max(a);
    else amax = L::transpose_max(a);
    // One test for all three conditions (measured: the three branches took ~18 % of BFP16's
    // walk); s and the fast form's test are only integer operations on the lanes of a block
    // with Inf or NaN, whose results the finite test masks.
    const I s = pol.exponent_of_magnitude(amax);
    if (!L::all(fast_usable(pol, amax, s))) return false;
    span.prm = pol.fast_params(s, s);
    span.unclamped = pol.unclamped(span.prm, amax);
    bool plain = true;  // else a -0 or a negative tiny x: the finite form (kPlain > 1)
    if constexpr (kMin) plain = L::all(no_negative_tiny(bmin));
    if constexpr (kZeros) plain = false;
    if constexpr (kTinyZero<kMinAfter>) {
      if (!plain && !pol.tiny_is_zero(s)) return false;
    }
    span.form = finite_form(true, plain, span.unclamped);
    return true;
  }

  // blocks_plain's second pass: the W blocks from p in span's form, to q.
  template <int kNv, bool kMinAfter>
  MXOPS_VINL void plain_second(const Pol& pol, const PlainSpanOf& span, const T* p, T* q,
                               const PlainQuotients<kNv>& kept) const {
    constexpr bool kHalves = kNv == kHalfVector;
    constexpr int kGroups = PlainGroups<kNv>::value;
    constexpr int kPer = PlainPer<kNv>::value;
    I bmin{};
    __asm__ volatile("" ::: "memory");  // (as in column_blocks)
    auto each = [&](auto apply) {
      auto block = [&](int b, const auto& pb) MXOPS_LAMBDA_INL {
#pragma GCC unroll 4
        for (int i = 0; i < kPer; ++i) {
          const int64_t off = (b * kPer + i) * W;
          const F v = quotient_or_load(kept, b * kPer + i, p + off);
          if constexpr (Pol::kPlain > 1 && kMinAfter)
            bmin = off == 0 ? as_int(f2u(v)) : imin(bmin, as_int(f2u(v)));
          store(q + off, apply(v, pb));
        }
      };
      if constexpr (kHalves) {
#pragma GCC unroll 16
        for (int b = 0; b < kGroups; ++b) block(b, broadcast_params<true>(span.prm, b));
      } else {
        // Each block's parameters a broadcast load, the blocks two at a time (LanesInMemory).
        const LanesInMemory<PlainPrm> lanes(span.prm);
#pragma GCC unroll 2
        for (int b = 0; b < kGroups; ++b) block(b, lanes.at(b));
      }
    };
    in_form<kTinyZero<kMinAfter>>(pol, span.form, each);
    if constexpr (Pol::kPlain > 1 && kMinAfter)
      if (!L::all(no_negative_tiny(bmin))) in_form(pol, finite_form(true, false, span.unclamped), each);
  }

  // The spans of kSpan elements from g while first(p, q, state) takes them, each span's
  // second(state, p, q) after the next span's first (software pipelining): the first pass's
  // chain of dependent operations (the loads, the transposing maximum, the parameters and the
  // tests, with the branch on them at its end) then runs beside the previous span's rounding
  // instead of ahead of its own, where the reorder window held about one and a half spans of
  // BFP16's blocks of 8 and the walk waited on that chain. A span first refuses goes to
  // refused(p, q): true where it handled that span (the walk goes on), false to stop there.
  // Returns where it stopped. Measured on Zen 4 (AVX2 walker for rows there, one thread;
  // `ort-mx-bench --kernel --nchwc --input hardswish`, the orientation classifier's five
  // activation shapes, --other-native): BFP16 in the NCHWc view 0.75x the time (211 -> 159 us;
  // blocks_plain), MX9 / MX6 / MX4 (blocks_sub, two AVX2 vectors a block) 0.93x (154 -> 144
  // us); blocked axis innermost (`ort-mx-bench --layouts innermost`, two threads) BFP16
  // 1.08-1.16x the GB/s at 64 Ki - 1 Mi, MX9 / MX6 / MX4 1.00-1.08x at 64 Ki - 4 Mi, the
  // blocks of 32 (MXINT8, MXFP) within 0.97-1.03. (The same order in the NCHWc pixel walk,
  // pixel_groups, made MXINT8 1.03x and the MXFP formats 1.04-1.06x the time: not kept.)
  template <int64_t kSpan, class State, class First, class Second, class Refused>
  static MXOPS_VINL int64_t pipelined_spans(const T* px, T* py, int64_t g, int64_t n_simd,
                                            First first, Second second, Refused refused) {
    while (g + kSpan <= n_simd) {
      State cur;
      if (!first(px + g, py + g, cur)) {
        if (!refused(px + g, py + g)) return g;
        g += kSpan;
        continue;
      }
      for (;;) {
        const int64_t h = g + kSpan;
        State next;
        const bool next_ok = h + kSpan <= n_simd && first(px + h, py + h, next);
        second(cur, px + g, py + g);
        g = h;
        if (!next_ok) break;
        cur = next;
      }
    }
    return g;
  }

  // blocks_plain over the spans of W blocks from g (pipelined_spans); kNv == 1: a span
  // blocks_plain refuses goes to blocks_of_vectors, as in span_blocks. Not for Float32Divided,
  // whose first pass keeps its quotients. kTinyZero: where the first span holds a -0, every
  // span takes the finite form (kZeros) without the least bit pattern that chooses between it
  // and the plain form: a Hardswish's output holds a -0 in nearly every span (a sixth of its
  // elements below -3), so that choice would cost one operation a vector and pick the finite
  // form anyway (Hardswish inputs: 142 us with it, 130 without, the kernel bench above; normal
  // inputs, whose first span holds no -0, keep it: 117 us, where the finite form took 131).
  template <int kNv, bool kMinAfter>
  MXOPS_VINL int64_t plain_spans_pipelined(const Pol& pol, const T* px, T* py, int64_t g,
                                           int64_t n_simd) const {
    static_assert(!kKeepQuotients, "the pipelined spans keep no quotients");
    constexpr int64_t kSpan = span_elements(kNv);
    if constexpr (kTinyZero<kMinAfter>)
      if (g + kSpan <= n_simd && holds_negative_zero(px + g, kSpan))
        return plain_spans_pipelined_as<kNv, kMinAfter, true>(pol, px, py, g, n_simd);
    return plain_spans_pipelined_as<kNv, kMinAfter, false>(pol, px, py, g, n_simd);
  }

  // Whether the n elements (a multiple of W) from p hold a -0.
  MXOPS_VINL bool holds_negative_zero(const T* p, int64_t n) const {
    I z{};
    for (int64_t i = 0; i < n; i += W) z |= as_int(f2u(load(p + i))) == static_cast<int32_t>(0x80000000u);
    return !L::all(z == 0);
  }

  template <int kNv, bool kMinAfter, bool kZeros>
  MXOPS_VINL int64_t plain_spans_pipelined_as(const Pol& pol, const T* px, T* py, int64_t g,
                                              int64_t n_simd) const {
    PlainQuotients<kNv> none;
    return pipelined_spans<span_elements(kNv), PlainSpanOf>(
        px, py, g, n_simd,
        [&](const T* p, T* q, PlainSpanOf& span) MXOPS_LAMBDA_INL {
          return plain_first<kNv, kMinAfter, kZeros>(pol, p, q, none, span);
        },
        [&](const PlainSpanOf& span, const T* p, T* q) MXOPS_LAMBDA_INL {
          plain_second<kNv, kMinAfter>(pol, span, p, q, none);
        },
        [&](const T* p, T* q) MXOPS_LAMBDA_INL {
          if constexpr (kNv != 1) return false;
          blocks_of_vectors(pol, p, q);
          return true;
        });
  }

  // W blocks of kNv vectors each from p for the sub-block policy (to_bfp_prime) with
  // sub-blocks of two lanes, as blocks_plain takes the plain form's: the W blocks' maxima in
  // one vector (transpose_max) and the test for the one-addition form without the subnormal
  // flush (fast and normal, as tile_sub_blocks' outer walk takes it) once for all W; then
  // each vector's result from its sub-blocks' maxima and its block's, broadcast from its lane.
  // Where a block was a group of kNv vectors with a cross-lane maximum of its own and each
  // vector's result by the fast form with the flush, measured in cache (MX9, [96, 288] and
  // [1, 27648] float32, one thread, Zen 4, the walker called directly): 1.35-1.5x faster with
  // AVX2 and AVX-512. false, nothing stored, where any of the W blocks does not take that form.
  template <int kNv>
  MXOPS_VINL bool blocks_sub(const Pol& pol, const T* p, T* q) const {
    Quotients<W * kNv> kept;
    K pairs[W * kNv];
    SubSpan span{I{}, pairs};
    if (!sub_first<kNv>(pol, p, q, kept, span)) return false;
    sub_second<kNv>(pol, span, p, q, kept);
    return true;
  }

  // What blocks_sub's second pass takes from its first: s, lane b block b's maximum, and
  // where its first pass kept each vector's sub-block maxima (its keys' maximum over each
  // pair of lanes, in both lanes).
  struct SubSpan {
    I s;
    K* pairs;
  };

  // blocks_sub's first pass over the W blocks from p; false where they do not all take that
  // form. The sub-block maxima are taken here and kept for the second pass (span.pairs, W kNv
  // vectors), where that pass computed them from the vector it loads again; the transposing
  // maximum then starts from lanes in equal pairs (transpose_max_of_pairs: W / 2 shuffles and
  // maxima fewer), for blocks of one vector straight from the kept maxima. Measured on a
  // 2-core Xeon (family 6 model 167, AVX-512, the walker called directly, one thread): MX9 /
  // MX6 / MX4 in the L2 0.90-0.94x the time (the orientation classifier's NCHWc shapes up to
  // [1, 64, 56, 56], innermost [64, 1024], [256, 1024], [784, 128]), beyond it unchanged;
  // AVX2 there unchanged. Kept in the span's state instead (copied from span to span by
  // pipelined_spans) it was 1.14x the time ("Sub-block maxima from the first pass" in
  // docs/speed-log.md).
  template <int kNv>
  MXOPS_VINL bool sub_first(const Pol& pol, const T* p, T* q, Quotients<W * kNv>& kept,
                            SubSpan& span) const {
    K a[kNv == 1 ? 1 : W];
#pragma GCC unroll 16
    for (int b = 0; b < W; ++b) {
      K m{};
#pragma GCC unroll 4
      for (int i = 0; i < kNv; ++i) {
        const int64_t off = (b * kNv + i) * W;
        if ((off * int64_t(sizeof(T))) % 64 == 0) prefetch(p + off, q + off);  // once per line
        const F xv = load(p + off);
        keep_quotient(kept, b * kNv + i, xv);
        const K k = L::group_max(pol.key(xv), 1);  // sub-blocks of two lanes
        span.pairs[b * kNv + i] = k;
        m = i == 0 ? k : imax(m, k);
      }
      if constexpr (kNv > 1) a[b] = m;
    }
    // lane b: block b's maximum
    span.s = pol.exponent(L::transpose_max_of_pairs(kNv == 1 ? span.pairs : a));
    return Pol::kFastMode && L::all(pol.fast_mask(span.s) & pol.normal_mask(span.s));
  }

  // blocks_sub's second pass: the W blocks from p, to q. The blocks' part of the parameters
  // (sub_floor) once for all W, each block's a broadcast load (LanesInMemory), and the loop
  // over the blocks two at a time: fully unrolled with a shuffle per broadcast, the walk
  // measured 1.08-1.12x the time on a 2-core Xeon (family 6 model 167; MX9, the NCHWc view in
  // the L2, the walker called directly: "Broadcast loads" in docs/speed-log.md).
  template <int kNv>
  MXOPS_VINL void sub_second(const Pol& pol, const SubSpan& span, const T* p, T* q,
                             [[maybe_unused]] const Quotients<W * kNv>& kept) const {
    __asm__ volatile("" ::: "memory");  // (as in column_blocks)
    const LanesInMemory<I> floors(pol.sub_floor(span.s));  // lane b: block b's least sub-block exponent
#pragma GCC unroll 2
    for (int b = 0; b < W; ++b) {
      const I fb = floors.at(b);
#pragma GCC unroll 4
      for (int i = 0; i < kNv; ++i) {
        const int64_t off = (b * kNv + i) * W;
        const F v = quotient_or_load(kept, b * kNv + i, p + off);
        store(q + off, pol.apply_normal_floor(v, fb, pol.exponent(span.pairs[b * kNv + i])));
      }
    }
  }

  // blocks_sub over the spans of W blocks from g (pipelined_spans), sub-blocks of two lanes.
  template <int kNv>
  MXOPS_VINL int64_t sub_spans_pipelined(const Pol& pol, const T* px, T* py, int64_t g,
                                         int64_t n_simd) const {
    static_assert(!kKeepQuotients, "the pipelined spans keep no quotients");
    Quotients<W * kNv> none;
    // Two spans' kept sub-block maxima at a time (the next span's first pass runs before this
    // one's second): each first pass takes the other buffer.
    K pairs[2][W * kNv];
    int turn = 0;
    return pipelined_spans<span_elements(kNv), SubSpan>(
        px, py, g, n_simd,
        [&](const T* p, T* q, SubSpan& span) MXOPS_LAMBDA_INL {
          span.pairs = pairs[turn];
          turn ^= 1;
          return sub_first<kNv>(pol, p, q, none, span);
        },
        [&](const SubSpan& span, const T* p, T* q) MXOPS_LAMBDA_INL {
          sub_second<kNv>(pol, span, p, q, none);
        },
        [](const T*, T*) { return false; });
  }

  // W blocks of kNv = 1, 2 or 4 vectors each from p, where a policy has a walk for them:
  // blocks_plain (the plain form's policies), blocks_sub (to_bfp_prime with sub-blocks of
  // two), else for blocks of one vector blocks_of_vectors. false, nothing stored, where none
  // applies; the caller then walks the W blocks one by one.
  MXOPS_VINL bool span_blocks(int kNv, const Pol& pol, const T* p, T* q) const {
    if constexpr (W == 1) {
      return false;
    } else if constexpr (Pol::kSubBlocks) {
      if (sub != 2) return false;
      switch (kNv) {
        case 1: return blocks_sub<1>(pol, p, q);
        case 2: return blocks_sub<2>(pol, p, q);
        case 4: return blocks_sub<4>(pol, p, q);
      }
      return false;
    } else {
      if constexpr (Pol::kPlain > 0) {
        // kMinAfter (blocks of several vectors, out of place, min_after): see blocks_plain.
        constexpr bool kAfter = Pol::kPlain > 1;
        const bool after = takes_min_after(p, q);
        switch (kNv) {
          case 1: if (blocks_plain<1>(pol, p, q)) return true; break;
          case 2: return after ? blocks_plain<2, kAfter>(pol, p, q) : blocks_plain<2>(pol, p, q);
          case 4: return after ? blocks_plain<4, kAfter>(pol, p, q) : blocks_plain<4>(pol, p, q);
        }
      }
      if (kNv != 1) return false;
      blocks_of_vectors(pol, p, q);
      return true;
    }
  }

  // contiguous_groups' spans of W blocks of kNv vectors from g while span_blocks takes them
  // (kNv == kHalfVector: of half a vector, while blocks_plain takes them): returns where it
  // stopped (a span it refused, or fewer than a span's elements left). In a
  // function of its own per kNv with the policy by value, as pixel_groups (inlined, the
  // three block lengths' walks shared contiguous_groups' registers). Measured with the
  // walkers called directly (AVX2, Zen 3, one thread, float32, both walks alternating in one
  // program): blocks of one vector in the NCHWc view (BFP16 with nchwc_block 8, the
  // 224 x 224 orientation classifier's activation shapes) 0.87x the time; blocked axis
  // innermost, rows of 1.5-256 Ki elements: BFP16 0.88x, MXINT8 0.94, MXFP8E4M3 0.95, MX9
  // 0.97. The plain form's policies take plain_spans_pipelined, to_bfp_prime with sub-blocks of
  // two sub_spans_pipelined (but for Float32Divided).
  template <int kNv>
  __attribute__((noinline)) int64_t spans(const Pol pol, const T* px, T* py, int64_t g,
                                          int64_t n_simd) const {
    constexpr int64_t span = span_elements(kNv);
    if constexpr (W > 1 && Pol::kPlain > 0 && !Pol::kSubBlocks && !kKeepQuotients) {
      if (kNv > 1 && takes_min_after(px, py))  // (as span_blocks)
        return plain_spans_pipelined<kNv, (Pol::kPlain > 1)>(pol, px, py, g, n_simd);
      return plain_spans_pipelined<kNv, false>(pol, px, py, g, n_simd);
    }
    if constexpr (W > 1 && Pol::kSubBlocks && !kKeepQuotients && kNv != kHalfVector)
      if (sub == 2) return sub_spans_pipelined<kNv>(pol, px, py, g, n_simd);
    for (; g + span <= n_simd; g += span) {
      if constexpr (kNv == kHalfVector) {
        if (!blocks_plain<kHalfVector>(pol, px + g, py + g)) break;
      } else {
        if (!span_blocks(kNv, pol, px + g, py + g)) break;
      }
    }
    return g;
  }

  // The most elements of a group that contiguous_groups takes in a padded copy where a row's
  // end cuts it short.
  static constexpr int64_t kPaddedGroup = 64;

  // Blocked axis innermost, blocks of a power-of-two size and (to_bfp_prime) sub-blocks of a
  // power of two <= W: `n` elements from `base`, the last partial group in a padded copy.
  void contiguous_groups(int64_t base, int64_t n) const {
    // Locals: the vector stores may alias anything reachable through `this`, which would
    // reload every policy constant after each store.
    const Pol pol = this->pol;
    const T* const px = x + base;
    T* const py = y + base;
    const int64_t bs = this->bs;
    const int64_t group = bs > W ? bs : W;
    const int64_t n_simd = n / group * group;
    const int steps = log2_exact(min64(bs, W));
    const int sub_steps = Pol::kSubBlocks ? log2_exact(sub) : steps;
    // One vector from p: the parameters of its (sub-)blocks, maxima s, and its result.
    auto one = [&](auto fast_tag, I s, const T* p, T* q) {
      constexpr bool kFast = decltype(fast_tag)::value;
      const F v = load(p);
      I sm = s;
      if constexpr (Pol::kSubBlocks) sm = pol.exponent(L::group_max(pol.key(v), sub_steps));
      if constexpr (kFast) store(q, pol.apply_fast(v, pol.fast_params(s, sm)));
      else store(q, pol.apply(v, pol.params(s, sm)));
    };
    // nv vectors of one group, blocks with maxima s; the parameters of whole blocks once.
    auto group_of = [&](auto fast_tag, I s, const T* p, T* q, int64_t nv) {
      constexpr bool kFast = decltype(fast_tag)::value;
      if constexpr (Pol::kSubBlocks) {
        for (int64_t i = 0; i < nv; ++i) one(fast_tag, s, p + i * W, q + i * W);
      } else if constexpr (kFast) {
        const auto prm = pol.fast_params(s, s);
        for (int64_t i = 0; i < nv; ++i) store(q + i * W, pol.apply_fast(load(p + i * W), prm));
      } else {
        const auto prm = pol.params(s, s);
        for (int64_t i = 0; i < nv; ++i) store(q + i * W, pol.apply(load(p + i * W), prm));
      }
    };
    // A group: bs / W vectors of one block (bs >= W), or one vector of W / bs blocks. Where a
    // block is one, two or four vectors, W blocks at a time (a span) where span_blocks has a
    // walk for them, else the groups one by one below.
    const int64_t nv = group / W;
    // One group from p to q: the maxima of its blocks, then each vector in the fast form
    // where every lane allows it, else in the general one. prefetch_tag: whether the row's
    // streams are prefetched on the way (not for the padded copy of the last group).
    auto walk_group = [&](auto prefetch_tag, const T* p, T* q) {
      constexpr bool kPrefetch = decltype(prefetch_tag)::value;
      if constexpr (kPrefetch) prefetch(p, q);
      K k = pol.key(load(p));
      for (int64_t i = 1; i < nv; ++i) {
        if constexpr (kPrefetch) prefetch(p + i * W, q + i * W);
        k = imax(k, pol.key(load(p + i * W)));
      }
      const I s = pol.exponent(L::group_max(k, steps));
      if (pol.fast(s)) group_of(std::true_type{}, s, p, q, nv);
      else group_of(std::false_type{}, s, p, q, nv);
    };
    const int span_nv = W == 1 ? 0 : bs == W ? 1 : bs == 2 * W ? 2 : bs == 4 * W ? 4 : 0;
    const int64_t span = span_nv * W * W;
    // Blocks of half a vector (AVX-512, BFP16): W at a time, the plain form's policies.
    const int64_t half_span = kHalfVectorBlocks && 2 * bs == W ? span_elements(kHalfVector) : 0;
    for (int64_t g = 0; g < n_simd;) {
      int64_t stop = n_simd;
      if constexpr (kHalfVectorBlocks) {
        if (half_span > 0 && g + half_span <= n_simd) {
          g = spans<kHalfVector>(pol, px, py, g, n_simd);
          if (g + half_span <= n_simd) stop = g + half_span;
        }
      }
      if constexpr (W > 1) {  // (no spans one lane wide: span_nv is 0)
        if (span > 0 && g + span <= n_simd) {
          switch (span_nv) {
            case 1: g = spans<1>(pol, px, py, g, n_simd); break;
            case 2: g = spans<2>(pol, px, py, g, n_simd); break;
            default: g = spans<4>(pol, px, py, g, n_simd); break;
          }
          if (g + span <= n_simd) stop = g + span;
        }
      }
      for (; g < stop; g += group) walk_group(std::true_type{}, px + g, py + g);
    }
    if (n_simd == n) return;
    // The last group, cut short by the row's end: in a copy padded to a whole group with the
    // row's last element. Every element's result depends only on its own value and the
    // greatest magnitudes of its block and sub-block, and the copies raise neither: the
    // last element's own (sub-)block holds it already, and any (sub-)block past it is
    // padding alone. So the copy's first n - n_simd results are the scalar walker's bits;
    // the padding's are dropped. (Padding with +0 would make blocks of zeros wherever the
    // padding fills a block, and those refuse the fast form for the whole vector.) Groups of
    // more than kPaddedGroup elements, and last groups less than a third full, go to the
    // scalar walker: measured with the walker called directly (Xeon model 167, AVX-512), rows
    // of 15 elements took MX9 0.48x the scalar walker's time, MXINT8 0.76x, BFP16 0.73x,
    // MXFP4E2M1 0.67x, but [64, 200]'s last 8 elements of MXINT8's and MXFP4E2M1's blocks of
    // 32 1.05-1.08x.
    if constexpr (W > 1) {
      if (group <= kPaddedGroup && 3 * (n - n_simd) >= group) {
        alignas(64) T in[kPaddedGroup];
        alignas(64) T out[kPaddedGroup];
        for (int64_t j = n_simd; j < n; ++j) in[j - n_simd] = px[j];
        for (int64_t j = n - n_simd; j < group; ++j) in[j] = px[n - 1];
        walk_group(std::false_type{}, in, out);
        for (int64_t j = n_simd; j < n; ++j) py[j] = out[j - n_simd];
        return;
      }
    }
    const auto tail = scalar();
    for (int64_t j0 = n_simd; j0 < n; j0 += bs) tail.block(base + j0, min64(bs, n - j0), 1);
  }

  // The sub-blocks of the tile of strided_tile, a sub-block at a time over the tile's nv
  // vectors of columns with block maxima s[v]: the sub-block's maximum and parameters stay in
  // registers, and the rows are read in order. kSub > 0: the sub-block size, fixed at compile
  // time for whole sub-blocks. The input rows are x_inner apart, the output's inner.
  template <int64_t kSub, bool Fast, bool Normal = false>
  MXOPS_VINL void tile_sub_blocks(const Pol& pol, const T* px, int64_t x_inner, T* py, int64_t n,
                                  int64_t sub, int64_t inner, int64_t nv, const I* s) const {
    auto rows = [&](int64_t a, auto len_of) {
      const int64_t len = len_of();
      const T* const row = px + a * x_inner;
      T* const out = py + a * inner;
      if constexpr (Stream && Fast && kSub > 0) {
        // Every row's results of the tile first, then the rows one after another: streaming
        // stores that go back and forth between rows run at a fraction of the speed.
        if (len == kSub) {
          F r[kSub][kTileVectors];
          for (int64_t v = 0; v < nv; ++v) {
            K km = pol.key(load(row + v * W));
            for (int64_t j = 1; j < kSub; ++j) km = imax(km, pol.key(load(row + j * x_inner + v * W)));
            const I sm = pol.exponent(km);
            const auto prm = pol.fast_params(s[v], sm);
            for (int64_t j = 0; j < kSub; ++j) {
              const F xv = load(row + j * x_inner + v * W);
              if constexpr (Normal) r[j][v] = pol.apply_normal(xv, s[v], sm);
              else r[j][v] = pol.apply_fast(xv, prm);
            }
          }
          for (int64_t j = 0; j < kSub; ++j)
            for (int64_t v = 0; v < nv; ++v) store(out + j * inner + v * W, r[j][v]);
          return;
        }
      }
      for (int64_t v = 0; v < nv; ++v) {
        K km = pol.key(load(row + v * W));
        for (int64_t j = 1; j < len; ++j) km = imax(km, pol.key(load(row + j * x_inner + v * W)));
        const I sm = pol.exponent(km);
        if constexpr (Fast) {
          const auto prm = pol.fast_params(s[v], sm);
          for (int64_t j = 0; j < len; ++j) {
            const F xv = load(row + j * x_inner + v * W);
            if constexpr (Normal) store(out + j * inner + v * W, pol.apply_normal(xv, s[v], sm));
            else store(out + j * inner + v * W, pol.apply_fast(xv, prm));
          }
        } else {
          const Params prm = pol.params(s[v], sm);
          for (int64_t j = 0; j < len; ++j)
            store(out + j * inner + v * W, pol.apply(load(row + j * x_inner + v * W), prm));
        }
      }
    };
    int64_t a = 0;
    if constexpr (kSub > 0)
      for (; a + kSub <= n; a += kSub) rows(a, [] { return kSub; });
    for (; a < n; a += sub) rows(a, [&] { return min64(n - a, sub); });
  }

  // k[0..nv) = maximum key over rows [0, n) from p, per column. kCols > 0: nv fixed at compile
  // time (a full tile), so that the loop over the vectors unrolls and the maxima stay in
  // registers, as in column_magnitudes.
  template <int64_t kCols = 0>
  static MXOPS_VINL void column_max(const Pol& pol, const T* p, int64_t n, int64_t inner,
                                    int64_t cols, K* k) {
    const int64_t nv = kCols > 0 ? kCols : cols;
    for (int64_t v = 0; v < nv; ++v) k[v] = pol.key(load(p + v * W));
    for (int64_t j = 1; j < n; ++j) {
      const T* row = p + j * inner;
      for (int64_t v = 0; v < nv; ++v) k[v] = imax(k[v], pol.key(load(row + v * W)));
    }
  }

  // Rows [0, n) of a tile without sub-blocks, vector v of every row in the block whose shared
  // exponent is s[v]: the fast form when every vector's block allows it, and within it the
  // plain form (without its clamp where no element reaches it) for blocks known finite from
  // their greatest magnitudes a[v] and least bit patterns bmin[v] (a null where not known).
  // kMinAfter (kPlain > 1: MXINT8, BFP16; a full tile out of place, known finite, in an input
  // of kStreamBytes or more; bmin not given): the least bit patterns, which decide whether the
  // blocks need the sign fix-up of a -0 or a negative tiny x, taken from the vectors this pass
  // loads; the rows computed as if none did and, where one does, computed again from px with
  // those minima (the same bits; rare). In the first pass beside the greatest magnitudes GCC
  // read each vector twice (a load folded into each operation); see docs/speed-log.md,
  // "Blocked axis outer at 16 Mi elements".
  template <bool kMinAfter = false>
  MXOPS_VINL void whole_block_rows(const Pol& pol, const T* px, int64_t x_inner, T* py, int64_t n,
                                   int64_t inner, int64_t nv, const I* s, const I* a = nullptr,
                                   const I* bmin = nullptr) const {
    bool fast = true;
    for (int64_t v = 0; v < nv; ++v) fast = fast && pol.fast(s[v]);
    if (fast) {
      typename Pol::Fast prm[kTileVectors];
      for (int64_t v = 0; v < nv; ++v) prm[v] = pol.fast_params(s[v], s[v]);
      if constexpr (kMinAfter) {
        // (every block taken as plain by the form's choice; the minima as the rows are read)
        I plain_bits[kTileVectors], bm[kTileVectors];
        for (int64_t v = 0; v < kTileVectors; ++v) plain_bits[v] = bm[v] = splat<I>(INT32_MAX);
        with_fast_form(pol, prm, kTileVectors, a, plain_bits, [&](const auto& apply) {
          block_rows<kTileVectors>(px, x_inner, py, n, inner, kTileVectors, [&](F x, int64_t v) MXOPS_LAMBDA_INL {
            bm[v] = imin(bm[v], as_int(f2u(x)));
            return apply(x, v);
          });
        });
        bool plain = true;
        for (int64_t v = 0; v < kTileVectors; ++v) plain = plain && pol.plain_finite(prm[v], bm[v]);
        if (plain) return;
        // Non-temporal stores of the same lines: the first ones made visible before the second.
        if constexpr (Stream) __builtin_ia32_sfence();
        return whole_block_rows(pol, px, x_inner, py, n, inner, kTileVectors, s, a, bm);
      } else {
        with_fast_form(pol, prm, nv, a, bmin, [&](const auto& apply) {
          if (nv == kTileVectors) return block_rows<kTileVectors>(px, x_inner, py, n, inner, nv, apply);
          block_rows(px, x_inner, py, n, inner, nv, apply);
        });
      }
    } else {
      Params prm[kTileVectors];
      for (int64_t v = 0; v < nv; ++v) prm[v] = pol.params(s[v], s[v]);
      for (int64_t j = 0; j < n; ++j) {
        const T* row = px + j * x_inner;
        T* out = py + j * inner;
        for (int64_t v = 0; v < nv; ++v) store(out + v * W, pol.apply(load(row + v * W), prm[v]));
      }
    }
  }

  // Rows [0, n) of a tile, vector v of each through apply(x, v), in rows: the input's rows
  // x_inner apart, the output's inner.
  // kNv > 0: nv fixed at compile time (a full tile, kTileVectors), so the loops over the
  // vectors unroll and the results of a row pair stay in registers.
  template <int64_t kNv = 0, class Apply>
  MXOPS_VINL void block_rows(const T* px, int64_t x_inner, T* py, int64_t n, int64_t inner,
                             int64_t nv_rt, const Apply& apply) const {
    const int64_t nv = kNv > 0 ? kNv : nv_rt;
    int64_t j = 0;
    if constexpr (Stream && W == 8) {
      // Two rows' results first, then each row's stores back to back: on the AMD EPYC
      // development machine (Zen 2, AVX2), streaming stores interleaved with the loads and
      // arithmetic of the next vectors ran the 16 Mi outer walk at 0.3x Neg, stored this way
      // at 0.7-0.9x (tile_sub_blocks does the same for the sub-blocks of MX9 / MX6 / MX4).
      // On Zen 4 the AVX2 walk gains 0.03-0.05 from storing as below; not measured on Zen 2,
      // so AVX2 keeps the row pairs.
      constexpr int64_t kRows = 2;
      for (; j + kRows <= n; j += kRows) {
        F r[kRows][kTileVectors];
        for (int64_t v = 0; v < nv; ++v)
          for (int64_t i = 0; i < kRows; ++i) r[i][v] = apply(load(px + (j + i) * x_inner + v * W), v);
        for (int64_t i = 0; i < kRows; ++i)
          for (int64_t v = 0; v < nv; ++v) store(py + (j + i) * inner + v * W, r[i][v]);
      }
    }
    // Each result stored as it is computed: ordinary stores, AVX-512's streaming ones
    // (measured on Zen 4, 16 Mi elements, MXINT8 / MXFP4E2M1 outer: 0.84 -> 0.86-0.91x Neg
    // against the row pairs above), and the row the pairs leave over.
    for (; j < n; ++j) {
      const T* row = px + j * x_inner;
      T* out = py + j * inner;
      for (int64_t v = 0; v < nv; ++v) store(out + v * W, apply(load(row + v * W), v));
    }
  }

  // The next tile of these rows, for reading and for writing (not when streaming: the stores
  // do not read the lines), while this one is computed; only for large inputs
  // (prefetch_tiles). px / py: the tile's first element, `column` columns into its row.
  MXOPS_VINL void prefetch_next_tile(const T* px, T* py, int64_t n, int64_t inner, int64_t cols,
                                     int64_t column) const {
    if (!prefetch_tiles || cols != kTileColumns || column + 2 * kTileColumns > inner) return;
    // Every line the next tile's rows touch: a row that does not start on a line spans one
    // line more (an input from numpy is 16 bytes past one), and a line left to the demand
    // load is a miss in every row of every tile (at 16 Mi elements, 16 bytes off, MXINT8
    // 0.66 -> 0.74x Neg with AVX2 on Zen 4).
    constexpr int64_t kBytes = kTileColumns * int64_t(sizeof(T));
    const int64_t x_off = static_cast<int64_t>(reinterpret_cast<uintptr_t>(px) % 64);
    const int64_t y_off = static_cast<int64_t>(reinterpret_cast<uintptr_t>(py) % 64);
    for (int64_t j = 0; j < n; ++j) {
      const char* next_x = reinterpret_cast<const char*>(px + j * inner + kTileColumns);
      for (int64_t c = -x_off; c < kBytes; c += 64) __builtin_prefetch(next_x + c, 0, 2);
      if constexpr (!Stream) {
        char* next_y = reinterpret_cast<char*>(py + j * inner + kTileColumns);
        for (int64_t c = -y_off; c < kBytes; c += 64) __builtin_prefetch(next_y + c, 1, 2);
      }
    }
  }

  // How strided_tile walks a block of n rows `inner` apart.
  enum class ColumnWalk { kColumns, kKeptColumns, kTile, kKeptTile };
  // kKeptTile is measured (and instantiated) for float32 with AVX-512 only (see column_walk).
  static constexpr bool kKeptTiles = !Stream && W == 16 && std::is_same_v<T, float>;

  // The column walk (column_tile) reads a column's n rows twice (maxima, then results), so
  // they must stay in the L1 cache between the passes, beside the n output lines it writes.
  // Rows a multiple of 4 KiB apart all fall into one L1 set (64 sets of 64-byte lines on
  // current x86 cores), 2 KiB apart into two, ...: with the 8 ways of a set, n rows in S sets
  // evict each other once n reaches 8 S, and sooner where the output's lines fall into the
  // same sets as the input's (x and y the same distance past a 4 KiB boundary, as large
  // allocations often are). Measured on the AVX2 development machine: MXINT8 (32 rows) at
  // 4 KiB strides 0.1x Neg where the tile walk gives 0.5x, and BFP16 (8 rows) 0.25x against
  // 0.45x; at 4 sets (strides of 1, 3, 9 KiB) 32 rows are as fast as or faster than the tile
  // walk. Sub-blocks read each sub-block a third time (MX9, 16 rows in 2 sets: 0.4x against
  // 0.56x).
  // Where the rows do not fit, kKeptColumns (n of the built-in block sizes) reads each row
  // once and keeps it in a small local buffer for the second pass. Measured with the output
  // in the input's sets, one thread, ns per element: MXINT8 at 1 KiB strides 0.26 -> 0.21,
  // at 2 KiB 0.35 -> 0.28; MX9 at 2 KiB 0.32 -> 0.27; BFP16 at 4 KiB 0.42 -> 0.31. At 4 KiB
  // strides MXINT8 and MX9 stay faster with the tile walk (0.38 against 0.42-0.44 kept).
  // Rows a multiple of 4 KiB apart (one set; [K, N] weights and activations with N a multiple
  // of 1024 float32) lose the tile walk's second pass to the L2 cache as well: 32 rows of a
  // tile in the same 8 sets. kKeptTile (float32, AVX-512, 16 or 32 rows) copies the tile's
  // rows into a local buffer during the first pass, rows in order, 512 bytes of each, and the
  // second pass reads that. Measured on Zen 4, one thread, the walker called directly, xNeg
  // tile -> kept tile: MXINT8 [64, 1024] 0.32 -> 0.46-0.48, [1024, 1024] 0.37 -> 0.52,
  // [2048, 1024] 0.47-0.50 -> 0.58; MXFP8E4M3 0.30-0.37 -> 0.45, 0.36 -> 0.50; MX9 0.33 ->
  // 0.42-0.44, 0.36-0.37 -> 0.44-0.48. With AVX2 it was no faster (0.35-0.37 both), nor for
  // BFP16's 8 rows (kept columns: 0.34-0.39 against 0.31), nor at 2 KiB strides ([512, 512]:
  // 0.52 both; kept columns stay), nor with half-tile rows (AVX2 and AVX-512: slower).
  // (Blocks of 16 or 32 rows with the plain form or sub-blocks take row_walk at 2 KiB strides
  // and more, except sub-blocks at 2 KiB where the L1 has 12 ways, and blocks of 32 float32
  // rows exactly 2 KiB apart there on AVX-512, which take the plain columns: takes_row_walk.)
  static MXOPS_VINL ColumnWalk column_walk(int64_t n, int64_t inner, const T* x, const T* y) {
    constexpr int64_t kLine = 64, kSets = 64, kWays = 8;
    // Divided inputs: the kept rows' second pass reads quotients (kKeepQuotients).
    if constexpr (kKeepQuotients)
      if (n == 8 || n == 16 || n == 32) return ColumnWalk::kKeptColumns;
    const int64_t stride = inner * int64_t(sizeof(T));
    if (stride % kLine != 0) return ColumnWalk::kColumns;  // rows at varying offsets: spread out
    const int64_t lines = stride / kLine;
    const int shift = static_cast<int>(min64(__builtin_ctzll(static_cast<unsigned long long>(lines)), 6));
    const int64_t sets = kSets >> shift;
    // the output rows in the input rows' sets: their set distance a multiple of the sets'
    // spacing, except in place (y == x: the output rows are the input's lines, no more of them).
    // Counted double in place before, 32-row blocks 1 or 3 KiB apart (and 24 rows 9 KiB apart)
    // took the kept columns or the tile walk; with the plain columns, on a 2-core Zen 4 (one
    // thread, ort-mx-bench --kernel --in-place, [1, 64 / 256, 1, 256], [1, 128, 1, 768],
    // [1, 32 / 24, 24, 96], the builds alternating): MXINT8 0.78x the time (xNeg 0.53 -> 0.68),
    // MXFP8E4M3 0.95x; the direction classifier's 16 NCHW shapes in place unchanged (0.996-1.016).
    const uint64_t d = (reinterpret_cast<uintptr_t>(y) / kLine - reinterpret_cast<uintptr_t>(x) / kLine) % kSets;
    const bool own_lines = static_cast<const void*>(y) != static_cast<const void*>(x);
    const int64_t per_set = (n + sets - 1) / sets * (own_lines && d % (uint64_t{1} << shift) == 0 ? 2 : 1);
    if (sets >= 4 ? per_set <= kWays : per_set < kWays) return ColumnWalk::kColumns;
    // Blocks of 8 rows where the L1 has more ways than the 8 assumed above (12 on the Intel
    // Xeon, family 6 model 207): rows 2 KiB apart with the output in their sets fit there. BFP16,
    // AVX-512, one thread, the walker called directly, xNeg kept columns -> columns: [512, 512]
    // 0.45-0.53 -> 0.66-0.71, [1024, 512] 0.53-0.62 -> 0.82-0.87, [256, 512] 0.40 -> 0.52-0.56.
    // With 8 ways too, for the AVX-512 walker and the plain form's policies, where the rows
    // fall into two sets (rows 2, 6, 10, ... KiB apart): the 8 lines a set of the input rows
    // and their output rows fill it exactly, and the plain columns (column_pairs_pipelined
    // without the copy) measured faster than the kept ones on a 2-core AMD Zen 4 (family 25
    // model 17, 32 KiB 8-way L1; BFP16, one thread, the walker called directly with the output
    // in the input's sets, xNeg, the libraries before and after alternating in one process, 6
    // rounds, medians): normal inputs [64, 512] 0.41 -> 0.51, [256, 512] 0.47 -> 0.58, [512,
    // 512] 0.44 -> 0.54, [2048, 512] 0.43 -> 0.52, [128, 1536] 0.46 -> 0.58, [256, 2560] 0.44 ->
    // 0.54; with -0s 0.42-0.45 -> 0.48-0.52. Not at one set (rows a multiple of 4 KiB apart;
    // [1024, 1024] with the walk forced in an experiment: 0.30 kept, 0.26 columns), nor on the
    // AVX2 walker (the same within 0.02 there).
    if (n == 8 && (per_set < l1d_ways() || (Pol::kPlain > 0 && W == 16 && sets == 2)))
      return ColumnWalk::kColumns;
    // Blocks of 32 float32 rows exactly 2 KiB apart (AVX-512, 12 ways or more): columns_at_2k.
    if (Pol::kPlain > 0 && columns_at_2k(W, n, stride, int64_t(sizeof(T)))) return ColumnWalk::kColumns;
    if ((n == 8 || n == 16 || n == 32) && (sets >= 2 || n <= 8)) return ColumnWalk::kKeptColumns;
    if (kKeptTiles && sets == 1 && (n == 16 || n == 32)) return ColumnWalk::kKeptTile;
    return ColumnWalk::kTile;
  }

  // Down n rows `inner` apart from p, per column vector c of kCols (p + c * W): the greatest
  // key in k[c] and, for the plain form (Pol::kPlain) where kMinima, the least key in kmin[c]
  // and the least bit pattern (as signed) in bmin[c].
  template <int kCols, bool kKeep = false, bool kMinima = true>
  static MXOPS_VINL void column_keys(const Pol& pol, const T* p, int64_t n, int64_t inner, K* k,
                                     K* kmin, I* bmin, F* keep = nullptr) {
    constexpr int kPlain = kMinima ? Pol::kPlain : 0;
    for (int c = 0; c < kCols; ++c) {
      const F xv = load(p + c * W);
      if constexpr (kKeep) keep[c] = xv;
      k[c] = pol.key(xv);
      if constexpr (kPlain > 0) kmin[c] = k[c];
      if constexpr (kPlain > 1) bmin[c] = as_int(f2u(xv));
    }
#pragma GCC unroll 2
    for (int64_t j = 1; j < n; ++j) {
      p += inner;
      for (int c = 0; c < kCols; ++c) {
        const F xv = load(p + c * W);
        if constexpr (kKeep) keep[j * kCols + c] = xv;
        const K kv = pol.key(xv);
        k[c] = imax(k[c], kv);
        if constexpr (kPlain > 0) kmin[c] = imin(kmin[c], kv);
        if constexpr (kPlain > 1) bmin[c] = imin(bmin[c], as_int(f2u(xv)));
      }
    }
  }

  // column_keys for the plain form's policies (Pol::kPlain > 0) in fewer operations: per
  // column vector c, the greatest bit pattern with the sign cleared (as signed) in a[c], which
  // is at least 0x7f800000 where the column holds Inf or NaN, and for kPlain > 1 the least bit
  // pattern (as signed) in bmin[c].
  // kCols 0: `cols` vectors (the tile walk's, rows in order). kKeep: the rows are also copied,
  // in order, into keep (n rows of nc vectors; the kept tile's first pass).
  // kMin false: no bmin (whole_block_rows<true> takes it in the second pass).
  template <int kCols, bool kKeep = false, bool kRaw = false, bool kMin = true>
  static MXOPS_VINL void column_magnitudes(const T* p, int64_t n, int64_t inner, I* a, I* bmin,
                                           int64_t cols = kCols, F* keep = nullptr) {
    const int64_t nc = kCols > 0 ? kCols : cols;
    magnitudes_start(nc, a, bmin);
#pragma GCC unroll 2
    for (int64_t j = 0; j < n; ++j, p += inner)
      magnitudes_row<kKeep, kRaw, kMin>(p, nc, a, bmin, kKeep ? keep + j * nc : nullptr);
  }

  // x's bit pattern with the sign cleared: ordered as |x| for finite x, above every finite
  // one for Inf and NaN (magnitude_finite).
  static MXOPS_VINL I magnitude_bits(F x) { return as_int(f2u(x)) & 0x7fffffff; }
  // The lanes whose block (greatest magnitude bits a, exponent s) is finite and within the
  // fast form's range.
  static MXOPS_VINL auto fast_usable(const Pol& pol, I a, I s) { return magnitude_finite(a) & pol.fast_mask(s); }

  // column_magnitudes' start for nc column vectors, and one row of it: the nc vectors from p
  // into a and bmin, and (kKeep) into keep[0..nc).
  static MXOPS_VINL void magnitudes_start(int64_t nc, I* a, I* bmin) {
    for (int64_t c = 0; c < nc; ++c) {
      a[c] = splat<I>(0);
      if constexpr (Pol::kPlain > 1) bmin[c] = splat<I>(INT32_MAX);
    }
  }
  // kRaw: the elements as load_raw reads them.
  template <bool kKeep = false, bool kRaw = false, bool kMin = true>
  static MXOPS_VINL void magnitudes_row(const T* p, int64_t nc, I* a, I* bmin, F* keep = nullptr) {
    for (int64_t c = 0; c < nc; ++c) {
      const F xv = kRaw ? load_raw(p + c * W) : load(p + c * W);
      if constexpr (kKeep) keep[c] = xv;
      a[c] = imax(a[c], magnitude_bits(xv));
      if constexpr (Pol::kPlain > 1 && kMin) bmin[c] = imin(bmin[c], as_int(f2u(xv)));
    }
  }

  // The fast form's element function for nc column vectors with parameters prm, given to
  // rows(apply) as apply(x, c) for vector c: for the plain form's policies (Pol::kPlain > 0),
  // where every vector's block is known finite (its greatest magnitude in a[c], a non-null)
  // and plain (its least bit pattern in bmin[c]), the plain form, without its clamp where no
  // element reaches it; known finite but not plain (kPlain > 1: a -0 or a negative tiny x),
  // the same with the sign fix-up; else apply_fast.
  template <class Rows>
  static MXOPS_VINL void with_fast_form(const Pol& pol, const typename Pol::Fast* prm, int64_t nc,
                                        const I* a, const I* bmin, const Rows& rows) {
    FastFormTally tally;
    if (a == nullptr) tally.plain = false, tally.finite = false;
    for (int64_t c = 0; (tally.plain || tally.finite) && c < nc; ++c) tally.add(pol, prm[c], a[c], bmin[c]);
    rows_in_form(pol, tally.form(), prm, rows);
  }

  // The form for a run of finite blocks, added one vector of blocks at a time (parameters
  // prm, greatest magnitude bits a, least bit pattern bmin): the plain form where every
  // block is plain, without its clamp where no block's greatest magnitude rounds past it
  // (most blocks); else, for kPlain > 1 (blocks with a -0 or a negative tiny x), the same
  // with the sign fix-up; else apply_fast. finite: the blocks are known finite (with_fast_form
  // clears it where it does not know).
  struct FastFormTally {
    bool plain = Pol::kPlain > 0, unclamped = true, finite = Pol::kPlain > 1;
    MXOPS_VINL void add(const Pol& pol, const typename Pol::Fast& prm, I a, I bmin) {
      if constexpr (Pol::kPlain > 0) {
        plain = plain && pol.plain_finite(prm, bmin);
        unclamped = unclamped && pol.unclamped(prm, a);
      }
    }
    MXOPS_VINL FastForm form() const { return finite_form(finite, plain, unclamped); }
  };

  // The form of blocks that are plain (so finite), without the clamp where unclamped; else
  // of blocks known finite (kPlain > 1): the same with the sign fix-up; else apply_fast.
  static MXOPS_VINL FastForm finite_form(bool finite, bool plain, bool unclamped) {
    if (Pol::kPlain > 0 && plain) return unclamped ? FastForm::kUnclamped : FastForm::kPlain;
    if (Pol::kPlain > 1 && finite) return unclamped ? FastForm::kFiniteUnclamped : FastForm::kFinite;
    return FastForm::kFast;
  }

  // each(apply) with apply(x, prm) the element function of `form` (the one place that maps a
  // form to its function: the column, tile and row walks, blocks_plain, pixel_group_finite,
  // pixel_group). kZeroBound: the finite forms with -0 as their one bound (apply_finite_zero*,
  // blocks_plain's spans of blocks of kd <= 0, kTinyZero).
  template <bool kZeroBound = false, class Each>
  static MXOPS_VINL void in_form(const Pol& pol, FastForm form, const Each& each) {
    if constexpr (Pol::kPlain > 0) {
      if (form == FastForm::kUnclamped) return each([&](F x, const auto& p) MXOPS_LAMBDA_INL { return pol.apply_unclamped(x, p); });
      if (form == FastForm::kPlain) return each([&](F x, const auto& p) MXOPS_LAMBDA_INL { return pol.apply_plain(x, p); });
      if constexpr (Pol::kPlain > 1) {
        if (form == FastForm::kFiniteUnclamped) return each([&](F x, const auto& p) MXOPS_LAMBDA_INL {
          if constexpr (kZeroBound) return pol.apply_finite_zero_unclamped(x, p);
          else return pol.apply_finite_unclamped(x, p);
        });
        if (form == FastForm::kFinite) return each([&](F x, const auto& p) MXOPS_LAMBDA_INL {
          if constexpr (kZeroBound) return pol.apply_finite_zero(x, p);
          else return pol.apply_finite(x, p);
        });
      }
    }
    each([&](F x, const auto& p) MXOPS_LAMBDA_INL { return pol.apply_fast(x, p); });
  }

  // rows(apply) with apply(x, c) the element function of `form` for vector c's parameters.
  template <class Rows>
  static MXOPS_VINL void rows_in_form(const Pol& pol, FastForm form, const typename Pol::Fast* prm,
                                      const Rows& rows) {
    in_form(pol, form, [&](const auto& apply) MXOPS_LAMBDA_INL {
      rows([&](F x, int64_t c) MXOPS_LAMBDA_INL { return apply(x, prm[c]); });
    });
  }

  // Column vector c of row j for the second pass of a column walk: from `keep` (column_keys'
  // copy, kKeep) or again from p, the row's first element.
  template <int kCols, bool kKeep>
  static MXOPS_VINL F row_vector(const F* keep, const T* p, int64_t j, int c) {
    if constexpr (kKeep) return keep[j * kCols + c];
    else return load(p + c * W);
  }

  // Rows [0, n) of a tile without sub-blocks, kCols column vectors at a time: their block
  // maxima, their parameters, then their rows, so the parameters stay in registers (the
  // row-wise walk of whole_block_rows reloads every vector's parameters from the stack: about
  // twice the instructions per element on in-cache tensors). Two columns of float32 share a
  // cache line, so each line is fetched once per pass. kN > 0: n, fixed at compile time for
  // the block sizes of the built-in formats, so the loops over the rows unroll.
  template <int64_t kN, int kCols, bool kKeep = false>
  MXOPS_VINL void column_blocks(const Pol& pol, const T* col, T* out, int64_t n_rows,
                                int64_t inner) const {
    static_assert(!kKeep || kN > 0, "kept rows need n fixed at compile time");
    const int64_t n = kN > 0 ? kN : n_rows;
    constexpr int kPlain = Pol::kPlain;
    K k[kCols];
    I a[kCols], bmin[kCols], s[kCols];
    F keep[kKeep ? kN * kCols : 1];
    // The plain form's policies take the greatest magnitudes (3 operations per vector for
    // MXINT8 and BFP, 2 for the MX float formats, where the keys take 5 and 4). Where a column
    // holds Inf or NaN (rare), its exponent needs the keys, the maximum over finite elements
    // only: a second read of the rows. Kept rows take the keys: with the magnitudes they
    // measured 5-10 % slower (MXINT8 at 2 KiB strides, BFP16 at 4 KiB; one thread).
    bool finite = false;
    if constexpr (kPlain > 0 && !kKeep) {
      column_magnitudes<kCols>(col, n, inner, a, bmin);
      finite = true;
      for (int c = 0; c < kCols; ++c) finite = finite && L::all(magnitude_finite(a[c]));
      if (finite)
        for (int c = 0; c < kCols; ++c) s[c] = pol.exponent_of_magnitude(a[c]);
      else
        column_keys<kCols, false, false>(pol, col, n, inner, k, nullptr, nullptr);
    } else {
      // (the keys path: with_fast_form below takes no magnitudes, so no minima either)
      column_keys<kCols, kKeep, false>(pol, col, n, inner, k, nullptr, nullptr, keep);
    }
    if (!finite)
      for (int c = 0; c < kCols; ++c) s[c] = pol.exponent(k[c]);
    auto in = [&](const T* p, int64_t j, int c) { return row_vector<kCols, kKeep>(keep, p, j, c); };
    // The second pass reads the rows again (from L1): keeping the first pass's vectors in
    // registers instead spills them on AVX2's 16 registers.
    __asm__ volatile("" ::: "memory");
    bool fast = true;
    for (int c = 0; c < kCols; ++c) fast = fast && pol.fast(s[c]);
    if (fast) {
      typename Pol::Fast prm[kCols];
      for (int c = 0; c < kCols; ++c) prm[c] = pol.fast_params(s[c], s[c]);
      // The plain form where the magnitudes showed every block finite; blocks with Inf or NaN
      // and kept rows (whose first pass takes the keys) take apply_fast. (The kept rows of the
      // vector walks come here only for a tile's last odd vector and for column pairs that
      // refuse the fast form or hold Inf or NaN: column_pairs_pipelined.)
      with_fast_form(pol, prm, kCols, finite ? a : nullptr, bmin, [&](const auto& apply) {
        const T* p = col;
        T* q = out;
#pragma GCC unroll 4
        for (int64_t j = 0; j < n; ++j, p += inner, q += inner)
          for (int c = 0; c < kCols; ++c) store(q + c * W, apply(in(p, j, c), c));
      });
    } else {
      for (int c = 0; c < kCols; ++c) {
        const Params prm = pol.params(s[c], s[c]);
        for (int64_t j = 0; j < n; ++j)
          store(out + j * inner + c * W, pol.apply(load(col + j * inner + c * W), prm));
      }
    }
  }

  // column_blocks for the sub-blocks of to_bfp_prime: the block maxima of kCols column
  // vectors, then their sub-blocks of `sub` rows in order, each sub-block's maximum and
  // parameters from the rows it reads.
  template <int64_t kN, int kCols, bool kKeep = false>
  MXOPS_VINL void column_sub_blocks(const Pol& pol, const T* col, T* out, int64_t n_rows,
                                    int64_t inner, int64_t sub) const {
    static_assert(!kKeep || kN > 0, "kept rows need n fixed at compile time");
    const int64_t n = kN > 0 ? kN : n_rows;
    K k[kCols], kmin[kCols];
    I bmin[kCols];
    F keep[kKeep ? kN * kCols : 1];
    column_keys<kCols, kKeep>(pol, col, n, inner, k, kmin, bmin, keep);  // (to_bfp_prime: no plain form)
    auto in = [&](const T* p, int64_t j, int c) { return row_vector<kCols, kKeep>(keep, p, j, c); };
    __asm__ volatile("" ::: "memory");  // (as in column_blocks)
    I s[kCols];
    bool fast = true, normal = true;
    for (int c = 0; c < kCols; ++c) {
      s[c] = pol.exponent(k[c]);
      fast = fast && pol.fast(s[c]);
      normal = normal && pol.normal(s[c]);
    }
    if (fast && normal && sub == 2) {
      const T* p = col;
      T* q = out;
      int64_t j = 0;
#pragma GCC unroll 2
      for (; j + 2 <= n; j += 2, p += 2 * inner, q += 2 * inner)
        for (int c = 0; c < kCols; ++c) {
          const F x0 = in(p, j, c), x1 = in(p + inner, j + 1, c);
          const I sm = pol.exponent(imax(pol.key(x0), pol.key(x1)));
          store(q + c * W, pol.apply_normal(x0, s[c], sm));
          store(q + inner + c * W, pol.apply_normal(x1, s[c], sm));
        }
      // An odd n's last row is a sub-block of its own (the 3 channels of an image's pixel; the
      // walker alone on 1- and 3-channel inputs in cache, MX9 / MX6: 54 us where the loop
      // below over each column's sub-blocks took 74-75).
      if (j < n)
        for (int c = 0; c < kCols; ++c) {
          const F x0 = in(p, j, c);
          store(q + c * W, pol.apply_normal(x0, s[c], pol.exponent(pol.key(x0))));
        }
      return;
    }
    for (int c = 0; c < kCols; ++c)
      for (int64_t a = 0; a < n; a += sub) {
        const int64_t len = min64(sub, n - a);
        const T* const rows = col + a * inner;
        T* const outs = out + a * inner + c * W;
        K km = pol.key(in(rows, a, c));
        for (int64_t j = 1; j < len; ++j) km = imax(km, pol.key(in(rows + j * inner, a + j, c)));
        const I sm = pol.exponent(km);
        if (fast) {
          const auto prm = pol.fast_params(s[c], sm);
          for (int64_t j = 0; j < len; ++j) store(outs + j * inner, pol.apply_fast(in(rows + j * inner, a + j, c), prm));
        } else {
          const Params prm = pol.params(s[c], sm);
          for (int64_t j = 0; j < len; ++j) store(outs + j * inner, pol.apply(in(rows + j * inner, a + j, c), prm));
        }
      }
  }

  // column_blocks over the nv column vectors of a tile, two at a time, for the plain form's
  // policies (Pol::kPlain > 0), software-pipelined: the first pass of the next two vectors
  // (their greatest magnitudes, read from L2) runs inside the second pass of these two (their
  // rows again, from L1, and the stores), so that the misses of both overlap instead of
  // alternating. kKeep (n fixed at compile time): the first pass copies the rows into a local
  // buffer, one per pair in flight, which the second pass reads (see column_walk). Two vectors
  // whose blocks hold Inf or NaN or refuse the fast form take column_blocks. Measured on the
  // classifier's NCHW activation shapes (Zen 4, one thread, the walker called directly, xNeg):
  // MXINT8 0.53-0.65 -> 0.73-0.91 with AVX-512 and 0.52-0.73 -> 0.56-0.82 with AVX2; BFP16
  // 0.48-0.63 -> 0.51-0.77; MXFP8E4M3 0.39-0.67 -> 0.45-0.64. Kept rows (rows 2 KiB apart,
  // AVX-512): MXINT8 [512, 512] 0.41 -> 0.52, BFP16 0.49 -> 0.57, MXFP8E4M3 0.45 -> 0.51.
  // (Four vectors at a time measured slower; so did the same pipelining of the sub-block walk,
  // whose second pass is bound by its arithmetic.)
  template <int64_t kN, bool kKeep>
  MXOPS_VINL void column_pairs_pipelined(const Pol& pol, const T* px, T* py, int64_t n_rows,
                                         int64_t inner, int64_t nv) const {
    static_assert(Pol::kPlain > 0, "the plain form's policies");
    static_assert(!kKeep || kN > 0, "kept rows need n fixed at compile time");
    constexpr int kCols = 2;
    const int64_t n = kN > 0 ? kN : n_rows;
    F keep[kKeep ? 2 : 1][kKeep ? kN * kCols : 1];
    // Row j of the first pass of the two vectors at p (column_magnitudes' row): into their
    // greatest magnitudes am and least bit patterns bm, and (kKeep) into kp.
    auto first_row = [&](const T* p, int64_t j, F* kp, I* am, I* bm) {
      if constexpr (kKeep) magnitudes_row<true>(p, kCols, am, bm, kp + j * kCols);
      else magnitudes_row(p, kCols, am, bm);
    };
    auto first_pass = [&](const T* p, F* kp, I* am, I* bm) {
      magnitudes_start(kCols, am, bm);
#pragma GCC unroll 2
      for (int64_t j = 0; j < n; ++j, p += inner) first_row(p, j, kp, am, bm);
    };
    I a[kCols], bmin[kCols];  // the first pass of the two vectors at v
    int cur = 0;              // (kKeep) their rows' buffer
    int64_t v = 0;
    if (nv >= kCols) first_pass(px, keep[0], a, bmin);
    for (; v + kCols <= nv; v += kCols, cur = kKeep ? 1 - cur : 0) {
      const T* const col = px + v * W;
      T* const out = py + v * W;
      const T* const next_col = v + 2 * kCols <= nv ? col + kCols * W : nullptr;
      F* const next_keep = keep[kKeep ? 1 - cur : 0];
      I next_a[kCols], next_bmin[kCols];
      I s[kCols];
      for (int c = 0; c < kCols; ++c) s[c] = pol.exponent_of_magnitude(a[c]);
      auto usable = fast_usable(pol, a[0], s[0]);
      for (int c = 1; c < kCols; ++c) usable = usable & fast_usable(pol, a[c], s[c]);
      if (!L::all(usable)) {
        column_blocks<kN, kCols, kKeep>(pol, col, out, n, inner);
        if (next_col) first_pass(next_col, next_keep, next_a, next_bmin);
      } else {
        typename Pol::Fast prm[kCols];
        for (int c = 0; c < kCols; ++c) prm[c] = pol.fast_params(s[c], s[c]);
        // The rows of these two vectors through apply(x, c), and the next two's first pass.
        auto rows = [&](auto apply) {
          const T* p = col;
          T* q = out;
          auto second_row = [&](int64_t j) {
            for (int c = 0; c < kCols; ++c)
              store(q + c * W, apply(row_vector<kCols, kKeep>(keep[cur], p, j, c), c));
          };
          if (!next_col) {
#pragma GCC unroll 4
            for (int64_t j = 0; j < n; ++j, p += inner, q += inner) second_row(j);
            return;
          }
          magnitudes_start(kCols, next_a, next_bmin);
          const T* pn = next_col;
#pragma GCC unroll 4
          for (int64_t j = 0; j < n; ++j, p += inner, q += inner, pn += inner) {
            first_row(pn, j, next_keep, next_a, next_bmin);
            second_row(j);
          }
        };
        with_fast_form(pol, prm, kCols, a, bmin, rows);
      }
      for (int c = 0; c < kCols; ++c) a[c] = next_a[c];
      if constexpr (Pol::kPlain > 1)
        for (int c = 0; c < kCols; ++c) bmin[c] = next_bmin[c];
    }
    if (v < nv) column_blocks<kN, 1, kKeep>(pol, px + v * W, py + v * W, n, inner);
  }

  template <int64_t kN, bool kKeep = false>
  MXOPS_VINL void column_tile(const Pol& pol, const T* px, T* py, int64_t n, int64_t inner,
                              int64_t nv) const {
    int64_t v = 0;
    if constexpr (Pol::kSubBlocks) {
      for (; v + 2 <= nv; v += 2) column_sub_blocks<kN, 2, kKeep>(pol, px + v * W, py + v * W, n, inner, sub);
      if (v < nv) column_sub_blocks<kN, 1, kKeep>(pol, px + v * W, py + v * W, n, inner, sub);
    } else if constexpr (Pol::kPlain > 0 && W > 1 && (!kKeep || kN > 0)) {
      column_pairs_pipelined<kN, kKeep>(pol, px, py, n, inner, nv);
    } else {
      for (; v + 2 <= nv; v += 2) column_blocks<kN, 2, kKeep>(pol, px + v * W, py + v * W, n, inner);
      if (v < nv) column_blocks<kN, 1, kKeep>(pol, px + v * W, py + v * W, n, inner);
    }
  }

  // Blocked axis outer: the block of `n` rows `inner` apart from `base`, over `cols`
  // neighbouring columns, W columns per vector, rows read in order; the columns left over by
  // the scalar walker.
  void strided_tile(int64_t base, int64_t n, int64_t cols) const {
    const Pol pol = this->pol;
    const T* const px = x + base;
    T* const py = y + base;
    const int64_t inner = this->inner;
    const int64_t nv = cols / W;
    ColumnWalk walk = ColumnWalk::kTile;
    if constexpr (!Stream) walk = column_walk(n, inner, x, y);
    if (walk == ColumnWalk::kKeptTile && nv == kTileVectors) {
      if constexpr (kKeptTiles) {
        if (n == 16) kept_tile_walk<16>(px, py, base % inner);
        else kept_tile_walk<32>(px, py, base % inner);
      }
    } else if (walk == ColumnWalk::kTile || walk == ColumnWalk::kKeptTile) {
      tile_walk<0>(pol, px, py, n, nv, base % inner);
    } else {
      prefetch_next_tile(px, py, n, inner, cols, base % inner);
      if (walk == ColumnWalk::kKeptColumns) {
        switch (n) {
          case 8: column_tile<8, true>(pol, px, py, n, inner, nv); break;
          case 16: column_tile<16, true>(pol, px, py, n, inner, nv); break;
          default: column_tile<32, true>(pol, px, py, n, inner, nv); break;
        }
      } else {
        switch (n) {
          case 8: column_tile<8>(pol, px, py, n, inner, nv); break;
          case 16: column_tile<16>(pol, px, py, n, inner, nv); break;
          case 32: column_tile<32>(pol, px, py, n, inner, nv); break;
          default: column_tile<0>(pol, px, py, n, inner, nv); break;
        }
      }
    }
    if constexpr (W > 1)
      if (nv * W < cols) last_columns(base + nv * W, n, cols - nv * W, nv);
  }

  // The last `cols` < W columns of the block of `n` rows from base, after `nv` whole column
  // vectors of the same tile (strided_tile, the row walk). With at least one before them and
  // the output apart from the input: the vector walk of the W columns that end with them,
  // which walks the last W - cols columns before them again. Each column's blocks are its
  // own, so those are the same results stored again (not in place, where their input is
  // already overwritten). Else the scalar walker, which took every such column before: on
  // the OCR recognizer's [1, 480, 1, 40] (the last 8 of 40 columns), the whole walk took MX9
  // 2.4x and MXINT8 2.1x its time now (Xeon model 167, AVX-512, the walker called directly).
  void last_columns(int64_t base, int64_t n, int64_t cols, int64_t nv) const {
    if constexpr (W > 1 && !Stream) {  // (streamed outputs have no such columns: stream_supported)
      if (nv > 0 && static_cast<const void*>(x) != static_cast<const void*>(y)) {
        strided_tile(base + cols - W, n, W);
        return;
      }
    }
    scalar().strided_tile(base, n, cols);
  }

  // tile_walk of a full tile of kN rows with the kept rows (ColumnWalk::kKeptTile), in a
  // function of its own: its local buffer (16 KiB) stays out of strided_tile's frame.
  template <int64_t kN>
  void kept_tile_walk(const T* px, T* py, int64_t column) const {
    const Pol pol = this->pol;
    tile_walk<kN>(pol, px, py, kN, kTileVectors, column);
  }

  // The tile walk of strided_tile over the nv column vectors from px: the block maxima of
  // every vector (down the n rows, rows in order), then the rows again, each element.
  // kKeep > 0 (ColumnWalk::kKeptTile, a full tile of kKeep rows): the first pass also copies
  // the rows into a local buffer, which the second pass reads instead of px. `column`: px's
  // column in its row (for prefetch_next_tile).
  template <int64_t kKeep>
  MXOPS_VINL void tile_walk(const Pol& pol, const T* px, T* py, int64_t n, int64_t nv,
                            int64_t column) const {
    const int64_t inner = this->inner, sub = this->sub;
    alignas(64) F keep[kKeep > 0 ? kKeep * kTileVectors : 1];
    const T* const src = kKeep > 0 ? reinterpret_cast<const T*>(keep) : px;
    const int64_t src_inner = kKeep > 0 ? kTileColumns : inner;
    K k[kTileVectors];
    I s[kTileVectors] = {};  // (initialised: GCC cannot see that s[v < nv] is always set)
    I a[kTileVectors], bmin[kTileVectors];
    bool finite = false;  // as in column_blocks: magnitudes first for the plain form's policies
    // kPlain > 1, a full tile of 16 rows or more out of place in an input of kStreamBytes or
    // more: the least bit patterns in the second pass (whole_block_rows<true>).
    constexpr bool kAfter = Pol::kPlain > 1 && kKeep == 0;
    const bool after = kAfter && nv == kTileVectors && n >= 16 && takes_min_after(px, py);
    if constexpr (Pol::kPlain > 0) {
      // A full tile's vector count fixed at compile time: the loop over the vectors unrolls
      // and the maxima stay in registers instead of a load and a store per vector and row
      // (16 Mi elements, blocked axis outer, streaming: MXINT8 0.78 -> 0.87x Neg with AVX2,
      // 0.73 -> 0.79 with AVX-512, together with full-tile rows in whole_block_rows; Zen 4).
      if constexpr (kKeep > 0) {
        column_magnitudes<kTileVectors, true>(px, kKeep, inner, a, bmin, kTileVectors, keep);
      } else if (after) {
        column_magnitudes<kTileVectors, false, false, !kAfter>(px, n, inner, a, bmin);
      } else if (nv == kTileVectors) {
        column_magnitudes<kTileVectors>(px, n, inner, a, bmin);
      } else {
        column_magnitudes<0>(px, n, inner, a, bmin, nv);
      }
      finite = true;
      for (int64_t v = 0; v < nv; ++v) finite = finite && L::all(magnitude_finite(a[v]));
      if (finite)
        for (int64_t v = 0; v < nv; ++v) s[v] = pol.exponent_of_magnitude(a[v]);
    } else if constexpr (kKeep > 0) {
      column_keys<kTileVectors, true, false>(pol, px, kKeep, inner, k, nullptr, nullptr, keep);
    }
    if (!finite) {
      // (the kept tile's policies without a plain form have their keys from the first pass)
      if constexpr (Pol::kPlain > 0 || kKeep == 0) {
        if (nv == kTileVectors) column_max<kTileVectors>(pol, src, n, src_inner, nv, k);
        else column_max(pol, src, n, src_inner, nv, k);
      }
      for (int64_t v = 0; v < nv; ++v) s[v] = pol.exponent(k[v]);
    }
    prefetch_next_tile(px, py, n, inner, nv * W, column);
    if constexpr (Pol::kSubBlocks) {
      bool fast = true, normal = true;
      for (int64_t v = 0; v < nv; ++v) fast = fast && pol.fast(s[v]);
      for (int64_t v = 0; v < nv; ++v) normal = normal && pol.normal(s[v]);
      if (fast && normal && sub == 2) tile_sub_blocks<2, true, true>(pol, src, src_inner, py, n, sub, inner, nv, s);
      else if (fast && sub == 2) tile_sub_blocks<2, true>(pol, src, src_inner, py, n, sub, inner, nv, s);
      else if (fast) tile_sub_blocks<0, true>(pol, src, src_inner, py, n, sub, inner, nv, s);
      else tile_sub_blocks<0, false>(pol, src, src_inner, py, n, sub, inner, nv, s);
    } else {
      if constexpr (kAfter) {
        if (after && finite) return whole_block_rows<true>(pol, px, inner, py, n, inner, kTileVectors, s, a);
      }
      whole_block_rows(pol, src, src_inner, py, n, inner, nv, s, finite ? a : nullptr, bmin);
    }
  }

  // ---------------------------------------------------------------------------------------
  // Blocked axis outer, rows a multiple of 2 or 4 KiB apart (plan_units): a unit is a
  // block of n rows across up to kRowColumns columns, and both passes read its rows in order,
  // each from its start to its end, where the tile and column walks read a few vectors of
  // each row at a time. Rows a multiple of 2 KiB apart put those lines into one or two L1
  // sets, and a tile's n rows of 512 bytes are n streams for the hardware prefetchers; a
  // whole block of rows in order is one. The parameters of every column vector are computed
  // once, between the passes, into an array the second pass reads, four rows at a time for
  // the plain form's policies. Measured on the AVX2 development machine (Zen 3;
  // ort-mx-bench, 2 threads, xNeg, against the column and tile walks in the same run):
  // float32 [512, 512] 0.55-0.64 -> 0.74-0.80, [1024, 1024] 0.55-0.68 -> 0.71-0.75; 16-bit
  // types 1-30 % faster at 4 and 8 KiB. Not for blocks of 8 rows (BFP16 [1024, 1024], the
  // walker called directly, one thread: 0.69 -> 0.49; its parameters serve 8 rows only) nor
  // for policies without the plain form or sub-blocks
  // (the other roundings: their tile walk per 128 columns of the unit).
  // ---------------------------------------------------------------------------------------

  static constexpr int64_t kRowVectors = kRowColumns / W;
  static constexpr int64_t kRowSegments = kRowVectors / kTileVectors;
  // How the second pass of row_walk takes a segment (kTileVectors column vectors): the plain
  // form without or with its clamp, the fast form, to_bfp_prime's sub-blocks in their fast
  // form (normal: no flush), or the tile walk (blocks with Inf or NaN, or outside the fast form).
  enum class RowForm : uint8_t {
    kUnclamped = uint8_t(FastForm::kUnclamped),
    kPlain = uint8_t(FastForm::kPlain),
    kFast = uint8_t(FastForm::kFast),
    kFiniteUnclamped = uint8_t(FastForm::kFiniteUnclamped),
    kFinite = uint8_t(FastForm::kFinite),
    kSubNormal,
    kSub,
    kTile
  };
  static constexpr bool kRowWalk = !Stream && W > 1 && (Pol::kPlain > 0 || Pol::kSubBlocks);

  // The first pass of row_walk over n rows `inner` apart from p: fold(v, xv) for column
  // vector v of four rows at a time, xv[0..4) (the last rows of an n not a multiple of four
  // repeat the last row), so a column's running maximum is read and written once per four
  // rows; rows in order.
  template <class Fold>
  MXOPS_VINL void rows_of_four(const T* p, int64_t n, int64_t nv, const Fold& fold) const {
    for (int64_t j = 0; j < n; j += 4) {
      const T* r[4];
      for (int i = 0; i < 4; ++i) r[i] = p + min64(j + i, n - 1) * inner;
      for (int64_t v = 0; v < nv; ++v) {
        const F xv[4] = {load(r[0] + v * W), load(r[1] + v * W), load(r[2] + v * W), load(r[3] + v * W)};
        fold(v, xv);
      }
    }
  }

  // n rows of the nv column vectors from px (nv <= kRowVectors): the first pass's greatest
  // magnitudes (plain form) or keys, each segment's form and parameters, then the rows.
  void row_walk(int64_t base, int64_t n, int64_t nv) const {
    const Pol pol = this->pol;
    const T* const px = x + base;
    T* const py = y + base;
    const int64_t inner = this->inner;
    const int64_t segments = (nv + kTileVectors - 1) / kTileVectors;
    alignas(64) I s[kRowVectors];
    alignas(64) typename Pol::Fast prm[Pol::kPlain > 0 ? kRowVectors : 1];
    RowForm form[kRowSegments];
    auto seg_end = [&](int64_t g) { return min64(nv, (g + 1) * kTileVectors); };
    if constexpr (Pol::kPlain > 0) {
      alignas(64) I a[kRowVectors], bmin[kRowVectors];
      magnitudes_start(nv, a, bmin);
      rows_of_four(px, n, nv, [&](int64_t v, const F* xv) {
        I m = magnitude_bits(xv[0]), b = as_int(f2u(xv[0]));
        for (int r = 1; r < 4; ++r) {
          m = imax(m, magnitude_bits(xv[r]));
          if constexpr (Pol::kPlain > 1) b = imin(b, as_int(f2u(xv[r])));
        }
        a[v] = imax(a[v], m);
        if constexpr (Pol::kPlain > 1) bmin[v] = imin(bmin[v], b);
      });
      for (int64_t g = 0; g < segments; ++g) {
        const int64_t v0 = g * kTileVectors, v1 = seg_end(g);
        bool usable = true;
        for (int64_t v = v0; v < v1; ++v) {
          s[v] = pol.exponent_of_magnitude(a[v]);
          usable = usable && L::all(fast_usable(pol, a[v], s[v]));
        }
        if (!usable) {
          form[g] = RowForm::kTile;
          continue;
        }
        FastFormTally tally;
        for (int64_t v = v0; v < v1; ++v) {
          prm[v] = pol.fast_params(s[v], s[v]);
          tally.add(pol, prm[v], a[v], bmin[v]);
        }
        form[g] = RowForm(tally.form());
      }
    } else {
      alignas(64) K k[kRowVectors];
      for (int64_t v = 0; v < nv; ++v) k[v] = K{};  // (every key is at least 0)
      rows_of_four(px, n, nv, [&](int64_t v, const F* xv) {
        K m = pol.key(xv[0]);
        for (int r = 1; r < 4; ++r) m = imax(m, pol.key(xv[r]));
        k[v] = imax(k[v], m);
      });
      for (int64_t g = 0; g < segments; ++g) {
        bool fast = sub == 2, normal = true;
        for (int64_t v = g * kTileVectors; v < seg_end(g); ++v) {
          s[v] = pol.exponent(k[v]);
          fast = fast && pol.fast(s[v]);
          normal = normal && pol.normal(s[v]);
        }
        form[g] = !fast ? RowForm::kTile : normal ? RowForm::kSubNormal : RowForm::kSub;
      }
    }
    for (int64_t g = 0; g < segments; ++g)
      if (form[g] == RowForm::kTile)
        tile_walk<0>(pol, px + g * kTileColumns, py + g * kTileColumns, n, seg_end(g) - g * kTileVectors,
                     base % inner + g * kTileColumns);
    // The second pass, each segment in its form: the plain form's policies four rows at a time,
    // so that four rows share each column vector's parameters, loaded once where a row at a
    // time loaded them for every vector (the walker harness, one thread, MXINT8 / MXFP8E4M3 /
    // MXFP4E2M1 at [512, 512], [1024, 1024], [256, 1024]: 0.77-0.92x the time; eight rows 4 KiB
    // apart, with their eight output rows, overflow an 8-way L1 set: 1.17x); to_bfp_prime a
    // sub-block's two rows at a time.
    if constexpr (Pol::kPlain > 0) {
      for (int64_t j = 0; j < n; j += 4) {
        const T* r[4];
        T* o[4];
        for (int i = 0; i < 4; ++i) {
          const int64_t row = min64(j + i, n - 1);  // (past n: the last row again, the same bits)
          r[i] = px + row * inner;
          o[i] = py + row * inner;
        }
        for (int64_t g = 0; g < segments; ++g) {
          if (form[g] == RowForm::kTile) continue;
          rows_in_form(pol, FastForm(form[g]), prm, [&](auto apply) {
            for (int64_t v = g * kTileVectors; v < seg_end(g); ++v) {
              F q[4];  // (all four loaded before any store: in place, a repeated row reads its input)
              for (int i = 0; i < 4; ++i) q[i] = apply(load(r[i] + v * W), v);
              for (int i = 0; i < 4; ++i) store(o[i] + v * W, q[i]);
            }
          });
        }
      }
    } else if constexpr (Pol::kSubBlocks) {
      for (int64_t j = 0; j < n; j += 2) {
        const T* const row = px + j * inner;
        T* const out = py + j * inner;
        for (int64_t g = 0; g < segments; ++g) {
          const int64_t v0 = g * kTileVectors, v1 = seg_end(g);
          if (form[g] == RowForm::kSubNormal)
            tile_sub_blocks<2, true, true>(pol, row + v0 * W, inner, out + v0 * W, min64(2, n - j), 2, inner,
                                           v1 - v0, s + v0);
          else if (form[g] == RowForm::kSub)
            tile_sub_blocks<2, true>(pol, row + v0 * W, inner, out + v0 * W, min64(2, n - j), 2, inner,
                                     v1 - v0, s + v0);
        }
      }
    }
  }

  // ---------------------------------------------------------------------------------------
  // The NCHWc view (lanes > 1): a block is `n` rows x `lanes` aligned columns. The maxima run
  // down the rows per column, then over each aligned group of `lanes` columns; sub-blocks of
  // to_bfp_prime are `sub` adjacent columns of one row (sub <= lanes) or sub / lanes rows of
  // whole groups (sub a multiple of lanes).
  // ---------------------------------------------------------------------------------------

  // k[0..nv): the maximum over each aligned group of `group` columns (a power of two), in
  // every column of the group. Groups of up to W columns lie in one vector; a longer group
  // is group / W whole vectors (nv and the tile's start are multiples of it).
  static MXOPS_VINL void column_groups_max(K* k, int64_t nv, int64_t group) {
    if (group <= W) {
      const int steps = log2_exact(group);
      for (int64_t v = 0; v < nv; ++v) k[v] = L::group_max(k[v], steps);
      return;
    }
    const int64_t per = group / W;
    const int all_steps = log2_exact(W);
    for (int64_t v0 = 0; v0 < nv; v0 += per) {
      K m = k[v0];
      for (int64_t i = 1; i < per; ++i) m = imax(m, k[v0 + i]);
      m = L::group_max(m, all_steps);
      for (int64_t i = 0; i < per; ++i) k[v0 + i] = m;
    }
  }

  // Every 32-bit lane vector of a parameter struct (numerics.h's parameter structs hold only
  // such vectors) broadcast: lane i in every lane (L::broadcast_lane), or for kPair (16 lanes)
  // lane 2i in lanes 0-7 and lane 2i + 1 in lanes 8-15 (L::broadcast_pair).
  template <bool kPair, class P>
  static MXOPS_VINL P broadcast_params(const P& p, int i) {
    static_assert(std::is_trivially_copyable_v<P> && sizeof(P) % sizeof(K) == 0,
                  "parameters must be lane vectors");
    K v[sizeof(P) / sizeof(K)];
    std::memcpy(v, &p, sizeof(P));
    for (auto& e : v) {
      if constexpr (kPair) e = L::broadcast_pair(e, i);
      else e = L::broadcast_lane(e, i);
    }
    P out;
    std::memcpy(&out, v, sizeof(P));
    return out;
  }
  template <class P>
  static MXOPS_VINL P broadcast_lane(const P& p, int i) {
    return broadcast_params<false>(p, i);
  }

  // A parameter struct's lanes in memory: at(i) is broadcast_lane(p, i), each vector of it a
  // broadcast load (a load port) where broadcast_lane takes a shuffle. The span walks' second
  // passes (plain_second, sub_second) take their blocks' parameters this way, in loops over
  // the blocks two at a time (a smaller loop than the unrolled one with shuffles).
  template <class P>
  struct LanesInMemory {
    // (as broadcast_params: the memcpy below fills `lanes` exactly, with no bytes left over)
    static_assert(std::is_trivially_copyable_v<P> && sizeof(P) % sizeof(K) == 0,
                  "parameters must be lane vectors");
    static constexpr int kVectors = sizeof(P) / sizeof(K);
    alignas(64) int32_t lanes[kVectors * W];
    explicit MXOPS_VINL LanesInMemory(const P& p) {
      std::memcpy(lanes, &p, sizeof(P));
      __asm__ volatile("" : "+m"(lanes));  // (each vector a broadcast load, not a shuffle)
    }
    MXOPS_VINL P at(int i) const {
      K v[kVectors];
      for (int e = 0; e < kVectors; ++e) v[e] = splat<K>(static_cast<uint32_t>(lanes[e * W + i]));
      P out;
      std::memcpy(&out, v, sizeof(P));
      return out;
    }
  };

  // lanes == W (every row vector is one pixel's W channels of a channel group) and no
  // sub-blocks: up to W pixels at once. Each pixel's column of n row vectors gives its block
  // maximum (in lane i for pixel i of one vector), so the parameters of W pixels are computed
  // once and broadcast to each pixel's vectors; then each pixel's rows, in the plain form
  // where the whole group allows it (the conservative test that needs no parameters, as its
  // minima run over all W pixels).
  // kN > 0: n and kCnt > 0: cnt fixed at compile time (the rows and pixels unroll).
  template <int64_t kN, int kCnt>
  MXOPS_VINL void pixel_group(const Pol& pol, const T* px, T* py, int64_t n_rows, int64_t inner,
                              int cnt_rt) const {
    constexpr int kPlain = Pol::kPlain;
    const int64_t n = kN > 0 ? kN : n_rows;
    const int cnt = kCnt > 0 ? kCnt : cnt_rt;
    K kk{}, kmin{};
    I bmin{};
    // (n fixed at compile time: the quotients kept, pixel i's row j in kept[i * kN + j])
    constexpr bool kKeep = kKeepQuotients && kN > 0;
    Quotients<kN * W> kept;
#pragma GCC unroll 16
    for (int i = 0; i < cnt; ++i) {
      K k, km;
      I bm;
      column_keys<1, kKeep>(pol, px + i * W, n, inner, &k, &km, &bm, kKeep ? kept + i * kN : nullptr);
      if constexpr (kPlain > 0) kmin = i == 0 ? km : imin(kmin, km);
      if constexpr (kPlain > 1) bmin = i == 0 ? bm : imin(bmin, bm);
      k = L::group_max(k, log2_exact(W));
      kk = i == 0 ? k : L::blend_lane(kk, k, i);  // lanes past cnt keep the first pixel's maximum
    }
    __asm__ volatile("" ::: "memory");  // (as in column_blocks)
    const I s = pol.exponent(kk);
    if (!pol.fast(s)) {
      pixel_rows<kN, kCnt>(px, py, n, inner, cnt, pol.params(s, s),
                           [&](F xv, const auto& pi) { return pol.apply(xv, pi); }, kept);
      return;
    }
    const auto prm = pol.fast_params(s, s);
    bool plain = false;  // (no maxima of magnitudes here: the clamp stays)
    if constexpr (kPlain > 0) plain = pol.plain_any(kmin, bmin);
    in_form(pol, finite_form(false, plain, false), [&](auto apply) MXOPS_LAMBDA_INL {
      pixel_rows<kN, kCnt>(px, py, n, inner, cnt, prm, apply, kept);
    });
  }

  // The rows of cnt pixels from px (pixel i's W channels at px + i * W, its n rows `inner`
  // apart), each element through apply(x, pixel i's parameters: lane i of prm in every lane).
  // kN > 0: n and kCnt > 0: cnt fixed at compile time, and (kKeepQuotients, kept not null)
  // pixel i's row j read from kept[i * kN + j].
  template <int64_t kN, int kCnt, class P, class Apply>
  MXOPS_VINL void pixel_rows(const T* px, T* py, int64_t n_rows, int64_t inner, int cnt_rt,
                             const P& prm, Apply apply, [[maybe_unused]] const F* kept) const {
    const int cnt = kCnt > 0 ? kCnt : cnt_rt;
    if constexpr (kN > 0) {
      const T* xr[kN];
      T* yr[kN];
      row_pointers<kN>(xr, px, inner);
      row_pointers<kN>(yr, py, inner);
#pragma GCC unroll 16
      for (int i = 0; i < cnt; ++i) {
        const P pi = broadcast_lane(prm, pinned_lane(i));
#pragma GCC unroll 4
        for (int64_t j = 0; j < kN; ++j)
          store(yr[j] + i * W, apply(quotient_or_load(kept, i * kN + j, xr[j] + i * W), pi));
      }
    } else {
#pragma GCC unroll 16
      for (int i = 0; i < cnt; ++i) {
        const P pi = broadcast_lane(prm, i);
        const T* col = px + i * W;
        T* out = py + i * W;
#pragma GCC unroll 4
        for (int64_t j = 0; j < n_rows; ++j, col += inner, out += inner) store(out, apply(load(col), pi));
      }
    }
  }

  // i, through an empty volatile asm where the AVX-512 walker broadcasts a DirectRound's
  // parameters (Pol::kPlain > 1: MXINT8, and to_bfp with blocks of W channels) to each of W
  // pixels: otherwise GCC computed all W pixels' broadcasts (four vectors each) before the
  // branch between the forms, kept the results on the stack and read them back in each
  // form's loop, a store per vector of the output on a processor whose stores limit a walk
  // in cache. The asm keeps each pixel's broadcasts (an index vector and a permute per
  // parameter that the form reads) next to its rows. Measured on a 2-core Zen 4 (the walker
  // called directly, one thread, in place, Hardswish inputs, the direction classifier's 16
  // NCHWc shapes): MXINT8 0.87x the time; the MXFP formats (MxDirectSigned) ran 2-4 %
  // slower with it, so they keep the constants.
  static MXOPS_VINL int pinned_lane(int i) {
    if constexpr (W == 16 && Pol::kPlain > 1) __asm__ volatile("" : "+r"(i));
    return i;
  }

  // rows[j] = p + j * inner for the kN rows of a group of pixels, so that the unrolled loops
  // address row j's vector i as rows[j] + i * W: a register per row and a constant offset.
  // Computed in the loops as p + i * W + j * inner, GCC kept all kN x W addresses of a group,
  // spilled them to the stack and reloaded one per load or store. Measured on the AVX2
  // development machine (Zen 3, one thread, the walkers called directly on the classifier's
  // 16 NCHWc activation shapes, the old and new walk alternating in one program): MXINT8
  // 10-11 % and MX9 / MX6 / MX4 3-4 % faster, MXFP 0-2 % slower, BFP16 (one-row blocks)
  // unchanged. The first pass of pixel_group_finite keeps column_magnitudes' order: the same
  // row pointers there made MXINT8 3-4 % and, with these, the MXFP formats 10-13 % slower.
  template <int64_t kN, class P>
  static MXOPS_VINL void row_pointers(P* rows, P p, int64_t inner) {
#pragma GCC unroll 4
    for (int64_t j = 0; j < kN; ++j) rows[j] = p + j * inner;
  }

  // pixel_group for W pixels of the plain form's policies (Pol::kPlain > 0) in fewer
  // operations: each pixel's greatest magnitude down its n rows (column_magnitudes: 3
  // operations per vector where the keys take 5), the W pixels' maxima by one transposing
  // reduction (2 (W - 1) shuffles where W group_max calls take W log2(W)), and the plain
  // form's least bit pattern over all W pixels at once (conservative, as in pixel_group).
  // Returns false, having written nothing, where a pixel holds Inf or NaN or the group does
  // not take the fast form; pixel_group then handles it.
  template <int64_t kN>
  MXOPS_VINL bool pixel_group_finite(const Pol& pol, const T* px, T* py, int64_t inner) const {
    static_assert(Pol::kPlain > 0 && W > 1, "the plain form's policies, vector lanes");
    constexpr int kPlain = Pol::kPlain;
    I a[W];
    I bmin = splat<I>(INT32_MAX);
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i) {
      I bm;
      column_magnitudes<1, false, true>(px + i * W, kN, inner, &a[i], &bm);  // (load_raw)
      if constexpr (kPlain > 1) bmin = imin(bmin, bm);
    }
    const I amax = as_loaded_bits(L::transpose_max(a));  // lane i: pixel i's greatest magnitude
    // (as in pixel_group: the second pass loads again; without the barrier GCC kept the first
    // pass's kN x W loaded vectors for it and, more of them than registers, spilled each)
    __asm__ volatile("" ::: "memory");
    if (!L::all(magnitude_finite(amax))) return false;
    const I s = pol.exponent_of_magnitude(amax);
    if (!pol.fast(s)) return false;
    const auto prm = pol.fast_params(s, s);
    // the least bit pattern over every lane, in every lane (~ reverses the order: no overflow)
    if constexpr (kPlain > 1) bmin = as_loaded_bits(~L::group_max(~bmin, log2_exact(W)));
    auto rows = [&](auto apply) { pixel_rows<kN, W>(px, py, kN, inner, W, prm, apply, nullptr); };
    // Where not plain, a -0 or a negative tiny x among the W pixels (Hardswish gives -0 below
    // -3): the plain form with the sign fix-up, without apply_fast's Inf / NaN test.
    in_form(pol, finite_form(true, pol.plain_finite(prm, bmin), pol.unclamped(prm, amax)), rows);
    return true;
  }

  // The whole groups of W pixels among nv column vectors from px, blocks of kRows rows (the
  // plain form's policies); returns the vectors done. A function of its own per row count,
  // not inlined, with the policy by value: inlined together into lanes_tile, the four row
  // counts' loops shared one function's registers, and a policy read through a reference
  // may change with every float stored (MxElement holds floats), so GCC reloaded its fields
  // after each store. 3 rows (the last block of 24, 88, 200, ... channels in AVX2's 8-channel
  // groups) took pixel_group with n and cnt at run time before. Measured with the walkers
  // called directly (AVX2, Zen 3, one thread, the classifier's 16 NCHWc activation shapes,
  // both walks alternating in one program): MXINT8 0.84x the time, MXFP8E4M3 0.90,
  // MXFP4E2M1 0.92; [1, 24, 12, 96] MXINT8 0.64-0.70x.
  // Policies without a plain form (non-default roundings) take pixel_group alone, with the
  // same compile-time row and pixel counts.
  template <int64_t kRows>
  __attribute__((noinline)) int64_t pixel_groups(const Pol pol, const T* px, T* py, int64_t inner,
                                                 int64_t nv) const {
    int64_t v0 = 0;
    for (; v0 + W <= nv; v0 += W) {
      if constexpr (Pol::kPlain > 0)
        if (pixel_group_finite<kRows>(pol, px + v0 * W, py + v0 * W, inner)) continue;
      pixel_group<kRows, W>(pol, px + v0 * W, py + v0 * W, kRows, inner, W);
    }
    return v0;
  }

  // n rows per block: whole groups of W pixels by pixel_groups for n <= 4, the rest (other n,
  // the last nv % W vectors) by pixel_group with n and the pixel count at run time.
  MXOPS_VINL void pixel_blocks(const Pol& pol, const T* px, T* py, int64_t n, int64_t inner,
                               int64_t nv) const {
    int64_t v0 = 0;
    switch (n) {
      case 1: v0 = pixel_groups<1>(pol, px, py, inner, nv); break;
      case 2: v0 = pixel_groups<2>(pol, px, py, inner, nv); break;
      case 3: v0 = pixel_groups<3>(pol, px, py, inner, nv); break;
      case 4: v0 = pixel_groups<4>(pol, px, py, inner, nv); break;
      default: break;
    }
    for (; v0 < nv; v0 += W)
      pixel_group<0, 0>(pol, px + v0 * W, py + v0 * W, n, inner, static_cast<int>(min64(W, nv - v0)));
  }

  // The sub-blocks of to_bfp_prime in the NCHWc view where a block's lanes columns and a
  // sub-block's sub <= lanes columns lie in one vector (lanes <= W): per column vector, its
  // blocks' maxima over the n rows and its groups of lanes, then each row vector's sub-block
  // maxima and its result, all in registers. kN > 0: n fixed at compile time; kSteps >= 0:
  // log2(lanes) and log2(sub) likewise (the lane maxima without branches).
  // Not inlined, the policy by value, as pixel_groups (MX9 on the classifier's NCHWc shapes:
  // 0.97x the time).
  template <int64_t kN, int kBlockSteps, int kSubSteps>
  __attribute__((noinline)) void lanes_column_sub_blocks(const Pol pol, const T* px, T* py,
                                                         int64_t n_rows, int64_t inner,
                                                         int64_t nv) const {
    const int64_t n = kN > 0 ? kN : n_rows;
    const int block_steps = kBlockSteps >= 0 ? kBlockSteps : log2_exact(lanes);
    const int sub_steps = kSubSteps >= 0 ? kSubSteps : log2_exact(sub);
    // The n rows of a column vector with block maxima s (one block per lane group), row j's
    // vector x_at(j) (its value), its result to y_at(j).
    auto rows = [&](auto fast_tag, auto normal_tag, I s, auto x_at, auto y_at) {
      constexpr bool kFast = decltype(fast_tag)::value, kNormal = decltype(normal_tag)::value;
#pragma GCC unroll 4
      for (int64_t j = 0; j < n; ++j) {
        const F xv = x_at(j);
        const I sm = pol.exponent(L::group_max(pol.key(xv), sub_steps));
        if constexpr (kNormal) store(y_at(j), pol.apply_normal(xv, s, sm));
        else if constexpr (kFast) store(y_at(j), pol.apply_fast(xv, pol.fast_params(s, sm)));
        else store(y_at(j), pol.apply(xv, pol.params(s, sm)));
      }
    };
    K k[W], kmin;  // (to_bfp_prime: no plain form, kmin / bmin unused)
    I bmin;
    int64_t v0 = 0;
    // A block per vector (lanes == W): W pixels' maxima in one transposing reduction, the
    // form decided once for all W.
    if constexpr (kBlockSteps == log2_exact(W)) {
      for (; v0 + W <= nv; v0 += W) {
        static_assert(kN > 0, "the W-pixel form is instantiated with n fixed (lanes_tile)");
        const T* xr[kN];
        T* yr[kN];
        row_pointers<kN>(xr, px + v0 * W, inner);
        row_pointers<kN>(yr, py + v0 * W, inner);
        // (Float32Divided: the quotients kept, pixel i's row j in kept[i * kN + j]. Dividing
        // only the first pass's greatest magnitudes instead, as pixel_group_finite does, and
        // each element in the second pass measured the same time for MX9 / MX6 / MX4: AVX-512,
        // Zen 4, the direction classifier's 18 hard-swish shapes in its NCHWc view, 20
        // alternating rounds, ort-mx-bench --kernel --other-native.)
        Quotients<kN * W> kept;
#pragma GCC unroll 4
        for (int64_t j = 0; j < kN; ++j)
#pragma GCC unroll 16
          for (int i = 0; i < W; ++i) {
            const F xv = load(xr[j] + i * W);
            keep_quotient(kept, i * kN + j, xv);
            k[i] = j == 0 ? pol.key(xv) : imax(k[i], pol.key(xv));
          }
        const I s = pol.exponent(L::transpose_max(k));
        auto each = [&](auto fast_tag, auto normal_tag) {
#pragma GCC unroll 16
          for (int i = 0; i < W; ++i)
            rows(fast_tag, normal_tag, L::broadcast_lane(s, i),
                 [&](int64_t j) { return quotient_or_load(kept, i * kN + j, xr[j] + i * W); },
                 [&](int64_t j) { return yr[j] + i * W; });
        };
        if (!pol.fast(s)) each(std::false_type{}, std::false_type{});
        else if (pol.normal(s)) each(std::true_type{}, std::true_type{});
        else each(std::true_type{}, std::false_type{});
      }
    }
    for (int64_t v = v0; v < nv; ++v) {
      const T* const col = px + v * W;
      T* const out = py + v * W;
      column_keys<1>(pol, col, n, inner, &k[0], &kmin, &bmin);
      const I s = pol.exponent(L::group_max(k[0], block_steps));
      auto x_at = [&](int64_t j) { return load(col + j * inner); };
      auto y_at = [&](int64_t j) { return out + j * inner; };
      if (!pol.fast(s)) rows(std::false_type{}, std::false_type{}, s, x_at, y_at);
      else if (pol.normal(s)) rows(std::true_type{}, std::true_type{}, s, x_at, y_at);
      else rows(std::true_type{}, std::false_type{}, s, x_at, y_at);
    }
  }

  // The sub-blocks of lanes_tile's tile with block maxima s[v], `sub_rows` rows x `sub_cols`
  // columns each; Fast / Normal as in tile_sub_blocks.
  template <bool Fast, bool Normal>
  MXOPS_VINL void lanes_sub_blocks(const Pol& pol, const T* px, T* py, int64_t n, int64_t inner,
                                   int64_t nv, const I* s, int64_t sub_rows,
                                   int64_t sub_cols) const {
    auto one = [&](F xv, I sv, I sm, T* q) {
      if constexpr (Normal) {
        store(q, pol.apply_normal(xv, sv, sm));
      } else if constexpr (Fast) {
        store(q, pol.apply_fast(xv, pol.fast_params(sv, sm)));
      } else {
        store(q, pol.apply(xv, pol.params(sv, sm)));
      }
    };
    if (sub_rows == 1 && sub_cols <= W) {
      // Sub-blocks inside one vector: one pass, each vector read once.
      const int steps = log2_exact(sub_cols);
      for (int64_t j = 0; j < n; ++j) {
        const T* const row = px + j * inner;
        T* const out = py + j * inner;
        for (int64_t v = 0; v < nv; ++v) {
          const F xv = load(row + v * W);
          one(xv, s[v], pol.exponent(L::group_max(pol.key(xv), steps)), out + v * W);
        }
      }
      return;
    }
    K km[kTileVectors];
    for (int64_t a = 0; a < n; a += sub_rows) {
      const int64_t len = min64(sub_rows, n - a);
      const T* const row = px + a * inner;
      T* const out = py + a * inner;
      column_max(pol, row, len, inner, nv, km);
      column_groups_max(km, nv, sub_cols);
      for (int64_t v = 0; v < nv; ++v) {
        const I sm = pol.exponent(km[v]);
        for (int64_t j = 0; j < len; ++j)
          one(load(row + j * inner + v * W), s[v], sm, out + j * inner + v * W);
      }
    }
  }

  // The block of `n` rows from `base` (a multiple of `lanes` columns into its row) over `cols`
  // columns (a multiple of lanes, any number of kTileColumns-column tiles), W columns per
  // vector; the columns left over (W > lanes) by the scalar walker.
  void lanes_tile(int64_t base, int64_t n, int64_t cols) const {
    const Pol pol = this->pol;
    const T* const px = x + base;
    T* const py = y + base;
    const int64_t inner = this->inner, lanes = this->lanes;
    // whole vectors: whole groups of lanes columns (lanes <= W: W / lanes groups each; else
    // lanes / W vectors per group, cols a multiple of lanes)
    const int64_t nv = cols / W;
    if constexpr (W > 1) {
      bool done = false;
      if constexpr (Pol::kSubBlocks) {
        if (lanes <= W && sub <= lanes) {
          // MX9 / MX6 / MX4 (blocks of 16, sub-blocks of 2) with lanes == W: blocks of two
          // rows, and of one row where the channels end halfway through a block (an odd
          // number of AVX2's 8-channel NCHWc groups: 8, 24, 40, ...) or where a block is one
          // vector (AVX-512's 16-channel groups). With n and the steps left to run time, such a
          // one-row block took each vector on its own with branching lane maxima: on the
          // AVX2 development machine (Zen 3, one thread, the kernel on the classifier's
          // activations, ort-mx-bench --kernel --nchwc) MX9 took 46.3 us on [1, 8, 48, 192]
          // where it now takes 20.1 (MXINT8: 20.5), and 238 -> 173 us over all 16 shapes.
          if (n == 2 && lanes == W && sub == 2)
            lanes_column_sub_blocks<2, log2_exact(W), 1>(pol, px, py, n, inner, nv);
          else if (n == 1 && lanes == W && sub == 2)
            lanes_column_sub_blocks<1, log2_exact(W), 1>(pol, px, py, n, inner, nv);
          else lanes_column_sub_blocks<0, -1, -1>(pol, px, py, n, inner, nv);
          done = true;
        }
      } else if (lanes == W) {
        pixel_blocks(pol, px, py, n, inner, nv);
        done = true;
      }
      if (done) {
        if (nv * W < cols) scalar().lanes_tile(base + nv * W, n, cols - nv * W);
        return;
      }
    }
    for (int64_t c0 = 0; c0 < cols; c0 += kTileColumns)
      lanes_tile_columns(pol, base + c0, n, min64(kTileColumns, cols - c0));
  }

  // lanes_tile's general form over at most kTileColumns columns: the block maxima of every
  // column vector first, then the rows.
  void lanes_tile_columns(const Pol& pol, int64_t base, int64_t n, int64_t cols) const {
    const T* const px = x + base;
    T* const py = y + base;
    const int64_t inner = this->inner, lanes = this->lanes;
    const int64_t nv = cols / W;
    K k[kTileVectors];
    I s[kTileVectors] = {};
    column_max(pol, px, n, inner, nv, k);
    column_groups_max(k, nv, lanes);
    for (int64_t v = 0; v < nv; ++v) s[v] = pol.exponent(k[v]);
    if constexpr (Pol::kSubBlocks) {
      const int64_t sub = this->sub;
      const int64_t sub_rows = sub > lanes ? sub / lanes : 1;
      const int64_t sub_cols = sub > lanes ? lanes : sub;
      bool fast = true, normal = true;
      for (int64_t v = 0; v < nv; ++v) fast = fast && pol.fast(s[v]);
      for (int64_t v = 0; v < nv; ++v) normal = normal && pol.normal(s[v]);
      if (fast && normal) lanes_sub_blocks<true, true>(pol, px, py, n, inner, nv, s, sub_rows, sub_cols);
      else if (fast) lanes_sub_blocks<true, false>(pol, px, py, n, inner, nv, s, sub_rows, sub_cols);
      else lanes_sub_blocks<false, false>(pol, px, py, n, inner, nv, s, sub_rows, sub_cols);
    } else {
      whole_block_rows(pol, px, inner, py, n, inner, nv, s);
    }
    if constexpr (W > 1)
      if (nv * W < cols) scalar().lanes_tile(base + nv * W, n, cols - nv * W);
  }

  // Work units [u0, u1) of plan_units(); outer rows are `length * inner` elements apart.
  void run(const UnitPlan& plan, int64_t u0, int64_t u1) const {
    if (inner == 1) {
      const int64_t per_row = (length + plan.chunk - 1) / plan.chunk;
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t row = u / per_row, c0 = (u % per_row) * plan.chunk;
        const int64_t base = row * length + c0, n = min64(plan.chunk, length - c0);
        if constexpr (W == 1) {
          for (int64_t j0 = 0; j0 < n; j0 += bs) block(base + j0, min64(bs, n - j0), 1);
        } else {
          contiguous_groups(base, n);
        }
      }
      return;
    }
    // (the unit's tile, block and outer index counted along, not divided out per unit)
    const int64_t tw = plan.tile_columns;
    const int64_t tiles = (inner + tw - 1) / tw;
    const int64_t blocks = (length + bs - 1) / bs;
    int64_t tile = u0 % tiles, blk = (u0 / tiles) % blocks, o = u0 / (tiles * blocks);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t j0 = blk * bs, col0 = tile * tw;
      const int64_t base = (o * length + j0) * inner + col0;
      const int64_t n = min64(bs, length - j0), cols = min64(tw, inner - col0);
      if (++tile == tiles) {
        tile = 0;
        if (++blk == blocks) blk = 0, ++o;
      }
      if constexpr (!Stream) {  // (stream_supported excludes the NCHWc view)
        if (lanes > 1) {
          lanes_tile(base, n, cols);
          continue;
        }
      }
      if (tw > kTileColumns) {  // a row walk's unit (plan_units)
        if constexpr (kRowWalk) {
          const int64_t nv = cols / W;
          row_walk(base, n, nv);
          if (nv * W < cols) last_columns(base + nv * W, n, cols - nv * W, nv);
        } else {
          for (int64_t c0 = 0; c0 < cols; c0 += kTileColumns)
            strided_tile(base + c0, n, min64(kTileColumns, cols - c0));
        }
        continue;
      }
      strided_tile(base, n, cols);
    }
  }
};

// Whether the walk of a float32 tensor with W lanes stores its output non-temporally: blocked
// axis outer, the output at least kStreamBytes, and every vector store aligned (y to the
// vector's size, rows a whole number of vectors apart).
template <int W>
MXOPS_VINL bool stream_supported(DType t, const void* y, const Geometry& g) {
  return W > 1 && t == DType::kFloat32 && g.inner > 1 && g.lanes == 1 && g.inner % W == 0 &&
         g.num_elements * int64_t(sizeof(float)) >= kStreamBytes &&
         reinterpret_cast<uintptr_t>(y) % (W * sizeof(float)) == 0;
}

// Whether the walker with W lanes handles this op and geometry (else the scalar one does).
template <int W>
MXOPS_VINL bool vector_walk_supported(const QdqParams& p, const Geometry& g) {
  if (g.lanes > 1) return true;  // lanes_tile: any lanes the attributes allow
  if (g.inner > 1) return g.inner >= W;
  if (!power_of_two(p.block_size) || p.block_size > kChunk) return false;
  return p.method != Method::kToBfpPrime || (power_of_two(p.sub_block_size) && p.sub_block_size <= W);
}

// Whether a policy reads the bf16_first attribute (the BFP methods; MX ops have none).
template <class Pol>
constexpr bool kTakesBf16First = true;
template <class L, int Mode, int Kind>
constexpr bool kTakesBf16First<MxLanes<L, Mode, Kind>> = false;

// Returns fn(pol) for the lane policy (over lanes L) of p's method, rounding mode and
// parameters: the one place that chooses a policy from an op's parameters. Only reachable
// policies are instantiated (walkers dominate the build's time): the small-mantissa BFP
// policy only for round-half-to-even, floating MX elements only with it.
template <class L, class Fn>
auto with_policy_for(const QdqParams& p, Fn&& fn) {
  auto with_mode = [&](auto mode_tag) {
    constexpr int kMode = decltype(mode_tag)::value;
    switch (p.method) {
      case Method::kToBfp:
        if constexpr (kMode == kHalfEven) {
          if (p.mantissa_bits <= 21) return fn(BfpLanes<L, kMode, true>{p.mantissa_bits});
        }
        return fn(BfpLanes<L, kMode, false>{p.mantissa_bits});
      case Method::kToBfpPrime:
        return fn(PrimeLanes<L, kMode>{p.mantissa_bits, p.sub_block_size, p.sub_block_shift_bits});
      case Method::kMx:
        break;
    }
    // MX: floating elements ignore the rounding mode (they come here with kHalfEven only).
    if constexpr (kMode == kHalfEven) {
      if (!p.element.is_int) return fn(MxLanes<L, kMode, kMxFloatElement>{p.element});
    }
    return fn(MxLanes<L, kMode, kMxIntElement>{p.element});
  };
  const bool float_mx = p.method == Method::kMx && !p.element.is_int;
  switch (float_mx ? 2 : p.rounding_mode) {
    case 0: return with_mode(std::integral_constant<int, 0>{});
    case 1: return with_mode(std::integral_constant<int, 1>{});
    default: return with_mode(std::integral_constant<int, 2>{});
  }
}

// Whether p's policy has the plain form (Pol::kPlain > 0: blocks_plain and the other plain
// walks apply): to_bfp rounding half to even with at most 21 mantissa bits, MX with floating
// elements, or with integer elements rounding half to even.
inline bool has_plain_form(const QdqParams& p) {
  return with_policy_for<ScalarLanes>(p, [](auto pol) { return decltype(pol)::kPlain > 0; });
}

// The dispatch from runtime parameters to a walker over elements of type IO: calls fn(walker)
// with the walker of lanes L that `p` selects; Stream: the walker that stores non-temporally
// (vector lanes, float32, see stream_supported); `prefetch_rows`: Walker::prefetch_rows.
// Only reachable walkers are instantiated (they dominate the build's time): no bf16_first
// walker for MX ops or for bfloat16 elements (rounding a bfloat16 value to bfloat16 is the
// identity, so that walker's bits are the plain one's), and of the policies only those
// with_policy_for reaches.
template <class L, class IO, bool Stream, class Fn>
void with_walker_for(const QdqParams& p, const void* x, void* y, const Geometry& g, Fn&& fn,
                     bool prefetch_rows) {
  using T = typename IO::T;
  with_policy_for<L>(p, [&](auto pol) {
    using Pol = decltype(pol);
    auto go = [&](auto bf16_first) {
      fn(Walker<L, IO, decltype(bf16_first)::value, Pol, Stream>{
          static_cast<const T*>(x), static_cast<T*>(y), g.length, g.inner, walk_block_size(p, g),
          p.method == Method::kToBfpPrime ? p.sub_block_size : p.block_size, pol, g.lanes,
          g.num_elements * int64_t(sizeof(T)) >= kPrefetchTileBytes, prefetch_rows,
          g.num_elements * int64_t(sizeof(T)) >= kStreamBytes});
    };
    if constexpr (kTakesBf16First<Pol> && !std::is_same_v<IO, BFloat16>) {
      if (p.bf16_first) return go(std::true_type{});
    }
    go(std::false_type{});
  });
}

// Calls fn(IO{}, std::bool_constant<Stream>{}) for the element type `t`; `stream` (vector
// lanes, float32 only): the non-temporal walker's Stream; `divided` (float32 only, never
// streamed): Float32Divided, the input divided by input_divisor as it is loaded.
template <int W, class Fn>
void with_element_type(DType t, bool stream, Fn&& fn, bool divided = false) {
  switch (t) {
    case DType::kFloat32:
      if (divided) return fn(Float32Divided{}, std::false_type{});
      if constexpr (W > 1) {
        if (stream) return fn(Float32{}, std::true_type{});
      }
      return fn(Float32{}, std::false_type{});
    case DType::kFloat16: return fn(Float16{}, std::false_type{});
    case DType::kBFloat16: return fn(BFloat16{}, std::false_type{});
  }
}

// with_walker_for for the element type `t` (see with_element_type).
template <class L, class Fn>
void with_walker(const QdqParams& p, DType t, const void* x, void* y, const Geometry& g, Fn&& fn,
                 bool stream = false, bool prefetch_rows = true) {
  with_element_type<L::W>(t, stream, [&](auto io, auto stream_tag) {
    with_walker_for<L, decltype(io), decltype(stream_tag)::value>(p, x, y, g, fn, prefetch_rows);
  }, p.input_divisor != 0);
}

}  // namespace
}  // namespace mxops::cpu
