// Kernels of BFPQuantizeDequantize / MXQuantizeDequantize for float32 tensors.
#include "qdq_kernels.cuh"
#include "qdq_launch.h"

namespace mxops::gpu {
template void launch_qdq_for<Float32>(const QdqParams&, DType, const void*, void*, const Geometry&,
                                      cudaStream_t);
}  // namespace mxops::gpu
