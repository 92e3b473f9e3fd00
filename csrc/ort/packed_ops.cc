// The ORT adapters of MXDequantize / BFPDequantize (packed_ops.h).
#include "packed_ops.h"

namespace mxops::ort {

std::vector<int64_t> packed_shape_attribute(const OrtKernelInfo* info, const std::string& label) {
  size_t size = 0;
  if (OrtStatus* st = api().KernelInfoGetAttributeArray_int64(info, "shape", nullptr, &size)) {
    api().ReleaseStatus(st);
    throw InvalidArgument{label + ": attribute 'shape' (ints, the output's shape) is required"};
  }
  std::vector<int64_t> shape(size);
  if (size) Ort::ThrowOnError(api().KernelInfoGetAttributeArray_int64(info, "shape", shape.data(), &size));
  return shape;
}

PackedInputView packed_view_of(const OrtValue* value) {
  PackedInputView v;
  if (value == nullptr) return v;
  Ort::ConstValue cv(value);
  v.count = static_cast<int64_t>(cv.GetTensorTypeAndShapeInfo().GetElementCount());
  v.data = cv.GetTensorRawData();
  return v;
}

packed::PackedInputs check_packed_views(const std::string& label, const packed::PackedOp& op,
                                        bool mx, const std::vector<PackedInputView>& in) {
  auto at = [&](size_t i) { return i < in.size() ? in[i] : PackedInputView{}; };
  const size_t exc = packed::exception_input(mx);
  const PackedInputView shifts = mx ? PackedInputView{} : at(2);
  const PackedInputView idx = at(exc), val = at(exc + 1);
  packed::check_packed_inputs(label, op, at(0).count, at(1).count, shifts.count,
                              std::max<int64_t>(idx.count, 0), std::max<int64_t>(val.count, 0));
  packed::PackedInputs r;
  r.buffers = {static_cast<const uint8_t*>(at(0).data), static_cast<const uint8_t*>(at(1).data),
               static_cast<const uint8_t*>(shifts.data)};
  r.exception_indices = static_cast<const int64_t*>(idx.data);
  r.exception_values = static_cast<const float*>(val.data);
  r.exception_count = std::max<int64_t>(idx.count, 0);
  return r;
}

bool constant_packed_views(const OrtKernelInfo* info, std::vector<PackedInputView>& views) {
  size_t count = 0;
  Ort::ThrowOnError(api().KernelInfo_GetInputCount(info, &count));
  views.assign(count, PackedInputView{});
  for (size_t i = 0; i < count; ++i) {
    size_t size = 0;
    Ort::ThrowOnError(api().KernelInfo_GetInputName(info, i, nullptr, &size));
    if (size <= 1) continue;  // an omitted optional input
    int is_constant = 0;
    const OrtValue* value = nullptr;
    Ort::ThrowOnError(api().KernelInfoGetConstantInput_tensor(info, i, &is_constant, &value));
    if (!is_constant || value == nullptr) return false;
    views[i] = packed_view_of(value);
  }
  return true;
}

}  // namespace mxops::ort
