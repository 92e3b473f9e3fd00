// MXDequantize and BFPDequantize (domain com.ort_mx_ops): a packed weight decoded to float32
// (docs/packed_weights.md), one kernel type per execution provider like the ops of kernels.h.
//
// Inputs: payload (uint8), scales (uint8), then optional: shifts (uint8, BFPDequantize only),
// exception_indices (int64), exception_values (float). Attribute 'shape' gives the output's
// shape; the format attributes are those of MXQuantizeDequantize / BFPQuantizeDequantize.
//
// A Backend adds to the interface of kernels.h
//
//   static constexpr bool kDecodeOnce;  // decode constant inputs once, at kernel creation
//   static void packed_dequantize(OrtKernelContext*, const std::string& label,
//                                 const packed::PackedOp&, const packed::PackedInputs&,
//                                 float* y);     // context nullptr: at creation
//   static void copy_floats(OrtKernelContext*, const float* src, float* y, int64_t n);
//
// CPU (kDecodeOnce): when every input is a constant initializer (the quantizer's packed
// models), the kernel decodes when the session creates it into a buffer it owns, and each run
// copies that buffer to the output; nothing is written after creation, so concurrent runs are
// safe. GPU: decodes on every run on ORT's compute stream.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "../common/packed_params.h"
#include "kernels.h"

namespace mxops::ort {

constexpr const char* kProductDomain = "com.ort_mx_ops";

// The 'shape' attribute (ints), required.
std::vector<int64_t> packed_shape_attribute(const OrtKernelInfo* info, const std::string& label);

// A tensor input's raw bytes and element count; absent: data == nullptr, count == -1.
struct PackedInputView {
  const void* data = nullptr;
  int64_t count = -1;
};

PackedInputView packed_view_of(const OrtValue* value);

// Checks the inputs of a node (in input order) and returns what the decoder reads.
packed::PackedInputs check_packed_views(const std::string& label, const packed::PackedOp& op,
                                        bool mx, const std::vector<PackedInputView>& in);

// The views of a kernel's inputs that are constant initializers; false if an input present
// on the node is not constant.
bool constant_packed_views(const OrtKernelInfo* info, std::vector<PackedInputView>& views);

template <class Backend>
struct PackedKernel {
  std::string label;
  packed::PackedOp op;
  bool mx = true;
  std::vector<float> decoded;  // kDecodeOnce with constant inputs: the output
  bool cached = false;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    return guarded(label, [&] {
      Ort::KernelContext ctx(context);
      Ort::UnownedValue output = ctx.GetOutput(0, op.shape);
      if (op.num_elements == 0) return;
      float* y = output.GetTensorMutableData<float>();
      if constexpr (Backend::kDecodeOnce) {
        if (cached) return Backend::copy_floats(context, decoded.data(), y, op.num_elements);
      }
      std::vector<PackedInputView> views(ctx.GetInputCount());
      for (size_t i = 0; i < views.size(); ++i) {
        const OrtValue* v = nullptr;
        Ort::ThrowOnError(api().KernelContext_GetInput(context, i, &v));
        views[i] = packed_view_of(v);
      }
      Backend::packed_dequantize(context, label, op, check_packed_views(label, op, mx, views), y);
    });
  }
};

template <class Backend>
struct PackedOpDef : Ort::CustomOpBase<PackedOpDef<Backend>, PackedKernel<Backend>, true> {
  explicit PackedOpDef(bool mx) : mx_(mx) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    std::string label = GetName();
    return guarded(label, [&] {
      label = node_label(info, GetName());
      auto k = std::make_unique<PackedKernel<Backend>>();
      k->label = label;
      k->mx = mx_;
      k->op = packed::parse_packed_op(label, mx_, node_attributes(info),
                                      packed_shape_attribute(info, label));
      if constexpr (Backend::kDecodeOnce) {
        std::vector<PackedInputView> views;
        if (k->op.num_elements > 0 && constant_packed_views(info, views)) {
          const packed::PackedInputs in = check_packed_views(label, k->op, mx_, views);
          k->decoded.resize(static_cast<size_t>(k->op.num_elements));
          Backend::packed_dequantize(nullptr, label, k->op, in, k->decoded.data());
          k->cached = true;
        }
      }
      *kernel = k.release();
    });
  }

  const char* GetName() const { return mx_ ? "MXDequantize" : "BFPDequantize"; }
  const char* GetExecutionProviderType() const { return Backend::provider(); }
  size_t GetInputTypeCount() const { return mx_ ? 4 : 5; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    const size_t exceptions = packed::exception_input(mx_);
    if (i == exceptions) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    if (i == exceptions + 1) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i < 2 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }

 private:
  bool mx_;
};

// Both ops for one execution provider, in the com.ort_mx_ops domain.
template <class Backend>
void add_packed_ops(Registry& registry) {
  for (bool mx : {true, false}) registry.add(kProductDomain, std::make_unique<PackedOpDef<Backend>>(mx));
}

}  // namespace mxops::ort
