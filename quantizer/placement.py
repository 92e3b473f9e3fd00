"""Where quantize-dequantize nodes go and along which axis each tensor is blocked.

Policy (``placement="default"``); what each op type contributes (inputs, reduction axes,
weight layout) lives in its handler, :mod:`.handlers`:

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
from .handlers import (COMPUTE_OPS, activation_axis, feature_axis, handler_for, numel)

__all__ = ["Site", "Plan", "plan_model", "COMPUTE_OPS", "reduction_axis", "activation_axis",
           "feature_axis"]

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


def reduction_axis(node: onnx.NodeProto, input_idx: int, view: ModelView) -> tuple[int, str]:
    """The axis ``node`` contracts ``node.input[input_idx]`` over (negative where the rank is
    unknown), with a short reason.  Non-compute ops raise ``KeyError``."""
    return handler_for(node, view).reduction_axis(input_idx)


def _wants_node(node: onnx.NodeProto, config: QuantizationConfig) -> bool:
    if node.domain not in _ONNX_DOMAINS:
        return False
    if node.name and node.name in config.nodes_to_exclude:
        return False
    if config.placement == "quark" or config.quantize_all_op_types:
        return True
    return node.op_type in config.op_types_to_quantize


def _spec_for(config: QuantizationConfig, name: str, is_weight: bool) -> Optional[FormatSpec]:
    """The format of tensor ``name``: its per-tensor override if any, else the kind's."""
    if name in config.tensor_formats:
        return config.tensor_formats[name]
    return config.weight if is_weight else config.activation


def plan_model(view: ModelView, config: QuantizationConfig) -> Plan:
    """Decide every quantized tensor, its format, axis and consumers (see module docs)."""
    plan = Plan()
    requests: dict[str, list[_Request]] = {}
    order: list[str] = []
    quark = config.placement == "quark"
    names = {n.name for n in view.graph.node}
    for missing in sorted(set(config.nodes_to_exclude) - names):
        plan.skipped.append(f"nodes_to_exclude: no node named {missing!r}")
    for missing in sorted(set(config.tensor_formats) - set(view.consumers)):
        plan.skipped.append(f"tensor_formats: no node reads a tensor named {missing!r}")
    for idx, node in enumerate(view.graph.node):
        if not _wants_node(node, config):
            continue
        handler = handler_for(node, view)
        for k in handler.inputs_to_quantize(config.quantize_bias, quark):
            name = node.input[k]
            if not name:
                continue
            is_float = view.is_float(name)
            if is_float is False or (is_float is None and not handler.contracts(k)):
                continue
            is_weight = view.is_weight(name)
            shape = view.shape.get(name)
            if is_weight and shape is not None and (numel(shape) or 0) <= 1:
                continue  # a one-element tensor comes back unchanged from every format
            if _spec_for(config, name, is_weight) is None:
                continue
            choice = handler.block_axis(k, quark)
            if choice.axis is None:
                plan.skipped.append(f"{name} (input {k} of {node.op_type} {node.name!r}): "
                                    f"{choice.reason}; left float")
                continue
            if name not in requests:
                order.append(name)
            requests.setdefault(name, []).append(
                _Request(idx, k, node.op_type, choice.axis, choice.reason, choice.priority,
                         choice.flatten))
    for name in order:
        reqs = requests[name]
        is_weight = view.is_weight(name)
        spec = _spec_for(config, name, is_weight)
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
