"""The number formats of SPEC section 3, in one table each.

``MX_ELEMENT_FORMATS`` describes the element types of ``MXQuantizeDequantize``;
``CONFIGS`` maps Quark's configuration names to the op and attributes they stand for.
The native library validates the same names (csrc/common/params.h).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["MXElementFormat", "MX_ELEMENT_FORMATS", "BFP_METHODS", "QuantConfig", "CONFIGS",
           "QUARK_DOMAIN", "LEGACY_DOMAIN", "PRODUCT_DOMAIN"]

QUARK_DOMAIN = "com.amd.quark"
LEGACY_DOMAIN = "com.vai.quantize"
PRODUCT_DOMAIN = "com.ort_mx_ops"  # ops that Quark does not have

# bfp_method names and the method each one means ("to_bfp_prime_shared" is an old alias).
BFP_METHODS = {"to_bfp": "to_bfp", "to_bfp_prime": "to_bfp_prime",
               "to_bfp_prime_shared": "to_bfp_prime"}


@dataclass(frozen=True)
class MXElementFormat:
    """One MX element type: exponent/mantissa bits (0/0 for int8), emax and max normal."""
    name: str
    exponent_bits: int
    mantissa_bits: int
    emax: int
    max_normal: float

    @property
    def is_integer(self) -> bool:
        return self.exponent_bits == 0

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1


MX_ELEMENT_FORMATS: dict[str, MXElementFormat] = {f.name: f for f in [
    MXElementFormat("fp8_e5m2", 5, 2, 15, 57344.0),
    MXElementFormat("fp8_e4m3", 4, 3, 8, 448.0),
    MXElementFormat("fp6_e3m2", 3, 2, 4, 28.0),
    MXElementFormat("fp6_e2m3", 2, 3, 2, 7.5),
    MXElementFormat("fp4_e2m1", 2, 1, 2, 6.0),
    MXElementFormat("int8", 0, 0, 0, 127 * 2.0 ** -6),
]}


@dataclass(frozen=True)
class QuantConfig:
    """A named configuration: the op (``"BFP"``, ``"MX"`` or ``"BF16"``) and its attributes."""
    name: str
    op: str
    attrs: dict[str, Any] = field(default_factory=dict)


def _mx(name: str, element_dtype: str) -> QuantConfig:
    return QuantConfig(name, "MX", {"element_dtype": element_dtype, "block_size": 32,
                                    "rounding_mode": 2})


def _microexponent(name: str, bit_width: int) -> QuantConfig:
    return QuantConfig(name, "BFP", {"bfp_method": "to_bfp_prime", "bit_width": bit_width,
                                     "block_size": 16, "sub_block_size": 2,
                                     "sub_block_shift_bits": 1, "rounding_mode": 2})


CONFIGS: dict[str, QuantConfig] = {c.name: c for c in [
    QuantConfig("BF16", "BF16", {}),
    QuantConfig("BFP16", "BFP", {"bfp_method": "to_bfp", "bit_width": 16, "block_size": 8,
                                 "rounding_mode": 2}),
    _microexponent("MX9", 16),
    _microexponent("MX6", 13),
    _microexponent("MX4", 11),
    _mx("MXFP8E5M2", "fp8_e5m2"),
    _mx("MXFP8E4M3", "fp8_e4m3"),
    _mx("MXFP6E3M2", "fp6_e3m2"),
    _mx("MXFP6E2M3", "fp6_e2m3"),
    _mx("MXFP4E2M1", "fp4_e2m1"),
    _mx("MXINT8", "int8"),
]}
