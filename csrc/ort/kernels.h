// The ONNX Runtime front end: one kernel type per op family, templated on the execution
// provider's backend, so each provider's kernels are registered side by side and no Compute
// asks which provider it runs on. A Backend is a struct with
//
//   static const char* provider();                  // ORT's execution provider name
//   static constexpr bool kNchwc;                   // reads the nchwc_block layout
//   static constexpr bool kInputDivisor;            // divides by input_divisor first (and
//                                                   // takes input_hardswish)
//   static constexpr bool kInPlace;                 // output 0 may reuse input 0's buffer
//   static void quantize_dequantize(OrtKernelContext*, const std::string& label,
//                                   const QdqParams&, DType, const void* x, void* y,
//                                   const Geometry&);
//   static void bf16_quantize_linear(OrtKernelContext*, const std::string& label,
//                                    const float* x, const float* scale,
//                                    const uint16_t* zero_point, bool per_channel,
//                                    const Geometry&, uint16_t* y);
//   static void bf16_dequantize_linear(... const uint16_t* y, ... float* x);
//   static void bf16_quantize_dequantize(... const float* x, ... float* y);
//
// (cpu_backend.h, gpu_backend.h in this folder). Kernels hold only validated, immutable
// parameters: one session may run on many threads and with changing input ranks.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <memory>
#include <string>
#include <vector>

#include "../common/params.h"

namespace mxops::ort {

const OrtApi& api();

// "Op (node 'name')", or "Op" for an unnamed node.
std::string node_label(const OrtKernelInfo* info, const char* op);

// The node's attributes through the kernel info: typed probes, and a search for names close
// to the known ones (ONNX Runtime's C API cannot list a node's attributes).
AttributeSource node_attributes(const OrtKernelInfo* info);

DType dtype_of(ONNXTensorElementDataType t, const std::string& label);

OrtStatusPtr to_status(const std::string& message, OrtErrorCode code = ORT_INVALID_ARGUMENT);

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

// Shape inference for an op whose output 0 has input 0's shape: output 0 gets that shape and
// element type `type` (UNDEFINED: the input's), so that onnxruntime knows the shapes after
// our nodes when it optimises a model (it folds or fuses the Shape nodes that read them, fuses
// MatMul + Add into Gemm, plans the buffers). An input of rank 0 sets nothing (onnxruntime's
// context reports an input without shape as rank 0); a dimension without value or name gets
// a new name.
OrtStatusPtr infer_same_shape(OrtShapeInferContext* ctx, ONNXTensorElementDataType type);

// Lets onnxruntime give a node's output 0 the buffer of its input 0 (the memory planner does
// where input 0 has no other reader left and the sizes match; never a graph input or an
// initializer). The CPU kernels read every element of a block before they write any of it,
// and blocks do not overlap (cpu::quantize_dequantize), so the bits are the same. Quantizing
// in place writes to lines the node has just read instead of a second buffer's: on the 2-core
// Xeon, the orientation classifier's 25 activation nodes of 50-800 KiB (NCHWc, one thread)
// took 0.65 ms instead of 0.75 ms (MXINT8; docs/speed-log.md, "In place").
template <class Backend>
void may_run_in_place(OrtCustomOp& op) {
  if constexpr (Backend::kInPlace) {
    op.GetMayInplace = [](int** input_index, int** output_index) -> size_t {
      *input_index = new int[1]{0};
      *output_index = new int[1]{0};
      return 1;
    };
    op.ReleaseMayInplace = [](int* input_index, int* output_index) {
      delete[] input_index;
      delete[] output_index;
    };
  }
}

// ------------------------------------------------------------------------------------------
// BFPQuantizeDequantize / MXQuantizeDequantize (and their legacy names)
// ------------------------------------------------------------------------------------------

template <class Backend>
struct BlockKernel {
  std::string label;
  QdqParams params;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    return guarded(label, [&] {
      Ort::KernelContext ctx(context);
      Ort::ConstValue input = ctx.GetInput(0);
      const auto info = input.GetTensorTypeAndShapeInfo();
      const DType t = dtype_of(info.GetElementType(), label);
      if (params.input_divisor != 0 && t != DType::kFloat32)
        throw InvalidArgument{label + ": attribute 'input_divisor' = " +
                              std::to_string(params.input_divisor) +
                              " needs a float32 input; allowed for float16 and bfloat16: 0"};
      if (params.input_hardswish && t != DType::kFloat32)
        throw InvalidArgument{label + ": attribute 'input_hardswish' = 1 needs a float32 "
                              "input; allowed for float16 and bfloat16: 0"};
      const std::vector<int64_t> shape = info.GetShape();
      const Geometry g = make_block_geometry(label, shape, params);
      Ort::UnownedValue output = ctx.GetOutput(0, shape);
      if (g.num_elements == 0) return;
      Backend::quantize_dequantize(context, label, params, t, input.GetTensorRawData(),
                                   output.GetTensorMutableRawData(), g);
    });
  }
};

template <class Backend>
struct BlockOp : Ort::CustomOpBase<BlockOp<Backend>, BlockKernel<Backend>, true> {
  BlockOp(const OpSpec& spec, ONNXTensorElementDataType type) : spec_(spec), type_(type) {
    // (the input's type: onnxruntime may run one instance's function for every input type)
    OrtCustomOp::InferOutputShapeFn = [](const OrtCustomOp*, OrtShapeInferContext* ctx) {
      return infer_same_shape(ctx, ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED);
    };
    may_run_in_place<Backend>(*this);
  }

  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    std::string label = spec_.name;
    return guarded(label, [&] {
      label = node_label(info, spec_.name);
      const QdqParams params = parse_block_attributes(spec_.kind, label, node_attributes(info));
      if (params.nchwc_block != 0 && !Backend::kNchwc)
        throw InvalidArgument{label + ": attribute 'nchwc_block' = " +
                              std::to_string(params.nchwc_block) +
                              " is supported on CPUExecutionProvider only (onnxruntime's NCHWc "
                              "layout exists only there); allowed on " + Backend::provider() +
                              ": 0"};
      if (params.input_divisor != 0 && !Backend::kInputDivisor)
        throw InvalidArgument{label + ": attribute 'input_divisor' = " +
                              std::to_string(params.input_divisor) +
                              " is supported on CPUExecutionProvider only; allowed on " +
                              Backend::provider() + ": 0"};
      if (params.input_hardswish && !Backend::kInputDivisor)
        throw InvalidArgument{label + ": attribute 'input_hardswish' = 1 is supported on "
                              "CPUExecutionProvider only; allowed on " + Backend::provider() +
                              ": 0"};
      *kernel = new BlockKernel<Backend>{label, params};
    });
  }

  const char* GetName() const { return spec_.name; }
  const char* GetExecutionProviderType() const { return Backend::provider(); }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return type_; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return type_; }

 private:
  OpSpec spec_;
  ONNXTensorElementDataType type_;
};

// ------------------------------------------------------------------------------------------
// ExtendedQuantizeLinear / ExtendedDequantizeLinear with a bfloat16 zero point, and the two
// in one node (BF16QuantizeDequantize, our own domain): float32 -> float32
// ------------------------------------------------------------------------------------------

// Per tensor (one scale) or per channel (one scale per index of `axis`); sets per_channel.
Geometry channel_geometry(const std::string& label, int64_t axis, const std::vector<int64_t>& shape,
                          int64_t n_scale, int64_t n_zero_point, bool& per_channel);

template <class Backend>
struct LinearKernel {
  std::string label;
  int64_t axis;
  OpKind kind;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) const {
    return guarded(label, [&] {
      Ort::KernelContext ctx(context);
      Ort::ConstValue input = ctx.GetInput(0);
      Ort::ConstValue scale = ctx.GetInput(1);
      Ort::ConstValue zero_point = ctx.GetInput(2);
      const std::vector<int64_t> shape = input.GetTensorTypeAndShapeInfo().GetShape();
      bool per_channel = false;
      const Geometry g = channel_geometry(label, axis, shape,
                                          scale.GetTensorTypeAndShapeInfo().GetElementCount(),
                                          zero_point.GetTensorTypeAndShapeInfo().GetElementCount(),
                                          per_channel);
      Ort::UnownedValue output = ctx.GetOutput(0, shape);
      if (g.num_elements == 0) return;
      const float* s = scale.GetTensorData<float>();
      const auto* zp = static_cast<const uint16_t*>(zero_point.GetTensorRawData());
      if (kind == OpKind::kBf16Quantize)
        Backend::bf16_quantize_linear(context, label, input.GetTensorData<float>(), s, zp, per_channel, g,
                                      static_cast<uint16_t*>(output.GetTensorMutableRawData()));
      else if (kind == OpKind::kBf16QuantizeDequantize)
        Backend::bf16_quantize_dequantize(context, label, input.GetTensorData<float>(), s, zp,
                                          per_channel, g, output.GetTensorMutableData<float>());
      else
        Backend::bf16_dequantize_linear(context, label, static_cast<const uint16_t*>(input.GetTensorRawData()),
                                        s, zp, per_channel, g, output.GetTensorMutableData<float>());
    });
  }
};

template <class Backend>
struct LinearOp : Ort::CustomOpBase<LinearOp<Backend>, LinearKernel<Backend>, true> {
  explicit LinearOp(const OpSpec& spec) : spec_(spec) {
    OrtCustomOp::InferOutputShapeFn = [](const OrtCustomOp* op, OrtShapeInferContext* ctx) {
      return infer_same_shape(ctx, static_cast<const LinearOp*>(op)->GetOutputType(0));
    };
    // (the element-wise float32 -> float32 one: the other two change the element's size)
    if (spec.kind == OpKind::kBf16QuantizeDequantize) may_run_in_place<Backend>(*this);
  }

  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const {
    std::string label = spec_.name;
    return guarded(label, [&] {
      label = node_label(info, spec_.name);
      const int64_t axis = parse_linear_attributes(spec_.kind, label, node_attributes(info));
      *kernel = new LinearKernel<Backend>{label, axis, spec_.kind};
    });
  }

  const char* GetName() const { return spec_.name; }
  const char* GetExecutionProviderType() const { return Backend::provider(); }
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    if (i == 1) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    if (i == 2) return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    return spec_.kind == OpKind::kBf16Dequantize ? ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16
                                                 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const {
    return spec_.kind == OpKind::kBf16Quantize ? ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16
                                               : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }

 private:
  OpSpec spec_;
};

// ------------------------------------------------------------------------------------------
// The registry: built once, kept for the life of the process (ORT holds raw pointers).
// ------------------------------------------------------------------------------------------

struct Registry {
  std::vector<std::unique_ptr<OrtCustomOp>> ops;
  std::vector<std::pair<std::string, OrtCustomOpDomain*>> domains;

  OrtCustomOpDomain* domain(const char* name);
  void add(const char* domain_name, std::unique_ptr<OrtCustomOp> op);

  // Every op of the catalogue for one execution provider; block ops once per input type so
  // that ORT's type inference gives the output the input's type.
  template <class Backend>
  void add_provider() {
    const ONNXTensorElementDataType types[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                               ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
                                               ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16};
    for (const OpSpec& spec : op_catalogue()) {
      if (spec.kind == OpKind::kBfp || spec.kind == OpKind::kMx) {
        for (auto type : types) add(spec.domain, std::make_unique<BlockOp<Backend>>(spec, type));
      } else {
        add(spec.domain, std::make_unique<LinearOp<Backend>>(spec));
      }
    }
  }
};

// Registers the kernels of every execution provider this library serves (defined once per
// library: providers_cpu.cc, providers_gpu.cc).
void add_providers(Registry& registry);

}  // namespace mxops::ort
