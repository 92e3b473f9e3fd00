// Op registration with ONNX Runtime (RegisterCustomOps) and the adapters between ORT's
// kernel info / context and the ORT-free catalogue and kernels.
#include <atomic>
#include <cctype>
#include <mutex>
#include <set>

#include "cpu_backend.h"
#include "kernels.h"

namespace mxops::ort {

const OrtApi& api() { return Ort::GetApi(); }

OrtStatusPtr to_status(const std::string& message, OrtErrorCode code) {
  return api().CreateStatus(code, message.c_str());
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

OrtStatusPtr infer_same_shape(OrtShapeInferContext* ctx, ONNXTensorElementDataType type) {
  return guarded("shape inference", [&] {
    OrtTensorTypeAndShapeInfo* in = nullptr;  // owned by the context
    Ort::ThrowOnError(api().ShapeInferContext_GetInputTypeShape(ctx, 0, &in));
    size_t rank = 0;
    Ort::ThrowOnError(api().GetDimensionsCount(in, &rank));
    if (rank == 0) return;  // no shape, or a scalar: nothing to say
    std::vector<int64_t> dims(rank);
    std::vector<const char*> names(rank, nullptr);
    Ort::ThrowOnError(api().GetDimensions(in, dims.data(), rank));
    Ort::ThrowOnError(api().GetSymbolicDimensions(in, names.data(), rank));
    // A dimension without value or name (onnxruntime reports it as -1, and so a model's own
    // dim_value -1) gets a name of its own: the output's dimension is unknown but the rank and
    // the other dimensions are known. (As -1 it would be taken for a value.)
    static std::atomic<uint64_t> unnamed{0};
    std::vector<std::string> fresh(rank);
    for (size_t i = 0; i < rank; ++i) {
      if (names[i] == nullptr) names[i] = "";
      if (dims[i] < 0 && names[i][0] == '\0') {
        fresh[i] = "ort_mx_ops_unk_" + std::to_string(unnamed++);
        names[i] = fresh[i].c_str();
      }
    }
    if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED)
      Ort::ThrowOnError(api().GetTensorElementType(in, &type));
    OrtTensorTypeAndShapeInfo* out = nullptr;
    Ort::ThrowOnError(api().CreateTensorTypeAndShapeInfo(&out));
    std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> owned(
        out, [](OrtTensorTypeAndShapeInfo* p) { api().ReleaseTensorTypeAndShapeInfo(p); });
    Ort::ThrowOnError(api().SetTensorElementType(out, type));
    Ort::ThrowOnError(api().SetDimensions(out, dims.data(), rank));
    Ort::ThrowOnError(api().SetSymbolicDimensions(out, names.data(), rank));
    Ort::ThrowOnError(api().ShapeInferContext_SetOutputTypeShape(ctx, 0, out));
  });
}

namespace {

// True when the ORT call succeeded; releases the status otherwise.
bool ok(OrtStatus* st) {
  if (st == nullptr) return true;
  api().ReleaseStatus(st);
  return false;
}

// The attribute `name` of the node with its type: one typed query per ONNX attribute type
// the C API can read (each fails on a missing attribute and on another type).
AttributeValue probe(const OrtKernelInfo* info, const std::string& name) {
  AttributeValue v;
  const char* n = name.c_str();
  size_t size = 0;
  float f = 0;
  if (ok(api().KernelInfoGetAttribute_int64(info, n, &v.i))) {
    v.type = FoundType::kInt;
  } else if (ok(api().KernelInfoGetAttribute_string(info, n, nullptr, &size))) {
    v.type = FoundType::kString;
    v.s.assign(size, '\0');
    if (ok(api().KernelInfoGetAttribute_string(info, n, v.s.data(), &size)))
      v.s.resize(size > 0 ? size - 1 : 0);
  } else if (ok(api().KernelInfoGetAttribute_float(info, n, &f))) {
    v.type = FoundType::kFloat;
  } else {
    // Some runtimes read a list of either type as an empty list of the other: the longer
    // reading tells which it is.
    size_t n_ints = 0, n_floats = 0;
    const bool ints = ok(api().KernelInfoGetAttributeArray_int64(info, n, nullptr, &n_ints));
    const bool floats = ok(api().KernelInfoGetAttributeArray_float(info, n, nullptr, &n_floats));
    if (ints || floats) v.type = floats && (!ints || n_floats > n_ints) ? FoundType::kFloats : FoundType::kInts;
  }
  return v;
}

// Names a misspelt or misplaced attribute is likely to have: every attribute name of the
// catalogue, and each known name with one character dropped, doubled or swapped with its
// neighbour, without underscores, with '-' for '_', in camel / Pascal / upper case.
std::set<std::string> near_misses(const std::vector<std::string>& known) {
  std::set<std::string> out;
  for (OpKind kind : {OpKind::kBfp, OpKind::kMx, OpKind::kBf16Quantize})
    for (const auto& a : attributes_of(kind)) out.insert(a.name);
  for (const auto& k : known) {
    for (size_t i = 0; i < k.size(); ++i) {
      out.insert(k.substr(0, i) + k.substr(i + 1));
      out.insert(k.substr(0, i + 1) + k.substr(i));
      if (i + 1 < k.size()) {
        std::string t = k;
        std::swap(t[i], t[i + 1]);
        out.insert(t);
      }
    }
    std::string bare, dashed, camel, pascal, upper;
    bool up = false;
    for (char c : k) {
      upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      dashed += c == '_' ? '-' : c;
      if (c == '_') {
        up = true;
        continue;
      }
      bare += c;
      camel += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
      up = false;
    }
    pascal = camel;
    if (!pascal.empty()) pascal[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(pascal[0])));
    out.insert({bare, dashed, camel, pascal, upper});
  }
  for (const auto& k : known) out.erase(k);
  return out;
}

}  // namespace

AttributeSource node_attributes(const OrtKernelInfo* info) {
  AttributeSource src;
  src.get = [info](const std::string& name) { return probe(info, name); };
  src.unknown = [info](const std::vector<std::string>& known) {
    std::vector<std::string> found;
    for (const auto& name : near_misses(known))
      if (probe(info, name).type != FoundType::kAbsent) found.push_back(name);
    return found;
  };
  return src;
}

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

Geometry channel_geometry(const std::string& label, int64_t axis, const std::vector<int64_t>& shape,
                          int64_t n_scale, int64_t n_zero_point, bool& per_channel) {
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

OrtCustomOpDomain* Registry::domain(const char* name) {
  for (auto& d : domains)
    if (d.first == name) return d.second;
  OrtCustomOpDomain* d = nullptr;
  Ort::ThrowOnError(api().CreateCustomOpDomain(name, &d));
  domains.emplace_back(name, d);
  return d;
}

void Registry::add(const char* domain_name, std::unique_ptr<OrtCustomOp> op) {
  Ort::ThrowOnError(api().CustomOpDomain_Add(domain(domain_name), op.get()));
  ops.push_back(std::move(op));
}

}  // namespace mxops::ort

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* ort = api_base->GetApi(ORT_API_VERSION);
  if (ort == nullptr) {
    // An older runtime: the version-1 API can still report why.
    const OrtApi* v1 = api_base->GetApi(1);
    const std::string message =
        "ort-mx-ops needs onnxruntime 1.21 or newer (C API version " +
        std::to_string(ORT_API_VERSION) + "), but this onnxruntime is " +
        api_base->GetVersionString() + ". Upgrade it: pip install 'onnxruntime>=1.21'.";
    return v1 ? v1->CreateStatus(ORT_FAIL, message.c_str()) : nullptr;
  }
  Ort::InitApi(ort);
  return mxops::ort::guarded("RegisterCustomOps", [&] {
    static std::once_flag once;
    static mxops::ort::Registry* registry = nullptr;
    std::call_once(once, [] {
      registry = new mxops::ort::Registry();  // never freed: ORT keeps pointers
      mxops::ort::add_providers(*registry);
    });
    for (auto& d : registry->domains) Ort::ThrowOnError(ort->AddCustomOpDomain(options, d.second));
  });
}
