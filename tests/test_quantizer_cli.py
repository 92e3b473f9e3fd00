"""The ort-mx-quantize command line and the demo's decoding, metrics and generic mode."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ort_mx_ops
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


def test_cli_bf16_fused(tmp_path, capsys):
    src, pair, fused = tmp_path / "f.onnx", tmp_path / "pair.onnx", tmp_path / "fused.onnx"
    onnx.save(conv_model(), str(src))
    assert cli.main([str(src), str(pair), "--config", "BF16", "--no-fold", "--quiet"]) == 0
    assert cli.main([str(src), str(fused), "--config", "BF16", "--no-fold", "--bf16-fused",
                     "--quiet"]) == 0
    ops = [n.op_type for n in onnx.load(str(fused)).graph.node]
    assert ops.count("BF16QuantizeDequantize") == 6 and "ExtendedQuantizeLinear" not in ops
    sessions = [ort.InferenceSession(str(p), ort_mx_ops.register(ort.SessionOptions()),
                                     providers=["CPUExecutionProvider"]) for p in (pair, fused)]
    feeds = feeds_for("conv")
    a, b = (s.run(None, feeds)[0] for s in sessions)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    line = _cli_error([src, tmp_path / "x.onnx", "--config", "BF16", "--bf16-fused",
                       "--bf16-cast"], capsys)
    assert "--bf16-cast and --bf16-fused are two forms of BF16" in line, line
    assert not (tmp_path / "x.onnx").exists()


def test_cli_errors_are_reported_not_raised(tmp_path, capsys):
    src = tmp_path / "f.onnx"
    onnx.save(conv_model(), str(src))
    assert "--config: unknown config 'FP3'" in _cli_error(
        [src, tmp_path / "q.onnx", "--config", "FP3"], capsys)
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
    assert table[0]["latency_vs_float"] == 1.0
    assert all(r["latency_ms"] > 0 and r["latency_vs_float"] > 0 for r in table)
    assert "| MXINT8 |" in (out_dir / "demo.md").read_text()


def test_demo_times_models_interleaved_with_paired_ratios(tmp_path):
    src = tmp_path / "f.onnx"
    onnx.save(conv_model(), str(src))
    feeds = [{"x": np.ones((1, 8, 10, 10), np.float32)}] * 2
    # The same model twice: one latency per model, and the reference's paired ratio is 1.
    timed = demo.time_interleaved([(str(src), False), (str(src), True)], feeds, 1, rounds=2)
    assert len(timed) == 2
    assert timed[0][1] == 1.0 and all(ms > 0 and ratio > 0 for ms, ratio in timed)


def test_demo_without_timing_leaves_latency_columns_empty(tmp_path):
    src = tmp_path / "f.onnx"
    onnx.save(conv_model(), str(src))
    out_dir = tmp_path / "res"
    rc = demo.main(["--model", str(src), "--configs", "MXINT8", "--samples", "2",
                    "--timing-rounds", "0", "--out-dir", str(out_dir), "--quiet"])
    assert rc == 0
    table = json.loads((out_dir / "demo.json").read_text())["rows"]
    assert [(r["latency_ms"], r["latency_vs_float"]) for r in table] == [(None, None)] * 2
    assert "| MXINT8 | default |" in (out_dir / "demo.md").read_text()


def test_demo_reads_npz_samples_one_at_a_time(tmp_path):
    src = tmp_path / "f.onnx"
    onnx.save(conv_model(), str(src))
    x = np.random.default_rng(0).standard_normal((3, 8, 10, 10)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    task = demo.GenericTask(str(src), str(tmp_path / "x.npz"), samples=99, seed=0)
    assert task.description.startswith("3 samples")
    assert [f["x"].shape for f in task.feeds] == [(1, 8, 10, 10)] * 3
    np.testing.assert_array_equal(np.concatenate([f["x"] for f in task.feeds]), x)


# ------------------------------------------------------------------------------------------
# every error: one line on stderr, exit status 2, naming the flag at fault
# ------------------------------------------------------------------------------------------

def _cli_error(argv, capsys) -> str:
    """Run the CLI, expecting an error: returns its one stderr line."""
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as exc:  # the parser's errors exit, with the same one line
        rc = exc.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2, (rc, captured.err)
    assert len(lines) == 1 and lines[0].startswith("ort-mx-quantize: error: "), captured.err
    assert captured.out == ""
    return lines[0]


def test_cli_error_paths_name_the_flag(tmp_path, capsys, monkeypatch):
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(conv_model(), str(src))
    opset12 = tmp_path / "f12.onnx"
    onnx.save(conv_model(opset=12), str(opset12))
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"this is not an onnx model\n" * 10)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    bad_npz = tmp_path / "bad.npz"
    bad_npz.write_bytes(b"not a zip")
    good_npz = tmp_path / "calib.npz"
    np.savez(good_npz, x=feeds_for("conv")["x"])
    (tmp_path / "fake_reader_mod.py").write_text(
        "def make():\n    return object()\n\ndef boom():\n    raise OSError('disk gone')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = [
        ([corrupt, dst, "--config", "MX6"], "corrupt.onnx is not a readable ONNX model"),
        ([tmp_path / "none.onnx", dst, "--config", "MX6"], "model file not found"),
        ([empty, dst, "--config", "MX6"], "empty.onnx is not an ONNX model (it has no graph)"),
        ([tmp_path, dst, "--config", "MX6"], "is not a file"),
        ([src, dst], "--config"),                                      # missing flag
        ([src, dst, "--config", "FP3"], "--config: unknown config 'FP3'"),
        ([src, dst, "--config", "none"], "--config: unknown config 'none'"),
        ([src, dst, "--config", "MX6", "--weight-config", "MX7"], "--weight-config: unknown"),
        ([src, dst, "--config", "MX6", "--activation-config", "int4"],
         "--activation-config: unknown"),
        ([src, dst, "--config", "MX6", "--activation-config", "none", "--weight-config",
          "none"], "--activation-config none and --weight-config none"),
        ([src, dst, "--config", "MX6", "--placement", "fancy"], "--placement"),
        ([src, dst, "--config", "BF16", "--bf16-activation-scaled"],
         "--bf16-activation-scaled needs --calib or --calib-reader"),
        ([src, dst, "--config", "BF16", "--bf16-activation-scaled", "--calib",
          tmp_path / "missing.npz"], "--calib: cannot read"),
        ([src, dst, "--config", "BF16", "--bf16-activation-scaled", "--calib", bad_npz],
         "--calib: cannot read"),
        ([src, dst, "--config", "BF16", "--bf16-activation-scaled", "--calib", good_npz,
          "--calib-batch", "0"], "--calib-batch: must be an integer >= 1"),
        ([src, dst, "--config", "BF16", "--calib-reader", "no_such_module_xyz:make"],
         "--calib-reader: cannot import module 'no_such_module_xyz'"),
        ([src, dst, "--config", "BF16", "--calib-reader", "fake_reader_mod"],
         "--calib-reader takes MODULE:CALLABLE"),
        ([src, dst, "--config", "BF16", "--calib-reader", "fake_reader_mod:nope"],
         "--calib-reader: module 'fake_reader_mod' has no 'nope'"),
        ([src, dst, "--config", "BF16", "--calib-reader", "fake_reader_mod:make"],
         "--calib-reader: fake_reader_mod:make() returned a object, not a"),
        ([src, dst, "--config", "BF16", "--calib-reader", "fake_reader_mod:boom"],
         "--calib-reader: fake_reader_mod:boom() raised OSError: disk gone"),
        ([opset12, dst, "--config", "BF16", "--bf16-cast"], "--bf16-cast needs ONNX opset >= 13"),
        ([src, tmp_path / "no_dir" / "q.onnx", "--config", "MX6"],
         "output directory " + str(tmp_path / "no_dir") + " does not exist"),
        ([src, tmp_path, "--config", "MX6"], "is a directory"),
        ([src, src, "--config", "MX6"], "refusing to write"),
    ]
    for argv, expected in cases:
        line = _cli_error(argv, capsys)
        assert expected in line, (argv, line)
    # Nothing was written by any of them, and no directory was created.
    assert not dst.exists() and not (tmp_path / "no_dir").exists()
    # A summary that cannot be written: the model was, and the line says so.
    line = _cli_error([src, dst, "--config", "MX6", "--quiet", "--summary-json",
                       tmp_path / "no_dir" / "s.json"], capsys)
    assert "--summary-json: cannot write" in line and f"written to {dst}" in line
    assert dst.exists()


def test_cli_external_data_flag_and_collision(tmp_path, capsys):
    src = tmp_path / "f.onnx"
    onnx.save(conv_model(), str(src), save_as_external_data=True, location="q.onnx.data",
              size_threshold=0)
    data = tmp_path / "q.onnx.data"
    before = data.read_bytes()
    line = _cli_error([src, tmp_path / "q.onnx", "--config", "MX6", "--external-data"], capsys)
    assert "refusing to write" in line and "q.onnx.data" in line
    assert data.read_bytes() == before and not (tmp_path / "q.onnx").exists()
    rc = cli.main([str(src), str(tmp_path / "r.onnx"), "--config", "MX6", "--external-data",
                   "--quiet", "--summary-json", str(tmp_path / "s.json")])
    assert rc == 0 and (tmp_path / "r.onnx.data").exists()
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["output_bytes"] == sum((tmp_path / n).stat().st_size
                                          for n in ("r.onnx", "r.onnx.data"))


def test_cli_corrupt_model_in_a_real_process(tmp_path):
    """The installed entry point: no traceback, one line, exit status 2."""
    import subprocess
    import sys
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(bytes(range(256)) * 4)
    proc = subprocess.run([sys.executable, "-m", "ort_mx_ops.quantizer.cli", str(corrupt),
                           str(tmp_path / "q.onnx"), "--config", "MX6"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("ort-mx-quantize: error: input model ")


def test_demo_execution_provider_option(tmp_path):
    """--ep: CPU by name gives the plain table; a provider this onnxruntime lacks is refused
    with the reason, before any work."""
    src = tmp_path / "f.onnx"
    onnx.save(conv_model(), str(src))
    out_dir = tmp_path / "res"
    rc = demo.main(["--model", str(src), "--configs", "MXINT8", "--samples", "2", "--ep", "cpu",
                    "--timing-rounds", "0", "--out-dir", str(out_dir), "--quiet"])
    assert rc == 0
    table = json.loads((out_dir / "demo.json").read_text())["rows"]
    assert all("vs_cpu" not in r["metrics"] for r in table)
    assert "CPUExecutionProvider" in (out_dir / "demo.md").read_text()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(SystemExit, match="CUDAExecutionProvider is not in this onnxruntime"):
            demo.main(["--model", str(src), "--ep", "CUDA", "--out-dir", str(tmp_path / "x")])
        assert not (tmp_path / "x").exists()
