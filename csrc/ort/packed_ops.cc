// MXDequantize and BFPDequantize (domain com.ort_mx_ops): a packed weight decoded to float32
// (docs/packed_weights.md), for the CPU provider and, in a GPU build, the GPU provider.
//
// Inputs: payload (uint8), scales (uint8), then optional: shifts (uint8, BFPDequantize only),
// exception_indices (int64), exception_values (float). Attribute 'shape' gives the output's
// shape; the format attributes are those of MXQuantizeDequantize / BFPQuantizeDequantize.
//
// CPU: when every input is a constant initializer (the quantizer's packed models), the kernel
// decodes once, when the session creates it, into a buffer it owns; each run then only copies
// that buffer to the output. Nothing is written after creation, so concurrent runs are safe.
// GPU: decodes on every run on ORT's compute stream (as fast as the copy it replaces).
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include "packed_ops.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "../common/packed_params.h"
#include "../cpu/packed_cpu.h"
#ifdef MXOPS_WITH_GPU
#include "../cuda/packed_launch.h"
#endif

namespace mxops::ort_packed {
namespace {

const OrtApi& api() { return Ort::GetApi(); }

enum Input : size_t { kPayload = 0, kScales = 1, kShifts = 2 };

// Slot of the exception inputs: MXDequantize has no shifts input.
size_t exception_slot(bool mx) { return mx ? 2 : 3; }

template <class F>
OrtStatusPtr guarded(const std::string& label, F&& f) {
  try {
    f();
    return nullptr;
  } catch (const InvalidArgument& e) {
    return api().CreateStatus(ORT_INVALID_ARGUMENT, e.message.c_str());
  } catch (const Ort::Exception& e) {
    return api().CreateStatus(e.GetOrtErrorCode(), (label + ": " + e.what()).c_str());
  } catch (const std::exception& e) {
    return api().CreateStatus(ORT_FAIL, (label + ": " + e.what()).c_str());
  } catch (...) {
    return api().CreateStatus(ORT_FAIL, (label + ": unknown error").c_str());
  }
}

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

std::vector<int64_t> shape_attribute(const OrtKernelInfo* info, const std::string& label) {
  size_t size = 0;
  OrtStatus* st = api().KernelInfoGetAttributeArray_int64(info, "shape", nullptr, &size);
  if (st) {
    api().ReleaseStatus(st);
    throw InvalidArgument{label + ": attribute 'shape' (ints, the output's shape) is required"};
  }
  std::vector<int64_t> shape(size);
  if (size) Ort::ThrowOnError(api().KernelInfoGetAttributeArray_int64(info, "shape", shape.data(), &size));
  return shape;
}

// A tensor input's raw bytes and element count; absent: data == nullptr, count == -1.
struct InputView {
  const void* data = nullptr;
  int64_t count = -1;
};

InputView view_of(const OrtValue* value) {
  InputView v;
  if (value == nullptr) return v;
  Ort::ConstValue cv(value);
  v.count = static_cast<int64_t>(cv.GetTensorTypeAndShapeInfo().GetElementCount());
  v.data = cv.GetTensorRawData();
  return v;
}

// Checks the inputs and returns the buffers the decoder reads (on whatever device they are).
struct Inputs {
  packed::PackedBuffers buffers{};
  const int64_t* exception_indices = nullptr;
  const float* exception_values = nullptr;
  int64_t exception_count = 0;
};

Inputs check_inputs(const std::string& label, const packed::PackedOp& op, bool mx,
                    const std::vector<InputView>& in) {
  auto at = [&](size_t i) { return i < in.size() ? in[i] : InputView{}; };
  const size_t exc = exception_slot(mx);
  const InputView shifts = mx ? InputView{} : at(kShifts);
  const InputView idx = at(exc), val = at(exc + 1);
  packed::check_packed_inputs(label, op, at(kPayload).count, at(kScales).count, shifts.count,
                              std::max<int64_t>(idx.count, 0), std::max<int64_t>(val.count, 0));
  Inputs r;
  r.buffers = {static_cast<const uint8_t*>(at(kPayload).data),
               static_cast<const uint8_t*>(at(kScales).data),
               static_cast<const uint8_t*>(shifts.data)};
  r.exception_indices = static_cast<const int64_t*>(idx.data);
  r.exception_values = static_cast<const float*>(val.data);
  r.exception_count = std::max<int64_t>(idx.count, 0);
  return r;
}

// ORT's intra-op thread pool as a TaskRunner; serial where ORT cannot parallelise.
cpu::TaskRunner thread_pool(OrtKernelContext* context) {
  return [context](int64_t n_tasks, const std::function<void(int64_t)>& body) {
    if (n_tasks <= 1) return cpu::run_serial(n_tasks, body);
    auto trampoline = [](void* data, size_t i) {
      (*static_cast<const std::function<void(int64_t)>*>(data))(static_cast<int64_t>(i));
    };
    OrtStatus* st = api().KernelContext_ParallelFor(context, trampoline, static_cast<size_t>(n_tasks), 0,
                                                    const_cast<std::function<void(int64_t)>*>(&body));
    if (st) {
      api().ReleaseStatus(st);
      cpu::run_serial(n_tasks, body);
    }
  };
}

void decode_on_cpu(const std::string& label, const packed::PackedOp& op, const Inputs& in,
                   float* y, const cpu::TaskRunner& run) {
  packed::check_exception_indices(label, op, in.exception_indices, in.exception_count);
  cpu::packed_dequantize(op.params, in.buffers, op.num_elements, in.exception_indices,
                         in.exception_values, in.exception_count, y, run);
}

struct PackedKernel {
  std::string label;
  packed::PackedOp op;
  bool mx;
  bool gpu;
  std::vector<float> decoded;  // CPU, constant inputs: the output, decoded at creation
  bool cached = false;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    return guarded(label, [&] {
      Ort::KernelContext ctx(context);
      Ort::UnownedValue output = ctx.GetOutput(0, op.shape);
      if (op.num_elements == 0) return;
      float* y = output.GetTensorMutableData<float>();
      if (cached) {
        copy_cached(y, thread_pool(context));
        return;
      }
      std::vector<InputView> views(ctx.GetInputCount());
      for (size_t i = 0; i < views.size(); ++i) {
        const OrtValue* v = nullptr;
        Ort::ThrowOnError(api().KernelContext_GetInput(context, i, &v));
        views[i] = view_of(v);
      }
      const Inputs in = check_inputs(label, op, mx, views);
      if (!gpu) return decode_on_cpu(label, op, in, y, thread_pool(context));
#ifdef MXOPS_WITH_GPU
      void* stream = nullptr;
      Ort::ThrowOnError(api().KernelContext_GetGPUComputeStream(context, &stream));
      const std::string error = gpu::launch_packed_dequantize(
          op.params, in.buffers, op.num_elements, in.exception_indices, in.exception_values,
          in.exception_count, y, stream);
      if (!error.empty()) throw InvalidArgument{label + ": GPU launch failed: " + error};
#endif
    });
  }

  // The copy in chunks over ORT's threads: a large weight copies faster on several cores.
  void copy_cached(float* y, const cpu::TaskRunner& run) const {
    constexpr int64_t kChunk = int64_t{1} << 16;
    const int64_t n = op.num_elements;
    run((n + kChunk - 1) / kChunk, [&](int64_t t) {
      const int64_t begin = t * kChunk;
      std::memcpy(y + begin, decoded.data() + begin,
                  static_cast<size_t>(std::min(kChunk, n - begin)) * sizeof(float));
    });
  }

  // CPU only: decodes now if every input present is a constant initializer.
  void decode_constant_inputs(const OrtKernelInfo* info) {
    size_t count = 0;
    Ort::ThrowOnError(api().KernelInfo_GetInputCount(info, &count));
    std::vector<InputView> views(count);
    for (size_t i = 0; i < count; ++i) {
      size_t size = 0;
      Ort::ThrowOnError(api().KernelInfo_GetInputName(info, i, nullptr, &size));
      if (size <= 1) continue;  // an omitted optional input
      int is_constant = 0;
      const OrtValue* value = nullptr;
      Ort::ThrowOnError(api().KernelInfoGetConstantInput_tensor(info, i, &is_constant, &value));
      if (!is_constant || value == nullptr) return;  // decoded on every run instead
      views[i] = view_of(value);
    }
    const Inputs in = check_inputs(label, op, mx, views);
    decoded.resize(static_cast<size_t>(op.num_elements));
    decode_on_cpu(label, op, in, decoded.data(), cpu::run_serial);
    cached = true;
  }
};

struct PackedOpDef : Ort::CustomOpBase<PackedOpDef, PackedKernel, true> {
  PackedOpDef(const char* name, bool mx, const char* provider, bool gpu)
      : name_(name), mx_(mx), provider_(provider), gpu_(gpu) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    std::string label = name_;
    return guarded(label, [&] {
      label = node_label(info, name_);
      auto k = std::make_unique<PackedKernel>();
      k->label = label;
      k->op = packed::parse_packed_op(label, mx_, node_attributes(info), shape_attribute(info, label));
      k->mx = mx_;
      k->gpu = gpu_;
      if (!gpu_) k->decode_constant_inputs(info);
      *kernel = k.release();
    });
  }

  const char* GetName() const { return name_; }
  const char* GetExecutionProviderType() const { return provider_; }
  size_t GetInputTypeCount() const { return mx_ ? 4 : 5; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    const size_t exc = exception_slot(mx_);
    if (i == exc) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    if (i == exc + 1) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i < 2 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }

 private:
  const char* name_;
  bool mx_;
  const char* provider_;
  bool gpu_;
};

}  // namespace

void add_packed_ops(OrtCustomOpDomain* domain, const char* provider, bool gpu,
                    std::vector<std::unique_ptr<OrtCustomOp>>& keep) {
  for (bool mx : {true, false}) {
    keep.push_back(std::make_unique<PackedOpDef>(mx ? "MXDequantize" : "BFPDequantize", mx,
                                                 provider, gpu));
    Ort::ThrowOnError(api().CustomOpDomain_Add(domain, keep.back().get()));
  }
}

}  // namespace mxops::ort_packed
