"""Large float32 tensors (32 MiB) through onnxruntime (its own 64-byte aligned output buffer,
its intra-op threads over many work units) against the native module, bit for bit, on values
that exercise every fast-form boundary of the CPU walker: block maxima of every exponent,
subnormals, zeros of both signs, Inf and NaN."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ort_mx_ops
from conftest import native_and_reference
from test_cpu_simd import cpu_path
from ort_mx_ops import _native, native
from ort_mx_ops.benchmarks import graphs
from ort_mx_ops.formats import CONFIGS

SHAPE = (2048, 4096)  # 8 Mi float32 elements: a 32 MiB output


def _values(rng: np.random.Generator, shape: tuple[int, int] = SHAPE) -> np.ndarray:
    n = shape[0] * shape[1]
    block_max = (np.arange(n) // 16 * 37 % 255).astype(np.int64)
    drop = rng.integers(0, 20, n)
    e = np.where(rng.random(n) < 0.15, block_max, np.maximum(block_max - drop, 0))
    e = np.where(rng.random(n) < 0.001, 255, e)
    bits = (rng.integers(0, 2, n) << 31) | (e << 23) | rng.integers(0, 1 << 23, n)
    return bits.astype(np.uint32).view(np.float32).reshape(shape)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("config", ["MX9", "MX4", "MXINT8", "MXFP8E4M3", "MXFP4E2M1", "BFP16"])
def test_large_tensor_matches_native(config, axis):
    x = _values(np.random.default_rng(len(config) + 10 * axis))
    spec = CONFIGS[config]
    so = ort.SessionOptions()
    so.register_custom_ops_library(ort_mx_ops.get_library_path("CPU"))
    so.log_severity_level = 3
    sess = ort.InferenceSession(graphs.custom_qdq_model(config, SHAPE, axis, "float32"), so,
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, {"X": x})[0]
    fn, _ = native_and_reference(spec.op)
    want = fn(x, threads=2, axis=axis, **spec.attrs)
    bad = np.flatnonzero(got.view(np.uint32).ravel() != want.view(np.uint32).ravel())
    assert bad.size == 0, (config, axis, bad[:5], x.ravel()[bad[:5]], got.ravel()[bad[:5]],
                           want.ravel()[bad[:5]])


def _run_node(op_type: str, x: np.ndarray, attrs: dict) -> np.ndarray:
    """x through one op_type node (attributes attrs) in an onnxruntime session: the output in
    the runtime's own 64-byte aligned buffer, as the walkers that store non-temporally need."""
    so = ort.SessionOptions()
    so.register_custom_ops_library(ort_mx_ops.get_library_path("CPU"))
    so.log_severity_level = 3
    elem = TensorProto.FLOAT16 if x.dtype == np.float16 else TensorProto.FLOAT
    model = helper.make_model(helper.make_graph(
        [helper.make_node(op_type, ["X"], ["Y"], domain="com.amd.quark", **attrs)], "g",
        [helper.make_tensor_value_info("X", elem, list(x.shape))],
        [helper.make_tensor_value_info("Y", elem, list(x.shape))]),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.amd.quark", 1)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": x})[0]


# Blocked axis outer, float32 outputs of 16 MiB and more: the SIMD walkers store them
# non-temporally (csrc/cpu/block_walker.h, kStreamBytes; AVX-512 as it computes, AVX2 in
# row pairs), full tiles with their vector count fixed at compile time, and the
# microexponent formats reorder their stores for it. The scalar path never streams: both
# must give the same bits, also where the last tile has an odd number of vectors (4104
# columns), the last block is partial (2047 rows) and the input starts 16 bytes past a
# cache line (numpy's own placement; the tile prefetch then covers one line more per row).
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("shape,offset", [(SHAPE, 0), ((2047, 4104), 4)])
@pytest.mark.parametrize("config,extra", [
    ("MX9", {}), ("MX4", {}), ("MX9", {"rounding_mode": 0}), ("BFP16", {}),
    ("MXINT8", {}), ("MXFP8E4M3", {})])
def test_streamed_outer_axis_matches_scalar_path(config, extra, shape, offset, isa, monkeypatch):
    monkeypatch.setenv("MXOPS_CPU_ISA", isa)
    if native.cpu_isa() != isa:
        pytest.skip(f"this processor cannot run the {isa} path (it runs {native.cpu_isa()})")
    spec = CONFIGS[config]
    attrs = {**spec.attrs, **extra}
    values = _values(np.random.default_rng(7), shape).ravel()
    # the input `offset` floats past a 64-byte boundary (onnxruntime reads numpy's memory)
    buf = np.empty(values.size + 32, np.float32)
    start = (-(buf.ctypes.data // 4) % 16) + offset
    x = buf[start:start + values.size].reshape(shape)
    x[...] = values.reshape(shape)
    assert x.ctypes.data % 64 == offset * 4
    got = _run_node(spec.op_type, x, dict(attrs, axis=0))
    assert native.cpu_isa() == isa
    fn, _ = native_and_reference(spec.op)
    monkeypatch.setenv("MXOPS_CPU_ISA", "scalar")
    want = fn(x, threads=2, axis=0, **attrs)
    bad = np.flatnonzero(got.view(np.uint32).ravel() != want.view(np.uint32).ravel())
    assert bad.size == 0, (config, extra, shape, bad[:5], x.ravel()[bad[:5]],
                           got.ravel()[bad[:5]], want.ravel()[bad[:5]])


# Inputs of 16 MiB and more, out of place: the SIMD walkers take the least bit pattern of
# MXINT8 / BFP16 blocks (where a -0 or a negative x below the quantum's tiny bound needs the
# sign fix-up) in the second pass, and compute the blocks again with the fix-up where they
# find one (csrc/cpu/block_walker.h: blocked axis innermost, blocks_plain's kMinAfter, W
# blocks at a time; outer, whole_block_rows<true>, a full tile of blocks of 16 rows or
# more); in place and below 16 MiB, in the first pass. Runs of blocks with and without such
# values (innermost about one element in 500 is a -0 or a negative subnormal; outer one in
# 10,000, so that about a third of MXINT8's tiles, 32 rows of 128 columns, hold one) in rows
# of ordinary values and in rows of _values' boundaries, float32 (also divided by
# input_divisor as it is loaded) and float16, against the scalar path, which has neither walk.
# Out of place into numpy's output buffer and into onnxruntime's, which is aligned as the
# non-temporal stores of the blocked axis outer need (numpy's is not: normal stores, and at
# rows a multiple of 2 KiB apart the row walk).
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("shape", [(1024, 4096), (1023, 4104)])
@pytest.mark.parametrize("dtype,extra", [("float32", {}), ("float32", {"input_divisor": 3}),
                                         ("float16", {})])
@pytest.mark.parametrize("config", ["MXINT8", "BFP16"])
def test_negative_zeros_match_scalar_path(config, dtype, extra, shape, isa, in_place, axis):
    rng = np.random.default_rng(shape[0] + len(config))
    if dtype == "float16":
        shape = (2 * shape[0], shape[1])  # 16 MiB of 2-byte elements
    x = _values(rng, shape)
    # half the rows ordinary values (one scale a row), where most runs of W blocks are plain;
    # blocked axis outer, half the groups of 32 rows, so that whole tiles are finite
    if axis == 1:
        rows = np.flatnonzero(rng.random(shape[0]) < 0.5)
    else:
        rows = np.flatnonzero(np.repeat(rng.random(shape[0] // 32 + 1) < 0.5, 32)[:shape[0]])
    top = 8 if dtype == "float16" else 20
    x[rows] = rng.standard_normal((rows.size, shape[1])) * 2.0 ** rng.integers(-top, top, (rows.size, 1))
    x = x.ravel()
    rate = 0.001 if axis == 1 else 0.00005
    x[np.flatnonzero(rng.random(x.size) < rate)] = -0.0
    tiny = np.flatnonzero(rng.random(x.size) < rate)
    x[tiny] = -rng.integers(1, 1 << 23, tiny.size).astype(np.uint32).view(np.float32)
    if dtype == "float16":  # negative float16 subnormals and -0 in place of the float32 ones
        with np.errstate(over="ignore"):  # (_values' large exponents become Inf)
            x = x.astype(np.float16)
        x[tiny] = -rng.integers(1, 1 << 10, tiny.size).astype(np.uint16).view(np.float16)
    x = x.reshape(shape)
    assert x.nbytes >= 16 << 20
    spec = CONFIGS[config]
    attrs = dict(spec.attrs, axis=axis, **extra)
    with cpu_path(isa):
        if in_place:
            outputs = {"in place": _native.quantize_dequantize(spec.op, x, attrs, "", 2, in_place=True)}
        else:
            outputs = {"numpy's buffer": _native.quantize_dequantize(spec.op, x, attrs, "", 2),
                       "onnxruntime's": _run_node(spec.op_type, x, attrs)}
    with cpu_path("scalar"):
        want = _native.quantize_dequantize(spec.op, x, attrs, "", 2, in_place=False)
    u = np.uint16 if dtype == "float16" else np.uint32
    for where, got in outputs.items():
        bad = np.flatnonzero(got.view(u).ravel() != want.view(u).ravel())
        assert bad.size == 0, (where, config, dtype, extra, shape, isa, axis, bad[:5],
                               x.ravel()[bad[:5]], got.ravel()[bad[:5]], want.ravel()[bad[:5]])
