"""Cross-layer equalization (CLE): rescale the channels between two consecutive layers so
that each channel's weight range is the same in both, without changing the float model.

For a pair ``layer1 -> ops -> layer2`` where every op between them is positively homogeneous
per channel (``f(x / s) = f(x) / s`` for ``s > 0``), output channel ``c`` of layer 1 (weight
and bias) is divided by ``s_c`` and input channel ``c`` of layer 2 is multiplied by it.  With
``r1_c`` the largest ``|w|`` of layer 1's output channel ``c`` and ``r2_c`` that of layer 2's
input channel ``c``, ``s_c = sqrt(r1_c / r2_c)`` makes both ranges ``sqrt(r1_c * r2_c)``
(Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias Correction").

Ops allowed between the two layers (each the only reader of the previous tensor): Relu,
LeakyRelu, PRelu, Identity; Mul / Div by a constant (linear: nothing to change); Add / Sub
of a per-channel constant (the constant is divided by ``s``); BatchNormalization in
inference mode (its mean and bias are divided by ``s``).  Clip (ReLU6), HardSwish, Sigmoid
and the like end the search: they do not commute with a per-channel scale.  Layers are found
through the op handlers (:func:`.handlers.layers`) and rescaled in the linear form of
:class:`.layers.Layer`, so Conv (grouped and depthwise included), ConvTranspose, Gemm and
MatMul pair up as long as both contract the same channel axis (convolutions: axis 1;
Gemm / MatMul: the last axis).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import ModelView
from .layers import Layer

__all__ = ["EqualizedPair", "EqualizationReport", "equalize_model", "channel_ranges"]

_CONV = ("Conv", "ConvTranspose")
_PASS = ("Relu", "LeakyRelu", "PRelu", "Identity")


@dataclass
class EqualizedPair:
    """One equalized pair: the two nodes, the ops between them, and the largest ratio
    ``max(r1, r2) / min(r1, r2)`` over the channels before and after (1.0: equal ranges)."""
    first: str
    second: str
    between: list[str]
    channels: int
    ratio_before: float = 0.0
    ratio_after: float = 0.0


@dataclass
class EqualizationReport:
    """The pairs equalized, in graph order."""
    pairs: list[EqualizedPair] = field(default_factory=list)
    steps: int = 0

    def lines(self) -> list[str]:
        out = [f"cross-layer equalization: {len(self.pairs)} pairs, {self.steps} step(s); "
               "worst range ratio per pair, before -> after:"]
        out += [f"  {p.first} -> {p.second} ({p.channels} channels"
                + (f", through {'/'.join(p.between)}" if p.between else "")
                + f"): {p.ratio_before:.3g} -> {p.ratio_after:.3g}" for p in self.pairs]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def as_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "pairs": [dict(p.__dict__) for p in self.pairs]}


@dataclass
class _Pair:
    """What rescaling one pair touches: the two layers (node index, math), and the constants
    between them whose elements (one per channel, in channel order) are divided by ``s``."""
    first: int
    second: int
    layer1: Layer
    layer2: Layer
    bias1: Optional[str]
    divided: list[str]
    between: list[str]


def _math_layer(view: ModelView, node: onnx.NodeProto, shape: tuple[int, ...]) -> Layer:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return Layer(node.op_type, shape, attrs)


def channel_ranges(layer: Layer, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(range of each output channel, range of each input channel) of weight ``w``: the
    largest ``|w|`` over the elements that channel multiplies."""
    m = np.abs(layer.weight_matrix(np.asarray(w, np.float32)))  # (g, K, cout/g)
    g, k, cog = m.shape
    cig = _in_per_group(layer)
    out_r = m.max(axis=1).reshape(-1)
    in_r = m.reshape(g, cig, k // cig, cog).max(axis=(2, 3)).reshape(-1)
    return out_r, in_r


def _in_per_group(layer: Layer) -> int:
    w = layer.weight_shape
    if layer.op == "Conv":
        return w[1]
    if layer.op == "ConvTranspose":
        return w[0] // layer.group
    if layer.op == "Gemm":
        return w[1] if layer.trans_b else w[0]
    return w[0]


def _scale_out(layer: Layer, w: np.ndarray, factor: np.ndarray) -> np.ndarray:
    m = layer.weight_matrix(w).astype(np.float32)
    g, _, cog = m.shape
    return np.ascontiguousarray(layer.weight_from_matrix(m * factor.reshape(g, 1, cog)))


def _scale_in(layer: Layer, w: np.ndarray, factor: np.ndarray) -> np.ndarray:
    m = layer.weight_matrix(w).astype(np.float32)
    g, k, _ = m.shape
    cig = _in_per_group(layer)
    per_row = np.repeat(factor.reshape(g, cig), k // cig, axis=1)[:, :, None]
    return np.ascontiguousarray(layer.weight_from_matrix(m * per_row))


def _per_channel(shape: tuple[int, ...], channels: int, axis_from_end: int, rank: int) -> bool:
    """A constant of ``shape`` broadcasts as one value per channel along the chain's channel
    axis (``axis_from_end`` from the end of a rank-``rank`` tensor)."""
    if len(shape) > rank:
        return False
    full = (1,) * (rank - len(shape)) + tuple(shape)
    axis = rank - axis_from_end
    return full[axis] == channels and all(d == 1 for i, d in enumerate(full) if i != axis)


def _single_reader_const(view: ModelView, name: str) -> bool:
    return name in view.weights and len(view.consumers.get(name, [])) == 1 and \
        view.weights[name].tensor.data_type == onnx.TensorProto.FLOAT


def _constant_source(view: ModelView, name: str) -> Optional[str]:
    """The float32 constant holding ``name``'s values in the same order: ``name`` itself, or
    the data of a Reshape / Unsqueeze / Squeeze / Flatten of a constant (exporters write
    per-channel biases so); each read by that one node alone.  None otherwise."""
    if _single_reader_const(view, name):
        return name
    if name not in view.producer or len(view.consumers.get(name, [])) != 1:
        return None
    node = view.graph.node[view.producer[name]]
    if node.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Flatten") and \
            _single_reader_const(view, node.input[0]):
        return node.input[0]
    return None


def _find_pairs(view: ModelView) -> list[_Pair]:
    """Every pair layer1 -> (homogeneous per-channel ops) -> layer2 whose tensors can all be
    rescaled (float32 constants read by that node alone)."""
    from .handlers import layers as handler_layers
    infos = {info.node_index: info for info in handler_layers(view)
             if info.weight_input == 1 and _single_reader_const(view, info.weight)}
    pairs = []
    for idx, info in infos.items():
        node = view.graph.node[idx]
        if info.bias is not None and not _single_reader_const(view, info.bias):
            continue
        if len(node.input) > 2 and node.input[2] and info.bias is None:
            continue  # a bias we could not rescale
        shape1 = view.shape[info.weight]
        try:
            layer1 = _math_layer(view, node, shape1)
        except ValueError:
            continue
        if info.bias is not None and layer1.bias_vector(
                view.weights[info.bias].array(view.base_dir)) is None:
            continue
        conv = node.op_type in _CONV
        rank = len(shape1) if conv else (view.rank(info.output) or 2)
        axis_from_end = rank - 1 if conv else 1
        channels = layer1.out_channels
        cur, divided, between = info.output, [], []
        while True:
            readers = view.consumers.get(cur, [])
            if len(readers) != 1 or cur in view.graph_outputs:
                break
            nidx, k = readers[0]
            nxt = view.graph.node[nidx]
            if nxt.domain not in ("", "ai.onnx"):
                break
            if nidx in infos and k == 0:
                pair = _second(view, infos[nidx], nxt, conv, channels)
                if pair is not None:
                    pairs.append(_Pair(idx, nidx, layer1, pair, info.bias, divided, between))
                break
            ok, consts = _passes(view, nxt, k, channels, axis_from_end, rank)
            if not ok:
                break
            divided = divided + consts
            between = between + [nxt.op_type]
            cur = nxt.output[0]
    return pairs


def _second(view: ModelView, info: Any, node: onnx.NodeProto, conv: bool,
            channels: int) -> Optional[Layer]:
    """Layer 2 of a pair, when it contracts the chain's channel axis over ``channels``."""
    if (node.op_type in _CONV) != conv:
        return None
    if node.op_type == "Gemm" and view.node_attr(node, "transA", 0):
        return None
    try:
        layer2 = _math_layer(view, node, view.shape[info.weight])
    except ValueError:
        return None
    if layer2.groups * _in_per_group(layer2) != channels:
        return None
    return layer2


def _passes(view: ModelView, node: onnx.NodeProto, k: int, channels: int,
            axis_from_end: int, rank: int) -> tuple[bool, list[str]]:
    """Whether a per-channel scale of input ``k`` passes through ``node`` to its output, and
    the constants that must be divided by the scale for that."""
    op = node.op_type
    if len(node.output) != 1 and op != "BatchNormalization":
        return False, []
    if op in _PASS:
        if op == "PRelu":
            slope = node.input[1]
            return (k == 0 and slope in view.weights), []
        return k == 0, []
    if op in ("Mul", "Div"):
        other = node.input[1 - k]
        if op == "Div" and k != 0:
            return False, []
        if other not in view.weights:
            return False, []
        shape = view.shape.get(other) or ()
        scalar = int(np.prod(shape)) == 1 if shape else True
        return scalar or _per_channel(shape, channels, axis_from_end, rank), []
    if op in ("Add", "Sub"):
        other = node.input[1 - k]
        shape = view.shape.get(other)
        if shape is None or not _per_channel(shape, channels, axis_from_end, rank):
            return False, []
        source = _constant_source(view, other)
        return (source is not None), [source] if source else []
    if op == "BatchNormalization":
        if k != 0 or view.node_attr(node, "training_mode", 0) or len(node.output) != 1:
            return False, []
        names = list(node.input[1:5])
        if len(names) != 4 or not all(_single_reader_const(view, n) for n in names):
            return False, []
        if any((view.shape.get(n) or ()) != (channels,) for n in names):
            return False, []
        # BN(x / s) = BN(x) / s once its mean and bias are divided by s.
        return True, [names[1], names[2]]
    return False, []


def _ratio(a: np.ndarray, b: np.ndarray) -> float:
    live = (a > 0) & (b > 0)
    if not live.any():
        return 1.0
    return float(np.max(np.maximum(a[live], b[live]) / np.minimum(a[live], b[live])))


def equalize_model(model: onnx.ModelProto, base_dir: Optional[str] = None, steps: int = 1
                   ) -> tuple[onnx.ModelProto, EqualizationReport]:
    """A copy of ``model`` with every equalizable pair of layers rescaled ``steps`` times
    (a layer can be the second of one pair and the first of the next: more steps bring
    such chains closer to equal ranges); its float outputs equal the input model's up to
    float rounding.  ``model`` is not modified.  Channels where either range is 0 keep
    their scale."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    view = ModelView(out, base_dir=base_dir)
    pairs = _find_pairs(view)
    report = EqualizationReport(steps=steps)
    arrays: dict[str, np.ndarray] = {}

    def get(name: str) -> np.ndarray:
        if name not in arrays:
            arrays[name] = view.weights[name].array(base_dir).astype(np.float32)
        return arrays[name]

    for p in pairs:
        n1, n2 = view.graph.node[p.first], view.graph.node[p.second]
        report.pairs.append(EqualizedPair(n1.name or n1.output[0], n2.name or n2.output[0],
                                          p.between, p.layer1.out_channels))
    for _ in range(steps):
        for p, rec in zip(pairs, report.pairs):
            n1, n2 = view.graph.node[p.first], view.graph.node[p.second]
            w1, w2 = get(n1.input[1]), get(n2.input[1])
            r1, _ = channel_ranges(p.layer1, w1)
            _, r2 = channel_ranges(p.layer2, w2)
            if not rec.ratio_before:
                rec.ratio_before = _ratio(r1, r2)
            s = np.ones_like(r1, dtype=np.float64)
            live = (r1 > 0) & (r2 > 0)
            s[live] = np.sqrt(r1[live].astype(np.float64) / r2[live])
            inv = (1.0 / s).astype(np.float32)
            arrays[n1.input[1]] = _scale_out(p.layer1, w1, inv)
            arrays[n2.input[1]] = _scale_in(p.layer2, w2, s.astype(np.float32))
            if p.bias1 is not None:
                b = get(p.bias1)
                arrays[p.bias1] = p.layer1.bias_from_vector(p.layer1.bias_vector(b) * inv, b)
            for name in p.divided:
                c = get(name)
                arrays[name] = (c.reshape(-1) * inv).reshape(c.shape).astype(np.float32)
    for p, rec in zip(pairs, report.pairs):
        n1, n2 = view.graph.node[p.first], view.graph.node[p.second]
        rec.ratio_after = _ratio(channel_ranges(p.layer1, arrays[n1.input[1]])[0],
                                 channel_ranges(p.layer2, arrays[n2.input[1]])[1])
    for name, arr in arrays.items():
        view.weights[name].tensor.CopyFrom(numpy_helper.from_array(arr, name))
    return out, report
