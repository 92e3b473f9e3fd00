#include "qdq_cpu.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <cstdio>
#include <mutex>
#include <string>

#include "../common/bf16_qdq.h"
#include "block_walker.h"
#include "qdq_simd.h"

// The SIMD walkers linked in (qdq_simd.h): both widths on x86-64, except where setup.py's
// sanitizer build leaves out a width that its processor cannot run (-DMXOPS_NO_SIMD16).
#if defined(__x86_64__)
#define MXOPS_HAVE_SIMD8 1
#else
#define MXOPS_HAVE_SIMD8 0
#endif
#if defined(__x86_64__) && !defined(MXOPS_NO_SIMD16)
#define MXOPS_HAVE_SIMD16 1
#else
#define MXOPS_HAVE_SIMD16 0
#endif

namespace mxops::cpu {
namespace {

// Elements per parallel task: large enough to amortise a thread-pool dispatch (a tensor of
// up to this many elements runs on the calling thread alone).
constexpr int64_t kElementsPerTask = 1 << 16;
// The same for the block ops, whose elements cost several times a copy's: a tensor of 64 Ki
// elements already pays for splitting over two threads.
constexpr int64_t kBlockElementsPerTask = 1 << 14;

// Bytes per element of a tensor of type t.
constexpr int64_t element_bytes(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// A one-element tensor is returned unchanged (rounded to bfloat16 first when asked).
template <class IO>
void copy_identity(const void* x, void* y, bool bf16_first) {
  using T = typename IO::T;
  float v = IO::load(*static_cast<const T*>(x));
  if (bf16_first) v = bf16_round_bits(v);
  const T out = bf16_first ? IO::store(v) : *static_cast<const T*>(x);
  std::memcpy(y, &out, sizeof(T));
}

// body(k) for k in [begin, end), in runs of 512 elements with the next run of `in` and `out`
// prefetched: the streaming loops otherwise wait on memory.
template <class In, class Out, class Body>
inline void for_each_run(int64_t begin, int64_t end, const In* in, Out* out, Body body) {
  constexpr int64_t kRun = 512;
  for (int64_t r = begin; r < end; r += kRun) {
    const int64_t r_end = std::min(end, r + kRun);
    const int64_t n_end = std::min(end, r_end + kRun);
    for (int64_t k = r_end; k < n_end; k += 64 / static_cast<int64_t>(sizeof(In)))
      __builtin_prefetch(in + k, 0, 3);
    for (int64_t k = r_end; k < n_end; k += 64 / static_cast<int64_t>(sizeof(Out)))
      __builtin_prefetch(out + k, 1, 3);
    for (int64_t k = r; k < r_end; ++k) body(k);
  }
}

template <class Body>
void for_each_chunk(int64_t n, const TaskRunner& run, Body body) {
  const int64_t tasks = (n + kElementsPerTask - 1) / kElementsPerTask;
  run_tasks(run, tasks, [&](int64_t task) {
    const int64_t begin = task * kElementsPerTask;
    body(begin, std::min(n, begin + kElementsPerTask));
  });
}

Isa detected_isa() {
#if !defined(__x86_64__)
  return Isa::kScalar;  // setup.py builds the SIMD walkers for x86-64 only
#else
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (MXOPS_HAVE_SIMD16 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
      return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return Isa::kAvx2;
    return Isa::kScalar;
  }();
  return isa;
#endif
}

// AMD family 19h with AVX-512: Zen 4 (Zen 3, the same family, has no AVX-512).
bool amd_zen4() {
#if !defined(__x86_64__)
  return false;
#else
  static const bool zen4 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") && __builtin_cpu_is("amdfam19h") &&
           __builtin_cpu_supports("avx512f");
  }();
  return zen4;
#endif
}

// AMD family 1Ah: Zen 5 (from CPUID leaf 1: GCC 12's __builtin_cpu_is has no name for it).
bool amd_zen5() {
#if !defined(__x86_64__)
  return false;
#else
  static const bool zen5 = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!amd_processor() || !__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned base = (a >> 8) & 0xfu, extended = (a >> 20) & 0xffu;
    return (base == 0xfu ? base + extended : base) == 0x1au;
  }();
  return zen5;
#endif
}

// Whether this processor runs 512-bit vector operations as two 256-bit halves (Zen 4). On
// such a Zen 4, one thread, float32,
// the AVX-512 walker along rows ran slower than the AVX2 one (xNeg, BFP16: 0.20-0.27 against
// 0.30-0.39 in cache, 0.57 against 0.66-0.78 at 16 Mi elements; the other formats 10-25 %
// slower in cache), while with the blocked axis outer it was mostly the faster one (0.35-0.79
// against 0.25-0.75 in cache, 0.57-0.82 against 0.52-0.74 at 16 Mi); docs/speed-log.md, "An
// AVX-512 processor".
bool split_512_bit_units() { return amd_zen4(); }

// Whether the walks with the blocked axis innermost prefetch their input and output streams in
// software (block_walker.h, Walker::prefetch_rows): yes, except on Zen 4, where they measured
// slower with them (16 Mi float32 elements, one thread, the walker called directly against a
// negation loop, with -> without: AVX2 path MXINT8 0.85 -> 1.08, MX9 0.82 -> 1.00; AVX-512
// path MXINT8 0.80 -> 1.15, MX9 0.87 -> 0.92). On Zen 3 (AVX2 only) they help: ort-mx-bench,
// 16 Mi, blocked axis innermost, xNeg without -> with, BFP16 0.88-0.95 -> 1.03-1.07, MX9 / MX6
// / MX4 0.87-0.95 -> 0.96-1.06, the others within the runs' spread (docs/speed-log.md, "An
// AVX2-only processor").
bool row_prefetch_helps() { return !amd_zen4(); }

// Blocks of more input bytes than this walk without the software prefetches. On Zen 3
// (ort-mx-bench, 16 Mi elements, blocked axis innermost, xNeg with -> without, three runs each,
// 2026-11-28) float32 blocks of 32 (128 bytes: MXINT8, the MXFP formats) lost with them:
// MXINT8 0.88-0.94 -> 0.94-1.00 on two threads and 0.70-0.84 -> 0.87-0.93 on one, MXFP8E4M3
// 0.76-0.88 -> 0.91-0.96 on one and the MXFP formats within the spread on two; blocks of at
// most 64 bytes gained as before (with -> without: BFP16 1.02-1.07 -> 0.94-0.97 and MX9 / MX6
// / MX4 0.95-1.04 -> 0.93-0.97 on two threads; float16 MXINT8 and MXFP8E4M3, 64 bytes, 11-13 %
// faster with them on one).
constexpr int64_t kPrefetchBlockBytes = 64;
// On Zen 5 float32 blocks of 32 (128 bytes) gain from them too: the walker called directly
// (one thread, [256, 65536] float32, blocked axis innermost, x a negation loop in the same
// run, without -> with, three or four runs each, 2026-12-02): AVX-512 MXINT8 0.44-0.56 ->
// 0.68-0.82, MXFP8E4M3 0.44-0.49 -> 0.65-0.70; AVX2 MXINT8 0.78-0.87 -> 0.96-1.04, MXFP8E4M3
// 0.51-0.96 -> 0.85-0.91 (avx2_takes_long_rows).
// So do they on an Intel Xeon (family 6 model 167, 48 KiB 12-way L1d, 2 MiB L2; the only
// Intel model measured): ort-mx-bench, 16 Mi float32 elements, blocked axis innermost, two
// threads, xNeg in the same run, without -> with (MXOPS_CPU_PREFETCH unset / 1, runs
// alternating, 2026-12-07): MXINT8 0.89-0.91 -> 1.14-1.17, the MXFP formats 0.86-0.89 ->
// 1.06-1.13 (BFP16, MX9 / MX6 / MX4 already prefetch); the AVX2 walker there
// (MXOPS_CPU_ISA=avx2) 0.94-0.97 -> 1.10-1.25.
constexpr int64_t kWidePrefetchBlockBytes = 128;
int64_t prefetch_block_bytes() {
  return amd_zen5() || intel_processor() ? kWidePrefetchBlockBytes : kPrefetchBlockBytes;
}

// Whether the innermost walks of a call over `bytes` of input, in blocks of `block_bytes`,
// prefetch: MXOPS_CPU_PREFETCH=1 / 0 forces it on / off (to measure both on one machine);
// unset or empty, where row_prefetch_helps(), the input is at least kStreamBytes
// (block_walker.h) and a block at most prefetch_block_bytes(). Below kStreamBytes the tensor is
// mostly in the caches, and on Zen 3 the prefetches measured 0-5 % slower there (64 Ki and
// 1 Mi float32 elements) where they gain 5-15 % at 16 Mi. The outputs are the same bits
// either way.
bool prefetch_rows_for_call(int64_t bytes, int64_t block_bytes) {
  const char* req = std::getenv("MXOPS_CPU_PREFETCH");
  if (req == nullptr || *req == '\0')
    return row_prefetch_helps() && bytes >= kStreamBytes &&
           block_bytes <= prefetch_block_bytes();
  if (std::strcmp(req, "1") == 0) return true;
  if (std::strcmp(req, "0") == 0) return false;
  throw InvalidArgument{std::string("MXOPS_CPU_PREFETCH=") + req +
                        " is not 0 or 1 (or unset: on this processor " +
                        (row_prefetch_helps() ? "1" : "0") + " for inputs of " +
                        std::to_string(kStreamBytes >> 20) + " MiB or more in blocks of at most " +
                        std::to_string(prefetch_block_bytes()) + " bytes)"};
}

// Says once per requested value, on stderr, that the processor cannot run that path.
void warn_unavailable(const char* requested, Isa ran) {
  static std::mutex mutex;
  static std::string warned;
  std::lock_guard<std::mutex> lock(mutex);
  if (warned == requested) return;
  warned = requested;
  std::fprintf(stderr,
               "ort-mx-ops: MXOPS_CPU_ISA=%s is not available on this processor; the CPU "
               "kernels run the %s path\n", requested, isa_name(ran));
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

namespace {

// The path that the value `req` of MXOPS_CPU_ISA (null or empty: unset) selects here.
Isa isa_for_request(const char* req) {
  const Isa best = detected_isa();
  if (req == nullptr || *req == '\0') return best;
  Isa want;
  if (std::strcmp(req, "scalar") == 0) want = Isa::kScalar;
  else if (std::strcmp(req, "avx2") == 0) want = Isa::kAvx2;
  else if (std::strcmp(req, "avx512") == 0) want = Isa::kAvx512;
  else
    throw InvalidArgument{std::string("MXOPS_CPU_ISA=") + req +
                          " is not a CPU path; allowed: scalar, avx2, avx512 (or unset: the "
                          "best this processor runs, here " + isa_name(best) + ")"};
  if (static_cast<int>(want) <= static_cast<int>(best)) return want;
  warn_unavailable(req, best);
  return best;
}

// Whether the AVX-512 walker takes blocks of 8 elements (half a vector) sixteen at a time
// (block_walker.h, blocks_plain<kHalfVector>): for the policies with a plain form.
bool avx512_takes_half_vector_blocks(const QdqParams& p) {
  return p.block_size == 8 && has_plain_form(p);
}

// Whether the AVX2 walker takes blocks of this op along rows at a time where the AVX-512 one
// cannot: blocks of 8 elements (BFP16; and in the NCHWc view with 16-channel groups, which
// reads such blocks as plain rows) are one AVX2 vector, so the AVX2 walk takes 8 of them in
// one transposing pass (span_blocks, block_walker.h), while the AVX-512 walk takes a vector
// of two blocks at a time with its own lane reductions, except where
// avx512_takes_half_vector_blocks. Measured on an Intel Xeon (family 6 model 207, AVX-512),
// one thread, float32, blocked axis innermost, BFP16, GB/s AVX-512 against AVX2
// (MXOPS_CPU_ISA, ort-mx-bench), before blocks of half a vector: 14.3 / 24.6 at 64 Ki elements,
// 14.9 / 23.8 at 256 Ki, 15.4 / 24.7 at 1 Mi, 14.0 / 14.1 at 16 Mi. With it, x Neg AVX-512
// against AVX2 (2-core Xeon, the same model, two runs): 0.60-0.63 / 0.36-0.47 at 64 Ki,
// 0.87 / 0.73-0.81 at 256 Ki, 0.89-0.90 / 0.81-0.82 at 1 Mi.
bool avx2_takes_row_blocks_at_once(const QdqParams& p) {
  return p.block_size == 8 && !avx512_takes_half_vector_blocks(p);
}

// Whether rows (the blocked axis innermost) of an input of `bytes` in float32 blocks of 32
// elements with the plain form (MXINT8, the MXFP formats) take the AVX2 walker in place of
// the AVX-512 one: on Zen 5, inputs of kStreamBytes or more, which the walk streams from
// memory (and prefetches: kZen5PrefetchBlockBytes). The AVX-512 walk takes 16 such blocks
// (2 KiB) at a time, the AVX2 one 8. Measured on a 2-core Zen 5 (family 1Ah model 2, KVM),
// 16 Mi float32 elements: the walker called directly, one thread, x a negation loop in the
// same run, three runs, both prefetching: AVX-512 MXINT8 0.68-0.82 / MXFP8E4M3 0.65-0.70,
// AVX2 0.96-1.04 / 0.85-0.91; ort-mx-bench (two threads, x Neg, one to three runs each):
// AVX-512 MXINT8 0.58-0.68 without prefetches (the default before) and 0.84 with, the MXFP
// formats 0.58-0.68 / 0.78-0.79; AVX2 with them MXINT8 0.98-1.01, MXFP 0.94-1.04. In cache
// the two walkers measured within their runs' spread, so smaller inputs keep the AVX-512
// walker.
bool avx2_takes_long_rows(const QdqParams& p, DType t, int64_t bytes) {
  return amd_zen5() && t == DType::kFloat32 && p.block_size == 32 && bytes >= kStreamBytes &&
         has_plain_form(p);
}

// The path of a block op with parameters p over g of element type t: the one MXOPS_CPU_ISA
// asks for (read once) if it is set; else the best detected, except the AVX2 walker in place
// of the AVX-512 one along rows (g.inner == 1) where split_512_bit_units(),
// avx2_takes_row_blocks_at_once(p) or avx2_takes_long_rows.
Isa block_op_isa(const QdqParams& p, const Geometry& g, DType t) {
  const char* req = std::getenv("MXOPS_CPU_ISA");
  if (req != nullptr && *req != '\0') return isa_for_request(req);
  const Isa best = detected_isa();
  if (best != Isa::kAvx512 || g.inner != 1) return best;
  const bool rows_on_avx2 = split_512_bit_units() || avx2_takes_row_blocks_at_once(p) ||
                            avx2_takes_long_rows(p, t, g.num_elements * element_bytes(t));
  return rows_on_avx2 ? Isa::kAvx2 : best;
}

}  // namespace

Isa selected_isa() { return isa_for_request(std::getenv("MXOPS_CPU_ISA")); }

void run_serial(int64_t n_tasks, const std::function<void(int64_t)>& body) {
  for (int64_t i = 0; i < n_tasks; ++i) body(i);
}

namespace {

// The kL lanes of each of `pixels` pixels from s to d, those from `real` on as +0 (bit
// patterns of U); s == d allowed. Whole 16-byte vectors per pixel where kL lanes fill them:
// a loop over the plane that tested each index, or one that GCC's overlap check sent to its
// scalar version (s == d), ran at about one element per nanosecond.
template <class U, int kL>
void mask_lanes(const U* s, U* d, int64_t pixels, int64_t real) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(U));  // lanes of a 16-byte vector
  if constexpr (kL % kPer == 0) {
    typedef U V __attribute__((vector_size(16)));
    constexpr int kN = kL / kPer;
    V keep[kN];
    for (int j = 0; j < kN; ++j)
      for (int l = 0; l < kPer; ++l) keep[j][l] = j * kPer + l < real ? static_cast<U>(~U{0}) : U{0};
    for (int64_t p = 0; p < pixels; ++p, s += kL, d += kL)
      for (int j = 0; j < kN; ++j) {
        V v;
        std::memcpy(&v, s + j * kPer, sizeof v);
        v &= keep[j];
        std::memcpy(d + j * kPer, &v, sizeof v);
      }
  } else {
    for (int64_t p = 0; p < pixels; ++p, s += kL, d += kL)
      for (int l = 0; l < kL; ++l) d[l] = l < real ? s[l] : U{0};
  }
}

// dst = src with the padding channels of an NCHWc input (pad) set to +0, as bit patterns of U
// (the element's size); full_groups: also copy the channel groups without padding, else write
// only each batch's last group. A task per channel group of a batch.
template <class U>
void zero_padding(const U* src, U* dst, const NchwcPadding& pad, bool full_groups,
                  const TaskRunner& run) {
  const int64_t plane = pad.pixels * pad.lanes;
  run_tasks(run, pad.batches * pad.groups, [&](int64_t k) {
    const U* s = src + k * plane;
    U* d = dst + k * plane;
    if (k % pad.groups != pad.groups - 1) {
      if (full_groups && d != s) std::memcpy(d, s, static_cast<size_t>(plane) * sizeof(U));
      return;
    }
    switch (pad.lanes) {  // (a power of two from 2 to kMaxNchwcBlock: 1 has no padding)
      case 2: return mask_lanes<U, 2>(s, d, pad.pixels, pad.real);
      case 4: return mask_lanes<U, 4>(s, d, pad.pixels, pad.real);
      case 8: return mask_lanes<U, 8>(s, d, pad.pixels, pad.real);
      case 16: return mask_lanes<U, 16>(s, d, pad.pixels, pad.real);
      case 32: return mask_lanes<U, 32>(s, d, pad.pixels, pad.real);
      case 64: return mask_lanes<U, 64>(s, d, pad.pixels, pad.real);
      default: return mask_lanes<U, 128>(s, d, pad.pixels, pad.real);
    }
  });
}

void zero_padding(DType t, const void* src, void* dst, const NchwcPadding& pad, bool full_groups,
                  const TaskRunner& run) {
  if (t == DType::kFloat32)
    zero_padding(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), pad, full_groups, run);
  else
    zero_padding(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), pad, full_groups, run);
}

// An NCHWc input with padding channels (nchwc_channels), batch by batch: the channel groups
// before the block that holds the padding are walked from x to y as they are; that last block's
// groups are copied into y with the padding zeroed and walked there, in place (each walk reads
// every element of a block before it writes any, and blocks do not overlap). +0 changes no
// maximum of the real channels' blocks, and blocks of padding alone give +0, what ReorderInput
// writes there; but to_bfp_prime turns a whole block with Inf or NaN into NaN, padding
// included, so its padding is zeroed again afterwards. Copying only that block, not the whole
// tensor (as before), measured on Zen 3 (AVX2, one thread, nchwc_block 16, one node through
// onnxruntime, 200 / 104 / 88 channels padded to 208 / 112 / 96): BFP16 and MX9 (blocks within
// a group) 5-20 % faster, MXINT8 2-6 %; tensors of one or two groups unchanged
// (docs/speed-log.md, "NCHWc padding: only the padded block copied").
void quantize_dequantize_padded(const QdqParams& p, DType t, const void* x, void* y,
                                const Geometry& g, const TaskRunner& run) {
  const NchwcPadding& pad = g.padding;
  const int64_t plane = pad.pixels * pad.lanes;  // elements of one channel group of one batch
  // Channel groups per block: block_size / L in the lanes view; in the flat view (block_size
  // divides L) a block lies within one group.
  const int64_t rows = g.lanes > 1 ? walk_block_size(p, g) : 1;
  const int64_t tail = (pad.groups - 1) / rows * rows;  // first group of the padded block
  const int64_t bytes = element_bytes(t);
  // The walk over `groups` consecutive channel groups of one batch.
  auto groups_view = [&](int64_t groups) {
    Geometry v = g;
    v.padding = NchwcPadding{};
    v.identity = false;
    v.outer = 1;
    v.num_elements = groups * plane;
    v.length = g.lanes > 1 ? groups : v.num_elements;
    return v;
  };
  NchwcPadding tail_pad = pad;
  tail_pad.batches = 1;
  tail_pad.groups = pad.groups - tail;
  for (int64_t b = 0; b < pad.batches; ++b) {
    const int64_t at = b * pad.groups * plane, tail_at = at + tail * plane;
    const auto* xb = static_cast<const char*>(x);
    auto* yb = static_cast<char*>(y);
    if (tail > 0) quantize_dequantize(p, t, xb + at * bytes, yb + at * bytes, groups_view(tail), run);
    void* y_tail = yb + tail_at * bytes;
    zero_padding(t, xb + tail_at * bytes, y_tail, tail_pad, true, run);
    quantize_dequantize(p, t, y_tail, y_tail, groups_view(tail_pad.groups), run);
    if (p.method == Method::kToBfpPrime) zero_padding(t, y_tail, y_tail, tail_pad, false, run);
  }
}

// input_hardswish: y[i] = hardswish_numerator(x[i]) (numerics.h) for i in [0, n); x may be y.
// Compiled for AVX-512 and AVX2 too, the widest this processor runs picked at load time; the
// same bits in each (additions, comparisons and products of float32, no contraction).
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void hardswish_numerators(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = hardswish_numerator(x[i]);
}

}  // namespace

void quantize_dequantize(const QdqParams& p, DType t, const void* x, void* y, const Geometry& g,
                         const TaskRunner& run) {
  if (g.num_elements == 0) return;
  if (p.input_divisor != 0 && t != DType::kFloat32)
    throw InvalidArgument{"attribute 'input_divisor' = " + std::to_string(p.input_divisor) +
                          " needs a float32 input; allowed for float16 and bfloat16: 0"};
  if (p.input_hardswish) {
    // Hard-swish's numerator into the output (the Add, Clip and Mul nodes it replaces wrote
    // three tensors), then the op on the output in place, as on any input it may overwrite.
    if (t != DType::kFloat32)
      throw InvalidArgument{"attribute 'input_hardswish' = 1 needs a float32 input; allowed "
                            "for float16 and bfloat16: 0"};
    const auto* xf = static_cast<const float*>(x);
    auto* yf = static_cast<float*>(y);
    for_each_chunk(g.num_elements, run, [&](int64_t begin, int64_t end) {
      hardswish_numerators(xf + begin, yf + begin, end - begin);
    });
    QdqParams rest = p;
    rest.input_hardswish = false;
    return quantize_dequantize(rest, t, y, y, g, run);
  }
  if (g.padding.real > 0) return quantize_dequantize_padded(p, t, x, y, g, run);
  if (g.identity) {
    if (p.input_divisor != 0) {  // X / d, returned unchanged as any one-element tensor
      float v = *static_cast<const float*>(x) / static_cast<float>(p.input_divisor);
      if (p.bf16_first) v = bf16_round_bits(v);
      std::memcpy(y, &v, sizeof v);
      return;
    }
    switch (t) {
      case DType::kFloat32: copy_identity<Float32>(x, y, p.bf16_first); break;
      case DType::kFloat16: copy_identity<Float16>(x, y, p.bf16_first); break;
      case DType::kBFloat16: copy_identity<BFloat16>(x, y, p.bf16_first); break;
    }
    return;
  }
  if (g.inner == 1 && g.outer > 1 && p.block_size > 0 && g.length % p.block_size == 0) {
    // Blocked axis innermost and whole blocks in every row: the rows lie one after another,
    // so they are one row of the same blocks, which the walker takes in spans of many blocks
    // instead of a row at a time (rows shorter than a span went block by block).
    Geometry one_row = g;
    one_row.length = g.outer * g.length;
    one_row.outer = 1;
    return quantize_dequantize(p, t, x, y, one_row, run);
  }
  Isa isa = block_op_isa(p, g, t);
#if MXOPS_HAVE_SIMD16
  if (isa == Isa::kAvx512 && !simd16::supports(p, g)) isa = Isa::kScalar;
#endif
#if MXOPS_HAVE_SIMD8
  if (isa == Isa::kAvx2 && !simd8::supports(p, g)) isa = Isa::kScalar;
#endif
  const int64_t lanes = isa == Isa::kAvx512 ? 16 : isa == Isa::kAvx2 ? 8 : 1;  // (the walker's plan)
  const UnitPlan plan = plan_units(p, g, element_bytes(t), lanes);
  const int64_t per_task = std::max<int64_t>(1, kBlockElementsPerTask / plan.unit_elements);
  const int64_t tasks = (plan.units + per_task - 1) / per_task;
  const int64_t input_bytes = g.num_elements * element_bytes(t);
  const bool prefetch_rows = prefetch_rows_for_call(input_bytes, p.block_size * element_bytes(t));
  run_tasks(run, tasks, [&](int64_t task) {
    const int64_t u0 = task * per_task, u1 = std::min(plan.units, u0 + per_task);
#if MXOPS_HAVE_SIMD16
    if (isa == Isa::kAvx512) return simd16::run_units(p, t, x, y, g, u0, u1, prefetch_rows);
#endif
#if MXOPS_HAVE_SIMD8
    if (isa == Isa::kAvx2) return simd8::run_units(p, t, x, y, g, u0, u1, prefetch_rows);
#endif
    set_input_divisor(p);  // (on the thread of the walk: block_walker.h)
    with_walker<ScalarLanes>(p, t, x, y, g, [&](const auto& walker) { walker.run(plan, u0, u1); },
                             false, prefetch_rows);
  });
}

namespace {

// Splits the tensor into runs of elements that share one scale / zero point (the whole chunk
// per tensor, an inner row per channel) and calls run(begin, end, scale, zero_point) for each,
// so the loop inside a run is branch-free and vectorises.
template <class Run>
void for_each_channel_run(const Geometry& g, bool per_channel, const float* scale,
                          const uint16_t* zero_point, const TaskRunner& tasks, Run run) {
  for_each_chunk(g.num_elements, tasks, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end;) {
      const int64_t c = per_channel ? (i / g.inner) % g.length : 0;
      const int64_t stop = per_channel ? std::min(end, (i / g.inner + 1) * g.inner) : end;
      run(i, stop, scale[c], zero_point[c]);
      i = stop;
    }
  });
}

// A vector run of a BF16 op (simd16 / simd8 .bf16_*_run), null where that width is not linked
// in. Its type names In and Out only through a member, so that null deduces nothing.
template <class T>
struct NonDeduced {
  using Type = T;
};
template <class In, class Out>
using Bf16Run = typename NonDeduced<void (*)(const In*, Out*, int64_t, float, uint16_t)>::Type;

// One of the BF16 ops over the tensor: the ISA's vector run per channel run, else `element`
// per element (bf16_qdq.h).
template <class In, class Out, class Element>
void bf16_elementwise(const In* x, const float* scale, const uint16_t* zero_point, bool per_channel,
                      const Geometry& g, Out* y, const TaskRunner& run, Bf16Run<In, Out> avx512,
                      Bf16Run<In, Out> avx2, Element element) {
  const Isa isa = selected_isa();
  for_each_channel_run(g, per_channel, scale, zero_point, run,
                       [&](int64_t i, int64_t stop, float s, uint16_t z) {
    if (isa == Isa::kAvx512 && avx512 != nullptr) return avx512(x + i, y + i, stop - i, s, z);
    if (isa == Isa::kAvx2 && avx2 != nullptr) return avx2(x + i, y + i, stop - i, s, z);
    for_each_run(i, stop, x, y, [&](int64_t k) { y[k] = element(x[k], s, z); });
  });
}

// The AVX-512 and AVX2 runs of a BF16 op for bf16_elementwise (where linked in).
#if MXOPS_HAVE_SIMD16
#define MXOPS_BF16_RUNS(name) simd16::name, simd8::name
#elif MXOPS_HAVE_SIMD8
#define MXOPS_BF16_RUNS(name) nullptr, simd8::name
#else
#define MXOPS_BF16_RUNS(name) nullptr, nullptr
#endif

}  // namespace

void bf16_quantize_linear(const float* x, const float* scale, const uint16_t* zero_point,
                          bool per_channel, const Geometry& g, uint16_t* y, const TaskRunner& run) {
  bf16_elementwise(x, scale, zero_point, per_channel, g, y, run, MXOPS_BF16_RUNS(bf16_quantize_run),
                   mxops::bf16_quantize);
}

void bf16_dequantize_linear(const uint16_t* y, const float* scale, const uint16_t* zero_point,
                            bool per_channel, const Geometry& g, float* x, const TaskRunner& run) {
  bf16_elementwise(y, scale, zero_point, per_channel, g, x, run,
                   MXOPS_BF16_RUNS(bf16_dequantize_run), mxops::bf16_dequantize);
}

void bf16_quantize_dequantize(const float* x, const float* scale, const uint16_t* zero_point,
                              bool per_channel, const Geometry& g, float* y, const TaskRunner& run) {
  // (qualified: this function's own name hides the element function)
  bf16_elementwise(x, scale, zero_point, per_channel, g, y, run,
                   MXOPS_BF16_RUNS(bf16_quantize_dequantize_run), mxops::bf16_quantize_dequantize);
}

#undef MXOPS_BF16_RUNS

}  // namespace mxops::cpu
