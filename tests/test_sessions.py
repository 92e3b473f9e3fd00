"""Session behaviour: many threads sharing one session, inputs left untouched, changing ranks
between runs, the BF16 quantize / dequantize ops, and the library loader."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ort_mx_ops
from conftest import (ELEM_TYPES, as_dtype, assert_bits_equal, make_session,
                      native_and_reference, one_node_model, poisoned_like, run_session,
                      sample_tensor)
from ort_mx_ops import reference
from ort_mx_ops.formats import CONFIGS, PRODUCT_DOMAIN


@pytest.mark.parametrize("config", ["MX6", "MXFP4E2M1", "BFP16"])
def test_eight_threads_share_one_session(config: str) -> None:
    cfg = CONFIGS[config]
    op = cfg.op_type
    sess = make_session(one_node_model(op, "com.amd.quark", dict(cfg.attrs, axis=1)), threads=2)
    rng = np.random.default_rng(11)
    inputs = [sample_tensor(shape, rng) for shape in
              [(64, 256), (3, 1000, 7), (4096,), (2, 50, 3, 9), (128, 33)] * 4]
    serial = [run_session(sess, x, "float32") for x in inputs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        parallel = list(pool.map(lambda x: run_session(sess, x, "float32"), inputs))
    for x, a, b in zip(inputs, serial, parallel):
        assert_bits_equal(b, a, f"threaded run of shape {x.shape}")


@pytest.mark.parametrize("elem", ["float32", "float16", "bfloat16"])
def test_input_buffer_is_unchanged(elem: str) -> None:
    x = as_dtype(sample_tensor((16, 64), np.random.default_rng(5)), elem)
    before = x.copy()
    attrs = dict(CONFIGS["BFP16"].attrs, convert_to_bfloat_before_bfp=1)  # rounds a private copy
    run_session(make_session(one_node_model("BFPQuantizeDequantize", "com.amd.quark", attrs, elem)),
                x, elem)
    assert_bits_equal(x, before, "input after the run")


def test_rank_changes_between_runs() -> None:
    sess = make_session(one_node_model("MXQuantizeDequantize", "com.amd.quark",
                                       dict(CONFIGS["MXINT8"].attrs, axis=-1)))
    rng = np.random.default_rng(2)
    for shape in [(70,), (3, 70), (2, 3, 70), (2, 1, 3, 70), (), (1, 1), (5, 0)]:
        x = sample_tensor(shape, rng, specials=False) if np.prod(shape) else np.zeros(shape, np.float32)
        expected = reference.mx_quantize_dequantize(x, **dict(CONFIGS["MXINT8"].attrs, axis=-1))
        assert_bits_equal(run_session(sess, x, "float32"), expected, f"shape {shape}")


def _shape_probe(config: str, elem: str, shape) -> onnx.ModelProto:
    """y = our node (config, blocked along axis 1) on x, and s = Shape(y); both outputs are
    declared without shapes, so what onnxruntime knows of them comes from our node's shape
    inference."""
    cfg = CONFIGS[config]
    nodes = [helper.make_node(cfg.op_type, ["x"], ["y"], domain="com.amd.quark",
                              **dict(cfg.attrs, axis=1)),
             helper.make_node("Shape", ["y"], ["s"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", ELEM_TYPES[elem], shape)],
        [helper.make_tensor_value_info("y", ELEM_TYPES[elem], None),
         helper.make_tensor_value_info("s", TensorProto.INT64, None)])
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.amd.quark", 1)])


def _optimized(model: onnx.ModelProto, tmp_path) -> tuple[ort.InferenceSession, list[str]]:
    """A session of `model` (our ops registered, onnxruntime's basic optimisations) and the
    op types of the graph those optimisations left."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort_mx_ops.register(so)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess, [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]


def _reference(config: str, x: np.ndarray) -> np.ndarray:
    cfg = CONFIGS[config]
    return native_and_reference(cfg.op)[1](x, **dict(cfg.attrs, axis=1))


# Our nodes tell onnxruntime their output's shape and type (those of the input), so it can
# optimise what follows them: here it folds Shape(y) into a constant. The outputs stay the op's.
@pytest.mark.parametrize("elem", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("config", ["MXINT8", "BFP16", "MX9"])
def test_output_shape_is_inferred(config: str, elem: str, tmp_path) -> None:
    shape = [2, 32, 3, 3]
    sess, ops = _optimized(_shape_probe(config, elem, shape), tmp_path)
    assert ops == [CONFIGS[config].op_type]
    y_info = sess.get_outputs()[0]
    assert y_info.shape == shape
    assert y_info.type == {"float32": "tensor(float)", "float16": "tensor(float16)",
                           "bfloat16": "tensor(bfloat16)"}[elem]
    if elem == "bfloat16":  # (numpy has no bfloat16 for sess.run; test_ops runs that type)
        return
    x = as_dtype(sample_tensor(tuple(shape), np.random.default_rng(5), specials=False), elem)
    y, s = sess.run(None, {"x": x})
    assert_bits_equal(y, _reference(config, x), f"{config} {elem}")
    assert s.tolist() == shape


# Named dimensions carry over, a dimension with neither value nor name gets a name of its own
# (onnxruntime reports it to a custom op as -1, which as a value would be wrong), and an input
# without a shape gives nothing (onnxruntime reports it as rank 0: a shape of rank 0 would have
# made Shape(y) a constant). Shape(y) stays a node, and every rank runs.
@pytest.mark.parametrize("shape,inferred", [(["batch", 32, "h"], ["batch", 32, "h"]),
                                            ([None, 32], ["*", 32]), (None, [])])
def test_output_shape_partly_known(shape, inferred, tmp_path) -> None:
    sess, ops = _optimized(_shape_probe("MXINT8", "float32", shape), tmp_path)
    got = sess.get_outputs()[0].shape
    assert len(got) == len(inferred)
    for g, want in zip(got, inferred):
        if want == "*":
            assert isinstance(g, str) and g.startswith("ort_mx_ops_unk_"), got
        else:
            assert g == want, got
    assert "Shape" in ops
    for run_shape in ([4, 32, 5], [3, 32]) if shape else ([70], [3, 32], [2, 32, 1, 4]):
        if shape and len(run_shape) != len(shape):
            continue
        x = sample_tensor(tuple(run_shape), np.random.default_rng(6), specials=False)
        y, s = sess.run(None, {"x": x})
        assert_bits_equal(y, _reference("MXINT8", x))
        assert s.tolist() == run_shape


def bf16_model(op: str, domain: str, per_channel: int | None, axis: int = 1,
               shape: list | None = None):
    quantize = op in ("ExtendedQuantizeLinear", "VitisQuantizeLinear")
    fused = op == "BF16QuantizeDequantize"
    in_type, out_type = ((TensorProto.FLOAT, TensorProto.BFLOAT16) if quantize else
                         (TensorProto.FLOAT, TensorProto.FLOAT) if fused else
                         (TensorProto.BFLOAT16, TensorProto.FLOAT))
    n = per_channel or 1
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [n] if per_channel else [],
                               np.linspace(0.5, 4.0, n).astype(np.float32).tolist())
    zp_bits = reference.float32_to_bfloat16_bits(np.linspace(-2, 2, n).astype(np.float32))
    zp = helper.make_tensor("zp", TensorProto.BFLOAT16, [n] if per_channel else [],
                            zp_bits.tobytes(), raw=True)
    node = helper.make_node(op, ["x", "scale", "zp"], ["y"], domain=domain, axis=axis)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", in_type, shape)],
                              [helper.make_tensor_value_info("y", out_type, None)],
                              initializer=[scale, zp])
    model = helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    return model, np.linspace(0.5, 4.0, n).astype(np.float32), zp_bits


def run_bf16(model, x: np.ndarray, in_elem: str, out_dtype) -> np.ndarray:
    sess = make_session(model)
    y = poisoned_like(np.empty(x.shape, out_dtype), "bfloat16" if out_dtype == np.uint16 else "float32")
    binding = sess.io_binding()
    elem = {"float32": TensorProto.FLOAT, "bfloat16": TensorProto.BFLOAT16}
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x, elem[in_elem]))
    out_elem = elem["bfloat16" if out_dtype == np.uint16 else "float32"]
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(y, out_elem))
    sess.run_with_iobinding(binding)
    return y


@pytest.mark.parametrize("domain,names", [
    ("com.amd.quark", ("ExtendedQuantizeLinear", "ExtendedDequantizeLinear")),
    ("com.vai.quantize", ("VitisQuantizeLinear", "VitisDequantizeLinear"))])
@pytest.mark.parametrize("per_channel", [None, 6])
def test_bf16_quantize_dequantize(domain: str, names, per_channel) -> None:
    x = sample_tensor((3, 6, 10), np.random.default_rng(9))
    q_model, scale, zp = bf16_model(names[0], domain, per_channel)
    q = run_bf16(q_model, x, "float32", np.uint16)
    assert_bits_equal(q, reference.extended_quantize_linear(x, scale, zp, axis=1), "quantize")
    dq_model, _, _ = bf16_model(names[1], domain, per_channel)
    dq = run_bf16(dq_model, q, "bfloat16", np.float32)
    assert_bits_equal(dq, reference.extended_dequantize_linear(q, scale, zp, axis=1), "dequantize")


def test_bf16_quantize_by_hand() -> None:
    # scale 1, zero point 0: 1 + 2^-8 is half a bfloat16 step above 1 (tie -> even 0x3F80);
    # 1 + 3 * 2^-8 is a tie between 0x3F81 and 0x3F82 (-> even 0x3F82); NaN -> 0x7FC1.
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, np.nan, -2.0, np.inf], np.float32)
    expected = [0x3F80, 0x3F82, 0x7FC1, 0xC000, 0x7F80]
    assert reference.extended_quantize_linear(x, np.float32(1), np.uint16(0)).tolist() == expected
    # Through onnxruntime, per-tensor scale 0.5 and zero point -2: y = bf16(2x - 2).
    model, _, _ = bf16_model("ExtendedQuantizeLinear", "com.amd.quark", None)
    x = np.array([1.5, 1 + 2 ** -9, np.nan, 0.0, -1.0], np.float32)
    got = run_bf16(model, x, "float32", np.uint16)
    assert got.tolist() == [0x3F80, 0x3B80, 0x7FC1, 0xC000, 0xC080]  # 1, 2^-8, NaN, -2, -4


@pytest.mark.parametrize("per_channel", [None, 6])
@pytest.mark.parametrize("shape", [(3, 6, 10), (2, 6, 1037)])
def test_bf16_fused_node_gives_the_pairs_bits(per_channel, shape) -> None:
    """BF16QuantizeDequantize (our domain) against the numpy reference and against the
    Extended pair run through onnxruntime, bit for bit, specials included."""
    x = sample_tensor(shape, np.random.default_rng(10))
    model, scale, zp = bf16_model("BF16QuantizeDequantize", PRODUCT_DOMAIN, per_channel)
    got = run_bf16(model, x, "float32", np.float32)
    assert_bits_equal(got, reference.bf16_quantize_dequantize(x, scale, zp, axis=1), "fused")
    q = run_bf16(bf16_model("ExtendedQuantizeLinear", "com.amd.quark", per_channel)[0], x,
                 "float32", np.uint16)
    pair = run_bf16(bf16_model("ExtendedDequantizeLinear", "com.amd.quark", per_channel)[0], q,
                    "bfloat16", np.float32)
    assert_bits_equal(got, pair, "fused vs the Extended pair")


def test_bf16_fused_by_hand() -> None:
    # scale 1, zero point 0: 1 + 2^-8 ties to 1; 1 + 3 * 2^-8 ties to even 1 + 2^-6;
    # NaN -> bfloat16 0x7FC1 -> float32 0x7FC10000; Inf and a subnormal bfloat16 has stay.
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, np.nan, -2.0, np.inf, 1.5 * 2.0 ** -130],
                 np.float32)
    want = np.array([0x3F800000, 0x3F820000, 0x7FC10000, 0xC0000000, 0x7F800000, 0x000C0000],
                    np.uint32)
    ref = reference.bf16_quantize_dequantize(x, np.float32(1), np.uint16(0))
    assert ref.view(np.uint32).tolist() == want.tolist()
    model = bf16_model("BF16QuantizeDequantize", PRODUCT_DOMAIN, None)[0]
    node = model.graph.node[0]
    model.graph.initializer[0].float_data[:] = [1.0]
    model.graph.initializer[1].raw_data = np.uint16(0).tobytes()
    assert node.input[1:] == ["scale", "zp"]
    assert run_bf16(model, x, "float32", np.float32).view(np.uint32).tolist() == want.tolist()


# The BF16 ops infer their output's shape too, with their output's type (the y of the model
# is declared without a shape).
@pytest.mark.parametrize("op,out_type", [("ExtendedQuantizeLinear", "tensor(bfloat16)"),
                                         ("ExtendedDequantizeLinear", "tensor(float)"),
                                         ("BF16QuantizeDequantize", "tensor(float)")])
def test_bf16_output_shape_is_inferred(op: str, out_type: str) -> None:
    domain = PRODUCT_DOMAIN if op == "BF16QuantizeDequantize" else "com.amd.quark"
    model, _, _ = bf16_model(op, domain, 6, shape=["n", 6, 5])
    y = make_session(model).get_outputs()[0]
    assert (y.shape, y.type) == (["n", 6, 5], out_type)


def test_bf16_scale_size_mismatch_is_an_error() -> None:
    model, _, _ = bf16_model("ExtendedQuantizeLinear", "com.amd.quark", 4)
    with pytest.raises(Exception, match="scale"):
        run_bf16(model, np.ones((2, 6), np.float32), "float32", np.uint16)


def test_loader() -> None:
    assert "CPU" in ort_mx_ops.available_devices()
    assert ort_mx_ops.get_library_path().endswith("libort_mx_ops_cpu.so")
    assert ort_mx_ops.get_library_path("cpu") == ort_mx_ops.get_library_path("CPU")
    with pytest.raises(ValueError, match="device"):
        ort_mx_ops.get_library_path("TPU")
    so = ort_mx_ops.register(ort.SessionOptions())
    assert isinstance(so, ort.SessionOptions)
