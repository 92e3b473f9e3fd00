"""Small float models for the quantizer tests, built in code (seeded random weights).

No tests here: the other test_quantizer*.py files import these builders.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def _w(rng: np.random.Generator, *shape: int, spread: bool = True) -> np.ndarray:
    """Weights whose rows span several binades, so that blocks and axes matter."""
    w = rng.standard_normal(shape).astype(np.float32)
    if spread and len(shape) > 1:
        w *= (2.0 ** rng.integers(-4, 3, size=(shape[0],) + (1,) * (len(shape) - 1))
              ).astype(np.float32)
    return w


def _model(nodes, inputs, outputs, inits, opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def conv_model(opset: int = 17) -> onnx.ModelProto:
    """x (N, 8, 10, 10) -> Conv 3x3 (w1, b1) -> Relu -> depthwise Conv (w2, a Constant node,
    group 16) -> Relu -> Conv 1x1 (w3) -> y."""
    rng = np.random.default_rng(1)
    w2 = helper.make_node("Constant", [], ["w2"],
                          value=numpy_helper.from_array(_w(rng, 16, 1, 3, 3), "w2"))
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        w2,
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", group=16,
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 8, 10, 10])],
                  [helper.make_tensor_value_info("y", F, ["N", 4, 10, 10])],
                  {"w1": _w(rng, 16, 8, 3, 3), "b1": rng.standard_normal(16).astype(np.float32),
                   "w3": _w(rng, 4, 16, 1, 1)}, opset)


def matmul_model() -> onnx.ModelProto:
    """An attention-like block on x (B, T, 32) and a Gemm on x2 (B, 32)."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="proj"),
        helper.make_node("Relu", ["h"], ["hr"], name="relu"),
        helper.make_node("Transpose", ["hr"], ["hT"], name="transpose", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["hr", "hT"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "hr"], ["o"], name="context"),
        helper.make_node("Gemm", ["x2", "Wg", "bg"], ["y2"], name="gemm", transB=1),
    ]
    return _model(nodes,
                  [helper.make_tensor_value_info("x", F, ["B", "T", 32]),
                   helper.make_tensor_value_info("x2", F, ["B", 32])],
                  [helper.make_tensor_value_info("o", F, ["B", "T", 64]),
                   helper.make_tensor_value_info("y2", F, ["B", 16])],
                  {"W1": _w(rng, 32, 64) * np.float32(0.2), "Wg": _w(rng, 16, 32),
                   "bg": rng.standard_normal(16).astype(np.float32)})


def two_consumer_model() -> onnx.ModelProto:
    """``a`` feeds MatMul as A (axis 1) and as B (axis 0); ``W1`` feeds a MatMul and an Add."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("MatMul", ["a", "W1"], ["y1"], name="mm_a_first"),
        helper.make_node("MatMul", ["W2", "a"], ["y2"], name="mm_a_second"),
        helper.make_node("Add", ["W1", "a"], ["y3"], name="add"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("a", F, [16, 16])],
                  [helper.make_tensor_value_info(n, F, [16, 16]) for n in ("y1", "y2", "y3")],
                  {"W1": _w(rng, 16, 16), "W2": _w(rng, 16, 16)})


def feeds_for(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for the model ``name`` (batch 2 where the batch is dynamic)."""
    rng = np.random.default_rng(seed)
    scale = lambda *s: (rng.standard_normal(s) *  # noqa: E731
                        2.0 ** rng.integers(-3, 4, size=s)).astype(np.float32)
    if name == "conv":
        return {"x": scale(2, 8, 10, 10)}
    if name == "matmul":
        return {"x": scale(2, 5, 32), "x2": scale(3, 32)}
    return {"a": scale(16, 16)}


MODELS = {"conv": conv_model, "matmul": matmul_model, "two": two_consumer_model}
