"""Graph surgery by hand: our nodes on the tensors you name, and off again.

* :func:`make_node` -- the node(s) that quantize one tensor in one format, as the quantizer
  emits them (``ort_mx_ops.make_node``);
* :func:`opset_imports` -- make a model's imports of our domains match its nodes
  (``ort_mx_ops.opset_imports``);
* :func:`insert_qdq` -- a copy of a model with a node on each named tensor and every reader
  rewired, subgraphs and graph outputs included;
* :func:`strip_qdq` -- a copy with every node of ours taken out: the float graph back.

Nodes come from the quantizer's node factory (:class:`.nodes.NodeFactory`), op names and
domains from the catalogue (:mod:`ort_mx_ops.formats`), and an omitted axis from the op
handler of the tensor's reader (:mod:`.handlers`), exactly as :func:`.quantize_model`
chooses it.  docs/quantizer.md ("Dropping nodes by hand") shows them in use.
"""
from __future__ import annotations

import json
import numbers
import os
import re
import sys
from dataclasses import dataclass, asdict
from typing import Any, Iterator, Mapping, Optional, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ort_mx_ops.formats import OPS, PRODUCT_DOMAIN, FormatSpec
from ort_mx_ops.graph_walk import subgraphs as _subgraphs

from .config import QuantizationConfig, as_format
from .graph import ModelView
from .handlers import feature_axis, handler_for
from .nodes import Emitted, NodeFactory
from .placement import plan_model
from .quantize import (_Names, _add_opset, _default_opset, _load, _same_file,
                       save_model_atomic)

__all__ = ["NodeGroup", "TensorError", "Inserted", "make_node", "opset_imports", "insert_qdq",
           "strip_qdq", "OUR_DOMAINS"]

# Every domain the library registers ops in.
OUR_DOMAINS: frozenset[str] = frozenset({s.domain for s in OPS.values()} | {PRODUCT_DOMAIN})
_ONNX_DOMAINS = ("", "ai.onnx")
_FLOAT_ELEMS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)

FormatLike = Union[FormatSpec, str]
Request = Union[FormatLike, tuple]  # a format, or (format, axis) with axis an int or None


class NodeGroup(Emitted):
    """What :func:`make_node` returns: ``nodes`` in execution order (one node for a block
    format; two for BF16, four for a rescaled Cast pair, three for a flattened weight),
    ``initializers`` they read (BF16's scale and zero point) and the op ``domains`` they
    need imported.  ``.node`` is the node when there is exactly one."""

    @property
    def node(self) -> onnx.NodeProto:
        """The single node; ``ValueError`` when there are several (BF16 is a pair)."""
        if len(self.nodes) != 1:
            raise ValueError(f"{len(self.nodes)} nodes ({', '.join(n.op_type for n in self.nodes)})"
                             "; read .nodes (and .initializers)")
        return self.nodes[0]


class TensorError(ValueError):
    """A request of :func:`insert_qdq` that cannot be met; ``tensor`` names the tensor."""

    def __init__(self, tensor: str, message: str) -> None:
        super().__init__(f"tensor {tensor!r}: {message}")
        self.tensor = tensor


@dataclass
class Inserted:
    """One tensor :func:`insert_qdq` quantized: format, axis (None for BF16), why that
    axis, the op types of the nodes, and the name its readers now read."""
    tensor: str
    format: str
    axis: Optional[int]
    reason: str
    nodes: list[str]
    output: str


# --------------------------------------------------------------------------------------
# Graph walking
# --------------------------------------------------------------------------------------

def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph nested in it (If branches, Loop and Scan bodies)."""
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _graphs(sub)


def _defines(graph: onnx.GraphProto) -> set[str]:
    """The tensor names ``graph`` itself defines."""
    names = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    for node in graph.node:
        names.update(node.output)
    return names


def _rename_reads(graph: onnx.GraphProto, renames: Mapping[str, str],
                  nested: bool = False) -> None:
    """Every read of a name in ``renames`` in ``graph`` and its subgraphs reads the name it
    maps to instead (followed through chains): node inputs, and the outputs of subgraphs
    that return an outer tensor directly.  A subgraph that defines a name itself keeps its
    own.  One pass, whatever the number of names."""
    if nested:
        own = _defines(graph) & set(renames)
        if own:
            renames = {k: v for k, v in renames.items() if k not in own}
        for out in graph.output:
            out.name = _resolve(renames, out.name)
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in renames:
                node.input[k] = _resolve(renames, name)
        for sub in _subgraphs(node):
            _rename_reads(sub, renames, nested=True)


def _resolve(renames: Mapping[str, str], name: str) -> str:
    while name in renames:
        name = renames[name]
    return name


def _readers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    """Tensor name -> the (node, input index) pairs reading it, in ``graph`` first (graph
    order) and then in its subgraphs."""
    found: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for g in _graphs(graph):
        for node in g.node:
            for k, name in enumerate(node.input):
                if name:
                    found.setdefault(name, []).append((node, k))
    return found


def _is_ours(node: onnx.NodeProto) -> bool:
    return node.domain in OUR_DOMAINS


def _all_names(model_graph: onnx.GraphProto) -> _Names:
    """Fresh-name source avoiding every name of the graph and of its subgraphs."""
    names = _Names(model_graph)
    for g in _graphs(model_graph):
        names.used |= _defines(g) | {o.name for o in g.output} | {n.name for n in g.node}
        for node in g.node:
            names.used.update(node.input)
    return names


# --------------------------------------------------------------------------------------
# make_node, opset_imports
# --------------------------------------------------------------------------------------

def _as_spec(config: Any) -> FormatSpec:
    spec = as_format(config) if isinstance(config, (str, FormatSpec)) else config
    if not isinstance(spec, FormatSpec):
        raise ValueError(f"a format is a built-in name or a FormatSpec, got {config!r}")
    return spec


def _check_axis(axis: Any) -> Optional[int]:
    if axis is None:
        return None
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise ValueError(f"axis must be an int, got {axis!r}")
    return int(axis)


def make_node(config: FormatLike, input: str, output: str, axis: Optional[int] = None,
              name: Optional[str] = None, legacy_names: bool = False, *,
              bf16_cast: bool = False, bf16_fused: bool = False,
              elem_type: int = TensorProto.FLOAT,
              graph: Optional[onnx.GraphProto] = None) -> NodeGroup:
    """The node(s) that quantize-dequantize tensor ``input`` into ``output`` in ``config`` (a
    built-in name such as ``"MXFP8E4M3"``, or a :class:`FormatSpec`), as the quantizer emits
    them.

    A block format (BFP, MX) is one ``BFPQuantizeDequantize`` / ``MXQuantizeDequantize``
    node (``legacy_names``: ``BFPFixNeuron`` / ``MXFixNeuron``) blocked along ``axis``, which
    it requires.  BF16 is the ``ExtendedQuantizeLinear`` -> ``ExtendedDequantizeLinear`` pair
    with scale 1 and a bfloat16 zero point 0 (two initializers, returned with the nodes), or
    with ``bf16_cast`` ``Cast(BFLOAT16) -> Cast(elem_type)``, or with ``bf16_fused`` our one
    ``BF16QuantizeDequantize`` node on the same initializers; it has no blocks and ignores
    ``axis``.  ``name`` names the node (several nodes: ``name`` plus a suffix); intermediate
    tensors and initializers are named after ``input`` and avoid every name of ``graph``
    when one is given.  Add ``result.domains`` to the model's imports, or call
    :func:`opset_imports` on the finished model."""
    spec = _as_spec(config)
    axis = _check_axis(axis)
    if spec.op != "BF16" and axis is None:
        raise ValueError(f"{spec.name} is a block format: pass axis= (the axis its blocks run "
                         "along)")
    names = _all_names(graph) if graph is not None else _Names(helper.make_graph([], "", [], []))
    names.used |= {input, output}

    def new_name(base: str) -> str:
        # The factory names everything after the tensor except BF16's shared constants: with
        # no graph to share them in, they are named after the tensor too.
        return names.new(base if base.startswith(f"{input}_") else f"{input}_{base}")

    factory = NodeFactory(new_name, legacy_names=legacy_names, bf16_cast=bf16_cast,
                          bf16_fused=bf16_fused)
    emitted = factory.quantize(spec, input, output, axis, elem_type=elem_type)
    if name is not None:
        for node in emitted.nodes:
            node.name = name if len(emitted.nodes) == 1 else name + node.name[len(input):]
    return NodeGroup(emitted.nodes, emitted.initializers, emitted.domains)


def _used_domains(model: onnx.ModelProto) -> set[str]:
    used = {n.domain for g in _graphs(model.graph) for n in g.node}
    for f in model.functions:
        used |= {n.domain for n in f.node}
    return used & OUR_DOMAINS


def opset_imports(model: onnx.ModelProto) -> list[str]:
    """Make ``model``'s imports of the library's domains match its nodes (subgraphs and
    functions included), in place: import each domain of ours that a node uses, at version
    1, and drop the ones no node uses.  Other domains are left alone.  Returns the domains
    of ours the model now imports, sorted."""
    used = _used_domains(model)
    keep = [o for o in model.opset_import if o.domain not in OUR_DOMAINS or o.domain in used]
    if len(keep) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(keep)
    for domain in sorted(used):
        _add_opset(model, domain)
    return sorted(used)


# --------------------------------------------------------------------------------------
# insert_qdq
# --------------------------------------------------------------------------------------

def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto, got {type(model).__name__}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _parse_request(tensor: str, value: Request) -> tuple[FormatSpec, Optional[int]]:
    if isinstance(value, tuple) and len(value) != 2:
        raise TensorError(tensor, f"expected a format or (format, axis), got {value!r}")
    config, axis = value if isinstance(value, tuple) else (value, None)
    try:
        return _as_spec(config), _check_axis(axis)
    except ValueError as exc:
        raise TensorError(tensor, str(exc)) from None


def _validate(view: ModelView, readers: dict, tensor: str, spec: FormatSpec,
              axis: Optional[int], bf16_cast: bool) -> Optional[int]:
    """Raise :class:`TensorError` for a request that cannot be met; return the axis made
    non-negative where the rank is known."""
    g = view.graph
    if tensor not in view.producer and tensor not in view.graph_inputs and \
            tensor not in {i.name for i in g.initializer}:
        raise TensorError(tensor, "no such tensor in the main graph (its inputs, initializers "
                                  "and node outputs)")
    elem = view.elem_type.get(tensor)
    if view.is_float(tensor) is False:
        raise TensorError(tensor, f"it is {TensorProto.DataType.Name(elem)}, not a float "
                                  "tensor (float, float16 or bfloat16)")
    ours = [n for n, _ in readers.get(tensor, []) if _is_ours(n)]
    if tensor in view.producer and _is_ours(g.node[view.producer[tensor]]):
        ours.insert(0, g.node[view.producer[tensor]])
    if ours:
        raise TensorError(tensor, f"it already carries a node of ours ({ours[0].op_type} "
                                  f"{ours[0].name!r}); strip_qdq first")
    is_output = tensor in view.graph_outputs
    if not readers.get(tensor) and not is_output:
        raise TensorError(tensor, "nothing reads it and it is not a graph output")
    if is_output and tensor in view.graph_inputs:
        raise TensorError(tensor, "it is both a graph input and a graph output; a node on it "
                                  "cannot keep both names")
    if spec.op == "BF16":
        if not bf16_cast and elem not in (None, TensorProto.FLOAT):
            raise TensorError(tensor, f"BF16 Extended Q/DQ takes float32 tensors; this one is "
                                      f"{TensorProto.DataType.Name(elem)} (use bf16_cast)")
        return None
    rank = view.rank(tensor)
    if axis is not None and rank is not None:
        if not -max(rank, 1) <= axis < max(rank, 1):
            raise TensorError(tensor, f"axis {axis} is out of range for its rank {rank}")
        axis %= max(rank, 1)
    return axis


def _handler_axis(view: ModelView, readers: dict, tensor: str) -> tuple[int, bool, str]:
    """The axis (and flatten) a reader's op handler chooses for ``tensor`` where the
    quantizer's placement would not place it: readers in graph order, subgraphs after the
    main graph; with no reader, the rule for inputs of ops that contract nothing."""
    reasons = []
    for node, k in readers.get(tensor, []):
        if node.domain not in _ONNX_DOMAINS:
            reasons.append(f"{node.op_type} {node.name!r} is in domain {node.domain!r}")
            continue
        choice = handler_for(node, view).block_axis(k)
        if choice.axis is not None:
            return choice.axis, choice.flatten, choice.reason
        reasons.append(f"{node.op_type} {node.name!r}: {choice.reason}")
    if not readers.get(tensor):
        alt = feature_axis(view, tensor, layout_first=True)
        if alt is not None:
            return alt, False, "graph output: feature axis"
        reasons.append("graph output without a fixed-length axis")
    raise TensorError(tensor, f"no reader's op handler chooses a block axis ({'; '.join(reasons)}"
                              "); pass (format, axis)")


def _choose_axes(view: ModelView, readers: dict,
                 wanted: dict[str, tuple[FormatSpec, Optional[int]]]
                 ) -> dict[str, tuple[Optional[int], bool, str]]:
    """tensor -> (axis, flatten, reason): the given axis, else the quantizer's choice (its
    placement over every op type, so main-graph readers decide as in quantize_model), else
    :func:`_handler_axis`."""
    auto = {t: spec for t, (spec, axis) in wanted.items() if axis is None and spec.op != "BF16"}
    sites = {}
    if auto:
        cfg = QuantizationConfig(activation=None, weight=None, tensor_formats=auto,
                                 quantize_all_op_types=True, quantize_bias=True)
        sites = {s.tensor: s for s in plan_model(view, cfg).sites}
    chosen = {}
    for t, (spec, axis) in wanted.items():
        if spec.op == "BF16":
            chosen[t] = (None, False, "BF16 has no blocks")
        elif axis is not None:
            chosen[t] = (axis, False, "axis given")
        elif t in sites:
            chosen[t] = (sites[t].axis, sites[t].flatten, sites[t].reason)
        else:
            chosen[t] = _handler_axis(view, readers, t)
    return chosen


def insert_qdq(model: onnx.ModelProto, tensors: Mapping[str, Request], *,
               legacy_names: bool = False, bf16_cast: bool = False,
               bf16_fused: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` (which is left untouched) with one quantize-dequantize node (a pair
    for BF16) on each tensor of ``tensors``: ``{name: format}`` or ``{name: (format, axis)}``,
    a format being a built-in name or a :class:`FormatSpec`.

    Tensors are those of the main graph (inputs, initializers, node outputs).  Every reader
    is rewired to the quantized tensor, including readers inside If / Loop / Scan subgraphs.
    A graph output keeps its name: the node writes it and the producer's output is renamed.
    Without an axis, the op handler of the tensor's reader chooses it as
    :func:`.quantize_model` does (a depthwise weight is blocked over its kernel window,
    between two Reshapes).  ``legacy_names``, ``bf16_cast`` and ``bf16_fused`` are the
    quantizer's options (see :func:`make_node`).

    Raises :class:`TensorError` (a ``ValueError`` naming the tensor) for an unknown tensor, a
    non-float tensor, an axis out of range for the tensor's known rank, a tensor that already
    carries a node of ours, or a format that is not one."""
    return _insert(model, tensors, legacy_names=legacy_names, bf16_cast=bf16_cast,
                   bf16_fused=bf16_fused)[0]


def _insert(model: onnx.ModelProto, tensors: Mapping[str, Request], *, legacy_names: bool,
            bf16_cast: bool, bf16_fused: bool = False) -> tuple[onnx.ModelProto, list[Inserted]]:
    m = _copy(model)
    g = m.graph
    wanted = {str(t): _parse_request(str(t), v) for t, v in tensors.items()}
    if bf16_cast and any(s.op == "BF16" for s, _ in wanted.values()) and _default_opset(m) < 13:
        raise ValueError(f"bf16_cast needs ONNX opset >= 13 (Cast to BFLOAT16); this model "
                         f"imports opset {_default_opset(m)}")
    view = ModelView(m)
    readers = _readers(g)
    for t, (spec, axis) in wanted.items():
        wanted[t] = (spec, _validate(view, readers, t, spec, axis, bf16_cast))
    chosen = _choose_axes(view, readers, wanted)

    names = _all_names(g)
    factory = NodeFactory(names.new, legacy_names=legacy_names, bf16_cast=bf16_cast,
                          bf16_fused=bf16_fused)
    after: dict[int, list[onnx.NodeProto]] = {}   # producer index (-1: none) -> new nodes
    new_inits: list[onnx.TensorProto] = []
    records = []
    renames: dict[str, str] = {}   # tensor -> the quantized tensor its readers read
    for t, (spec, _) in wanted.items():
        axis, flatten, reason = chosen[t]
        if t in view.graph_outputs:
            # The graph output keeps its name: the node writes it (so its readers read the
            # quantized tensor under the same name) and the producer writes src.
            src, dst = names.new(f"{t}_float"), t
            _rename_definition(g, view, t, src)
        else:
            src = t
            dst = names.new(f"{t}_DequantizeLinear_Output" if spec.op == "BF16"
                            else f"{t}_{spec.name}")
            renames[t] = dst
        shape = view.shape.get(t)
        flat_shape = shape if flatten and shape is not None and len(shape) > 2 else None
        emitted = factory.quantize(spec, src, dst, axis, elem_type=view.elem_type.get(t),
                                   flat_shape=flat_shape)
        after.setdefault(view.producer.get(t, -1), []).extend(emitted.nodes)
        new_inits.extend(emitted.initializers)
        records.append(Inserted(t, spec.name, axis, reason, [n.op_type for n in emitted.nodes],
                                dst))

    _rename_reads(g, renames)   # before the new nodes join the graph: they read the originals
    rebuilt = list(after.get(-1, []))
    for idx, node in enumerate(g.node):
        rebuilt.append(node)
        rebuilt.extend(after.get(idx, []))
    del g.node[:]
    g.node.extend(rebuilt)
    g.initializer.extend(new_inits)
    if m.ir_version < 4:  # before IR 4 every initializer is also a graph input
        g.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
                       for i in new_inits)
    opset_imports(m)
    return m, records


def _rename_definition(g: onnx.GraphProto, view: ModelView, old: str, new: str) -> None:
    """The producer of ``old`` (a node, a Constant or an initializer) writes ``new``."""
    if old in view.producer:
        node = g.node[view.producer[old]]
        node.output[list(node.output).index(old)] = new
    else:
        next(i for i in g.initializer if i.name == old).name = new
    for vi in g.value_info:
        if vi.name == old:
            vi.name = new


# --------------------------------------------------------------------------------------
# strip_qdq
# --------------------------------------------------------------------------------------

@dataclass
class _Unit:
    """Nodes that together quantize tensor ``source``; readers of each of ``outputs`` read
    ``source`` once they are gone."""
    nodes: list[onnx.NodeProto]
    source: str
    outputs: list[str]


def _const_value(g: onnx.GraphProto, name: str) -> Optional[np.ndarray]:
    """The value of ``name`` where ``g`` holds it as an initializer or a Constant's value."""
    for i in g.initializer:
        if i.name == name:
            return numpy_helper.to_array(i)
    for n in g.node:
        if n.op_type == "Constant" and n.domain in _ONNX_DOMAINS and list(n.output) == [name]:
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            return None if value is None else numpy_helper.to_array(value)
    return None


def _only_reader(readers: dict, name: str, outputs: set[str]) -> Optional[onnx.NodeProto]:
    found = readers.get(name, [])
    if len(found) != 1 or name in outputs:
        return None
    return found[0][0]


def _cast_to(node: onnx.NodeProto) -> Optional[int]:
    if node.op_type != "Cast" or node.domain not in _ONNX_DOMAINS:
        return None
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _units(g: onnx.GraphProto) -> list[_Unit]:
    """Every group of nodes of ours in ``g`` (not its subgraphs), with the BF16 Cast pairs;
    ``ValueError`` for a node of ours with no float graph to go back to."""
    readers = _readers(g)
    producer = {o: n for n in g.node for o in n.output}
    outputs = {o.name for o in g.output}
    units: list[_Unit] = []
    for node in g.node:
        kind = OPS[node.op_type].kind if node.op_type in OPS and \
            OPS[node.op_type].domain == node.domain else None
        if kind in ("BFP", "MX", "BF16_QDQ"):
            units.append(_reshaped(g, node, readers, producer, outputs) or
                         _Unit([node], node.input[0], [node.output[0]]))
        elif kind == "BF16_QUANTIZE" or _cast_to(node) == TensorProto.BFLOAT16:
            unit = _pair(g, node, readers, producer, outputs)
            if unit is not None:
                units.append(unit)
            elif kind:
                raise ValueError(f"strip_qdq: {node.op_type} {node.name!r} is not followed only "
                                 "by ExtendedDequantizeLinear nodes; it cannot be removed alone")
        elif kind == "BF16_DEQUANTIZE":
            q = producer.get(node.input[0])
            if q is None or OPS.get(q.op_type) is None or OPS[q.op_type].kind != "BF16_QUANTIZE":
                raise ValueError(f"strip_qdq: {node.op_type} {node.name!r} reads "
                                 f"{node.input[0]!r}, which no ExtendedQuantizeLinear writes: "
                                 "it stores a tensor in bfloat16, with no float form to go "
                                 "back to")
        elif _is_ours(node):
            raise ValueError(f"strip_qdq: does not know how to remove {node.op_type} "
                             f"{node.name!r} (domain {node.domain})")
    return units


def _reshaped(g: onnx.GraphProto, node: onnx.NodeProto, readers: dict, producer: dict,
              outputs: set[str]) -> Optional[_Unit]:
    """The quantizer's flattened-weight form Reshape -> node -> Reshape, when the second
    Reshape restores the shape of the constant the first one read."""
    first = producer.get(node.input[0])
    last = _only_reader(readers, node.output[0], outputs)
    if first is None or last is None or first.op_type != "Reshape" or \
            last.op_type != "Reshape" or \
            _only_reader(readers, first.output[0], outputs) is not node:
        return None
    source = _const_value(g, first.input[0])
    shape = _const_value(g, last.input[1])
    if source is None or shape is None or list(source.shape) != shape.tolist():
        return None
    return _Unit([first, node, last], first.input[0], [last.output[0]])


def _pair(g: onnx.GraphProto, q: onnx.NodeProto, readers: dict, producer: dict,
          outputs: set[str]) -> Optional[_Unit]:
    """Extended Q with only Extended DQ readers, or Cast(BFLOAT16) with only Casts back to
    a float type (with the quantizer's Div / Mul rescale around them when present)."""
    cast = q.op_type == "Cast"
    mid = q.output[0]
    back = [n for n, _ in readers.get(mid, [])]
    if not back or mid in outputs or len(back) != len(readers[mid]):
        return None
    for n in back:
        ok = _cast_to(n) in _FLOAT_ELEMS if cast else \
            (n.op_type in OPS and OPS[n.op_type].kind == "BF16_DEQUANTIZE" and n.input[0] == mid)
        if not ok:
            return None
    nodes, source, outs = [q, *back], q.input[0], [n.output[0] for n in back]
    div = producer.get(source) if cast else None
    if div is not None and div.op_type == "Div" and _only_reader(readers, source, outputs) is q:
        muls = [_only_reader(readers, o, outputs) for o in outs]
        if all(mul is not None and mul.op_type == "Mul" and list(mul.input)[1] == div.input[1]
               for mul in muls):
            nodes = [div, *nodes, *muls]
            source, outs = div.input[0], [mul.output[0] for mul in muls]  # type: ignore
    return _Unit(nodes, source, outs)


def _strip_graph(g: onnx.GraphProto, dropped_reads: set[str]) -> None:
    """Remove the units of ``g`` and of its subgraphs (innermost first), rewiring readers;
    names the removed nodes read go to ``dropped_reads``."""
    for node in g.node:
        for sub in _subgraphs(node):
            _strip_graph(sub, dropped_reads)
    units = _units(g)
    if not units:
        return
    outputs = {o.name for o in g.output}
    inputs = {i.name for i in g.input}
    removed = {id(n) for u in units for n in u.nodes}
    producer = {o: n for n in g.node if id(n) not in removed for o in n.output}
    identities: dict[int, list[onnx.NodeProto]] = {}  # id of a removed node -> nodes after it
    renames: dict[str, str] = {}   # a name rewired away -> the name that replaces it
    gone: set[str] = set()
    for u in units:
        for n in u.nodes:
            dropped_reads.update(i for i in n.input if i)
            gone.update(n.output)
        source = _resolve(renames, u.source)  # an earlier unit may have renamed it (chains)
        for out in u.outputs:
            if out not in outputs:
                renames[out] = source
            elif source not in outputs and source not in inputs and source in producer:
                # The graph output keeps its name: the producer writes it again.
                node = producer.pop(source)
                node.output[list(node.output).index(source)] = out
                producer[out] = node
                renames[source] = out
                gone.add(source)
                source = out
            else:
                identities.setdefault(id(u.nodes[-1]), []).append(helper.make_node(
                    "Identity", [source], [out], name=f"{out}_Identity"))
    kept = []
    for n in g.node:
        if id(n) not in removed:
            kept.append(n)
        kept.extend(identities.get(id(n), []))
    del g.node[:]
    g.node.extend(kept)
    _rename_reads(g, renames)
    still = {o for n in g.node for o in n.output}
    kept_vi = [vi for vi in g.value_info if vi.name not in gone or vi.name in still]
    if len(kept_vi) != len(g.value_info):
        del g.value_info[:]
        g.value_info.extend(kept_vi)


def strip_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` (which is left untouched) with every node of ours removed, in the
    main graph and in subgraphs: block-format nodes (with the quantizer's Reshape pair around
    a flattened weight), Extended Q/DQ pairs, and BF16 Cast pairs (``Cast(BFLOAT16)`` read
    only by Casts back to float, with the quantizer's Div / Mul rescale).  Their readers read
    the float tensor again; a graph output keeps its name (its producer writes it again, or
    an Identity where the float tensor is a graph input).  Initializers only the removed
    nodes read, and imports of our domains no node uses any more, are dropped.

    Weights that :func:`.quantize_model` folded carry no node and stay quantized.
    ``ValueError`` for a node of ours with no float form to go back to (a lone
    ExtendedDequantizeLinear of a bfloat16 constant, an op strip_qdq does not know)."""
    m = _copy(model)
    dropped: set[str] = set()
    _strip_graph(m.graph, dropped)
    read = set()
    for g in _graphs(m.graph):
        read |= {i for n in g.node for i in n.input} | {o.name for o in g.output}
    unused = dropped - read
    for g in _graphs(m.graph):
        inputs = {i.name for i in g.input}
        drop = {i.name for i in g.initializer if i.name in unused and
                (i.name not in inputs or (g is m.graph and m.ir_version < 4))}
        if drop:
            kept = [i for i in g.initializer if i.name not in drop]
            del g.initializer[:]
            g.initializer.extend(kept)
            kept_in = [i for i in g.input if i.name not in drop]
            del g.input[:]
            g.input.extend(kept_in)
    opset_imports(m)
    return m


# --------------------------------------------------------------------------------------
# ort-mx-quantize --tensor
# --------------------------------------------------------------------------------------

_AXIS_SUFFIX = re.compile(r":axis=(-?\d+)$")


def parse_tensor_flag(text: str) -> tuple[str, str, Optional[int]]:
    """``NAME=CONFIG`` or ``NAME=CONFIG:axis=N`` -> (name, config, axis); the name may hold
    ``:`` and ``=`` (the config is after the last ``=``)."""
    m = _AXIS_SUFFIX.search(text)
    head = text[:m.start()] if m else text
    name, sep, config = head.rpartition("=")
    if not sep or not name or not config:
        raise ValueError("expected NAME=CONFIG or NAME=CONFIG:axis=N")
    return name, config, int(m.group(1)) if m else None


def run_tensor_flags(args: Any) -> int:
    """``ort-mx-quantize IN OUT --tensor NAME=CONFIG[:axis=N] ...``: nodes on the named
    tensors only (no automatic placement), written atomically.  Errors: one line on stderr
    naming the flag, exit status 2."""
    def fail(message: str) -> int:
        print(f"ort-mx-quantize: error: {message}", file=sys.stderr)
        return 2

    others = [flag for flag, given in (
        ("--config", args.config), ("--weight-config", args.weight_config),
        ("--activation-config", args.activation_config), ("--all-op-types", args.all_op_types),
        ("--exclude", args.exclude), ("--quantize-bias", args.quantize_bias),
        ("--placement", args.placement != "default"), ("--no-fold", args.no_fold),
        ("--bf16-weight-scaled", args.bf16_weight_scaled),
        ("--bf16-activation-scaled", args.bf16_activation_scaled),
        ("--calib", args.calib), ("--calib-reader", args.calib_reader)) if given]
    if not args.output:
        return fail("--tensor needs an OUTPUT model path")
    if others:
        return fail(f"--tensor places nodes on the named tensors only; it does not combine "
                    f"with {', '.join(others)}")
    flags: dict[str, str] = {}
    requests: dict[str, tuple[str, Optional[int]]] = {}
    for text in args.tensor:
        try:
            name, config, axis = parse_tensor_flag(text)
        except ValueError as exc:
            return fail(f"--tensor {text}: {exc}")
        if name in flags:
            return fail(f"--tensor {text}: tensor {name!r} is already given by --tensor "
                        f"{flags[name]}")
        flags[name] = text
        requests[name] = (config, axis)
    try:
        if os.path.exists(args.input) and _same_file(args.input, args.output):
            return fail(f"--tensor: refusing to write over the input {args.input!r}; choose "
                        "another output path")
        model, _ = _load(args.input)
        out, records = _insert(model, requests, legacy_names=args.legacy_names,
                               bf16_cast=args.bf16_cast, bf16_fused=args.bf16_fused)
        save_model_atomic(out, args.output, input_model=args.input)
    except TensorError as exc:
        return fail(f"--tensor {flags.get(exc.tensor, exc.tensor)}: {exc}")
    except (ValueError, FileNotFoundError, RuntimeError, onnx.checker.ValidationError) as exc:
        return fail(f"--tensor: {' '.join(str(exc).split())}")
    if not args.quiet:
        for r in records:
            where = "" if r.axis is None else f" along axis {r.axis}"
            print(f"{r.tensor}: {r.format}{where} ({r.reason}): {' -> '.join(r.nodes)}")
        print(f"wrote {args.output}")
    if args.summary_json:
        with open(args.summary_json, "w", encoding="utf-8") as f:
            json.dump({"tensors": [asdict(r) for r in records]}, f, indent=2)
    return 0
