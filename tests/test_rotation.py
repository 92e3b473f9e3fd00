"""Block-wise Hadamard rotation of MatMul / Gemm reduction axes: orthonormal blocks, float
outputs unchanged, the weight rotated as defined, the added rotation node left float, and the
quantized model computing the rotated product with the kernel's rounding."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_mx_ops
from ort_mx_ops.quantizer.quantize import quantize_model
from ort_mx_ops.quantizer.rotation import block_hadamard, hadamard, rotate_model


def _model(w1, w2, b2):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="gemm", transB=1)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, w1.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, w2.shape[0]])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(b2, "b2")])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])


def _run(model, x, custom=False):
    so = ort.SessionOptions()
    if custom:
        ort_mx_ops.register(so)
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_hadamard_blocks_are_orthonormal():
    h = hadamard(8)
    np.testing.assert_allclose(h @ h.T, np.eye(8), atol=1e-12)
    assert set(np.unique(np.abs(h) * np.sqrt(8)).round(12)) == {1.0}
    bh = block_hadamard(24, 8)
    np.testing.assert_allclose(bh @ bh, np.eye(24), atol=1e-12)
    assert np.count_nonzero(bh) == 3 * 64
    with pytest.raises(ValueError, match="power of two"):
        hadamard(12)
    with pytest.raises(ValueError, match="multiple"):
        block_hadamard(20, 8)


def test_rotation_keeps_float_outputs_and_rotates_weights():
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((96, 40)).astype(np.float32)
    w2 = rng.standard_normal((6, 40)).astype(np.float32)
    b2 = rng.standard_normal(6).astype(np.float32)
    model = _model(w1, w2, b2)
    out, rep = rotate_model(model)
    assert rep.layers == [("mm", 96, 32), ("gemm", 40, 8)]
    x = rng.standard_normal((5, 96)).astype(np.float32)
    ref = _run(model, x)
    np.testing.assert_allclose(_run(out, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    w = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    np.testing.assert_allclose(w["w1"], block_hadamard(96, 32) @ w1, atol=1e-5)
    np.testing.assert_allclose(w["w2"], w2 @ block_hadamard(40, 8), atol=1e-5)
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]), w1)


def test_rotated_quantized_model_computes_rotated_product():
    """Quantized with the rotation: y = relu((x H1) Q(H1 W1)) H2 Q(W2 H2)^T + b, Q the
    kernel's MXFP4 rounding of the rotated weight along its reduction axis."""
    from ort_mx_ops.quantizer.config import FormatSpec
    from ort_mx_ops.quantizer.quantize import fold_weight
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((64, 48)).astype(np.float32)
    w2 = rng.standard_normal((4, 48)).astype(np.float32)
    b2 = rng.standard_normal(4).astype(np.float32)
    model = _model(w1, w2, b2)
    s = quantize_model(model, None, "MXFP4E2M1", activation=None, hadamard_rotation=True)
    rot = [n for n in s.model.graph.node if n.name in s.rotation.added_nodes]
    assert len(rot) == 2 and rot[0].input[0] == "x"  # reads the float input
    assert "block Hadamard rotation: 2" in str(s)
    spec = FormatSpec.from_name("MXFP4E2M1")
    h1, h2 = block_hadamard(64, 32), block_hadamard(48, 16)
    q1 = fold_weight((h1 @ w1).astype(np.float32), spec, 0)
    q2 = fold_weight((w2 @ h2).astype(np.float32), spec, 1)
    x = rng.standard_normal((20, 64)).astype(np.float32)
    r = np.maximum((x @ h1) @ q1, 0)
    want = (r @ h2) @ q2.T + b2
    got = _run(s.model, x, True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    plain = quantize_model(model, None, "MXFP4E2M1", activation=None)
    assert not np.allclose(_run(plain.model, x, True), got, rtol=1e-3)
