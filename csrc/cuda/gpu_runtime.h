// The few GPU runtime names the kernels use, for CUDA (nvcc) and HIP (hipcc), so one set of
// kernel sources builds for both. Under HIP the names come from csrc/rocm/hip_compat.h.
//
// Lane groups: a block's reduction spans at most kGroupLanes = 32 lanes, and every shuffle
// stays inside an aligned group of 32 lanes. That is a whole warp on NVIDIA and on RDNA
// (wave32) and half a wavefront on CDNA (wave64), so the kernels are correct for either
// wavefront size without knowing it.
#pragma once

#include <cstdint>

#if defined(MXOPS_GPU_EMULATION)
#include "host_emulation.h"  // kernels on host threads, to test their logic without a GPU
#elif defined(__HIP__) || defined(__HIPCC__)
#include "../rocm/hip_compat.h"
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// MXOPS_LAUNCH(grid, block, stream, kernel)(args...): a launch with no dynamic shared memory.
#define MXOPS_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<(grid), (block), 0, (stream)>>>

#define MXOPS_GPU_EXECUTION_PROVIDER "CUDAExecutionProvider"
#define MXOPS_GPU_BACKEND_NAME "CUDA"

namespace mxops::gpu::port {

constexpr unsigned kFullMask = 0xffffffffu;

// Every lane of the warp executes these (the kernels keep warps converged around them).
__device__ __forceinline__ int shfl_xor(int v, int lane_mask) {
  return __shfl_xor_sync(kFullMask, v, lane_mask, 32);
}
__device__ __forceinline__ int shfl_up(int v, int delta, int width) {
  return __shfl_up_sync(kFullMask, v, delta, width);
}
__device__ __forceinline__ int shfl(int v, int src_lane, int width) {
  return __shfl_sync(kFullMask, v, src_lane, width);
}
// Whether `p` holds in every lane of the warp (a choice the whole warp then takes together).
__device__ __forceinline__ bool all_lanes(bool p) { return __all_sync(kFullMask, p); }

// The hardware's float16 conversions (correctly rounded; a NaN comes out canonical).
__device__ __forceinline__ float half_to_float(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ uint16_t float_to_half_rn(float f) {
  return __half_as_ushort(__float2half_rn(f));
}

}  // namespace mxops::gpu::port
#endif

// Grids are capped at this many CTAs and kernels grid-stride beyond it (HIP also limits a
// launch to 2^32 threads along x). Tests lower it to run the grid-stride paths on small inputs.
#ifndef MXOPS_GPU_MAX_CTAS
#define MXOPS_GPU_MAX_CTAS (1 << 22)
#endif

namespace mxops::gpu {
constexpr int kGroupLanes = 32;
constexpr long long kMaxCtas = MXOPS_GPU_MAX_CTAS;
}  // namespace mxops::gpu

#include <cstdint>
#include <string>

namespace mxops::gpu {

// CTAs for one thread per element, `threads` per CTA, capped at kMaxCtas (the kernels
// grid-stride beyond it).
inline unsigned elementwise_grid(int64_t n, int threads) {
  int64_t ctas = (n + threads - 1) / threads;
  if (ctas < 1) ctas = 1;
  return static_cast<unsigned>(ctas < kMaxCtas ? ctas : kMaxCtas);
}

// "" when the last launch succeeded, else a message naming `what`.
inline std::string launch_status(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return "";
  return std::string(MXOPS_GPU_BACKEND_NAME " launch of ") + what + " failed: " +
         cudaGetErrorString(e);
}

}  // namespace mxops::gpu
