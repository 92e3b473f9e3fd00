"""GPTQ-style rounding: the result is exactly representable (the real kernel returns it
unchanged), and on a layer with correlated inputs it has a lower output error than
round-to-nearest on held-out inputs."""
from __future__ import annotations

import numpy as np
import pytest

from ort_mx_ops.quantizer.config import FormatSpec
from ort_mx_ops.quantizer.gptq import block_ids, gptq_quantize, hessian_add, kernel_rows
from ort_mx_ops.quantizer.layers import Layer
from ort_mx_ops.quantizer.quantize import fold_weight

FORMATS = ["MXFP4E2M1", "MXFP6E2M3", "MXFP8E4M3", "MXINT8", "MX6", "MX4", "BFP16", "BF16"]


def _correlated(rng, n, k):
    base = rng.standard_normal((n, 12))
    return (base @ rng.standard_normal((12, k)) + 0.3 * rng.standard_normal((n, k))
            ).astype(np.float32)


def _run(layer, w, x_cal, spec, axis, flatten):
    q = lambda v: fold_weight(v, spec, axis, 1.0, flatten)  # noqa: E731
    a, _ = layer.rows(x_cal)
    return gptq_quantize(layer, w, hessian_add(None, a), spec, axis, flatten, q,
                         kernel_rows(spec)), q


@pytest.mark.parametrize("name", FORMATS)
def test_matmul_idempotent_and_better_than_nearest(name):
    rng = np.random.default_rng(3)
    spec = FormatSpec.from_name(name)
    layer = Layer("MatMul", (96, 40))
    w = (rng.standard_normal((96, 40)) * 0.05).astype(np.float32)
    x = _correlated(rng, 1200, 96)
    res, q = _run(layer, w, x[:600], spec, 0, False)
    assert res.fallback == ""
    np.testing.assert_array_equal(q(res.weight), res.weight)
    held = x[600:]
    err_nearest = np.mean((held @ q(w) - held @ w) ** 2)
    err_gptq = np.mean((held @ res.weight - held @ w) ** 2)
    assert err_gptq < 0.5 * err_nearest, (err_gptq, err_nearest)


@pytest.mark.parametrize("op,ws,attrs,axis,flatten", [
    ("Conv", (8, 64, 3, 3), {"pads": [1, 1, 1, 1]}, 1, False),
    ("Conv", (8, 32, 3, 3), {"group": 2}, 1, False),
    ("Conv", (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}, 1, True),   # depthwise
    ("ConvTranspose", (64, 4, 2, 2), {"strides": [2, 2]}, 0, False),
    ("Gemm", (24, 80), {"transB": 1}, 1, False),
])
@pytest.mark.parametrize("name", ["MXFP4E2M1", "MX6"])
def test_layouts(op, ws, attrs, axis, flatten, name):
    rng = np.random.default_rng(4)
    spec = FormatSpec.from_name(name)
    layer = Layer(op, ws, attrs)
    w = (rng.standard_normal(ws) * 0.1).astype(np.float32)
    cin = ws[0] if op == "ConvTranspose" else (ws[1] * attrs.get("group", 1))
    if op == "Gemm":
        x = _correlated(rng, 400, ws[1])
    else:
        flat = _correlated(rng, 4 * 10 * 10, cin)
        x = flat.reshape(4, 10, 10, cin).transpose(0, 3, 1, 2).copy()
    half = len(x) // 2
    res, q = _run(layer, w, x[:half], spec, axis, flatten)
    assert res.fallback == ""
    np.testing.assert_array_equal(q(res.weight), res.weight)
    ref = layer.forward(x[half:], w)
    err_nearest = np.mean((layer.forward(x[half:], q(w)) - ref) ** 2)
    err_gptq = np.mean((layer.forward(x[half:], res.weight) - ref) ** 2)
    assert err_gptq < err_nearest, (err_gptq, err_nearest)


def test_block_ids_follow_the_kernel_blocks():
    # Two elements share a block id exactly when the kernel gives them one shared scale:
    # scaling one block by 2^k scales only that block's quantized values.
    spec = FormatSpec.from_name("MXFP4E2M1")
    rng = np.random.default_rng(5)
    w = rng.standard_normal((3, 70)).astype(np.float32)
    ids = block_ids(w.shape, spec, 1, False)
    assert len(np.unique(ids)) == 3 * 3
    base = fold_weight(w, spec, 1)
    bumped = w.copy()
    bumped[ids == ids[1, 40]] *= 1024
    diff = fold_weight(bumped, spec, 1) != base * np.where(ids == ids[1, 40], 1024, 1)
    assert not diff.any()


def test_weight_blocked_along_output_axis_falls_back():
    spec = FormatSpec.from_name("MXINT8")
    layer = Layer("MatMul", (1, 64))
    w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    x = np.ones((5, 1), np.float32)
    res, q = _run(layer, w, x, spec, 1, False)
    assert res.fallback
    np.testing.assert_array_equal(res.weight, q(w))


def test_gptq_speed_benchmark_model_and_protocol(capsys):
    # The benchmark's CNN has MobileNetV2's size at width 1 (3.49 M parameters with biases)
    # and about 5.4 M at width 1.3; its float model runs, and a small one goes through the
    # whole protocol (both quantizer calls, GPTQ reported on every Conv and the Gemm).
    import onnxruntime as ort
    from ort_mx_ops.benchmarks import gptq_speed
    assert gptq_speed.parameter_count(gptq_speed.build_cnn(1.0)) == 3_487_816
    assert 5.3e6 < gptq_speed.parameter_count(gptq_speed.build_cnn(1.3)) < 5.5e6
    small = gptq_speed.build_cnn(0.25, resolution=32, classes=10)
    sess = ort.InferenceSession(small.SerializeToString(), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": np.ones((2, 3, 32, 32), np.float32)})[0]
    assert y.shape == (2, 10) and np.isfinite(y).all()
    r = gptq_speed.run(0.25, 32, 4, "MXINT8", None)
    convs = sum(n.op_type in ("Conv", "Gemm") for n in small.graph.node)
    assert r["layers"] == convs and r["gptq_s"] > 0 and "gptq" in r["timings_s"]
    assert gptq_speed.main(["--width", "0.25", "--resolution", "32", "--calib", "4"]) == 0
    assert "weight_rounding='gptq'" in capsys.readouterr().out
