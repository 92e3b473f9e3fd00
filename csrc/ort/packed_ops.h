// MXDequantize / BFPDequantize (csrc/ort/packed_ops.cc): adds them to a custom-op domain.
#pragma once

#include <memory>
#include <vector>

#include <onnxruntime_c_api.h>

namespace mxops::ort_packed {

// Adds both ops for `provider` (gpu: decode with the GPU launcher) to `domain`; `keep` owns
// them for as long as ORT may use them.
void add_packed_ops(OrtCustomOpDomain* domain, const char* provider, bool gpu,
                    std::vector<std::unique_ptr<OrtCustomOp>>& keep);

}  // namespace mxops::ort_packed
