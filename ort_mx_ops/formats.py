"""The catalogue: every op of the library and every number format, defined once.

Everything else reads these tables: the numpy reference, the quantizer, the simulator, the
smoke test, the benchmarks and the tests.  The native library keeps its own table (it
validates attributes in C++); ``ort_mx_ops._native.catalogue()`` returns it in the form of
:func:`catalogue`, and a test asserts the two agree field by field.

* :data:`OPS` -- op name -> :class:`OpSchema` (domain, kind, attributes with their type,
  default and allowed values), legacy names included.
* :data:`MX_ELEMENT_FORMATS` -- the element types of ``MXQuantizeDequantize``.
* :data:`BFP_METHODS` -- ``bfp_method`` values and the method each one means.
* :class:`FormatSpec` -- one number format (op family and attributes, never the axis);
  :data:`CONFIGS` -- the built-in named formats (Quark's configuration names).

docs/formats.md explains the arithmetic of each op.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

__all__ = ["QUARK_DOMAIN", "LEGACY_DOMAIN", "PRODUCT_DOMAIN", "AttrSpec", "OpSchema", "OPS",
           "op_schema", "block_op", "LEGACY_NAMES", "MXElementFormat", "MX_ELEMENT_FORMATS",
           "BFP_METHODS", "FormatSpec", "CONFIGS", "FORMAT_FAMILIES", "catalogue", "LAYOUT_ATTRS",
           "ADAQUANT_SUFFIX", "BLOCK_OPS",
           "resolve_attrs"]

QUARK_DOMAIN = "com.amd.quark"
LEGACY_DOMAIN = "com.vai.quantize"
PRODUCT_DOMAIN = "com.ort_mx_ops"  # ops that Quark does not have

# bfp_method names and the method each one means ("to_bfp_prime_shared" is an old alias).
BFP_METHODS: dict[str, str] = {"to_bfp": "to_bfp", "to_bfp_prime": "to_bfp_prime",
                               "to_bfp_prime_shared": "to_bfp_prime"}

MAX_BLOCK_SIZE = 1 << 30  # the native kernels index blocks with 32-bit offsets
MAX_NCHWC_BLOCK = 128  # nchwc_block: a power of two up to this (docs/formats.md, "NCHWc")


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

    @property
    def bits(self) -> int:
        """Storage bits of one element (sign included)."""
        return 8 if self.is_integer else 1 + self.exponent_bits + self.mantissa_bits


MX_ELEMENT_FORMATS: dict[str, MXElementFormat] = {f.name: f for f in [
    MXElementFormat("fp8_e5m2", 5, 2, 15, 57344.0),
    MXElementFormat("fp8_e4m3", 4, 3, 8, 448.0),
    MXElementFormat("fp6_e3m2", 3, 2, 4, 28.0),
    MXElementFormat("fp6_e2m3", 2, 3, 2, 7.5),
    MXElementFormat("fp4_e2m1", 2, 1, 2, 6.0),
    MXElementFormat("int8", 0, 0, 0, 127 * 2.0 ** -6),
]}


# --------------------------------------------------------------------------------------
# Ops and their attributes
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttrSpec:
    """One node attribute: ``type`` "int" or "string", its default, and the values the
    native library accepts (``min``/``max`` for ints, ``allowed`` for a closed list)."""
    name: str
    type: str
    default: Any
    min: Optional[int] = None
    max: Optional[int] = None
    allowed: Optional[tuple] = None

    def check(self, op: str, value: Any) -> None:
        """Raise ``ValueError`` naming ``op`` and the attribute when ``value`` is not allowed."""
        if self.type == "int":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{op}: attribute {self.name!r} must be an int, got {value!r}")
            if (self.min is not None and value < self.min) or \
                    (self.max is not None and value > self.max):
                hi = "" if self.max is None else f"{self.max}"
                raise ValueError(f"{op}: {self.name} must be in [{self.min}, {hi or 'inf'}], "
                                 f"got {value}")
        elif not isinstance(value, str):
            raise ValueError(f"{op}: attribute {self.name!r} must be a string, got {value!r}")
        if self.allowed is not None and value not in self.allowed:
            raise ValueError(f"{op}: {self.name} must be one of {sorted(self.allowed)}, "
                             f"got {value!r}")


@dataclass(frozen=True)
class OpSchema:
    """One op: its name and domain, its ``kind`` ("BFP", "MX", "BF16_QUANTIZE",
    "BF16_DEQUANTIZE", "BF16_QDQ"), its attributes, and the name it had in the legacy domain."""
    name: str
    domain: str
    kind: str
    attrs: tuple[AttrSpec, ...]
    legacy_name: Optional[str] = None

    def attr(self, name: str) -> AttrSpec:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(name)

    def defaults(self) -> dict[str, Any]:
        """Every attribute with its default value."""
        return {a.name: a.default for a in self.attrs}


_AXIS = AttrSpec("axis", "int", 1)
_LINEAR_ATTRS = (_AXIS,)  # Extended Q/DQ: the per-channel axis of scale and zero point
_ROUNDING = AttrSpec("rounding_mode", "int", 0, 0, 2)
# Our extension (not a Quark attribute): the input is in onnxruntime's NCHWc layout with
# channel blocks of this size (0: the plain layout); a power of two, see resolve_attrs.
_NCHWC_BLOCK = AttrSpec("nchwc_block", "int", 0, 0, MAX_NCHWC_BLOCK)
# Our extension, with nchwc_block: how many of the input's channels are the tensor's (0: all);
# onnxruntime pads an NCHWc tensor's channels to a multiple of the block, see resolve_attrs.
_NCHWC_CHANNELS = AttrSpec("nchwc_channels", "int", 0, 0, None)
# Our extension: each float32 element is divided by this integer (1 .. 2^24, exact in
# float32) before the op quantizes it, as a Div node before the op would (0: not divided).
MAX_INPUT_DIVISOR = 1 << 24
_INPUT_DIVISOR = AttrSpec("input_divisor", "int", 0, 0, MAX_INPUT_DIVISOR)
# Our extension: 1: each float32 element x is replaced by x * clip(x + 3, 0, 6) first (the
# numerator of an exported hard-swish), before input_divisor; 0: the input as it is.
_INPUT_HARDSWISH = AttrSpec("input_hardswish", "int", 0, 0, 1)
# Attributes that describe a node's tensor (where its blocks lie, what is computed from it
# first), not a number format.
LAYOUT_ATTRS = ("axis", "nchwc_block", "nchwc_channels", "input_divisor", "input_hardswish")

_BFP_ATTRS = (
    AttrSpec("bfp_method", "string", "to_bfp", allowed=tuple(BFP_METHODS)),
    _AXIS,
    AttrSpec("bit_width", "int", 16, 10, 32),
    AttrSpec("block_size", "int", 8, 1, MAX_BLOCK_SIZE),
    _ROUNDING,
    # The sub-block attributes are checked only for to_bfp_prime (to_bfp ignores them), and
    # sub_block_size must also divide block_size: see resolve_attrs.
    AttrSpec("sub_block_size", "int", 2, 1, None),
    AttrSpec("sub_block_shift_bits", "int", 1, 0, 8),
    AttrSpec("convert_to_bfloat_before_bfp", "int", 0, 0, 1),
    AttrSpec("use_compiler_version_cpu_kernel", "int", 0, 0, 0),  # not implemented yet
    _NCHWC_BLOCK,
    _NCHWC_CHANNELS,
    _INPUT_DIVISOR,
    _INPUT_HARDSWISH,
)
_MX_ATTRS = (
    AttrSpec("element_dtype", "string", "int8", allowed=tuple(MX_ELEMENT_FORMATS)),
    _AXIS,
    AttrSpec("block_size", "int", 32, 1, MAX_BLOCK_SIZE),
    _ROUNDING,
    _NCHWC_BLOCK,
    _NCHWC_CHANNELS,
    _INPUT_DIVISOR,
    _INPUT_HARDSWISH,
)

_CANONICAL = [
    OpSchema("BFPQuantizeDequantize", QUARK_DOMAIN, "BFP", _BFP_ATTRS, "BFPFixNeuron"),
    OpSchema("MXQuantizeDequantize", QUARK_DOMAIN, "MX", _MX_ATTRS, "MXFixNeuron"),
    OpSchema("ExtendedQuantizeLinear", QUARK_DOMAIN, "BF16_QUANTIZE", _LINEAR_ATTRS,
             "VitisQuantizeLinear"),
    OpSchema("ExtendedDequantizeLinear", QUARK_DOMAIN, "BF16_DEQUANTIZE", _LINEAR_ATTRS,
             "VitisDequantizeLinear"),
    # Our own op: the Extended pair above in one node (same inputs, float32 -> float32).
    OpSchema("BF16QuantizeDequantize", PRODUCT_DOMAIN, "BF16_QDQ", _LINEAR_ATTRS),
]

# Canonical name -> legacy (com.vai.quantize) name.
LEGACY_NAMES: dict[str, str] = {s.name: s.legacy_name for s in _CANONICAL if s.legacy_name}

# Every op the library registers, legacy names included (same kind and attributes).
OPS: dict[str, OpSchema] = {}
for _s in _CANONICAL:
    OPS[_s.name] = _s
    if _s.legacy_name:
        OPS[_s.legacy_name] = OpSchema(_s.legacy_name, LEGACY_DOMAIN, _s.kind, _s.attrs)

# The block (BFP / MX) quantize-dequantize ops, legacy names included.
BLOCK_OPS: frozenset[str] = frozenset(n for n, s in OPS.items() if s.kind in ("BFP", "MX"))

# FormatSpec.op -> the op that computes that family ("BF16" is a pair, see FormatSpec).
FORMAT_FAMILIES: dict[str, Optional[str]] = {"BFP": "BFPQuantizeDequantize",
                                             "MX": "MXQuantizeDequantize", "BF16": None}


def op_schema(name: str) -> OpSchema:
    """The schema of op ``name`` (canonical or legacy); ``KeyError`` for an unknown op."""
    return OPS[name]


def block_op(family: str, legacy: bool = False) -> tuple[str, str]:
    """(op type, domain) of the quantize-dequantize op of ``family`` ("BFP" or "MX")."""
    name = FORMAT_FAMILIES[family]
    if name is None:
        raise ValueError(f"{family} has no single quantize-dequantize op")
    if legacy:
        name = LEGACY_NAMES[name]
    return name, OPS[name].domain


def resolve_attrs(op: str, attrs: Mapping[str, Any], *, allow_axis: bool = True) -> dict[str, Any]:
    """``attrs`` of op ``op`` with every default filled in, validated as the native library
    validates them: ``ValueError`` for an unknown attribute or a value out of range.
    ``allow_axis=False`` (a number format's attributes): without the layout attributes
    (:data:`LAYOUT_ATTRS`, which belong to a tensor)."""
    schema = OPS[op]
    known = {a.name for a in schema.attrs}
    if not allow_axis:
        known.difference_update(LAYOUT_ATTRS)
    unknown = sorted(set(attrs) - known)
    if unknown:
        raise ValueError(f"{op}: unknown attribute(s) {unknown}; allowed: {sorted(known)}")
    full = {**schema.defaults(), **attrs}
    if not allow_axis:
        for name in LAYOUT_ATTRS:
            full.pop(name, None)
    prime = schema.kind == "BFP" and BFP_METHODS.get(full["bfp_method"]) == "to_bfp_prime"
    for a in schema.attrs:
        if a.name in full and (prime or a.name not in ("sub_block_size", "sub_block_shift_bits")):
            a.check(op, full[a.name])
    if prime and full["block_size"] % full["sub_block_size"]:
        raise ValueError(f"{op}: sub_block_size ({full['sub_block_size']}) must divide "
                         f"block_size ({full['block_size']})")
    lanes, bs = full.get("nchwc_block", 0), full.get("block_size", 1)
    if full.get("nchwc_channels", 0) and not lanes:
        raise ValueError(f"{op}: nchwc_channels ({full['nchwc_channels']}) needs nchwc_block; "
                         "allowed without it: 0")
    if lanes:
        if lanes & (lanes - 1):
            raise ValueError(f"{op}: nchwc_block must be 0 or a power of two, got {lanes}")
        if bs % lanes and lanes % bs:
            raise ValueError(f"{op}: nchwc_block ({lanes}) must divide block_size ({bs}) or be "
                             "a multiple of it")
        sub = full.get("sub_block_size", 0)
        if prime and bs > lanes > 1 and sub % lanes and lanes % sub:
            raise ValueError(f"{op}: sub_block_size ({sub}) must divide nchwc_block ({lanes}) "
                             f"or be a multiple of it (block_size {bs})")
    return full


# --------------------------------------------------------------------------------------
# Formats: one number format, and the named ones
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FormatSpec:
    """One number format: ``op`` is the family ``"BFP"``, ``"MX"`` or ``"BF16"``; ``attrs``
    are the family's op attributes (defaults filled in by :meth:`full_attrs`, never the axis:
    the axis belongs to a tensor, not to a format); ``name`` labels it in summaries and in
    the names of inserted tensors.  BF16 has no attributes: it is the Extended Q/DQ pair
    with scale 1 and zero point 0 (or a Cast pair)."""
    op: str
    attrs: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        if self.op not in FORMAT_FAMILIES:
            raise ValueError(f"FormatSpec.op must be 'BFP', 'MX' or 'BF16', got {self.op!r}")
        if "axis" in self.attrs:
            raise ValueError("FormatSpec.attrs must not set 'axis': the quantizer chooses the "
                             "block axis per tensor (see docs/quantizer.md)")
        if "nchwc_block" in self.attrs:
            raise ValueError("FormatSpec.attrs must not set 'nchwc_block': it describes a "
                             "tensor's memory layout (ort_mx_ops.quantizer.nchwc sets it)")
        if self.op == "BF16":
            if self.attrs:
                raise ValueError(f"BF16 takes no attributes, got {sorted(self.attrs)}")
        else:
            try:
                resolve_attrs(FORMAT_FAMILIES[self.op], self.attrs, allow_axis=False)
            except ValueError as exc:
                # Name the format family, the way users wrote it.
                raise ValueError(f"{self.op} format: {str(exc).split(': ', 1)[1]}") from None
        if not self.name:
            object.__setattr__(self, "name", self._default_name())

    def _default_name(self) -> str:
        if self.op == "BF16":
            return "BF16"
        a = self.full_attrs()
        if self.op == "MX":
            return "MX_" + str(a["element_dtype"])
        return f"BFP_{a['bfp_method']}_{a['bit_width']}"

    @classmethod
    def from_name(cls, name: str) -> "FormatSpec":
        """The built-in format called ``name`` (case-insensitive; see :data:`CONFIGS`).
        ``<NAME>_ADAQUANT`` is the format of ``<NAME>`` (the suffix asks the quantizer for
        fast finetune, which is not a property of the format)."""
        upper = str(name).upper()
        if upper.endswith(ADAQUANT_SUFFIX) and upper != ADAQUANT_SUFFIX:
            upper = upper[:-len(ADAQUANT_SUFFIX)]
        key = {k.upper(): k for k in CONFIGS}.get(upper)
        if key is None:
            raise ValueError(f"unknown quantization config {name!r}; choose one of "
                             f"{', '.join(CONFIGS)} (each also as <NAME>{ADAQUANT_SUFFIX}) "
                             "or pass a QuantizationConfig")
        c = CONFIGS[key]
        return cls(c.op, dict(c.attrs), c.name)  # a copy: callers may not share its attrs

    @property
    def op_type(self) -> Optional[str]:
        """The op that computes this format (None for BF16, a pair of ops)."""
        return FORMAT_FAMILIES[self.op]

    def full_attrs(self) -> dict[str, Any]:
        """The op attributes with every default filled in (no axis)."""
        if self.op == "BF16":
            return {}
        defaults = OPS[FORMAT_FAMILIES[self.op]].defaults()  # type: ignore[index]
        for name in LAYOUT_ATTRS:
            defaults.pop(name)
        return {**defaults, **dict(self.attrs)}

    def node_attrs(self, axis: int) -> dict[str, Any]:
        """The attributes a node of this format blocked along ``axis`` carries (an attribute
        left at a default that means "not implemented" is not written)."""
        attrs = self.full_attrs()
        if self.op == "BFP" and not attrs.get("use_compiler_version_cpu_kernel"):
            attrs.pop("use_compiler_version_cpu_kernel", None)
        return {**attrs, "axis": int(axis)}

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
            return MX_ELEMENT_FORMATS[a["element_dtype"]].bits + 8 / a["block_size"]
        mantissa_and_sign = a["bit_width"] - 9 + 1
        bits = mantissa_and_sign + 8 / a["block_size"]
        if BFP_METHODS[a["bfp_method"]] == "to_bfp_prime":
            bits += a["sub_block_shift_bits"] / a["sub_block_size"]
        return float(bits)


def _mx(name: str, element_dtype: str) -> FormatSpec:
    return FormatSpec("MX", {"element_dtype": element_dtype, "block_size": 32,
                             "rounding_mode": 2}, name)


def _microexponent(name: str, bit_width: int) -> FormatSpec:
    return FormatSpec("BFP", {"bfp_method": "to_bfp_prime", "bit_width": bit_width,
                              "block_size": 16, "sub_block_size": 2,
                              "sub_block_shift_bits": 1, "rounding_mode": 2}, name)


# Quark's configuration names, in Quark's table order.
# ``<NAME>_ADAQUANT``: the built-in config <NAME> with fast finetune (Quark's names).
ADAQUANT_SUFFIX = "_ADAQUANT"

CONFIGS: dict[str, FormatSpec] = {c.name: c for c in [
    FormatSpec("BF16", {}, "BF16"),
    FormatSpec("BFP", {"bfp_method": "to_bfp", "bit_width": 16, "block_size": 8,
                       "rounding_mode": 2}, "BFP16"),
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


def catalogue() -> dict[str, Any]:
    """The catalogue in the plain form ``ort_mx_ops._native.catalogue()`` returns, so the
    Python and C++ tables can be compared field by field."""
    return {
        "ops": {name: {"domain": s.domain, "kind": s.kind,
                       "attrs": {a.name: {"type": a.type, "default": a.default, "min": a.min,
                                          "max": a.max,
                                          "allowed": None if a.allowed is None
                                          else list(a.allowed)}
                                 for a in s.attrs}}
                for name, s in OPS.items()},
        "mx_element_formats": {n: {"exponent_bits": f.exponent_bits,
                                   "mantissa_bits": f.mantissa_bits, "emax": f.emax,
                                   "max_normal": f.max_normal}
                               for n, f in MX_ELEMENT_FORMATS.items()},
        "bfp_methods": dict(BFP_METHODS),
    }
