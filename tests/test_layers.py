"""quantizer.layers: numpy forward passes agree with onnxruntime, and weight /
bias gradients agree with finite differences."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, TensorProto
import onnxruntime as ort

from ort_mx_ops.quantizer.layers import Layer

CASES = [
    # op, x shape, w shape, attrs, bias
    ("Conv", (2, 4, 7, 6), (6, 4, 3, 3), {}, True),
    ("Conv", (1, 6, 9, 8), (6, 3, 3, 2), {"group": 2, "strides": [2, 1],
                                          "pads": [1, 0, 2, 1], "dilations": [1, 2]}, True),
    ("Conv", (2, 5, 8, 8), (5, 1, 3, 3), {"group": 5, "pads": [1, 1, 1, 1]}, False),  # depthwise
    ("Conv", (2, 3, 11), (4, 3, 3), {"strides": [2], "pads": [1, 1]}, True),  # 1-D
    ("ConvTranspose", (2, 4, 5, 4), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 0, 0, 1],
                                                   "output_padding": [1, 0]}, True),
    ("ConvTranspose", (1, 6, 4, 5), (6, 2, 2, 3), {"group": 3, "strides": [2, 1],
                                                   "dilations": [1, 2]}, True),
    ("Gemm", (5, 7), (7, 3), {"alpha": 0.5, "beta": 2.0}, True),
    ("Gemm", (7, 5), (3, 7), {"transA": 1, "transB": 1}, True),
    ("MatMul", (2, 3, 8), (8, 5), {}, False),
]


def _onnx_forward(op, x, w, b, attrs):
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)]
    inits = [onnx.numpy_helper.from_array(w, "w")]
    names = ["x", "w"]
    if b is not None:
        inits.append(onnx.numpy_helper.from_array(b, "b"))
        names.append("b")
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("op,xs,ws,attrs,bias", CASES)
def test_forward_matches_onnx(op, xs, ws, attrs, bias):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    layer = Layer(op, ws, attrs)
    b = rng.standard_normal(layer.out_channels).astype(np.float32) if bias else None
    want = _onnx_forward(op, x, w, b, attrs)
    got = layer.forward(x, w, b)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op,xs,ws,attrs,bias", CASES)
def test_weight_matrix_round_trip(op, xs, ws, attrs, bias):
    layer = Layer(op, ws, attrs)
    w = np.arange(int(np.prod(ws)), dtype=np.float32).reshape(ws)
    m = layer.weight_matrix(w)
    assert m.shape[0] == layer.groups and m.shape[0] * m.shape[2] == layer.out_channels
    np.testing.assert_array_equal(layer.weight_from_matrix(m), w)


@pytest.mark.parametrize("op,xs,ws,attrs,bias", CASES)
def test_gradients_match_finite_differences(op, xs, ws, attrs, bias):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(xs).astype(np.float64).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    layer = Layer(op, ws, attrs)
    b = rng.standard_normal(layer.out_channels).astype(np.float32) if bias else None
    target = rng.standard_normal(layer.forward(x, w, b).shape).astype(np.float32)

    def loss(w_, b_):
        y = layer.forward(x, w_, b_).astype(np.float64)
        return 0.5 * float(np.sum((y - target) ** 2))

    dy = layer.forward(x, w, b) - target
    gw, gb = layer.gradients(x, w, b, dy)
    assert gw.shape == w.shape
    eps = 1e-2
    for idx in list(np.ndindex(*ws))[:: max(1, w.size // 12)]:
        wp, wm = w.copy(), w.copy()
        wp[idx] += eps
        wm[idx] -= eps
        fd = (loss(wp, b) - loss(wm, b)) / (2 * eps)
        assert abs(fd - gw[idx]) <= 1e-2 * max(1.0, abs(fd)), (idx, fd, gw[idx])
    if bias:
        assert gb.shape == b.shape
        for i in range(b.size):
            bp, bm = b.copy(), b.copy()
            bp[i] += eps
            bm[i] -= eps
            fd = (loss(w, bp) - loss(w, bm)) / (2 * eps)
            assert abs(fd - gb[i]) <= 1e-2 * max(1.0, abs(fd))


def test_post_relu_mask():
    layer = Layer("MatMul", (3, 2), post="Relu")
    y, mask = layer.apply_post(np.array([[-1.0, 2.0]], np.float32))
    np.testing.assert_array_equal(y, [[0.0, 2.0]])
    np.testing.assert_array_equal(mask, [[False, True]])


def test_rejects_unsupported():
    with pytest.raises(ValueError, match="unsupported layer"):
        Layer("Add", (3,))
    with pytest.raises(ValueError, match="auto_pad"):
        Layer("Conv", (2, 2, 3, 3), {"auto_pad": "SAME_UPPER"})
