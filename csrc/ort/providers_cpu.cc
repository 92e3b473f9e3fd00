// The CPU library: CPU kernels only.
#include "cpu_backend.h"

namespace mxops::ort {
void add_providers(Registry& registry) { registry.add_provider<CpuBackend>(); }
}  // namespace mxops::ort
