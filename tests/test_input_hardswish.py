"""``input_hardswish`` (docs/formats.md, "Hard-swish before the blocks"): a BFP / MX node with
``input_hardswish = 1`` gives, bit for bit, what onnxruntime's ``Add(x, 3) -> Clip(0, 6) ->
Mul(x, .)`` (and a ``Div`` by 6, as ``input_divisor``) followed by the same node gives, and what
the numpy reference gives, on every CPU path, in both layouts, in place and with two threads;
the attribute's errors; and the NCHWc pre-optimisation taking a hard-swish's numerator into
the node after it without changing an output bit."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_mx_ops
from conftest import assert_bits_equal, make_session, native_and_reference, run_session
from ort_mx_ops import formats
from ort_mx_ops.quantizer import get_config, quantize_model
from ort_mx_ops.quantizer import nchwc
from test_cpu_simd import _inputs, cpu_path
# (the configurations, CPU paths, shapes, opsets and node attributes of the input_divisor tests)
from test_input_divisor import (CONFIGS, ISAS, SHAPES, _OPSET, _float16_session, _hard_swish_cnn,
                                _node_attrs)

_F32 = np.float32
# Values where the three steps meet their edges: -3 (t = +0), just above and below it, the
# clip's ends (t = 0 and 6), -0, the infinities, a quiet and a signalling NaN with payloads,
# float32's extremes and subnormals.
_EDGES = np.array([-3.0, np.nextafter(_F32(-3), _F32(0)), np.nextafter(_F32(-3), _F32(-4)), 3.0,
                   np.nextafter(_F32(3), _F32(4)), -0.0, 0.0, np.inf, -np.inf, 3.4e38, -3.4e38,
                   1e-45, -1e-45, -2.9999998, -1.5], np.float32)


def _with_edges(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(-1).copy()
    n = min(len(flat), len(_EDGES))
    flat[:n] = _EDGES[:n]
    if len(flat) > n + 2:
        flat[n] = np.array(0x7FC12345, np.uint32).view(np.float32)      # quiet NaN
        flat[n + 1] = np.array(0xFF800001, np.uint32).view(np.float32)  # signalling NaN
    return flat.reshape(x.shape)


def _model(op: str, attrs: dict, nodes_first: bool, divisor: float | None = None,
           before: str | None = None, mul_order: tuple[int, int] = (0, 1)) -> onnx.ModelProto:
    """y = op(x) with `attrs`; `nodes_first`: y = op(Mul(x, Clip(Add(x, 3), 0, 6))) with the
    three steps as onnxruntime nodes (`mul_order`: the Mul's operand order), then a Div by
    `divisor` where given; `before` ("Relu"): that op first, so that onnxruntime may run ours
    in place."""
    nodes, inits, prev = [], [], "x"
    if before:
        nodes.append(helper.make_node(before, [prev], ["b"], name="before"))
        prev = "b"
    if nodes_first:
        inits += [numpy_helper.from_array(np.array(v, np.float32), n)
                  for n, v in (("three", 3.0), ("zero", 0.0), ("six", 6.0))]
        operands = [prev, "c"]
        nodes += [helper.make_node("Add", [prev, "three"], ["t"], name="add3"),
                  helper.make_node("Clip", ["t", "zero", "six"], ["c"], name="relu6"),
                  helper.make_node("Mul", [operands[mul_order[0]], operands[mul_order[1]]], ["m"],
                                   name="mul")]
        prev = "m"
        if divisor is not None:
            inits.append(numpy_helper.from_array(np.array(divisor, np.float32), "d"))
            nodes.append(helper.make_node("Div", [prev, "d"], ["q"], name="div"))
            prev = "q"
    nodes.append(helper.make_node(op, [prev], ["y"], domain=formats.QUARK_DOMAIN, name="n0",
                                  **attrs))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, ir_version=8, opset_imports=_OPSET)


def test_reference_numerator_matches_onnxruntime():
    """The reference's x * clip(x + 3, 0, 6) is onnxruntime's Add -> Clip -> Mul bit for bit on
    every edge value and on random bit patterns (NaN payloads included)."""
    rng = np.random.default_rng(1)
    x = _with_edges(_inputs((64, 64), "float32", rng))
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "three"], ["t"]), helper.make_node("Clip", ["t", "zero", "six"], ["c"]),
         helper.make_node("Mul", ["x", "c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("three", 3.0), ("zero", 0.0), ("six", 6.0))])
    m = helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    from ort_mx_ops.reference import _hardswished
    assert_bits_equal(_hardswished(x, None, 1, "test"), got, "numerator")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("config", CONFIGS)
def test_same_bits_as_the_nodes_then_op(config, isa):
    rng = np.random.default_rng(abs(hash((config, isa, "hardswish"))) % 2**32)
    _, ref = native_and_reference(formats.FormatSpec.from_name(config).op)
    with cpu_path(isa):
        for shape, axis in SHAPES:
            for divisor in (None, 6):
                op, attrs = _node_attrs(config, axis)
                x = _with_edges(_inputs(shape, "float32", rng))
                nodes = run_session(make_session(_model(op, attrs, True, divisor)), x, "float32")
                fused = dict(attrs, input_hardswish=1)
                if divisor:
                    fused["input_divisor"] = divisor
                one_node = run_session(make_session(_model(op, fused, False)), x, "float32")
                context = f"{config} {isa} {shape} axis {axis} / {divisor}"
                assert_bits_equal(one_node, nodes, context)
                assert_bits_equal(one_node, ref(x, **fused), context + " (reference)")


@pytest.mark.parametrize("config", ["BFP16", "MX6", "MXINT8", "MXFP8E4M3"])
def test_in_place_threads_and_operand_order(config):
    """Our node reading another node's output (onnxruntime may give it that buffer to write
    into), one and two intra-op threads, the Mul's operands either way round."""
    rng = np.random.default_rng(5)
    op, attrs = _node_attrs(config, 1)
    x = _with_edges(_inputs((1, 96, 20, 24), "float32", rng))
    fused = dict(attrs, input_hardswish=1, input_divisor=6)
    for threads in (1, 2):
        one_node = run_session(make_session(_model(op, fused, False, before="Relu"), threads),
                               x, "float32")
        for order in ((0, 1), (1, 0)):
            nodes = run_session(make_session(_model(op, attrs, True, 6.0, "Relu", order), threads),
                                x, "float32")
            assert_bits_equal(one_node, nodes, f"{config}, {threads} threads, Mul {order}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("config", ["BFP16", "MX9", "MX4", "MXINT8", "MXFP6E2M3"])
def test_nchwc_view_with_hardswish(config, isa):
    """nchwc_block with input_hardswish (and input_divisor), padding channels included: the
    native module against the reference and against the node on the numerator computed
    beforehand."""
    spec = formats.FormatSpec.from_name(config)
    nat, ref = native_and_reference(spec.op)
    from ort_mx_ops.reference import _hardswished
    rng = np.random.default_rng(11)
    with cpu_path(isa):
        for lanes, channels, real in ((8, 48, 48), (16, 48, 40), (16, 64, 64), (16, 32, 24)):
            x = _with_edges(_inputs((1, channels, 3, 7), "float32", rng))
            attrs = dict(spec.node_attrs(1), nchwc_block=lanes)
            if real < channels:
                attrs["nchwc_channels"] = real
            for extra in ({}, {"input_divisor": 6}):
                context = f"{config} {isa} L={lanes} C={channels} real={real} {extra}"
                got = nat(x, input_hardswish=1, **extra, **attrs)
                assert_bits_equal(got, ref(x, input_hardswish=1, **extra, **attrs), context)
                assert_bits_equal(got, nat(_hardswished(x, None, 1, "t"), **extra, **attrs),
                                  context + " (numerator first)")


def test_errors():
    op, attrs = _node_attrs("MXINT8", 1)
    nat, ref = native_and_reference("MX")
    for bad in (-1, 2):
        with pytest.raises(Exception, match="input_hardswish"):
            make_session(_model(op, dict(attrs, input_hardswish=bad), False))
        for fn in (nat, ref):
            with pytest.raises(ValueError, match="input_hardswish"):
                fn(np.ones((1, 32), np.float32), input_hardswish=bad, **attrs)
    # float16: the Add, Clip and Mul would round in float16; the attribute is for float32 only
    sess = _float16_session(op, dict(attrs, input_hardswish=1))
    with pytest.raises(Exception, match="input_hardswish.*float32"):
        sess.run(None, {"x": np.ones((1, 32), np.float16)})
    for fn in (nat, ref):
        with pytest.raises(ValueError, match="input_hardswish.*float32"):
            fn(np.ones((1, 32), np.float16), input_hardswish=1, **attrs)


@pytest.mark.parametrize("config", ["BFP16", "MX9", "MXINT8", "MXFP4E2M1"])
def test_nchwc_takes_the_numerator_into_our_node(tmp_path, config):
    q = str(tmp_path / "q.onnx")
    quantize_model(_hard_swish_cnn(str(tmp_path / "m.onnx")), q, get_config(config))
    out = str(tmp_path / "q_nchwc.onnx")
    report = nchwc.optimize_nchwc(q, out)
    assert len(report.divisions_fused) == 1 and len(report.hardswish_fused) == 1, report
    m = onnx.load(out)
    ours = [n for n in m.graph.node if n.domain == formats.QUARK_DOMAIN]
    fused = [n for n in ours if any(a.name == "input_hardswish" and a.i == 1 for a in n.attribute)]
    assert len(fused) == 1
    assert not any(n.op_type in ("Add", "Clip", "Mul", "Div") for n in m.graph.node), \
        [n.op_type for n in m.graph.node]
    plain = ort.InferenceSession(q, ort_mx_ops.register(ort.SessionOptions()),
                                 providers=["CPUExecutionProvider"])
    pre = ort.InferenceSession(out, nchwc.session_options(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for shape in ((1, 3, 12, 16), (1, 3, 7, 9)):
        x = (rng.standard_normal(shape) * 4).astype(np.float32)
        x.flat[::13] = 0.0
        x.flat[3] = np.nan
        x.flat[5] = -np.inf
        x.flat[7] = np.inf
        assert_bits_equal(pre.run(None, {"x": x})[0], plain.run(None, {"x": x})[0],
                          f"{config} {shape}")


def _edit_constant(path: str, name: str, value: float) -> str:
    m = onnx.load(path)
    for t in m.graph.initializer:
        if t.name == name:
            t.CopyFrom(numpy_helper.from_array(np.array(value, np.float32), name))
    onnx.save(m, path)
    return path


def test_nchwc_leaves_other_chains(tmp_path):
    """Constants other than 3, +0 and 6 (6.5, -0, 2.5) and a numerator with a second reader
    keep their nodes; the Div before our node is still taken where it qualifies."""
    cases = [("max", "six", 6.5), ("negzero", "zero", -0.0), ("add", "three", 2.5)]
    for name, const, value in cases:
        m = _edit_constant(_hard_swish_cnn(str(tmp_path / f"{name}.onnx")), const, value)
        q = str(tmp_path / f"{name}_q.onnx")
        quantize_model(m, q, get_config("MX9"))
        report = nchwc.optimize_nchwc(q, str(tmp_path / f"{name}_n.onnx"))
        assert report.hardswish_fused == [], name
        assert len(report.divisions_fused) == 1, name
    q = str(tmp_path / "shared_q.onnx")
    quantize_model(_hard_swish_cnn(str(tmp_path / "shared.onnx"), second_reader=True), q,
                   get_config("MX9"))
    report = nchwc.optimize_nchwc(q, str(tmp_path / "shared_n.onnx"))
    assert report.hardswish_fused == [] and report.divisions_fused == []
