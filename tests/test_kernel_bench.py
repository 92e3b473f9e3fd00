"""``ort-mx-bench --kernel`` (benchmarks/kernel_bench.py): its rows, shapes, errors and files.
Times are not checked (speed is reported by benchmarks, not tests)."""
from __future__ import annotations

import collections
import json
import os

import numpy as np
import onnx
import pytest

from ort_mx_ops import _native
from ort_mx_ops.benchmarks import cli, kernel_bench
from ort_mx_ops.formats import CONFIGS


def test_rows_count_every_shape_times_its_count():
    shapes = [((40, 2, 16), 2), ((8, 3, 32), 1)]
    rows = kernel_bench.run(["MXINT8", "BFP16", "MX9"], shapes, rounds=3)
    assert [r["config"] for r in rows] == ["MXINT8", "BFP16", "MX9"]
    for r in rows:
        assert r["elements"] == 40 * 2 * 16 * 2 + 8 * 3 * 32
        assert [(s["shape"], s["count"]) for s in r["shapes"]] == [([1, 40, 2, 16], 2),
                                                                  ([1, 8, 3, 32], 1)]
        assert all(s["kernel_s"] > 0 and s["neg_s"] > 0 for s in r["shapes"])
        assert r["kernel_s"] == pytest.approx(sum(s["kernel_s"] * s["count"] for s in r["shapes"]))
        assert r["neg_s"] == pytest.approx(sum(s["neg_s"] * s["count"] for s in r["shapes"]))
        assert r["x_neg"] == pytest.approx(r["neg_s"] / r["kernel_s"])


def test_nchwc_rounds_the_channels_up():
    rows = kernel_bench.run(["MXINT8"], [((12, 2, 16), 1)], nchwc_block=8, rounds=2)
    assert rows[0]["shapes"][0]["shape"] == [1, 16, 2, 16]
    assert rows[0]["elements"] == 16 * 2 * 16


def test_hardswish_input_has_negative_zeros_and_hardswish_range():
    x = kernel_bench.activation("hardswish", (1, 64, 8, 8), np.random.default_rng(0))
    assert x.dtype == np.float32
    negative_zero = (x == 0) & np.signbit(x)
    assert 0.1 < negative_zero.mean() < 0.25  # P(3 z < -3) = 0.16
    assert -0.376 < x.min() < 0  # Hardswish's least value: -0.375, at -1.5
    with pytest.raises(ValueError, match="unknown input"):
        kernel_bench.activation("uniform", (2,), np.random.default_rng(0))


def test_bf16_has_no_block_kernel():
    assert "BF16" not in kernel_bench.block_configs()
    with pytest.raises(ValueError, match="no block kernel"):
        kernel_bench.run(["BF16"], [((8, 1, 16), 1)], rounds=1)


def test_time_block_op_refuses_bad_input():
    x = np.zeros((1, 32, 1, 16), np.float32)
    attrs = dict(CONFIGS["MXINT8"].attrs, axis=1)
    with pytest.raises(ValueError, match="float32"):
        _native.time_block_op("MX", [x.astype(np.float16)], attrs, 1)
    with pytest.raises(ValueError, match="rounds"):
        _native.time_block_op("MX", [x], attrs, 0)
    with pytest.raises(ValueError, match="op must be"):
        _native.time_block_op("XX", [x], attrs, 1)
    with pytest.raises(ValueError, match="element_dtype"):
        _native.time_block_op("MX", [x], dict(attrs, element_dtype="int7"), 1)
    kernel, neg, huge = _native.time_block_op("MX", [x, x], attrs, 2)
    assert len(kernel) == len(neg) == 2
    assert all(t > 0 for t in kernel + neg) and 0.0 <= huge <= 1.0


def test_time_block_op_in_place(tmp_path, monkeypatch):
    """in_place times the kernel writing over its input (the output's buffer filled with the
    array first); --in-place passes it on every call and the report says so; a build without
    the option is refused with a message."""
    x = np.random.default_rng(3).standard_normal((1, 64, 1, 256)).astype(np.float32)
    attrs = dict(CONFIGS["MXINT8"].attrs, axis=1)
    kernel, neg, _ = _native.time_block_op("MX", [x], attrs, 2, in_place=True)
    assert kernel[0] > 0 and neg[0] > 0
    seen = []
    real = _native.time_block_op

    def spy(op, xs, attrs, rounds, in_place=False):
        seen.append(in_place)
        return real(op, xs, attrs, rounds, in_place=in_place)

    monkeypatch.setattr(_native, "time_block_op", spy)
    assert cli.main(["--kernel", "--configs", "MXINT8,BFP16", "--shapes", "32x2x16", "--rounds",
                     "2", "--in-place", "--out", str(tmp_path), "--quiet"]) == 0
    assert seen == [True, True]
    assert json.loads((tmp_path / "kernel_results.json").read_text())["options"]["in_place"]
    assert "in place" in (tmp_path / "kernel_results.md").read_text()

    def old_build(op, xs, attrs, rounds):
        return real(op, xs, attrs, rounds)

    monkeypatch.setattr(_native, "time_block_op", old_build)
    with pytest.raises(SystemExit, match="no in_place"):
        cli.main(["--kernel", "--configs", "MXINT8", "--shapes", "32x2x16", "--rounds", "1",
                  "--in-place", "--out", str(tmp_path), "--quiet"])


@pytest.mark.parametrize("text, shapes", [
    ("200x2x96*4,16x3x96", [((200, 2, 96), 4), ((16, 3, 96), 1)]),
    (" 8X1X4 ", [((8, 1, 4), 1)]),
])
def test_parse_shapes(text, shapes):
    assert kernel_bench.parse_shapes(text) == shapes


@pytest.mark.parametrize("text", ["", "8x4", "8x4x2*0", "0x1x1", "ax1x1", "8x1x1*b"])
def test_parse_shapes_refuses(text):
    with pytest.raises(ValueError):
        kernel_bench.parse_shapes(text)


def test_cli_writes_json_and_markdown(tmp_path):
    rc = cli.main(["--kernel", "--configs", "MXINT8,MXFP4E2M1", "--shapes", "32x2x16*2,8x1x16",
                   "--rounds", "2", "--per-shape", "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    doc = json.loads((tmp_path / "kernel_results.json").read_text())
    assert [r["config"] for r in doc["results"]] == ["MXINT8", "MXFP4E2M1"]
    assert doc["options"]["shapes"] == [[[32, 2, 16], 2], [[8, 1, 16], 1]]
    assert doc["isa"] in ("scalar", "avx2", "avx512")
    assert doc["options"]["input"] == "normal"
    md = (tmp_path / "kernel_results.md").read_text()
    assert "| MXINT8 | 2176 |" in md  # 32 * 2 * 16 * 2 + 8 * 16 elements
    assert "| [1, 32, 2, 16] | 2 |" in md


def test_cli_input_divisor_reaches_the_kernel(tmp_path, monkeypatch):
    """--input-divisor sets the op's attribute on every timed call, and the report says so."""
    seen = []
    real = _native.time_block_op

    def spy(op, xs, attrs, rounds):
        seen.append(attrs.get("input_divisor"))
        return real(op, xs, attrs, rounds)

    monkeypatch.setattr(_native, "time_block_op", spy)
    rc = cli.main(["--kernel", "--configs", "MXINT8,BFP16", "--shapes", "32x2x16", "--rounds", "2",
                   "--input-divisor", "6", "--out", str(tmp_path), "--quiet"])
    assert rc == 0 and seen == [6, 6]
    doc = json.loads((tmp_path / "kernel_results.json").read_text())
    assert doc["options"]["input_divisor"] == 6
    assert "divided by 6" in (tmp_path / "kernel_results.md").read_text()


def test_compare_times_both_builds_in_alternating_rounds(tmp_path, monkeypatch):
    """--other-native: this package's module and another build's (here the same file loaded a
    second time under another name) each timed in every round, the order alternating."""
    other = kernel_bench.load_other_native(_native.__file__)
    assert other is not _native and other.__name__ != _native.__name__
    calls = []

    def recording(module, label):
        real = module.time_block_op

        def timed(op, xs, attrs, rounds):
            calls.append(label)
            return real(op, xs, attrs, rounds)
        return timed

    monkeypatch.setattr(_native, "time_block_op", recording(_native, "this"))
    monkeypatch.setattr(other, "time_block_op", recording(other, "other"))
    rows = kernel_bench.compare(["MXINT8"], [((32, 2, 16), 1)], other, alternations=3, rounds=2,
                                input_divisor=6)
    assert calls == ["this", "other", "other", "this", "this", "other"]
    (row,) = rows
    assert row["config"] == "MXINT8" and row["other_kernel_s"] > 0 and row["kernel_s"] > 0
    assert row["time_vs_other"] == pytest.approx(row["kernel_s"] / row["other_kernel_s"])
    rc = cli.main(["--kernel", "--configs", "BFP16", "--shapes", "16x2x16", "--rounds", "2",
                   "--other-native", _native.__file__, "--alternations", "2",
                   "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    doc = json.loads((tmp_path / "kernel_results.json").read_text())
    assert doc["options"]["other_native"] == _native.__file__
    assert doc["options"]["alternations"] == 2
    assert "Against another build" in (tmp_path / "kernel_results.md").read_text()


@pytest.mark.parametrize("path, message", [("missing.so", "no such file"),
                                           ("empty.so", "cannot load")])
def test_other_native_refuses_what_is_not_a_build(tmp_path, path, message):
    (tmp_path / "empty.so").write_bytes(b"")
    with pytest.raises(SystemExit, match=message):
        cli.main(["--kernel", "--other-native", str(tmp_path / path), "--out", str(tmp_path),
                  "--quiet"])


@pytest.mark.parametrize("args, message", [
    (["--alternations", "0"], "--alternations"),
    (["--configs", "BF16"], "non-block config"),
    (["--configs", "MX5"], "unknown"),
    (["--shapes", "8x8"], "--shapes"),
    (["--rounds", "0"], "--rounds"),
    (["--input-divisor", "-1"], "--input-divisor"),
    (["--input-divisor", str(2**24 + 1)], "--input-divisor"),
])
def test_cli_refuses(tmp_path, args, message):
    with pytest.raises(SystemExit, match=message):
        cli.main(["--kernel", *args, "--out", str(tmp_path), "--quiet"])


def test_default_shapes_are_the_classifiers_activations(tmp_path):
    """CLASSIFIER_SHAPES is what the module says: the inputs of 4 Ki elements and more of the
    nodes that the default placement puts into the OCR demo's direction classifier."""
    rapidocr = pytest.importorskip("rapidocr_onnxruntime")  # a demo dependency, as CI installs
    from ort_mx_ops.quantizer import get_config, quantize_model

    path = os.path.join(os.path.dirname(rapidocr.__file__), "models",
                        "ch_ppocr_mobile_v2.0_cls_infer.onnx")
    model = onnx.load(path)
    for dim, value in zip(model.graph.input[0].type.tensor_type.shape.dim, (1, 3, 48, 192)):
        dim.ClearField("dim_param")
        dim.dim_value = value
    fixed, quantized = tmp_path / "cls.onnx", tmp_path / "cls_mxint8.onnx"
    onnx.save(model, str(fixed))
    quantize_model(str(fixed), str(quantized), get_config("MXINT8"))
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
              for v in [*inferred.graph.value_info, *inferred.graph.input]}
    found = collections.Counter()
    for node in onnx.load(str(quantized)).graph.node:
        if node.op_type in ("MXQuantizeDequantize", "MXFixNeuron"):
            shape = shapes.get(node.input[0])  # (None: a weight, not an activation)
            if shape and len(shape) == 4 and np.prod(shape) >= 4096:
                found[shape[1:]] += 1
    assert found == collections.Counter(dict(kernel_bench.CLASSIFIER_SHAPES))
