"""Quantization configurations: what format goes on activations and weights, and where.

A :class:`FormatSpec` (defined in :mod:`ort_mx_ops.formats`, the catalogue) is one number
format with explicit op attributes (never the axis: the placement policy chooses the axis
per tensor).  A :class:`QuantizationConfig` pairs an activation format with a weight format,
per-tensor overrides, and the placement and emission options.  :func:`get_config` turns a
built-in name into a config.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

from ort_mx_ops.formats import ADAQUANT_SUFFIX, CONFIGS, FormatSpec

from .adaquant import FastFinetune
from .handlers import COMPUTE_OPS

__all__ = ["FormatSpec", "QuantizationConfig", "get_config", "config_names",
           "DEFAULT_OP_TYPES", "PLACEMENTS", "WEIGHT_STORAGES", "WEIGHT_ROUNDINGS", "as_format",
           "FastFinetune"]

# The ops whose inputs the default placement quantizes: the ones that contract a dimension.
DEFAULT_OP_TYPES: tuple[str, ...] = COMPUTE_OPS
PLACEMENTS = ("default", "quark")
WEIGHT_ROUNDINGS = ("nearest", "gptq")
WEIGHT_STORAGES = ("folded", "packed", "onnx")  # docs/packed_weights.md

FormatLike = Union[FormatSpec, str, None]


def config_names(adaquant: bool = False) -> list[str]:
    """The built-in configuration names, in Quark's table order; with ``adaquant``, their
    ``<NAME>_ADAQUANT`` forms (the same formats with fast finetune)."""
    return [n + ADAQUANT_SUFFIX for n in CONFIGS] if adaquant else list(CONFIGS)


def as_format(value: FormatLike) -> Optional[FormatSpec]:
    """``value`` as a FormatSpec: a FormatSpec as it is, a built-in name looked up
    (case-insensitive; "none" and None mean float)."""
    if value is None or isinstance(value, FormatSpec):
        return value
    if isinstance(value, str):
        return None if value.lower() == "none" else FormatSpec.from_name(value)
    raise TypeError(f"a format is a FormatSpec, a built-in name or None, got {type(value)}")


def _label(spec: Optional[FormatSpec]) -> str:
    return spec.name if spec else "float"


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

    ``activation`` and ``weight`` also take a built-in name (``"MXINT8"``).
    ``tensor_formats`` maps tensor names to the format of that one tensor (a FormatSpec, a
    name, or None to keep it float), over the kind's format; its axis is still chosen by the
    placement.

    Emission: ``fold_weights`` stores quantized weight values (computed offline by the native
    kernels) instead of a runtime node per weight; ``weight_storage`` writes folded weights
    as float tensors (``"folded"``), packed codes and exponents decoded by this library's
    ``MXDequantize`` / ``BFPDequantize`` (``"packed"``), or standard blocked
    ``DequantizeLinear`` (``"onnx"``; MXFP8 / MXINT8 / BF16 only), see
    docs/packed_weights.md; ``legacy_names`` emits
    ``com.vai.quantize`` ``BFPFixNeuron`` / ``MXFixNeuron``; for BF16, ``bf16_qdq_to_cast``
    emits ``Cast(BFLOAT16) -> Cast(FLOAT)`` instead of the Extended Q/DQ pair,
    ``bf16_qdq_fused`` emits this library's ``BF16QuantizeDequantize`` (the pair's outputs
    bit for bit, in one node and one pass; Quark's library does not have it), and
    ``bf16_weight_scaled`` / ``bf16_activation_scaled`` divide the tensor by a scale derived
    from its range (weights: their own values; activations: MinMax calibration) before the
    bfloat16 rounding and multiply it back after, so that ``max|x| / scale == bf16_scale_target``.

    Accuracy algorithms (they need calibration data; see docs/quantizer.md):
    ``weight_rounding="gptq"`` rounds each weight block by block along its reduction axis,
    pushing the rounding error onto the weights not yet rounded through the inverse Hessian
    of the layer's calibration inputs (``"nearest"``: plain rounding, the default);
    ``fast_finetune`` (a :class:`FastFinetune`, a dict of its options in our or Quark's
    names, or True for the defaults) runs AdaQuant per layer; ``bias_correction`` shifts
    each bias by the mean output error the layer's weight quantization causes on its
    calibration inputs (layers without a bias input: the per-channel constant of the Add,
    or the mean of the BatchNormalization, that reads their output).  Each is applied to a
    layer only where it lowers that layer's output error on held-out calibration samples.
    ``cross_layer_equalization`` (no calibration data needed) rescales the channels between
    consecutive layers so both weights have the same range per channel, leaving the float
    model's outputs unchanged (:mod:`.equalization`); ``hadamard_rotation`` rotates the
    reduction axis of MatMul / Gemm layers block-wise by a Hadamard matrix, folded into the
    weight and applied to the activation by an added float MatMul (:mod:`.rotation`).  Both
    are off by default (measured in docs/quantizer.md).
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
    weight_storage: str = "folded"
    legacy_names: bool = False
    bf16_qdq_to_cast: bool = False
    bf16_qdq_fused: bool = False
    bf16_weight_scaled: bool = False
    bf16_activation_scaled: bool = False
    bf16_scale_target: float = 1.0
    tensor_formats: Mapping[str, Optional[FormatSpec]] = field(default_factory=dict)
    weight_rounding: str = "nearest"
    fast_finetune: Optional[FastFinetune] = None
    bias_correction: bool = False
    cross_layer_equalization: bool = False
    hadamard_rotation: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "fast_finetune", FastFinetune.from_options(self.fast_finetune))
        if self.weight_rounding not in WEIGHT_ROUNDINGS:
            raise ValueError(f"weight_rounding must be one of {WEIGHT_ROUNDINGS}, got "
                             f"{self.weight_rounding!r}")
        object.__setattr__(self, "activation", as_format(self.activation))
        object.__setattr__(self, "weight", as_format(self.weight))
        object.__setattr__(self, "tensor_formats",
                           {str(k): as_format(v) for k, v in dict(self.tensor_formats).items()})
        if self.bf16_qdq_to_cast and self.bf16_qdq_fused:
            raise ValueError("bf16_qdq_to_cast and bf16_qdq_fused are two forms of BF16: "
                             "choose one")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.activation is None and self.weight is None and \
                not any(self.tensor_formats.values()):
            raise ValueError("QuantizationConfig needs an activation or a weight FormatSpec")
        if not self.bf16_scale_target > 0:
            raise ValueError("bf16_scale_target must be > 0")
        if self.weight_storage not in WEIGHT_STORAGES:
            raise ValueError(f"weight_storage must be one of {WEIGHT_STORAGES}, got "
                             f"{self.weight_storage!r}")
        if self.weight_storage != "folded" and not self.fold_weights:
            raise ValueError(f"weight_storage={self.weight_storage!r} stores folded weights; "
                             "it needs fold_weights=True")
        if isinstance(self.op_types_to_quantize, str) or isinstance(self.nodes_to_exclude, str):
            raise TypeError("op_types_to_quantize and nodes_to_exclude take lists of names")
        object.__setattr__(self, "op_types_to_quantize", tuple(self.op_types_to_quantize))
        object.__setattr__(self, "nodes_to_exclude", tuple(self.nodes_to_exclude))
        if not self.name:
            object.__setattr__(self, "name", self._default_name())

    def _default_name(self) -> str:
        a, w = _label(self.activation), _label(self.weight)
        return a if a == w else f"A:{a}/W:{w}"

    def replace(self, **changes: Any) -> "QuantizationConfig":
        """A copy with the named fields changed (unknown names raise ``TypeError``).  A new
        ``activation`` or ``weight`` renames a config that carried its default name."""
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise TypeError(f"unknown quantization option(s) {unknown}; valid: {sorted(fields)}")
        if ({"activation", "weight"} & set(changes) and "name" not in changes
                and self.name == self._default_name()):
            changes["name"] = ""
        return dataclasses.replace(self, **changes)


# Named configs with one format on activations and another on weights: (activation, weight).
# Quark's MX9_INT8 has per-tensor int8 weights, a format the library does not have; ours
# stores them in MXINT8 (int8 elements with a shared scale per 32).
MIXED_FORMAT_CONFIGS: dict[str, tuple[str, str]] = {"MX9_INT8": ("MX9", "MXINT8")}


def get_config(name: str | QuantizationConfig, **options: Any) -> QuantizationConfig:
    """The built-in configuration ``name`` (the same format on activations and weights) with
    ``options`` applied, or ``name`` itself with the options if it is already a config
    (``<NAME>_ADAQUANT``: the same with ``fast_finetune`` at its defaults); e.g.
    ``get_config("MXFP4E2M1", activation="MXINT8")`` or ``activation=None`` (weight-only);
    ``"MX9_INT8"`` (:data:`MIXED_FORMAT_CONFIGS`) is MX9 on activations, MXINT8 on weights.
    Raises ``ValueError`` naming the valid choices for an unknown name."""
    if isinstance(name, QuantizationConfig):
        return name.replace(**options) if options else name
    if not isinstance(name, str):
        raise TypeError(f"config must be a name or a QuantizationConfig, got {type(name)}")
    pair = MIXED_FORMAT_CONFIGS.get(name.upper())
    if pair is not None:
        base = QuantizationConfig(activation=pair[0], weight=pair[1], name=name.upper())
        return base.replace(**options) if options else base
    spec = FormatSpec.from_name(name)
    if name.upper().endswith(ADAQUANT_SUFFIX):
        plain = get_config(spec.name, **options)
        return plain.replace(name=plain.name + ADAQUANT_SUFFIX,
                             fast_finetune=plain.fast_finetune or FastFinetune())
    base = QuantizationConfig(activation=spec, weight=spec, name=spec.name)
    return base.replace(**options) if options else base
