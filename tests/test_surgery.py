"""Graph surgery by hand: make_node, opset_imports, insert_qdq, strip_qdq, --tensor.

The expected outputs are computed from the float graph, never from the quantized one: run
the float model with the tensor exposed, apply ``ort_mx_ops.reference`` to it, feed the
result downstream in place of the tensor (see ``expected_outputs``).
"""
from __future__ import annotations

import copy
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_mx_ops
from ort_mx_ops import reference
from ort_mx_ops.formats import FormatSpec
from ort_mx_ops.quantizer import cli, insert_qdq, quantize_model, strip_qdq
from ort_mx_ops.quantizer.surgery import TensorError, _graphs, parse_tensor_flag

from conftest import assert_bits_equal, native_and_reference
from test_quantizer_models import conv_model, feeds_for, matmul_model, two_consumer_model

F = TensorProto.FLOAT


# --------------------------------------------------------------------------------------
# The expectation, from the float graph
# --------------------------------------------------------------------------------------

def quantize_ref(x: np.ndarray, config: str, axis: int | None, flatten: bool = False,
                 cast: bool = False) -> np.ndarray:
    """What one node of ``config`` along ``axis`` computes, by the numpy reference."""
    spec = FormatSpec.from_name(config)
    if flatten:
        return quantize_ref(x.reshape(x.shape[0], -1), config, axis).reshape(x.shape)
    if spec.op == "BF16":
        if cast:
            return reference.bfloat16_bits_to_float32(reference.float32_to_bfloat16_bits(x))
        scale, zp = np.float32(1.0), np.zeros((), np.uint16)
        return reference.extended_dequantize_linear(
            reference.extended_quantize_linear(x, scale, zp), scale, zp)
    _, fn = native_and_reference(spec.op)
    return fn(x, **spec.node_attrs(axis))


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    # The same float kernels in both models: no fusion may change a rounding.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort_mx_ops.register(so)
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    sess = session(model)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})))


def expected_outputs(model: onnx.ModelProto, feeds: dict, quantized: dict) -> dict:
    """Graph outputs of float ``model`` with ``quantized[t](value of t)`` in place of each
    tensor t: tensors in the order they are defined; each is read from a run of the float
    graph with it exposed as an output, then becomes a graph input fed the reference's
    result."""
    m = copy.deepcopy(model)
    g = m.graph
    feeds = dict(feeds)
    producer = {o: i for i, n in enumerate(g.node) for o in n.output}
    for t in sorted(quantized, key=lambda t: producer.get(t, -1)):
        inits = {i.name: i for i in g.initializer}
        if t in feeds:
            value = feeds[t]
        elif t in inits:
            value = numpy_helper.to_array(inits[t])
            g.initializer.remove(inits[t])
        else:
            probe = copy.deepcopy(m)
            probe.graph.output.append(helper.make_tensor_value_info(t, F, None))
            value = run(probe, feeds)[t]
            node = g.node[producer[t]]
            node.output[list(node.output).index(t)] = t + "__float"
        feeds[t] = quantized[t](value)
        if t not in {i.name for i in g.input}:
            g.input.append(helper.make_tensor_value_info(t, F, None))
    rest = [o for o in g.output if o.name not in quantized]
    out = run(_with_outputs(m, rest), feeds) if rest else {}
    out.update({o.name: feeds[o.name] for o in g.output if o.name in quantized})
    return out


def _with_outputs(m: onnx.ModelProto, outputs) -> onnx.ModelProto:
    m = copy.deepcopy(m)
    del m.graph.output[:]
    m.graph.output.extend(outputs)
    return m


def assert_outputs_equal(actual: dict, expected: dict) -> None:
    assert set(actual) == set(expected)
    for name in expected:
        assert_bits_equal(actual[name], expected[name], name)


def ours(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain.startswith(("com.amd", "com.vai"))]


# --------------------------------------------------------------------------------------
# A model whose outer tensors are read inside an If and a Loop
# --------------------------------------------------------------------------------------

def subgraph_model() -> onnx.ModelProto:
    """r = Relu(x) (N, 8) is read only inside subgraphs: If(c) then r @ W else (r * 2) @ W,
    and a Loop of 3 iterations accumulating r @ W.  W is a main-graph initializer."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((8, 4)) * 2.0 ** rng.integers(-3, 3, (8, 1))).astype(np.float32)
    out = lambda name: helper.make_tensor_value_info(name, F, [None, 4])  # noqa: E731
    then_g = helper.make_graph([helper.make_node("MatMul", ["r", "W"], ["t_out"], name="then_mm")],
                               "then", [], [out("t_out")])
    else_g = helper.make_graph([
        helper.make_node("Mul", ["r", "two"], ["r2"], name="else_mul"),
        helper.make_node("MatMul", ["r2", "W"], ["e_out"], name="else_mm")],
        "else", [], [out("e_out")])
    body = helper.make_graph([
        helper.make_node("MatMul", ["r", "W"], ["b_mm"], name="body_mm"),
        helper.make_node("Add", ["acc_in", "b_mm"], ["acc_out"], name="body_add"),
        helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 out("acc_in")],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), out("acc_out")])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("If", ["c"], ["if_out"], name="if", then_branch=then_g,
                         else_branch=else_g),
        helper.make_node("Loop", ["trips", "", "acc0"], ["loop_out"], name="loop", body=body),
    ]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.float32(2), "two"),
             numpy_helper.from_array(np.array(3, np.int64), "trips"),
             numpy_helper.from_array(np.zeros((1, 4), np.float32), "acc0")]
    g = helper.make_graph(nodes, "sub", [helper.make_tensor_value_info("x", F, ["N", 8]),
                                         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("if_out", F, ["N", 4]),
                           helper.make_tensor_value_info("loop_out", F, [None, 4])], inits)
    m = helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m


def subgraph_feeds(cond: bool) -> dict:
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((3, 8)) * 2.0 ** rng.integers(-6, 6, (3, 8))).astype(np.float32)
    return {"x": x, "c": np.array(cond)}


def ocr_model() -> onnx.ModelProto:
    from ort_mx_ops.quantizer.demo import find_rapidocr_recognizer
    return onnx.load(find_rapidocr_recognizer())


# --------------------------------------------------------------------------------------
# make_node, opset_imports
# --------------------------------------------------------------------------------------

def test_make_node_block_format_matches_catalogue_and_runs():
    q = ort_mx_ops.make_node("MXFP8E4M3", "x", "y", axis=1, name="q")
    node = q.node
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert (node.op_type, node.domain, node.name) == ("MXQuantizeDequantize", "com.amd.quark", "q")
    assert attrs == {"axis": 1, "block_size": 32, "element_dtype": b"fp8_e4m3",
                     "rounding_mode": 2}
    assert q.initializers == [] and q.domains == {"com.amd.quark"}
    legacy = ort_mx_ops.make_node(FormatSpec.from_name("MX6"), "x", "y", axis=0,
                                  legacy_names=True).node
    assert (legacy.op_type, legacy.domain) == ("BFPFixNeuron", "com.vai.quantize")

    g = helper.make_graph(q.nodes, "g", [helper.make_tensor_value_info("x", F, [4, 64])],
                          [helper.make_tensor_value_info("y", F, [4, 64])], q.initializers)
    m = helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    assert ort_mx_ops.opset_imports(m) == ["com.amd.quark"]
    x = (np.random.default_rng(0).standard_normal((4, 64)) * 100).astype(np.float32)
    assert_bits_equal(run(m, {"x": x})["y"], quantize_ref(x, "MXFP8E4M3", 1), "make_node")


def test_make_node_bf16_fused():
    q = ort_mx_ops.make_node("bf16", "x", "y", name="b", bf16_fused=True)
    assert [(n.domain, n.op_type, n.name) for n in q.nodes] == \
        [("com.ort_mx_ops", "BF16QuantizeDequantize", "b")]
    assert list(q.node.input)[0] == "x" and len(q.initializers) == 2
    with pytest.raises(ValueError, match="choose one"):
        ort_mx_ops.make_node("bf16", "x", "y", bf16_fused=True, bf16_cast=True)


@pytest.mark.parametrize("cast", [False, True])
def test_make_node_bf16_pair_with_initializers(cast):
    q = ort_mx_ops.make_node("bf16", "x", "y", name="b", bf16_cast=cast)
    assert [n.op_type for n in q.nodes] == (["Cast", "Cast"] if cast else
                                            ["ExtendedQuantizeLinear", "ExtendedDequantizeLinear"])
    assert [n.name for n in q.nodes] == (["b_Cast_bf16", "b_Cast_float"] if cast else
                                         ["b_QuantizeLinear", "b_DequantizeLinear"])
    assert len(q.initializers) == (0 if cast else 2)
    with pytest.raises(ValueError, match="2 nodes"):
        q.node
    g = helper.make_graph(q.nodes, "g", [helper.make_tensor_value_info("x", F, [3, 5])],
                          [helper.make_tensor_value_info("y", F, [3, 5])], q.initializers)
    m = helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    ort_mx_ops.opset_imports(m)
    onnx.checker.check_model(m)
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    assert_bits_equal(run(m, {"x": x})["y"], quantize_ref(x, "BF16", None, cast=cast), "bf16")


def test_make_node_names_avoid_the_graph_and_axis_is_required():
    g = conv_model().graph
    g.initializer.append(numpy_helper.from_array(np.float32(1), "r1_bf16_scale"))
    q = ort_mx_ops.make_node("BF16", "r1", "r1_q", graph=g)
    assert q.initializers[0].name == "r1_bf16_scale_2"
    with pytest.raises(ValueError, match="pass axis="):
        ort_mx_ops.make_node("MX9", "x", "y")
    with pytest.raises(ValueError, match="unknown quantization config 'FP3'"):
        ort_mx_ops.make_node("FP3", "x", "y", axis=0)


def test_opset_imports_adds_and_drops_only_our_domains():
    m = conv_model()
    m.opset_import.append(helper.make_opsetid("com.vai.quantize", 1))
    m.opset_import.append(helper.make_opsetid("com.example", 3))
    assert ort_mx_ops.opset_imports(m) == []
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 17), ("com.example", 3)]


# --------------------------------------------------------------------------------------
# insert_qdq and strip_qdq
# --------------------------------------------------------------------------------------

CONV_REQUESTS = {"x": ("MXINT8", -3), "r1": "MXFP8E4M3", "w2": "MX9", "w3": ("MX6", 1),
                 "y": "BF16"}


def test_insert_qdq_conv_model_bit_identical_to_reference_and_input_untouched():
    m = conv_model()
    before = copy.deepcopy(m)
    q = insert_qdq(m, CONV_REQUESTS)
    assert m == before  # the caller's model is not modified
    onnx.checker.check_model(q)
    assert [o.name for o in q.graph.output] == ["y"] and [i.name for i in q.graph.input] == ["x"]
    assert {o.domain: o.version for o in q.opset_import} == {"": 17, "com.amd.quark": 1}
    kinds = [n.op_type for n in ours(q)]
    assert sorted(kinds) == sorted(["MXQuantizeDequantize", "MXQuantizeDequantize",
                                    "BFPQuantizeDequantize", "BFPQuantizeDequantize",
                                    "ExtendedQuantizeLinear", "ExtendedDequantizeLinear"])
    # Omitted axes come from the reader's handler: Conv's channel axis, and the depthwise
    # weight over its 9-element kernel window (the quantizer's Reshape pair).
    axes = {n.input[0]: helper.get_attribute_value(a) for n in ours(q) for a in n.attribute
            if a.name == "axis"}
    assert axes == {"x": 1, "r1": 1, "w2_flat": 1, "w3": 1}
    feeds = feeds_for("conv")
    expected = expected_outputs(m, feeds, {
        "x": lambda v: quantize_ref(v, "MXINT8", 1),
        "r1": lambda v: quantize_ref(v, "MXFP8E4M3", 1),
        "w2": lambda v: quantize_ref(v, "MX9", 1, flatten=True),
        "w3": lambda v: quantize_ref(v, "MX6", 1),
        "y": lambda v: quantize_ref(v, "BF16", None)})
    assert_outputs_equal(run(q, feeds), expected)
    # and not what the float model gives
    assert not np.array_equal(run(m, feeds)["y"], expected["y"])


def test_insert_qdq_matches_quantize_model_axes():
    """Without an axis, a tensor gets the axis quantize_model gives it (MatMul B, Gemm with
    transB, attention's dynamic contraction axis moved to a fixed one)."""
    m = matmul_model()
    summary = quantize_model(m, None, "MXINT8", fold_weights=False)
    by_tensor = {s.tensor: s.axis for s in summary.sites}
    q = insert_qdq(m, {t: "MXINT8" for t in by_tensor})
    axes = {n.input[0]: helper.get_attribute_value(a) for n in ours(q) for a in n.attribute
            if a.name == "axis"}
    assert axes == by_tensor and len(by_tensor) >= 5


def test_insert_qdq_graph_output_that_is_also_read():
    """r1 is a graph output and Conv conv2's input: both see the quantized tensor, and the
    output keeps its name."""
    m = conv_model()
    m.graph.output.append(helper.make_tensor_value_info("r1", F, None))
    q = insert_qdq(m, {"r1": "MXFP6E2M3"})
    assert [o.name for o in q.graph.output] == ["y", "r1"]
    node = ours(q)[0]
    assert (list(node.input), list(node.output)) == (["r1_float"], ["r1"])
    assert next(n for n in q.graph.node if n.name == "relu1").output[0] == "r1_float"
    assert next(n for n in q.graph.node if n.name == "conv2").input[0] == "r1"
    feeds = feeds_for("conv", 1)
    expected = expected_outputs(m, feeds, {"r1": lambda v: quantize_ref(v, "MXFP6E2M3", 1)})
    assert_outputs_equal(run(q, feeds), expected)
    assert strip_qdq(q) == m


def test_insert_then_strip_gives_the_original_graph():
    m = conv_model()
    for legacy, cast in [(False, False), (True, True)]:
        q = insert_qdq(m, CONV_REQUESTS, legacy_names=legacy, bf16_cast=cast)
        assert q != m
        assert strip_qdq(q) == m
    # two readers, one a graph output's producer: every reader rewired, then back
    two = two_consumer_model()
    q = insert_qdq(two, {"a": ("MX6", 0), "W1": "BFP16", "y3": "MXFP6E2M3"})
    assert [o.name for o in q.graph.output] == ["y1", "y2", "y3"]
    assert strip_qdq(q) == two


@pytest.mark.parametrize("config,options", [
    ("MX6", {}), ("BF16", {}), ("MXINT8", {"legacy_names": True, "quantize_all_op_types": True}),
    ("BF16", {"bf16_qdq_to_cast": True, "bf16_weight_scaled": True}),
    ("BF16", {"bf16_qdq_fused": True})])
def test_strip_qdq_undoes_quantize_model_runtime_nodes(config, options):
    for build in (conv_model, matmul_model, two_consumer_model):
        m = build()
        q = quantize_model(m, None, config, fold_weights=False, **options).model
        assert len(q.graph.node) > len(m.graph.node)
        assert strip_qdq(q) == m, build.__name__


def test_insert_qdq_subgraph_readers_if_and_loop():
    m = subgraph_model()
    before = copy.deepcopy(m)
    q = insert_qdq(m, {"r": "MXFP8E4M3", "W": ("MX6", 0), "if_out": "BF16"})
    assert m == before
    onnx.checker.check_model(q)
    branches = {a.name: a.g for n in q.graph.node for a in n.attribute if a.type == a.GRAPH}
    assert [list(n.input) for n in branches["then_branch"].node] == [["r_MXFP8E4M3", "W_MX6"]]
    assert list(branches["body"].node[0].input) == ["r_MXFP8E4M3", "W_MX6"]
    # r is read only inside the subgraphs: the MatMul's handler chose its last axis
    r_node = next(n for n in ours(q) if n.input[0] == "r")
    assert {a.name: a.i for a in r_node.attribute}["axis"] == 1
    assert [o.name for o in q.graph.output] == ["if_out", "loop_out"]
    for cond in (True, False):
        feeds = subgraph_feeds(cond)
        expected = expected_outputs(m, feeds, {
            "r": lambda v: quantize_ref(v, "MXFP8E4M3", 1),
            "W": lambda v: quantize_ref(v, "MX6", 0),
            "if_out": lambda v: quantize_ref(v, "BF16", None)})
        assert_outputs_equal(run(q, feeds), expected)
    assert strip_qdq(q) == m


def test_strip_qdq_inside_subgraphs_and_graph_input_outputs():
    """Nodes of ours inside a subgraph go too; a graph output computed straight from a graph
    input keeps its name through an Identity."""
    m = subgraph_model()
    then_g = next(a.g for a in m.graph.node[1].attribute if a.name == "then_branch")
    q = ort_mx_ops.make_node("MXINT8", "r", "r_q", axis=1)
    then_g.node.insert(0, q.node)
    then_g.node[1].input[0] = "r_q"
    direct = ort_mx_ops.make_node("MX9", "x", "x_out", axis=1)
    m.graph.node.insert(0, direct.node)
    m.graph.output.append(helper.make_tensor_value_info("x_out", F, None))
    ort_mx_ops.opset_imports(m)
    s = strip_qdq(m)
    assert not any(n.domain for g in _graphs(s.graph) for n in g.node)
    then_s = next(a.g for a in s.graph.node[2].attribute if a.name == "then_branch")
    assert [list(n.input) for n in then_s.node] == [["r", "W"]]
    assert [(n.op_type, list(n.input), list(n.output)) for n in s.graph.node[:1]] == \
        [("Identity", ["x"], ["x_out"])]
    assert [o.domain for o in s.opset_import] == [""]
    feeds = subgraph_feeds(True)
    assert_bits_equal(run(s, feeds)["x_out"], feeds["x"], "identity")


def test_ocr_model_insert_strip_and_reference():
    m = ocr_model()
    g = m.graph
    conv = [n for n in g.node if n.op_type == "Conv"]
    matmul = next(n for n in g.node if n.op_type == "MatMul")
    act, weight = conv[3].input[0], conv[5].input[1]
    out = g.output[0].name
    requests = {act: "MXFP8E4M3", weight: ("MX6", 0), matmul.input[0]: "MXINT8", out: "BF16"}
    before = copy.deepcopy(m)
    q = insert_qdq(m, requests)
    assert m == before
    onnx.checker.check_model(q)
    assert len(ours(q)) == 5 and g.output[0].name == q.graph.output[0].name
    assert strip_qdq(q) == m
    # the activation along Conv's channel axis, the MatMul input along its last axis (rank 3,
    # known to symbolic shape inference: 2), as quantize_model places them
    axes = {n.input[0]: helper.get_attribute_value(a) for n in ours(q) for a in n.attribute
            if a.name == "axis"}
    assert axes == {act: 1, weight: 0, matmul.input[0]: 2}
    sites = quantize_model(m, None, "MXINT8", fold_weights=False).sites
    assert {s.tensor: s.axis for s in sites if s.tensor in (act, matmul.input[0])} == \
        {act: 1, matmul.input[0]: 2}
    x = np.random.default_rng(7).random((1, 3, 48, 320), dtype=np.float32)
    expected = expected_outputs(m, {"x": x}, {
        act: lambda v: quantize_ref(v, "MXFP8E4M3", 1),
        weight: lambda v: quantize_ref(v, "MX6", 0),
        matmul.input[0]: lambda v: quantize_ref(v, "MXINT8", v.ndim - 1),
        out: lambda v: quantize_ref(v, "BF16", None)})
    assert_outputs_equal(run(q, {"x": x}), expected)
    # every runtime node of a whole-model quantization (hundreds of them) comes out again
    everything = quantize_model(m, None, "MXINT8", fold_weights=False,
                                quantize_all_op_types=True).model
    assert len(everything.graph.node) > len(g.node) + 300
    assert strip_qdq(everything) == m


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("requests,message", [
    ({"nope": "MX6"}, "'nope': no such tensor in the main graph"),
    ({"r": ("MX6", 2)}, "'r': axis 2 is out of range for its rank 2"),
    ({"r": ("MX6", -3)}, "'r': axis -3 is out of range"),
    ({"c": "MX6"}, "'c': it is BOOL, not a float tensor"),
    ({"trips": "MXINT8"}, "'trips': it is INT64, not a float tensor"),
    ({"r": "FP3"}, "'r': unknown quantization config 'FP3'"),
    ({"r": ("MX6", 1.5)}, "'r': axis must be an int"),
    ({"r": ("MX6", 1, 2)}, "'r': expected a format or"),
])
def test_insert_qdq_errors_name_the_tensor(requests, message):
    with pytest.raises(ValueError, match=message) as info:
        insert_qdq(subgraph_model(), requests)
    assert info.value.tensor == next(iter(requests))


def test_insert_qdq_refuses_a_tensor_that_already_carries_a_node():
    q = insert_qdq(conv_model(), {"r1": "MX6", "y": "BF16"})
    for tensor, node in [("r1", "BFPQuantizeDequantize"), ("r1_MX6", "BFPQuantizeDequantize"),
                         ("y_float", "ExtendedQuantizeLinear")]:
        with pytest.raises(TensorError, match=f"'{tensor}': it already carries a node of ours "
                                              f"\\({node}"):
            insert_qdq(q, {tensor: "MXINT8"})


def test_strip_qdq_refuses_a_lone_dequantize():
    m = conv_model()
    zp = helper.make_tensor("zp", TensorProto.BFLOAT16, [], [0])
    m.graph.initializer.extend([zp, numpy_helper.from_array(np.float32(1), "s"),
                                helper.make_tensor("w_bf16", TensorProto.BFLOAT16, [1], [0])])
    m.graph.node.insert(0, helper.make_node("ExtendedDequantizeLinear", ["w_bf16", "s", "zp"],
                                            ["w_f"], domain="com.amd.quark", name="dq"))
    with pytest.raises(ValueError, match="'dq' reads 'w_bf16', which no ExtendedQuantizeLinear"):
        strip_qdq(m)


# --------------------------------------------------------------------------------------
# ort-mx-quantize --tensor
# --------------------------------------------------------------------------------------

def test_cli_tensor_flags(tmp_path, capsys):
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    m = conv_model()
    onnx.save(m, str(src))
    rc = cli.main([str(src), str(dst), "--tensor", "r1=MXFP8E4M3", "--tensor", "w3=MX9:axis=1",
                   "--tensor", "y=bf16", "--summary-json", str(tmp_path / "s.json")])
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "r1: MXFP8E4M3 along axis 1 (Conv channel axis): MXQuantizeDequantize",
        "w3: MX9 along axis 1 (axis given): BFPQuantizeDequantize",
        "y: BF16 (BF16 has no blocks): ExtendedQuantizeLinear -> ExtendedDequantizeLinear",
        f"wrote {dst}"]
    q = onnx.load(str(dst))
    assert len(ours(q)) == 4  # only the named tensors: no automatic placement
    assert strip_qdq(q) == m
    assert [t["tensor"] for t in json.loads((tmp_path / "s.json").read_text())["tensors"]] == \
        ["r1", "w3", "y"]
    feeds = feeds_for("conv", 3)
    expected = expected_outputs(m, feeds, {
        "r1": lambda v: quantize_ref(v, "MXFP8E4M3", 1),
        "w3": lambda v: quantize_ref(v, "MX9", 1),
        "y": lambda v: quantize_ref(v, "BF16", None)})
    assert_outputs_equal(run(q, feeds), expected)


@pytest.mark.parametrize("flags,message", [
    (["--tensor", "r1"], "--tensor r1: expected NAME=CONFIG or NAME=CONFIG:axis=N"),
    (["--tensor", "r1=FP3"], "--tensor r1=FP3: tensor 'r1': unknown quantization config 'FP3'"),
    (["--tensor", "nope=MX6"], "--tensor nope=MX6: tensor 'nope': no such tensor"),
    (["--tensor", "r1=MX6:axis=4"], "--tensor r1=MX6:axis=4: tensor 'r1': axis 4 is out of "
                                    "range for its rank 4"),
    (["--tensor", "r1=MX6", "--tensor", "r1=MX9"], "--tensor r1=MX9: tensor 'r1' is already "
                                                   "given by --tensor r1=MX6"),
    (["--tensor", "r1=MX6", "--config", "MX6"], "--tensor places nodes on the named tensors "
                                                "only; it does not combine with --config"),
])
def test_cli_tensor_errors_one_line_exit_2(tmp_path, capsys, flags, message):
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(conv_model(), str(src))
    assert cli.main([str(src), str(dst), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ort-mx-quantize: error: {message}"), err
    assert not dst.exists()


def test_cli_tensor_never_writes_over_its_input_and_needs_a_mode(tmp_path, capsys):
    src = tmp_path / "f.onnx"
    onnx.save(conv_model(), str(src))
    data = src.read_bytes()
    assert cli.main([str(src), str(src), "--tensor", "r1=MX6"]) == 2
    assert capsys.readouterr().err.startswith(
        "ort-mx-quantize: error: --tensor: refusing to write over the input")
    assert src.read_bytes() == data
    assert cli.main([str(tmp_path / "missing.onnx"), str(tmp_path / "q.onnx"),
                     "--tensor", "r1=MX6"]) == 2
    assert capsys.readouterr().err.startswith("ort-mx-quantize: error: --tensor: model file "
                                              "not found")
    with pytest.raises(SystemExit) as info:
        cli.main([str(src), str(tmp_path / "q.onnx")])
    assert info.value.code == 2
    assert "--config (or --tensor)" in capsys.readouterr().err


def test_parse_tensor_flag_names_with_colons_and_equals():
    assert parse_tensor_flag("input:0=MX9:axis=-1") == ("input:0", "MX9", -1)
    assert parse_tensor_flag("a=b=MXINT8") == ("a=b", "MXINT8", None)


# --------------------------------------------------------------------------------------
# The README's example
# --------------------------------------------------------------------------------------

def test_readme_dropping_nodes_by_hand_example_prints_what_it_says(capsys):
    import pathlib
    import re
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("\n## Dropping nodes by hand\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shown = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    assert capsys.readouterr().out == shown
