"""quantize_model(weight_storage=...) and --weight-storage (docs/packed_weights.md): packed
models through this library's MXDequantize / BFPDequantize and standard-ONNX models through
plain onnxruntime, bit-identical to the folded models, on unit models and on the real OCR
recognizer that rapidocr-onnxruntime ships."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import ort_mx_ops
from ort_mx_ops.benchmarks.weight_storage import optimized_graph
from ort_mx_ops.formats import CONFIGS, PRODUCT_DOMAIN
from ort_mx_ops.quantizer import quantize_model
from ort_mx_ops.quantizer.cli import main as quantize_cli
from ort_mx_ops.quantizer.storage import expand_packed_weights

from test_quantizer_models import conv_model, matmul_model

BLOCK_CONFIGS = [name for name, c in CONFIGS.items() if c.op != "BF16"]
ONNX_CONFIGS = ["MXFP8E4M3", "MXFP8E5M2", "MXINT8"]
NO_STANDARD_KERNEL = ["MXFP4E2M1", "MXFP6E3M2", "MXFP6E2M3", "MX9", "MX6", "MX4", "BFP16"]


# onnxruntime folds a BatchNormalization into the preceding Conv's weight when that weight is a
# constant (the folded model), which changes the weight it runs; a packed weight is not a
# constant, so comparisons of packed and folded models switch that one rewrite off.
NO_CONV_BN = ["ConvBNFusion"]


def _session(model: onnx.ModelProto, library: bool, qdq_fusion: bool = True,
             level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
             disabled: tuple = ()) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 2
    if not qdq_fusion:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    if library:
        so.register_custom_ops_library(ort_mx_ops.get_library_path())
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled))


def _run(model: onnx.ModelProto, feeds: dict, **kw) -> list[np.ndarray]:
    return _session(model, **kw).run(None, feeds)


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b))


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def _uses_custom_domain(model: onnx.ModelProto) -> bool:
    return any(n.domain not in ("", "ai.onnx") for n in model.graph.node)


UNIT_MODELS = {"conv": (conv_model, {"x": (2, 8, 10, 10)}),
               "matmul": (matmul_model, None)}


def _unit_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else 3
                for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


# ------------------------------------------------------------------------------------------
# Unit models
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", BLOCK_CONFIGS)
@pytest.mark.parametrize("which", sorted(UNIT_MODELS))
def test_packed_unit_model_bit_identical_to_folded(which, config):
    model = UNIT_MODELS[which][0]()
    feeds = _unit_feeds(model)
    folded = quantize_model(model, None, config).model
    packed = quantize_model(model, None, config, weight_storage="packed").model
    onnx.checker.check_model(packed)
    ops = {n.op_type for n in packed.graph.node if n.domain == PRODUCT_DOMAIN}
    assert ops == {"MXDequantize" if CONFIGS[config].op == "MX" else "BFPDequantize"}
    assert _same(_run(folded, feeds, library=True, disabled=NO_CONV_BN),
                 _run(packed, feeds, library=True, disabled=NO_CONV_BN))
    # The numpy reader gives the folded weights back, bit for bit.
    expanded = expand_packed_weights(packed)
    assert not any(n.domain == PRODUCT_DOMAIN for n in expanded.graph.node)
    want, got = _weights(folded), _weights(expanded)
    for name, w in want.items():
        if w.dtype == np.float32 and w.ndim >= 2:
            # A depthwise weight is decoded as (C, -1) and reshaped by a Reshape node.
            g = got[name] if name in got else got[f"{name}_flat"]
            assert g.tobytes() == w.tobytes(), name


@pytest.mark.parametrize("config", ONNX_CONFIGS + ["BF16"])
@pytest.mark.parametrize("which", sorted(UNIT_MODELS))
def test_onnx_storage_runs_without_the_library(which, config):
    model = UNIT_MODELS[which][0]()
    feeds = _unit_feeds(model)
    folded = quantize_model(model, None, config, activation=None).model
    stored = quantize_model(model, None, config, activation=None, weight_storage="onnx").model
    onnx.checker.check_model(stored, full_check=True)
    assert not _uses_custom_domain(stored)
    if config != "BF16":
        assert any(n.op_type == "DequantizeLinear" for n in stored.graph.node)
        assert stored.opset_import[0].version >= 21 and stored.ir_version >= 10
    else:
        assert any(n.op_type == "Cast" for n in stored.graph.node)
    # A session with no custom-op library loads and runs it.
    got = _run(stored, feeds, library=False, qdq_fusion=False)
    want = _run(onnx.version_converter.convert_version(folded, stored.opset_import[0].version)
                if config != "BF16" else folded, feeds, library=False, qdq_fusion=False)
    assert _same(want, got)


@pytest.mark.parametrize("config", NO_STANDARD_KERNEL)
def test_onnx_storage_without_standard_kernel_names_packed(config):
    with pytest.raises(ValueError, match="weight_storage='packed'"):
        quantize_model(conv_model(), None, config, weight_storage="onnx")


def test_weight_storage_option_errors(tmp_path):
    with pytest.raises(ValueError, match="weight_storage must be one of"):
        quantize_model(conv_model(), None, "MXINT8", weight_storage="zip")
    with pytest.raises(ValueError, match="fold_weights=True"):
        quantize_model(conv_model(), None, "MXINT8", weight_storage="packed", fold_weights=False)
    src = tmp_path / "m.onnx"
    onnx.save(conv_model(), src)
    assert quantize_cli([str(src), str(tmp_path / "o.onnx"), "--config", "MXFP4E2M1",
                         "--weight-storage", "onnx", "--quiet"]) == 2
    assert not (tmp_path / "o.onnx").exists()


def test_cli_weight_storage_packed(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "p.onnx"
    onnx.save(conv_model(), src)
    assert quantize_cli([str(src), str(out), "--config", "MX6", "--weight-storage", "packed",
                         "--quiet"]) == 0
    packed = onnx.load(out)
    assert any(n.op_type == "BFPDequantize" for n in packed.graph.node)
    # A tiny model: graph structure and the float bias weigh as much as the weights.
    assert os.path.getsize(out) < os.path.getsize(src) / 1.7


def test_special_weight_values_round_trip_through_the_op():
    model = conv_model()
    w1 = next(t for t in model.graph.initializer if t.name == "w1")
    arr = numpy_helper.to_array(w1).copy()
    arr.reshape(-1)[[0, 5, 9, 17]] = [np.inf, np.nan, -0.0, 1e-42]
    w1.CopyFrom(numpy_helper.from_array(arr, "w1"))
    feeds = _unit_feeds(model)
    for config in ("MXINT8", "MXFP4E2M1", "MX9", "BFP16"):
        folded = quantize_model(model, None, config).model
        packed = quantize_model(model, None, config, weight_storage="packed").model
        assert any("exception" in t.name for t in packed.graph.initializer) or config == "MX9"
        level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        a = _run(folded, feeds, library=True, level=level)
        b = _run(packed, feeds, library=True, level=level)
        assert _same(a, b), config


# ------------------------------------------------------------------------------------------
# The real OCR model
# ------------------------------------------------------------------------------------------

def _rec_model() -> str:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        pytest.skip("rapidocr-onnxruntime (the demo model) is not installed")
    return os.path.join(os.path.dirname(spec.origin), "models", "ch_PP-OCRv4_rec_infer.onnx")


@pytest.fixture(scope="module")
def rec_input() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).random((1, 3, 48, 320), dtype=np.float32)}


@pytest.mark.parametrize("config,ratio", [("MXFP4E2M1", 6.0), ("MXINT8", 3.5),
                                          ("MXFP8E4M3", 3.5), ("MX6", 4.5)])
def test_packed_ocr_model(tmp_path, rec_input, config, ratio):
    src = _rec_model()
    folded_path, packed_path = tmp_path / "folded.onnx", tmp_path / "packed.onnx"
    quantize_model(src, folded_path, config)
    summary = quantize_model(src, packed_path, config, weight_storage="packed")
    assert summary.output_bytes == os.path.getsize(packed_path)
    assert os.path.getsize(packed_path) <= os.path.getsize(src) / ratio
    folded, packed = onnx.load(folded_path), onnx.load(packed_path)
    # Expanded at load, the weights are constants again: identical under every optimization,
    # and onnxruntime optimizes the expanded model into the very graph it runs for the folded
    # one (same nodes, same constant bytes), so it runs as fast.
    want = _run(folded, rec_input, library=True)
    expanded = expand_packed_weights(packed)
    assert _same(want, _run(expanded, rec_input, library=True))
    expanded_path = tmp_path / "expanded.onnx"
    onnx.save(expanded, expanded_path)
    libs = [ort_mx_ops.get_library_path()]
    graph = optimized_graph(str(folded_path), libs, str(tmp_path))
    assert optimized_graph(str(expanded_path), libs, str(tmp_path)) == graph
    assert optimized_graph(str(packed_path), libs, str(tmp_path)) != graph  # decoded by ops
    # Decoded by the op: identical once onnxruntime no longer rewrites the folded weights.
    assert _same(_run(folded, rec_input, library=True, disabled=NO_CONV_BN),
                 _run(packed, rec_input, library=True, disabled=NO_CONV_BN))


@pytest.mark.parametrize("config", ONNX_CONFIGS)
def test_onnx_storage_ocr_model(tmp_path, rec_input, config):
    src = _rec_model()
    out = tmp_path / "onnx.onnx"
    summary = quantize_model(src, out, config, activation=None, weight_storage="onnx")
    assert not summary.skipped, summary.skipped  # every weight converted
    assert os.path.getsize(out) <= os.path.getsize(src) / 3.3
    stored = onnx.load(out)
    onnx.checker.check_model(stored)
    assert not _uses_custom_domain(stored)
    folded = quantize_model(src, None, config, activation=None).model
    same_opset = onnx.version_converter.convert_version(folded, 21)
    got = _run(stored, rec_input, library=False, qdq_fusion=False)
    assert _same(_run(same_opset, rec_input, library=False, qdq_fusion=False), got)
