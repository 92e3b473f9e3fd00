"""The CPU kernels' SIMD walkers (AVX2, AVX-512; csrc/cpu/qdq_simd.cc) against the scalar
walker, bit for bit, on random bit patterns (NaN, Inf, subnormals, zeros of both signs
included), every method / rounding mode / dtype, contiguous and strided layouts, with tails.
The scalar walker is itself checked against the numpy reference by test_ops.py. A path this
processor cannot run is skipped, saying so; every run asserts which path actually ran
(ort_mx_ops.native.cpu_isa())."""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import pytest

from conftest import assert_bits_equal, native_and_reference
from ort_mx_ops import formats, native

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
    # blocks of half an AVX-512 vector, sixteen at a time (blocks_plain<kHalfVector>)
    ("MX", dict(element_dtype="fp8_e4m3", block_size=8)),
    ("MX", dict(element_dtype="int8", block_size=8)),
    ("MX", dict(element_dtype="fp4_e2m1", block_size=64)),
]

# Blocked axis outer: rows 300 / 70 elements apart take the column walk; rows 2 KiB and 4 KiB
# apart (512 and 1024 float32) the row walk for blocks of 16 and 32 rows in the default
# rounding (block_walker.h, plan_units), else the column walk with kept rows (2 KiB; 4 KiB for
# blocks of 8) or the tile walk (4 KiB; float32 with AVX-512: with the tile's rows kept).
SHAPES = [((3, 517), 1), ((5, 4096), 1), ((2, 40, 37), 1), ((48, 300), 0), ((33, 70), 0),
          ((64, 512), 0), ((40, 1024), 0), ((2, 19, 3, 17), 1)]


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


@contextmanager
def cpu_path(isa: str):
    """Runs the block with MXOPS_CPU_ISA=isa, after checking that this path really runs
    (skips, saying why, where the processor lacks it)."""
    old = os.environ.get("MXOPS_CPU_ISA")
    os.environ["MXOPS_CPU_ISA"] = isa
    try:
        ran = native.cpu_isa()
        if ran != isa:
            pytest.skip(f"this processor cannot run the {isa} path (it runs {ran})")
        yield
        assert native.cpu_isa() == isa
    finally:
        if old is None:
            del os.environ["MXOPS_CPU_ISA"]
        else:
            os.environ["MXOPS_CPU_ISA"] = old


def _run(op, x, dtype, attrs, isa):
    with cpu_path(isa):
        fn, _ = native_and_reference(op)
        return fn(x, dtype="bfloat16" if dtype == "bfloat16" else None, threads=2, **attrs)


# Blocked axis outer with rows 1, 2 and 4 KiB apart, whose column walks depend on where the
# output lies against the input (block_walker.h, column_walk): the input at three offsets
# into its buffer (the output's place is numpy's), every path against the numpy reference.
# Rows 2, 4 and 8 KiB apart take the row walk for blocks of 16 and 32 rows (a [48, 2048]
# tensor of 32-element blocks ends in a 16-row block; where the L1 has 12 ways or more, MX9's
# sub-blocks at 2 KiB take the kept columns and, on AVX-512, MXINT8's and MXFP4E2M1's 32 rows
# exactly 2 KiB apart the plain column pairs: takes_row_walk, columns_at_2k; on AVX-512 with
# an 8-way L1 on AMD's processors, MXINT8's rows 4 and 8 KiB apart the kept tile:
# kept_tiles_at_4k), the kept columns for BFP16's 8 rows
# (the plain column walk where the L1 has more than 8 ways and the rows fit: l1d_ways);
# test_outer_row_walk_mixed_segments below takes the tile walks with a non-default rounding.
@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("config", ["MXINT8", "MX9", "BFP16", "MXFP4E2M1"])
def test_outer_column_walks_match_reference(config, isa):
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(len(config))
    for shape in [(160, 256), (96, 512), (64, 1024), (48, 2048)]:
        x = _inputs(shape, "float32", rng)
        attrs = dict(spec.attrs, axis=0)
        want = ref(x, **attrs)
        n = x.size
        for offset in (0, 5, 16):
            buf = np.empty(n + 16, np.float32)
            moved = buf[offset:offset + n].reshape(shape)
            moved[...] = x
            with cpu_path(isa):
                got = nat(moved, threads=2, **attrs)
            assert_bits_equal(got, want, f"{config} {shape} input offset {offset} {isa}")


def _near_clamp_blocks(shape, block_size, rng):
    """Finite float32 blocks down axis 0 whose greatest magnitude has a mantissa on a grid
    of 2^-6 or near 2 (2 - k * 2^-10, k <= 40), each also 2^-20 either side: every format's
    rounding of it reaches the clamp or just misses it (the thresholds: ties at the top of the
    element grid, 1.75 for FP4, 1.8125 for FP8 E4M3, 1.9375 for FP6 E2M3, 2 - 2^-7 for INT8).
    The greatest element is negative in half the blocks, at a random row; some blocks are all
    of one sign."""
    rows, cols = shape
    x = rng.standard_normal(shape).astype(np.float32)
    grid = np.concatenate([1.0 + np.arange(64) * 2.0**-6, 2.0 - np.arange(41) * 2.0**-10])
    tops = np.concatenate([grid, grid + 2.0**-20, grid - 2.0**-20])
    for b in range(0, rows, block_size):
        n = min(block_size, rows - b)
        block = x[b:b + n]
        for c in range(cols):
            kind = rng.integers(0, 4)
            if kind == 1:
                block[:, c] = np.abs(block[:, c])
            elif kind == 2:
                block[:, c] = -np.abs(block[:, c])
            top = np.float32(rng.choice(tops) * 2.0 ** rng.integers(-3, 4))
            block[:, c] = np.clip(block[:, c], -top * np.float32(0.99), top * np.float32(0.99))
            block[rng.integers(0, n), c] = top if rng.random() < 0.5 else -top
    return x


# The walks with the blocked axis outer take blocks whose greatest magnitude rounds inside the
# clamp without it (block_walker.h: column_blocks, whole_block_rows; rows 4 KiB apart take the
# tile walk): blocks at that edge, every path against the numpy reference.
@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("config", ["MXINT8", "BFP16", "MXFP8E4M3", "MXFP8E5M2", "MXFP6E2M3",
                                    "MXFP4E2M1"])
def test_outer_column_walk_near_the_clamp(config, isa):
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(7 * len(config))
    for shape in [(64, 256), (96, 512), (40, 100), (64, 1024)]:
        x = _near_clamp_blocks(shape, spec.attrs["block_size"], rng)
        attrs = dict(spec.attrs, axis=0)
        with cpu_path(isa):
            got = nat(x, threads=2, **attrs)
        assert_bits_equal(got, ref(x, **attrs), f"{config} {shape} {isa}")


# Blocked axis outer, the column walk of the plain form's policies: two column vectors at a
# time, the next two's first pass inside this pair's second (block_walker.h,
# column_pairs_pipelined), with the rows read again or kept (rows 2 KiB apart; 4 KiB for
# blocks of 8). Neighbouring pairs take the rounding alone, with the clamp, the fast form (a
# -0 or a negative subnormal in a block) or column_blocks (Inf / NaN, blocks too tiny or too
# large for the fast form); rows of 70 columns leave an odd vector and a tail. Every path
# against the numpy reference.
@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("config", ["MXINT8", "BFP16", "MXFP8E4M3", "MXFP4E2M1"])
def test_outer_column_pairs_mixed_forms(config, dtype, isa):
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(11 * len(config) + len(dtype))
    bs = spec.attrs["block_size"]
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, -(2.0**-140), 3.0e38], np.float32)
    for rows, cols in [(64, 256), (96, 300), (2 * bs, 70), (200, 192), (96, 512), (64, 1024)]:
        for data in ("scales", "clamp", "normal"):
            if data == "scales":  # a power-of-two scale per block (down axis 0)
                x = np.ascontiguousarray(_blocks_at_scales((cols, rows), bs, rng).T)
            elif data == "clamp":
                x = _near_clamp_blocks((rows, cols), bs, rng)
            else:
                x = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
            x = _sprinkled(x, specials, 400, rng)
            f16_scale = np.float32(2.0**-112 if data == "scales" else 1.0)
            xs, bf = _as_dtype(x, dtype, f16_scale)
            attrs = dict(spec.attrs, axis=0)
            with cpu_path(isa), np.errstate(over="ignore"):
                got = nat(xs, dtype=bf, threads=2, **attrs)
            assert_bits_equal(got, ref(xs, dtype=bf, **attrs),
                              f"{config} {dtype} {(rows, cols)} {data} {isa}")


# The blocked axis innermost: W blocks at a time take the rounding alone or with the clamp
# where all of them are finite, with the sign fix-up where one holds a negative zero or
# subnormal (block_walker.h, blocks_plain), else the general walk. Rows of blocks near the clamp (W blocks of one, two or
# four vectors per step on both paths), then the same with one special value (NaN, Inf,
# -0, a subnormal, a negative subnormal) in some blocks, so that neighbouring groups of W
# blocks take different walks; every path against the numpy reference.
@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("config", ["MXINT8", "BFP16", "MXFP8E4M3", "MXFP8E5M2", "MXFP6E2M3",
                                    "MXFP6E3M2", "MXFP4E2M1"])
def test_innermost_blocks_near_the_clamp(config, dtype, isa):
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(11 * len(config) + len(dtype))
    bs = spec.attrs["block_size"]
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 2.0**-140, -(2.0**-140), -(2.0**-127)],
                        np.float32)
    for rows, cols in [(512, 4), (1024, 3), (300, 5)]:
        x = np.ascontiguousarray(_near_clamp_blocks((rows, cols), bs, rng).T)
        for spoil in (False, True):
            if spoil:
                x = _sprinkled(x, specials, 300, rng)
            xs, bf = _as_dtype(x, dtype, np.float32(1 / 64))  # inside float16's range
            attrs = dict(spec.attrs, axis=1)
            with cpu_path(isa):
                got = nat(xs, dtype=bf, threads=2, **attrs)
            assert_bits_equal(got, ref(xs, dtype=bf, **attrs),
                              f"{config} {dtype} {x.shape} spoilt={spoil} {isa}")


def _negative_zero_spans(rows, cols, first_has_zero, rng):
    """float32 [rows, cols] in spans of 64 elements (eight blocks of 8), each span of one kind
    in random order: Hardswish of 3 * N(0, 1) (a sixth -0); the same times 512 (block maxima past
    256) with negative subnormals at 2^-148, which such blocks round to -0, and at 2^-140, which
    they round to +0; small values with negative subnormals and -0; no -0 at all; an Inf or NaN
    among ordinary values. Each row's first span holds a -0 or not as `first_has_zero` says."""
    def hardswish(n):
        v = rng.standard_normal(n).astype(np.float32) * np.float32(3)
        return v * np.clip(v + np.float32(3), 0, 6) / np.float32(6)

    tiny = np.array([-(2.0**-148), -(2.0**-140), -0.0], np.float32)
    x = np.empty((rows, cols), np.float32)
    for r in range(rows):
        for c0 in range(0, cols, 64):
            kind = rng.integers(0, 5) if c0 else (0 if first_has_zero else 3)
            if kind == 0:
                span = hardswish(64)
                span[rng.integers(0, 64)] = -0.0
            elif kind == 1:
                span = hardswish(64) * np.float32(512)
                span[rng.choice(64, 6, replace=False)] = rng.choice(tiny, 6)
            elif kind == 2:
                span = rng.standard_normal(64).astype(np.float32)
                span[rng.choice(64, 6, replace=False)] = rng.choice(tiny, 6)
            elif kind == 3:
                span = np.abs(rng.standard_normal(64)).astype(np.float32) * rng.choice([-1, 1], 64)
                span[span == 0] = 1.0
            else:
                span = rng.standard_normal(64).astype(np.float32)
                span[rng.integers(0, 64)] = rng.choice([np.inf, -np.inf, np.nan])
            x[r, c0:c0 + 64] = span
    return x


# BFP16's spans of W blocks along rows (block_walker.h, plain_spans_pipelined): where a walk's
# first span holds a -0, every span takes the finite form with -0 as its one bound (kd <= 0) and
# the spans with a block maximum of 256 or more (kd > 0, where negative subnormals down to
# 2^(kd - 150) round to -0 too) go to the walk by blocks; else a span takes the plain form where
# it holds no -0 or negative subnormal. Rows whose first span holds a -0 and rows whose first
# does not, then spans of every kind in random order (also through the NCHWc view, whose
# 16-channel groups are such rows); every path against the numpy reference.
@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("config", ["BFP16", "MXINT8"])
def test_innermost_spans_with_negative_zeros(config, dtype, isa):
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(17 * len(config) + len(dtype))
    for first_has_zero in (True, False):
        x = _negative_zero_spans(24, 64 * 37, first_has_zero, rng)
        xs, bf = _as_dtype(x, dtype, np.float32(1 / 8))
        attrs = dict(spec.attrs, axis=1)
        with cpu_path(isa):
            got = nat(xs, dtype=bf, threads=2, **attrs)
        assert_bits_equal(got, ref(xs, dtype=bf, **attrs),
                          f"{config} {dtype} first span with -0: {first_has_zero} {isa}")


# Blocked axis outer, rows a multiple of 2 KiB apart and blocks of 16 or 32 rows: the row walk
# (block_walker.h, row_walk), both passes a whole row of up to 1024 columns at a time, each
# segment of 128 columns in its own form: the rounding alone, with the clamp, the fast form (a
# -0 or negative subnormal in a block), the tile walk (Inf / NaN; blocks too tiny or too large
# for the fast form), to_bfp_prime's sub-blocks with or without the subnormal flush. Rows of
# 1536 columns make units of 1024 and 512 columns; row counts that are not a multiple of four
# or of the block size, and an odd last sub-block; a non-default rounding (no row walk: the
# tile walk per 128 columns of the same units). Every path against the numpy reference.
ROW_WALK_SEGMENTS = ["normal", "clamp", "negative zero", "special", "scales", "tiny"]


def _row_walk_input(rows, cols, block, rng):
    """float32 [rows, cols] whose 128-column segments each hold one of ROW_WALK_SEGMENTS'
    kinds of blocks (down axis 0), starting at a random kind."""
    x = np.empty((rows, cols), np.float32)
    start = int(rng.integers(0, len(ROW_WALK_SEGMENTS)))
    for i, c0 in enumerate(range(0, cols, 128)):
        w = min(128, cols - c0)
        kind = ROW_WALK_SEGMENTS[(start + i) % len(ROW_WALK_SEGMENTS)]
        seg = (rng.standard_normal((rows, w)) * 4).astype(np.float32)
        if kind == "clamp":
            seg = _near_clamp_blocks((rows, w), block, rng)
        elif kind == "negative zero":
            seg = _sprinkled(seg, np.array([-0.0, -(2.0**-140)], np.float32), 300, rng)
        elif kind == "special":
            seg = _sprinkled(seg, np.array([np.nan, np.inf, -np.inf], np.float32), 500, rng)
        elif kind == "scales":
            seg = np.ascontiguousarray(_blocks_at_scales((w, rows), block, rng).T)
        elif kind == "tiny":
            seg = seg * np.float32(2.0**-135)
        x[:, c0:c0 + w] = seg
    return x


@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("config", ["MXINT8", "MXFP8E4M3", "MXFP6E2M3", "MXFP4E2M1", "MX9", "MX6",
                                    "MX4", "MXINT8 rounding_mode=1", "MXINT8 block_size=16",
                                    "MXFP4E2M1 block_size=16"])
def test_outer_row_walk_mixed_segments(config, dtype, isa):
    name, _, extra = config.partition(" ")
    spec = formats.CONFIGS[name]
    attrs = dict(spec.attrs, axis=0)
    if extra:
        key, value = extra.split("=")
        attrs[key] = int(value)
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(13 * len(config) + len(dtype))
    block = attrs["block_size"]
    # rows 2, 4 and 6 KiB apart (float32: a unit of 1024 and one of 512 columns per block; at
    # 4 KiB MXINT8's plain form takes the kept tile instead where kept_tiles_at_4k, with blocks
    # of 32 and, block_size=16, of 16 rows) or 4 and 12 KiB (16-bit types)
    if dtype == "float32":
        shapes = [(3 * block + 5, 512), (2 * block, 1024), (block + 3, 1536)]
    else:
        shapes = [(3 * block + 5, 2048), (block + 3, 6144)]
    for rows, cols in shapes:
        x = _row_walk_input(rows, cols, block, rng)
        with np.errstate(over="ignore"):
            xs, bf = _as_dtype(x, dtype, np.float32(1.0))
        with cpu_path(isa), np.errstate(over="ignore"):
            got = nat(xs, dtype=bf, threads=2, **attrs)
        assert_bits_equal(got, ref(xs, dtype=bf, **attrs), f"{config} {dtype} {(rows, cols)} {isa}")


def _sprinkled(x, specials, every, rng):
    """A copy of x with one element in `every` (at least one) replaced by one of `specials`."""
    x = x.copy()
    flat = x.reshape(-1)
    where = rng.choice(flat.size, size=max(1, flat.size // every), replace=False)
    flat[where] = rng.choice(specials, size=where.size)
    return x


def _as_dtype(x, dtype, f16_scale):
    """float32 x as the kernels' input of `dtype` (float16: x * f16_scale; bfloat16: the upper
    halves of the bit patterns) and the dtype argument of ort_mx_ops.native for it."""
    if dtype == "float32":
        return x, None
    if dtype == "float16":
        return (x * f16_scale).astype(np.float16), None
    return (x.view(np.uint32) >> 16).astype(np.uint16), "bfloat16"


def _blocks_at_scales(shape, block, rng, lo=-149, hi=127):
    """Normal values whose blocks of `block` consecutive elements (along the last axis) each
    have their own power-of-two scale from 2^lo to 2^hi: neighbouring blocks are tiny
    (subnormal quanta), ordinary or near float32's largest."""
    n = int(np.prod(shape))
    k = np.repeat(rng.integers(lo, hi, -(-n // block)), block)[:n]
    with np.errstate(over="ignore", under="ignore"):
        x = (rng.standard_normal(n) * 2.0 ** k.astype(np.float64)).astype(np.float32)
    x[~np.isfinite(x)] = np.float32(3.0e38)
    return x.reshape(shape)


# A blocked axis shorter than one block, as an image's channels (1, 3 or 5 of them) in blocks
# of 16 or 32, with rows a multiple of 2 KiB apart: the column walk, not the row walk, whose
# rule is for blocks of 16 rows or more (block_walker.h, plan_units); an odd number of rows
# ends MX9's / MX6's / MX4's sub-block pairs in a sub-block of one row (column_sub_blocks).
# Every path and dtype against the numpy reference, ordinary blocks (the fast forms) and ones
# at every scale with Inf / NaN / -0 / subnormals.
@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("config", ["MX9", "MX6", "MX4", "MXINT8", "MXFP8E4M3", "MXFP4E2M1",
                                    "BFP16"])
def test_axis_shorter_than_a_block(config, dtype, isa):
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(11 * len(config) + len(dtype))
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 2.0**-140, -(2.0**-140)], np.float32)
    # rows 2, 4 and 8 KiB apart for float32, 4 and 8 KiB for the 16-bit types
    for shape in [(1, 3, 16, 32), (2, 3, 32, 32), (1, 3, 32, 64), (1, 1, 16, 64),
                  (1, 5, 16, 128), (1, 7, 8, 256)]:
        for scales, spoil in ((False, False), (True, True)):
            x = _blocks_at_scales(shape, 7, rng) if scales else \
                (rng.standard_normal(shape) * 4).astype(np.float32)
            if spoil:
                x = _sprinkled(x, specials, 300, rng)
            xs, bf = _as_dtype(x, dtype, np.float32(2.0**-112) if scales else np.float32(1.0))
            attrs = dict(spec.attrs, axis=1)
            with cpu_path(isa), np.errstate(over="ignore"):
                got = nat(xs, dtype=bf, threads=2, **attrs)
            assert_bits_equal(got, ref(xs, dtype=bf, **attrs),
                              f"{config} {dtype} {shape} scales={scales} {isa}")


# to_bfp_prime with the blocked axis innermost or in the NCHWc view (nchwc_block >= the block):
# W blocks at a time (block_walker.h, blocks_sub) where all W are finite and take the
# one-addition form without the subnormal flush, else one block at a time. Rows of 11 blocks
# and longer ones, so that both walks and the tail meet; blocks at every scale (tiny ones
# refuse the form without the flush, huge ones the one-addition form), Inf / NaN / -0 /
# subnormals sprinkled.
@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("config", ["MX9", "MX6", "MX4"])
def test_innermost_sub_blocks_match_reference(config, dtype, isa):
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(7 * len(config) + len(dtype))
    bs = spec.attrs["block_size"]
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 2.0**-140, -(2.0**-140)], np.float32)
    cases = [((64, 11 * bs), 1, 0), ((3, 70 * bs), 1, 0), ((1, 32, 6, 40), 1, 16),
             ((1, 16, 9, 21), 1, 16), ((1, 32, 5, 7), 1, 32)]
    for shape, axis, lanes in cases:
        for scales, spoil in ((True, False), (True, True), (False, False)):
            x = _blocks_at_scales(shape, bs, rng) if scales else \
                (rng.standard_normal(shape) * 4).astype(np.float32)
            if spoil:
                x = _sprinkled(x, specials, 500, rng)
            xs, bf = _as_dtype(x, dtype, np.float32(2.0**-112))  # float16's range and below
            attrs = dict(spec.attrs, axis=axis, nchwc_block=lanes)
            with cpu_path(isa):
                got = nat(xs, dtype=bf, threads=2, **attrs)
            assert_bits_equal(got, ref(xs, dtype=bf, **attrs),
                              f"{config} {dtype} {shape} lanes={lanes} scales={scales} "
                              f"spoilt={spoil} {isa}")


def _signed_sub_blocks(shape, rng):
    """float32 values whose blocks of 16 along the last axis have random signs and magnitudes
    2^e * mantissa: e the block's exponent less 0 to 30 (an element 5 or more below the block's
    greatest rounds to zero, keeping its sign), the mantissa on a grid of 2^-6 or just under 2
    (the rounding of a sub-block's greatest element reaches the saturation)."""
    n = int(np.prod(shape))
    e = np.repeat(rng.integers(-100, 100, -(-n // 16)), 16)[:n] - rng.choice([0, 0, 0, 1, 2, 5, 12, 30], n)
    mantissa = np.where(rng.random(n) < 0.5, 1.0 + rng.integers(0, 64, n) * 2.0**-6,
                        2.0 - rng.integers(1, 40, n) * 2.0**-20)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (sign * mantissa * 2.0 ** e.astype(np.float64)).astype(np.float32).reshape(shape)


# MX9 / MX6 / MX4's sub-blocks in the one-addition form without the flush, which AVX-512 takes
# signed (numerics.h, bfp_prime_element_signed_normal: a negative element that rounds to zero
# gets its sign back from the saturation bound). Negative elements that round to -0 and
# sub-blocks whose greatest element rounds up to the saturation, in every walk that takes the
# form: the innermost spans and one-vector groups, the NCHWc views (flat and lanes), the
# column walk (blocked axis outer) and the tile walk for the rest. Against the numpy reference,
# and the reference's output holds -0 (else the input would not test the sign).
@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("config", ["MX9", "MX6", "MX4"])
def test_sub_blocks_keep_the_sign_of_zero(config, isa):
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(5 * len(config))
    cases = [((24, 512), 1, 0), ((37, 48), 1, 0), ((1, 32, 6, 40), 1, 16), ((1, 64, 5, 7), 1, 8),
             ((48, 300), 0, 0), ((2, 19, 3, 17), 1, 0), ((64, 512), 0, 0)]
    for shape, axis, lanes in cases:
        x = _signed_sub_blocks(shape, rng)
        if axis == 0:  # the blocks down the axis
            x = np.ascontiguousarray(_signed_sub_blocks(shape[::-1], rng).T)
        attrs = dict(spec.attrs, axis=axis, nchwc_block=lanes)
        want = ref(x, **attrs)
        assert np.any((want == 0) & np.signbit(want)), (config, shape)
        with cpu_path(isa):
            got = nat(x, threads=2, **attrs)
        assert_bits_equal(got, want, f"{config} {shape} axis={axis} lanes={lanes} {isa}")


# Blocked axis innermost with rows of whole blocks: the kernel walks the rows as one row
# (qdq_cpu.cc, quantize_dequantize), so spans of many blocks cross the rows' ends. Rows
# shorter than a span, rows of a span and a piece, one block per row, rows that are not whole
# blocks (each row on its own), Inf / NaN / -0 / subnormals sprinkled so that a block's
# special values next to a row's end change nothing in the next row; one and two threads.
@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("config", ["MX9", "MXINT8", "BFP16", "MXFP4E2M1"])
def test_rows_of_whole_blocks_match_reference(config, dtype, isa):
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(13 * len(config) + len(dtype))
    bs = spec.attrs["block_size"]
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 2.0**-140, -(2.0**-140)], np.float32)
    for shape in [(37, 4 * bs), (9, 12 * bs), (50, bs), (3, 5, 8 * bs), (11, 3 * bs + 5), (2000, 2 * bs)]:
        for spoil in (False, True):
            x = (rng.standard_normal(shape) * 4).astype(np.float32)
            if spoil:
                x = _sprinkled(x, specials, 97, rng)
            xs, bf = _as_dtype(x, dtype, np.float32(1.0))
            attrs = dict(spec.attrs, axis=len(shape) - 1)
            for threads in (1, 2):
                with cpu_path(isa):
                    got = nat(xs, dtype=bf, threads=threads, **attrs)
                assert_bits_equal(got, ref(xs, dtype=bf, **attrs),
                                  f"{config} {dtype} {shape} spoilt={spoil} threads={threads} {isa}")


# Rows and column strips cut short (block_walker.h): with the blocked axis innermost, a row's
# last group of blocks (a vector, or bs / W vectors) that the row's end cuts short is walked in
# a copy padded with the row's last element (groups of up to kPaddedGroup elements, a third
# full or more; else, as for MXINT8 in blocks of 128 here, by the scalar walker); with it
# outer, the columns past the last whole vector are walked as the last W columns again (by
# the scalar walker where no whole vector precedes them). Every remainder of a row against the
# group and of the columns against a vector, for 8 and 16 lanes; blocks at every scale with
# Inf / NaN / -0 / subnormals, and ones whose last element or column (the one the padding
# copies) is such a value.
@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("config", ["MX9", "MX4", "MXINT8", "MXFP4E2M1", "BFP16", "MXINT8/64",
                                    "MXINT8/128"])
def test_cut_short_rows_and_columns_match_reference(config, dtype, isa):
    name, _, block = config.partition("/")
    spec = formats.CONFIGS[name]
    nat, ref = native_and_reference(spec.op)
    bs = int(block or spec.attrs["block_size"])
    rng = np.random.default_rng(17 * len(config) + len(dtype))
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 2.0**-140, -(2.0**-140)], np.float32)
    group = max(bs, 16)
    # innermost: rows of every length up to two groups and a piece; outer: [1, C, 1, inner]
    # with C ending in a partial block of rows and inner past every whole vector
    cases = [((5, n), 1) for n in range(1, 2 * group + 2)]
    cases += [((1, 2 * bs + 3, 1, n), 1) for n in range(1, 36)]
    for shape, axis in cases:
        for scales, ends in ((False, False), (True, False), (True, True)):
            x = _blocks_at_scales(shape, 5, rng) if scales else \
                (rng.standard_normal(shape) * 4).astype(np.float32)
            if scales:
                x = _sprinkled(x, specials, 11, rng)
            if ends:
                x[..., -1] = rng.choice(specials, size=x[..., -1].shape)
            xs, bf = _as_dtype(x, dtype, np.float32(2.0**-112) if scales else np.float32(1.0))
            attrs = dict(spec.attrs, axis=axis, block_size=bs)
            with cpu_path(isa), np.errstate(over="ignore"):
                got = nat(xs, dtype=bf, threads=1, **attrs)
            assert_bits_equal(got, ref(xs, dtype=bf, **attrs),
                              f"{config} {dtype} {shape} axis={axis} scales={scales} ends={ends} {isa}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_simd_matches_scalar(case, mode, dtype, isa):
    op, attrs = CASES[case]
    rng = np.random.default_rng(1000 * case + 10 * mode + len(dtype))
    for shape, axis in SHAPES:
        x = _inputs(shape, dtype, rng)
        a = dict(attrs, rounding_mode=mode, axis=axis)
        want = _run(op, x, dtype, a, "scalar").view(np.uint16 if dtype != "float32" else np.uint32)
        got = _run(op, x, dtype, a, isa).view(want.dtype)
        bad = np.flatnonzero(got.ravel() != want.ravel())
        assert bad.size == 0, (isa, shape, axis, a, bad[:5], x.ravel()[bad[:5]],
                               got.ravel()[bad[:5]], want.ravel()[bad[:5]])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("per_channel,unit_scale", [(False, False), (True, False), (False, True),
                                                    (True, True)])
def test_bf16_qdq_simd_matches_scalar(per_channel, unit_scale, isa):
    """ExtendedQuantizeLinear / ExtendedDequantizeLinear (bfloat16 zero point) and the fused
    BF16QuantizeDequantize through onnxruntime: the SIMD loops against the scalar ones, bit
    for bit, and the fused node against the pair; unit_scale: scale 1 (the loops without the
    divide and multiply) in every channel."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import ort_mx_ops

    rng = np.random.default_rng(5)
    shape = (3, 7, 333)
    x = _inputs(shape, "float32", rng)
    channels = shape[1] if per_channel else 1
    scale = (rng.standard_normal(channels) * 2.0 ** rng.integers(-8, 8, channels)).astype(np.float32)
    if unit_scale:
        scale[:] = 1.0
    zp_f = (rng.standard_normal(channels) * 4).astype(np.float32)
    zp = (zp_f.view(np.uint32) >> 16).astype(np.uint16)
    s_shape, axis = ([channels], 1) if per_channel else ([], 1)
    inits = [helper.make_tensor("s", TensorProto.FLOAT, s_shape, scale.tolist()),
             helper.make_tensor("z", TensorProto.BFLOAT16, s_shape, zp.tolist(), raw=False)]
    nodes = [helper.make_node("ExtendedQuantizeLinear", ["X", "s", "z"], ["Q"],
                              domain="com.amd.quark", axis=axis),
             helper.make_node("ExtendedDequantizeLinear", ["Q", "s", "z"], ["D"],
                              domain="com.amd.quark", axis=axis),
             helper.make_node("BF16QuantizeDequantize", ["X", "s", "z"], ["F"],
                              domain="com.ort_mx_ops", axis=axis)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape)
                               for o in ("D", "F")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.amd.quark", 1),
                                                    helper.make_opsetid("com.ort_mx_ops", 1)])
    model.ir_version = 8
    so = ort.SessionOptions()
    ort_mx_ops.register(so)
    sess = ort.InferenceSession(model.SerializeToString(), so)
    outs = {}
    for path in ("scalar", isa):
        with cpu_path(path):
            outs[path] = [y.view(np.uint32) for y in sess.run(None, {"X": x})]
    np.testing.assert_array_equal(outs[isa][0], outs["scalar"][0], err_msg=isa)
    np.testing.assert_array_equal(outs[isa][1], outs["scalar"][1], err_msg=f"{isa} fused")
    np.testing.assert_array_equal(outs["scalar"][1], outs["scalar"][0], err_msg="fused vs pair")


def test_cpu_isa_names_a_path():
    """Unset, MXOPS_CPU_ISA gives the best path this processor runs."""
    env = {k: v for k, v in os.environ.items() if k != "MXOPS_CPU_ISA"}
    out = subprocess.run([sys.executable, "-c", "from ort_mx_ops import native; print(native.cpu_isa())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out in ("scalar", "avx2", "avx512")
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " avx512f " in flags and " avx512bw " in flags and " avx512vl " in flags and " avx512dq " in flags:
        assert out == "avx512"
    elif " avx2 " in flags and " f16c " in flags:
        assert out == "avx2"


def test_unknown_cpu_isa_is_an_error():
    """A misspelt MXOPS_CPU_ISA fails the op (pybind and ONNX Runtime), naming the values."""
    from conftest import make_session, one_node_model, run_session
    old = os.environ.get("MXOPS_CPU_ISA")
    os.environ["MXOPS_CPU_ISA"] = "avx3"
    try:
        with pytest.raises(ValueError, match="MXOPS_CPU_ISA=avx3.*scalar, avx2, avx512"):
            native.cpu_isa()
        with pytest.raises(ValueError, match="MXOPS_CPU_ISA=avx3"):
            native.mx_quantize_dequantize(np.ones((4, 32), np.float32))
        sess = make_session(one_node_model("MXQuantizeDequantize", "com.amd.quark", {}))
        with pytest.raises(Exception, match="MXOPS_CPU_ISA=avx3"):
            run_session(sess, np.ones((4, 32), np.float32), "float32")
    finally:
        if old is None:
            del os.environ["MXOPS_CPU_ISA"]
        else:
            os.environ["MXOPS_CPU_ISA"] = old


def test_unavailable_cpu_isa_is_reported():
    """Asking for a path the processor lacks says so on stderr and reports the path that runs."""
    best = subprocess.run([sys.executable, "-c", "from ort_mx_ops import native; print(native.cpu_isa())"],
                          env={k: v for k, v in os.environ.items() if k != "MXOPS_CPU_ISA"},
                          capture_output=True, text=True, check=True).stdout.strip()
    if best == "avx512":
        pytest.skip("this processor runs every path")
    r = subprocess.run([sys.executable, "-c", "from ort_mx_ops import native; print(native.cpu_isa())"],
                       env=dict(os.environ, MXOPS_CPU_ISA="avx512"), capture_output=True, text=True,
                       check=True)
    assert r.stdout.strip() == best
    assert "MXOPS_CPU_ISA=avx512 is not available" in r.stderr and best in r.stderr


# MXOPS_CPU_PREFETCH forces the innermost walks' software prefetch on or off (its default
# depends on the processor, csrc/cpu/qdq_cpu.cc): both settings give the reference's bits on
# every path, blocks of one, two and four vectors and sub-blocks, specials sprinkled.
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("prefetch", ["0", "1"])
@pytest.mark.parametrize("config", ["MXINT8", "MX9", "BFP16", "MXFP8E4M3"])
def test_row_prefetch_setting_keeps_the_bits(config, prefetch, isa, monkeypatch):
    monkeypatch.setenv("MXOPS_CPU_PREFETCH", prefetch)
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(5 * len(config) + int(prefetch))
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 2.0**-140, -(2.0**-127)], np.float32)
    for shape in [(64, 1024), (33, 96)]:
        clean = (rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 20, (shape[0], 1)))
        x = _sprinkled(clean.astype(np.float32), specials, 500, rng)  # most blocks plain
        attrs = dict(spec.attrs, axis=1)
        with cpu_path(isa):
            got = nat(x, threads=2, **attrs)
        assert_bits_equal(got, ref(x, **attrs), f"{config} {shape} prefetch={prefetch} {isa}")


def test_unknown_row_prefetch_setting_is_an_error(monkeypatch):
    """MXOPS_CPU_PREFETCH other than 0 / 1 fails the op (pybind and ONNX Runtime), naming
    the values and this processor's default (by input size and block size)."""
    from conftest import make_session, one_node_model, run_session
    monkeypatch.setenv("MXOPS_CPU_PREFETCH", "yes")
    with pytest.raises(ValueError,
                       match="MXOPS_CPU_PREFETCH=yes is not 0 or 1.*on this processor [01] for inputs of "
                             "16 MiB or more in blocks of at most (64|128) bytes"):
        native.mx_quantize_dequantize(np.ones((4, 32), np.float32))
    sess = make_session(one_node_model("MXQuantizeDequantize", "com.amd.quark", {}))
    with pytest.raises(Exception, match="MXOPS_CPU_PREFETCH=yes"):
        run_session(sess, np.ones((4, 32), np.float32), "float32")


def _with_zero_blocks(shape, block, rng):
    """Normal values (a power-of-two scale per block of `block` consecutive elements along the
    last axis, as _blocks_at_scales, from 2^-12 to 2^12) with whole blocks of zeros: a quarter
    of the blocks all +0, and some all -0 or of both signs; single zeros elsewhere too."""
    x = _blocks_at_scales(shape, block, rng, -12, 12).reshape(-1)
    blocks = x[:x.size // block * block].reshape(-1, block)
    kind = rng.random(blocks.shape[0])
    blocks[kind < 0.25] = 0.0
    blocks[(kind >= 0.25) & (kind < 0.3)] = -0.0
    mixed = (kind >= 0.3) & (kind < 0.35)
    blocks[mixed] = np.where(rng.random((int(mixed.sum()), block)) < 0.5, np.float32(0.0),
                             np.float32(-0.0))
    x[rng.choice(x.size, size=max(1, x.size // 50), replace=False)] = 0.0
    return x.reshape(shape)


# Blocks of zeros (ReLU outputs, an NCHWc tensor's padding channels) take the fast and plain
# forms with the exponent of 1.0 (block_walker.h, exponent_of_magnitude_or_one): blocks all +0,
# all -0 or of both signs among ordinary ones, blocked axis innermost and outer, every path
# against the numpy reference.
@pytest.mark.parametrize("isa", ["scalar"] + ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("config", ["BFP16", "MXINT8", "MXFP8E4M3", "MXFP6E2M3", "MXFP4E2M1",
                                    "MX9"])
def test_zero_blocks_match_reference(config, dtype, isa):
    spec = formats.CONFIGS[config]
    nat, ref = native_and_reference(spec.op)
    rng = np.random.default_rng(13 * len(config) + len(dtype))
    bs = spec.attrs["block_size"]
    for shape, axis in [((64, 1024), 1), ((40, 100), 1), ((64, 1024), 0), ((96, 300), 0),
                        ((200, 192), 0)]:
        if axis == 1:
            x = _with_zero_blocks(shape, bs, rng)
        else:  # blocks down the rows: make them along the rows of the transpose
            x = np.ascontiguousarray(_with_zero_blocks(shape[::-1], bs, rng).T)
        xs, bf = _as_dtype(x, dtype, np.float32(1.0))
        attrs = dict(spec.attrs, axis=axis)
        with cpu_path(isa):
            got = nat(xs, dtype=bf, threads=2, **attrs)
        assert_bits_equal(got, ref(xs, dtype=bf, **attrs),
                          f"{config} {dtype} {shape} axis {axis} {isa}")
