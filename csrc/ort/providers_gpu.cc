// The CUDA and ROCm libraries: the GPU kernels and the CPU kernels side by side, so a GPU
// session can place a node on either provider.
#include "cpu_backend.h"
#include "gpu_backend.h"

namespace mxops::ort {
void add_providers(Registry& registry) {
  registry.add_provider<CpuBackend>();
  registry.add_provider<GpuBackend>();
}
}  // namespace mxops::ort
