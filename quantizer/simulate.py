"""Run a quantized model without the native library: ``onnx.reference`` for the standard ops
and :mod:`ort_mx_ops.reference` (the numpy oracle of SPEC section 2) for ours.

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
from ort_mx_ops.formats import QUARK_DOMAIN, LEGACY_DOMAIN

__all__ = ["reference_evaluator", "run_reference"]


def _dtype_name(x: np.ndarray) -> str:
    return {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}[x.dtype]


class _BFP(OpRun):
    op_domain = QUARK_DOMAIN

    def _run(self, x, bfp_method="to_bfp", axis=1, bit_width=16, block_size=8, rounding_mode=0,
             sub_block_size=2, sub_block_shift_bits=1, convert_to_bfloat_before_bfp=0,
             use_compiler_version_cpu_kernel=0):
        m = bfp_method.decode() if isinstance(bfp_method, bytes) else bfp_method
        return (reference.bfp_quantize_dequantize(
            x, bfp_method=m, axis=axis, bit_width=bit_width, block_size=block_size,
            rounding_mode=rounding_mode, sub_block_size=sub_block_size,
            sub_block_shift_bits=sub_block_shift_bits,
            convert_to_bfloat_before_bfp=convert_to_bfloat_before_bfp),)


class _MX(OpRun):
    op_domain = QUARK_DOMAIN

    def _run(self, x, element_dtype="int8", axis=1, block_size=32, rounding_mode=0):
        e = element_dtype.decode() if isinstance(element_dtype, bytes) else element_dtype
        return (reference.mx_quantize_dequantize(x, element_dtype=e, axis=axis,
                                                 block_size=block_size,
                                                 rounding_mode=rounding_mode),)


def _bf16_bits(zp: Any) -> np.ndarray:
    # onnx.reference hands bfloat16 tensors over as its own float-like dtype or as uint16.
    a = np.asarray(zp)
    if a.dtype == np.uint16:
        return a
    return reference.float32_to_bfloat16_bits(a.astype(np.float32))


class _ExtQ(OpRun):
    op_domain = QUARK_DOMAIN

    def _run(self, x, scale, zero_point, axis=1):
        return (reference.extended_quantize_linear(x, scale, _bf16_bits(zero_point), axis=axis),)


class _ExtDQ(OpRun):
    op_domain = QUARK_DOMAIN

    def _run(self, y, scale, zero_point, axis=1):
        return (reference.extended_dequantize_linear(_bf16_bits(y), scale,
                                                     _bf16_bits(zero_point), axis=axis),)


def _classes() -> list[type]:
    out = []
    for name, base, domain in [
            ("BFPQuantizeDequantize", _BFP, QUARK_DOMAIN), ("MXQuantizeDequantize", _MX, QUARK_DOMAIN),
            ("ExtendedQuantizeLinear", _ExtQ, QUARK_DOMAIN),
            ("ExtendedDequantizeLinear", _ExtDQ, QUARK_DOMAIN),
            ("BFPFixNeuron", _BFP, LEGACY_DOMAIN), ("MXFixNeuron", _MX, LEGACY_DOMAIN)]:
        out.append(type(name, (base,), {"op_domain": domain}))
    return out


def reference_evaluator(model: onnx.ModelProto | str) -> ReferenceEvaluator:
    """An ``onnx.reference.ReferenceEvaluator`` that also runs the plugin's ops with the numpy
    oracle."""
    return ReferenceEvaluator(model, new_ops=_classes())


def run_reference(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """All graph outputs of ``model`` for ``feeds``, computed by :func:`reference_evaluator`."""
    return reference_evaluator(model).run(None, feeds)
