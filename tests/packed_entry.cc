// Test-only C entry for tests/test_packed_kernels.py: MXDequantize / BFPDequantize through the
// CPU kernel (csrc/cpu/packed_cpu.cc) or the GPU kernel (csrc/cuda/packed_dequantize.cu,
// compiled for the host emulation), attributes parsed by csrc/common/packed_params.cc.
// Never part of a shipped library.
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/packed_params.h"
#include "cpu/packed_cpu.h"
#include "cuda/packed_launch.h"

namespace {
thread_local std::string g_error;
}

// attrs: "name=value;..." (ints or strings). Returns nullptr on success, else the error.
extern "C" const char* packed_decode(int gpu, int mx, const char* attrs, const int64_t* shape,
                                     int rank, const uint8_t* payload, int64_t payload_bytes,
                                     const uint8_t* scales, int64_t scale_count,
                                     const uint8_t* shifts, int64_t shift_bytes,
                                     const int64_t* exception_indices,
                                     const float* exception_values, int64_t exception_count,
                                     float* y) {
  try {
    std::vector<std::pair<std::string, std::string>> kv;
    std::string s(attrs);
    size_t pos = 0;
    while (pos < s.size()) {
      size_t end = s.find(';', pos);
      if (end == std::string::npos) end = s.size();
      const std::string item = s.substr(pos, end - pos);
      const size_t eq = item.find('=');
      if (eq != std::string::npos) kv.emplace_back(item.substr(0, eq), item.substr(eq + 1));
      pos = end + 1;
    }
    auto find = [kv](const char* name) -> std::optional<std::string> {
      for (auto& p : kv)
        if (p.first == name) return p.second;
      return std::nullopt;
    };
    mxops::AttributeSource src;
    src.get = [find](const std::string& n) {
      mxops::AttributeValue v;
      if (auto text = find(n.c_str())) {
        const bool is_int = !text->empty() && text->find_first_not_of("-0123456789") == std::string::npos;
        v.type = is_int ? mxops::FoundType::kInt : mxops::FoundType::kString;
        if (is_int) v.i = std::stoll(*text); else v.s = *text;
      }
      return v;
    };
    src.unknown = [](const std::vector<std::string>&) { return std::vector<std::string>{}; };
    const std::string op = mx ? "MXDequantize" : "BFPDequantize";
    const auto p = mxops::packed::parse_packed_op(op, mx != 0, src,
                                                  std::vector<int64_t>(shape, shape + rank));
    mxops::packed::check_packed_inputs(op, p, payload_bytes, scale_count,
                                       shifts ? shift_bytes : -1, exception_count,
                                       exception_count);
    const mxops::packed::PackedBuffers in{payload, scales, shifts};
    if (gpu) {
      g_error = mxops::gpu::launch_packed_dequantize(p.params, in, p.num_elements,
                                                      exception_indices, exception_values,
                                                      exception_count, y, nullptr);
      return g_error.empty() ? nullptr : g_error.c_str();
    }
    mxops::packed::check_exception_indices(op, p, exception_indices, exception_count);
    mxops::cpu::packed_dequantize(
        p.params, in, p.num_elements, exception_indices, exception_values, exception_count, y,
        [](int64_t n, const std::function<void(int64_t)>& body) {
          for (int64_t i = n; i-- > 0;) body(i);  // backwards: tasks must not depend on order
        });
    return nullptr;
  } catch (const mxops::InvalidArgument& e) {
    g_error = e.message;
    return g_error.c_str();
  }
}
