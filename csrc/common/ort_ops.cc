// Op registration: the ONNX Runtime custom ops of SPEC section 2, for every execution provider
// this build serves. The CPU build registers CPU kernels; a GPU build (MXOPS_WITH_GPU, CUDA or
// HIP) registers its GPU kernels for gpu::execution_provider() and the CPU kernels as well, so
// a GPU session can place a node on either.
//
// Each op name is registered once per input type (float, float16, bfloat16) so that ORT's
// type inference gives the output the input's type. Kernels hold only validated, immutable
// parameters: one session may run on many threads and with changing input ranks.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../cpu/qdq_cpu.h"
#include "params.h"
#ifdef MXOPS_WITH_GPU
#include "gpu_backend.h"
#endif

namespace mxops {
namespace {

constexpr const char* kQuarkDomain = "com.amd.quark";
constexpr const char* kLegacyDomain = "com.vai.quantize";
constexpr const char* kCpuProvider = "CPUExecutionProvider";

const OrtApi& api() { return Ort::GetApi(); }

// ------------------------------------------------------------------------------------------
// Small adapters between ORT and the ORT-free kernels
// ------------------------------------------------------------------------------------------

std::string node_label(const OrtKernelInfo* info, const char* op) {
  size_t size = 0;
  std::string name;
  if (OrtStatus* st = api().KernelInfo_GetNodeName(info, nullptr, &size)) {
    api().ReleaseStatus(st);
  } else if (size > 1) {
    name.resize(size);
    if (OrtStatus* st2 = api().KernelInfo_GetNodeName(info, name.data(), &size))
      api().ReleaseStatus(st2);
    name.resize(size > 0 ? size - 1 : 0);
  }
  return name.empty() ? std::string(op) : std::string(op) + " (node '" + name + "')";
}

AttributeSource node_attributes(const OrtKernelInfo* info) {
  AttributeSource src;
  src.get_int = [info](const char* name) -> std::optional<int64_t> {
    int64_t v = 0;
    if (OrtStatus* st = api().KernelInfoGetAttribute_int64(info, name, &v)) {
      api().ReleaseStatus(st);
      return std::nullopt;
    }
    return v;
  };
  src.get_string = [info](const char* name) -> std::optional<std::string> {
    size_t size = 0;
    if (OrtStatus* st = api().KernelInfoGetAttribute_string(info, name, nullptr, &size)) {
      api().ReleaseStatus(st);
      return std::nullopt;
    }
    std::string s(size, '\0');
    if (OrtStatus* st = api().KernelInfoGetAttribute_string(info, name, s.data(), &size)) {
      api().ReleaseStatus(st);
      return std::nullopt;
    }
    s.resize(size > 0 ? size - 1 : 0);
    return s;
  };
  return src;
}

// ORT's intra-op thread pool as a TaskRunner; runs serially if ORT cannot parallelise.
cpu::TaskRunner ort_thread_pool(OrtKernelContext* context) {
  return [context](int64_t n_tasks, const std::function<void(int64_t)>& body) {
    if (n_tasks <= 1) return cpu::run_serial(n_tasks, body);
    auto trampoline = [](void* data, size_t i) {
      (*static_cast<const std::function<void(int64_t)>*>(data))(static_cast<int64_t>(i));
    };
    OrtStatus* st = api().KernelContext_ParallelFor(context, trampoline, static_cast<size_t>(n_tasks),
                                                    0, const_cast<std::function<void(int64_t)>*>(&body));
    if (st) {  // refused before running anything: do the work here
      api().ReleaseStatus(st);
      cpu::run_serial(n_tasks, body);
    }
  };
}

OrtStatusPtr to_status(const std::string& message, OrtErrorCode code = ORT_INVALID_ARGUMENT) {
  return api().CreateStatus(code, message.c_str());
}

// Runs `f` and turns every exception into an ORT status: nothing escapes into ORT.
template <class F>
OrtStatusPtr guarded(const std::string& label, F&& f) {
  try {
    f();
    return nullptr;
  } catch (const InvalidArgument& e) {
    return to_status(e.message);
  } catch (const Ort::Exception& e) {
    return to_status(label + ": " + e.what(), e.GetOrtErrorCode());
  } catch (const std::exception& e) {
    return to_status(label + ": " + e.what(), ORT_FAIL);
  } catch (...) {
    return to_status(label + ": unknown error", ORT_FAIL);
  }
}

bool is_cpu(const char* provider) { return std::string(provider) == kCpuProvider; }

DType dtype_of(ONNXTensorElementDataType t, const std::string& label) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return DType::kFloat32;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return DType::kFloat16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return DType::kBFloat16;
    default:
      throw InvalidArgument{label + ": input 'X' has an unsupported element type (" +
                            std::to_string(static_cast<int>(t)) +
                            "); allowed: float32, float16, bfloat16"};
  }
}

#ifdef MXOPS_WITH_GPU
void* gpu_stream(OrtKernelContext* context) {
  void* stream = nullptr;
  Ort::ThrowOnError(api().KernelContext_GetGPUComputeStream(context, &stream));
  return stream;
}

void check_launch(const std::string& label, const std::string& error) {
  if (!error.empty()) throw InvalidArgument{label + ": GPU launch failed: " + error};
}
#endif

// ------------------------------------------------------------------------------------------
// BFPQuantizeDequantize / MXQuantizeDequantize (and their legacy names)
// ------------------------------------------------------------------------------------------

enum class BlockOpKind { kBfp, kMx };

struct BlockKernel {
  std::string label;
  QdqParams params;
  const char* provider;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    return guarded(label, [&] {
      Ort::KernelContext ctx(context);
      Ort::ConstValue input = ctx.GetInput(0);
      const auto info = input.GetTensorTypeAndShapeInfo();
      const DType t = dtype_of(info.GetElementType(), label);
      const std::vector<int64_t> shape = info.GetShape();
      const Geometry g = make_geometry(label, shape, params.axis);
      Ort::UnownedValue output = ctx.GetOutput(0, shape);
      if (g.num_elements == 0) return;
      const void* x = input.GetTensorRawData();
      void* y = output.GetTensorMutableRawData();
      if (is_cpu(provider)) {
        cpu::quantize_dequantize(params, t, x, y, g, ort_thread_pool(context));
        return;
      }
#ifdef MXOPS_WITH_GPU
      check_launch(label, gpu::launch_quantize_dequantize(params, t, x, y, g, gpu_stream(context)));
#endif
    });
  }
};

struct BlockOp : Ort::CustomOpBase<BlockOp, BlockKernel, true> {
  BlockOp(const char* name, BlockOpKind kind, ONNXTensorElementDataType type, const char* provider)
      : name_(name), kind_(kind), type_(type), provider_(provider) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    std::string label = name_;
    return guarded(label, [&] {
      label = node_label(info, name_);
      const AttributeSource attrs = node_attributes(info);
      QdqParams params = kind_ == BlockOpKind::kBfp ? parse_bfp_attributes(label, attrs)
                                                   : parse_mx_attributes(label, attrs);
      *kernel = new BlockKernel{label, params, provider_};
    });
  }

  const char* GetName() const { return name_; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return type_; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return type_; }

 private:
  const char* name_;
  BlockOpKind kind_;
  ONNXTensorElementDataType type_;
  const char* provider_;
};

// ------------------------------------------------------------------------------------------
// ExtendedQuantizeLinear / ExtendedDequantizeLinear with a bfloat16 zero point (SPEC 2.4)
// ------------------------------------------------------------------------------------------

enum class LinearKind { kQuantize, kDequantize };

struct LinearKernel {
  std::string label;
  int64_t axis;
  LinearKind kind;
  const char* provider;

  // Per tensor (one scale) or per channel (one scale per index of `axis`).
  Geometry channel_geometry(const std::vector<int64_t>& shape, int64_t n_scale,
                            int64_t n_zero_point, bool& per_channel) const {
    if (n_scale != n_zero_point)
      throw InvalidArgument{label + ": inputs 'scale' and 'zero_point' must have the same number "
                            "of elements (got " + std::to_string(n_scale) + " and " +
                            std::to_string(n_zero_point) + ")"};
    per_channel = n_scale != 1;
    const Geometry g = make_geometry(label, shape, per_channel ? axis : 0);
    if (per_channel && n_scale != g.length)
      throw InvalidArgument{label + ": per-channel 'scale' has " + std::to_string(n_scale) +
                            " elements; allowed: 1 or the size of axis " + std::to_string(axis) +
                            " (" + std::to_string(g.length) + ")"};
    return g;
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    return guarded(label, [&] {
      Ort::KernelContext ctx(context);
      Ort::ConstValue input = ctx.GetInput(0);
      Ort::ConstValue scale = ctx.GetInput(1);
      Ort::ConstValue zero_point = ctx.GetInput(2);
      const std::vector<int64_t> shape = input.GetTensorTypeAndShapeInfo().GetShape();
      bool per_channel = false;
      Geometry g = channel_geometry(shape, scale.GetTensorTypeAndShapeInfo().GetElementCount(),
                                    zero_point.GetTensorTypeAndShapeInfo().GetElementCount(),
                                    per_channel);
      Ort::UnownedValue output = ctx.GetOutput(0, shape);
      if (g.num_elements == 0) return;
      const float* s = scale.GetTensorData<float>();
      const auto* zp = static_cast<const uint16_t*>(zero_point.GetTensorRawData());
      const bool cpu_side = is_cpu(provider);
      if (kind == LinearKind::kQuantize) {
        const float* x = input.GetTensorData<float>();
        auto* y = static_cast<uint16_t*>(output.GetTensorMutableRawData());
        if (cpu_side) return cpu::bf16_quantize_linear(x, s, zp, per_channel, g, y, ort_thread_pool(context));
#ifdef MXOPS_WITH_GPU
        check_launch(label, gpu::launch_bf16_quantize_linear(x, s, zp, per_channel, g, y, gpu_stream(context)));
#endif
      } else {
        const auto* y = static_cast<const uint16_t*>(input.GetTensorRawData());
        float* x = output.GetTensorMutableData<float>();
        if (cpu_side) return cpu::bf16_dequantize_linear(y, s, zp, per_channel, g, x, ort_thread_pool(context));
#ifdef MXOPS_WITH_GPU
        check_launch(label, gpu::launch_bf16_dequantize_linear(y, s, zp, per_channel, g, x, gpu_stream(context)));
#endif
      }
    });
  }
};

struct LinearOp : Ort::CustomOpBase<LinearOp, LinearKernel, true> {
  LinearOp(const char* name, LinearKind kind, const char* provider)
      : name_(name), kind_(kind), provider_(provider) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    std::string label = name_;
    return guarded(label, [&] {
      label = node_label(info, name_);
      const int64_t axis = node_attributes(info).get_int("axis").value_or(1);
      *kernel = new LinearKernel{label, axis, kind_, provider_};
    });
  }

  const char* GetName() const { return name_; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    if (i == 1) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    if (i == 2) return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    return kind_ == LinearKind::kQuantize ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
                                          : ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const {
    return kind_ == LinearKind::kQuantize ? ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16
                                          : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }

 private:
  const char* name_;
  LinearKind kind_;
  const char* provider_;
};

// ------------------------------------------------------------------------------------------
// The registry: built once, kept for the life of the process (ORT holds raw pointers).
// ------------------------------------------------------------------------------------------

struct Registry {
  std::vector<std::unique_ptr<OrtCustomOp>> ops;
  OrtCustomOpDomain* quark = nullptr;
  OrtCustomOpDomain* legacy = nullptr;

  void add(OrtCustomOpDomain* domain, std::unique_ptr<OrtCustomOp> op) {
    Ort::ThrowOnError(api().CustomOpDomain_Add(domain, op.get()));
    ops.push_back(std::move(op));
  }

  void add_provider(const char* provider) {
    const ONNXTensorElementDataType types[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                               ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
                                               ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16};
    for (auto type : types) {
      add(quark, std::make_unique<BlockOp>("BFPQuantizeDequantize", BlockOpKind::kBfp, type, provider));
      add(quark, std::make_unique<BlockOp>("MXQuantizeDequantize", BlockOpKind::kMx, type, provider));
      add(legacy, std::make_unique<BlockOp>("BFPFixNeuron", BlockOpKind::kBfp, type, provider));
      add(legacy, std::make_unique<BlockOp>("MXFixNeuron", BlockOpKind::kMx, type, provider));
    }
    add(quark, std::make_unique<LinearOp>("ExtendedQuantizeLinear", LinearKind::kQuantize, provider));
    add(quark, std::make_unique<LinearOp>("ExtendedDequantizeLinear", LinearKind::kDequantize, provider));
    add(legacy, std::make_unique<LinearOp>("VitisQuantizeLinear", LinearKind::kQuantize, provider));
    add(legacy, std::make_unique<LinearOp>("VitisDequantizeLinear", LinearKind::kDequantize, provider));
  }

  Registry() {
    Ort::ThrowOnError(api().CreateCustomOpDomain(kQuarkDomain, &quark));
    Ort::ThrowOnError(api().CreateCustomOpDomain(kLegacyDomain, &legacy));
    add_provider(kCpuProvider);
#ifdef MXOPS_WITH_GPU
    add_provider(gpu::execution_provider());
#endif
  }
};

}  // namespace
}  // namespace mxops

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* ort = api_base->GetApi(ORT_API_VERSION);
  if (ort == nullptr) {
    // An older runtime: the version-1 API can still report why.
    const OrtApi* v1 = api_base->GetApi(1);
    const std::string message =
        "ort-mx-ops needs ONNX Runtime API version " + std::to_string(ORT_API_VERSION) +
        " or newer; this runtime is " + api_base->GetVersionString();
    return v1 ? v1->CreateStatus(ORT_FAIL, message.c_str()) : nullptr;
  }
  Ort::InitApi(ort);
  return mxops::guarded("RegisterCustomOps", [&] {
    static std::once_flag once;
    static mxops::Registry* registry = nullptr;
    std::call_once(once, [] { registry = new mxops::Registry(); });  // never freed: ORT keeps pointers
    Ort::ThrowOnError(ort->AddCustomOpDomain(options, registry->quark));
    Ort::ThrowOnError(ort->AddCustomOpDomain(options, registry->legacy));
  });
}
