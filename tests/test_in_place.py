"""The CPU kernels in place: onnxruntime may give a BFP / MX or BF16QuantizeDequantize node's
output the buffer of its input (csrc/ort/kernels.h, may_run_in_place), so every walk must
give the same bits reading and writing one buffer. The kernel directly (``_native`` with
``in_place=True``: the result's buffer starts as a copy of x and is both the kernel's input
and output) on every CPU path, against the numpy reference; and models whose quantize node
reads the output of another node, through onnxruntime."""
from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import ELEM_TYPES, as_dtype, assert_bits_equal, make_session, native_and_reference
from ort_mx_ops import _native, formats, reference
from test_cpu_simd import CASES, _inputs, cpu_path
from test_nchwc_kernel import _stored

ISAS = ["scalar", "avx2", "avx512"]

# Blocked axis innermost (chunks with tails), outer with rows 280 B apart (column walk), 1 KiB
# (plain columns in place, where the output's own lines would have sent 32 rows to the kept
# columns), 2 KiB (row walk for 16 and 32 rows, kept columns for sub-blocks on a 12-way L1,
# kept or plain columns for 8), 4 KiB (row walk, kept tile), and a middle axis.
SHAPES = [((3, 517), 1), ((2, 40, 37), 1), ((48, 70), 0), ((64, 256), 0), ((64, 512), 0),
          ((40, 1024), 0), ((96, 512), 0), ((2, 19, 3, 17), 1)]


def _in_place(op: str, x: np.ndarray, dtype: str, attrs: dict) -> np.ndarray:
    out = _native.quantize_dequantize(op, x, attrs, "bfloat16" if dtype == "bfloat16" else "",
                                      2, in_place=True)
    assert out.ctypes.data != x.ctypes.data  # x itself is left alone
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_walk_in_place_matches_reference(case, isa):
    op, attrs = CASES[case]
    _, ref = native_and_reference(op)
    rng = np.random.default_rng(zlib.crc32(f"{case} {isa}".encode()))
    for shape, axis in SHAPES:
        x = _inputs(shape, "float32", rng)
        kept = x.copy()
        a = dict(attrs, axis=axis)
        with cpu_path(isa):
            got = _in_place(op, x, "float32", a)
        assert_bits_equal(got, ref(x, **a), f"{op} {attrs} {shape} axis {axis} {isa}")
        assert_bits_equal(x, kept, "the input was changed")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("config", ["MXINT8", "MX9", "BFP16", "MXFP4E2M1"])
def test_16_bit_types_in_place(config, dtype, isa):
    spec = formats.CONFIGS[config]
    _, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(zlib.crc32(f"{config} {dtype} {isa}".encode()))
    bf = "bfloat16" if dtype == "bfloat16" else None
    for shape, axis in SHAPES + [((64, 2048), 0)]:
        x = _inputs(shape, dtype, rng)
        a = dict(spec.attrs, axis=axis)
        with cpu_path(isa):
            got = _in_place(spec.op, x, dtype, a)
        assert_bits_equal(got, ref(x, dtype=bf, **a), f"{config} {dtype} {shape} {isa}")


# The NCHWc view (nchwc_block), with padding channels (nchwc_channels): the padded block is
# zeroed and walked in the output's buffer, which is here the input's.
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("config", ["MXINT8", "MX9", "BFP16", "MXFP4E2M1"])
def test_nchwc_in_place(config, lanes, isa):
    spec = formats.CONFIGS[config]
    _, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(zlib.crc32(f"{config} {lanes} {isa}".encode()))
    for channels in (2 * lanes, lanes + 3, 5 * lanes + 3):
        padded = -(-channels // lanes) * lanes
        for spatial in ((5, 7), (12, 96)):
            full = _inputs((2, padded, *spatial), "float32", rng)
            full[:, channels:] = rng.choice(np.array([np.nan, np.inf, 1e30], np.float32),
                                            size=full[:, channels:].shape)
            x = _stored(full, lanes)
            a = dict(spec.attrs, axis=1, nchwc_block=lanes, nchwc_channels=channels)
            with cpu_path(isa):
                got = _in_place(spec.op, x, "float32", a)
            assert_bits_equal(got, ref(x, **a), f"{config} L={lanes} c={channels} {spatial} {isa}")


# float32 outputs of 16 MiB and more are written with non-temporal stores (block_walker.h,
# kStreamBytes): in place, the lines a stream store wrote are read by no later block.
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_streaming_stores_in_place(isa):
    spec = formats.CONFIGS["MXINT8"]
    nat, _ = native_and_reference(spec.op)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2048, 2048)) * 8).astype(np.float32)
    a = dict(spec.attrs, axis=0)
    with cpu_path(isa):
        got = _in_place(spec.op, x, "float32", a)
        # (the out-of-place kernel on this path is checked against the reference by
        # test_cpu_large.py; the reference over 4 Mi elements would dominate this file's time)
        assert_bits_equal(got, nat(x, threads=2, **a), f"MXINT8 [2048, 2048] {isa}")


def _chain_model(op: str, domain: str, attrs: dict, elem: str, shape: list[int],
                 second_reader: bool) -> onnx.ModelProto:
    """x -> Neg -> t -> op -> y: t is a buffer onnxruntime allocated, so the planner may give
    y the same one. second_reader: t is also read by an Abs (output z)."""
    nodes = [helper.make_node("Neg", ["x"], ["t"]),
             helper.make_node(op, ["t"], ["y"], domain=domain, **attrs)]
    outputs = [helper.make_tensor_value_info("y", ELEM_TYPES[elem], shape)]
    if second_reader:
        nodes.append(helper.make_node("Abs", ["t"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", ELEM_TYPES[elem], shape))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", ELEM_TYPES[elem], shape)],
                              outputs)
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


@pytest.mark.parametrize("second_reader", [False, True])
@pytest.mark.parametrize("elem", ["float32", "float16"])
@pytest.mark.parametrize("config", ["MXINT8", "MX9", "BFP16", "MXFP4E2M1"])
def test_through_onnxruntime_after_another_node(config, elem, second_reader):
    spec = formats.CONFIGS[config]
    name, domain = formats.block_op(spec.op)
    _, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(zlib.crc32(f"{config} {elem}".encode()))
    for shape, axis in [((2, 48, 9, 11), 1), ((64, 512), 0), ((5, 96), 1)]:
        x = as_dtype((rng.standard_normal(shape) * 2.0 ** rng.integers(-8, 8, shape)).astype(np.float32), elem)
        attrs = dict(spec.attrs, axis=axis)
        sess = make_session(_chain_model(name, domain, attrs, elem, list(shape), second_reader), threads=2)
        out = sess.run(None, {"x": x})
        assert_bits_equal(out[0], ref(-x, **attrs), f"{config} {elem} {shape}")
        if second_reader:
            assert_bits_equal(out[1], np.abs(x), "the other reader of the quantized tensor")


def test_bf16_quantize_dequantize_after_another_node():
    domain = formats.OPS["BF16QuantizeDequantize"].domain
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 40, 50)) * 2.0 ** rng.integers(-8, 8, (3, 40, 50))).astype(np.float32)
    scale = (rng.standard_normal(40) * 2.0 ** rng.integers(-8, 8, 40)).astype(np.float32)
    zero_point = ((rng.standard_normal(40) * 4).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    nodes = [helper.make_node("Neg", ["x"], ["t"]),
             helper.make_node("BF16QuantizeDequantize", ["t", "s", "zp"], ["y"], domain=domain, axis=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        initializer=[helper.make_tensor("s", TensorProto.FLOAT, [40], scale.tolist()),
                     helper.make_tensor("zp", TensorProto.BFLOAT16, [40], zero_point.tobytes(), raw=True)])
    model = helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    got = make_session(model, threads=2).run(None, {"x": x})[0]
    assert_bits_equal(got, reference.bf16_quantize_dequantize(-x, scale, zero_point, axis=1))
