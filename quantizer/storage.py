"""How folded weights are stored in the written model: ``weight_storage``.

- ``"folded"``: float tensors holding the quantized values (the default; runs anywhere the
  activation nodes run).
- ``"packed"``: each BFP / MX weight as its packed codes and shared exponents
  (docs/packed_weights.md), decoded at run time by ``MXDequantize`` / ``BFPDequantize`` of the
  ``com.ort_mx_ops`` domain; BF16 weights as a bfloat16 tensor and a ``Cast``.
- ``"onnx"``: standard ONNX only: MXFP8 E4M3 / E5M2 and MXINT8 weights as a blocked
  ``DequantizeLinear`` (FLOAT8E4M3FN / FLOAT8E5M2 / INT8 data, float32 power-of-two scales,
  opset 21; a model below opset 21 is converted first), BF16 weights as bfloat16 and a
  ``Cast``. Other formats have no standard kernel and raise an error naming ``"packed"``.

Every form decodes to exactly the folded values; a weight that a form cannot hold exactly
(e.g. a NaN in an ONNX-stored weight) stays folded, with a note.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ort_mx_ops import packing
from ort_mx_ops.formats import PRODUCT_DOMAIN

from .config import WEIGHT_STORAGES, FormatSpec

__all__ = ["WEIGHT_STORAGES", "StoredWeight", "apply_weight_storage", "check_weight_storage",
           "expand_packed_weights",
           "ONNX_ELEMENT_TYPES", "ONNX_MIN_OPSET"]

ONNX_MIN_OPSET = 21  # DequantizeLinear with block_size
# MX element types that standard DequantizeLinear runs, and their ONNX data type.
ONNX_ELEMENT_TYPES = {"fp8_e4m3": TensorProto.FLOAT8E4M3FN, "fp8_e5m2": TensorProto.FLOAT8E5M2,
                      "int8": TensorProto.INT8}


@dataclass(frozen=True)
class StoredWeight:
    """A folded weight: the tensor holding it, its format, block axis and whether it was
    blocked as (shape[0], -1) (a convolution's whole kernel window per output channel)."""
    name: str
    spec: FormatSpec
    axis: Optional[int]
    flatten: bool = False


def check_weight_storage(storage: str, spec: Optional[FormatSpec]) -> None:
    """Raises ValueError if ``storage`` is unknown or cannot hold weights of ``spec``."""
    if storage not in WEIGHT_STORAGES:
        raise ValueError(f"weight_storage must be one of {WEIGHT_STORAGES}, got {storage!r}")
    if storage != "onnx" or spec is None or spec.op == "BF16":
        return
    element = spec.full_attrs().get("element_dtype")
    if spec.op != "MX" or element not in ONNX_ELEMENT_TYPES:
        raise ValueError(
            f"weight_storage='onnx': standard ONNX has no DequantizeLinear that onnxruntime "
            f"runs for {spec.name} weights (only MXFP8E4M3, MXFP8E5M2, MXINT8 and BF16); use "
            f"weight_storage='packed' (this library's MXDequantize / BFPDequantize) or "
            f"'folded'")


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


class _Graph:
    """Replaces weight tensors of the main graph by nodes computing the same values."""

    def __init__(self, model: onnx.ModelProto) -> None:
        from .quantize import _Names  # here: quantize imports this module
        self.model, self.graph = model, model.graph
        self.new = _Names(self.graph).new
        self.front: list[onnx.NodeProto] = []
        self.domains: set[str] = set()

    def values(self, name: str) -> Optional[np.ndarray]:
        for t in self.graph.initializer:
            if t.name == name:
                return numpy_helper.to_array(t)
        for n in self.graph.node:
            if n.op_type == "Constant" and list(n.output) == [name]:
                for a in n.attribute:
                    if a.name == "value":
                        return numpy_helper.to_array(a.t)
        return None

    def add_init(self, array_or_tensor, name: str) -> str:
        t = array_or_tensor if isinstance(array_or_tensor, TensorProto) else \
            numpy_helper.from_array(array_or_tensor, name)
        t.name = name
        self.graph.initializer.append(t)
        if self.model.ir_version < 4:
            self.graph.input.append(helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
        return name

    def replace(self, name: str, nodes: list[onnx.NodeProto]) -> None:
        """Drops the weight tensor ``name``; ``nodes`` (the last one writing ``name``) run
        first in the graph instead."""
        for i, t in enumerate(self.graph.initializer):
            if t.name == name:
                del self.graph.initializer[i]
                break
        for i, vi in enumerate(self.graph.input):
            if vi.name == name:
                del self.graph.input[i]
                break
        for i, n in enumerate(self.graph.node):
            if n.op_type == "Constant" and list(n.output) == [name]:
                del self.graph.node[i]
                break
        self.front.extend(nodes)

    def finish(self) -> None:
        rest = list(self.graph.node)
        del self.graph.node[:]
        self.graph.node.extend(self.front + rest)
        for domain in sorted(self.domains):
            if not any(o.domain == domain for o in self.model.opset_import):
                self.model.opset_import.append(helper.make_opsetid(domain, 1))


def _blocked_view(values: np.ndarray, w: StoredWeight) -> tuple[np.ndarray, int]:
    axis = 0 if w.axis is None else int(w.axis)
    if w.flatten and values.ndim > 2:
        return values.reshape(values.shape[0], -1), axis
    return values, axis


def _pack(view: np.ndarray, spec: FormatSpec, axis: int) -> packing.PackedWeight:
    a = spec.full_attrs()
    if spec.op == "MX":
        return packing.pack_mx(view, a["element_dtype"], axis, int(a["block_size"]))
    return packing.pack_bfp(view, a["bfp_method"], int(a["bit_width"]), axis,
                            int(a["block_size"]), int(a["sub_block_size"]),
                            int(a["sub_block_shift_bits"]))


def _reshape_back(g: _Graph, src: str, name: str, shape: tuple[int, ...]) -> onnx.NodeProto:
    shape_name = g.add_init(np.array(shape, dtype=np.int64), g.new(f"{name}_shape"))
    return helper.make_node("Reshape", [src, shape_name], [name], name=g.new(f"{name}_Reshape"))


def _bf16_nodes(g: _Graph, name: str, values: np.ndarray) -> Optional[list[onnx.NodeProto]]:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    if np.any(bits & 0xFFFF):
        return None  # a rescaled BF16 weight is not a bfloat16 value
    t = helper.make_tensor(g.new(f"{name}_bf16"), TensorProto.BFLOAT16, list(values.shape),
                           (bits >> 16).astype(np.uint16).tobytes(), raw=True)
    src = g.add_init(t, t.name)
    return [helper.make_node("Cast", [src], [name], to=TensorProto.FLOAT,
                             name=g.new(f"{name}_Cast"))]


def _packed_nodes(g: _Graph, w: StoredWeight, values: np.ndarray) -> list[onnx.NodeProto]:
    view, axis = _blocked_view(values, w)
    p = _pack(view, w.spec, axis)
    inputs = [g.add_init(p.payload, g.new(f"{w.name}_payload")),
              g.add_init(p.scales, g.new(f"{w.name}_scales"))]
    if p.op == "BFP":
        inputs.append(g.add_init(p.shifts, g.new(f"{w.name}_shifts")) if p.shifts.size else "")
    if p.exception_indices.size:
        inputs += [g.add_init(p.exception_indices, g.new(f"{w.name}_exception_indices")),
                   g.add_init(p.exception_values, g.new(f"{w.name}_exception_values"))]
    while inputs[-1] == "":
        inputs.pop()
    reshape = view.shape != values.shape
    out = g.new(f"{w.name}_flat") if reshape else w.name
    op_type = "MXDequantize" if p.op == "MX" else "BFPDequantize"
    nodes = [helper.make_node(op_type, inputs, [out], domain=PRODUCT_DOMAIN,
                              name=g.new(f"{w.name}_{op_type}"), axis=axis,
                              shape=list(view.shape), **p.attrs)]
    g.domains.add(PRODUCT_DOMAIN)
    if reshape:
        nodes.append(_reshape_back(g, out, w.name, values.shape))
    return nodes


def _onnx_nodes(g: _Graph, w: StoredWeight, values: np.ndarray) -> Optional[list[onnx.NodeProto]]:
    view, axis = _blocked_view(values, w)
    a = w.spec.full_attrs()
    element = a["element_dtype"]
    # float32 scales need no E8M0 clipping: a block of float32 subnormals keeps its scale.
    p = packing.pack_mx(view, element, axis, int(a["block_size"]), e8m0=False)
    if p.exception_indices.size:
        return None  # Inf / NaN / -0 that the element type cannot hold
    block = int(a["block_size"])
    if view.ndim == 0:
        return None
    axis %= view.ndim
    data_shape = view.shape
    scale_shape = list(data_shape)
    scale_shape[axis] = -(-data_shape[axis] // block)
    # The scale of the blocked DequantizeLinear is the E8M0 scale (int8: times 2^-6, the
    # element's own scale), so each value is exactly the folded one.
    exponent = p.scales.astype(np.int32) - 127 - (6 if element == "int8" else 0)
    # Packed scales are laid out as the tensor's shape with the axis replaced by its block
    # count: exactly the shape of DequantizeLinear's blocked scale.
    scale = np.ldexp(np.float32(1.0), exponent).astype(np.float32).reshape(scale_shape)
    data = helper.make_tensor(g.new(f"{w.name}_quantized"), ONNX_ELEMENT_TYPES[element],
                              list(data_shape), p.payload.tobytes(), raw=True)
    # Check the standard formula, float(data) * scale, against the folded values.
    if element == "int8":
        elements = p.payload.view(np.int8).astype(np.float32)
    else:
        elements = packing.mx_code_values(element)[p.payload]
    decoded = (elements.reshape(data_shape) *
               np.repeat(scale, block, axis=axis)[tuple(slice(0, d) for d in data_shape)])
    if decoded.astype(np.float32).tobytes() != np.ascontiguousarray(view, np.float32).tobytes():
        return None
    src = g.add_init(data, data.name)
    scale_name = g.add_init(scale, g.new(f"{w.name}_scale"))
    reshape = tuple(data_shape) != values.shape
    out = g.new(f"{w.name}_dq") if reshape else w.name
    nodes = [helper.make_node("DequantizeLinear", [src, scale_name], [out],
                              name=g.new(f"{w.name}_DequantizeLinear"), axis=axis,
                              block_size=block)]
    if reshape:
        nodes.append(_reshape_back(g, out, w.name, values.shape))
    return nodes


def apply_weight_storage(model: onnx.ModelProto, weights: Sequence[StoredWeight],
                         storage: str) -> list[str]:
    """Rewrites the folded ``weights`` of ``model`` (in place) into ``storage`` form; returns
    notes on weights kept folded. ``"onnx"`` raises the opset to 21 first where it is lower
    (onnx.version_converter) and the IR version to 10."""
    for w in weights:
        check_weight_storage(storage, w.spec)
    if storage == "folded" or not weights:
        return []
    if storage == "onnx" and any(w.spec.op != "BF16" for w in weights):
        if _default_opset(model) < ONNX_MIN_OPSET:
            from onnx import version_converter
            converted = version_converter.convert_version(model, ONNX_MIN_OPSET)
            model.CopyFrom(converted)
        model.ir_version = max(model.ir_version, 10)
    g = _Graph(model)
    notes: list[str] = []
    for w in weights:
        values = g.values(w.name)
        if values is None:
            notes.append(f"{w.name}: not a weight tensor of the main graph; left folded")
            continue
        if values.dtype != np.float32:
            notes.append(f"{w.name}: {storage} storage takes float32 weights, this one is "
                         f"{values.dtype}; left folded")
            continue
        if w.spec.op == "BF16":
            if _default_opset(model) < 13:  # Cast from bfloat16
                notes.append(f"{w.name}: a bfloat16 weight needs opset 13 (Cast from "
                             f"BFLOAT16), this model imports {_default_opset(model)}; left folded")
                continue
            nodes = _bf16_nodes(g, w.name, values)
        elif storage == "packed":
            nodes = _packed_nodes(g, w, values)
        else:
            nodes = _onnx_nodes(g, w, values)
        if nodes is None:
            notes.append(f"{w.name}: holds values the {storage} form cannot express exactly "
                         "(Inf, NaN, -0 or a rescaled BF16 weight); left folded")
            continue
        g.replace(w.name, nodes)
    g.finish()
    return notes


def expand_packed_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` in which every ``MXDequantize`` / ``BFPDequantize`` node whose inputs
    are initializers is replaced by the float32 initializer it computes (decoded in numpy, bit
    for bit the folded weight). onnxruntime then sees constant weights, as in the folded model
    (weight prepacking, layout transforms): load a packed file through this to run it exactly as
    fast as the folded one; the file on disk stays packed."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    keep: list[onnx.NodeProto] = []
    used_by_decoders: set[str] = set()
    for n in g.node:
        if n.domain != PRODUCT_DOMAIN or n.op_type not in ("MXDequantize", "BFPDequantize") or \
                any(i and i not in inits for i in n.input):
            keep.append(n)
            continue
        arrays = [numpy_helper.to_array(inits[i]) if i else None for i in n.input]
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        shape = tuple(attrs["shape"])
        if n.op_type == "MXDequantize":
            arrays += [None] * (4 - len(arrays))
            y = packing.unpack_mx(arrays[0], arrays[1], attrs.get("element_dtype", "int8"),
                                  attrs.get("axis", 1), attrs.get("block_size", 32), shape,
                                  arrays[2], arrays[3])
        else:
            arrays += [None] * (5 - len(arrays))
            y = packing.unpack_bfp(arrays[0], arrays[1], attrs.get("bfp_method", "to_bfp"),
                                   attrs.get("bit_width", 16), attrs.get("axis", 1),
                                   attrs.get("block_size", 8), shape, arrays[2],
                                   attrs.get("sub_block_size", 2),
                                   attrs.get("sub_block_shift_bits", 1), arrays[3], arrays[4])
        g.initializer.append(numpy_helper.from_array(y, n.output[0]))
        used_by_decoders.update(i for i in n.input if i)
    del g.node[:]
    g.node.extend(keep)
    still_used = {i for n in keep for i in n.input} | {o.name for o in g.output}
    dead = used_by_decoders - still_used
    kept_inits = [t for t in g.initializer if t.name not in dead]
    del g.initializer[:]
    g.initializer.extend(kept_inits)
    if not any(n.domain == PRODUCT_DOMAIN for n in keep):
        ops = [o for o in out.opset_import if o.domain != PRODUCT_DOMAIN]
        del out.opset_import[:]
        out.opset_import.extend(ops)
    return out
