// C entry points into the GPU kernels, for tests and benchmarks that drive them through ctypes
// on device buffers (CuPy / PyTorch pointers) without onnxruntime-gpu. They parse attributes
// with the same code as the ORT kernels and call the same launchers. All work is queued on
// `stream` (0: the default stream); nothing synchronises.
//
// Each returns 0 on success, or 1 with a message in err[0..err_len) (always NUL-terminated).
#include "gpu_runtime.h"  // first: see qdq_kernels.cuh

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "gpu_backend.h"
#include "../common/params.h"

#define MXOPS_C_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using mxops::AttributeSource;
using mxops::DType;
using mxops::InvalidArgument;

int fail(char* err, size_t err_len, const std::string& message) {
  if (err != nullptr && err_len > 0) {
    const size_t n = message.size() < err_len - 1 ? message.size() : err_len - 1;
    std::memcpy(err, message.data(), n);
    err[n] = '\0';
  }
  return 1;
}

// "key=value;key=value": a value that is a whole decimal integer is an int attribute, any
// other value a string attribute.
struct ParsedAttributes {
  std::vector<std::pair<std::string, std::string>> items;

  explicit ParsedAttributes(const char* text) {
    const std::string s = text == nullptr ? "" : text;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t end = s.find(';', pos);
      if (end == std::string::npos) end = s.size();
      const std::string item = s.substr(pos, end - pos);
      pos = end + 1;
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        throw InvalidArgument{"attribute '" + item + "' is not of the form key=value"};
      items.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
  }

  static bool is_int(const std::string& v) {
    size_t i = (!v.empty() && (v[0] == '-' || v[0] == '+')) ? 1 : 0;
    if (i == v.size()) return false;
    for (; i < v.size(); ++i)
      if (v[i] < '0' || v[i] > '9') return false;
    return true;
  }

  const std::string* find(const char* key) const {
    for (const auto& kv : items)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }

  AttributeSource source() const {
    AttributeSource src;
    src.get = [this](const std::string& name) {
      mxops::AttributeValue v;
      const std::string* text = find(name.c_str());
      if (text == nullptr) return v;
      if (is_int(*text)) {
        v.type = mxops::FoundType::kInt;
        v.i = std::stoll(*text);
      } else {
        v.type = mxops::FoundType::kString;
        v.s = *text;
      }
      return v;
    };
    src.unknown = [this](const std::vector<std::string>& known) {
      std::vector<std::string> out;
      for (const auto& kv : items) {
        bool k = false;
        for (const auto& name : known) k = k || name == kv.first;
        if (!k) out.push_back(kv.first);
      }
      return out;
    };
    return src;
  }
};

DType parse_dtype(const char* dtype) {
  const std::string d = dtype == nullptr ? "" : dtype;
  if (d == "float32") return DType::kFloat32;
  if (d == "float16") return DType::kFloat16;
  if (d == "bfloat16") return DType::kBFloat16;
  throw InvalidArgument{"unsupported dtype '" + d + "': float32, float16 or bfloat16"};
}

std::vector<int64_t> make_shape(const int64_t* shape, int rank) {
  if (rank < 0 || (rank > 0 && shape == nullptr)) throw InvalidArgument{"bad shape"};
  std::vector<int64_t> v(shape, shape + rank);
  for (int64_t d : v)
    if (d < 0) throw InvalidArgument{"negative dimension in shape"};
  return v;
}

}  // namespace

// "CUDAExecutionProvider" or "ROCMExecutionProvider": which GPU build this library is.
MXOPS_C_EXPORT const char* mxops_gpu_execution_provider() {
  return mxops::gpu::execution_provider();
}

// op: "BFP" (BFPQuantizeDequantize) or "MX" (MXQuantizeDequantize); attrs as the node's, e.g.
// "bfp_method=to_bfp_prime;bit_width=13;block_size=16;rounding_mode=2"; dtype: "float32",
// "float16" or "bfloat16" (x and y hold the 16-bit patterns); x, y: device buffers of the
// tensor of `shape` (rank entries), C order; y must not overlap x.
MXOPS_C_EXPORT int mxops_gpu_qdq(const char* op, const char* attrs, const char* dtype,
                                 const int64_t* shape, int rank, const void* x, void* y,
                                 void* stream, char* err, size_t err_len) {
  try {
    const std::string o = op == nullptr ? "" : op;
    if (o != "BFP" && o != "MX") throw InvalidArgument{"op must be \"BFP\" or \"MX\""};
    const std::string op_name = o == "MX" ? "MXQuantizeDequantize" : "BFPQuantizeDequantize";
    const ParsedAttributes parsed(attrs);
    const mxops::QdqParams params = mxops::parse_block_attributes(
        o == "MX" ? mxops::OpKind::kMx : mxops::OpKind::kBfp, op_name, parsed.source());
    const DType t = parse_dtype(dtype);
    const mxops::Geometry g = mxops::make_geometry(op_name, make_shape(shape, rank), params.axis);
    const std::string status = mxops::gpu::launch_quantize_dequantize(params, t, x, y, g, stream);
    if (!status.empty()) return fail(err, err_len, status);
    return 0;
  } catch (const InvalidArgument& e) {
    return fail(err, err_len, e.message);
  } catch (const std::exception& e) {
    return fail(err, err_len, e.what());
  }
}

// ExtendedQuantizeLinear (direction 0: float32 x -> bfloat16 y), ExtendedDequantizeLinear
// (direction 1: bfloat16 x -> float32 y) or BF16QuantizeDequantize (direction 2: float32 x ->
// float32 y) with a bfloat16 zero point. scale (float32) and
// zero_point (bfloat16 bits) hold one value, or, with per_channel, shape[axis] values.
MXOPS_C_EXPORT int mxops_gpu_bf16_qdq(int direction, const int64_t* shape, int rank, int axis,
                                      int per_channel, const void* x, const float* scale,
                                      const uint16_t* zero_point, void* y, void* stream,
                                      char* err, size_t err_len) {
  try {
    static const char* const names[] = {"ExtendedQuantizeLinear", "ExtendedDequantizeLinear",
                                        "BF16QuantizeDequantize"};
    if (direction < 0 || direction > 2) throw InvalidArgument{"direction must be 0, 1 or 2"};
    const mxops::Geometry g = mxops::make_geometry(names[direction], make_shape(shape, rank), axis);
    const bool pc = per_channel != 0;
    std::string status;
    if (direction == 0)
      status = mxops::gpu::launch_bf16_quantize_linear(static_cast<const float*>(x), scale,
                                                       zero_point, pc, g,
                                                       static_cast<uint16_t*>(y), stream);
    else if (direction == 1)
      status = mxops::gpu::launch_bf16_dequantize_linear(static_cast<const uint16_t*>(x), scale,
                                                         zero_point, pc, g,
                                                         static_cast<float*>(y), stream);
    else
      status = mxops::gpu::launch_bf16_quantize_dequantize(static_cast<const float*>(x), scale,
                                                           zero_point, pc, g,
                                                           static_cast<float*>(y), stream);
    if (!status.empty()) return fail(err, err_len, status);
    return 0;
  } catch (const InvalidArgument& e) {
    return fail(err, err_len, e.message);
  } catch (const std::exception& e) {
    return fail(err, err_len, e.what());
  }
}
