"""Where quantize-dequantize nodes go and along which axis each tensor is blocked.

Policy (``placement="default"``):

* Nodes go on the float inputs of the op types to quantize (Conv, ConvTranspose, Gemm,
  MatMul by default): data and weight, not the bias unless asked.  Each tensor is quantized
  once, however many consumers it has.
* A tensor is blocked along the dimension its consumer contracts over: Conv input and
  weight along the channel axis 1; ConvTranspose input along 1 and weight (C_in, C_out/g,
  ...) along 0; MatMul A along its last axis and B along its second-to-last; Gemm by
  ``transA`` / ``transB``.
* Where that axis is 1 long (a depthwise convolution's weight, (C, 1, kh, kw)), the tensor
  is blocked along its longest fixed axis instead (the output channels for depthwise
  weights), rather than giving every element its own exponent.
* An activation is never blocked along a batch or token axis: where the contraction axis of
  an activation has no fixed length (it grows with batch or sequence, e.g. attention
  probabilities times V contract over the key tokens), the longest fixed axis other than
  the batch axis is used; with none, the tensor stays float and the summary says so.
* Where consumers disagree, compute ops outrank other ops, then the majority, then the
  first consumer in graph order; the summary lists each such choice.

``placement="quark"`` reproduces Quark's placement for comparison: every float input of
every op, compute ops along their reduction axis, all other inputs along axis 1.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import onnx

from .config import QuantizationConfig, FormatSpec
from .graph import ModelView

__all__ = ["Site", "Plan", "plan_model", "COMPUTE_OPS", "reduction_axis", "activation_axis",
           "feature_axis"]

COMPUTE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# Inputs of these ops whose values never reach the output; quantizing them changes nothing.
_SHAPE_ONLY_OPS = {"Shape", "Size", "Constant", "ConstantOfShape"}
_ONNX_DOMAINS = ("", "ai.onnx")


@dataclass
class Site:
    """One tensor to quantize: its kind ("weight" or "activation"), format, block axis (None
    for BF16, which has no blocks), the (node index, input index) pairs that will read the
    quantized tensor, and why the axis was chosen."""
    tensor: str
    kind: str
    spec: FormatSpec
    axis: Optional[int]
    consumers: list[tuple[int, int]]
    consumer_ops: list[str]
    reason: str
    conflict: str = ""
    # Weights only: block the tensor viewed as (shape[0], -1) along axis 1, i.e. over each
    # output channel's whole kernel window (depthwise Conv weights).
    flatten: bool = False


@dataclass
class Plan:
    sites: list[Site] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)      # tensors left float, and why
    conflicts: list[str] = field(default_factory=list)    # consumers that disagreed


@dataclass
class _Request:
    node_idx: int
    input_idx: int
    op_type: str
    axis: Optional[int]
    reason: str
    priority: int
    flatten: bool = False


def _normalize(axis: int, rank: Optional[int]) -> int:
    return axis % rank if rank else axis


def reduction_axis(node: onnx.NodeProto, input_idx: int, view: ModelView) -> tuple[int, str]:
    """The axis ``node`` contracts ``node.input[input_idx]`` over (negative where the rank is
    unknown), with a short reason.  Non-compute ops raise ``KeyError``."""
    op = node.op_type
    name = node.input[input_idx]
    if op == "Conv":
        return 1, "Conv channel axis"
    if op == "ConvTranspose":
        if input_idx == 1:
            return 0, "ConvTranspose weight input-channel axis"
        return 1, "ConvTranspose channel axis"
    if op == "MatMul":
        rank = view.rank(name)
        if input_idx == 0:
            return (-1 if rank is None else max(rank - 1, 0)), "MatMul A last axis"
        if rank == 1:
            return 0, "MatMul B (1-D)"
        return (-2 if rank is None else rank - 2), "MatMul B second-to-last axis"
    if op == "Gemm":
        if input_idx == 0:
            return (0, "Gemm A with transA") if view.node_attr(node, "transA", 0) else \
                (1, "Gemm A axis 1")
        return (1, "Gemm B with transB") if view.node_attr(node, "transB", 0) else \
            (0, "Gemm B axis 0")
    raise KeyError(op)


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


def weight_axis(view: ModelView, name: str, axis: int, reason: str, op_type: str,
                correct: bool = True) -> tuple[int, str, bool]:
    """The block axis of weight ``name`` given its consumer's preferred ``axis``, and whether
    to flatten it.  When ``correct`` and that axis is 1 long: a Conv weight (C_out, 1, k...)
    (depthwise) is blocked over each output channel's kernel window, viewed as
    (C_out, prod(k)) along axis 1 -- the window is what a depthwise conv contracts over;
    other weights use their longest axis."""
    shape = view.shape.get(name) or ()
    rank = len(shape)
    if rank <= 1:
        return 0, "rank <= 1: its only axis", False
    a = _normalize(axis, rank)
    if correct and shape[a] == 1:
        if op_type == "Conv" and a == 1 and rank >= 3:
            window = _numel(shape[2:]) or 1
            return 1, (f"depthwise Conv weight: channel axis is 1 long; blocked over each "
                       f"output channel's {window}-element kernel window"), True
        alt = feature_axis(view, name, exclude=a, is_weight=True)
        if alt is not None:
            return alt, f"{op_type} weight: axis {a} is 1 long; blocked along axis {alt}", False
    return a, reason, False


def _inputs_to_consider(node: onnx.NodeProto, config: QuantizationConfig,
                        view: ModelView) -> list[int]:
    """Indices of ``node``'s inputs that the placement mode quantizes (before type checks)."""
    op = node.op_type
    n = len(node.input)
    if config.placement == "quark":
        return list(range(n))
    if op in ("Conv", "ConvTranspose", "Gemm"):
        return [k for k in range(n) if k < 2 or (k == 2 and config.quantize_bias)]
    if op == "MatMul":
        return [0, 1][:n]
    return list(range(n))


def _wants_node(node: onnx.NodeProto, config: QuantizationConfig) -> bool:
    if node.domain not in _ONNX_DOMAINS or node.op_type in _SHAPE_ONLY_OPS:
        return False
    if node.name and node.name in config.nodes_to_exclude:
        return False
    if config.placement == "quark" or config.quantize_all_op_types:
        return True
    return node.op_type in config.op_types_to_quantize


def plan_model(view: ModelView, config: QuantizationConfig) -> Plan:
    """Decide every quantized tensor, its format, axis and consumers (see module docs)."""
    plan = Plan()
    requests: dict[str, list[_Request]] = {}
    order: list[str] = []
    quark = config.placement == "quark"
    names = {n.name for n in view.graph.node}
    for missing in sorted(set(config.nodes_to_exclude) - names):
        plan.skipped.append(f"nodes_to_exclude: no node named {missing!r}")
    for idx, node in enumerate(view.graph.node):
        if not _wants_node(node, config):
            continue
        for k in _inputs_to_consider(node, config, view):
            name = node.input[k]
            if not name:
                continue
            is_float = view.is_float(name)
            compute = node.op_type in COMPUTE_OPS and k < 2
            if is_float is False or (is_float is None and not compute):
                continue
            is_weight = view.is_weight(name)
            shape = view.shape.get(name)
            if is_weight and shape is not None and (_numel(shape) or 0) <= 1:
                continue  # a one-element tensor comes back unchanged from every format
            spec = config.weight if is_weight else config.activation
            if spec is None:
                continue
            flatten = False
            if compute:
                axis, reason = reduction_axis(node, k, view)
                priority = 1
            else:
                axis = 1 if quark else (feature_axis(view, name, is_weight=is_weight,
                                                     layout_first=True)
                                        if view.rank(name) is not None else -1)
                reason = "axis 1 (Quark)" if quark else f"{node.op_type} input: feature axis"
                priority = 0
                if axis is None:
                    plan.skipped.append(f"{name} (input of {node.op_type} {node.name!r}): "
                                        "no fixed-length axis to block along")
                    continue
            if not quark:
                if is_weight:
                    axis, reason, flatten = weight_axis(view, name, axis, reason,
                                                        node.op_type)
                else:
                    axis, reason = activation_axis(view, name, axis, reason,
                                                   keep_dynamic=node.op_type in
                                                   ("Conv", "ConvTranspose"))
                if axis is None:
                    plan.skipped.append(f"{name} (input {k} of {node.op_type} "
                                        f"{node.name!r}): {reason}; left float")
                    continue
            elif view.rank(name) is not None:
                axis = _normalize(axis, view.rank(name)) if view.rank(name) > 1 else 0
            if name not in requests:
                order.append(name)
            requests.setdefault(name, []).append(
                _Request(idx, k, node.op_type, axis, reason, priority, flatten))
    for name in order:
        reqs = requests[name]
        is_weight = view.is_weight(name)
        spec = config.weight if is_weight else config.activation
        assert spec is not None
        top = max(r.priority for r in reqs)
        best = [r for r in reqs if r.priority == top]
        counts = Counter((r.axis, r.flatten) for r in best)
        winner_key = max(counts, key=lambda a: (counts[a], -min(
            i for i, r in enumerate(best) if (r.axis, r.flatten) == a)))
        winner = next(r for r in best if (r.axis, r.flatten) == winner_key)
        winner_axis = winner.axis
        conflict = ""
        distinct = {(r.axis, r.flatten) for r in reqs}
        if len(distinct) > 1 and spec.op != "BF16":
            wanted = ", ".join(f"{r.op_type} {view.graph.node[r.node_idx].name!r} axis {r.axis}"
                               for r in reqs)
            conflict = (f"{name}: consumers disagree ({wanted}); blocked along axis "
                        f"{winner_axis} for all ({'compute op first, ' if top else ''}"
                        f"then majority, then graph order)")
            plan.conflicts.append(conflict)
        plan.sites.append(Site(
            tensor=name, kind="weight" if is_weight else "activation", spec=spec,
            axis=None if spec.op == "BF16" else winner_axis,
            consumers=[(r.node_idx, r.input_idx) for r in reqs],
            consumer_ops=[r.op_type for r in reqs], reason=winner.reason, conflict=conflict,
            flatten=winner.flatten and spec.op != "BF16"))
    return plan


def _numel(shape: tuple) -> Optional[int]:
    n = 1
    for d in shape:
        if d is None:
            return None
        n *= d
    return n
