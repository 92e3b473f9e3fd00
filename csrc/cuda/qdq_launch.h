// Declarations of the per-storage-type launchers, instantiated in qdq_float32.cu,
// qdq_float16.cu and qdq_bfloat16.cu (one translation unit each, so builds run in parallel).
#pragma once

#include "gpu_runtime.h"  // first: see qdq_kernels.cuh

#include "../common/numerics.h"
#include "../common/params.h"

namespace mxops::gpu {

// Quantize-dequantize of a non-empty tensor of more than one element, storage type IO.
template <class IO>
void launch_qdq_for(const QdqParams& p, DType t, const void* x, void* y, const Geometry& g,
                    cudaStream_t stream);

extern template void launch_qdq_for<Float32>(const QdqParams&, DType, const void*, void*,
                                             const Geometry&, cudaStream_t);
extern template void launch_qdq_for<Float16>(const QdqParams&, DType, const void*, void*,
                                             const Geometry&, cudaStream_t);
extern template void launch_qdq_for<BFloat16>(const QdqParams&, DType, const void*, void*,
                                              const Geometry&, cudaStream_t);

}  // namespace mxops::gpu
