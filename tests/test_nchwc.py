"""quantizer.nchwc: a quantized model pre-optimised by onnxruntime with our nodes inside the
blocked NCHWc layout gives bit-identical outputs to the same quantized model run normally,
on inputs of several shapes and with special values, and removes layout conversions where it
says it does."""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_mx_ops
from ort_mx_ops import formats
from ort_mx_ops.quantizer import get_config, quantize_model
from ort_mx_ops.quantizer import nchwc

BLOCK = nchwc.nchwc_block_size()
pytestmark = pytest.mark.skipif(BLOCK == 0, reason="onnxruntime uses no NCHWc layout here")


def _cnn(path, channels=(16, 16, 16), residual=True):
    """x -> Conv -> Relu -> Conv -> Conv (-> + the first conv's output) -> y: free H and W."""
    rng = np.random.default_rng(0)
    nodes, inits, prev, cin = [], [], "x", 3
    for i, c in enumerate(channels):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((c, cin, 3, 3)) * 0.3).astype(np.float32), f"w{i}"))
        inits.append(numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), f"b{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"],
                                      pads=[1, 1, 1, 1], name=f"conv{i}"))
        prev, cin = f"c{i}", c
        if i == 0:
            nodes.append(helper.make_node("Relu", [prev], ["r0"], name="relu0"))
            prev = "r0"
    if residual and channels[0] == channels[-1]:
        nodes.append(helper.make_node("Add", [prev, "c0"], ["sum"], name="add"))
        prev = "sum"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, "h", "w"])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, channels[-1], "h", "w"])], inits)
    onnx.save(helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 13)]),
              str(path))
    return str(path)


def _inputs():
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, 3, 12, 16)).astype(np.float32),
          (rng.standard_normal((1, 3, 7, 9)) * 1e3).astype(np.float32)]
    special = rng.standard_normal((1, 3, 10, 11)).astype(np.float32)
    special.flat[::17] = 0.0
    special.flat[5] = np.inf
    special.flat[40] = -np.inf
    special.flat[77] = np.nan
    special.flat[100] = 1e-40  # subnormal
    xs.append(special)
    return xs


def _run(path, so, x):
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("config", ["BFP16", "MX9", "MX4", "MXINT8", "MXFP8E4M3", "MXFP4E2M1",
                                    "BF16", "BF16fused"])
def test_bit_identical_to_default_run(tmp_path, config):
    q = str(tmp_path / "q.onnx")
    fused = config == "BF16fused"  # BF16 as one BF16QuantizeDequantize node per tensor
    config = "BF16" if fused else config
    quantize_model(_cnn(tmp_path / "m.onnx"), q,
                   get_config(config).replace(bf16_qdq_fused=fused))
    out = str(tmp_path / "q_nchwc.onnx")
    report = nchwc.optimize_nchwc(q, out)
    assert report.block == BLOCK
    plain = ort_mx_ops.register(ort.SessionOptions())
    for x in _inputs():
        a, b = _run(q, plain, x), _run(out, nchwc.session_options(), x)
        assert a.shape == b.shape
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), config
    block_size = formats.CONFIGS[config].block_size
    # conv0 -> relu (fused into the NCHWc conv) -> our node -> conv1, and conv1 -> our node
    # -> conv2: two chains between convolutions; every built-in block size is a power of two
    # (a multiple or a divisor of B)
    assert BLOCK % block_size == 0 or block_size % BLOCK == 0
    assert len(report.rewritten) == 2, report
    assert report.reorders_after == report.reorders_before - 4
    nodes = onnx.load(out).graph.node
    ours = [n for n in nodes if n.domain in (formats.QUARK_DOMAIN, formats.LEGACY_DOMAIN,
                                             formats.PRODUCT_DOMAIN)]
    assert len(ours) == (6 if config == "BF16" and not fused else 3), [n.op_type for n in ours]
    if config != "BF16":  # the two nodes read the blocked tensors themselves
        lanes = [helper.get_attribute_value(a) for n in ours for a in n.attribute
                 if a.name == "nchwc_block"]
        assert lanes == [BLOCK, BLOCK], lanes
        assert not [n for n in nodes if n.name.startswith(tuple(n.name for n in ours))
                    and n.op_type in ("Reshape", "Shape")]
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    assert meta[nchwc.METADATA_KEY] == f"onnxruntime {ort.__version__}; NCHWc block {BLOCK}"


@pytest.mark.parametrize("config", ["BFP16", "MX9"])
@pytest.mark.parametrize("hw", [(12, 16), (7, 9)])
def test_fixed_shapes(tmp_path, config, hw):
    """With the input shape fixed, the model runs that shape (no Shape / Reshape nodes
    around ours) and refuses others."""
    q = str(tmp_path / "q.onnx")
    quantize_model(_cnn(tmp_path / "m.onnx"), q, config)
    out = str(tmp_path / "q_nchwc.onnx")
    shape = [1, 3, *hw]
    report = nchwc.optimize_nchwc(q, out, {"x": shape})
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    a = _run(q, ort_mx_ops.register(ort.SessionOptions()), x)
    b = _run(out, nchwc.session_options(), x)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    nodes = onnx.load(out).graph.node
    assert "Shape" not in [n.op_type for n in nodes]
    assert len(report.rewritten) == 2
    with pytest.raises(Exception, match="[Ii]nvalid|dimension|shape"):
        _run(out, nchwc.session_options(), np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(ValueError, match="no input"):
        nchwc.optimize_nchwc(q, out, {"y": shape})


@pytest.mark.parametrize("config", ["BFP16", "MX9", "MXINT8", "BF16"])
def test_channels_not_a_multiple_of_the_block(tmp_path, config):
    """onnxruntime pads a blocked tensor's channels to the next multiple of B: 12 channels with
    AVX2's blocks of 8, 24 with AVX-512's blocks of 16 (which reads 12-channel tensors in NCHW).
    A BFP / MX node between two convolutions reads the padded tensor, with nchwc_channels the
    real count, whether its blocks are larger than B or not; a BF16 node keeps its conversions.
    The outputs keep every bit, special values included."""
    channels = (24, 24, 24) if BLOCK == 16 else (12, 12, 12)
    q = str(tmp_path / "q.onnx")
    quantize_model(_cnn(tmp_path / "m.onnx", channels=channels), q, config)
    out = str(tmp_path / "q_nchwc.onnx")
    report = nchwc.optimize_nchwc(q, out)
    if channels[0] % BLOCK:
        if config == "BF16":
            assert report.rewritten == [] and report.reorders_after == report.reorders_before
            assert any("not a multiple" in k for k in report.kept), report.kept
        else:
            assert report.rewritten, report.kept
            assert report.reorders_after == report.reorders_before - 2 * len(report.rewritten)
            real = [helper.get_attribute_value(a) for n in onnx.load(out).graph.node
                    for a in n.attribute if a.name == "nchwc_channels"]
            assert real == [channels[0]] * len(report.rewritten)
    for x in _inputs():
        a = _run(q, ort_mx_ops.register(ort.SessionOptions()), x)
        b = _run(out, nchwc.session_options(), x)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (config, x.shape)


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError):
        nchwc.optimize_nchwc(str(tmp_path / "missing.onnx"), str(tmp_path / "o.onnx"))
    q = str(tmp_path / "q.onnx")
    quantize_model(_cnn(tmp_path / "m.onnx"), q, "BFP16")
    before = open(q, "rb").read()
    with pytest.raises(ValueError, match="over the input"):
        nchwc.optimize_nchwc(q, q)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        nchwc.optimize_nchwc(q, str(tmp_path / "no" / "o.onnx"))
    assert open(q, "rb").read() == before
    assert nchwc.main([q, str(tmp_path / "o.onnx")]) == 0
    assert nchwc.main([str(tmp_path / "missing.onnx"), str(tmp_path / "o2.onnx")]) == 2


def test_quantize_cli(tmp_path):
    """ort-mx-quantize --nchwc writes the pre-optimised model: the same bits as quantizing
    alone; it refuses to write over its input."""
    from ort_mx_ops.quantizer import cli
    model = _cnn(tmp_path / "m.onnx")
    plain, fast = str(tmp_path / "q.onnx"), str(tmp_path / "q_nchwc.onnx")
    assert cli.main([model, plain, "--config", "BF16", "--quiet"]) == 0
    assert cli.main([model, fast, "--config", "BF16", "--nchwc", "--nchwc-shape",
                     "x=1x3x12x16", "--quiet"]) == 0
    meta = {p.key for p in onnx.load(fast).metadata_props}
    assert nchwc.METADATA_KEY in meta
    x = _inputs()[0]
    a = _run(plain, ort_mx_ops.register(ort.SessionOptions()), x)
    b = _run(fast, nchwc.session_options(), x)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    before = open(model, "rb").read()
    assert cli.main([model, model, "--config", "BF16", "--nchwc", "--quiet"]) == 2
    assert cli.main([model, fast, "--config", "BF16", "--nchwc", "--nchwc-shape", "x=1x3",
                     "--quiet"]) == 2
    assert cli.main([model, fast, "--config", "BF16", "--nchwc", "--nchwc-shape", "bad",
                     "--quiet"]) == 2
    assert cli.main([model, fast, "--config", "BF16", "--nchwc", "--external-data",
                     "--quiet"]) == 2
    assert open(model, "rb").read() == before
    assert [f for f in os.listdir(tmp_path) if f.startswith(".ort-mx")] == []


def _classifier() -> str:
    import importlib.util
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        pytest.skip("rapidocr-onnxruntime (the classifier) is not installed")
    return os.path.join(os.path.dirname(spec.origin), "models",
                        "ch_ppocr_mobile_v2.0_cls_infer.onnx")


@pytest.mark.parametrize("config", ["BFP16", "MX9", "MXFP8E4M3", "MXINT8"])
def test_classifier_bit_identical_with_fewer_conversions(tmp_path, config):
    """rapidocr's text-direction classifier (MobileNetV3): every node of ours between two
    NCHWc convolutions reads the blocked tensor (nchwc_block = B), so the layout conversions
    around them go; the outputs keep every bit, at the fixed shape and at another width."""
    q = str(tmp_path / "q.onnx")
    quantize_model(_classifier(), q, config)
    out, fixed = str(tmp_path / "q_nchwc.onnx"), str(tmp_path / "q_nchwc_fixed.onnx")
    report = nchwc.optimize_nchwc(q, out)
    assert report.rewritten, report.kept
    assert not [k for k in report.kept if "block_size" in k or "straddles" in k], report.kept
    assert report.reorders_after == report.reorders_before - 2 * len(report.rewritten)
    lanes = [helper.get_attribute_value(a) for n in onnx.load(out).graph.node
             for a in n.attribute if a.name == "nchwc_block"]
    assert lanes == [BLOCK] * len(report.rewritten)
    real = [helper.get_attribute_value(a) for n in onnx.load(out).graph.node
            for a in n.attribute if a.name == "nchwc_channels"]
    assert not [k for k in report.kept if "not a multiple" in k], report.kept
    if BLOCK == 16:  # its 8- and 24-channel tensors, padded in onnxruntime's blocked layout
        assert sorted(set(real)) == [8, 24], real
    else:
        assert real == []
    # its 9 hard-swishes before our nodes: the Div and the Add -> Clip -> Mul taken into them
    assert len(report.divisions_fused) == 9 and len(report.hardswish_fused) == 9, report
    fixed_report = nchwc.optimize_nchwc(q, fixed, {"x": [1, 3, 48, 192]})
    assert fixed_report.rewritten == report.rewritten
    rng = np.random.default_rng(1)
    plain = ort_mx_ops.register(ort.SessionOptions())
    x = rng.random((1, 3, 48, 192), dtype=np.float32)
    runs = [(out, x), (fixed, x), (out, (rng.standard_normal((2, 3, 48, 100)) * 3).astype(np.float32))]
    for path, xi in runs:
        a, b = _run(q, plain, xi), _run(path, nchwc.session_options(), xi)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (config, path, xi.shape)


@pytest.mark.parametrize("config", ["BFP16", "MXFP4E2M1", "BF16"])
def test_inference_session_at_load_time(tmp_path, config):
    """inference_session: the same rewrite as optimize_nchwc, made in memory when the session
    is created: bit-identical outputs to a plain session, the same report, nothing written."""
    q = str(tmp_path / "q.onnx")
    quantize_model(_cnn(tmp_path / "m.onnx"), q, config)
    before = {p: os.path.getmtime(tmp_path / p) for p in os.listdir(tmp_path)}
    session, report = nchwc.inference_session(q, threads=1)
    assert {p: os.path.getmtime(tmp_path / p) for p in os.listdir(tmp_path)} == before
    assert report.block == BLOCK and len(report.rewritten) == 2
    assert report.reorders_after == report.reorders_before - 4
    written = nchwc.optimize_nchwc(q, str(tmp_path / "q_nchwc.onnx"))
    assert (written.rewritten, written.kept) == (report.rewritten, report.kept)
    # the session runs the rewritten model (its metadata), not the file as it is
    meta = session.get_modelmeta().custom_metadata_map
    assert meta[nchwc.METADATA_KEY] == f"onnxruntime {ort.__version__}; NCHWc block {BLOCK}"
    plain = ort_mx_ops.register(ort.SessionOptions())
    for x in _inputs():
        a, b = _run(q, plain, x), session.run(None, {"x": x})[0]
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), config
    # A fixed shape is honoured; other shapes are refused by onnxruntime.
    fixed, _ = nchwc.inference_session(q, {"x": [1, 3, 12, 16]})
    x = _inputs()[0]
    assert np.array_equal(_run(q, plain, x).view(np.uint32), fixed.run(None, {"x": x})[0].view(np.uint32))
    with pytest.raises(Exception, match="[Ii]nvalid|dimension|shape"):
        fixed.run(None, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    with pytest.raises(ValueError, match="no input"):
        nchwc.inference_session(q, {"y": [1, 3, 12, 16]})
    with pytest.raises(FileNotFoundError):
        nchwc.inference_session(str(tmp_path / "missing.onnx"))
