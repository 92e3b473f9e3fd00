// CPU backend: runs the numeric core of csrc/common/numerics.h over a tensor, reading blocks
// in place along any axis and spreading them over the caller's threads.
#pragma once

#include <cstdint>
#include <functional>

#include "../common/params.h"

namespace mxops::cpu {

// Runs body(task) once for every task in [0, n_tasks), possibly on several threads at once.
// The ORT kernels pass ORT's intra-op thread pool; the pybind module passes std::threads.
using TaskRunner = std::function<void(int64_t n_tasks, const std::function<void(int64_t)>& body)>;

// The CPU kernels' instruction-set paths.
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// "scalar", "avx2" or "avx512".
const char* isa_name(Isa isa);

// The path the CPU kernels take now: the best this processor runs (AVX-512 F/BW/VL/DQ, else
// AVX2 + F16C, else scalar), narrowed by the environment variable MXOPS_CPU_ISA (scalar,
// avx2 or avx512; read on every call, for tests and benchmarks). An unknown value throws
// InvalidArgument; a path this processor cannot run is said once on stderr and the best
// available one runs instead.
Isa selected_isa();

// A runner that does every task on the calling thread.
void run_serial(int64_t n_tasks, const std::function<void(int64_t)>& body);

// run(n_tasks, body), except that a single task runs here directly: a small tensor's node
// would otherwise wrap `body` in a std::function (a heap allocation for a lambda with more
// than two captures) on every call.
template <class Body>
void run_tasks(const TaskRunner& run, int64_t n_tasks, Body&& body) {
  if (n_tasks == 1) return body(int64_t{0});
  run(n_tasks, body);
}

// BFPQuantizeDequantize / MXQuantizeDequantize of the tensor `x` (type `t`, viewed as
// `geometry`) into `y`: `y` is `x` (in place; every walk reads all elements of a block before
// it writes any, and blocks do not overlap) or does not overlap it. Writes every output
// element once and allocates nothing the size of the tensor.
void quantize_dequantize(const QdqParams& params, DType t, const void* x, void* y,
                         const Geometry& geometry, const TaskRunner& run);

// ExtendedQuantizeLinear with a bfloat16 zero point: y = bfloat16(x / scale + zp).
// scale / zero_point hold one value (per tensor) or `channels` values along the axis that
// splits the tensor into [outer, channels, inner].
void bf16_quantize_linear(const float* x, const float* scale, const uint16_t* zero_point,
                          bool per_channel, const Geometry& geometry, uint16_t* y,
                          const TaskRunner& run);

// ExtendedDequantizeLinear with a bfloat16 zero point: x = (float(y) - float(zp)) * scale.
void bf16_dequantize_linear(const uint16_t* y, const float* scale, const uint16_t* zero_point,
                            bool per_channel, const Geometry& geometry, float* x,
                            const TaskRunner& run);

// BF16QuantizeDequantize: y = the dequantized bf16_quantize_linear of x, the pair's bits in
// one pass (x and y float32; y is x, in place, or does not overlap it).
void bf16_quantize_dequantize(const float* x, const float* scale, const uint16_t* zero_point,
                              bool per_channel, const Geometry& geometry, float* y,
                              const TaskRunner& run);

}  // namespace mxops::cpu
