"""A read-only view of an ONNX graph: tensor types and shapes, consumers, weights.

Shapes come from onnxruntime's symbolic shape inference where it works (it keeps track of
which dimensions derive from dynamic input dimensions through Reshape and friends) and from
``onnx.shape_inference`` otherwise.  A dimension with no fixed value is *dynamic*: a batch,
sequence or spatial dimension whose length changes from run to run.
"""
from __future__ import annotations

import copy
import os
import tempfile
import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx
from onnx import numpy_helper, TensorProto

from ort_mx_ops.graph_walk import subgraphs as _subgraphs

__all__ = ["ModelView", "Shape", "FLOAT_TYPES", "WeightRef"]

log = logging.getLogger(__name__)

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}

# One entry per dimension: an int for a fixed length, None for a dynamic one.
Shape = Optional[tuple[Optional[int], ...]]


@dataclass
class WeightRef:
    """Where a constant tensor lives: an initializer, or the ``value`` of a Constant node."""
    name: str
    initializer: Optional[onnx.TensorProto] = None
    constant_node: Optional[onnx.NodeProto] = None

    @property
    def tensor(self) -> onnx.TensorProto:
        if self.initializer is not None:
            return self.initializer
        for a in self.constant_node.attribute:  # type: ignore[union-attr]
            if a.name == "value":
                return a.t
        raise KeyError(self.name)

    def array(self, base_dir: str | None = None) -> np.ndarray:
        return numpy_helper.to_array(self.tensor, base_dir or "")


def _shape_of(vi: onnx.ValueInfoProto) -> Shape:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape-inferred copy of ``model``; symbolic inference first, plain ONNX inference as
    the fallback, the model itself if both fail (large or unusual models)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
        # Where inference is incomplete the tool saves "sym_shape_infer_temp.onnx" (and its
        # data files) into the current directory before raising: run it in a scratch folder
        # so no file of the user's is written or overwritten.
        with tempfile.TemporaryDirectory(prefix="ort-mx-shapes-") as scratch:
            previous = os.getcwd()
            os.chdir(scratch)
            try:
                out = SymbolicShapeInference.infer_shapes(copy.deepcopy(model), auto_merge=True)
            finally:
                os.chdir(previous)
        if out is not None:
            return out
    except Exception as exc:  # the tool raises on ops it does not know; plain inference next
        log.debug("symbolic shape inference failed: %s", exc)
    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception as exc:
        log.warning("shape inference failed (%s); axes are chosen without shapes", exc)
        return model


class ModelView:
    """Types, shapes, producers, consumers and weights of ``model``'s main graph."""

    def __init__(self, model: onnx.ModelProto, base_dir: str | None = None,
                 infer_shapes: bool = True) -> None:
        self.model = model
        self.graph = model.graph
        self.base_dir = base_dir
        self.ir_version = model.ir_version
        self.elem_type: dict[str, int] = {}
        self.shape: dict[str, Shape] = {}
        g = self.graph
        inferred = _infer(_without_weight_data(model)) if infer_shapes else model
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + \
                list(inferred.graph.output):
            if vi.type.HasField("tensor_type"):
                self.elem_type[vi.name] = vi.type.tensor_type.elem_type
                self.shape[vi.name] = _shape_of(vi)
        self.weights: dict[str, WeightRef] = {}
        graph_inputs = {i.name for i in g.input}
        for init in g.initializer:
            # An initializer listed as a graph input (IR >= 4) can be overridden at run time:
            # that makes it an activation, not a weight we may rewrite.
            if init.name in graph_inputs and model.ir_version >= 4:
                continue
            self.weights[init.name] = WeightRef(init.name, initializer=init)
        for node in g.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                if any(a.name == "value" for a in node.attribute):
                    self.weights[node.output[0]] = WeightRef(node.output[0], constant_node=node)
        for name, ref in self.weights.items():
            t = ref.tensor
            self.elem_type[name] = t.data_type
            self.shape[name] = tuple(int(d) for d in t.dims)
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[tuple[int, int]]] = {}
        for idx, node in enumerate(g.node):
            for out in node.output:
                self.producer[out] = idx
            for k, inp in enumerate(node.input):
                if inp:
                    self.consumers.setdefault(inp, []).append((idx, k))
        self.graph_outputs = {o.name for o in g.output}
        self.graph_inputs = graph_inputs
        # Every name a subgraph (If / Loop / Scan body, at any depth) mentions: an outer
        # tensor read there must keep its values, and new names must not collide with them.
        self.subgraph_names: set[str] = set()
        self.subgraph_nodes: list[str] = []
        for node in g.node:
            subs = _subgraphs(node)
            if subs:
                self.subgraph_nodes.append(f"{node.op_type} {node.name!r}")
            for sub in subs:
                self.subgraph_names |= _all_names(sub)

    def is_float(self, name: str) -> Optional[bool]:
        """True/False where the element type is known, None where it is not."""
        t = self.elem_type.get(name)
        if t is None or t == TensorProto.UNDEFINED:
            return None
        return t in FLOAT_TYPES

    def rank(self, name: str) -> Optional[int]:
        s = self.shape.get(name)
        return None if s is None else len(s)

    def dim(self, name: str, axis: int) -> Optional[int]:
        """Fixed length of ``axis`` (negative from the end), None if dynamic or unknown."""
        s = self.shape.get(name)
        if s is None or not -len(s) <= axis < len(s):
            return None
        return s[axis]

    def is_weight(self, name: str) -> bool:
        return name in self.weights

    def node_attr(self, node: onnx.NodeProto, name: str, default=None):
        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default


def _all_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor and node name in ``graph`` and the subgraphs nested in it."""
    names = {i.name for i in graph.initializer} | {i.name for i in graph.input} | \
        {o.name for o in graph.output}
    for node in graph.node:
        names.add(node.name)
        names.update(node.input)
        names.update(node.output)
        for sub in _subgraphs(node):
            names |= _all_names(sub)
    names.discard("")
    return names


def _without_weight_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for shape inference with large initializers emptied (dims kept), so inference
    works on models whose weights exceed protobuf's 2 GB limit and runs faster."""
    if sum(len(i.raw_data) for i in model.graph.initializer) < (1 << 30):
        return model
    light = onnx.ModelProto()
    light.CopyFrom(model)
    for init in light.graph.initializer:
        if len(init.raw_data) > (1 << 20):
            # Keep the tensor's dims and type; a graph input of the same name carries them.
            init.ClearField("raw_data")
            init.data_location = TensorProto.EXTERNAL
            del init.external_data[:]
            init.external_data.add(key="location", value="__omitted__")
    return light
