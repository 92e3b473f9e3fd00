"""Fast finetune (AdaQuant) and model-level weight tuning: real error reductions on held-out
inputs, the overfitting guard, determinism for a fixed seed, option parsing and errors."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper, TensorProto

import ort_mx_ops
from ort_mx_ops.quantizer.adaquant import FastFinetune, Sample, adaquant_layer
from ort_mx_ops.quantizer.config import FormatSpec, get_config
from ort_mx_ops.quantizer.layers import Layer
from ort_mx_ops.quantizer.quantize import fold_weight, quantize_model
from ort_mx_ops.quantizer.tuning import CalibrationMissing, read_feeds, sign_test, tune_model


def _correlated(rng, n, k):
    base = rng.standard_normal((n, 8))
    return (base @ rng.standard_normal((8, k)) + 0.2 * rng.standard_normal((n, k))
            ).astype(np.float32)


def _matmul_problem(seed=0):
    rng = np.random.default_rng(seed)
    spec = FormatSpec.from_name("MXFP4E2M1")
    layer = Layer("MatMul", (64, 24))
    w = (rng.standard_normal((64, 24)) * 0.1).astype(np.float32)
    x = _correlated(rng, 900, 64)
    xq = fold_weight(x, FormatSpec.from_name("MXINT8"), 1)  # the quantized model's input
    q = lambda v: fold_weight(v, spec, 0)  # noqa: E731
    y = x @ w                                                # the float layer's output
    samples = [Sample(xq[i:i + 50][None], y[i:i + 50]) for i in range(0, 900, 50)]
    return layer, w, q, samples


OPTS = FastFinetune(num_iterations=300, learning_rate=1e-3, batch_size=2)


def test_adaquant_lowers_held_out_error_vs_nearest():
    layer, w, q, samples = _matmul_problem()
    train, hold, test = samples[:10], samples[10:13], samples[13:]
    fit = adaquant_layer(layer, w, None, q, train, hold, OPTS, np.random.default_rng(0))
    assert fit.kept and fit.hold_after < fit.hold_before and fit.train_after < fit.train_before

    def err(weight):
        return np.mean([np.mean((s.a[0] @ q(weight) - s.y) ** 2) for s in test])
    assert err(fit.weight) < 0.8 * err(w), (err(fit.weight), err(w))


def test_adaquant_trains_bias_with_relu():
    rng = np.random.default_rng(1)
    layer = Layer("Gemm", (12, 32), {"transB": 1}, post="Relu")
    w = (rng.standard_normal((12, 32)) * 0.2).astype(np.float32)
    b = (rng.standard_normal(12) * 0.1).astype(np.float32)
    x = _correlated(rng, 600, 32)
    y = np.maximum(x @ w.T + b, 0)
    q = lambda v: fold_weight(v, FormatSpec.from_name("MX4"), 1)  # noqa: E731
    samples = [Sample(x[i:i + 40][None], y[i:i + 40]) for i in range(0, 600, 40)]
    fit = adaquant_layer(layer, w, b, q, samples[:10], samples[10:], OPTS,
                         np.random.default_rng(0))
    assert fit.kept and fit.bias is not None and not np.array_equal(fit.bias, b)
    assert fit.hold_after < fit.hold_before


def test_overfitting_guard_keeps_nearest():
    layer, w, q, samples = _matmul_problem()
    rng = np.random.default_rng(9)
    # Held-out targets unrelated to the inputs: no change can help there.
    hold = [Sample(s.a, rng.standard_normal(s.y.shape).astype(np.float32) * 10)
            for s in samples[10:12]]
    fit = adaquant_layer(layer, w, None, q, samples[:10], hold, OPTS, np.random.default_rng(0))
    assert not fit.kept and fit.bias is None
    np.testing.assert_array_equal(fit.weight, w)
    assert fit.hold_after == fit.hold_before
    assert fit.iterations < OPTS.num_iterations  # early stop: held-out error never improved


def test_fixed_seed_is_deterministic():
    layer, w, q, samples = _matmul_problem()
    layer.post = "Relu"  # the row-wise path, which draws minibatches from the generator
    samples = [Sample(s.a, np.maximum(s.y, 0)) for s in samples]
    runs = [adaquant_layer(layer, w, None, q, samples[:10], samples[10:13], OPTS,
                           np.random.default_rng(seed)) for seed in (5, 5, 6)]
    np.testing.assert_array_equal(runs[0].weight, runs[1].weight)
    assert runs[0].iterations == runs[1].iterations
    assert not np.array_equal(runs[0].weight, runs[2].weight)


def test_options():
    assert FastFinetune.from_options(None) is None and FastFinetune.from_options(False) is None
    d = FastFinetune.from_options(True)
    assert (d.data_size, d.batch_size, d.num_iterations, d.learning_rate, d.early_stop) == \
        (1000, 2, 1000, 1e-5, True)
    o = FastFinetune.from_options({"NumIterations": 5, "LearningRate": 1e-6,
                                   "batch_size": 4, "OptimDevice": "cpu"})
    assert (o.num_iterations, o.learning_rate, o.batch_size) == (5, 1e-6, 4)
    with pytest.raises(ValueError, match="unknown fast_finetune option 'Foo'"):
        FastFinetune.from_options({"Foo": 1})
    with pytest.raises(ValueError, match="adaround"):
        FastFinetune(optim_algorithm="adaround")
    with pytest.raises(ValueError, match="CPU"):
        FastFinetune(optim_device="cuda:0")


# -- model level ---------------------------------------------------------------------------

def _small_cnn(seed=0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def init(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)
    inits = [init("w1", (16, 3, 3, 3), 0.3), init("b1", (16,), 0.1),
             init("w2", (32, 16, 3, 3), 0.1), init("b2", (32,), 0.1),
             init("w3", (32, 10), 0.2), init("b3", (10,), 0.1)]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2",
                              strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc")]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _images(seed, n):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        img = rng.standard_normal((1, 3, 4, 4)).astype(np.float32)
        img = np.kron(img, np.ones((1, 1, 3, 3), np.float32))  # smooth: correlated pixels
        out.append({"x": img + 0.1 * rng.standard_normal(img.shape).astype(np.float32)})
    return out


def _run(model, feeds):
    so = ort.SessionOptions()
    ort_mx_ops.register(so)
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, f)[0] for f in feeds])


def _output_error(model, cfg, feeds):
    ref = _run(model, feeds)
    out = _run(quantize_model(model, None, cfg).model, feeds)
    return float(np.mean((out - ref) ** 2))


@pytest.mark.parametrize("algo", ["gptq", "adaquant"])
def test_tuned_model_beats_nearest_on_held_out_inputs(algo):
    model = _small_cnn()
    cfg = get_config("MXFP4E2M1").replace(activation=FormatSpec.from_name("MXINT8"), name="")
    calib, held = _images(1, 64), _images(2, 24)
    kw = {"weight_rounding": "gptq"} if algo == "gptq" else \
        {"fast_finetune": FastFinetune(num_iterations=200, learning_rate=1e-3,
                                       guard_metric="mse")}
    tuned, report = tune_model(model, cfg, calib, **kw)
    assert [c.node for c in report.layers] == ["conv1", "conv2", "fc"]
    assert all(c.err_after <= c.err_before for c in report.layers)
    assert any(a.startswith(algo) for c in report.layers for a in c.applied)
    assert _output_error(model, cfg, held) > _output_error(tuned, cfg, held)
    # The input model is untouched.
    assert np.array_equal(numpy_helper.to_array(model.graph.initializer[0]),
                          numpy_helper.to_array(_small_cnn().graph.initializer[0]))


def test_tuning_is_deterministic():
    model = _small_cnn()
    cfg = get_config("MX6")
    calib = _images(3, 8)
    opts = FastFinetune(num_iterations=50, learning_rate=1e-3)
    a, _ = tune_model(model, cfg, calib, fast_finetune=opts, weight_rounding="gptq")
    b, _ = tune_model(model, cfg, calib, fast_finetune=opts, weight_rounding="gptq")
    for ta, tb in zip(a.graph.initializer, b.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(ta), numpy_helper.to_array(tb))


def test_gptq_weights_survive_folding_exactly():
    model = _small_cnn()
    cfg = get_config("MXFP6E2M3")
    tuned, report = tune_model(model, cfg, _images(4, 12), weight_rounding="gptq")
    folded = quantize_model(tuned, None, cfg).model
    got = {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}
    for t in tuned.graph.initializer:
        if t.name in ("w1", "w2", "w3") and any(
                c.weight == t.name and any(a.startswith("gptq") for a in c.applied)
                for c in report.layers):
            np.testing.assert_array_equal(got[t.name], numpy_helper.to_array(t))


def test_missing_calibration_data_names_the_argument():
    with pytest.raises(CalibrationMissing, match="calibration_data_reader.*--calib"):
        read_feeds(None, 10, "weight_rounding='gptq'")

    class Empty:
        def get_next(self):
            return None
    with pytest.raises(CalibrationMissing, match="yielded no batches"):
        read_feeds(Empty(), 10, "fast_finetune")


# -- through quantize_model and the CLI -------------------------------------------------------

class _Reader:
    def __init__(self, feeds):
        self.feeds = list(feeds)

    def get_next(self):
        return self.feeds.pop(0) if self.feeds else None


def test_adaquant_config_names():
    from ort_mx_ops.quantizer.config import config_names
    names = config_names(adaquant=True)
    assert len(names) == len(config_names()) and all(n.endswith("_ADAQUANT") for n in names)
    for name in names:
        cfg = get_config(name)
        plain = get_config(name[:-len("_ADAQUANT")])
        assert cfg.fast_finetune == FastFinetune() and cfg.weight == plain.weight
        assert cfg.name == name and FormatSpec.from_name(name) == plain.weight
    mixed = get_config("MXFP4E2M1_ADAQUANT", activation="MXINT8")
    assert mixed.activation == FormatSpec.from_name("MXINT8") and "MXINT8" in mixed.name


def test_quantize_model_runs_the_algorithms_and_reports():
    model = _small_cnn()
    opts = {"NumIterations": 60, "LearningRate": 1e-3}
    s = quantize_model(model, None, "MXFP6E2M3_ADAQUANT", _Reader(_images(6, 10)),
                       weight_rounding="gptq", fast_finetune=opts)
    assert s.tuning is not None and [c.node for c in s.tuning.layers] == \
        ["conv1", "conv2", "fc"]
    assert "relative output error per layer" in str(s)
    assert {"inference", "gptq", "adaquant"} <= set(s.tuning.timings) and \
        all(v >= 0 for v in s.tuning.timings.values())
    assert s.as_dict()["tuning"]["layers"][0]["node"] == "conv1"
    near = quantize_model(model, None, "MXFP6E2M3").model
    assert any(not np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
               for a, b in zip(s.model.graph.initializer, near.graph.initializer))


@pytest.mark.parametrize("options", [{"weight_rounding": "gptq"}, {"bias_correction": True},
                                     {"config": "MX6_ADAQUANT"}])
def test_missing_reader_is_a_clear_error(options):
    config = options.pop("config", "MX6")
    with pytest.raises(ValueError, match="calibration_data_reader=.*--calib"):
        quantize_model(_small_cnn(), None, config, **options)


def test_cli_flags(tmp_path):
    from ort_mx_ops.quantizer.cli import main
    src, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(_small_cnn(), src)
    np.savez(tmp_path / "cal.npz", x=np.concatenate([f["x"] for f in _images(7, 8)]))
    js = tmp_path / "s.json"
    rc = main([str(src), str(out), "--config", "MXFP4E2M1_ADAQUANT", "--activation-config",
               "MXINT8", "--weight-rounding", "gptq", "--ff", "NumIterations=20", "--ff",
               "LearningRate=1e-3", "--calib", str(tmp_path / "cal.npz"), "--quiet",
               "--summary-json", str(js)])
    assert rc == 0 and out.exists()
    import json
    d = json.load(open(js))
    assert d["config"] == "A:MXINT8/W:MXFP4E2M1_ADAQUANT"
    assert d["tuning"]["algorithms"] == ["gptq", "adaquant"]
    assert all(c["iterations"] <= 20 for c in d["tuning"]["layers"])
    assert main([str(src), str(tmp_path / "r.onnx"), "--config", "MX6",
                 "--fast-finetune", "--quiet"]) == 2
    assert main([str(src), str(tmp_path / "r.onnx"), "--config", "MX6", "--ff", "Bad",
                 "--quiet"]) == 2


def test_demo_row_specs():
    from ort_mx_ops.quantizer.demo import parse_row
    assert parse_row("MXFP4E2M1/A=MXINT8+gptq+bc") == (
        "MXFP4E2M1", {"activation": "MXINT8", "weight_rounding": "gptq",
                      "bias_correction": True})
    assert parse_row("MX6_ADAQUANT") == ("MX6_ADAQUANT", {})
    assert parse_row("MX6+adaquant") == ("MX6", {"fast_finetune": True})
    with pytest.raises(ValueError, match="unknown algorithm 'foo'"):
        parse_row("MX6+foo")


def test_gram_form_matches_rows():
    from ort_mx_ops.quantizer.adaquant import _Gram, _loss
    rng = np.random.default_rng(8)
    layer = Layer("Conv", (6, 2, 3, 3), {"group": 3})
    x = rng.standard_normal((2, 6, 5, 5)).astype(np.float32)
    a, _ = layer.rows(x)
    y = rng.standard_normal((a.shape[1], 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    m = layer.weight_matrix(w)
    gram = _Gram(layer, [Sample(a[:, :7], y[:7]), Sample(a[:, 7:], y[7:])])
    np.testing.assert_allclose(gram.loss(m, b), _loss(layer, a, y, m, b), rtol=1e-5)
    gm, gb = gram.grad(m, b)
    dy = (layer.linear(a, m, b) - y) * (2.0 / y.size)
    gm_ref, gb_ref = layer.grad_linear(a, dy)
    np.testing.assert_allclose(gm, gm_ref, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(gb, gb_ref, rtol=1e-3, atol=1e-5)


def test_demo_rows_generic_mode(tmp_path):
    import json
    from ort_mx_ops.quantizer import demo
    src = tmp_path / "m.onnx"
    onnx.save(_small_cnn(), src)
    np.savez(tmp_path / "cal.npz", x=np.concatenate([f["x"] for f in _images(11, 24)]))
    np.savez(tmp_path / "ev.npz", x=np.concatenate([f["x"] for f in _images(12, 12)]))
    out = tmp_path / "res"
    rc = demo.main(["--model", str(src), "--configs", "MXFP4E2M1", "--data",
                    str(tmp_path / "ev.npz"), "--rows", "MXFP4E2M1+gptq",
                    "MXFP4E2M1_ADAQUANT", "--calib-data", str(tmp_path / "cal.npz"),
                    "--ff", "NumIterations=30", "--out-dir", str(out), "--quiet"])
    assert rc == 0
    rows = {r["config"]: r for r in json.loads((out / "demo.json").read_text())["rows"]}
    assert set(rows) == {"float32", "MXFP4E2M1", "MXFP4E2M1+gptq", "MXFP4E2M1_ADAQUANT"}
    cos = {k: r["metrics"]["cosine_to_float"] for k, r in rows.items()}
    assert cos["MXFP4E2M1+gptq"] > cos["MXFP4E2M1"]
    assert "| MXFP4E2M1+gptq |" in (out / "demo.md").read_text()


# -- the model-level guard ---------------------------------------------------------------------

def _hurting(real, hurt=lambda layer: True):
    """An adaquant_layer whose fit, where ``hurt(layer)``, is noise the per-layer guard
    accepted: finetuning made to hurt the whole model."""
    from ort_mx_ops.quantizer.adaquant import LayerFit

    def fit(layer, w, bias, quantize, train, hold, opts, rng, train_bias=True):
        if not hurt(layer):
            return real(layer, w, bias, quantize, train, hold, opts, rng, train_bias)
        noise = np.random.default_rng(0).standard_normal(w.shape).astype(np.float32)
        bad = (w + 2.0 * np.abs(w).max() * noise).astype(np.float32)
        return LayerFit(weight=bad, bias=None if bias is None else bias + 1.0,
                        train_before=1.0, train_after=0.5, hold_before=1.0, hold_after=0.5,
                        iterations=3, kept=True)
    return fit


def _arrays(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("mode", ["model", "layers"])
def test_model_guard_reverts_finetuning_that_hurts(monkeypatch, mode):
    from ort_mx_ops.quantizer import tuning
    monkeypatch.setattr(tuning, "adaquant_layer", _hurting(tuning.adaquant_layer))
    model = _small_cnn()
    cfg = get_config("MX6")
    opts = FastFinetune(num_iterations=10, model_guard=mode)
    tuned, report = tune_model(model, cfg, _images(13, 16), fast_finetune=opts)
    # Exactly the plain model's weights and biases.
    plain = _arrays(model)
    got = _arrays(tuned)
    assert got.keys() == plain.keys()
    for name in plain:
        np.testing.assert_array_equal(got[name], plain[name])
    g = report.model_guard
    assert g["kept"] == 0 and g["reverted"] == ["conv1", "conv2", "fc"] and g["samples"] == 4
    assert g["finetuned"]["rel_error"] > g["plain"]["rel_error"]
    assert g["final"] == g["plain"]
    for c in report.layers:
        assert "adaquant" not in c.applied and "adaquant (model guard)" in c.rejected
        assert c.err_after == c.err_before
    assert "kept 0 of 3 finetuned layers" in str(report)
    # Through quantize_model: the same quantized model as the config without AdaQuant.
    s = quantize_model(model, None, "MX6_ADAQUANT", _Reader(_images(13, 16)),
                       fast_finetune={"NumIterations": 10, "ModelGuard": mode})
    np.testing.assert_array_equal(_run(s.model, _images(14, 4)),
                                  _run(quantize_model(model, None, "MX6").model, _images(14, 4)))
    assert s.as_dict()["tuning"]["model_guard"]["kept"] == 0


def test_model_guard_keeps_finetuning_that_helps():
    model = _small_cnn()
    cfg = get_config("MXFP4E2M1").replace(activation=FormatSpec.from_name("MXINT8"), name="")
    opts = FastFinetune(num_iterations=200, learning_rate=1e-3, guard_metric="mse")
    tuned, report = tune_model(model, cfg, _images(1, 64), fast_finetune=opts)
    g = report.model_guard
    # Better on 13 of the 16 held-out samples, worse on 3: significant at 0.05.
    assert g["sign_test"]["better"] == 13 and g["sign_test"]["worse"] == 3
    assert np.isclose(g["sign_test"]["p"], sign_test(13, 3))
    finetuned = [c.node for c in report.layers if "adaquant" in c.applied]
    assert finetuned and g["kept"] == len(finetuned) == g["layers"] and g["reverted"] == []
    assert g["finetuned"]["rel_error"] < g["plain"]["rel_error"]
    assert g["final"] == g["finetuned"] and g["samples"] == 16
    # The guard scored the model that gets written: its error on the held-out samples.
    hold = sorted(np.random.default_rng(opts.fixed_seed).choice(64, size=16, replace=False))
    feeds = [_images(1, 64)[i] for i in hold]
    ref, out = _run(model, feeds), _run(quantize_model(tuned, None, cfg).model, feeds)
    assert np.isclose(g["final"]["rel_error"], np.sum((out - ref) ** 2.0) / np.sum(ref ** 2.0),
                      rtol=1e-5)
    changed = [n for n, a in _arrays(tuned).items()
               if not np.array_equal(a, _arrays(model)[n])]
    assert changed
    # Off: no guard ran, the same weights.
    off, rep_off = tune_model(model, cfg, _images(1, 64),
                              fast_finetune=opts.replace(model_guard="off"))
    assert rep_off.model_guard is None
    for name, a in _arrays(off).items():
        np.testing.assert_array_equal(a, _arrays(tuned)[name])


def test_model_guard_layers_reverts_only_the_layer_that_hurts(monkeypatch):
    from ort_mx_ops.quantizer import tuning
    hurt_conv2 = lambda layer: tuple(layer.weight_shape) == (32, 16, 3, 3)  # noqa: E731
    monkeypatch.setattr(tuning, "adaquant_layer",
                        _hurting(tuning.adaquant_layer, hurt_conv2))
    model = _small_cnn()
    cfg = get_config("MXFP4E2M1").replace(activation=FormatSpec.from_name("MXINT8"), name="")
    opts = FastFinetune(num_iterations=200, learning_rate=1e-3, model_guard="layers",
                        guard_metric="mse")
    tuned, report = tune_model(model, cfg, _images(1, 64), fast_finetune=opts)
    g = report.model_guard
    assert "conv2" in g["reverted"] and g["kept"] >= 1
    np.testing.assert_array_equal(_arrays(tuned)["w2"], _arrays(model)["w2"])
    np.testing.assert_array_equal(_arrays(tuned)["b2"], _arrays(model)["b2"])
    kept = [c.node for c in report.layers if "adaquant" in c.applied]
    assert kept and "conv2" not in kept
    assert g["final"]["rel_error"] < g["plain"]["rel_error"]
    # With the whole-model guard only, the hurting layer drags every layer back.
    _, rep = tune_model(model, cfg, _images(1, 64), fast_finetune=opts.replace(
        model_guard="model"))
    assert rep.model_guard["kept"] == 0


def test_model_guard_score_and_options():
    from ort_mx_ops.quantizer.tuning import _score
    ref = [[np.array([[0.1, 0.9], [0.8, 0.2]], np.float32)]]
    agree = [[np.array([[0.4, 0.6], [0.6, 0.4]], np.float32)]]    # both argmax right
    close = [[np.array([[0.1, 0.9], [0.45, 0.55]], np.float32)]]  # closer, one argmax wrong
    assert _score(agree, ref, "argmax") > _score(close, ref, "argmax")
    assert _score(close, ref, "mse") > _score(agree, ref, "mse")
    assert _score(ref, ref, "argmax") == (1.0, 0.0)
    with pytest.raises(ValueError, match="model_guard"):
        FastFinetune(model_guard="bogus")
    with pytest.raises(ValueError, match="guard_metric"):
        FastFinetune.from_options({"GuardMetric": "top5"})


def test_model_guard_needs_held_out_samples(monkeypatch):
    from ort_mx_ops.quantizer import tuning
    monkeypatch.setattr(tuning, "adaquant_layer", _hurting(tuning.adaquant_layer))
    # A single calibration sample: nothing held out whole, the guard says it skipped.
    _, report = tune_model(_small_cnn(), get_config("MX6"), _images(3, 1),
                           fast_finetune=FastFinetune(num_iterations=10))
    assert report.model_guard["result"].startswith("skipped") and \
        report.model_guard["samples"] == 0
    assert all("adaquant" in c.applied for c in report.layers)


def test_adaquant_speed_benchmark_protocol(tmp_path, capsys):
    """The benchmark against Quark: our side runs, and the subprocess protocol (calibration
    batches in, model and timing out) works with a stand-in for Quark's interpreter that
    writes the float model as its result."""
    import importlib.util
    import json
    import os
    import stat
    if importlib.util.find_spec("rapidocr_onnxruntime") is None:
        pytest.skip("rapidocr-onnxruntime (the benchmark's model) is not installed")
    from ort_mx_ops.benchmarks import adaquant_speed
    fake = tmp_path / "fake_python"
    fake.write_text(
        "#!/bin/sh\n"
        f"exec {os.sys.executable} -c '\n"
        "import json, shutil, sys, numpy as np\n"
        "a = dict(zip(sys.argv[2::2], sys.argv[3::2]))\n"
        "n = len(np.load(a[\"--calib\"]).files)\n"
        "shutil.copy(a[\"--model\"], a[\"--out\"])\n"
        "json.dump({\"seconds\": 2.5, \"quark\": \"stand-in\", \"torch\": str(n),\n"
        "           \"ff\": json.loads(a[\"--ff\"])}, open(a[\"--json\"], \"w\"))\n"
        "' \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "r.json"
    assert adaquant_speed.main(["--calib", "3", "--eval", "4", "--ff", "NumIterations=2",
                                "--no-plain", "--quark", str(fake), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["quantizer"] for r in rows] == ["ort_mx_ops", "quark stand-in (torch 3)"]
    assert rows[1]["seconds"] == 2.5 and rows[1]["top1_agreement"] == 1.0
    assert 0 <= rows[0]["top1_agreement"] <= 1 and rows[0]["seconds"] > 0
    assert "MXFP8E4M3_ADAQUANT: Quark 2.5 s / ours" in capsys.readouterr().out


def test_sign_test_values():
    from ort_mx_ops.quantizer.tuning import _paired, sign_test
    assert sign_test(0, 0) == 1.0
    assert sign_test(5, 0) == 1 / 32                 # the fewest samples that reach 0.05
    assert sign_test(4, 0) == 1 / 16
    assert np.isclose(sign_test(13, 2), (1 + 15 + 105) / 2 ** 15)
    assert np.isclose(sign_test(10, 5), 4944 / 32768)
    assert sign_test(0, 3) == 1.0
    # Positions (argmax agreement): fixed against broken, ties left out.
    new = np.array([1, 1, 0, 1, 1, 0, 1], bool)
    old = np.array([1, 0, 1, 0, 0, 0, 1], bool)
    assert _paired(new, old) == (3, 1, 5 / 16)
    # Samples (minus their error): larger is better.
    assert _paired(np.array([-0.1, -0.3, -0.2]), np.array([-0.2, -0.2, -0.2])) == (1, 1, 0.75)


def test_guard_units():
    """Under "argmax" the sign test counts every output position (an OCR line has many);
    under "mse", or where no output has a class axis, each sample's squared error."""
    from ort_mx_ops.quantizer.tuning import _units
    ref = [[np.array([[[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]])], [np.array([[[0.6, 0.4]]])]]
    out = [[np.array([[[0.2, 0.8], [0.4, 0.6], [0.3, 0.7]]])], [np.array([[[0.5, 0.5]]])]]
    np.testing.assert_array_equal(_units(out, ref, "argmax"), [True, False, True, True])
    np.testing.assert_allclose(_units(out, ref, "mse"), [-(0.02 + 0.32), -0.02])
    scalar = [[np.array([1.0])]], [[np.array([1.5])]]
    np.testing.assert_allclose(_units(scalar[1], scalar[0], "argmax"), [-0.25])


def test_model_guard_reverts_an_improvement_that_is_not_significant():
    """Finetuning that lowers the error on every held-out sample, but on 4 samples only: a
    sign test cannot reach 0.05 (p = 1/16), so the plain weights stay; without the test
    (guard_significance=1) the same finetuning is kept."""
    model = _small_cnn()
    cfg = get_config("MXFP4E2M1").replace(activation=FormatSpec.from_name("MXINT8"), name="")
    opts = FastFinetune(num_iterations=200, learning_rate=1e-3, guard_metric="mse")
    calib = _images(1, 16)
    tuned, report = tune_model(model, cfg, calib, fast_finetune=opts)
    g = report.model_guard
    assert g["samples"] == 4 and g["significance"] == 0.05 and g["metric"] == "mse"
    assert g["finetuned"]["rel_error"] < g["plain"]["rel_error"]
    assert g["sign_test"] == {"better": 4, "worse": 0, "p": 1 / 16, "unit": "samples"}
    assert g["kept"] == 0 and g["final"] == g["plain"]
    assert "sign test p 0.0625" in g["result"]
    for name, a in _arrays(tuned).items():
        np.testing.assert_array_equal(a, _arrays(model)[name])
    loose, rep = tune_model(model, cfg, calib,
                            fast_finetune=opts.replace(guard_significance=1.0))
    assert rep.model_guard["kept"] == rep.model_guard["layers"] > 0
    assert rep.model_guard["final"] == rep.model_guard["finetuned"]
    assert any(not np.array_equal(a, _arrays(model)[n]) for n, a in _arrays(loose).items())
    # Under "argmax" the test counts argmax agreement alone: on 16 held-out samples the same
    # kind of finetuning agrees with float on 15 (plain 13) and has a lower error, but it is
    # fixes 3 positions (one per sample) and breaks 1 (p = 5/16): the plain weights stay.
    _, rep = tune_model(model, cfg, _images(1, 64), fast_finetune=opts.replace(
        guard_metric="argmax"))
    g = rep.model_guard
    assert g["finetuned"]["agreement"] == 15 / 16 and g["plain"]["agreement"] == 13 / 16
    assert g["finetuned"]["rel_error"] < g["plain"]["rel_error"]
    assert g["sign_test"] == {"better": 3, "worse": 1, "p": 5 / 16, "unit": "positions"}
    assert g["kept"] == 0
    # The CLI / Quark-style name.
    assert FastFinetune.from_options({"GuardSignificance": 0.2}).guard_significance == 0.2
    with pytest.raises(ValueError, match="guard_significance"):
        FastFinetune(guard_significance=0.0)


def test_model_guard_is_deterministic():
    model = _small_cnn()
    cfg = get_config("MXFP4E2M1").replace(activation=FormatSpec.from_name("MXINT8"), name="")
    opts = FastFinetune(num_iterations=200, learning_rate=1e-3, guard_metric="mse")
    runs = [tune_model(model, cfg, _images(1, 64), fast_finetune=opts) for _ in range(2)]
    assert runs[0][1].model_guard == runs[1][1].model_guard
    assert runs[0][1].model_guard["kept"] > 0
    for ta, tb in zip(runs[0][0].graph.initializer, runs[1][0].graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(ta), numpy_helper.to_array(tb))
