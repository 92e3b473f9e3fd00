// HIP side of csrc/cuda/gpu_runtime.h: the ROCm build compiles the CUDA kernel sources in
// csrc/cuda/ unchanged with hipcc; this header maps the CUDA runtime names they use to HIP and
// supplies the shuffle wrappers (HIP 5.x has no *_sync shuffles).
//
// Wavefronts are 64 lanes on CDNA (gfx908, gfx90a) and 32 on RDNA (gfx1030). The kernels
// reduce within aligned groups of at most 32 lanes (kGroupLanes), passing width 32 or less to
// every shuffle, so the same code is correct for both; the assertion below checks that the
// wavefront size of every target is a multiple of 32.
#pragma once

#include <cstdint>

#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

#if defined(__HIP_DEVICE_COMPILE__) && defined(__AMDGCN_WAVEFRONT_SIZE)
static_assert(__AMDGCN_WAVEFRONT_SIZE % 32 == 0, "lane groups of 32 must tile a wavefront");
#endif

#define cudaStream_t hipStream_t
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString

// MXOPS_LAUNCH(grid, block, stream, kernel)(args...): a launch with no dynamic shared memory.
#define MXOPS_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<(grid), (block), 0, (stream)>>>

#define MXOPS_GPU_EXECUTION_PROVIDER "ROCMExecutionProvider"
#define MXOPS_GPU_BACKEND_NAME "ROCM"

namespace mxops::gpu::port {

// Shuffles within an aligned group of `width` (<= 32) lanes; width 32 splits a wave64 in two
// independent halves, exactly like a CUDA warp.
__device__ __forceinline__ int shfl_xor(int v, int lane_mask) {
  return __shfl_xor(v, lane_mask, 32);
}
__device__ __forceinline__ int shfl_up(int v, int delta, int width) {
  return __shfl_up(v, static_cast<unsigned int>(delta), width);
}
__device__ __forceinline__ int shfl(int v, int src_lane, int width) {
  return __shfl(v, src_lane, width);
}
// Whether `p` holds in every active lane of the wavefront: on wave64 both 32-lane groups get
// the same answer, which keeps each of them converged.
__device__ __forceinline__ bool all_lanes(bool p) { return __all(p) != 0; }

// The hardware's float16 conversions (correctly rounded; a NaN comes out canonical).
__device__ __forceinline__ float half_to_float(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ uint16_t float_to_half_rn(float f) {
  return __half_as_ushort(__float2half_rn(f));
}

}  // namespace mxops::gpu::port
