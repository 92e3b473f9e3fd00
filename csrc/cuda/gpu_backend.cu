// mxops::gpu (csrc/cuda/gpu_backend.h) for CUDA, and for ROCm when hipcc compiles this same
// file: the launchers the ORT kernels call. Everything runs on the caller's stream; nothing
// allocates or synchronises.
#include "gpu_runtime.h"  // first: see qdq_kernels.cuh

#include <string>

#include "../common/bf16_qdq.h"
#include "gpu_backend.h"
#include "qdq_launch.h"

namespace mxops::gpu {
namespace {

constexpr int kThreads = 256;

// A one-element tensor is returned unchanged (rounded to bfloat16 first when asked), as the
// CPU backend does.
template <class IO>
__global__ void identity_kernel(const typename IO::T* x, typename IO::T* y, bool bf16_first) {
  const typename IO::T raw = *x;
  *y = bf16_first ? IO::store(bf16_round_bits(IO::load(raw))) : raw;
}

__device__ __forceinline__ int64_t channel_of(int64_t i, int64_t length, int64_t inner) {
  if (((i | length | inner) >> 31) == 0)
    return static_cast<uint32_t>(i) / static_cast<uint32_t>(inner) % static_cast<uint32_t>(length);
  return i / inner % length;
}

// The BF16 quantize and dequantize (bf16_qdq.h) as element functions, so that one
// grid-stride kernel serves both directions.
struct Bf16QuantizeElement {
  MXOPS_HD uint16_t operator()(float x, float s, uint16_t z) const { return bf16_quantize(x, s, z); }
};
struct Bf16DequantizeElement {
  MXOPS_HD float operator()(uint16_t y, float s, uint16_t z) const { return bf16_dequantize(y, s, z); }
};
struct Bf16QuantizeDequantizeElement {
  MXOPS_HD float operator()(float x, float s, uint16_t z) const {
    return bf16_quantize_dequantize(x, s, z);
  }
};

template <class Element, class In, class Out>
__global__ void bf16_linear_kernel(const In* __restrict__ in, const float* __restrict__ scale,
                                   const uint16_t* __restrict__ zero_point, bool per_channel,
                                   int64_t n, int64_t length, int64_t inner,
                                   Out* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t c = per_channel ? channel_of(i, length, inner) : 0;
    out[i] = Element{}(in[i], scale[c], zero_point[c]);
  }
}

template <class IO>
void launch_identity(const void* x, void* y, bool bf16_first, cudaStream_t stream) {
  using T = typename IO::T;
  MXOPS_LAUNCH(1, 1, stream, identity_kernel<IO>)(static_cast<const T*>(x), static_cast<T*>(y),
                                                  bf16_first);
}

}  // namespace

const char* execution_provider() { return MXOPS_GPU_EXECUTION_PROVIDER; }

std::string launch_quantize_dequantize(const QdqParams& params, DType t, const void* x, void* y,
                                       const Geometry& geometry, void* stream) {
  // onnxruntime's NCHWc layout exists on its CPU provider only; these kernels read the plain
  // layout, so a blocked input would give wrong numbers.
  if (params.nchwc_block != 0 || geometry.lanes != 1)
    return "attribute 'nchwc_block' = " + std::to_string(params.nchwc_block) +
           " is for the CPU kernels only (onnxruntime's NCHWc layout); allowed on " +
           execution_provider() + ": 0";
  if (params.input_divisor != 0)
    return "attribute 'input_divisor' = " + std::to_string(params.input_divisor) +
           " is for the CPU kernels only; allowed on " + execution_provider() + ": 0";
  if (params.input_hardswish)
    return std::string("attribute 'input_hardswish' = 1 is for the CPU kernels only; allowed on ") +
           execution_provider() + ": 0";
  if (geometry.num_elements == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  if (geometry.identity) {
    switch (t) {
      case DType::kFloat32: launch_identity<Float32>(x, y, params.bf16_first, s); break;
      case DType::kFloat16: launch_identity<Float16>(x, y, params.bf16_first, s); break;
      case DType::kBFloat16: launch_identity<BFloat16>(x, y, params.bf16_first, s); break;
    }
    return launch_status("the one-element copy");
  }
  switch (t) {
    case DType::kFloat32: launch_qdq_for<Float32>(params, t, x, y, geometry, s); break;
    case DType::kFloat16: launch_qdq_for<Float16>(params, t, x, y, geometry, s); break;
    case DType::kBFloat16: launch_qdq_for<BFloat16>(params, t, x, y, geometry, s); break;
  }
  return launch_status(params.method == Method::kMx ? "the MX quantize-dequantize kernel"
                                                    : "the BFP quantize-dequantize kernel");
}

namespace {

// One of the BF16 ops' grid-stride kernels over the tensor; `what` names it in an error.
template <class Element, class In, class Out>
std::string launch_bf16(const In* in, const float* scale, const uint16_t* zero_point,
                        bool per_channel, const Geometry& g, Out* out, void* stream,
                        const char* what) {
  if (g.num_elements == 0) return "";
  MXOPS_LAUNCH(elementwise_grid(g.num_elements, kThreads), kThreads,
               static_cast<cudaStream_t>(stream), bf16_linear_kernel<Element, In, Out>)(
      in, scale, zero_point, per_channel, g.num_elements, g.length, g.inner, out);
  return launch_status(what);
}

}  // namespace

std::string launch_bf16_quantize_linear(const float* x, const float* scale,
                                        const uint16_t* zero_point, bool per_channel,
                                        const Geometry& g, uint16_t* y, void* stream) {
  return launch_bf16<Bf16QuantizeElement>(x, scale, zero_point, per_channel, g, y, stream,
                                          "the bfloat16 quantize kernel");
}

std::string launch_bf16_dequantize_linear(const uint16_t* y, const float* scale,
                                          const uint16_t* zero_point, bool per_channel,
                                          const Geometry& g, float* x, void* stream) {
  return launch_bf16<Bf16DequantizeElement>(y, scale, zero_point, per_channel, g, x, stream,
                                            "the bfloat16 dequantize kernel");
}

std::string launch_bf16_quantize_dequantize(const float* x, const float* scale,
                                            const uint16_t* zero_point, bool per_channel,
                                            const Geometry& g, float* y, void* stream) {
  return launch_bf16<Bf16QuantizeDequantizeElement>(x, scale, zero_point, per_channel, g, y,
                                                    stream,
                                                    "the bfloat16 quantize-dequantize kernel");
}

}  // namespace mxops::gpu
