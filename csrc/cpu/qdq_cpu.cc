#include "qdq_cpu.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "../common/bf16_qdq.h"
#include "../common/block_ops.h"
#include "qdq_simd.h"

namespace mxops::cpu {
namespace {

// Columns of the inner dimension handled together when the blocked axis is not innermost:
// the per-column state stays in registers / L1 while every row of a block streams through.
constexpr int64_t kTileColumns = 64;
// Elements per parallel task: large enough to amortise a thread-pool dispatch.
constexpr int64_t kElementsPerTask = 1 << 15;

template <class Ld, class Policy>
struct BlockWalker {
  using T = typename Ld::T;
  using Params = typename Policy::Params;
  const T* x;
  T* y;
  Geometry g;
  int64_t block_size;
  Policy pol;

  int64_t sub_block_size() const {
    if constexpr (Policy::kSubBlocks) return pol.sub_block_size;
    return block_size;
  }

  // Blocked axis innermost: each block is `n` consecutive elements at `base`.
  void contiguous_block(int64_t base, int64_t n) const {
    int s = 0;
    for (int64_t j = 0; j < n; ++j) s = imax(s, pol.key(Ld::load(x[base + j])));
    const int64_t sub = sub_block_size();
    for (int64_t j0 = 0; j0 < n; j0 += sub) {
      const int64_t j1 = std::min(n, j0 + sub);
      int sub_max = 0;
      if constexpr (Policy::kSubBlocks)
        for (int64_t j = j0; j < j1; ++j) sub_max = imax(sub_max, pol.key(Ld::load(x[base + j])));
      const Params prm = pol.params(s, sub_max);
      for (int64_t j = j0; j < j1; ++j) y[base + j] = Ld::store(pol.apply(Ld::load(x[base + j]), prm));
    }
  }

  // Blocked axis outer: a tile of `w` neighbouring columns, each its own block of `n` rows
  // `inner` apart; the column loops are innermost so reads and writes stay contiguous.
  void strided_tile(int64_t base, int64_t n, int64_t w) const {
    const int64_t stride = g.inner;
    int s[kTileColumns], sub_max[kTileColumns];
    Params prm[kTileColumns];
    for (int64_t i = 0; i < w; ++i) s[i] = 0;
    for (int64_t j = 0; j < n; ++j) {
      const T* row = x + base + j * stride;
      for (int64_t i = 0; i < w; ++i) s[i] = imax(s[i], pol.key(Ld::load(row[i])));
    }
    const int64_t sub = sub_block_size();
    for (int64_t j0 = 0; j0 < n; j0 += sub) {
      const int64_t j1 = std::min(n, j0 + sub);
      for (int64_t i = 0; i < w; ++i) sub_max[i] = 0;
      if constexpr (Policy::kSubBlocks) {
        for (int64_t j = j0; j < j1; ++j) {
          const T* row = x + base + j * stride;
          for (int64_t i = 0; i < w; ++i) sub_max[i] = imax(sub_max[i], pol.key(Ld::load(row[i])));
        }
      }
      for (int64_t i = 0; i < w; ++i) prm[i] = pol.params(s[i], sub_max[i]);
      for (int64_t j = j0; j < j1; ++j) {
        const T* row = x + base + j * stride;
        T* out = y + base + j * stride;
        for (int64_t i = 0; i < w; ++i) out[i] = Ld::store(pol.apply(Ld::load(row[i]), prm[i]));
      }
    }
  }
};

struct QdqRunner {
  const void* x;
  void* y;
  const Geometry& g;
  int64_t block_size;
  const TaskRunner& run_tasks;

  template <class Ld, class Policy>
  void run(const Policy& pol) const {
    using T = typename Ld::T;
    const BlockWalker<Ld, Policy> walk{static_cast<const T*>(x), static_cast<T*>(y), g, block_size, pol};
    const int64_t blocks_along = g.blocks_along(static_cast<int>(block_size));
    const int64_t tiles_per_row = g.inner == 1 ? 1 : (g.inner + kTileColumns - 1) / kTileColumns;
    const int64_t units = g.outer * blocks_along * tiles_per_row;  // (outer, block, tile)
    const int64_t unit_elements = block_size * std::min(g.inner, kTileColumns);
    const int64_t units_per_task = std::max<int64_t>(1, kElementsPerTask / unit_elements);
    const int64_t tasks = (units + units_per_task - 1) / units_per_task;
    run_tasks(tasks, [&](int64_t task) {
      const int64_t u_end = std::min(units, (task + 1) * units_per_task);
      for (int64_t u = task * units_per_task; u < u_end; ++u) {
        const int64_t tile = u % tiles_per_row;
        const int64_t block = (u / tiles_per_row) % blocks_along;
        const int64_t o = u / (tiles_per_row * blocks_along);
        const int64_t j0 = block * block_size;
        const int64_t n = std::min(block_size, g.length - j0);
        const int64_t base = (o * g.length + j0) * g.inner + tile * kTileColumns;
        if (g.inner == 1)
          walk.contiguous_block(base, n);
        else
          walk.strided_tile(base, n, std::min(kTileColumns, g.inner - tile * kTileColumns));
      }
    });
  }
};

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
  run(tasks, [&](int64_t task) {
    const int64_t begin = task * kElementsPerTask;
    body(begin, std::min(n, begin + kElementsPerTask));
  });
}

// The SIMD walker this processor runs: AVX-512 (F, BW, VL, DQ), else AVX2, else none.
// MXOPS_CPU_ISA=scalar|avx2|avx512 narrows the choice (read on every call, for testing and
// benchmarking); a request the processor cannot run falls back to what it can.
enum class Isa { kScalar, kAvx2, kAvx512 };

Isa detected_isa() {
#if !defined(__x86_64__)
  return Isa::kScalar;  // setup.py builds the SIMD walkers for x86-64 only
#else
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return Isa::kAvx2;
    return Isa::kScalar;
  }();
  return isa;
#endif
}

Isa selected_isa() {
  Isa isa = detected_isa();
  if (const char* req = std::getenv("MXOPS_CPU_ISA")) {
    if (std::strcmp(req, "scalar") == 0) isa = Isa::kScalar;
    else if (std::strcmp(req, "avx2") == 0 && isa == Isa::kAvx512) isa = Isa::kAvx2;
  }
  return isa;
}

// Runs the op with the SIMD walker of `isa`; false when that walker does not handle it.
bool run_simd(Isa isa, const QdqParams& p, DType t, const void* x, void* y, const Geometry& g,
              const TaskRunner& run_tasks) {
  if (isa == Isa::kScalar) return false;
  SimdOp op;
  op.method = static_cast<int>(p.method);
  op.rounding_mode = p.rounding_mode;
  op.mantissa_bits = p.mantissa_bits;
  op.sub_block_size = p.sub_block_size;
  op.sub_block_shift_bits = p.sub_block_shift_bits;
  op.bf16_first = p.bf16_first;
  op.element = p.element;
  op.dtype = static_cast<int>(t);
  op.block_size = p.block_size;
  op.x = x;
  op.y = y;
  op.outer = g.outer;
  op.length = g.length;
  op.inner = g.inner;
#if !defined(__x86_64__)
  (void)g;
  (void)run_tasks;
  return false;
#else
  const bool wide = isa == Isa::kAvx512;
  if (!(wide ? simd16::prepare(op) : simd8::prepare(op))) return false;
  const int64_t per = op.units_per_task;
  const int64_t tasks = (op.units + per - 1) / per;
  run_tasks(tasks, [&](int64_t task) {
    const int64_t begin = task * per, end = std::min(op.units, begin + per);
    if (wide) simd16::run_units(op, begin, end);
    else simd8::run_units(op, begin, end);
  });
  return true;
#endif
}

}  // namespace

void run_serial(int64_t n_tasks, const std::function<void(int64_t)>& body) {
  for (int64_t i = 0; i < n_tasks; ++i) body(i);
}

void quantize_dequantize(const QdqParams& p, DType t, const void* x, void* y, const Geometry& g,
                         const TaskRunner& run) {
  if (g.num_elements == 0) return;
  if (g.identity) {
    switch (t) {
      case DType::kFloat32: copy_identity<Float32>(x, y, p.bf16_first); break;
      case DType::kFloat16: copy_identity<Float16>(x, y, p.bf16_first); break;
      case DType::kBFloat16: copy_identity<BFloat16>(x, y, p.bf16_first); break;
    }
    return;
  }
  if (run_simd(selected_isa(), p, t, x, y, g, run)) return;
  dispatch_block_op(p, t, QdqRunner{x, y, g, p.block_size, run});
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

}  // namespace

void bf16_quantize_linear(const float* x, const float* scale, const uint16_t* zero_point,
                          bool per_channel, const Geometry& g, uint16_t* y, const TaskRunner& run) {
  const Isa isa = selected_isa();
  (void)isa;
  for_each_channel_run(g, per_channel, scale, zero_point, run,
                       [&](int64_t i, int64_t stop, float s, uint16_t z) {
#if defined(__x86_64__)
    if (isa == Isa::kAvx512) return simd16::bf16_quantize_run(x + i, y + i, stop - i, s, z);
    if (isa == Isa::kAvx2) return simd8::bf16_quantize_run(x + i, y + i, stop - i, s, z);
#endif
    for_each_run(i, stop, x, y, [&](int64_t k) { y[k] = bf16_quantize(x[k], s, z); });
  });
}

void bf16_dequantize_linear(const uint16_t* y, const float* scale, const uint16_t* zero_point,
                            bool per_channel, const Geometry& g, float* x, const TaskRunner& run) {
  const Isa isa = selected_isa();
  (void)isa;
  for_each_channel_run(g, per_channel, scale, zero_point, run,
                       [&](int64_t i, int64_t stop, float s, uint16_t z) {
#if defined(__x86_64__)
    if (isa == Isa::kAvx512) return simd16::bf16_dequantize_run(y + i, x + i, stop - i, s, z);
    if (isa == Isa::kAvx2) return simd8::bf16_dequantize_run(y + i, x + i, stop - i, s, z);
#endif
    for_each_run(i, stop, y, x, [&](int64_t k) { x[k] = bf16_dequantize(y[k], s, z); });
  });
}

}  // namespace mxops::cpu
