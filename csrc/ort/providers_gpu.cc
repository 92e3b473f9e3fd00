// The CUDA and ROCm libraries: the GPU kernels and the CPU kernels side by side, so a GPU
// session can place a node on either provider.
#include "cpu_backend.h"
#include "packed_ops.h"
#include "gpu_backend.h"

namespace mxops::ort {
void add_providers(Registry& registry) {
  registry.add_provider<CpuBackend>();
  add_packed_ops<CpuBackend>(registry);
  registry.add_provider<GpuBackend>();
  add_packed_ops<GpuBackend>(registry);
}
}  // namespace mxops::ort
