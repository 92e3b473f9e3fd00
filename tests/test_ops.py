"""The ONNX Runtime ops against ort_mx_ops.reference, bit for bit: every built-in
configuration, non-default attributes, axes, ranks 1 to 5, lengths not divisible by the
block, float32 / float16 / bfloat16, and special values."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from conftest import (as_dtype, assert_bits_equal, native_and_reference, run_one_node,
                      sample_tensor)
from ort_mx_ops import reference
from ort_mx_ops.formats import CONFIGS

DTYPES = ["float32", "float16", "bfloat16"]
BLOCK_CONFIGS = {name: c for name, c in CONFIGS.items() if c.op in ("BFP", "MX")}

# (shape, axis): axis 0, 1, a middle one and -1, ranks 1 to 5, odd lengths.
LAYOUTS = [
    ((37,), 1),             # rank 1: axis ignored (default 1 included)
    ((5, 70), 1),           # innermost, 70 = not a multiple of 8/16/32
    ((45, 6), 0),           # outer axis, inner 6
    ((3, 33, 7), 1),        # middle axis
    ((2, 3, 4, 35), -1),
    ((2, 19, 3, 2, 5), 1),  # rank 5, middle axis with inner 30
    ((67, 3, 2, 1, 2), 0),  # rank 5, axis 0
]


def check(op: str, attrs: dict, x32: np.ndarray, elem: str, legacy: bool = False,
          threads: int = 1) -> None:
    x = as_dtype(x32, elem)
    name = {("BFP", False): "BFPQuantizeDequantize", ("MX", False): "MXQuantizeDequantize",
            ("BFP", True): "BFPFixNeuron", ("MX", True): "MXFixNeuron"}[(op, legacy)]
    domain = "com.vai.quantize" if legacy else "com.amd.quark"
    _, ref = native_and_reference(op)
    expected = ref(x, dtype=elem if elem == "bfloat16" else None, **attrs)
    got = run_one_node(name, domain, attrs, x, elem, threads=threads)
    assert_bits_equal(got, expected, f"{name} {attrs} {elem} {x.shape}")


@pytest.mark.parametrize("elem", DTYPES)
@pytest.mark.parametrize("config", sorted(BLOCK_CONFIGS))
@pytest.mark.parametrize("layout", LAYOUTS, ids=[f"{s}-ax{a}" for s, a in LAYOUTS])
def test_configs_layouts_dtypes(config: str, layout, elem: str) -> None:
    shape, axis = layout
    cfg = BLOCK_CONFIGS[config]
    rng = np.random.default_rng(zlib.crc32(repr((config, shape, elem)).encode()))  # stable across runs
    check(cfg.op, dict(cfg.attrs, axis=axis), sample_tensor(shape, rng), elem, threads=2)


NON_DEFAULT_BFP = [
    dict(bfp_method="to_bfp", bit_width=bw, block_size=bs, rounding_mode=rm)
    for bw in (10, 12, 24, 32) for bs in (1, 3, 8, 64) for rm in (0, 1, 2)
] + [
    dict(bfp_method=method, bit_width=bw, block_size=bs, sub_block_size=sbs,
         sub_block_shift_bits=sh, rounding_mode=rm)
    for method in ("to_bfp_prime", "to_bfp_prime_shared")
    for bw, bs, sbs, sh in ((16, 16, 1, 0), (13, 16, 4, 2), (11, 8, 8, 1), (20, 12, 3, 3),
                            (32, 16, 2, 8), (10, 4, 2, 1))
    for rm in (0, 1, 2)
] + [
    dict(bfp_method="to_bfp", convert_to_bfloat_before_bfp=1, rounding_mode=1),
    dict(bfp_method="to_bfp_prime", block_size=16, convert_to_bfloat_before_bfp=1),
    dict(),  # every default
]


@pytest.mark.parametrize("attrs", NON_DEFAULT_BFP, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "defaults")
def test_bfp_non_default_attributes(attrs: dict) -> None:
    rng = np.random.default_rng(len(str(attrs)))
    x = sample_tensor((4, 50, 3), rng)
    for elem in DTYPES:
        check("BFP", dict(attrs, axis=1), x, elem)
        check("BFP", dict(attrs, axis=-1), x, elem)


NON_DEFAULT_MX = [dict(element_dtype=e, block_size=bs, rounding_mode=rm)
                  for e in ("fp8_e5m2", "fp8_e4m3", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8")
                  for bs in (1, 5, 32, 100) for rm in (0, 1, 2)] + [dict()]


@pytest.mark.parametrize("attrs", NON_DEFAULT_MX, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "defaults")
def test_mx_non_default_attributes(attrs: dict) -> None:
    rng = np.random.default_rng(len(str(attrs)))
    x = sample_tensor((3, 130, 2), rng)
    for elem in DTYPES:
        check("MX", dict(attrs, axis=1), x, elem)


@pytest.mark.parametrize("op,attrs", [("BFP", CONFIGS["MX6"].attrs), ("MX", CONFIGS["MXFP6E2M3"].attrs)])
def test_legacy_names_equal_new_names(op: str, attrs: dict) -> None:
    x = sample_tensor((6, 40), np.random.default_rng(7))
    for elem in DTYPES:
        check(op, dict(attrs), x, elem, legacy=True)


# Blocked axis outer with rows 2 and 4 KiB apart (float32), where block_walker.h picks its walk
# by the stride: the row walk at 4 KiB, at exactly 2 KiB the column pairs for blocks of 32 rows
# (AVX-512 where the L1 has 12 ways or more: columns_at_2k) and the kept columns for MX9's
# sub-blocks, else the row walk. Through onnxruntime, so .ci/run's sanitizer job walks them too.
# Rows 2 KiB apart (two of the L1's sets), 4 KiB (one) and 6 KiB (two again).
STRIDE_LAYOUTS = [((96, 512), 0), ((101, 512), 0), ((2, 64, 512), 1), ((40, 1024), 0), ((48, 1536), 0)]


@pytest.mark.parametrize("config", sorted(BLOCK_CONFIGS))
@pytest.mark.parametrize("layout", STRIDE_LAYOUTS, ids=[f"{s}-ax{a}" for s, a in STRIDE_LAYOUTS])
def test_outer_rows_2_and_4_kib_apart(config: str, layout) -> None:
    shape, axis = layout
    cfg = BLOCK_CONFIGS[config]
    rng = np.random.default_rng(zlib.crc32(f"{config}{shape}".encode()))
    wide = sample_tensor(shape, rng)  # scales far apart, ties, zeros, special values
    narrow = (rng.standard_normal(shape) * 4).astype(np.float32)  # the plain forms, some clamped
    narrow.reshape(-1)[rng.integers(0, narrow.size, 64)] = -0.0
    for x in (wide, narrow):
        check(cfg.op, dict(cfg.attrs, axis=axis), x, "float32", threads=2)


def special_blocks() -> np.ndarray:
    """Blocks made only of edge cases: all zeros, ±0 mixes, subnormal-only, float max, Inf/NaN
    with finite neighbours, exact ties for the BFP16 / MXINT8 grids."""
    f = np.float32
    rows = [
        [0.0] * 32,
        [-0.0, 0.0] * 16,
        [1e-45, -1e-45, 1e-40, -3e-39, 5.877472e-39, 0.0, -0.0, 1.1754942e-38] * 4,
        [3.4028235e38, -3.4028235e38, 1.0, -1.0, 1e30, -1e-30, 0.0, 2.0] * 4,
        [np.inf, 1.0, 0.5, -0.25, np.nan, -np.inf, 3.0, 0.0] * 4,
        [1.0, 2.0 ** -7, -(2.0 ** -7), 3 * 2.0 ** -7, 1.0 + 2.0 ** -7, -(1.0 + 2.0 ** -7), 0.5 + 2.0 ** -8, 1.999] * 4,
        [1.0, 0.5 + 2.0 ** -7, -(0.5 + 2.0 ** -7), 1.5 * 2.0 ** -6, -1.999, 0.0, 2.0 ** -7, -(2.0 ** -7)] * 4,
        list(np.frombuffer(np.array([0x7FC00001, 0xFFFFFFFF, 0x7F800001, 0x3F800000] * 8, np.uint32).tobytes(), f)),
    ]
    return np.array(rows, dtype=f)


@pytest.mark.parametrize("config", sorted(BLOCK_CONFIGS))
@pytest.mark.parametrize("rounding_mode", [0, 1, 2])
def test_special_values(config: str, rounding_mode: int) -> None:
    cfg = BLOCK_CONFIGS[config]
    x = special_blocks()
    for elem in DTYPES:
        check(cfg.op, dict(cfg.attrs, rounding_mode=rounding_mode, axis=-1), x, elem)
        check(cfg.op, dict(cfg.attrs, rounding_mode=rounding_mode, axis=0), x.T.copy(), elem)


@pytest.mark.parametrize("shape", [(1,), (1, 1, 1), ()])
@pytest.mark.parametrize("bf16_first", [0, 1])
def test_one_element_is_returned_unchanged(shape, bf16_first: int) -> None:
    x = np.full(shape, 1.2345678, dtype=np.float32)
    attrs = dict(bfp_method="to_bfp", axis=7, convert_to_bfloat_before_bfp=bf16_first)  # axis not checked
    got = run_one_node("BFPQuantizeDequantize", "com.amd.quark", attrs, x, "float32")
    expected = reference.bf16_round(x) if bf16_first else x
    assert_bits_equal(got, expected.reshape(shape), "one element")


@pytest.mark.parametrize("shape,axis", [((0,), 1), ((3, 0, 5), 1), ((0, 4), -1)])
def test_empty_tensor_gives_empty_output(shape, axis) -> None:
    x = np.zeros(shape, dtype=np.float32)
    for op, name in (("BFP", "BFPQuantizeDequantize"), ("MX", "MXQuantizeDequantize")):
        y = run_one_node(name, "com.amd.quark", {"axis": axis}, x, "float32")
        assert y.shape == shape


def test_native_module_matches_onnxruntime() -> None:
    """The pybind module (used to fold weights offline) gives the ORT op's bits, with threads."""
    x = sample_tensor((64, 96, 5), np.random.default_rng(3))
    for name, cfg in BLOCK_CONFIGS.items():
        fn, _ = native_and_reference(cfg.op)
        for axis in (1, -1):
            attrs = dict(cfg.attrs, axis=axis)
            op = cfg.op_type
            expected = run_one_node(op, "com.amd.quark", attrs, x, "float32", threads=2)
            assert_bits_equal(fn(x, threads=3, **attrs), expected, f"native {name} axis {axis}")
            assert_bits_equal(fn(np.asfortranarray(x), **attrs), expected, "non-contiguous input")


@pytest.mark.parametrize("axis", [0, -1])
def test_block_longer_than_the_axis(axis: int) -> None:
    """block_size far beyond the axis (2^30): one zero-padded block per row, no allocation
    the size of the padding."""
    x = sample_tensor((6, 45), np.random.default_rng(4))
    for op, attrs in (("BFP", dict(bfp_method="to_bfp_prime", block_size=2 ** 30, sub_block_size=4)),
                      ("BFP", dict(bfp_method="to_bfp", block_size=2 ** 30)),
                      ("MX", dict(element_dtype="fp6_e2m3", block_size=2 ** 30))):
        check(op, dict(attrs, axis=axis), x, "float32")


@pytest.mark.parametrize("rounding_mode", [0, 1, 2])
@pytest.mark.parametrize("config", sorted(BLOCK_CONFIGS))
def test_all_subnormal_blocks(config: str, rounding_mode: int) -> None:
    """Blocks whose every element is a float32 subnormal (random mantissas, both signs, some
    zeros): the shared scale is computed from exponent field 0, so each op's smallest-scale
    path runs, innermost and outer."""
    cfg = BLOCK_CONFIGS[config]
    rng = np.random.default_rng(zlib.crc32(f"subnormal{config}{rounding_mode}".encode()))
    mant = rng.integers(0, 1 << 23, size=(12, 64), dtype=np.uint32)
    mant[:, ::2] >>= rng.integers(0, 23, size=(12, 32)).astype(np.uint32)  # tiny ones too
    sign = rng.integers(0, 2, size=mant.shape, dtype=np.uint32) << 31
    x = (sign | mant).view(np.float32)
    x[3, :] = np.float32(1e-45)                          # the smallest subnormal everywhere
    x[4, :] = (np.uint32(0x007FFFFF)).view(np.float32)   # the largest
    assert np.all(np.abs(x) < np.float32(1.1754944e-38))
    for elem in DTYPES:
        check(cfg.op, dict(cfg.attrs, rounding_mode=rounding_mode, axis=-1), x, elem)
        check(cfg.op, dict(cfg.attrs, rounding_mode=rounding_mode, axis=0), x.T.copy(), elem)


# Shapes that split into many parallel tasks with partial last units and tasks, blocked axis
# innermost (chunks of a long row) and outer (tiles of columns x blocks of rows).
SPLIT_LAYOUTS = [((3, 100003), 1), ((1201, 257), 0), ((2, 409, 401), 1)]


@pytest.mark.parametrize("config", ["MX9", "MXINT8", "BFP16", "MXFP4E2M1"])
@pytest.mark.parametrize("layout", SPLIT_LAYOUTS, ids=[f"{s}-ax{a}" for s, a in SPLIT_LAYOUTS])
def test_thread_pool_split(config: str, layout) -> None:
    """Tensors of ~300 Ki elements run as many tasks on ORT's thread pool (2 and 3 threads) and
    on the pybind module's threads: every run gives the serial result and the reference's."""
    shape, axis = layout
    cfg = BLOCK_CONFIGS[config]
    attrs = dict(cfg.attrs, axis=axis)
    x = sample_tensor(shape, np.random.default_rng(zlib.crc32(f"{config}{shape}".encode())))
    op = cfg.op_type
    nat, ref = native_and_reference(cfg.op)
    expected = ref(x, **attrs)
    serial = run_one_node(op, "com.amd.quark", attrs, x, "float32", threads=1)
    assert_bits_equal(serial, expected, f"serial {config} {shape}")
    for threads in (2, 3):
        got = run_one_node(op, "com.amd.quark", attrs, x, "float32", threads=threads)
        assert_bits_equal(got, serial, f"ORT {threads} threads {config} {shape}")
    assert_bits_equal(nat(x, threads=4, **attrs), serial, f"native 4 threads {config} {shape}")
    odd = dict(attrs, block_size=5) if cfg.op == "MX" or attrs["bfp_method"] == "to_bfp" else \
        dict(attrs, block_size=12, sub_block_size=3)  # the scalar walker's split
    assert_bits_equal(run_one_node(op, "com.amd.quark", odd, x, "float32", threads=3),
                      ref(x, **odd), f"odd blocks {config} {shape}")


def _bf16_node_model(op: str, domain: str, in_type: int, scale: np.ndarray,
                     zp_bits: np.ndarray, shape: tuple[int, ...]):
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(scale, "s"),
             helper.make_tensor("z", TensorProto.BFLOAT16, list(zp_bits.shape),
                                zp_bits.astype("<u2").tobytes(), raw=True)]
    node = helper.make_node(op, ["x", "s", "z"], ["y"], domain=domain, axis=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", in_type, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              initializer=inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


def test_bf16_dequantize_nan_results() -> None:
    """ExtendedDequantizeLinear and BF16QuantizeDequantize on the CPU give the reference's NaN
    results (x86's: a NaN operand quieted, the left one first; else 0xFFC00000), which the
    GPU kernels spell out too (tests/test_gpu_kernels.py)."""
    import gpu_cases
    from onnx import TensorProto
    from conftest import make_session
    from ort_mx_ops.formats import PRODUCT_DOMAIN, QUARK_DOMAIN
    y, x, scale, zp = gpu_cases.bf16_nan_cases()
    want = reference.extended_dequantize_linear(y, scale, zp, axis=1)
    # NaN results of several kinds: payloads of y, of zp, of scale, and the default NaN
    nan_bits = set(want.view(np.uint32)[np.isnan(want)].tolist())
    assert {0x7FC10000, 0x7FC30000, 0x7FE00001, 0xFFC00000} <= nan_bits
    sess = make_session(_bf16_node_model("ExtendedDequantizeLinear", QUARK_DOMAIN,
                                         TensorProto.BFLOAT16, scale, zp, y.shape))
    got = run_session_bf16_in(sess, y)
    assert_bits_equal(got, want)
    sess = make_session(_bf16_node_model("BF16QuantizeDequantize", PRODUCT_DOMAIN,
                                         TensorProto.FLOAT, scale, zp, x.shape))
    assert_bits_equal(sess.run(None, {"x": x})[0],
                      reference.bf16_quantize_dequantize(x, scale, zp, axis=1))


def run_session_bf16_in(sess, y_bits: np.ndarray) -> np.ndarray:
    """Runs a session whose input "x" is bfloat16 (given as bits) and output "y" float32."""
    import onnxruntime as ort
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
        np.ascontiguousarray(y_bits), 16))  # 16: TensorProto.BFLOAT16
    binding.bind_output("y")
    sess.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0]


@pytest.mark.skipif(__import__("platform").machine().lower() not in ("x86_64", "amd64"),
                    reason="x86's own NaN results are what the reference spells out")
def test_reference_nan_results_are_x86s() -> None:
    """The reference's explicit NaN rule gives what this x86 processor computes itself."""
    import gpu_cases
    y, _, scale, zp = gpu_cases.bf16_nan_cases()
    yf = (y.astype(np.uint32) << 16).view(np.float32)
    zpf = (zp.astype(np.uint32) << 16).view(np.float32)
    with np.errstate(all="ignore"):
        plain = (yf - zpf) * scale
    assert_bits_equal(reference.extended_dequantize_linear(y, scale, zp, axis=1), plain)
