// pybind11 module ort_mx_ops._native: the CPU kernels on numpy arrays, so that Python code
// (the quantizer folding weights offline, tests) gets exactly the bits an ORT node computes.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

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

FoundType python_type(const py::handle& v) {
  if (py::isinstance<py::bool_>(v) || py::isinstance<py::int_>(v)) return FoundType::kInt;
  if (py::isinstance<py::float_>(v)) return FoundType::kFloat;
  if (py::isinstance<py::str>(v)) return FoundType::kString;
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    bool ints = true;
    for (auto item : v) ints = ints && py::isinstance<py::int_>(item);
    return ints ? FoundType::kInts : FoundType::kFloats;
  }
  return FoundType::kOther;
}

AttributeSource dict_attributes(const py::dict& attrs) {
  AttributeSource src;
  src.get = [attrs](const std::string& name) {
    AttributeValue v;
    if (!attrs.contains(name)) return v;
    py::object value = attrs[py::str(name)];
    v.type = python_type(value);
    if (v.type == FoundType::kInt) v.i = value.cast<int64_t>();
    if (v.type == FoundType::kString) v.s = value.cast<std::string>();
    return v;
  };
  src.unknown = [attrs](const std::vector<std::string>& known) {
    std::vector<std::string> out;
    for (auto item : attrs) {
      const auto key = py::str(item.first).cast<std::string>();
      if (std::find(known.begin(), known.end(), key) == known.end()) out.push_back(key);
    }
    return out;
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

// op: "BFP" or "MX". Returns a new C-contiguous array of x's dtype and shape; in_place: that
// array starts as a copy of x and the kernel reads and writes it (as the ONNX Runtime node
// does where the runtime gives its output the input's buffer), for the tests.
py::array quantize_dequantize(const std::string& op, py::array x, const py::dict& attrs,
                              const std::string& dtype, int threads, bool in_place) {
  try {
    const std::string op_name = op == "MX" ? "MXQuantizeDequantize" : "BFPQuantizeDequantize";
    if (op != "BFP" && op != "MX") throw InvalidArgument{"op must be \"BFP\" or \"MX\""};
    const QdqParams params = parse_block_attributes(op == "MX" ? OpKind::kMx : OpKind::kBfp,
                                                    op_name, dict_attributes(attrs));
    const DType t = parse_dtype(x, dtype);
    x = py::array::ensure(x, py::array::c_style);
    std::vector<int64_t> shape(x.shape(), x.shape() + x.ndim());
    const Geometry g = make_block_geometry(op_name, shape, params);
    py::array y(x.dtype(), std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
    if (in_place) std::memcpy(y.mutable_data(), x.data(), static_cast<size_t>(x.nbytes()));
    const void* in = in_place ? y.data() : x.data();
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

// The kernel benchmark's reference: y = -x, compiled for the baseline instruction set as
// onnxruntime's Neg is; not inlined, so that it is timed as a call, as the kernel is. Its
// loop on a 64-byte boundary: where the linker put it is otherwise up to what precedes it,
// and on a 2-core Xeon the same loop at a 16-byte boundary 16 bytes before a line's end ran
// 1.6-1.9x slower over in-cache arrays than at a 32-byte boundary.
__attribute__((noinline, aligned(64), optimize("align-loops=64"))) void negate(const float* x,
                                                                              float* y,
                                                                              int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = -x[i];
}

// The kernel benchmark's arrays: one region, each array 64-byte aligned after the previous
// one (as in onnxruntime's arena), on 2 MiB pages where Linux grants them (transparent huge
// pages, madvise mode). On 4 KiB pages each process got other physical pages, so other
// cache sets for the same arrays: on a 2-core Xeon the negation loop's best time over the
// same 10 MB of arrays ranged over 1.8x between processes, and a change to the walker could
// not be told from that. In a 2 MiB page the physical address's low 21 bits are the
// virtual one's, so the arrays take the same L2 sets in every run.
class BenchRegion {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;
  explicit BenchRegion(size_t bytes) : size_((bytes + kHugePage - 1) / kHugePage * kHugePage) {
#if defined(__linux__)
    // Over-mapped by a page so that the region can start on a 2 MiB boundary.
    const size_t mapped = size_ + kHugePage;
    void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    map_ = static_cast<char*>(m);
    map_size_ = mapped;
    const auto a = reinterpret_cast<uintptr_t>(map_);
    base_ = map_ + (kHugePage - a % kHugePage) % kHugePage;
    madvise(base_, size_, MADV_HUGEPAGE);  // a hint: refused, the pages stay 4 KiB
#else
    owned_.assign(size_ / sizeof(float) + 16, 0.0f);
    const auto a = reinterpret_cast<uintptr_t>(owned_.data());
    base_ = reinterpret_cast<char*>(owned_.data()) + (64 - a % 64) % 64;
#endif
    std::memset(base_, 0, size_);  // touched now, so the pages are in place before timing
  }
  ~BenchRegion() {
#if defined(__linux__)
    munmap(map_, map_size_);
#endif
  }
  BenchRegion(const BenchRegion&) = delete;
  BenchRegion& operator=(const BenchRegion&) = delete;

  // The next `n` floats, 64-byte aligned.
  float* take(int64_t n) {
    const size_t at = (used_ + 63) / 64 * 64;
    used_ = at + static_cast<size_t>(n) * sizeof(float);
    return reinterpret_cast<float*>(base_ + at);
  }

  // The fraction of the region on huge pages (Linux: AnonHugePages of its mapping in
  // /proc/self/smaps); 0 where unknown.
  double huge_fraction() const {
#if defined(__linux__)
    std::FILE* f = std::fopen("/proc/self/smaps", "r");
    if (!f) return 0.0;
    char line[512];
    bool inside = false;
    double huge = 0.0;
    const auto lo = reinterpret_cast<uintptr_t>(base_), hi = lo + size_;
    while (std::fgets(line, sizeof line, f)) {
      unsigned long start = 0, end = 0;
      if (std::sscanf(line, "%lx-%lx ", &start, &end) == 2 && std::strchr(line, '-') < std::strchr(line, ' ')) {
        inside = start < hi && end > lo;
        continue;
      }
      unsigned long kb = 0;
      if (inside && std::sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) huge += kb * 1024.0;
    }
    std::fclose(f);
    return std::min(1.0, huge / static_cast<double>(size_));
#else
    return 0.0;
#endif
  }

 private:
  size_t size_;
  size_t used_ = 0;
  char* base_ = nullptr;
#if defined(__linux__)
  char* map_ = nullptr;
  size_t map_size_ = 0;
#else
  std::vector<float> owned_;
#endif
};

// For benchmarks/kernel_bench.py: each of `rounds` rounds calls the block op once on each
// float32 array of xs (one thread; copies of the arrays and the outputs in a BenchRegion)
// and then the negation loop on the same array, each call timed alone, after an untimed
// negation of the same array. in_place: the op computes in the output's buffer, which an
// untimed copy of the array fills before each call (as a node that onnxruntime lets write
// over its input); the negation loop still reads the array and writes the output.
// Returns (kernel, negation, huge): per array, the best call's seconds, and the fraction of
// the arrays' region on 2 MiB pages.
py::tuple time_block_op(const std::string& op, const py::list& xs, const py::dict& attrs,
                        int rounds, bool in_place) {
  try {
    const std::string op_name = op == "MX" ? "MXQuantizeDequantize" : "BFPQuantizeDequantize";
    if (op != "BFP" && op != "MX") throw InvalidArgument{"op must be \"BFP\" or \"MX\""};
    if (rounds < 1) throw InvalidArgument{"rounds must be at least 1"};
    const QdqParams params = parse_block_attributes(op == "MX" ? OpKind::kMx : OpKind::kBfp,
                                                    op_name, dict_attributes(attrs));
    struct Case {
      py::array source;
      Geometry g;
      float* x;
      float* out;
    };
    std::vector<Case> cases;
    size_t bytes = 0;
    for (auto item : xs) {
      Case c;
      c.source = py::array::ensure(item, py::array::c_style);
      if (!c.source || c.source.dtype().kind() != 'f' || c.source.dtype().itemsize() != 4)
        throw InvalidArgument{"time_block_op takes float32 arrays"};
      std::vector<int64_t> shape(c.source.shape(), c.source.shape() + c.source.ndim());
      c.g = make_block_geometry(op_name, shape, params);
      bytes += 2 * (static_cast<size_t>(c.g.num_elements) * sizeof(float) + 64);
      cases.push_back(std::move(c));
    }
    BenchRegion region(bytes);
    for (Case& c : cases) {
      c.x = region.take(c.g.num_elements);
      c.out = region.take(c.g.num_elements);
      std::memcpy(c.x, c.source.data(), static_cast<size_t>(c.g.num_elements) * sizeof(float));
    }
    std::vector<double> kernel(cases.size(), 1e30), neg(cases.size(), 1e30);
    {
      py::gil_scoped_release release;
      using clock = std::chrono::steady_clock;
      for (int r = 0; r < rounds; ++r)
        for (size_t i = 0; i < cases.size(); ++i) {
          const Case& c = cases[i];
          const float* x = c.x;
          // Untimed, so that both timed calls find x and the output where the previous one
          // left them (in the caches as far as they fit), as a node does after the node that
          // wrote its input: first in a round, ours would read x from where the round's other
          // arrays pushed it, and the negation loop then from the caches ours filled.
          if (in_place) std::memcpy(c.out, x, static_cast<size_t>(c.g.num_elements) * sizeof(float));
          else negate(x, c.out, c.g.num_elements);
          const auto t0 = clock::now();
          cpu::quantize_dequantize(params, DType::kFloat32, in_place ? c.out : x, c.out, c.g,
                                   cpu::run_serial);
          const auto t1 = clock::now();
          negate(x, c.out, c.g.num_elements);
          const auto t2 = clock::now();
          kernel[i] = std::min(kernel[i], std::chrono::duration<double>(t1 - t0).count());
          neg[i] = std::min(neg[i], std::chrono::duration<double>(t2 - t1).count());
        }
    }
    return py::make_tuple(kernel, neg, region.huge_fraction());
  } catch (const InvalidArgument& e) {
    throw py::value_error(e.message);
  }
}

py::object int_or_none(const std::optional<int64_t>& v) {
  return v ? py::object(py::int_(*v)) : py::object(py::none());
}

// The C++ catalogue (params.h) as plain Python data; see ort_mx_ops._native.catalogue.
py::dict catalogue() {
  py::dict ops;
  for (const OpSpec& op : op_catalogue()) {
    py::dict attrs;
    for (const AttrSpec& a : attributes_of(op.kind)) {
      py::dict d;
      const bool is_int = a.type == AttrType::kInt;
      d["type"] = is_int ? "int" : "string";
      d["default"] = is_int ? py::object(py::int_(a.int_default)) : py::object(py::str(a.string_default));
      d["min"] = int_or_none(a.min);
      d["max"] = int_or_none(a.max);
      d["allowed"] = a.allowed.empty() ? py::object(py::none()) : py::object(py::cast(a.allowed));
      attrs[py::str(a.name)] = d;
    }
    py::dict entry;
    entry["domain"] = op.domain;
    entry["kind"] = op_kind_name(op.kind);
    entry["attrs"] = attrs;
    ops[op.name] = entry;
  }
  py::dict formats;
  for (const MxFormatSpec& f : mx_formats()) {
    py::dict d;
    d["exponent_bits"] = f.exponent_bits;
    d["mantissa_bits"] = f.mantissa_bits;
    d["emax"] = f.emax;
    d["max_normal"] = static_cast<double>(f.max_normal);
    formats[py::str(f.name)] = d;
  }
  py::dict methods;
  for (const BfpMethodSpec& m : bfp_methods()) methods[py::str(m.name)] = m.canonical;
  py::dict out;
  out["ops"] = ops;
  out["mx_element_formats"] = formats;
  out["bfp_methods"] = methods;
  return out;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "ort-mx-ops CPU kernels on numpy arrays (same bits as the ONNX Runtime ops)";
  m.def("quantize_dequantize", &quantize_dequantize, py::arg("op"), py::arg("x"),
        py::arg("attrs"), py::arg("dtype") = "", py::arg("threads") = 1,
        py::arg("in_place") = false,
        "Block quantize-dequantize of x; op is \"BFP\" or \"MX\"; attrs as the ONNX node's; "
        "in_place: the kernel computes in the result's buffer, filled with x first (tests).");
  m.def("time_block_op", &time_block_op, py::arg("op"), py::arg("xs"), py::arg("attrs"),
        py::arg("rounds") = 100, py::arg("in_place") = false,
        "Per float32 array of xs, the best of `rounds` calls of the block op (one thread) and "
        "of a negation loop on the same array, interleaved (copies of the arrays on 2 MiB pages "
        "where Linux grants them): two lists of seconds and the fraction on 2 MiB pages. "
        "in_place: the op computes in its output's buffer, filled with the array first.");
  m.def("cpu_isa", [] {
    try {
      return std::string(cpu::isa_name(cpu::selected_isa()));
    } catch (const InvalidArgument& e) {
      throw py::value_error(e.message);
    }
  }, "The CPU kernels' instruction-set path that runs now: \"scalar\", \"avx2\" or \"avx512\".");
  m.def("catalogue", &catalogue,
        "The ops (names, domains, kinds, attributes with type, default, min, max, allowed "
        "values), MX element formats and bfp_method names, from the tables the validation reads.");
}
