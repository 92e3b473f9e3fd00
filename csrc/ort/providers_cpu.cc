// The CPU library: CPU kernels only.
#include "cpu_backend.h"
#include "packed_ops.h"

namespace mxops::ort {
void add_providers(Registry& registry) {
  registry.add_provider<CpuBackend>();
  add_packed_ops<CpuBackend>(registry);
}
}  // namespace mxops::ort
