"""Block-wise Hadamard rotation of the reduction axis of MatMul / Gemm layers.

For a layer ``Y = X @ W`` contracting ``K``, and ``H`` block-diagonal with normalized
Sylvester-Hadamard blocks of size ``b`` (``H @ H = I``, ``H = H^T``),
``Y = (X @ H) @ (H @ W)``: the weight is stored rotated and a float ``MatMul(X, H)`` node
rotates the activation at run time (it is excluded from quantization, so the layer's
quantizer sees the rotated activation).  Within each block the rotation spreads an outlier
over all ``b`` elements, which a shared block scale handles better (arXiv 2509.23202,
2511.04214).  ``b`` is the largest power of two that divides both ``K`` and 32 (the MX
block size); layers with ``b < 4`` are left alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import ModelView

__all__ = ["hadamard", "block_hadamard", "rotate_model", "RotationReport"]


@dataclass
class RotationReport:
    """The layers rotated (node name, K, block size) and the nodes added."""
    layers: list[tuple[str, int, int]] = field(default_factory=list)
    added_nodes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"block Hadamard rotation: {len(self.layers)} MatMul/Gemm layers"] + \
            [f"  {n}: K={k}, blocks of {b}" for n, k, b in self.layers]

    def as_dict(self) -> dict[str, Any]:
        return {"layers": [list(t) for t in self.layers], "added_nodes": self.added_nodes}


def hadamard(n: int) -> np.ndarray:
    """The normalized Sylvester-Hadamard matrix of order ``n`` (a power of two)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard order must be a power of two, got {n}")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def block_hadamard(k: int, block: int) -> np.ndarray:
    """(k, k) block-diagonal matrix of normalized Hadamard blocks of order ``block``."""
    if k % block:
        raise ValueError(f"{k} is not a multiple of the block size {block}")
    return np.kron(np.eye(k // block), hadamard(block))


def _block_size(k: int, limit: int = 32) -> int:
    b = 1
    while b < limit and k % (2 * b) == 0:
        b *= 2
    return b


def rotate_model(model: onnx.ModelProto, base_dir: Optional[str] = None,
                 op_types: Sequence[str] = ("MatMul", "Gemm"), exclude: Sequence[str] = ()
                 ) -> tuple[onnx.ModelProto, RotationReport]:
    """A copy of ``model`` with every MatMul / Gemm (no transA; of ``op_types``, not named
    in ``exclude``) whose constant float32 weight is read by it alone rotated as described
    in the module docstring.  Float outputs equal the input model's up to rounding;
    ``report.added_nodes`` names the rotation nodes, which must stay float."""
    from .handlers import layers as handler_layers
    from .quantize import _Names
    out = onnx.ModelProto()
    out.CopyFrom(model)
    view = ModelView(out, base_dir=base_dir)
    report = RotationReport()
    names = _Names(out.graph)
    names.used |= view.subgraph_names
    added: dict[int, list[onnx.NodeProto]] = {}
    for info in handler_layers(view):
        node = out.graph.node[info.node_index]
        if node.op_type not in ("MatMul", "Gemm") or node.op_type not in op_types or \
                info.weight_input != 1 or node.name in exclude:
            continue
        if node.op_type == "Gemm" and view.node_attr(node, "transA", 0):
            continue
        ref = view.weights[info.weight]
        w = ref.array(base_dir)
        if w.dtype != np.float32 or w.ndim != 2 or len(view.consumers[info.weight]) != 1:
            continue
        trans_b = node.op_type == "Gemm" and view.node_attr(node, "transB", 0)
        k = w.shape[1] if trans_b else w.shape[0]
        b = _block_size(k)
        if b < 4:
            continue
        h = block_hadamard(k, b)
        rotated = (w.astype(np.float64) @ h) if trans_b else (h @ w.astype(np.float64))
        ref.tensor.CopyFrom(numpy_helper.from_array(rotated.astype(np.float32), info.weight))
        label = node.name or node.output[0]
        hname, xname, nname = (names.new(f"{label}_hadamard{s}") for s in ("", "_in", "_rot"))
        out.graph.initializer.append(numpy_helper.from_array(h.astype(np.float32), hname))
        added.setdefault(info.node_index, []).append(
            helper.make_node("MatMul", [node.input[0], hname], [xname], name=nname))
        node.input[0] = xname
        report.layers.append((label, k, b))
        report.added_nodes.append(nname)
    if added:
        nodes = []
        for i, n in enumerate(out.graph.node):
            nodes.extend(added.get(i, []))
            nodes.append(n)
        del out.graph.node[:]
        out.graph.node.extend(nodes)
    return out, report

