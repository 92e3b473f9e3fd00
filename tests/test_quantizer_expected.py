"""The quantizer against expectations written by hand, not read back from its output.

Each case is a small float model, the axis every quantized tensor must be blocked along
(stated here, per op type and layout), and the positions (node, input) that read the
quantized values.  The oracle runs the *float* model node by node with ``onnx.reference``,
applying ``ort_mx_ops.reference`` to exactly those inputs along exactly those axes; the
quantized model must agree with it in onnxruntime, and folded weights must equal the
reference bit for bit.  Nothing here looks at the axes or attributes the quantizer wrote.
"""
from __future__ import annotations

from typing import Union

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ort_mx_ops
from ort_mx_ops import reference
from ort_mx_ops.formats import CONFIGS
from ort_mx_ops.quantizer import quantize_model

from conftest import assert_bits_equal

F = TensorProto.FLOAT
# An axis, or ("flat", axis): the weight viewed as (shape[0], -1), blocked along axis.
Axis = Union[int, tuple[str, int]]


def qdq(x: np.ndarray, config: str, axis: Axis) -> np.ndarray:
    """The reference quantize-dequantize of ``x`` in ``config`` along ``axis``."""
    if isinstance(axis, tuple):
        flat = qdq(x.reshape(x.shape[0], -1), config, axis[1])
        return flat.reshape(x.shape)
    c = CONFIGS[config]
    fn = reference.bfp_quantize_dequantize if c.op == "BFP" else reference.mx_quantize_dequantize
    return fn(x, axis=axis, **c.attrs)


def oracle(model: onnx.ModelProto, feeds: dict[str, np.ndarray], config: str,
           positions: dict[str, dict[int, Axis]]) -> dict[str, np.ndarray]:
    """The graph outputs of the float ``model`` with input k of node n replaced by its
    reference quantize-dequantize along ``positions[n][k]``; every other value float."""
    values: dict[str, np.ndarray] = dict(feeds)
    values.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer})
    for node in model.graph.node:
        local = onnx.NodeProto()
        local.CopyFrom(node)
        args = {}
        for k, name in enumerate(node.input):
            if not name:
                continue
            v = values[name]
            if k in positions.get(node.name, {}):
                v = qdq(v, config, positions[node.name][k])
            local.input[k] = f"in{k}"  # one node may read a tensor twice, differently
            args[f"in{k}"] = v
        for name, v in zip(node.output, ReferenceEvaluator(local).run(None, args)):
            values[name] = v
    return {o.name: values[o.name] for o in model.graph.output}


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    so = ort_mx_ops.register(ort.SessionOptions())
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def spread(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Values spanning binades element by element: every axis choice changes the result."""
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-6, 7, size=shape)
            ).astype(np.float32)


def make_model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], config: str,
          axes: dict[str, Axis], positions: dict[str, dict[int, Axis]], **opts) -> None:
    """Quantize ``model`` with folded weights and with runtime weight nodes; the tensors
    quantized and their axes must be ``axes``, the outputs must agree with :func:`oracle` at
    ``positions``, and each folded weight must equal its reference values."""
    float_out = oracle(model, feeds, config, {})
    want = oracle(model, feeds, config, positions)
    # The comparison below can tell: every output that quantization reaches moves far beyond
    # its slack (the others are bit for bit the float ones), and at least one does.
    moved = [n for n in want if not np.array_equal(want[n], float_out[n])]
    assert moved
    for name in moved:
        scale = float(np.abs(want[name]).max())
        assert float(np.abs(float_out[name] - want[name]).max()) > 1e-3 * scale, name
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for fold in (True, False):
        s = quantize_model(model, None, config, fold_weights=fold, **opts)
        got_axes = {r.tensor: ("flat", r.axis) if r.flatten else r.axis for r in s.sites}
        assert got_axes == axes, f"fold={fold}"
        out = run_ort(s.model, feeds)
        for name, w in want.items():
            scale = float(np.abs(w).max())
            err = float(np.abs(out[name] - w).max())
            assert err <= 1e-5 * scale, f"fold={fold} {name}: {err} vs {scale}"
        if fold:
            stored = {i.name: numpy_helper.to_array(i) for i in s.model.graph.initializer}
            for r in s.sites:
                if r.kind == "weight":
                    assert_bits_equal(stored[r.output], qdq(weights[r.tensor], config,
                                                            axes[r.tensor]), r.tensor)


CONFIG_PAIR = ["MXINT8", "MX6"]  # one MX and one BFP-family format


# ------------------------------------------------------------------------------------------
# consumers that disagree
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", CONFIG_PAIR)
def test_compute_op_outranks_a_majority_of_other_consumers(config):
    """``a`` (16, 32) is read by Relu and Tanh first (feature axis: the last, 1) and then
    by a MatMul as B, which contracts over axis 0.  The MatMul wins: axis 0 for all three.
    Weight W (32, 8) likewise: two Mul readers (axis 1) before the MatMul (axis 0)."""
    rng = np.random.default_rng(20)
    nodes = [helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Tanh", ["a"], ["s"], name="tanh"),
             helper.make_node("MatMul", ["x", "a"], ["y"], name="mm"),
             helper.make_node("Mul", ["W", "W"], ["w2"], name="square"),
             helper.make_node("MatMul", ["y", "W"], ["z"], name="mm_w")]
    model = make_model(nodes, [("x", [4, 16]), ("a", [16, 32])],
                       [("r", [16, 32]), ("s", [16, 32]), ("z", [4, 8]), ("w2", [32, 8])],
                       {"W": spread(rng, 32, 8)})
    feeds = {"x": spread(rng, 4, 16), "a": spread(rng, 16, 32)}
    axes = {"a": 0, "x": 1, "W": 0, "y": 1}
    positions = {"relu": {0: 0}, "tanh": {0: 0}, "mm": {0: 1, 1: 0},
                 "square": {0: 0, 1: 0}, "mm_w": {0: 1, 1: 0}}
    check(model, feeds, config, axes, positions, quantize_all_op_types=True)


@pytest.mark.parametrize("config", CONFIG_PAIR)
def test_compute_consumers_disagreeing_follow_the_majority(config):
    """``a`` (32, 32) is B of one MatMul (axis 0), then A of two (axis 1): the majority wins
    over graph order."""
    rng = np.random.default_rng(21)
    nodes = [helper.make_node("MatMul", ["W0", "a"], ["y0"], name="mm_b"),
             helper.make_node("MatMul", ["a", "W1"], ["y1"], name="mm_a1"),
             helper.make_node("MatMul", ["a", "W2"], ["y2"], name="mm_a2")]
    model = make_model(nodes, [("a", [32, 32])], [(n, [32, 32]) for n in ("y0", "y1", "y2")],
                       {k: spread(rng, 32, 32) for k in ("W0", "W1", "W2")})
    feeds = {"a": spread(rng, 32, 32)}
    axes = {"W0": 1, "a": 1, "W1": 0, "W2": 0}
    positions = {"mm_b": {0: 1, 1: 1}, "mm_a1": {0: 1, 1: 0}, "mm_a2": {0: 1, 1: 0}}
    check(model, feeds, config, axes, positions)


# ------------------------------------------------------------------------------------------
# static batch shapes: axis 0 is never an activation's block axis
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", CONFIG_PAIR)
def test_single_channel_conv_keeps_its_channel_axis(config):
    """x (16, 1, 6, 6): a Conv input stays on its channel axis 1 even when it is 1 long
    (never on the batch, though 16 is the longest); the weight (8, 1, 3, 3) is blocked over
    each output channel's 3x3 window."""
    rng = np.random.default_rng(22)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    model = make_model(nodes, [("x", [16, 1, 6, 6])], [("y", [16, 8, 6, 6])],
                       {"w": spread(rng, 8, 1, 3, 3)})
    feeds = {"x": spread(rng, 16, 1, 6, 6)}
    check(model, feeds, config, {"x": 1, "w": ("flat", 1)}, {"conv": {0: 1, 1: ("flat", 1)}})


@pytest.mark.parametrize("config", CONFIG_PAIR)
def test_other_ops_inputs_with_a_static_batch(config):
    """Neg inputs (a quantized op type here): a (64, 3, 1) has a 1-long last axis, so
    its feature axis is 1; b (64, 1) has no fixed axis but the batch, so it stays float."""
    rng = np.random.default_rng(29)
    nodes = [helper.make_node("Neg", ["a"], ["sa"], name="neg_a"),
             helper.make_node("Neg", ["b"], ["sb"], name="neg_b")]
    model = make_model(nodes, [("a", [64, 3, 1]), ("b", [64, 1])],
                       [("sa", [64, 3, 1]), ("sb", [64, 1])], {})
    feeds = {"a": spread(rng, 64, 3, 1), "b": spread(rng, 64, 1)}
    check(model, feeds, config, {"a": 1}, {"neg_a": {0: 1}}, op_types_to_quantize=["Neg"])
    s = quantize_model(model, None, config, op_types_to_quantize=["Neg"])
    assert any(m.startswith("b (input 0 of Neg") for m in s.skipped), s.skipped


@pytest.mark.parametrize("config", CONFIG_PAIR)
def test_attention_with_a_static_batch_and_dynamic_tokens(config):
    """P (64, 2, T, T) @ V (64, 2, T, 4), T dynamic: both contract over key tokens.  P moves
    to its only other fixed axis, the heads (1); V to its feature axis (3); never the batch
    axis 0, though it is the longest."""
    rng = np.random.default_rng(23)
    nodes = [helper.make_node("MatMul", ["p", "v"], ["o"], name="context")]
    model = make_model(nodes, [("p", [64, 2, "T", "T"]), ("v", [64, 2, "T", 4])],
                       [("o", [64, 2, "T", 4])], {})
    feeds = {"p": spread(rng, 64, 2, 3, 3), "v": spread(rng, 64, 2, 3, 4)}
    check(model, feeds, config, {"p": 1, "v": 3}, {"context": {0: 1, 1: 3}})


@pytest.mark.parametrize("config", CONFIG_PAIR)
def test_static_batch_with_a_one_long_contraction(config):
    """x (40, 1) @ W (1, 24): x has no fixed axis but the batch besides its 1-long contraction
    axis; it stays on axis 1 (one element per block), never on the batch."""
    rng = np.random.default_rng(24)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    model = make_model(nodes, [("x", [40, 1])], [("y", [40, 24])], {"W": spread(rng, 1, 24)})
    feeds = {"x": spread(rng, 40, 1)}
    check(model, feeds, config, {"x": 1, "W": 1}, {"mm": {0: 1, 1: 1}})


# ------------------------------------------------------------------------------------------
# layouts per op type
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", CONFIG_PAIR)
def test_conv_transpose_weight_blocks_its_input_channels(config):
    """ConvTranspose x (N, 16, 5, 5), W (C_in 16, C_out 6, 3, 3): x along its channels (1),
    W along C_in (0), the axis it contracts over."""
    rng = np.random.default_rng(25)
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="deconv",
                              strides=[2, 2])]
    model = make_model(nodes, [("x", ["N", 16, 5, 5])], [("y", ["N", 6, 11, 11])],
                       {"w": spread(rng, 16, 6, 3, 3),
                        "b": rng.standard_normal(6).astype(np.float32)})
    feeds = {"x": spread(rng, 2, 16, 5, 5)}
    check(model, feeds, config, {"x": 1, "w": 0}, {"deconv": {0: 1, 1: 0}})


@pytest.mark.parametrize("config", CONFIG_PAIR)
def test_grouped_conv_transpose(config):
    """group 2, W (16, 3, 3, 3): still C_in (axis 0).  onnx.reference has no grouped
    ConvTranspose, so the oracle is the float model in onnxruntime with W and x replaced by
    their reference values (axis 0 and 1): the same float kernel, so equal bit for bit."""
    rng = np.random.default_rng(30)
    w = spread(rng, 16, 3, 3, 3)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="deconv", group=2)
    model = make_model([node], [("x", [2, 16, 5, 5])], [("y", [2, 6, 7, 7])], {"w": w})
    x = spread(rng, 2, 16, 5, 5)
    pre = make_model([node], [("x", [2, 16, 5, 5])], [("y", [2, 6, 7, 7])],
                     {"w": qdq(w, config, 0)})
    want = run_ort(pre, {"x": qdq(x, config, 1)})["y"]
    for fold in (True, False):
        s = quantize_model(model, None, config, fold_weights=fold)
        assert {r.tensor: r.axis for r in s.sites} == {"x": 1, "w": 0}
        assert_bits_equal(run_ort(s.model, {"x": x})["y"], want, f"fold={fold}")


@pytest.mark.parametrize("config", CONFIG_PAIR)
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_layouts(config, trans_a, trans_b):
    """Gemm contracts A over axis 1 (0 when transposed) and B over axis 0 (1 when
    transposed); the bias C stays float."""
    rng = np.random.default_rng(26)
    a_shape = [40, 6] if trans_a else [6, 40]
    b_shape = [12, 40] if trans_b else [40, 12]
    nodes = [helper.make_node("Gemm", ["a", "B", "C"], ["y"], name="gemm", transA=trans_a,
                              transB=trans_b, alpha=0.5)]
    model = make_model(nodes, [("a", a_shape)], [("y", [6, 12])],
                       {"B": spread(rng, *b_shape), "C": spread(rng, 12)})
    feeds = {"a": spread(rng, *a_shape)}
    a_axis, b_axis = (0 if trans_a else 1), (1 if trans_b else 0)
    check(model, feeds, config, {"a": a_axis, "B": b_axis}, {"gemm": {0: a_axis, 1: b_axis}})


@pytest.mark.parametrize("config", CONFIG_PAIR)
def test_matmul_batched_weight_and_conv_layouts(config):
    """MatMul with a 3-D weight (2, 32, 8): its second-to-last axis; a grouped Conv
    (8, 4, 3, 3) with group 2: the channel axis 1; a depthwise Conv: the kernel window."""
    rng = np.random.default_rng(27)
    nodes = [helper.make_node("Conv", ["x", "wg"], ["c1"], name="grouped", group=2,
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c1", "wd"], ["c2"], name="depthwise", group=8,
                              pads=[1, 1, 1, 1]),
             helper.make_node("MatMul", ["t", "Wb"], ["m"], name="batched")]
    model = make_model(nodes, [("x", ["N", 8, 5, 5]), ("t", [2, 3, 32])],
                       [("c2", ["N", 8, 5, 5]), ("m", [2, 3, 8])],
                       {"wg": spread(rng, 8, 4, 3, 3), "wd": spread(rng, 8, 1, 3, 3),
                        "Wb": spread(rng, 2, 32, 8)})
    feeds = {"x": spread(rng, 2, 8, 5, 5), "t": spread(rng, 2, 3, 32)}
    axes = {"x": 1, "wg": 1, "c1": 1, "wd": ("flat", 1), "t": 2, "Wb": 1}
    positions = {"grouped": {0: 1, 1: 1}, "depthwise": {0: 1, 1: ("flat", 1)},
                 "batched": {0: 2, 1: 1}}
    check(model, feeds, config, axes, positions)


@pytest.mark.parametrize("config", CONFIG_PAIR)
def test_weight_that_is_also_a_graph_output(config):
    """W feeds a MatMul and is itself a graph output: the output stays the float W, the
    MatMul reads W blocked along axis 0."""
    rng = np.random.default_rng(28)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")]
    model = make_model(nodes, [("x", [3, 64])], [("y", [3, 16]), ("W", [64, 16])],
                       {"W": spread(rng, 64, 16)})
    feeds = {"x": spread(rng, 3, 64)}
    w = numpy_helper.to_array(model.graph.initializer[0])
    check(model, feeds, config, {"x": 1, "W": 0}, {"mm": {0: 1, 1: 0}})
    q = quantize_model(model, None, config).model
    assert_bits_equal(run_ort(q, feeds)["W"], w)
