"""``input_divisor`` (docs/formats.md, "A divisor before the blocks"): a BFP / MX node with
``input_divisor = d`` gives, bit for bit, what onnxruntime's ``Div`` by the float32 ``d``
followed by the same node gives, and what the numpy reference gives, on every CPU path, in
both layouts and in place; the attribute's errors; and the NCHWc pre-optimisation taking a
hard-swish's ``Div`` by 6 into the node after it without changing an output bit."""
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

CONFIGS = [name for name, spec in formats.CONFIGS.items() if spec.op != "BF16"]
ISAS = ["scalar", "avx2", "avx512"]
# (shape, axis): blocked axis outer (NCHW channels), innermost, a tail block, one element
SHAPES = [((1, 48, 6, 24), 1), ((3, 96), -1), ((2, 40, 5), 1), ((1, 1), 1), ((1, 64, 1, 1), 1)]
_OPSET = [helper.make_opsetid("", 17), helper.make_opsetid(formats.QUARK_DOMAIN, 1)]


def _node_attrs(config: str, axis: int, **extra) -> tuple[str, dict]:
    spec = formats.FormatSpec.from_name(config)
    return spec.op_type, dict(spec.node_attrs(axis), **extra)


def _model(op: str, attrs: dict, divisor: float | None, before: str | None = None
           ) -> onnx.ModelProto:
    """y = op(x) with `attrs`; `divisor`: y = op(Div(x, divisor)), the Div a node of its own;
    `before` ("Relu"): that op first, so that onnxruntime may run ours in place."""
    nodes, inits, prev = [], [], "x"
    if before:
        nodes.append(helper.make_node(before, [prev], ["b"], name="before"))
        prev = "b"
    if divisor is not None:
        inits.append(numpy_helper.from_array(np.array(divisor, np.float32), "d"))
        nodes.append(helper.make_node("Div", [prev, "d"], ["q"], name="div"))
        prev = "q"
    nodes.append(helper.make_node(op, [prev], ["y"], domain=formats.QUARK_DOMAIN, name="n0",
                                  **attrs))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, ir_version=8, opset_imports=_OPSET)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("config", CONFIGS)
def test_same_bits_as_div_then_op(config, isa):
    rng = np.random.default_rng(abs(hash((config, isa))) % 2**32)
    with cpu_path(isa):
        for shape, axis in SHAPES:
            for d in (6, 7):
                op, attrs = _node_attrs(config, axis)
                x = _inputs(shape, "float32", rng)
                two_nodes = run_session(make_session(_model(op, attrs, float(d))), x, "float32")
                one_node = run_session(make_session(_model(op, dict(attrs, input_divisor=d),
                                                           None)), x, "float32")
                context = f"{config} {isa} {shape} axis {axis} / {d}"
                assert_bits_equal(one_node, two_nodes, context)
                _, ref = native_and_reference(formats.FormatSpec.from_name(config).op)
                assert_bits_equal(one_node, ref(x, input_divisor=d, **attrs), context + " (reference)")


@pytest.mark.parametrize("config", ["BFP16", "MX9", "MXINT8", "MXFP4E2M1"])
def test_divisors_at_the_ends_of_the_range(config):
    """d = 1 (a Div by 1 still quiets a signalling NaN) and d = 2^24 (many results
    subnormal or zero)."""
    rng = np.random.default_rng(3)
    op, attrs = _node_attrs(config, 1)
    for d in (1, formats.MAX_INPUT_DIVISOR):
        x = _inputs((2, 64, 3, 5), "float32", rng)
        x.flat[::41] = np.array(0x7F800001, np.uint32).view(np.float32)  # signalling NaN
        two_nodes = run_session(make_session(_model(op, attrs, float(d))), x, "float32")
        one_node = run_session(make_session(_model(op, dict(attrs, input_divisor=d), None)),
                               x, "float32")
        assert_bits_equal(one_node, two_nodes, f"{config} / {d}")


@pytest.mark.parametrize("config", ["BFP16", "MX6", "MXINT8", "MXFP8E4M3"])
def test_in_place_and_threads(config):
    """Our node reading another node's output (onnxruntime may give it that buffer to write
    into), with one and two intra-op threads."""
    rng = np.random.default_rng(5)
    op, attrs = _node_attrs(config, 1)
    x = _inputs((1, 96, 20, 24), "float32", rng)
    for threads in (1, 2):
        two_nodes = run_session(make_session(_model(op, attrs, 6.0, "Relu"), threads), x, "float32")
        one_node = run_session(make_session(_model(op, dict(attrs, input_divisor=6), None, "Relu"),
                                            threads), x, "float32")
        assert_bits_equal(one_node, two_nodes, f"{config}, {threads} threads")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("config", ["BFP16", "MX9", "MX4", "MXINT8", "MXFP6E2M3"])
def test_nchwc_view_with_a_divisor(config, isa):
    """nchwc_block and input_divisor together, padding channels included (native module)."""
    spec = formats.FormatSpec.from_name(config)
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(11)
    with cpu_path(isa):
        for lanes, channels, real in ((8, 48, 48), (16, 48, 40), (16, 64, 64)):
            x = _inputs((1, channels, 3, 7), "float32", rng)
            attrs = dict(spec.node_attrs(1), nchwc_block=lanes, input_divisor=6)
            if real < channels:
                attrs["nchwc_channels"] = real
            assert_bits_equal(nat(x, **attrs), ref(x, **attrs), f"{config} {isa} L={lanes}")


def _activations(shape: tuple[int, ...], rng: np.random.Generator, specials: bool) -> np.ndarray:
    """Hard-swish outputs times 6 (the Div's input in a CNN: finite, a sixth of them -0, so
    the walks' fast and plain forms run), their scale varying by block; `specials`: a NaN, an
    Inf and a subnormal here and there too, so the forms' fallbacks run."""
    x = np.float32(3) * rng.standard_normal(shape).astype(np.float32)
    x = x * np.clip(x + np.float32(3), 0, 6) * np.float32(2.0) ** rng.integers(-8, 8, shape)
    if specials:
        flat = x.reshape(-1)
        flat[::997] = np.nan
        flat[5::1499] = -np.inf
        flat[7::211] = np.float32(3e-39)
    return x.astype(np.float32)


# (shape, axis, nchwc_block): the walks that read a block twice, which keep the quotients of
# their first pass for the second: W blocks at a time along rows (blocked axis innermost,
# rows of 512 elements and more), column pairs and kept columns down the rows (blocked axis
# outer; rows 9216, 576 and 3136 bytes apart), and W pixels at a time in the NCHWc view; and
# the row walk (rows 2 KiB apart), which divides at both passes.
WALK_CASES = [((4, 1536), -1, 0), ((1, 96, 24, 96), 1, 0), ((1, 40, 12, 12), 1, 0),
              ((1, 64, 28, 28), 1, 0), ((1, 64, 6, 40), 1, 8), ((1, 64, 6, 40), 1, 16),
              ((1, 48, 5, 19), 1, 16), ((1, 64, 8, 64), 1, 0)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("config", CONFIGS)
def test_walks_that_keep_the_quotients(config, isa):
    """Every block configuration on the walks of WALK_CASES, finite activations and ones with
    specials: the same bits as the node on the input divided beforehand (numpy's float32
    division, correctly rounded as onnxruntime's Div) and as the reference."""
    spec = formats.FormatSpec.from_name(config)
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(abs(hash((config, isa, "walks"))) % 2**32)
    with cpu_path(isa):
        for shape, axis, lanes in WALK_CASES:
            for specials in (False, True):
                x = _activations(shape, rng, specials)
                attrs = dict(spec.node_attrs(axis))
                if lanes:
                    attrs["nchwc_block"] = lanes
                context = f"{config} {isa} {shape} axis {axis} L={lanes} specials={specials}"
                got = nat(x, input_divisor=6, **attrs)
                assert_bits_equal(got, nat(x / np.float32(6), **attrs), context)
                assert_bits_equal(got, ref(x, input_divisor=6, **attrs), context + " (reference)")


@pytest.mark.parametrize("isa", ISAS)
def test_walks_divided_with_bfloat16_rounding_first(isa):
    """BFP16 with convert_to_bfloat_before_bfp on the walks of WALK_CASES, d = 1 and 6, values
    near the float32 maximum among them (bfloat16 rounding turns those into Inf after the
    division by 1: the first passes that divide only a block's statistics must see it too)."""
    nat, ref = native_and_reference("BFP")
    rng = np.random.default_rng(17)
    with cpu_path(isa):
        for shape, axis, lanes in WALK_CASES:
            x = _activations(shape, rng, specials=False)
            flat = x.reshape(-1)
            flat[3::301] = np.float32(3.4e38)
            flat[4::401] = np.float32(-3.39e38)
            attrs = dict(formats.FormatSpec.from_name("BFP16").node_attrs(axis),
                         convert_to_bfloat_before_bfp=1)
            if lanes:
                attrs["nchwc_block"] = lanes
            for d in (1, 6):
                context = f"{isa} {shape} axis {axis} L={lanes} / {d}"
                got = nat(x, input_divisor=d, **attrs)
                assert_bits_equal(got, nat(x / np.float32(d), **attrs), context)
                assert_bits_equal(got, ref(x, input_divisor=d, **attrs), context + " (reference)")


def test_errors():
    op, attrs = _node_attrs("MXINT8", 1)
    for bad in (-1, formats.MAX_INPUT_DIVISOR + 1):
        with pytest.raises(Exception, match="input_divisor"):
            make_session(_model(op, dict(attrs, input_divisor=bad), None))
        nat, ref = native_and_reference("MX")
        for fn in (nat, ref):
            with pytest.raises(ValueError, match="input_divisor"):
                fn(np.ones((1, 32), np.float32), input_divisor=bad, **attrs)
    # float16: onnxruntime's Div would divide in float16; the attribute is for float32 only
    sess = _float16_session(op, dict(attrs, input_divisor=6))
    with pytest.raises(Exception, match="input_divisor.*float32"):
        sess.run(None, {"x": np.ones((1, 32), np.float16)})
    nat, ref = native_and_reference("MX")
    for fn in (nat, ref):
        with pytest.raises(ValueError, match="input_divisor.*float32"):
            fn(np.ones((1, 32), np.float16), input_divisor=6, **attrs)


def _float16_session(op: str, attrs: dict) -> ort.InferenceSession:
    """A session of one node of ours, `op` with `attrs`, on a float16 input."""
    node = helper.make_node(op, ["x"], ["y"], domain=formats.QUARK_DOMAIN, name="n0", **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    return make_session(helper.make_model(g, ir_version=8, opset_imports=_OPSET))


def _hard_swish_cnn(path: str, divisor: float = 6.0, second_reader: bool = False) -> str:
    """x -> Conv -> hard-swish as x * clip(x + 3, 0, 6) / divisor -> Conv -> y (48 channels);
    `second_reader`: the Div's output also goes to the graph output `z`."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((48, 3, 3, 3)) * 0.3).astype(np.float32), "w0"),
             numpy_helper.from_array((rng.standard_normal((48, 48, 1, 1)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array(np.array(3.0, np.float32), "three"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6.0, np.float32), "six"),
             numpy_helper.from_array(np.array(divisor, np.float32), "div")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Add", ["c0", "three"], ["a"], name="add3"),
             helper.make_node("Clip", ["a", "zero", "six"], ["r6"], name="relu6"),
             helper.make_node("Mul", ["c0", "r6"], ["m"], name="mul"),
             helper.make_node("Div", ["m", "div"], ["h"], name="div6"),
             helper.make_node("Conv", ["h", "w1"], ["y"], name="conv1")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 48, "h", "w"])]
    if second_reader:
        nodes.append(helper.make_node("Identity", ["h"], ["z"], name="also"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 48, "h", "w"]))
    g = helper.make_graph(nodes, "hswish", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, "h", "w"])], outputs, inits)
    onnx.save(helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.mark.parametrize("config", ["BFP16", "MX9", "MXINT8", "MXFP4E2M1"])
def test_nchwc_takes_the_division_into_our_node(tmp_path, config):
    q = str(tmp_path / "q.onnx")
    quantize_model(_hard_swish_cnn(str(tmp_path / "m.onnx")), q, get_config(config))
    out = str(tmp_path / "q_nchwc.onnx")
    report = nchwc.optimize_nchwc(q, out)
    assert len(report.divisions_fused) == 1, report
    m = onnx.load(out)
    ours = [n for n in m.graph.node if n.domain == formats.QUARK_DOMAIN]
    divided = [n for n in ours if any(a.name == "input_divisor" and a.i == 6 for a in n.attribute)]
    assert len(divided) == 1 and not any(n.op_type == "Div" for n in m.graph.node)
    plain = ort.InferenceSession(q, ort_mx_ops.register(ort.SessionOptions()),
                                 providers=["CPUExecutionProvider"])
    pre = ort.InferenceSession(out, nchwc.session_options(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for shape in ((1, 3, 12, 16), (1, 3, 7, 9)):
        x = (rng.standard_normal(shape) * 4).astype(np.float32)
        x.flat[::13] = 0.0
        x.flat[3] = np.nan
        x.flat[5] = -np.inf
        assert_bits_equal(pre.run(None, {"x": x})[0], plain.run(None, {"x": x})[0],
                          f"{config} {shape}")


def test_nchwc_leaves_other_divisions(tmp_path):
    """A divisor that is not a whole number, and a Div whose output has a second reader."""
    for name, kw in (("frac", dict(divisor=6.5)), ("shared", dict(second_reader=True))):
        q = str(tmp_path / f"{name}_q.onnx")
        quantize_model(_hard_swish_cnn(str(tmp_path / f"{name}.onnx"), **kw), q, get_config("MX9"))
        out = str(tmp_path / f"{name}_n.onnx")
        report = nchwc.optimize_nchwc(q, out)
        assert report.divisions_fused == [], name
        assert any(n.op_type == "Div" for n in onnx.load(out).graph.node), name
