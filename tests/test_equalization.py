"""Cross-layer equalization and bias correction on small models with real values: CLE keeps
the float model's outputs, equalizes the per-channel weight ranges as defined (largest |w| of
layer 1's output channel = that of layer 2's input channel), stops at ops that do not
commute with a per-channel scale; bias correction zeroes the mean output error it is fitted
on and lowers it on the whole calibration set."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_mx_ops
from ort_mx_ops.quantizer.adaquant import Sample
from ort_mx_ops.quantizer.config import FormatSpec
from ort_mx_ops.quantizer.equalization import equalize_model
from ort_mx_ops.quantizer.layers import Layer
from ort_mx_ops.quantizer.quantize import fold_weight, quantize_model
from ort_mx_ops.quantizer.tuning import _mean_shift


def _const(name, arr):
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.asarray(arr, np.float32), name))


def _uneven(rng, shape, axis):
    """Weights whose channels along ``axis`` span very different ranges (what CLE fixes)."""
    w = rng.standard_normal(shape)
    scale = np.exp(rng.uniform(-3, 3, shape[axis]))
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return (w * scale.reshape(view)).astype(np.float32)


def _cnn(seed=0):
    """conv_a -> BN -> Relu -> dw (depthwise) -> Add(Reshape(const)) -> Relu -> conv_c
    -> Clip -> conv_d (Clip is not homogeneous: c, d stay), conv_d -> two readers."""
    rng = np.random.default_rng(seed)
    inits = {
        "wa": _uneven(rng, (8, 3, 3, 3), 0), "ba": rng.standard_normal(8),
        "bn_s": rng.uniform(0.5, 2, 8), "bn_b": rng.standard_normal(8),
        "bn_m": rng.standard_normal(8), "bn_v": rng.uniform(0.5, 2, 8),
        "wdw": _uneven(rng, (8, 1, 3, 3), 0), "bdw_flat": rng.standard_normal(8),
        "shape4": None,
        "wc": _uneven(rng, (6, 8, 1, 1), 1), "wd": rng.standard_normal((4, 6, 3, 3)),
    }
    nodes = [
        helper.make_node("Conv", ["x", "wa", "ba"], ["a"], name="conv_a", pads=[1] * 4),
        helper.make_node("BatchNormalization", ["a", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"],
                         name="bn", epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("Conv", ["r1", "wdw"], ["dw"], name="dw", group=8, pads=[1] * 4),
        helper.make_node("Reshape", ["bdw_flat", "shape4"], ["bdw"]),
        helper.make_node("Add", ["dw", "bdw"], ["dwb"]),
        helper.make_node("Relu", ["dwb"], ["r2"]),
        helper.make_node("Conv", ["r2", "wc"], ["c"], name="conv_c"),
        helper.make_node("Clip", ["c", "lo", "hi"], ["cl"]),
        helper.make_node("Conv", ["cl", "wd"], ["d"], name="conv_d"),
        helper.make_node("Relu", ["d"], ["y1"]),
        helper.make_node("Sigmoid", ["d"], ["y2"]),
    ]
    consts = [_const(k, v) for k, v in inits.items() if v is not None]
    consts += [helper.make_node("Constant", [], ["shape4"], value=numpy_helper.from_array(
        np.array([1, 8, 1, 1], np.int64), "shape4")), _const("lo", 0.0), _const("hi", 6.0)]
    graph = helper.make_graph(
        consts + nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              [None, 3, 10, 10])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * 4) for n in ("y1", "y2")])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])


def _mlp(seed=1):
    """MatMul -> Add(const) -> LeakyRelu -> Gemm(transB, bias) -> Mul(scalar) -> PRelu ->
    MatMul, and a ConvTranspose -> Relu -> grouped Conv."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(_uneven(rng, (16, 12), 1), "w1"),
        numpy_helper.from_array(rng.standard_normal(12).astype(np.float32), "b1"),
        numpy_helper.from_array(_uneven(rng, (10, 12), 0), "w2"),
        numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "b2"),
        numpy_helper.from_array(np.array(0.7, np.float32), "half"),
        numpy_helper.from_array(rng.uniform(0, 0.3, 10).astype(np.float32), "slope"),
        numpy_helper.from_array(_uneven(rng, (10, 5), 0), "w3"),
        numpy_helper.from_array(_uneven(rng, (2, 6, 2, 2), 1), "wt"),
        numpy_helper.from_array(_uneven(rng, (4, 3, 3, 3), 1), "wg"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("LeakyRelu", ["a1"], ["l1"], alpha=0.1),
        helper.make_node("Gemm", ["l1", "w2", "b2"], ["g2"], name="gemm2", transB=1),
        helper.make_node("Mul", ["half", "g2"], ["h2"]),
        helper.make_node("PRelu", ["h2", "slope"], ["p2"]),
        helper.make_node("MatMul", ["p2", "w3"], ["y"], name="mm3"),
        helper.make_node("ConvTranspose", ["img", "wt"], ["t"], name="convt", strides=[2, 2]),
        helper.make_node("Relu", ["t"], ["tr"]),
        helper.make_node("Conv", ["tr", "wg"], ["z"], name="gconv", group=2),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16]),
                       helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 5]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [None] * 4)],
        inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _weights(model):
    out = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def _ratio(r1, r2):
    return float(np.max(np.maximum(r1, r2) / np.minimum(r1, r2)))


def test_cle_keeps_float_outputs_and_equalizes_cnn():
    model = _cnn()
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 3, 10, 10)).astype(np.float32)}
    out, report = equalize_model(model)
    assert [(p.first, p.second, p.between) for p in report.pairs] == [
        ("conv_a", "dw", ["BatchNormalization", "Relu"]), ("dw", "conv_c", ["Add", "Relu"])]
    for a, b in zip(_run(model, feeds), _run(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-5 * np.abs(a).max())
    w0, w = _weights(model), _weights(out)
    # The last pair of the chain is equal by definition: max|w| of dw's output channel c
    # over its kernel = max|w| of conv_c's input channel c over all its outputs.
    r1 = np.abs(w["wdw"]).max(axis=(1, 2, 3))
    r2 = np.abs(w["wc"]).max(axis=(0, 2, 3))
    np.testing.assert_allclose(r1, r2, rtol=1e-5)
    assert _ratio(np.abs(w0["wdw"]).max(axis=(1, 2, 3)),
                  np.abs(w0["wc"]).max(axis=(0, 2, 3))) > 10
    # Clip between conv_c and conv_d: conv_d is untouched; conv_c changed only its inputs.
    np.testing.assert_array_equal(w["wd"], w0["wd"])
    # BN: mean and bias divided by the scale of conv_a's channel; gamma and var kept.
    s = np.abs(w0["wa"]).max(axis=(1, 2, 3)) / np.abs(w["wa"]).max(axis=(1, 2, 3))
    np.testing.assert_allclose(w["bn_m"], w0["bn_m"] / s, rtol=1e-5)
    np.testing.assert_allclose(w["bn_b"], w0["bn_b"] / s, rtol=1e-5)
    np.testing.assert_array_equal(w["bn_s"], w0["bn_s"])
    np.testing.assert_array_equal(w["bn_v"], w0["bn_v"])
    np.testing.assert_allclose(w["ba"], w0["ba"] / s, rtol=1e-5)
    # The input model is left as it was.
    np.testing.assert_array_equal(_weights(model)["wa"], w0["wa"])


def test_cle_more_steps_bring_chains_closer():
    model = _cnn()
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 3, 10, 10)).astype(np.float32)}
    one = equalize_model(model, steps=1)[1].pairs[0].ratio_after
    out, rep = equalize_model(model, steps=12)
    assert rep.pairs[0].ratio_after < one and rep.pairs[0].ratio_after < 1.01
    w = _weights(out)
    np.testing.assert_allclose(np.abs(w["wa"]).max(axis=(1, 2, 3)),
                               np.abs(w["wdw"]).max(axis=(1, 2, 3)), rtol=0.01)
    for a, b in zip(_run(model, feeds), _run(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-5 * np.abs(a).max())
    with pytest.raises(ValueError, match="steps"):
        equalize_model(model, steps=0)


def test_cle_matmul_gemm_convtranspose_grouped():
    model = _mlp()
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((7, 16)).astype(np.float32),
             "img": rng.standard_normal((1, 2, 4, 4)).astype(np.float32)}
    out, report = equalize_model(model)
    assert [(p.first, p.second) for p in report.pairs] == [
        ("mm1", "gemm2"), ("gemm2", "mm3"), ("convt", "gconv")]
    for a, b in zip(_run(model, feeds), _run(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-5 * np.abs(a).max())
    w = _weights(out)
    # gemm2 (transB: rows are outputs) -> mm3: output channel = row of w2, input = row of w3.
    np.testing.assert_allclose(np.abs(w["w2"]).max(axis=1), np.abs(w["w3"]).max(axis=1),
                               rtol=1e-5)
    # convt (C_in, C_out/g, k, k) -> grouped conv (4, 3, k, k) with 2 groups of 3 inputs:
    # input channel c of gconv reaches the 2 outputs of its group only.
    r1 = np.abs(w["wt"]).max(axis=(0, 2, 3))
    r2 = np.concatenate([np.abs(w["wg"][2 * g:2 * g + 2]).max(axis=(0, 2, 3))
                         for g in range(2)])
    np.testing.assert_allclose(r1, r2, rtol=1e-5)


def test_quantize_with_cle_option_and_cli(tmp_path):
    model = _cnn()
    s = quantize_model(model, None, "MX6", cross_layer_equalization=True)
    assert s.equalization is not None and len(s.equalization.pairs) == 2
    assert "cross-layer equalization: 2 pairs" in str(s)
    plain = quantize_model(model, None, "MX6")
    assert plain.equalization is None
    q, p = _weights(s.model), _weights(plain.model)
    assert not np.array_equal(q["wc"], p["wc"])
    from ort_mx_ops.quantizer.cli import main
    from ort_mx_ops.quantizer.demo import parse_row
    src, js = tmp_path / "m.onnx", tmp_path / "s.json"
    onnx.save(model, src)
    assert main([str(src), str(tmp_path / "q.onnx"), "--config", "MXFP8E4M3",
                 "--cross-layer-equalization", "--quiet", "--summary-json", str(js)]) == 0
    assert len(json.load(open(js))["equalization"]["pairs"]) == 2
    assert parse_row("MX6+cle+bc") == ("MX6", {"cross_layer_equalization": True,
                                               "bias_correction": True})


@pytest.mark.parametrize("op,shape,attrs", [("Conv", (6, 2, 3, 3), {"group": 2}),
                                            ("Gemm", (5, 40), {"transB": 1})])
def test_bias_correction_shift_zeroes_mean_error(op, shape, attrs):
    rng = np.random.default_rng(6)
    layer = Layer(op, shape, attrs)
    w = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(layer.out_channels).astype(np.float32)
    x = np.abs(rng.standard_normal((3, 4, 7, 7) if op == "Conv" else (90, 40))) \
        .astype(np.float32)  # positive inputs: a systematic error per channel
    a, _ = layer.rows(x)
    y = layer.linear(a, layer.weight_matrix(w), b)      # the float layer's output
    wq = fold_weight(w, FormatSpec.from_name("MX4"), 1)
    m = layer.weight_matrix(wq)
    samples = [Sample(a[:, :len(y) // 2], y[:len(y) // 2]), Sample(a[:, len(y) // 2:],
                                                                   y[len(y) // 2:])]
    before = np.abs((y - layer.linear(a, m, b)).mean(axis=0))
    shift = _mean_shift(layer, samples, layer.weight_matrix(w), m)
    after = np.abs((y - layer.linear(a, m, b + shift)).mean(axis=0))
    assert before.max() > 1e-2
    assert after.max() < 1e-5 * np.abs(y).max()


@pytest.mark.parametrize("bias_at", ["input", "add", "batchnorm"])
def test_bias_correction_lowers_mean_error_on_calibration_data(bias_at):
    """The bias is the Conv's input 2, a following Add of a Reshape'd constant (as exporters
    write it), or the mean of a following BatchNormalization."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    if bias_at == "input":
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1] * 4)]
        inits.append(numpy_helper.from_array(b, "b"))
    elif bias_at == "add":
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
                 _const("b", b), helper.make_node("Constant", [], ["s4"], value=numpy_helper.
                                                  from_array(np.array([1, 8, 1, 1]), "s4")),
                 helper.make_node("Reshape", ["b", "s4"], ["b4"]),
                 helper.make_node("Add", ["c", "b4"], ["y"])]
    else:
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
                 helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"])]
        inits += [numpy_helper.from_array(v.astype(np.float32), n) for n, v in
                  (("g", rng.uniform(0.5, 2, 8)), ("b", b), ("m", rng.standard_normal(8)),
                   ("v", rng.uniform(0.5, 2, 8)))]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8, 8, 8])], inits)
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 13)])
    feeds = [{"x": (np.abs(rng.standard_normal((1, 4, 8, 8))) + 0.5).astype(np.float32)}
             for _ in range(12)]

    class Reader:
        def __init__(self):
            self.left = list(feeds)

        def get_next(self):
            return self.left.pop(0) if self.left else None

    def mean_error(q):
        so = ort.SessionOptions()
        ort_mx_ops.register(so)
        sess = ort.InferenceSession(q.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        ref = np.concatenate([_run(model, f)[0] for f in feeds])
        got = np.concatenate([sess.run(None, f)[0] for f in feeds])
        return np.abs((got - ref).mean(axis=(0, 2, 3)))

    plain = quantize_model(model, None, "MX4", activation=None)
    bc = quantize_model(model, None, "MX4", Reader(), activation=None, bias_correction=True)
    assert bc.tuning.layers[0].applied == ["bias_correction"]
    before, after = mean_error(plain.model), mean_error(bc.model)
    assert before.max() > 0.05
    assert after.max() < 0.2 * before.max()
