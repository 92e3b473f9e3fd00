"""Sensitivity analysis and automatic mixed precision on small models.

Every fidelity the search reports is checked here against the written model run through
onnxruntime with the library, scored by hand; bits are checked against hand-computed values.
"""
from __future__ import annotations

import json
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ort_mx_ops
from ort_mx_ops.quantizer import quantize_model, FormatSpec
from ort_mx_ops.quantizer.mixed_precision import (auto_mixed_precision, bits_accounting,
                                                  MIXED_CONFIGS)
from ort_mx_ops.quantizer.sensitivity import (TrialModel, MixedSite, analyze_sensitivity,
                                              resolve_candidates, resolve_metric,
                                              top1_agreement, mean_cosine, sqnr_db)

from test_quantizer_models import conv_model, matmul_model


class Reader:
    """Seeded calibration batches of one sample each for the named inputs and shapes."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], n: int = 6, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.batches = [{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
                        for _ in range(n)]
        self.all = list(self.batches)

    def get_next(self):
        return self.batches.pop(0) if self.batches else None


CONV_IN = {"x": (1, 8, 10, 10)}
MATMUL_IN = {"x": (1, 5, 32), "x2": (1, 32)}


def run_model(model: onnx.ModelProto, feeds: list[dict]) -> list[list[np.ndarray]]:
    so = ort.SessionOptions()
    ort_mx_ops.register(so)
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return [sess.run(None, f) for f in feeds]


def cosine_by_hand(ref: list[list[np.ndarray]], out: list[list[np.ndarray]]) -> float:
    sims = []
    for r, o in zip(ref, out):
        a, b = r[0].astype(np.float64).ravel(), o[0].astype(np.float64).ravel()
        sims.append(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return float(np.mean(sims))


# -- metrics -------------------------------------------------------------------------------
def test_metrics_hand_computed():
    f = [[np.array([[1.0, 2.0, 0.0], [3.0, 0.0, 1.0]])]]
    q = [[np.array([[1.0, 0.5, 2.0], [3.0, 0.0, 1.0]])]]
    # argmax rows: float (1, 0), quantized (2, 0): one of two agrees.
    assert top1_agreement(f, q) == 0.5
    cos_row0 = (1 + 1 + 0) / (math.sqrt(5) * math.sqrt(1 + 0.25 + 4))
    assert mean_cosine(f, q) == pytest.approx((cos_row0 + 1.0) / 2, abs=1e-12)
    # signal 1+4+9+1 = 15, noise 1.5^2 + 2^2 = 6.25
    assert sqnr_db(f, q) == pytest.approx(10 * math.log10(15 / 6.25), abs=1e-12)
    assert sqnr_db(f, f) == 300.0
    m = resolve_metric(lambda a, b: 0.25)
    assert m.fn(f, q) == 0.25 and not m.first_output_only
    with pytest.raises(ValueError, match="metric must be"):
        resolve_metric("l2")


# -- the trial model -----------------------------------------------------------------------
@pytest.mark.parametrize("builder, shapes", [(conv_model, CONV_IN), (matmul_model, MATMUL_IN)])
@pytest.mark.parametrize("name", ["MXFP4E2M1", "MXFP6E2M3", "MXINT8", "BF16", "MX6", "BFP16"])
def test_trial_model_equals_written_model(builder, shapes, name):
    """Every tensor in one format through the trial model's switches gives the outputs of
    quantize_model's model (the search scores what it will write): the folded weights it
    feeds are bit-identical to the written ones; the outputs agree to float32 rounding
    (onnxruntime may sum in another order when a weight is a graph input)."""
    reader = Reader(shapes, n=3)
    cands = resolve_candidates([name])
    trial = TrialModel(builder(), reader, cands, resolve_metric(lambda a, b: 0.0),
                       max_batch=1)
    got = trial.outputs([cands[0]] * len(trial.sites))
    ref = run_model(quantize_model(builder(), None, name).model, reader.all)
    assert len(got) == len(ref) == 3
    for g, r in zip(got, ref):
        for a, b in zip(g, r):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * float(np.abs(b).max()))
    written = {i.name: onnx.numpy_helper.to_array(i)
               for i in quantize_model(builder(), None, name).model.graph.initializer}
    for site in trial.sites:
        if site.kind == "weight" and site.tensor in written:
            np.testing.assert_array_equal(trial.folded(site, cands[0]), written[site.tensor])


def test_calibration_batches_are_stacked_when_the_batch_axis_is_dynamic():
    reader = Reader(CONV_IN, n=5)
    trial = TrialModel(conv_model(), reader, resolve_candidates(["MXINT8"]),
                       resolve_metric("top1"), max_batch=2)
    assert [b["x"].shape[0] for b in trial.batches] == [2, 2, 1]
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in trial.batches]),
                                  np.concatenate([b["x"] for b in reader.all]))
    # A batch axis written as -1 (as some exporters do) is dynamic too.
    m = conv_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    again = TrialModel(m, Reader(CONV_IN, n=5), resolve_candidates(["MXINT8"]),
                       resolve_metric("top1"), max_batch=4)
    assert [b["x"].shape[0] for b in again.batches] == [4, 1]
    # Activation sizes at the first batch's shape (2 samples): conv1 reads x (2*8*10*10).
    sizes = {s.tensor: s.numel for s in trial.sites}
    assert sizes["x"] == 2 * 8 * 100 and sizes["w1"] == 16 * 8 * 9 and sizes["w2"] == 16 * 9


# -- sensitivity ---------------------------------------------------------------------------
def test_sensitivity_values_are_one_tensor_quantized(tmp_path):
    reader = Reader(CONV_IN, n=4)
    report = analyze_sensitivity(conv_model(), reader, ["MXFP4E2M1", "MXINT8"], "cosine")
    assert {s.tensor for s in report.sites} == {"x", "w1", "r1", "w2", "r2", "w3"}
    # w1 alone in MXFP4E2M1: the same model written with only conv1's weight quantized.
    only_w1 = quantize_model(conv_model(), None, "MXFP4E2M1", activation=None,
                             nodes_to_exclude=["conv2", "conv3"]).model
    ref = run_model(conv_model(), reader.all)
    expected = cosine_by_hand(ref, run_model(only_w1, reader.all))
    w1 = next(s.index for s in report.sites if s.tensor == "w1")
    assert report.fidelity[w1]["MXFP4E2M1"] == pytest.approx(expected, abs=1e-6)
    assert expected < 1.0
    # Ranked most damaging first at the cheapest format.
    ranked = [report.fidelity[i]["MXFP4E2M1"] for i in report.ranking()]
    assert ranked == sorted(ranked)
    report.save_json(tmp_path / "s.json")
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["metric"] == "cosine" and len(data["sites"]) == 6
    assert data["bits"] == {"MXFP4E2M1": 4.25, "MXINT8": 8.25}
    text = report.table()
    assert "MXFP4E2M1 (4.25 b)" in text and "conv1" in text


def test_sensitivity_heatmap_png(tmp_path):
    pytest.importorskip("matplotlib")
    report = analyze_sensitivity(conv_model(), Reader(CONV_IN, n=2), ["MXFP6E2M3", "BF16"])
    report.save_heatmap(str(tmp_path / "h.png"))
    assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sensitivity_needs_calibration_data():
    with pytest.raises(ValueError, match="calibration_data_reader"):
        analyze_sensitivity(conv_model(), None)
    with pytest.raises(ValueError, match="no batches"):
        analyze_sensitivity(conv_model(), Reader(CONV_IN, n=0))


# -- bits ----------------------------------------------------------------------------------
def test_bits_accounting_hand_computed():
    fp4, int8, bf16 = (FormatSpec.from_name(n) for n in ("MXFP4E2M1", "MXINT8", "BF16"))
    sites = [MixedSite(0, "w1", "weight", 1, False, ["a"], ["Conv"], numel=1152),
             MixedSite(1, "w2", "weight", 1, True, ["b"], ["Conv"], numel=144),
             MixedSite(2, "w3", "weight", 1, False, ["c"], ["Conv"], numel=64),
             MixedSite(3, "x", "activation", 1, False, ["a"], ["Conv"], numel=800),
             MixedSite(4, "r", "activation", 1, False, ["b"], ["Conv"], numel=1600)]
    wb, ab = bits_accounting(sites, [fp4, None, int8, bf16, fp4])
    # MXFP4: 4 + 8/32 = 4.25; MXINT8: 8 + 8/32 = 8.25; float: 32; BF16: 16.
    assert wb == pytest.approx((1152 * 4.25 + 144 * 32 + 64 * 8.25) / 1360)
    assert wb == pytest.approx(10032 / 1360)
    assert ab == pytest.approx((800 * 16 + 1600 * 4.25) / 2400)
    assert bits_accounting(sites[:3], [fp4] * 3) == (4.25, 0.0)


def test_cheapest_candidates_without_a_target_and_presets(tmp_path):
    """No target: every tensor in its cheapest candidate; BF16_MIXED_BFP16 is BFP16
    (8 mantissa-and-sign bits + an 8-bit exponent per 8 elements = 9 bits) everywhere."""
    out = tmp_path / "m.onnx"
    s = auto_mixed_precision(conv_model(), out, Reader(CONV_IN), "BF16_MIXED_BFP16")
    assert MIXED_CONFIGS["BF16_MIXED_BFP16"] == ("BFP16", "BF16")
    assert set(s.assignment.values()) == {"BFP16"}
    assert s.weight_bits == 9.0 and s.activation_bits == 9.0 and s.met
    written = onnx.load(str(out))
    ref = quantize_model(conv_model(), None, "BFP16").model
    feeds = Reader(CONV_IN, seed=5).all
    for a, b in zip(run_model(written, feeds), run_model(ref, feeds)):
        np.testing.assert_array_equal(a[0], b[0])
    s = auto_mixed_precision(conv_model(), None, Reader(CONV_IN), "BF16_MIXED_MXINT8")
    assert set(s.assignment.values()) == {"MXINT8"} and s.weight_bits == 8.25
    with pytest.raises(ValueError, match="BF16_MIXED_BFP16"):
        auto_mixed_precision(conv_model(), None, Reader(CONV_IN), "MX9_MIXED")


# -- the search ----------------------------------------------------------------------------
@pytest.mark.parametrize("builder, shapes", [(conv_model, CONV_IN), (matmul_model, MATMUL_IN)])
@pytest.mark.parametrize("target", [0.99, 0.999, 0.9999])
def test_search_meets_its_target_on_the_calibration_data(builder, shapes, target):
    reader = Reader(shapes, n=6)
    s = auto_mixed_precision(builder(), None, reader, ["MXFP4E2M1", "MXFP6E2M3", "MXINT8",
                                                       "BF16"], target, "cosine")
    assert s.met and s.achieved >= target
    # The written model, run with the library and scored by hand on the same data.
    got = cosine_by_hand(run_model(builder(), reader.all), run_model(s.model, reader.all))
    assert got >= target
    assert got == pytest.approx(s.achieved, abs=1e-9)
    # Not everything at the most precise candidate: the search saved bits.
    assert s.weight_bits + s.activation_bits < 32.0
    assert set(s.assignment.values()) <= {"MXFP4E2M1", "MXFP6E2M3", "MXINT8", "BF16"}


def test_search_picks_the_cheaper_format_when_both_meet_the_target():
    reader = Reader(CONV_IN, n=6)
    ref = run_model(conv_model(), reader.all)
    fp6 = cosine_by_hand(ref, run_model(quantize_model(conv_model(), None, "MXFP6E2M3").model,
                                        reader.all))
    int8 = cosine_by_hand(ref, run_model(quantize_model(conv_model(), None, "MXINT8").model,
                                         reader.all))
    target = fp6 - 1e-3  # both whole-model assignments meet it
    assert int8 >= target
    s = auto_mixed_precision(conv_model(), None, reader, ["MXINT8", "MXFP6E2M3"], target,
                             "cosine")
    assert set(s.assignment.values()) == {"MXFP6E2M3"}
    assert s.weight_bits == 6.25 and s.activation_bits == 6.25
    # Just above what MXFP6 everywhere reaches, some tensors must stay MXINT8.
    s = auto_mixed_precision(conv_model(), None, Reader(CONV_IN, n=6), ["MXINT8", "MXFP6E2M3"],
                             fp6 + 1e-4, "cosine")
    assert s.met and "MXINT8" in s.assignment.values()
    assert 6.25 < max(s.weight_bits, s.activation_bits) <= 8.25


def test_search_with_top1_sqnr_and_a_callable_metric():
    reader = Reader(MATMUL_IN, n=4)
    s = auto_mixed_precision(matmul_model(), None, reader, ["MXFP4E2M1", "MXINT8"], 30.0,
                             "sqnr")
    ref = run_model(matmul_model(), reader.all)
    out = run_model(s.model, reader.all)
    assert s.met and sqnr_db(ref, out) >= 30.0
    calls = []

    def worst_row_cosine(f, q):
        calls.append(len(f[0]))  # every output is passed to a callable
        return min(float(np.dot(a[0].ravel(), b[0].ravel()) /
                         np.linalg.norm(a[0]) / np.linalg.norm(b[0])) for a, b in zip(f, q))

    s = auto_mixed_precision(matmul_model(), None, Reader(MATMUL_IN, n=4),
                             ["MXFP4E2M1", "MXINT8"], 0.999, worst_row_cosine)
    assert s.met and s.achieved >= 0.999 and calls and set(calls) == {2}
    s = auto_mixed_precision(conv_model(), None, Reader(CONV_IN, n=4), ["MXFP4E2M1", "BF16"],
                             1.0, "top1")
    assert s.met and s.achieved == 1.0


def test_unreachable_target_writes_the_most_precise_candidates():
    s = auto_mixed_precision(conv_model(), None, Reader(CONV_IN), ["MXFP4E2M1", "MXFP6E2M3"],
                             0.999999, "cosine")
    assert not s.met and set(s.assignment.values()) == {"MXFP6E2M3"}
    assert s.weight_bits == 6.25


# -- named configs and the command line ----------------------------------------------------
def test_mx9_int8_and_searched_presets_by_name():
    from ort_mx_ops.quantizer import get_config
    cfg = get_config("mx9_int8")
    assert (cfg.activation.name, cfg.weight.name, cfg.name) == ("MX9", "MXINT8", "MX9_INT8")
    s = quantize_model(conv_model(), None, "MX9_INT8")
    formats = {r.tensor: r.format for r in s.sites}
    assert formats == {"x": "MX9", "r1": "MX9", "r2": "MX9", "w1": "MXINT8", "w2": "MXINT8",
                       "w3": "MXINT8"}
    s = quantize_model(conv_model(), None, "BF16_MIXED_MXINT8", Reader(CONV_IN), target=1.0,
                       metric="top1")
    assert s.met and set(s.assignment.values()) <= {"MXINT8", "BF16"}


def test_cli_analyze_and_auto_mixed_precision(tmp_path, capsys):
    from ort_mx_ops.quantizer.cli import main
    model = tmp_path / "conv.onnx"
    onnx.save(conv_model(), str(model))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((6, 8, 10, 10)).astype(np.float32))
    calib = str(tmp_path / "calib.npz")
    assert main([str(model), "--analyze", "--calib", calib, "--candidates", "MXFP4E2M1",
                 "MXINT8", "--metric", "cosine", "--analysis-json", str(tmp_path / "a.json"),
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "MXFP4E2M1 (4.25 b)" in out and "conv1" in out
    data = json.loads((tmp_path / "a.json").read_text())
    assert len(data["sites"]) == 6 and data["metric"] == "cosine"
    assert main([str(model), str(tmp_path / "m.onnx"), "--auto-mixed-precision", "--calib",
                 calib, "--candidates", "MXFP6E2M3", "MXINT8", "--target", "0.999",
                 "--metric", "cosine", "--summary-json", str(tmp_path / "s.json"),
                 "--quiet"]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["met"] and summary["achieved"] >= 0.999
    assert 6.25 <= summary["weight_bits"] <= 8.25
    # The written model runs with the library and meets the target on the same data.
    feeds = [{"x": a[None]} for a in np.load(calib)["x"]]
    got = cosine_by_hand(run_model(conv_model(), feeds),
                         run_model(onnx.load(str(tmp_path / "m.onnx")), feeds))
    assert got >= 0.999
    assert main([str(model), "--analyze", "--quiet"]) == 2
    assert "calibration_data_reader" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(model), "--calib", calib])  # neither --config nor a search


def test_weights_objective_spends_the_budget_on_weights_first():
    cands = ["MXFP4E2M1", "MXFP6E2M3", "MXINT8", "BF16"]
    total = auto_mixed_precision(conv_model(), None, Reader(CONV_IN), cands, 0.999, "cosine")
    weights = auto_mixed_precision(conv_model(), None, Reader(CONV_IN), cands, 0.999,
                                   "cosine", objective="weights")
    assert total.met and weights.met and weights.achieved >= 0.999
    assert weights.weight_bits < total.weight_bits  # 6.56 vs 8.25 on this model
    with pytest.raises(ValueError, match="objective"):
        auto_mixed_precision(conv_model(), None, Reader(CONV_IN), cands, 0.99, objective="size")


# -- GPTQ rounding in the search -------------------------------------------------------------
def parallel_model() -> onnx.ModelProto:
    """x (B, 64) -> MatMul W1 (strong) and MatMul W2 (100x weaker), added: y (B, 32).  Both
    layers read the graph input, so each one's GPTQ Hessian depends on x alone."""
    from onnx import TensorProto, helper
    from test_quantizer_models import _model, _w
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["a"], name="strong"),
             helper.make_node("MatMul", ["x", "W2"], ["b"], name="weak"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    f = TensorProto.FLOAT
    return _model(nodes, [helper.make_tensor_value_info("x", f, ["B", 64])],
                  [helper.make_tensor_value_info("y", f, ["B", 32])],
                  {"W1": _w(rng, 64, 32), "W2": _w(rng, 64, 32) * np.float32(0.01)})


class Correlated(Reader):
    """Four batches of 32 rows with correlated features (where GPTQ's error feedback pays);
    batches of the largest stacked size, so the search sees exactly these batches."""

    def __init__(self, seed: int = 0):
        super().__init__({"x": (32, 64)}, n=4, seed=seed)
        mix = np.random.default_rng(9).standard_normal((64, 64)).astype(np.float32)
        self.batches = [{"x": b["x"] @ mix / np.float32(8)} for b in self.batches]
        self.all = list(self.batches)


def _weight_of(model: onnx.ModelProto, node_name: str) -> np.ndarray:
    from onnx import numpy_helper
    node = next(n for n in model.graph.node if n.name == node_name)
    init = next(i for i in model.graph.initializer if i.name == node.input[1])
    return numpy_helper.to_array(init)


def test_gptq_rounding_follows_the_per_layer_assignment():
    """With weight_rounding="gptq" each written weight is what quantize_model with GPTQ
    writes for that layer in the format the search gave it (both layers read x, in the same
    format as in the mixed model), not the nearest rounding; weight_bits is hand-computed."""
    cands = ["MXFP4E2M1", "MXINT8"]
    s = auto_mixed_precision(parallel_model(), None, Correlated(), cands, 30.0, "sqnr",
                             max_batch=32, weight_rounding="gptq")
    # The strong layer needs MXINT8 (MXFP4 costs ~20 dB), the weak one does not.
    assert s.assignment == {"x": "MXINT8", "W1": "MXINT8", "W2": "MXFP4E2M1"}
    assert s.met and s.weight_rounding == "gptq" and s.as_dict()["weight_rounding"] == "gptq"
    assert s.weight_bits == (2048 * 8.25 + 2048 * 4.25) / 4096 == 6.25
    assert s.activation_bits == 8.25
    assert s.tuning is not None and s.tuning.algorithms == ["gptq"]
    for layer, fmt in (("strong", "MXINT8"), ("weak", "MXFP4E2M1")):
        uniform = quantize_model(parallel_model(), None, fmt, Correlated(),
                                 activation="MXINT8", weight_rounding="gptq").model
        np.testing.assert_array_equal(_weight_of(s.model, layer), _weight_of(uniform, layer))
    nearest = quantize_model(parallel_model(), None, "MXFP4E2M1", activation="MXINT8").model
    assert not np.array_equal(_weight_of(s.model, "weak"), _weight_of(nearest, "weak"))
    # The reported fidelity is the written model's, run with the library.
    ref = run_model(parallel_model(), Correlated().all)
    assert sqnr_db(ref, run_model(s.model, Correlated().all)) == pytest.approx(s.achieved,
                                                                                abs=1e-9)


def test_gptq_search_scores_the_gptq_rounded_weights():
    """The sensitivity of a weight in a cheaper format is that of its GPTQ-rounded values
    (as quantize_model writes them, weights only), which beat nearest rounding here."""
    cands = ["MXFP4E2M1", "MXINT8"]
    runs = {r: auto_mixed_precision(parallel_model(), None, Correlated(), cands, 30.0, "sqnr",
                                    max_batch=32, weight_rounding=r)
            for r in ("nearest", "gptq")}
    idx = next(i for i, site in enumerate(runs["gptq"].sensitivity.sites)
               if site.tensor == "W1")
    ref = run_model(parallel_model(), Correlated().all)
    for rounding, s in runs.items():
        written = quantize_model(parallel_model(), None, "MXFP4E2M1", Correlated(),
                                 activation=None, weight_rounding=rounding,
                                 tensor_formats={"W2": None}).model
        got = sqnr_db(ref, run_model(written, Correlated().all))
        assert s.sensitivity.fidelity[idx]["MXFP4E2M1"] == pytest.approx(got, abs=1e-6)
    assert runs["gptq"].sensitivity.fidelity[idx]["MXFP4E2M1"] > \
        runs["nearest"].sensitivity.fidelity[idx]["MXFP4E2M1"] + 1.0
    with pytest.raises(ValueError, match="weight_rounding"):
        auto_mixed_precision(parallel_model(), None, Correlated(), cands, 30.0, "sqnr",
                             weight_rounding="adaround")


def test_cli_auto_mixed_precision_with_gptq(tmp_path):
    """``--weight-rounding gptq`` reaches the search: the same data in an .npz (one sample
    per batch, stacked back to 32) writes the weights the API writes."""
    from ort_mx_ops.quantizer.cli import main
    model = tmp_path / "par.onnx"
    onnx.save(parallel_model(), str(model))
    np.savez(tmp_path / "calib.npz", x=np.concatenate([b["x"] for b in Correlated().all]))
    assert main([str(model), str(tmp_path / "m.onnx"), "--auto-mixed-precision", "--calib",
                 str(tmp_path / "calib.npz"), "--candidates", "MXFP4E2M1", "MXINT8",
                 "--target", "30", "--metric", "sqnr", "--max-batch", "32",
                 "--weight-rounding", "gptq", "--summary-json", str(tmp_path / "s.json"),
                 "--quiet"]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["weight_rounding"] == "gptq" and summary["weight_bits"] == 6.25
    api = auto_mixed_precision(parallel_model(), None, Correlated(), ["MXFP4E2M1", "MXINT8"],
                               30.0, "sqnr", max_batch=32, weight_rounding="gptq")
    written = onnx.load(str(tmp_path / "m.onnx"))
    for layer in ("strong", "weak"):
        np.testing.assert_array_equal(_weight_of(written, layer), _weight_of(api.model, layer))
