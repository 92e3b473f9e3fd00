#include "packed_cpu.h"

#include <algorithm>

namespace mxops::cpu {

namespace {
constexpr int64_t kElementsPerTask = int64_t{1} << 16;
}

void packed_dequantize(const packed::PackedParams& params, const packed::PackedBuffers& in,
                       int64_t n, const int64_t* exception_indices, const float* exception_values,
                       int64_t exception_count, float* y, const TaskRunner& run) {
  const int64_t tasks = (n + kElementsPerTask - 1) / kElementsPerTask;
  run_tasks(run, tasks, [&](int64_t task) {
    const int64_t begin = task * kElementsPerTask;
    const int64_t end = std::min(n, begin + kElementsPerTask);
    for (int64_t i = begin; i < end; ++i) y[i] = packed::decode_element(params, in, i);
  });
  for (int64_t k = 0; k < exception_count; ++k) y[exception_indices[k]] = exception_values[k];
}

}  // namespace mxops::cpu
