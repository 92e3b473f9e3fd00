"""The CPU kernels' SIMD walkers (AVX2, AVX-512; csrc/cpu/qdq_simd.cc) against the scalar
walker, bit for bit, on random bit patterns (NaN, Inf, subnormals, zeros of both signs
included), every method / rounding mode / dtype, contiguous and strided layouts, with tails.
The scalar walker is itself checked against the numpy reference by test_ops.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

from ort_mx_ops import native

ISAS = ["avx2", "avx512"]

CASES = [
    ("BFP", dict(bfp_method="to_bfp", bit_width=16, block_size=8)),
    ("BFP", dict(bfp_method="to_bfp", bit_width=32, block_size=16)),
    ("BFP", dict(bfp_method="to_bfp", bit_width=12, block_size=32, convert_to_bfloat_before_bfp=1)),
    ("BFP", dict(bfp_method="to_bfp", bit_width=16, block_size=5)),
    ("BFP", dict(bfp_method="to_bfp_prime", bit_width=16, block_size=16)),
    ("BFP", dict(bfp_method="to_bfp_prime", bit_width=13, block_size=16)),
    ("BFP", dict(bfp_method="to_bfp_prime", bit_width=11, block_size=16)),
    ("BFP", dict(bfp_method="to_bfp_prime", bit_width=11, block_size=32, sub_block_size=4,
                 sub_block_shift_bits=2, convert_to_bfloat_before_bfp=1)),
    ("BFP", dict(bfp_method="to_bfp_prime", bit_width=14, block_size=8, sub_block_size=8)),
    ("BFP", dict(bfp_method="to_bfp_prime", bit_width=16, block_size=6, sub_block_size=3)),
] + [("MX", dict(element_dtype=e, block_size=32))
     for e in ["fp8_e5m2", "fp8_e4m3", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8"]] + [
    ("MX", dict(element_dtype="int8", block_size=4)),
    ("MX", dict(element_dtype="fp4_e2m1", block_size=64)),
]

SHAPES = [((3, 517), 1), ((5, 4096), 1), ((2, 40, 37), 1), ((48, 300), 0), ((33, 70), 0),
          ((2, 19, 3, 17), 1)]


def _inputs(shape, dtype, rng):
    n = int(np.prod(shape))
    kind = rng.integers(0, 6, n)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    normal = rng.standard_normal(n).astype(np.float32) * np.float32(2.0) ** rng.integers(-20, 20, n)
    tiny = rng.standard_normal(n).astype(np.float32) * np.float32(2.0 ** -130)
    # short dyadic values: exact ties of every rounding step
    ties = (rng.integers(-300, 300, n) * 2.0 ** rng.integers(-12, 2, n)).astype(np.float32)
    zeros = np.where(rng.random(n) < 0.5, np.float32(0.0), np.float32(-0.0))
    u = lambda a: a.astype(np.float32).view(np.uint32)  # select on bit patterns (sNaN kept)
    xb = np.select([kind == 0, kind == 1, kind == 2, kind == 3], [bits, u(tiny), u(ties), u(zeros)],
                   u(normal))
    if rng.random() < 0.3:  # whole blocks of small or tie values
        xb = np.where(rng.random(n) < 0.5, u(ties), u(zeros))
    x = xb.astype(np.uint32).view(np.float32).reshape(shape)
    if dtype == "float32":
        return x
    if dtype == "float16":
        if rng.random() < 0.3:
            return bits[:n].astype(np.uint16).view(np.float16).reshape(shape)
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def _run(op, x, dtype, attrs, isa):
    old = os.environ.get("MXOPS_CPU_ISA")
    os.environ["MXOPS_CPU_ISA"] = isa
    try:
        fn = native.bfp_quantize_dequantize if op == "BFP" else native.mx_quantize_dequantize
        return fn(x, dtype="bfloat16" if dtype == "bfloat16" else None, threads=2, **attrs)
    finally:
        if old is None:
            del os.environ["MXOPS_CPU_ISA"]
        else:
            os.environ["MXOPS_CPU_ISA"] = old


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_simd_matches_scalar(case, mode, dtype):
    op, attrs = CASES[case]
    rng = np.random.default_rng(1000 * case + 10 * mode + len(dtype))
    for shape, axis in SHAPES:
        x = _inputs(shape, dtype, rng)
        a = dict(attrs, rounding_mode=mode, axis=axis)
        want = _run(op, x, dtype, a, "scalar").view(np.uint16 if dtype != "float32" else np.uint32)
        for isa in ISAS:
            got = _run(op, x, dtype, a, isa).view(want.dtype)
            bad = np.flatnonzero(got.ravel() != want.ravel())
            assert bad.size == 0, (isa, shape, axis, a, bad[:5], x.ravel()[bad[:5]],
                                   got.ravel()[bad[:5]], want.ravel()[bad[:5]])


@pytest.mark.parametrize("per_channel", [False, True])
def test_bf16_qdq_simd_matches_scalar(per_channel):
    """ExtendedQuantizeLinear / ExtendedDequantizeLinear (bfloat16 zero point) through
    onnxruntime: the SIMD loops against the scalar ones, bit for bit."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import ort_mx_ops

    rng = np.random.default_rng(5)
    shape = (3, 7, 333)
    x = _inputs(shape, "float32", rng)
    channels = shape[1] if per_channel else 1
    scale = (rng.standard_normal(channels) * 2.0 ** rng.integers(-8, 8, channels)).astype(np.float32)
    zp_f = (rng.standard_normal(channels) * 4).astype(np.float32)
    zp = (zp_f.view(np.uint32) >> 16).astype(np.uint16)
    s_shape, axis = ([channels], 1) if per_channel else ([], 1)
    inits = [helper.make_tensor("s", TensorProto.FLOAT, s_shape, scale.tolist()),
             helper.make_tensor("z", TensorProto.BFLOAT16, s_shape, zp.tolist(), raw=False)]
    nodes = [helper.make_node("ExtendedQuantizeLinear", ["X", "s", "z"], ["Q"],
                              domain="com.amd.quark", axis=axis),
             helper.make_node("ExtendedDequantizeLinear", ["Q", "s", "z"], ["D"],
                              domain="com.amd.quark", axis=axis)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("D", TensorProto.FLOAT, shape)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.amd.quark", 1)])
    model.ir_version = 8
    so = ort.SessionOptions()
    ort_mx_ops.register(so)
    sess = ort.InferenceSession(model.SerializeToString(), so)
    outs = {}
    for isa in ["scalar"] + ISAS:
        os.environ["MXOPS_CPU_ISA"] = isa
        try:
            outs[isa] = sess.run(None, {"X": x})[0].view(np.uint32)
        finally:
            del os.environ["MXOPS_CPU_ISA"]
    for isa in ISAS:
        np.testing.assert_array_equal(outs[isa], outs["scalar"], err_msg=isa)
