"""Run a quantized model without the native library: ``onnx.reference`` for the standard ops
and :mod:`ort_mx_ops.reference` (the numpy oracle; docs/formats.md) for ours.

Slow, but independent of the C++ kernels: the tests use it as "the float graph evaluated
with the reference applied at the same places".
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ort_mx_ops import reference
from ort_mx_ops.formats import OPS

__all__ = ["reference_evaluator", "run_reference"]


def _decoded(attrs: dict[str, Any]) -> dict[str, Any]:
    # onnx.reference hands string attributes over as bytes.
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}


class _BFP(OpRun):
    def _run(self, x, **attrs):
        return (reference.bfp_quantize_dequantize(x, **_decoded(attrs)),)


class _MX(OpRun):
    def _run(self, x, **attrs):
        return (reference.mx_quantize_dequantize(x, **_decoded(attrs)),)


def _bf16_bits(zp: Any) -> np.ndarray:
    # onnx.reference hands bfloat16 tensors over as its own float-like dtype or as uint16.
    a = np.asarray(zp)
    if a.dtype == np.uint16:
        return a
    return reference.float32_to_bfloat16_bits(a.astype(np.float32))


class _ExtQ(OpRun):
    def _run(self, x, scale, zero_point, axis=OPS["ExtendedQuantizeLinear"].attr("axis").default):
        return (reference.extended_quantize_linear(x, scale, _bf16_bits(zero_point), axis=axis),)


class _ExtDQ(OpRun):
    def _run(self, y, scale, zero_point,
             axis=OPS["ExtendedDequantizeLinear"].attr("axis").default):
        return (reference.extended_dequantize_linear(_bf16_bits(y), scale,
                                                     _bf16_bits(zero_point), axis=axis),)


class _Bf16Qdq(OpRun):
    def _run(self, x, scale, zero_point,
             axis=OPS["BF16QuantizeDequantize"].attr("axis").default):
        return (reference.bf16_quantize_dequantize(x, scale, _bf16_bits(zero_point), axis=axis),)


_IMPLEMENTATIONS = {"BFP": _BFP, "MX": _MX, "BF16_QUANTIZE": _ExtQ, "BF16_DEQUANTIZE": _ExtDQ,
                    "BF16_QDQ": _Bf16Qdq}


def _classes() -> list[type]:
    """One evaluator class per op of the catalogue, legacy names included."""
    return [type(name, (_IMPLEMENTATIONS[s.kind],), {"op_domain": s.domain})
            for name, s in OPS.items()]


def reference_evaluator(model: onnx.ModelProto | str) -> ReferenceEvaluator:
    """An ``onnx.reference.ReferenceEvaluator`` that also runs the plugin's ops with the numpy
    oracle."""
    return ReferenceEvaluator(model, new_ops=_classes())


def run_reference(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """All graph outputs of ``model`` for ``feeds``, computed by :func:`reference_evaluator`."""
    return reference_evaluator(model).run(None, feeds)
