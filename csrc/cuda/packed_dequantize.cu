// MXDequantize / BFPDequantize on the GPU (CUDA, and HIP when hipcc compiles this file): one
// grid-stride pass decodes every element with the shared decoder of
// csrc/common/packed_decode.h, a second writes the exception values.
#include "gpu_runtime.h"  // first: the runtime names for CUDA, HIP or the host emulation

#include <string>

#include "packed_launch.h"

namespace mxops::gpu {
namespace {

constexpr int kPackedThreads = 256;

__global__ void packed_decode_kernel(packed::PackedParams p, packed::PackedBuffers in, int64_t n,
                                     float* __restrict__ y) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    y[i] = packed::decode_element(p, in, i);
}

__global__ void packed_exceptions_kernel(const int64_t* __restrict__ indices,
                                         const float* __restrict__ values, int64_t count,
                                         int64_t n, float* __restrict__ y) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < count;
       k += stride) {
    const int64_t i = indices[k];
    if (i >= 0 && i < n) y[i] = values[k];
  }
}

}  // namespace

std::string launch_packed_dequantize(const packed::PackedParams& params,
                                     const packed::PackedBuffers& in, int64_t n,
                                     const int64_t* exception_indices,
                                     const float* exception_values, int64_t exception_count,
                                     float* y, void* stream) {
  if (n == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  MXOPS_LAUNCH(elementwise_grid(n, kPackedThreads), kPackedThreads, s,
               packed_decode_kernel)(params, in, n, y);
  std::string error = launch_status("the packed-weight decoder");
  if (!error.empty() || exception_count == 0) return error;
  // Same stream: runs after the decoder, so the exceptions win.
  MXOPS_LAUNCH(elementwise_grid(exception_count, kPackedThreads), kPackedThreads, s,
               packed_exceptions_kernel)(exception_indices, exception_values, exception_count,
                                         n, y);
  return launch_status("the packed-weight exceptions");
}

}  // namespace mxops::gpu
