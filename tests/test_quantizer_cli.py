"""The ort-mx-quantize command line and the demo's decoding, metrics and generic mode."""
from __future__ import annotations

import json

import numpy as np
import onnx

from ort_mx_ops.quantizer import cli, demo
from ort_mx_ops.quantizer.ocr_data import ctc_greedy_decode, edit_distance

from test_quantizer_models import conv_model, feeds_for


def test_cli_quantizes_and_prints_summary(tmp_path, capsys):
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(conv_model(), str(src))
    rc = cli.main([str(src), str(dst), "--config", "MX6", "--exclude", "conv3",
                   "--summary-json", str(tmp_path / "s.json")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "quantized with MX6" in out and "depthwise Conv weight" in out
    summary = json.loads((tmp_path / "s.json").read_text())
    assert {s["tensor"] for s in summary["sites"]} == {"x", "w1", "r1", "w2"}
    onnx.checker.check_model(str(dst))


def test_cli_mixed_formats_and_bf16_calibration(tmp_path, capsys):
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(conv_model(), str(src))
    np.savez(tmp_path / "calib.npz", x=np.concatenate([feeds_for("conv", s)["x"]
                                                       for s in range(3)]))
    rc = cli.main([str(src), str(dst), "--config", "BF16", "--weight-config", "MXINT8",
                   "--bf16-activation-scaled", "--calib", str(tmp_path / "calib.npz"),
                   "--quiet", "--summary-json", str(tmp_path / "s.json")])
    assert rc == 0
    sites = json.loads((tmp_path / "s.json").read_text())["sites"]
    assert {(s["kind"], s["format"]) for s in sites} == {("activation", "BF16"),
                                                          ("weight", "MXINT8")}
    x_site = next(s for s in sites if s["tensor"] == "x")
    x_max = max(float(np.abs(feeds_for("conv", s)["x"]).max()) for s in range(3))
    assert abs(x_site["bf16_scale"] - x_max) <= 1e-6 * x_max


def test_cli_errors_are_reported_not_raised(tmp_path, capsys):
    src = tmp_path / "f.onnx"
    onnx.save(conv_model(), str(src))
    assert cli.main([str(src), str(tmp_path / "q.onnx"), "--config", "FP3"]) == 2
    assert "unknown quantization config 'FP3'" in capsys.readouterr().err
    assert cli.main([str(src), str(src), "--config", "MX6"]) == 2
    assert "refusing to write" in capsys.readouterr().err


def test_ctc_greedy_decode_and_edit_distance():
    chars = ["a", "b", "c", " "]
    # time steps: a a blank b b c blank c -> "abcc"
    seq = [1, 1, 0, 2, 2, 3, 0, 3]
    probs = np.eye(5, dtype=np.float32)[seq][None]
    assert ctc_greedy_decode(probs, chars) == ["abcc"]
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3 and edit_distance("same", "same") == 0


def test_demo_generic_mode_writes_tables(tmp_path, capsys):
    src = tmp_path / "f.onnx"
    onnx.save(conv_model(), str(src))
    out_dir = tmp_path / "res"
    rc = demo.main(["--model", str(src), "--configs", "MXINT8", "MXFP4E2M1", "--samples", "3",
                    "--out-dir", str(out_dir), "--quiet"])
    assert rc == 0
    table = json.loads((out_dir / "demo.json").read_text())["rows"]
    assert [r["config"] for r in table] == ["float32", "MXINT8", "MXFP4E2M1"]
    cos = {r["config"]: r["metrics"]["cosine_to_float"] for r in table}
    assert cos["float32"] == 1.0 and 0.5 < cos["MXFP4E2M1"] < cos["MXINT8"] < 1.0
    assert "| MXINT8 |" in (out_dir / "demo.md").read_text()


def test_demo_reads_npz_samples_one_at_a_time(tmp_path):
    src = tmp_path / "f.onnx"
    onnx.save(conv_model(), str(src))
    x = np.random.default_rng(0).standard_normal((3, 8, 10, 10)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    task = demo.GenericTask(str(src), str(tmp_path / "x.npz"), samples=99, seed=0)
    assert task.description.startswith("3 samples")
    assert [f["x"].shape for f in task.feeds] == [(1, 8, 10, 10)] * 3
    np.testing.assert_array_equal(np.concatenate([f["x"] for f in task.feeds]), x)
