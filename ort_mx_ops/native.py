"""The CPU kernels on numpy arrays, with the signatures of ``ort_mx_ops.reference``.

Results are bit-identical to the ONNX Runtime ops (the same C++ code computes both); the
quantizer uses these to fold weights offline. Arrays of any layout are accepted; the result
is a new C-contiguous array of the input's dtype and shape. bfloat16 is passed as a uint16
array of bit patterns with ``dtype="bfloat16"``.
"""
from __future__ import annotations

import os

import numpy as np

from . import _native

__all__ = ["bfp_quantize_dequantize", "mx_quantize_dequantize", "cpu_isa"]

_DEFAULT_THREADS = os.cpu_count() or 1


def bfp_quantize_dequantize(x: np.ndarray, dtype: str | None = None,
                            threads: int = _DEFAULT_THREADS, **attrs: int | str) -> np.ndarray:
    """``BFPQuantizeDequantize`` with the node's attributes as keyword arguments."""
    return _native.quantize_dequantize("BFP", np.asarray(x), attrs, dtype or "", threads)


def mx_quantize_dequantize(x: np.ndarray, dtype: str | None = None,
                           threads: int = _DEFAULT_THREADS, **attrs: int | str) -> np.ndarray:
    """``MXQuantizeDequantize`` with the node's attributes as keyword arguments."""
    return _native.quantize_dequantize("MX", np.asarray(x), attrs, dtype or "", threads)


def cpu_isa() -> str:
    """The instruction-set path the CPU kernels run now: "scalar", "avx2" or "avx512".

    The best this processor supports, narrowed by the environment variable MXOPS_CPU_ISA
    (read on every call). Raises ValueError for an unknown MXOPS_CPU_ISA value; a path this
    processor cannot run is reported once on stderr and the best available one is returned.
    Two exceptions, where MXOPS_CPU_ISA is unset and this reports "avx512": block ops whose
    blocked axis is innermost run the AVX2 walker on AMD family 19h (Zen 4), and those with
    blocks of 8 elements (BFP16) do on every processor; both measured faster (docs/speed-log.md,
    "An AVX-512 processor" and "An Intel Xeon with AVX-512"). The bits are the same.
    """
    return _native.cpu_isa()
