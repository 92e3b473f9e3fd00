"""End-to-end tests of ort_mx_ops.quantizer on small models built in code.

The quantized models run in onnxruntime with the CPU library registered; the oracle is the
float graph with ``ort_mx_ops.reference`` applied at the same places (per node, bit for bit,
and end to end through ``quantizer.simulate``).
"""
from __future__ import annotations

import hashlib
import os
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import ort_mx_ops
from ort_mx_ops import reference
from ort_mx_ops.formats import CONFIGS, QUARK_DOMAIN, LEGACY_DOMAIN, PRODUCT_DOMAIN
from ort_mx_ops.quantizer import (quantize_model, get_config, FormatSpec, QuantizationConfig,
                                  config_names)
from ort_mx_ops.quantizer.quantize import save_model_atomic
from ort_mx_ops.quantizer.simulate import run_reference

from conftest import assert_bits_equal
from test_quantizer_models import MODELS, conv_model, feeds_for, two_consumer_model

ALL_CONFIGS = list(CONFIGS)
QDQ_OPS = {"BFPQuantizeDequantize", "MXQuantizeDequantize", "BFPFixNeuron", "MXFixNeuron"}


def session(model: onnx.ModelProto, extra_outputs: tuple[str, ...] = ()) -> ort.InferenceSession:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for name in extra_outputs:
        m.graph.output.append(onnx.ValueInfoProto(name=name))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ort_mx_ops.register(so)
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto, feeds, extra: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    sess = session(model, extra)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def quantize(model: onnx.ModelProto, config, **opts):
    s = quantize_model(model, None, config, **opts)
    return s.model, s


def custom_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain in (QUARK_DOMAIN, LEGACY_DOMAIN)]


def node_attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def reference_of(node: onnx.NodeProto, x: np.ndarray) -> np.ndarray:
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in node_attrs(node).items()}
    if node.op_type.startswith("BFP"):
        return reference.bfp_quantize_dequantize(x, **attrs)
    return reference.mx_quantize_dequantize(x, **attrs)


def sites(summary) -> dict[str, object]:
    return {s.tensor: s for s in summary.sites}


# ------------------------------------------------------------------------------------------
# configuration handling
# ------------------------------------------------------------------------------------------

def test_unknown_config_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown quantization config 'MXFP9'.*MXFP8E4M3"):
        quantize_model(conv_model(), None, "MXFP9")
    with pytest.raises(TypeError, match="unknown quantization option"):
        quantize_model(conv_model(), None, "MX6", fold_weight=False)  # typo of fold_weights
    with pytest.raises(ValueError, match="must not set 'axis'"):
        FormatSpec("MX", {"element_dtype": "int8", "axis": 2})
    with pytest.raises(ValueError, match="element_dtype must be one of"):
        FormatSpec("MX", {"element_dtype": "fp5"})


def test_config_names_match_spec_table():
    assert config_names() == ["BF16", "BFP16", "MX9", "MX6", "MX4", "MXFP8E5M2", "MXFP8E4M3",
                              "MXFP6E3M2", "MXFP6E2M3", "MXFP4E2M1", "MXINT8"]
    assert get_config("mxint8").weight.full_attrs() == {"element_dtype": "int8",
                                                        "block_size": 32, "rounding_mode": 2}


# ------------------------------------------------------------------------------------------
# placement and axes
# ------------------------------------------------------------------------------------------

def test_conv_placement_and_axes():
    model, s = quantize(conv_model(), "MXFP8E4M3", fold_weights=False)
    got = {t: (r.kind, r.axis, r.flatten) for t, r in sites(s).items()}
    assert got == {"x": ("activation", 1, False), "w1": ("weight", 1, False),
                   "r1": ("activation", 1, False), "w2": ("weight", 1, True),
                   "r2": ("activation", 1, False), "w3": ("weight", 1, False)}
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["MXQuantizeDequantize"] == 6 and ops["Reshape"] == 2  # depthwise: flattened
    assert "b1" not in got  # bias stays float by default
    # Graph inputs and outputs keep their names; conv1 now reads the quantized x.
    assert [i.name for i in model.graph.input] == ["x"]
    assert [o.name for o in model.graph.output] == ["y"]
    conv1 = next(n for n in model.graph.node if n.name == "conv1")
    assert conv1.input[0] != "x" and conv1.input[2] == "b1"


def test_matmul_gemm_placement_never_blocks_token_axes():
    _, s = quantize(MODELS["matmul"](), "MXINT8")
    got = {t: r.axis for t, r in sites(s).items()}
    # h feeds MatMul as A (last axis, 64) and as B via its second-to-last axis, which is the
    # dynamic T axis: both resolve to the fixed 64-long axis 2.
    assert got == {"x": 2, "W1": 0, "hr": 2, "hT": 1, "x2": 1, "Wg": 1}
    # The attention probabilities contract over key tokens and have no fixed axis: float.
    assert any(msg.startswith("p (input 0 of MatMul") for msg in s.skipped)
    assert s.conflicts == []


def test_two_consumers_quantized_once_and_conflict_reported():
    model, s = quantize(two_consumer_model(), "MX9")
    a = sites(s)["a"]
    assert a.axis == 1 and sorted(a.consumer_ops) == ["MatMul", "MatMul"]
    assert len(s.conflicts) == 1 and "a: consumers disagree" in s.conflicts[0]
    # One runtime node for a, shared by both MatMuls.
    qdq = custom_nodes(model)
    assert [n.input[0] for n in qdq] == ["a"]
    readers = [n for n in model.graph.node if qdq[0].output[0] in n.input]
    assert sorted(n.name for n in readers) == ["mm_a_first", "mm_a_second"]
    # W1 also feeds the (unquantized) Add: folded values go to a new initializer, the Add
    # keeps the original.
    add = next(n for n in model.graph.node if n.name == "add")
    mm = next(n for n in model.graph.node if n.name == "mm_a_first")
    assert add.input[0] == "W1" and mm.input[1] != "W1"
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    w1 = numpy_helper.to_array(next(i for i in two_consumer_model().graph.initializer
                                    if i.name == "W1"))
    np.testing.assert_array_equal(inits["W1"], w1)
    assert_bits_equal(inits[mm.input[1]],
                      reference.bfp_quantize_dequantize(w1, axis=0, **CONFIGS["MX9"].attrs))


def test_quark_placement_reproduces_every_input_axis_one():
    model, s = quantize(conv_model(), "BFP16", placement="quark", fold_weights=False)
    got = {t: (r.axis, r.flatten) for t, r in sites(s).items()}
    # Every input of every op: Relu inputs and the bias too; the depthwise weight keeps
    # Quark's axis 1 (one exponent per weight).
    assert got == {"x": (1, False), "w1": (1, False), "b1": (0, False), "c1": (1, False),
                   "r1": (1, False), "w2": (1, False), "c2": (1, False), "r2": (1, False),
                   "w3": (1, False)}
    assert len(custom_nodes(model)) == 9


def test_exclusions_and_op_type_options():
    _, s = quantize(conv_model(), "MX6", nodes_to_exclude=["conv2"])
    assert set(sites(s)) == {"x", "w1", "r2", "w3"}
    _, s = quantize(MODELS["matmul"](), "MX6", op_types_to_quantize=["Gemm"])
    assert set(sites(s)) == {"x2", "Wg"}
    _, s = quantize(conv_model(), "MX6", quantize_all_op_types=True)
    assert {"c1", "c2"} <= set(sites(s))  # Relu inputs now too
    _, s = quantize(conv_model(), "MX6", quantize_bias=True)
    assert "b1" in sites(s)
    _, s = quantize(conv_model(), "MX6", nodes_to_exclude=["no_such_node"])
    assert any("no_such_node" in m for m in s.skipped)


# ------------------------------------------------------------------------------------------
# numerics: quantized model vs the reference at the same places
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [c for c in ALL_CONFIGS if c != "BF16"])
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_runtime_nodes_equal_reference_bit_for_bit(model_name, config):
    """Every inserted node's output equals the numpy reference on that node's actual input,
    and the whole model agrees with the float graph evaluated with the reference there."""
    model, s = quantize(MODELS[model_name](), config, fold_weights=False)
    qdq = [n for n in model.graph.node if n.op_type in QDQ_OPS]
    assert len(qdq) == len(s.sites) > 0
    feeds = feeds_for(model_name)
    names = tuple(dict.fromkeys(t for n in qdq for t in (n.input[0], n.output[0])))
    names = tuple(t for t in names if t not in feeds)
    out = run(model, feeds, names)
    values = {**feeds, **out}
    for n in qdq:
        assert_bits_equal(values[n.output[0]], reference_of(n, values[n.input[0]]),
                          f"{config} {n.name}")
    # End to end: onnx.reference for the float ops, ort_mx_ops.reference for ours.
    sim = run_reference(model, feeds)
    float_out = run(MODELS[model_name](), feeds)
    changed = []
    for (name, got), want in zip(list(out.items())[:len(sim)], sim):
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 1e-3, f"{config} {name}: relative error {err} vs the reference graph"
        changed.append(not np.array_equal(got, float_out[name]))
    assert any(changed), f"{config}: quantization changed no output"


@pytest.mark.parametrize("config", ALL_CONFIGS)
@pytest.mark.parametrize("model_name", ["conv", "matmul"])
def test_folded_weights_equal_runtime_weight_nodes(model_name, config):
    runtime, _ = quantize(MODELS[model_name](), config, fold_weights=False)
    folded, s = quantize(MODELS[model_name](), config)
    assert s.runtime_node_count() == (2 if config == "BF16" else 1) * sum(
        1 for r in s.sites if r.kind == "activation")
    weights = [r for r in s.sites if r.kind == "weight"]
    assert weights and all(r.folded for r in weights)
    # The folded values are what the runtime weight node computes in onnxruntime.
    runtime_sites = {r.tensor: r for r in quantize(MODELS[model_name](), config,
                                                   fold_weights=False)[1].sites}
    feeds = feeds_for(model_name)
    out = run(runtime, feeds, tuple(runtime_sites[r.tensor].output for r in weights))
    stored = {i.name: numpy_helper.to_array(i) for i in folded.graph.initializer}
    stored.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t)
                   for n in folded.graph.node if n.op_type == "Constant"})
    for r in weights:
        assert_bits_equal(stored[r.output], out[runtime_sites[r.tensor].output],
                          f"{config} {r.tensor}")
    a, b = run(folded, feeds), run(runtime, feeds)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------
# BF16 forms
# ------------------------------------------------------------------------------------------

def _bf16_round(x: np.ndarray) -> np.ndarray:
    return reference.bfloat16_bits_to_float32(reference.float32_to_bfloat16_bits(x))


def test_bf16_extended_pair_and_cast_pair_agree():
    ext, s_ext = quantize(conv_model(), "BF16", fold_weights=False)
    cast, s_cast = quantize(conv_model(), "BF16", fold_weights=False, bf16_qdq_to_cast=True)
    ops_ext = Counter(n.op_type for n in ext.graph.node)
    assert ops_ext["ExtendedQuantizeLinear"] == ops_ext["ExtendedDequantizeLinear"] == 6
    zp = next(i for i in ext.graph.initializer if i.name.startswith("bf16_zero_point"))
    assert zp.data_type == onnx.TensorProto.BFLOAT16
    ops_cast = Counter(n.op_type for n in cast.graph.node)
    assert ops_cast["Cast"] == 12 and not custom_nodes(cast)
    assert all(o.domain != QUARK_DOMAIN for o in cast.opset_import)
    feeds = feeds_for("conv")
    a, b = run(ext, feeds)["y"], run(cast, feeds)["y"]
    np.testing.assert_array_equal(a, b)
    # The first node rounds the graph input x to bfloat16.
    q = run(ext, feeds, (s_ext.sites[0].output,))[s_ext.sites[0].output]
    assert_bits_equal(q, _bf16_round(feeds["x"]))


def test_bf16_fused_node_gives_the_extended_pairs_bits():
    """bf16_qdq_fused: one BF16QuantizeDequantize per tensor where the pair has two nodes,
    the same output bits (rescaled activations and weights included)."""
    class Reader:
        def __init__(self):
            self.batches = [feeds_for("conv", seed) for seed in range(3)]

        def get_next(self):
            return self.batches.pop() if self.batches else None

    for options in ({}, {"bf16_activation_scaled": True, "bf16_weight_scaled": True,
                         "bf16_scale_target": 0.25}):
        calib = lambda: {"calibration_data_reader": Reader()} if options else {}  # noqa: E731
        ext, _ = quantize(conv_model(), "BF16", fold_weights=False, **options, **calib())
        fused, _ = quantize(conv_model(), "BF16", fold_weights=False, bf16_qdq_fused=True,
                            **options, **calib())
        ops = Counter((n.domain, n.op_type) for n in fused.graph.node)
        assert ops[(PRODUCT_DOMAIN, "BF16QuantizeDequantize")] == 6, ops
        assert not any(n.op_type.startswith("Extended") for n in fused.graph.node)
        assert PRODUCT_DOMAIN in {o.domain for o in fused.opset_import}
        feeds = feeds_for("conv")
        assert_bits_equal(run(fused, feeds)["y"], run(ext, feeds)["y"], f"fused {options}")
        # the numpy simulation of both forms (onnx.reference's Conv, not onnxruntime's)
        assert_bits_equal(run_reference(fused, feeds)[0], run_reference(ext, feeds)[0],
                          "simulated")
    with pytest.raises(ValueError, match="choose one"):
        quantize(conv_model(), "BF16", bf16_qdq_to_cast=True, bf16_qdq_fused=True)


def test_bf16_cast_needs_opset_13():
    with pytest.raises(ValueError, match="opset >= 13"):
        quantize(conv_model(opset=12), "BF16", bf16_qdq_to_cast=True)


def test_bf16_weight_and_activation_rescaling():
    class Reader:
        def __init__(self):
            self.batches = [feeds_for("conv", seed) for seed in range(3)]

        def get_next(self):
            return self.batches.pop() if self.batches else None

    with pytest.raises(ValueError, match="calibration_data_reader"):
        quantize(conv_model(), "BF16", bf16_activation_scaled=True)
    model, s = quantize(conv_model(), "BF16", calibration_data_reader=Reader(),
                        bf16_weight_scaled=True, bf16_activation_scaled=True)
    by = sites(s)
    x_max = max(np.abs(feeds_for("conv", seed)["x"]).max() for seed in range(3))
    assert by["x"].bf16_scale == pytest.approx(float(x_max), rel=1e-6)
    w1 = numpy_helper.to_array(next(i for i in conv_model().graph.initializer if i.name == "w1"))
    scale = np.float32(np.abs(w1).max())
    assert by["w1"].bf16_scale == pytest.approx(float(scale), rel=1e-7)
    stored = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w1"))
    assert_bits_equal(stored, (_bf16_round(w1 / scale) * scale).astype(np.float32))
    # The runtime pair on x divides by the calibrated scale and multiplies it back.
    q_node = next(n for n in model.graph.node if n.op_type == "ExtendedQuantizeLinear"
                  and n.input[0] == "x")
    scale_x = numpy_helper.to_array(next(i for i in model.graph.initializer
                                         if i.name == q_node.input[1]))
    feeds = feeds_for("conv")
    out = run(model, feeds, (by["x"].output,))[by["x"].output]
    assert_bits_equal(out, (_bf16_round(feeds["x"] / scale_x) * scale_x).astype(np.float32))


def test_mixed_activation_and_weight_formats():
    cfg = QuantizationConfig(activation=FormatSpec.from_name("BF16"),
                             weight=FormatSpec("MX", {"element_dtype": "int8", "block_size": 16,
                                                      "rounding_mode": 2}, name="MXINT8b16"))
    model, s = quantize(conv_model(), cfg, fold_weights=False)
    kinds = {(r.kind, r.format) for r in s.sites}
    assert kinds == {("activation", "BF16"), ("weight", "MXINT8b16")}
    mx = [n for n in model.graph.node if n.op_type == "MXQuantizeDequantize"]
    assert len(mx) == 3 and all(node_attrs(n)["block_size"] == 16 for n in mx)
    np.testing.assert_allclose(run(model, feeds_for("conv"))["y"],
                               run_reference(model, feeds_for("conv"))[0], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------
# emitted model: names, domains, file handling
# ------------------------------------------------------------------------------------------

def test_legacy_names_give_the_same_numbers():
    legacy, _ = quantize(conv_model(), "MX6", fold_weights=False, legacy_names=True)
    modern, _ = quantize(conv_model(), "MX6", fold_weights=False)
    assert {n.op_type for n in custom_nodes(legacy)} == {"BFPFixNeuron"}
    assert {n.domain for n in custom_nodes(legacy)} == {LEGACY_DOMAIN}
    assert any(o.domain == LEGACY_DOMAIN and o.version == 1 for o in legacy.opset_import)
    feeds = feeds_for("conv")
    np.testing.assert_array_equal(run(legacy, feeds)["y"], run(modern, feeds)["y"])
    legacy_mx, _ = quantize(conv_model(), "MXFP4E2M1", legacy_names=True)
    assert {n.op_type for n in custom_nodes(legacy_mx)} == {"MXFixNeuron"}


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_written_model_keeps_ir_opset_and_input_untouched(tmp_path):
    src = tmp_path / "float.onnx"
    onnx.save(conv_model(), str(src))
    before = _sha(src)
    dst = tmp_path / "out" / "q.onnx"
    dst.parent.mkdir()  # the output directory must exist
    s = quantize_model(str(src), str(dst), "MXFP6E2M3")
    assert _sha(src) == before
    q = onnx.load(str(dst))
    onnx.checker.check_model(q)
    assert q.ir_version == conv_model().ir_version
    assert {(o.domain, o.version) for o in q.opset_import} == {("", 17), (QUARK_DOMAIN, 1)}
    assert s.output_bytes == os.path.getsize(dst)
    assert sorted(os.listdir(dst.parent)) == ["q.onnx"]  # no temporary files left behind
    with pytest.raises(ValueError, match="refusing to write the quantized model over its input"):
        quantize_model(str(src), str(src), "MX6")
    assert _sha(src) == before
    # A ModelProto argument is not modified either.
    m = conv_model()
    snapshot = m.SerializeToString()
    quantize_model(m, None, "MX4")
    assert m.SerializeToString() == snapshot


def test_external_data_for_large_models(tmp_path):
    model, _ = quantize(conv_model(), "MXINT8")
    path = tmp_path / "big.onnx"
    save_model_atomic(model, str(path), external_threshold=0)  # as if above 2 GB
    assert (tmp_path / "big.onnx.data").exists()
    onnx.checker.check_model(str(path))
    so = ort_mx_ops.register(ort.SessionOptions())
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = feeds_for("conv")
    np.testing.assert_array_equal(sess.run(["y"], feeds)[0], run(model, feeds)["y"])


def test_summary_reports_counts_axes_and_sizes():
    _, s = quantize(conv_model(), "MXFP4E2M1")
    text = str(s)
    assert "MXFP4E2M1" in text and "depthwise Conv weight" in text
    assert s.counts()[("MXFP4E2M1", "weight", "Conv")] == 3
    assert s.counts()[("MXFP4E2M1", "activation", "Conv")] == 3
    fb, pb = s.packed_weight_bytes()
    numel = 16 * 8 * 9 + 16 * 9 + 4 * 16
    assert fb == 4 * numel and pb == round(numel * 4.25 / 8)
