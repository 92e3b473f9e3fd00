"""What the quantizer knows about each op type, one handler class per op type.

A handler owns, for the nodes of its op type: which inputs are quantized, the axis each input
is contracted over (its *reduction axis*), the rule for activations whose axis is dynamic,
and the layout of its weight.  :func:`handler_for` picks the handler of a node (the default
handler for op types nobody registered); :func:`register_handler` adds one.  The accuracy
algorithms use :meth:`OpHandler.layer`: the weight of one node, its block axis, the bias,
and the tensors the layer reads and writes.

The axis rules themselves are described in docs/quantizer.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import onnx

from .graph import ModelView

__all__ = ["OpHandler", "Layer", "AxisChoice", "register_handler", "handler_for", "HANDLERS",
           "COMPUTE_OPS", "feature_axis", "activation_axis", "numel", "layers"]


@dataclass(frozen=True)
class AxisChoice:
    """The block axis a consumer wants for one of its inputs.  ``axis`` None: leave the
    tensor float (``reason`` says why).  ``flatten``: block the weight viewed as
    (shape[0], -1) along axis 1.  ``priority``: compute ops (1) outrank other ops (0) when
    consumers disagree."""
    axis: Optional[int]
    reason: str
    priority: int = 0
    flatten: bool = False


@dataclass(frozen=True)
class Layer:
    """One layer with a weight, as the accuracy algorithms see it: ``weight`` (an initializer
    or Constant output) blocked along ``weight_axis`` (viewed as (shape[0], -1) first when
    ``flatten``), ``bias`` (None when absent or not constant), the layer's data ``input``
    and its ``output`` tensor, and ``node_index`` in ``graph.node``."""
    node_index: int
    node_name: str
    op_type: str
    input: str
    output: str
    weight: str
    weight_input: int
    weight_axis: int
    flatten: bool
    bias: Optional[str]


def numel(shape: tuple) -> Optional[int]:
    """Element count of ``shape``; None if a dimension is dynamic."""
    n = 1
    for d in shape:
        if d is None:
            return None
        n *= d
    return n


def _normalize(axis: int, rank: Optional[int]) -> int:
    return axis % rank if rank else axis


def feature_axis(view: ModelView, name: str, exclude: Optional[int] = None,
                 is_weight: bool = False, layout_first: bool = False) -> Optional[int]:
    """A fixed-length axis longer than 1 to block ``name`` along when its consumer's
    reduction axis cannot be used: the longest such axis (the last of equals), or with
    ``layout_first`` (inputs of non-compute ops, which contract nothing) the channel axis of
    an image-like (rank 4/5) activation, else the last axis, before the longest.
    Activations never get axis 0 (batch) or a dynamic axis.  None where no such axis exists
    or the shape is unknown."""
    shape = view.shape.get(name)
    if shape is None:
        return None
    rank = len(shape)
    lo = 0 if is_weight or rank < 2 else 1

    def ok(a: int) -> bool:
        return a >= lo and a != exclude and shape[a] is not None and shape[a] > 1

    if layout_first:
        preferred = ([1] if rank in (4, 5) and not is_weight else []) + [rank - 1]
        for a in preferred:
            if 0 <= a < rank and ok(a):
                return a
    candidates = [a for a in range(rank) if ok(a)]
    if not candidates:
        return None
    return max(candidates, key=lambda a: (shape[a], a))


def activation_axis(view: ModelView, name: str, axis: int, reason: str,
                    keep_dynamic: bool = False) -> tuple[Optional[int], str]:
    """Apply the batch/token rule and the 1-long rule to a preferred ``axis`` of activation
    ``name``: returns the axis to use (None: leave the tensor float) and the reason."""
    rank = view.rank(name)
    if rank is None:
        return axis, reason + " (shape unknown)"
    if rank <= 1:
        return 0, "rank <= 1: its only axis"
    a = _normalize(axis, rank)
    length = view.dim(name, a)
    if keep_dynamic:
        return a, reason
    if length is None:
        alt = feature_axis(view, name, exclude=a)
        if alt is None:
            return None, f"{reason} is a batch/token axis and no fixed-length axis exists"
        return alt, f"{reason} {a} is a batch/token axis; fixed axis {alt} instead"
    if length == 1:
        alt = feature_axis(view, name, exclude=a)
        if alt is not None:
            return alt, f"{reason} is 1 long; axis {alt} instead"
    return a, reason


class OpHandler:
    """The default handler: ops that contract nothing.  Subclasses override the class
    attributes and the methods below for their op type."""
    op_type: ClassVar[str] = ""
    # Inputs contracted over a dimension (blocked along their reduction axis); empty for
    # ops that contract nothing.
    contracted_inputs: ClassVar[tuple[int, ...]] = ()
    # Inputs quantized besides the contracted ones; None: every input.
    other_inputs: ClassVar[Optional[tuple[int, ...]]] = None
    bias_input: ClassVar[Optional[int]] = None
    weight_input: ClassVar[Optional[int]] = None
    # A convolution's channel axis is blocked even when its length is not known.
    keep_dynamic_axis: ClassVar[bool] = False

    def __init__(self, node: onnx.NodeProto, view: ModelView) -> None:
        self.node, self.view = node, view

    # -- which inputs ----------------------------------------------------------------------
    def inputs_to_quantize(self, quantize_bias: bool = False, quark: bool = False) -> list[int]:
        """Indices of the node's inputs to quantize (before type checks); ``quark``: every
        input, as Quark's placement does."""
        n = len(self.node.input)
        if quark or self.other_inputs is None:
            return list(range(n))
        wanted = set(self.contracted_inputs) | set(self.other_inputs)
        if quantize_bias and self.bias_input is not None:
            wanted.add(self.bias_input)
        return [k for k in range(n) if k in wanted]

    def contracts(self, input_idx: int) -> bool:
        return input_idx in self.contracted_inputs

    # -- axes ------------------------------------------------------------------------------
    def reduction_axis(self, input_idx: int) -> tuple[int, str]:
        """The axis the node contracts input ``input_idx`` over (negative where the rank is
        unknown) and a short reason; ``KeyError`` for inputs that are not contracted."""
        raise KeyError(self.node.op_type)

    def weight_layout(self, name: str, axis: int, reason: str) -> tuple[int, str, bool]:
        """The weight's block axis when its preferred ``axis`` is 1 long (and whether to
        flatten it): its longest fixed axis."""
        alt = feature_axis(self.view, name, exclude=axis, is_weight=True)
        if alt is not None:
            return alt, f"{self.node.op_type} weight: axis {axis} is 1 long; blocked along " \
                        f"axis {alt}", False
        return axis, reason, False

    def block_axis(self, input_idx: int, quark: bool = False) -> AxisChoice:
        """The block axis this node wants for input ``input_idx``: its reduction axis for a
        contracted input, a feature axis otherwise; then the weight layout or the dynamic-
        axis rule (not with ``quark``, which reproduces Quark's placement)."""
        view, name = self.view, self.node.input[input_idx]
        is_weight = view.is_weight(name)
        if self.contracts(input_idx):
            axis, reason = self.reduction_axis(input_idx)
            priority = 1
        else:
            priority = 0
            if quark:
                axis, reason = 1, "axis 1 (Quark)"
            else:
                reason = f"{self.node.op_type} input: feature axis"
                found = feature_axis(view, name, is_weight=is_weight, layout_first=True) \
                    if view.rank(name) is not None else -1
                if found is None:
                    return AxisChoice(None, "no fixed-length axis to block along", priority)
                axis = found
        rank = view.rank(name)
        if quark:
            if rank is not None:
                axis = _normalize(axis, rank) if rank > 1 else 0
            return AxisChoice(axis, reason, priority)
        if is_weight:
            shape = view.shape.get(name) or ()
            if len(shape) <= 1:
                return AxisChoice(0, "rank <= 1: its only axis", priority)
            axis = _normalize(axis, len(shape))
            flatten = False
            if shape[axis] == 1:
                axis, reason, flatten = self.weight_layout(name, axis, reason)
            return AxisChoice(axis, reason, priority, flatten)
        chosen, reason = activation_axis(view, name, axis, reason,
                                         keep_dynamic=self.keep_dynamic_axis)
        return AxisChoice(chosen, reason, priority)

    # -- the layer, for the accuracy algorithms ---------------------------------------------
    def layer(self, node_index: int) -> Optional[Layer]:
        """The node as a layer with a constant weight, or None (no weight input, or the
        weight is not a constant of the graph)."""
        k = self.weight_input
        node = self.node
        if k is None or len(node.input) <= k or not self.view.is_weight(node.input[k]):
            return None
        choice = self.block_axis(k)
        b = self.bias_input
        bias = node.input[b] if b is not None and len(node.input) > b and node.input[b] \
            and self.view.is_weight(node.input[b]) else None
        data = [i for i in self.contracted_inputs if i != k]
        return Layer(node_index=node_index, node_name=node.name, op_type=node.op_type,
                     input=node.input[data[0]], output=node.output[0], weight=node.input[k],
                     weight_input=k, weight_axis=int(choice.axis or 0), flatten=choice.flatten,
                     bias=bias)


HANDLERS: dict[str, type[OpHandler]] = {}


def register_handler(cls: type[OpHandler]) -> type[OpHandler]:
    """Class decorator: make ``cls`` the handler of ``cls.op_type``."""
    HANDLERS[cls.op_type] = cls
    return cls


def handler_for(node: onnx.NodeProto, view: ModelView) -> OpHandler:
    """The handler of ``node`` (the default :class:`OpHandler` for unregistered op types)."""
    return HANDLERS.get(node.op_type, OpHandler)(node, view)


class _LayerHandler(OpHandler):
    """Ops of the form op(data, weight[, bias]) that contract data and weight."""
    contracted_inputs = (0, 1)
    other_inputs = ()
    weight_input = 1
    bias_input = 2


class _ConvolutionHandler(_LayerHandler):
    """Convolutions keep a channel axis of unknown length: it is never a batch axis."""
    keep_dynamic_axis = True


@register_handler
class ConvHandler(_ConvolutionHandler):
    """Conv(X, W (C_out, C_in/g, k...), B): X and W along the channel axis 1."""
    op_type = "Conv"

    def reduction_axis(self, input_idx: int) -> tuple[int, str]:
        return 1, "Conv channel axis"

    def weight_layout(self, name: str, axis: int, reason: str) -> tuple[int, str, bool]:
        # A depthwise weight (C_out, 1, k...): block over each output channel's kernel
        # window, the dimension a depthwise convolution contracts over.
        shape = self.view.shape.get(name) or ()
        if axis == 1 and len(shape) >= 3:
            window = numel(shape[2:]) or 1
            return 1, (f"depthwise Conv weight: channel axis is 1 long; blocked over each "
                       f"output channel's {window}-element kernel window"), True
        return super().weight_layout(name, axis, reason)


@register_handler
class ConvTransposeHandler(_ConvolutionHandler):
    """ConvTranspose(X, W (C_in, C_out/g, k...), B): X along 1, W along 0."""
    op_type = "ConvTranspose"

    def reduction_axis(self, input_idx: int) -> tuple[int, str]:
        if input_idx == 1:
            return 0, "ConvTranspose weight input-channel axis"
        return 1, "ConvTranspose channel axis"


@register_handler
class GemmHandler(_LayerHandler):
    """Gemm(A, B, C): A along 1 (0 with transA), B along 0 (1 with transB)."""
    op_type = "Gemm"

    def reduction_axis(self, input_idx: int) -> tuple[int, str]:
        if input_idx == 0:
            return (0, "Gemm A with transA") if self.view.node_attr(self.node, "transA", 0) \
                else (1, "Gemm A axis 1")
        return (1, "Gemm B with transB") if self.view.node_attr(self.node, "transB", 0) \
            else (0, "Gemm B axis 0")


@register_handler
class MatMulHandler(_LayerHandler):
    """MatMul(A, B): A along its last axis, B along its second-to-last (its only axis when
    1-D).  B is the weight when it is a constant."""
    op_type = "MatMul"
    bias_input = None

    def reduction_axis(self, input_idx: int) -> tuple[int, str]:
        rank = self.view.rank(self.node.input[input_idx])
        if input_idx == 0:
            return (-1 if rank is None else max(rank - 1, 0)), "MatMul A last axis"
        if rank == 1:
            return 0, "MatMul B (1-D)"
        return (-2 if rank is None else rank - 2), "MatMul B second-to-last axis"


class _ShapeOnlyHandler(OpHandler):
    """Ops whose input values never reach the output: quantizing them changes nothing."""

    def inputs_to_quantize(self, quantize_bias: bool = False, quark: bool = False) -> list[int]:
        return []


for _op in ("Shape", "Size", "Constant", "ConstantOfShape"):
    register_handler(type(f"{_op}Handler", (_ShapeOnlyHandler,), {"op_type": _op}))

# The ops that contract a dimension: what the default placement quantizes.
COMPUTE_OPS: tuple[str, ...] = tuple(op for op, h in HANDLERS.items() if h.contracted_inputs)


def layers(view: ModelView) -> list[Layer]:
    """Every node of the main graph that has a constant weight, as a :class:`Layer`, in graph
    order (Conv, ConvTranspose, Gemm, MatMul with a constant B)."""
    found = []
    for idx, node in enumerate(view.graph.node):
        if node.domain in ("", "ai.onnx"):
            layer = handler_for(node, view).layer(idx)
            if layer is not None:
                found.append(layer)
    return found
