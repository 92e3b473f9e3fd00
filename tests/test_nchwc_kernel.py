"""The BFP / MX kernels on a tensor stored in onnxruntime's NCHWc layout (attribute
``nchwc_block``, docs/formats.md "NCHWc layout"): bit for bit against the numpy reference
(which rebuilds the logical tensor, applies the op along axis 1 and stores it back), on every
CPU path, for every built-in BFP / MX configuration and the variants the walker treats
differently; through onnxruntime; and the errors for attribute values and inputs it cannot
take."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper

from conftest import (assert_bits_equal, make_session, native_and_reference, one_node_model,
                      run_one_node, run_session)
from ort_mx_ops import formats, native
from test_cpu_simd import _inputs, _near_clamp_blocks, _with_zero_blocks, cpu_path

ISAS = ["scalar", "avx2", "avx512"]
CONFIGS = [name for name, spec in formats.CONFIGS.items() if spec.op != "BF16"]
CHANNELS = [16, 24, 40, 64]
# (N, spatial...): a column tile with a tail, several tiles (9 * 40 * L columns), rank 3 and 5
SPATIAL = [(1, 5, 7), (2, 3, 11), (1, 9, 40), (2, 13), (1, 2, 3, 5)]


def _adversarial(shape, dtype, rng):
    """test_cpu_simd's random bit patterns (NaN, Inf, subnormals, +-0, ties), and whole
    pixels (every channel of one spatial position: the NCHWc blocks) at extreme exponents:
    near float max (exponent field 254), the smallest normals, subnormals only, ties only."""
    x = _inputs(shape, dtype, rng)
    if dtype != "float32" or len(shape) < 3:
        return x
    x = x.copy()
    n, c = shape[:2]
    pixels = x.reshape(n, c, -1)
    big = (np.float32(2.0) ** 127 * (1 + rng.random(c))).astype(np.float32)
    fills = [big * np.where(rng.random(c) < 0.5, -1, 1).astype(np.float32),
             (rng.standard_normal(c) * 2.0 ** -125).astype(np.float32),
             (rng.standard_normal(c) * 2.0 ** -140).astype(np.float32),
             ((rng.integers(-40, 40, c) + 0.5) * 2.0 ** -3).astype(np.float32)]
    for k, fill in enumerate(fills):
        if pixels.shape[2] > k:
            pixels[rng.integers(0, n), :, k] = fill
    return x


def _stored(logical, lanes):
    """The NCHWc memory order [N, C/L, d2, ..., L] of the logical tensor [N, C, d2, ...], in a
    buffer of the logical shape (what the op with nchwc_block = L reads)."""
    n, c, *spatial = logical.shape
    blocked = np.moveaxis(logical.reshape(n, c // lanes, lanes, *spatial), 2, -1)
    return np.ascontiguousarray(blocked).reshape(logical.shape)


def _check(op, attrs, x, dtype, isa, context):
    nat, ref = native_and_reference(op)
    bf = "bfloat16" if dtype == "bfloat16" else None
    want = ref(x, dtype=bf, **attrs)
    with cpu_path(isa):
        got = nat(x, dtype=bf, threads=2, **attrs)
    assert_bits_equal(got, want, context)


def _every_config_lanes_dtype_path(test):
    """The test parametrised over every BFP / MX configuration, L = 8 and 16, the three dtypes
    and every CPU path."""
    for name, values in [("isa", ISAS), ("dtype", ["float32", "float16", "bfloat16"]),
                         ("lanes", [8, 16]), ("config", CONFIGS)]:
        test = pytest.mark.parametrize(name, values)(test)
    return test


@_every_config_lanes_dtype_path
def test_configs_match_reference(config, lanes, dtype, isa):
    spec = formats.CONFIGS[config]
    rng = np.random.default_rng(zlib.crc32(f"{config} {lanes} {dtype}".encode()))
    for c in CHANNELS:
        if c % lanes:
            continue
        for n, *spatial in SPATIAL:
            shape = (n, c, *spatial)
            x = _adversarial(shape, dtype, rng)
            attrs = dict(spec.attrs, axis=1, nchwc_block=lanes)
            _check(spec.op, attrs, x, dtype, isa, f"{config} L={lanes} {dtype} {shape} {isa}")


# What the walker treats differently: rounding modes, to_bfp's wide mantissa, bfloat16
# rounding first, sub-blocks that span rows (sub_block_size > lanes), sub-blocks of one
# element, block sizes that are not powers of two, a block that divides the NCHWc block
# (the flat view), lanes narrower and wider than a vector.
VARIANTS = [
    ("BFP", dict(bfp_method="to_bfp", bit_width=32, block_size=16, rounding_mode=0), [8, 16]),
    ("BFP", dict(bfp_method="to_bfp", bit_width=12, block_size=24, rounding_mode=1,
                 convert_to_bfloat_before_bfp=1), [8]),
    ("BFP", dict(bfp_method="to_bfp", bit_width=16, block_size=4, rounding_mode=2), [4, 8, 16]),
    ("BFP", dict(bfp_method="to_bfp_prime", bit_width=13, block_size=16, rounding_mode=0), [2, 4, 8]),
    ("BFP", dict(bfp_method="to_bfp_prime", bit_width=11, block_size=32, sub_block_size=16,
                 sub_block_shift_bits=2, rounding_mode=1, convert_to_bfloat_before_bfp=1), [8, 16]),
    ("BFP", dict(bfp_method="to_bfp_prime", bit_width=14, block_size=32, sub_block_size=4,
                 rounding_mode=2), [2, 8, 32]),
    ("BFP", dict(bfp_method="to_bfp_prime", bit_width=16, block_size=16, sub_block_size=1,
                 sub_block_shift_bits=3), [8]),
    ("MX", dict(element_dtype="int8", block_size=16, rounding_mode=0), [8, 16]),
    ("MX", dict(element_dtype="int8", block_size=32, rounding_mode=1), [8, 32]),
    ("MX", dict(element_dtype="fp8_e5m2", block_size=64), [8, 16, 64]),
    ("MX", dict(element_dtype="fp6_e2m3", block_size=48), [8, 16]),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", range(len(VARIANTS)))
def test_variants_match_reference(case, dtype, isa):
    op, attrs, lane_list = VARIANTS[case]
    rng = np.random.default_rng(100 + case)
    for lanes in lane_list:
        for c in (lanes, 3 * lanes, 64):
            if c % lanes:
                continue
            for n, *spatial in SPATIAL[:3]:
                shape = (n, c, *spatial)
                x = _adversarial(shape, dtype, rng)
                _check(op, dict(attrs, axis=1, nchwc_block=lanes), x, dtype, isa,
                       f"{attrs} L={lanes} {dtype} {shape} {isa}")


# MX9 / MX6 / MX4 (blocks of 16 channels, sub-blocks of 2) where a block is one row of the
# NCHWc view: the channels end halfway through a block (8, 24 or 40 channels with L = 8) or a
# block is one NCHWc group (L = 16). The walker has a path for these one-row blocks, W pixels
# at a time and one pixel vector at a time for the pixels left over (5 x 7 and 3 x 11 pixels),
# and the blocks of two rows beside them (24 and 40 channels). 8 channels (the whole tensor
# one partial block) is not in CHANNELS; the others repeat test_configs_match_reference's
# shapes for these three formats in one place.
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("config", ["MX9", "MX6", "MX4"])
def test_one_row_blocks_match_reference(config, dtype, isa):
    spec = formats.CONFIGS[config]
    rng = np.random.default_rng(zlib.crc32(f"one row {config} {dtype}".encode()))
    for lanes, channels in [(8, 8), (8, 24), (8, 40), (16, 16), (16, 48)]:
        for n, *spatial in SPATIAL[:3]:
            shape = (n, channels, *spatial)
            x = _adversarial(shape, dtype, rng)
            _check(spec.op, dict(spec.attrs, axis=1, nchwc_block=lanes), x, dtype, isa,
                   f"{config} L={lanes} {dtype} {shape} {isa}")


# Rows of many pixels: the CPU walker's NCHWc work units then span several 128-column tiles
# (about 16 Ki elements each: 4096 columns for MXINT8 with nchwc_block 8) and the row's last
# unit is partial; a block narrower than the NCHWc block (BFP16, L 8) takes the flat view.
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("config", ["MXINT8", "MX9", "BFP16", "MXFP4E2M1"])
def test_units_of_many_tiles_match_reference(config, lanes, isa):
    spec = formats.CONFIGS[config]
    rng = np.random.default_rng(zlib.crc32(f"wide {config} {lanes}".encode()))
    nat, ref = native_and_reference(spec.op)
    for shape in [(1, 32, 24, 41), (2, 16, 7, 300)]:
        x = _adversarial(shape, "float32", rng)
        attrs = dict(spec.attrs, axis=1, nchwc_block=lanes)
        want = ref(x, **attrs)
        for threads in (1, 2):
            with cpu_path(isa):
                got = nat(x, threads=threads, **attrs)
            assert_bits_equal(got, want, f"{config} L={lanes} {shape} {isa} threads={threads}")


def test_layout_is_the_blocked_memory_order():
    """nchwc_block = L reads [N, C/L, H, W, L]: the same numbers as the plain op on the
    logical tensor, stored back in the blocked order (and different from the plain op on
    the same buffer)."""
    rng = np.random.default_rng(3)
    n, c, h, w, lanes = 2, 40, 3, 5, 8
    logical = (rng.standard_normal((n, c, h, w)) * 2.0 ** rng.integers(-8, 8, (n, c, h, w))
               ).astype(np.float32)
    blocked = _stored(logical, lanes)
    attrs = dict(formats.CONFIGS["MX9"].attrs, axis=1)
    plain = native.bfp_quantize_dequantize(logical, **attrs)
    got = native.bfp_quantize_dequantize(blocked, nchwc_block=lanes, **attrs)
    unblocked = got.reshape(n, c // lanes, h, w, lanes).transpose(0, 1, 4, 2, 3).reshape(n, c, h, w)
    assert_bits_equal(unblocked, plain, "blocked result, reordered")
    assert not np.array_equal(native.bfp_quantize_dequantize(blocked, **attrs), got)


@pytest.mark.parametrize("config", ["MX9", "MXFP8E4M3", "MXINT8", "BFP16"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_through_onnxruntime(config, dtype):
    spec = formats.CONFIGS[config]
    op, domain = formats.block_op(spec.op)
    rng = np.random.default_rng(11)
    ref = native_and_reference(spec.op)[1]
    bf = "bfloat16" if dtype == "bfloat16" else None
    for lanes in (8, 16):
        attrs = dict(spec.attrs, axis=1, nchwc_block=lanes)
        sess = make_session(one_node_model(op, domain, attrs, dtype), threads=2)
        for c in (16, 48):
            x = _adversarial((1, c, 6, 9), dtype, rng)
            want = ref(x, dtype=bf, **attrs)
            assert_bits_equal(run_session(sess, x, dtype), want, f"{config} L={lanes} C={c}")
    legacy = formats.block_op(spec.op, legacy=True)
    x = _adversarial((1, 32, 4, 4), dtype, rng)
    attrs = dict(spec.attrs, axis=-3, nchwc_block=8)  # axis 1 counted from the end
    want = ref(x, dtype=bf, **attrs)
    assert_bits_equal(run_one_node(*legacy, attrs, x, dtype), want, f"{config} legacy")


# nchwc_channels: onnxruntime pads a blocked tensor's channels to a multiple of L. The real
# channels' results equal the plain op on the logical tensor of those channels alone, whatever
# the padding holds (NaN, Inf, huge values: a convolution's padding lanes can hold anything);
# the padding's results are +0. Channel counts below one group, a group and a bit, blocks cut
# short by the last real channel, and real groups in several blocks before the padded one. The
# kernel walks the groups before the block that holds the padding straight from the input, and
# copies that block's groups with the padding zeroed into the output to work there in place
# (quantize_dequantize_padded, qdq_cpu.cc).
def _check_padding(config, lanes, dtype, isa, channels, spatials, seed):
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(zlib.crc32(f"{seed} {config} {lanes} {dtype}".encode()))
    bf = "bfloat16" if dtype == "bfloat16" else None
    junk = {"float32": np.array([np.nan, np.inf, -3e38, 1e30], np.float32).view(np.uint32),
            "float16": np.array([np.nan, np.inf, -6e4, 1e4], np.float16).view(np.uint16),
            "bfloat16": np.array([0x7fc0, 0x7f80, 0xff7f, 0x7149], np.uint16)}[dtype]
    for c in channels:
        padded = -(-c // lanes) * lanes
        for n, *spatial in spatials:
            logical = _adversarial((n, c, *spatial), dtype, rng)
            full = np.concatenate([logical, np.zeros((n, padded - c, *spatial), logical.dtype)], 1)
            pad = full[:, c:].view(junk.dtype)
            pad[...] = rng.choice(junk, size=pad.shape)
            attrs = dict(spec.attrs, axis=1, nchwc_block=lanes, nchwc_channels=c)
            x = _stored(full, lanes)
            before = x.view(junk.dtype).copy()
            with cpu_path(isa):
                got = nat(x, dtype=bf, threads=2, **attrs)
            want = ref(x, dtype=bf, **attrs)
            ctx = f"{config} L={lanes} c={c} {dtype} {full.shape} {isa}"
            assert_bits_equal(got, want, ctx)
            # the definition, independently of the reference's NCHWc code
            plain = ref(logical, dtype=bf, **spec.attrs, axis=1)
            expect = np.concatenate([plain, np.zeros((n, padded - c, *spatial), plain.dtype)], 1)
            assert_bits_equal(want, _stored(expect, lanes), ctx + " (reference)")
            assert np.array_equal(x.view(junk.dtype), before), "the input was changed"


@_every_config_lanes_dtype_path
def test_padding_channels_are_left_out(config, lanes, dtype, isa):
    _check_padding(config, lanes, dtype, isa,
                   (lanes // 2 + 1, lanes + 3, 2 * lanes + lanes // 2, 3 * lanes - 2, 4 * lanes + 1),
                   SPATIAL[:3],
                   "pad")


# Planes large enough for several work units per block (12 x 96 pixels: up to 18432 columns),
# two batches, on two threads; the padded group alone in its block (L + 3) or beside real
# groups (5 L + 3), 4- and 2-byte elements.
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("config", CONFIGS)
def test_padding_channels_large_planes(config, lanes, dtype, isa):
    _check_padding(config, lanes, dtype, isa, (lanes + 3, 5 * lanes + 3), [(2, 12, 96)],
                   "pad large")


def test_empty_and_rank_two_inputs():
    for shape in [(0, 16, 3, 3), (2, 0, 3), (1, 16, 0, 4)]:
        x = np.zeros(shape, np.float32)
        for fn in native_and_reference("MX"):
            assert fn(x, nchwc_block=8).shape == shape
    x = _adversarial((3, 48), "float32", np.random.default_rng(5))
    _check("MX", dict(block_size=32, nchwc_block=16), x, "float32", "avx2" if
           native.cpu_isa() != "scalar" else "scalar", "rank 2")


BAD = [
    # (attributes, input shape, words the error names)
    (dict(nchwc_block=3), (1, 48, 2, 2), ["nchwc_block", "power of two"]),
    (dict(nchwc_block=12, block_size=24), (1, 48, 2, 2), ["nchwc_block", "power of two"]),
    (dict(nchwc_block=256), (1, 256, 2, 2), ["nchwc_block", "128"]),
    (dict(nchwc_block=-1), (1, 16, 2, 2), ["nchwc_block"]),
    (dict(nchwc_block=8, block_size=12), (1, 48, 2, 2), ["nchwc_block", "block_size"]),
    (dict(nchwc_block=8, axis=2), (1, 16, 8, 2), ["axis"]),
    (dict(nchwc_block=8, axis=0), (16, 16, 2, 2), ["axis"]),
    (dict(nchwc_block=8), (1, 20, 2, 2), ["nchwc_block", "20"]),
    (dict(nchwc_block=8), (64,), ["nchwc_block", "rank"]),
    (dict(nchwc_block=8, bfp_method="to_bfp_prime", block_size=24, sub_block_size=3),
     (1, 48, 2, 2), ["sub_block_size"]),
    (dict(nchwc_block=8, bfp_method="to_bfp_prime", block_size=24, sub_block_size=12),
     (1, 48, 2, 2), ["sub_block_size"]),
    (dict(nchwc_channels=12), (1, 16, 2, 2), ["nchwc_channels", "nchwc_block"]),
    (dict(nchwc_block=8, nchwc_channels=16), (1, 24, 2, 2), ["nchwc_channels", "16"]),
    (dict(nchwc_block=8, nchwc_channels=25), (1, 24, 2, 2), ["nchwc_channels", "24"]),
    (dict(nchwc_block=8, nchwc_channels=-1), (1, 24, 2, 2), ["nchwc_channels"]),
]


@pytest.mark.parametrize("attrs,shape,words", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_values_are_errors(attrs, shape, words):
    x = np.ones(shape, np.float32)
    before = x.copy()
    for fn in native_and_reference("BFP"):
        with pytest.raises(ValueError) as info:
            fn(x, **attrs)
        for w in words:
            assert w in str(info.value), (fn, str(info.value))
    # onnxruntime: at session creation for the attributes alone, else at run time
    model = one_node_model("BFPQuantizeDequantize", "com.amd.quark", attrs)
    with pytest.raises(Exception) as info:
        run_session(make_session(model), x, "float32")
    assert "BFPQuantizeDequantize" in str(info.value) and words[0] in str(info.value)
    assert np.array_equal(x, before)


def test_a_block_straddling_two_nchwc_blocks_needs_whole_ones():
    """block_size 8 and nchwc_block 16 is the flat view (blocks inside one NCHWc block);
    block_size 16 and nchwc_block 8 spans two: both allowed. 24 and 16 is neither."""
    x = _adversarial((1, 48, 3, 3), "float32", np.random.default_rng(2))
    for bs, lanes in [(8, 16), (16, 8)]:
        _check("MX", dict(block_size=bs, nchwc_block=lanes), x, "float32", "scalar", str(bs))
    for fn in native_and_reference("MX"):
        with pytest.raises(ValueError, match="nchwc_block"):
            fn(x, block_size=24, nchwc_block=16)


def test_packed_weights_take_no_nchwc_block():
    from ort_mx_ops.model_check import model_problems
    node = helper.make_node("MXDequantize", ["p", "s"], ["y"], domain=formats.PRODUCT_DOMAIN,
                            shape=[4, 32], element_dtype="int8", nchwc_block=8)
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("p", TensorProto.UINT8, [128]),
        helper.make_tensor_value_info("s", TensorProto.UINT8, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])])
    model = helper.make_model(graph, ir_version=8,
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid(formats.PRODUCT_DOMAIN, 1)])
    _, problems = model_problems(model)
    assert len(problems) == 1 and "nchwc_block" in problems[0], problems
    import onnxruntime as ort
    import ort_mx_ops
    with pytest.raises(Exception, match="nchwc_block"):
        ort.InferenceSession(model.SerializeToString(), ort_mx_ops.register(ort.SessionOptions()),
                             providers=["CPUExecutionProvider"])


def test_format_specs_take_no_nchwc_block():
    with pytest.raises(ValueError, match="nchwc_block"):
        formats.FormatSpec("MX", {"element_dtype": "int8", "nchwc_block": 8})
    assert "nchwc_block" not in formats.CONFIGS["MX9"].node_attrs(1)


# Groups of a vector's width of pixels, each a whole block of one vector per row (nchwc_block
# the vector width, block_size 32): every pixel finite takes one transposing reduction of
# their greatest magnitudes (block_walker.h, pixel_group_finite), and each group's form is
# decided from them: unclamped, the clamp alone, each with the sign fix-up where some pixel
# holds a negative zero or a negative subnormal. Blocks whose greatest magnitude rounds to either side
# of every format's clamp (test_cpu_simd's _near_clamp_blocks), some pixels with those tiny
# negatives, a few with a NaN or an Inf (the keys' walk), against the numpy reference.
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("config", ["MXINT8", "MXFP8E4M3", "MXFP8E5M2", "MXFP6E2M3", "MXFP4E2M1"])
def test_pixel_groups_near_the_clamp(config, lanes, isa):
    spec = formats.CONFIGS[config]
    rng = np.random.default_rng(zlib.crc32(f"pixel groups {config} {lanes}".encode()))
    block = spec.attrs["block_size"]
    for n, c, h, w in [(1, 32, 3, 40), (2, 64, 2, 17), (1, 16, 5, 33)]:
        pixels = n * h * w
        logical = _near_clamp_blocks((c, pixels), block, rng)  # blocks down the channels
        for col in rng.choice(pixels, pixels // 8, replace=False):
            logical[rng.integers(0, c), col] = rng.choice(
                np.array([-0.0, -1e-40, -1e-45, 0.0], np.float32))
        for col in rng.choice(pixels, 2, replace=False):
            logical[rng.integers(0, c), col] = rng.choice(np.array([np.nan, -np.inf], np.float32))
        x = logical.reshape(c, n, h * w).transpose(1, 0, 2).reshape(n, c, h, w)
        attrs = dict(spec.attrs, axis=1, nchwc_block=lanes)
        _check(spec.op, attrs, _stored(x, lanes), "float32", isa,
               f"{config} L={lanes} {(n, c, h, w)} {isa}")


# Blocks of zeros in the NCHWc view (block_walker.h, exponent_of_magnitude_or_one): pixels
# whose channel blocks are all +0, all -0 or of both signs beside ordinary ones, every
# configuration, L = 8 and 16, every path against the numpy reference.
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("config", CONFIGS)
def test_zero_blocks_match_reference(config, lanes, isa):
    spec = formats.CONFIGS[config]
    rng = np.random.default_rng(17 * len(config) + lanes)
    bs = spec.attrs["block_size"]
    for n, c, spatial in [(1, 64, (6, 40)), (2, 32, (3, 96)), (1, 48, (5, 7))]:
        pixels = _with_zero_blocks((n, int(np.prod(spatial)), c), bs, rng)  # channels last
        logical = np.ascontiguousarray(np.moveaxis(pixels, 2, 1)).reshape(n, c, *spatial)
        attrs = dict(spec.attrs, axis=1, nchwc_block=lanes)
        _check(spec.op, attrs, _stored(logical, lanes), "float32", isa,
               f"{config} L={lanes} {logical.shape} {isa}")
