"""Quantization configurations: what format goes on activations and weights, and where.

A :class:`FormatSpec` is one number format with explicit op attributes (never the axis: the
placement policy chooses the axis per tensor).  A :class:`QuantizationConfig` pairs an
activation spec with a weight spec and carries the placement and emission options.
:func:`get_config` turns a name of SPEC section 3 into a config.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ort_mx_ops.formats import CONFIGS, MX_ELEMENT_FORMATS, BFP_METHODS

__all__ = ["FormatSpec", "QuantizationConfig", "get_config", "config_names",
           "DEFAULT_OP_TYPES", "PLACEMENTS"]

# The ops whose inputs the default placement quantizes: the ones that contract a dimension.
DEFAULT_OP_TYPES: tuple[str, ...] = ("Conv", "ConvTranspose", "Gemm", "MatMul")
PLACEMENTS = ("default", "quark")

# Attribute names (and their defaults) each op accepts, as SPEC section 2 lists them.
_BFP_ATTRS: dict[str, Any] = {"bfp_method": "to_bfp", "bit_width": 16, "block_size": 8,
                              "rounding_mode": 0, "sub_block_size": 2,
                              "sub_block_shift_bits": 1, "convert_to_bfloat_before_bfp": 0,
                              "use_compiler_version_cpu_kernel": 0}
_MX_ATTRS: dict[str, Any] = {"element_dtype": "int8", "block_size": 32, "rounding_mode": 0}


def config_names() -> list[str]:
    """The built-in configuration names of SPEC section 3, in table order."""
    return list(CONFIGS)


@dataclass(frozen=True)
class FormatSpec:
    """One number format: ``op`` is ``"BFP"``, ``"MX"`` or ``"BF16"``; ``attrs`` are the op's
    attributes (defaults filled in by :meth:`full_attrs`); ``name`` labels it in summaries
    and in the names of inserted tensors."""
    op: str
    attrs: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        allowed = {"BFP": _BFP_ATTRS, "MX": _MX_ATTRS, "BF16": {}}.get(self.op)
        if allowed is None:
            raise ValueError(f"FormatSpec.op must be 'BFP', 'MX' or 'BF16', got {self.op!r}")
        if "axis" in self.attrs:
            raise ValueError("FormatSpec.attrs must not set 'axis': the quantizer chooses the "
                             "block axis per tensor (see quantizer/placement.py)")
        unknown = sorted(set(self.attrs) - set(allowed))
        if unknown:
            raise ValueError(f"unknown {self.op} attribute(s) {unknown}; allowed: "
                             f"{sorted(allowed)}")
        attrs = self.full_attrs()
        if self.op == "BFP" and attrs["bfp_method"] not in BFP_METHODS:
            raise ValueError(f"bfp_method must be one of {sorted(BFP_METHODS)}, got "
                             f"{attrs['bfp_method']!r}")
        if self.op == "MX" and attrs["element_dtype"] not in MX_ELEMENT_FORMATS:
            raise ValueError(f"element_dtype must be one of {sorted(MX_ELEMENT_FORMATS)}, "
                             f"got {attrs['element_dtype']!r}")
        if self.op != "BF16" and (int(attrs["block_size"]) < 1
                                  or int(attrs["rounding_mode"]) not in (0, 1, 2)):
            raise ValueError("block_size must be >= 1 and rounding_mode 0, 1 or 2")
        if not self.name:
            object.__setattr__(self, "name", self._default_name())

    def _default_name(self) -> str:
        if self.op == "BF16":
            return "BF16"
        if self.op == "MX":
            return "MX_" + str(self.full_attrs()["element_dtype"])
        a = self.full_attrs()
        return f"BFP_{a['bfp_method']}_{a['bit_width']}"

    @classmethod
    def from_name(cls, name: str) -> "FormatSpec":
        """The format of a SPEC section 3 configuration name (case-insensitive)."""
        return cls(**_named(name))

    def full_attrs(self) -> dict[str, Any]:
        """The op attributes with every default filled in (no axis)."""
        base = {"BFP": _BFP_ATTRS, "MX": _MX_ATTRS, "BF16": {}}[self.op]
        return {**base, **dict(self.attrs)}

    @property
    def block_size(self) -> int:
        """Elements per shared scale (1 for BF16, which has none)."""
        return 1 if self.op == "BF16" else int(self.full_attrs()["block_size"])

    def bits_per_element(self) -> float:
        """Storage cost of one element in this format, shared scales amortised: what a packed
        weight would take (the folded ONNX model still stores float32)."""
        a = self.full_attrs()
        if self.op == "BF16":
            return 16.0
        if self.op == "MX":
            fmt = MX_ELEMENT_FORMATS[a["element_dtype"]]
            element = 8 if fmt.is_integer else 1 + fmt.exponent_bits + fmt.mantissa_bits
            return element + 8 / a["block_size"]
        mantissa_and_sign = a["bit_width"] - 9 + 1
        bits = mantissa_and_sign + 8 / a["block_size"]
        if BFP_METHODS[a["bfp_method"]] == "to_bfp_prime":
            bits += a["sub_block_shift_bits"] / a["sub_block_size"]
        return float(bits)


def _named(name: str) -> dict[str, Any]:
    lookup = {k.upper(): k for k in CONFIGS}
    key = lookup.get(str(name).upper())
    if key is None:
        raise ValueError(f"unknown quantization config {name!r}; choose one of "
                         f"{', '.join(CONFIGS)} or pass a QuantizationConfig")
    c = CONFIGS[key]
    return {"op": c.op, "attrs": dict(c.attrs), "name": c.name}


@dataclass(frozen=True)
class QuantizationConfig:
    """What to quantize and how.

    ``activation`` / ``weight``: the format of each kind of tensor (``None`` leaves that kind
    in float).  Weights are initializers and ``Constant`` outputs; everything else is an
    activation.

    Placement: ``placement="default"`` puts one node on each float input (data and weight;
    bias only with ``quantize_bias``) of ``op_types_to_quantize``, or of every op with
    ``quantize_all_op_types``, blocked along the consumer's reduction axis and never along a
    batch/token (dynamic) axis.  ``placement="quark"`` reproduces Quark's placement: every
    float input of every op, compute ops along their reduction axis, everything else along
    axis 1, no depthwise or token-axis correction.  ``nodes_to_exclude`` names nodes whose
    inputs stay float.

    Emission: ``fold_weights`` stores quantized weight values (computed offline by the native
    kernels) instead of a runtime node per weight; ``legacy_names`` emits
    ``com.vai.quantize`` ``BFPFixNeuron`` / ``MXFixNeuron``; for BF16, ``bf16_qdq_to_cast``
    emits ``Cast(BFLOAT16) -> Cast(FLOAT)`` instead of the Extended Q/DQ pair, and
    ``bf16_weight_scaled`` / ``bf16_activation_scaled`` divide the tensor by a scale derived
    from its range (weights: their own values; activations: MinMax calibration) before the
    bfloat16 rounding and multiply it back after, so that ``max|x| / scale == bf16_scale_target``.
    """
    activation: Optional[FormatSpec]
    weight: Optional[FormatSpec]
    name: str = ""
    placement: str = "default"
    op_types_to_quantize: Sequence[str] = DEFAULT_OP_TYPES
    nodes_to_exclude: Sequence[str] = ()
    quantize_all_op_types: bool = False
    quantize_bias: bool = False
    fold_weights: bool = True
    legacy_names: bool = False
    bf16_qdq_to_cast: bool = False
    bf16_weight_scaled: bool = False
    bf16_activation_scaled: bool = False
    bf16_scale_target: float = 1.0

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.activation is None and self.weight is None:
            raise ValueError("QuantizationConfig needs an activation or a weight FormatSpec")
        if not self.bf16_scale_target > 0:
            raise ValueError("bf16_scale_target must be > 0")
        if isinstance(self.op_types_to_quantize, str) or isinstance(self.nodes_to_exclude, str):
            raise TypeError("op_types_to_quantize and nodes_to_exclude take lists of names")
        object.__setattr__(self, "op_types_to_quantize", tuple(self.op_types_to_quantize))
        object.__setattr__(self, "nodes_to_exclude", tuple(self.nodes_to_exclude))
        if not self.name:
            a = self.activation.name if self.activation else "float"
            w = self.weight.name if self.weight else "float"
            object.__setattr__(self, "name", a if a == w else f"A:{a}/W:{w}")

    def replace(self, **changes: Any) -> "QuantizationConfig":
        """A copy with the named fields changed (unknown names raise ``TypeError``)."""
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise TypeError(f"unknown quantization option(s) {unknown}; valid: {sorted(fields)}")
        return dataclasses.replace(self, **changes)


def get_config(name: str | QuantizationConfig, **options: Any) -> QuantizationConfig:
    """The configuration ``name`` (SPEC section 3; the same format on activations and weights)
    with ``options`` applied, or ``name`` itself with the options if it is already a config.
    Raises ``ValueError`` naming the valid choices for an unknown name."""
    if isinstance(name, QuantizationConfig):
        return name.replace(**options) if options else name
    if not isinstance(name, str):
        raise TypeError(f"config must be a name or a QuantizationConfig, got {type(name)}")
    spec = FormatSpec.from_name(name)
    base = QuantizationConfig(activation=spec, weight=spec, name=spec.name)
    return base.replace(**options) if options else base
