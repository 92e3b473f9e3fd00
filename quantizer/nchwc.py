"""Opt-in: a quantized model pre-optimised by onnxruntime for *this* CPU, with our
quantize-dequantize nodes working inside onnxruntime's blocked NCHWc layout.

Why: onnxruntime's CPU provider runs chains of convolutions in a blocked layout (NCHWc: the
channels split into blocks of B = 8 with AVX2, 16 with AVX-512, stored innermost).  A custom
node between two convolutions breaks the chain, and onnxruntime inserts a ``ReorderOutput``
(NCHWc -> NCHW) before it and a ``ReorderInput`` (NCHW -> NCHWc) after it: two extra passes
over the tensor.

What: onnxruntime optimises the model (``ORT_ENABLE_ALL``, our ops registered) and saves the
optimised graph; then every ``ReorderOutput -> our op -> ReorderInput`` chain whose op can work
on the blocked data directly loses both conversions:

* BFP / MX nodes blocked along the channel axis, with a ``block_size`` that is a multiple of
  B or divides it: the node gets the attribute ``nchwc_block = B`` (docs/formats.md, "NCHWc
  layout") and reads the blocked tensor itself, memory ``[N, C/B, H, W, B]``: each block is
  the same ``block_size`` consecutive channels of one pixel as in the plain layout, gathered
  from ``block_size / B`` channel groups (or, where ``block_size`` divides B, ``block_size``
  consecutive floats of one group).  Where the channel count is not a multiple of B,
  onnxruntime's blocked tensor has padding channels up to the next multiple; the node then
  also gets ``nchwc_channels`` = the real count, ignores the padding and writes 0 there (what
  onnxruntime's ``ReorderInput`` writes).
* BF16 (``ExtendedQuantizeLinear -> ExtendedDequantizeLinear``, or our one-node
  ``BF16QuantizeDequantize``) with a per-tensor scale and zero point: elementwise, runs on the
  blocked tensor as it is.

* A BFP / MX node whose input is written by a ``Div`` by a whole-number scalar that nothing
  else reads takes that Div's input and ``input_divisor`` (docs/formats.md, "A divisor
  before the blocks"): it divides each element as the Div did, then quantizes, one pass over
  the tensor where there were two.
* Then a BFP / MX node whose input is hard-swish's numerator ``Mul(x, Clip(Add(x, 3), 0,
  6))``, its three tensors read by nothing else, takes ``x`` and ``input_hardswish``
  (docs/formats.md, "Hard-swish before the blocks"): three nodes fewer.

Every quantized value is computed from the same block of the same values in the same order,
so the outputs are bit-identical to the same quantized model run normally (the tests check it).
The result is hardware-specific (onnxruntime warns the same of any model saved with its layout
optimisations): it must run on a machine with the same NCHWc block, with onnxruntime's graph
optimisations disabled (``ORT_DISABLE_ALL``; :func:`session_options` does that), with a
version of this library that knows ``nchwc_block``, on the CPU execution provider (the GPU
kernels refuse the attribute); the model's metadata records the onnxruntime version and B it
was made for.  :func:`inference_session` makes it in memory where the model runs, so the
file shipped stays the portable quantized model.  Nodes of ours that keep their conversions,
with why, are listed in the report: a ``block_size`` that is neither a multiple nor a divisor
of B, BF16 nodes on channel counts that are not multiples of B, a node read outside the
layout.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ort_mx_ops.formats import (BLOCK_OPS, LEGACY_DOMAIN, MAX_INPUT_DIVISOR, PRODUCT_DOMAIN,
                                QUARK_DOMAIN)

__all__ = ["NchwcReport", "nchwc_block_size", "optimize_nchwc", "inference_session",
           "session_options", "main", "METADATA_KEY", "parse_shapes"]

METADATA_KEY = "ort_mx_ops.onnxruntime_optimized"
_NCHWC_DOMAIN = "com.microsoft.nchwc"
_OUR_DOMAINS = (QUARK_DOMAIN, LEGACY_DOMAIN, PRODUCT_DOMAIN)
# Elementwise BF16 nodes (per-tensor scale and zero point): the pair's first node, or ours.
_BF16_OPS = {"ExtendedQuantizeLinear", "BF16QuantizeDequantize"}


@dataclass
class NchwcReport:
    """What :func:`optimize_nchwc` did: the NCHWc block, the chains rewritten (conversions
    removed), and the nodes of ours left with conversions around them, with why."""
    block: int
    rewritten: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    reorders_before: int = 0
    reorders_after: int = 0
    # Div nodes whose division our node after them now does (input_divisor)
    divisions_fused: list[str] = field(default_factory=list)
    # Add -> Clip -> Mul chains (hard-swish's numerator) our node now computes (input_hardswish)
    hardswish_fused: list[str] = field(default_factory=list)


def _ort():
    import onnxruntime as ort
    return ort


def session_options(threads: int = 0):
    """SessionOptions for a model written by :func:`optimize_nchwc`: our ops registered and
    onnxruntime's graph optimisations off (the model is optimised already)."""
    import ort_mx_ops
    ort = _ort()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        so.intra_op_num_threads = threads
    ort_mx_ops.register(so)
    return so


def parse_shapes(items: list[str], flag: str = "--shape") -> dict[str, list[int]]:
    """``["x=1x3x48x192", ...]`` -> ``{"x": [1, 3, 48, 192]}``; ``ValueError`` naming
    ``flag`` for anything else."""
    shapes = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            raise ValueError(f"{flag} wants NAME=D0xD1x..., got {item!r}") from None
    return shapes


def _optimized_by_ort(model_path: str, out_path: str) -> onnx.ModelProto:
    import ort_mx_ops
    ort = _ort()
    so = ort.SessionOptions()
    so.log_severity_level = 3  # the "hardware specific" warning is what we ask for
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = out_path
    ort_mx_ops.register(so)
    ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    return onnx.load(out_path)


def nchwc_block_size() -> int:
    """onnxruntime's NCHWc channel block on this CPU (0 where it does not use the layout),
    read from how it lays out a 4-channel convolution's weight: padded to one block."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    # IR 8: an onnx newer than the installed onnxruntime would write an IR version it rejects
    model = helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "probe.onnx"), os.path.join(tmp, "probe_opt.onnx")
        onnx.save(model, src)
        opt = _optimized_by_ort(src, dst)
    inits = {i.name: i for i in opt.graph.initializer}
    for n in opt.graph.node:
        if n.domain == _NCHWC_DOMAIN and n.op_type == "Conv":
            return int(inits[n.input[1]].dims[0])
    return 0


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _is_scalar(g: onnx.GraphProto, name: str) -> bool:
    """Whether ``name`` is an initializer holding one value (a per-tensor scale)."""
    for t in g.initializer:
        if t.name == name:
            return int(np.prod(t.dims)) == 1
    return False


def _fix_inputs(model: onnx.ModelProto, input_shapes: dict[str, list[int]]) -> None:
    """Give the graph inputs named in ``input_shapes`` those fixed dimensions."""
    inputs = {i.name: i for i in model.graph.input}
    for name, shape in input_shapes.items():
        if name not in inputs:
            raise ValueError(f"the model has no input {name!r} (inputs: {sorted(inputs)})")
        dims = inputs[name].type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise ValueError(f"input {name!r} has rank {len(dims)}, shape given {shape}")
        for d, v in zip(dims, shape):
            if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != v:
                raise ValueError(f"input {name!r} has fixed shape; {shape} does not match it")
            d.dim_value = int(v)


def _graph_index(g: onnx.GraphProto) -> tuple[dict[str, onnx.NodeProto],
                                               dict[str, list[onnx.NodeProto]], set[str]]:
    """(the node writing each tensor, the nodes reading each tensor, the graph's outputs)."""
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
    return producer, consumers, {o.name for o in g.output}


def _rewrite(model: onnx.ModelProto, block: int) -> NchwcReport:
    g = model.graph
    report = NchwcReport(block=block)
    producer, consumers, outputs = _graph_index(g)
    report.reorders_before = sum(n.op_type in ("ReorderInput", "ReorderOutput")
                                 and n.domain == _NCHWC_DOMAIN for n in g.node)
    replace: dict[int, list[onnx.NodeProto]] = {}
    drop: set[int] = set()

    def sole_consumer(name: str) -> Optional[onnx.NodeProto]:
        c = consumers.get(name, [])
        return c[0] if len(c) == 1 and name not in outputs else None

    for node in g.node:
        if node.domain not in _OUR_DOMAINS or node.op_type not in BLOCK_OPS | _BF16_OPS:
            continue
        ro = producer.get(node.input[0])
        if ro is None or ro.op_type != "ReorderOutput" or ro.domain != _NCHWC_DOMAIN:
            continue  # its input is not a blocked tensor: nothing to gain
        label = f"{node.op_type} {node.name!r}"
        ro_attrs = _attrs(ro)
        chain = [node]
        if node.op_type in _BF16_OPS:
            if not all(_is_scalar(g, name) for name in node.input[1:]):
                report.kept.append(f"{label}: scale or zero point is not one value")
                continue
        if node.op_type == "ExtendedQuantizeLinear":
            dq = sole_consumer(node.output[0])
            if dq is None or dq.op_type != "ExtendedDequantizeLinear":
                report.kept.append(f"{label}: not followed by its dequantize node alone")
                continue
            chain.append(dq)
        ri = sole_consumer(chain[-1].output[0])
        if ri is None or ri.op_type != "ReorderInput" or ri.domain != _NCHWC_DOMAIN:
            report.kept.append(f"{label}: its output is read outside the blocked layout")
            continue
        if ro_attrs.get("channels_last", 0) or _attrs(ri).get("channels_last", 0):
            report.kept.append(f"{label}: channels-last conversion")
            continue
        channels = int(ro_attrs.get("channels", 0))
        if channels <= 0 or (channels % block and node.op_type in _BF16_OPS):
            # (a BF16 node would turn the padding channels into values other than 0)
            report.kept.append(f"{label}: {channels} channels, not a multiple of the NCHWc "
                               f"block {block}")
            continue
        x = ro.input[0]
        if node.op_type in _BF16_OPS:
            new = []
            for k, n in enumerate(chain):
                copy = onnx.NodeProto()
                copy.CopyFrom(n)
                if k == 0:
                    copy.input[0] = x
                if k == len(chain) - 1:
                    copy.output[0] = ri.output[0]
                new.append(copy)
        else:
            a = _attrs(node)
            axis, bs = int(a.get("axis", 1)), int(a.get("block_size", 0))
            sub = int(a.get("sub_block_size", 2))
            prime = a.get("bfp_method", b"to_bfp") in (b"to_bfp_prime", b"to_bfp_prime_shared")
            if axis not in (1, -3):
                report.kept.append(f"{label}: blocked along axis {axis}, not the channels")
                continue
            if int(a.get("nchwc_block", 0)):
                report.kept.append(f"{label}: has nchwc_block already")
                continue
            if bs <= 0 or (bs % block and block % bs):
                report.kept.append(f"{label}: block_size {bs} is neither a multiple nor a "
                                   f"divisor of the NCHWc block {block}")
                continue
            if prime and bs > block and sub % block and block % sub:
                report.kept.append(f"{label}: sub_block_size {sub} straddles NCHWc blocks "
                                   f"of {block}")
                continue
            a["axis"] = 1
            a["nchwc_block"] = block
            if channels % block:
                # onnxruntime's blocked tensor has padding channels past these. Also for blocks
                # of at most B (BFP16 and MX9 with B = 16), where the padding fills whole or
                # half blocks: all-zero blocks take the fast form (45b8927), and on the
                # classifier's 8- and 24-channel nodes this measured no slower than keeping
                # the conversions (docs/speed-log.md, "Padding channels in blocks of at most B").
                a["nchwc_channels"] = channels
            new = [helper.make_node(node.op_type, [x], [ri.output[0]], domain=node.domain,
                                    name=node.name, **a)]
        replace[id(chain[0])] = new
        drop.update(id(n) for n in chain[1:])
        drop.add(id(ri))
        if len(consumers[ro.output[0]]) == 1 and ro.output[0] not in outputs:
            drop.add(id(ro))
        report.rewritten.append(label)
    nodes: list[onnx.NodeProto] = []
    for n in g.node:
        if id(n) in replace:
            nodes.extend(replace[id(n)])
        elif id(n) not in drop:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    report.reorders_after = sum(n.op_type in ("ReorderInput", "ReorderOutput")
                                and n.domain == _NCHWC_DOMAIN for n in g.node)
    return report


def _is_standard(node: Optional[onnx.NodeProto], op_type: str) -> bool:
    """Whether ``node`` is an ONNX-domain node of ``op_type``."""
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def _read_once(name: str, consumers: dict[str, list[onnx.NodeProto]], outputs: set[str]) -> bool:
    """Whether tensor ``name`` is read by one node and is not a graph output."""
    return len(consumers[name]) == 1 and name not in outputs


def _drop_nodes(g: onnx.GraphProto, drop: set[int]) -> None:
    """Remove the nodes whose ``id`` is in ``drop``, keeping the others' order."""
    kept = [n for n in g.node if id(n) not in drop]
    del g.node[:]
    g.node.extend(kept)


def _integer_divisor(g: onnx.GraphProto, name: str) -> int:
    """The divisor a Div by ``name`` stands for as our ``input_divisor``: the integer value
    (1 .. 2^24, exact in float32) of a rank-0 float32 initializer, else 0."""
    for t in g.initializer:
        if t.name == name:
            if t.data_type != onnx.TensorProto.FLOAT or len(t.dims) != 0:
                return 0
            v = float(numpy_helper.to_array(t))
            return int(v) if v.is_integer() and 1 <= v <= MAX_INPUT_DIVISOR else 0
    return 0


def _fuse_divisions(model: onnx.ModelProto, report: NchwcReport) -> None:
    """Every BFP / MX node of ours whose input is written by a ``Div`` by a whole-number
    scalar, read by nothing else, takes the Div's input and the attribute ``input_divisor``
    (docs/formats.md, "A divisor before the blocks"): the node divides each element as that
    Div did, correctly rounded, then quantizes, so the outputs keep every bit and the model
    loses one pass over the tensor (hard-swish's ``x * relu6(x + 3) / 6`` ends in such a Div
    in models exported from some frameworks)."""
    g = model.graph
    producer, consumers, outputs = _graph_index(g)
    drop: set[int] = set()
    for node in g.node:
        if node.domain not in _OUR_DOMAINS or node.op_type not in BLOCK_OPS:
            continue
        div = producer.get(node.input[0])
        if not _is_standard(div, "Div") or not _read_once(div.output[0], consumers, outputs):
            continue
        if int(_attrs(node).get("input_divisor", 0)):
            continue
        divisor = _integer_divisor(g, div.input[1])
        if not divisor:
            continue
        node.input[0] = div.input[0]
        node.attribute.append(helper.make_attribute("input_divisor", divisor))
        drop.add(id(div))
        report.divisions_fused.append(f"{node.op_type} {node.name!r}: Div {div.name!r} by "
                                      f"{divisor}")
    _drop_nodes(g, drop)


def _float32_constant(g: onnx.GraphProto, name: str) -> Optional[np.ndarray]:
    """The value of ``name`` where it is a float32 initializer of rank 0 or one element of
    rank 1, else None."""
    for t in g.initializer:
        if t.name == name:
            if t.data_type != onnx.TensorProto.FLOAT or len(t.dims) > 1 or int(np.prod(t.dims)) != 1:
                return None
            return numpy_helper.to_array(t).reshape(())
    return None


def _is_exactly(v: Optional[np.ndarray], value: float) -> bool:
    """Whether float32 ``v`` has exactly the bits of ``value`` (so 0 means +0, not -0)."""
    return v is not None and np.float32(v).tobytes() == np.float32(value).tobytes()


def _clip_bounds(g: onnx.GraphProto, clip: onnx.NodeProto) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """A Clip node's (min, max) as float32 scalars: its constant inputs (opset 11 on) or
    its attributes (before), None where either is missing or not a constant."""
    if len(clip.input) >= 3 and clip.input[1] and clip.input[2]:
        lo, hi = _float32_constant(g, clip.input[1]), _float32_constant(g, clip.input[2])
        return None if lo is None or hi is None else (lo, hi)
    a = _attrs(clip)
    if len(clip.input) == 1 and "min" in a and "max" in a:
        return np.float32(a["min"]), np.float32(a["max"])
    return None


def _fuse_hardswish(model: onnx.ModelProto, report: NchwcReport) -> None:
    """Every BFP / MX node of ours whose input is ``Mul(x, Clip(Add(x, 3), 0, 6))`` (either
    operand order; hard-swish's numerator, which ``_fuse_divisions`` leaves before a node that
    took the ``/ 6``), each intermediate tensor read by nothing else, takes ``x`` and the
    attribute ``input_hardswish`` (docs/formats.md, "Hard-swish before the blocks"): the node
    computes the three steps as those nodes did, float32 rounding at each, then quantizes, so
    the outputs keep every bit and the model loses three nodes and their passes over the
    tensor. The constants must be float32 3, +0 and 6 exactly."""
    g = model.graph
    producer, consumers, outputs = _graph_index(g)

    def private(name: str) -> bool:
        return _read_once(name, consumers, outputs)

    drop: set[int] = set()
    for node in g.node:
        if node.domain not in _OUR_DOMAINS or node.op_type not in BLOCK_OPS:
            continue
        if int(_attrs(node).get("input_hardswish", 0)):
            continue
        mul = producer.get(node.input[0])
        if not _is_standard(mul, "Mul") or not private(mul.output[0]) or len(mul.input) != 2:
            continue
        for x, c in ((mul.input[0], mul.input[1]), (mul.input[1], mul.input[0])):
            clip = producer.get(c)
            if not _is_standard(clip, "Clip") or not private(c):
                continue
            bounds = _clip_bounds(g, clip)
            if bounds is None or not (_is_exactly(bounds[0], 0.0) and _is_exactly(bounds[1], 6.0)):
                continue
            add = producer.get(clip.input[0])
            if not _is_standard(add, "Add") or not private(add.output[0]) or len(add.input) != 2:
                continue
            others = [i for i in add.input if i != x]
            if len(others) != 1 or not _is_exactly(_float32_constant(g, others[0]), 3.0):
                continue
            node.input[0] = x
            node.attribute.append(helper.make_attribute("input_hardswish", 1))
            drop.update((id(mul), id(clip), id(add)))
            report.hardswish_fused.append(f"{node.op_type} {node.name!r}: Add {add.name!r}, "
                                          f"Clip {clip.name!r}, Mul {mul.name!r}")
            break
    _drop_nodes(g, drop)


def _optimized_model(model_path: str, input_shapes: Optional[dict[str, list[int]]]
                     ) -> tuple[onnx.ModelProto, NchwcReport]:
    """``model_path`` optimised by onnxruntime for this CPU and rewritten (in memory), and the
    report; the input file is only read."""
    if not os.path.isfile(model_path):
        raise FileNotFoundError(f"model file not found: {model_path}")
    ort = _ort()
    block = nchwc_block_size()
    with tempfile.TemporaryDirectory() as tmp:
        model = _optimized_by_ort(model_path, os.path.join(tmp, "optimized.onnx"))
    if input_shapes:
        _fix_inputs(model, input_shapes)
    report = _rewrite(model, block) if block else NchwcReport(block=0)
    if not block:
        report.kept.append("onnxruntime does not use the NCHWc layout on this CPU")
    _fuse_divisions(model, report)
    _fuse_hardswish(model, report)
    meta = {p.key: p for p in model.metadata_props}
    value = f"onnxruntime {ort.__version__}; NCHWc block {block}"
    if METADATA_KEY in meta:
        meta[METADATA_KEY].value = value
    else:
        model.metadata_props.append(onnx.StringStringEntryProto(key=METADATA_KEY, value=value))
    return model, report


def optimize_nchwc(model_path: str, output_path: str,
                   input_shapes: Optional[dict[str, list[int]]] = None) -> NchwcReport:
    """Write ``output_path``: ``model_path`` (a quantized model) optimised by onnxruntime for
    this CPU, with our nodes moved into the NCHWc layout where that keeps every output bit
    (see the module documentation).  Run it with :func:`session_options`.

    ``input_shapes`` (name -> dims) fixes those inputs' shapes in the output model (other
    shapes are then refused by onnxruntime).  Raises ``ValueError`` when input and output are
    the same file or a shape does not fit the model, and refuses (``ValueError`` /
    ``FileNotFoundError``) to write over the input model or its data files, or into a missing
    directory."""
    if not os.path.isfile(model_path):
        raise FileNotFoundError(f"model file not found: {model_path}")
    from .quantize import check_output
    check_output(model_path, output_path)
    model, report = _optimized_model(model_path, input_shapes)
    # onnxruntime's optimised graph holds its internal ops (fused kernels, LayerNormalization
    # at any opset), which onnx.checker rejects: write it as onnxruntime saved it, atomically.
    directory = os.path.dirname(os.path.abspath(output_path))
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".onnx", delete=False) as tmp:
        tmp_path = tmp.name
    try:
        onnx.save(model, tmp_path)
        os.replace(tmp_path, output_path)
    finally:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
    return report


def inference_session(model_path: str, input_shapes: Optional[dict[str, list[int]]] = None,
                      threads: int = 0) -> tuple["onnxruntime.InferenceSession", NchwcReport]:
    """A CPU ``onnxruntime.InferenceSession`` of ``model_path`` (a quantized model, portable)
    with our nodes inside onnxruntime's NCHWc layout, made on the machine that runs it, and
    the :class:`NchwcReport`: ``(session, report)``.

    The same optimisation as :func:`optimize_nchwc`, in memory at load time, so the model
    file stays portable and nothing is written; the outputs are bit-identical to a plain
    session of the same model.  ``threads`` sets the intra-op threads (0: onnxruntime's
    default); ``input_shapes`` as in :func:`optimize_nchwc`.  Raises ``FileNotFoundError``
    for a missing model and ``ValueError`` for a shape that does not fit it.  The optimised
    model passes to onnxruntime as one serialised message, so it must stay under 2 GiB."""
    model, report = _optimized_model(model_path, input_shapes)
    session = _ort().InferenceSession(model.SerializeToString(), session_options(threads),
                                      providers=["CPUExecutionProvider"])
    return session, report


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ort_mx_ops.quantizer.nchwc",
        description="Pre-optimise a quantized model for this CPU with our nodes inside "
                    "onnxruntime's NCHWc layout (bit-identical outputs; hardware-specific; "
                    "run it with graph optimisations disabled).")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--shape", action="append", default=[],
                   help="NAME=1x3x48x192: fix an input's shape (repeatable)")
    args = p.parse_args(argv)
    try:
        r = optimize_nchwc(args.input, args.output, parse_shapes(args.shape) or None)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"NCHWc block {r.block}: {len(r.rewritten)} of our nodes moved into the blocked "
          f"layout; layout conversions {r.reorders_before} -> {r.reorders_after}; "
          f"{len(r.kept)} kept their conversions; {len(r.divisions_fused)} Div nodes and "
          f"{len(r.hardswish_fused)} hard-swish numerators (Add, Clip, Mul) taken into the "
          "node after them")
    for k in r.kept:
        print(f"  kept: {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
