// pybind11 module ort_mx_ops._native: the CPU kernels on numpy arrays, so that Python code
// (the quantizer folding weights offline, tests) gets exactly the bits an ORT node computes.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "../common/params.h"
#include "../cpu/qdq_cpu.h"

namespace py = pybind11;
using namespace mxops;

namespace {

// Spreads tasks over up to `threads` std::threads (the calling thread included).
cpu::TaskRunner thread_runner(int threads) {
  return [threads](int64_t n_tasks, const std::function<void(int64_t)>& body) {
    const int64_t workers = std::min<int64_t>(std::max(threads, 1), n_tasks);
    if (workers <= 1) return cpu::run_serial(n_tasks, body);
    std::atomic<int64_t> next{0};
    auto work = [&] {
      for (int64_t t = next++; t < n_tasks; t = next++) body(t);
    };
    std::vector<std::thread> pool;
    for (int64_t i = 1; i < workers; ++i) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
  };
}

AttributeSource dict_attributes(const py::dict& attrs) {
  AttributeSource src;
  src.get_int = [attrs](const char* name) -> std::optional<int64_t> {
    if (!attrs.contains(name)) return std::nullopt;
    py::object v = attrs[name];
    if (!py::isinstance<py::int_>(v))
      throw InvalidArgument{std::string("attribute '") + name + "' must be an integer"};
    return v.cast<int64_t>();
  };
  src.get_string = [attrs](const char* name) -> std::optional<std::string> {
    if (!attrs.contains(name)) return std::nullopt;
    py::object v = attrs[name];
    if (!py::isinstance<py::str>(v))
      throw InvalidArgument{std::string("attribute '") + name + "' must be a string"};
    return v.cast<std::string>();
  };
  return src;
}

DType parse_dtype(const py::array& x, const std::string& dtype) {
  const char kind = x.dtype().kind();
  const auto size = x.dtype().itemsize();
  if (dtype == "bfloat16") {
    if (kind != 'u' || size != 2)
      throw InvalidArgument{"dtype='bfloat16' needs a uint16 array of bfloat16 bit patterns"};
    return DType::kBFloat16;
  }
  if (dtype.empty() && kind == 'f' && size == 4) return DType::kFloat32;
  if (dtype.empty() && kind == 'f' && size == 2) return DType::kFloat16;
  throw InvalidArgument{"unsupported input type " + std::string(py::str(x.dtype())) +
                        ": float32, float16, or uint16 with dtype='bfloat16'"};
}

// op: "BFP" or "MX". Returns a new C-contiguous array of x's dtype and shape.
py::array quantize_dequantize(const std::string& op, py::array x, const py::dict& attrs,
                              const std::string& dtype, int threads) {
  try {
    const std::string op_name = op == "MX" ? "MXQuantizeDequantize" : "BFPQuantizeDequantize";
    if (op != "BFP" && op != "MX") throw InvalidArgument{"op must be \"BFP\" or \"MX\""};
    static const char* kKnown[] = {"bfp_method", "axis", "bit_width", "block_size",
                                   "rounding_mode", "sub_block_size", "sub_block_shift_bits",
                                   "convert_to_bfloat_before_bfp",
                                   "use_compiler_version_cpu_kernel", "element_dtype"};
    for (auto item : attrs) {
      const auto key = item.first.cast<std::string>();
      if (std::none_of(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return key == k; }))
        throw InvalidArgument{op_name + ": unknown attribute '" + key + "'"};
    }
    const AttributeSource src = dict_attributes(attrs);
    const QdqParams params =
        op == "MX" ? parse_mx_attributes(op_name, src) : parse_bfp_attributes(op_name, src);
    const DType t = parse_dtype(x, dtype);
    x = py::array::ensure(x, py::array::c_style);
    std::vector<int64_t> shape(x.shape(), x.shape() + x.ndim());
    const Geometry g = make_geometry(op_name, shape, params.axis);
    py::array y(x.dtype(), std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
    const void* in = x.data();
    void* out = y.mutable_data();
    {
      py::gil_scoped_release release;
      cpu::quantize_dequantize(params, t, in, out, g, thread_runner(threads));
    }
    return y;
  } catch (const InvalidArgument& e) {
    throw py::value_error(e.message);
  }
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "ort-mx-ops CPU kernels on numpy arrays (same bits as the ONNX Runtime ops)";
  m.def("quantize_dequantize", &quantize_dequantize, py::arg("op"), py::arg("x"),
        py::arg("attrs"), py::arg("dtype") = "", py::arg("threads") = 1,
        "Block quantize-dequantize of x; op is \"BFP\" or \"MX\"; attrs as the ONNX node's.");
}
