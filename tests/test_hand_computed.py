"""Expected outputs computed by hand from the arithmetic in docs/formats.md, independent of
ort_mx_ops.reference, so that the reference itself is checked. Each case runs through the reference, the pybind
module and onnxruntime. The arithmetic behind each number is in the comment beside it."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_bits_equal, native_and_reference, run_one_node
from ort_mx_ops import native
from ort_mx_ops.formats import FORMAT_FAMILIES

f32 = np.float32
NEG0 = -0.0


def all_three(op: str, x: np.ndarray, attrs: dict) -> list[np.ndarray]:
    nat, ref = native_and_reference(op)
    return [ref(x, **attrs), nat(x, **attrs),
            run_one_node(FORMAT_FAMILIES[op], "com.amd.quark", attrs, x, "float32")]


def expect(op: str, x, attrs: dict, expected) -> None:
    x = np.array(x, dtype=f32)
    expected = np.array(expected, dtype=f32)
    for got, who in zip(all_three(op, x, attrs), ("reference", "native", "onnxruntime")):
        assert_bits_equal(got, expected, f"{who} {attrs}")


# BFP16 (to_bfp, m = 7): the block maximum 1.0 has e = 127, so E = 0, scale = 2^-6 and
# max_v = 127 * 2^-6 = 1.984375. Elements are x / 2^-6 rounded, times 2^-6.
BFP16_X = [1.0, 2 ** -7, -(2 ** -7), 3 * 2 ** -7, -(3 * 2 ** -7), 1.999, -1.999, 0.3]
BFP16_EXPECTED = {
    # 2^-7 / 2^-6 = 0.5, a tie; 3 * 2^-7 -> 1.5; 1.999 -> 127.936 -> 128 -> clamped to 127;
    # 0.3 -> 19.2 -> 19 -> 0.296875.
    0: [1.0, 2 ** -6, -(2 ** -6), 2 ** -5, -(2 ** -5), 1.984375, -1.984375, 0.296875],
    1: [1.0, 2 ** -6, NEG0, 2 ** -5, -(2 ** -6), 1.984375, -1.984375, 0.296875],  # ceil(-0.5) = -0, ceil(-1.5) = -1
    2: [1.0, 0.0, 0.0, 2 ** -5, -(2 ** -5), 1.984375, -1.984375, 0.296875],      # half to even; -0.5 -> +0
}


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_bfp16_by_hand(mode: int) -> None:
    expect("BFP", [BFP16_X], dict(bfp_method="to_bfp", bit_width=16, block_size=8,
                                  rounding_mode=mode, axis=1), [BFP16_EXPECTED[mode]])


def test_bfp_special_values_by_hand() -> None:
    # Inf and NaN pass through and do not count in the maximum (e = 255 counts as 0), so the
    # scale comes from 4.0 (E = 2, scale 2^-4); -0 stays -0; 2^-20 rounds to +-0 by sign.
    x = [np.inf, -np.inf, np.nan, 4.0, NEG0, 2 ** -20, -(2 ** -20), 0.1]
    y = [np.inf, -np.inf, np.nan, 4.0, NEG0, 0.0, NEG0, 0.125]  # 0.1 * 16 = 1.6 -> 2 -> 0.125
    expect("BFP", [x], dict(bfp_method="to_bfp", rounding_mode=0, axis=1), [y])


# MX9 (to_bfp_prime, m = 7, block 16, sub-blocks of 2, shift <= 1). Block max s = 127 (1.0).
# Sub-block [1.0, 1 + 2^-7]: shift 0, step 2^(127-127-0+1-7) = 2^-6.  1 + 2^-7 is a tie (q = 64,
# r = h).  Sub-block [0.5, 0.5 + 2^-8]: max e = 126, shift 1, step 2^-7: 0.5 + 2^-8 is a tie.
# Sub-block [1.999, -1.999]: q = 127 = 2^m - 1 is kept (no carry to 128): 127 * 2^-6.
# Sub-block [0.25, 0.001]: max e = 125, shift = min(127 - 125, 1) = 1, step 2^-7: 0.25 stays;
# 0.001 (e = 117) drops t = 26 >= 25 bits -> 0. Subnormals (2^-130) flush to zero.
MX9_X = [1.0, 1 + 2 ** -7, 0.5, 0.5 + 2 ** -8, 1.999, -1.999, 0.25, 0.001,
         -(1 + 2 ** -7), 0.0, NEG0, -(2 ** -30), 2 ** -130, 0.75, 0.0, 0.0]
MX9_EXPECTED = {
    0: [1.0, 1 + 2 ** -6, 0.5, 0.5 + 2 ** -7, 127 * 2 ** -6, -127 * 2 ** -6, 0.25, 0.0,
        -(1 + 2 ** -6), 0.0, NEG0, NEG0, 0.0, 0.75, 0.0, 0.0],
    1: [1.0, 1 + 2 ** -6, 0.5, 0.5 + 2 ** -7, 127 * 2 ** -6, -127 * 2 ** -6, 0.25, 0.0,
        -1.0, 0.0, NEG0, NEG0, 0.0, 0.75, 0.0, 0.0],             # a negative tie moves up
    2: [1.0, 1.0, 0.5, 0.5, 127 * 2 ** -6, -127 * 2 ** -6, 0.25, 0.0,
        -1.0, 0.0, NEG0, NEG0, 0.0, 0.75, 0.0, 0.0],             # ties to even q = 64
}


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_mx9_by_hand(mode: int) -> None:
    attrs = dict(bfp_method="to_bfp_prime", bit_width=16, block_size=16, sub_block_size=2,
                 sub_block_shift_bits=1, rounding_mode=mode, axis=-1)
    expect("BFP", [MX9_X], attrs, [MX9_EXPECTED[mode]])


def test_mx9_inf_makes_the_block_nan() -> None:
    attrs = dict(bfp_method="to_bfp_prime", bit_width=16, block_size=4, sub_block_size=2, axis=-1)
    x = np.array([[1.0, np.inf, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]], dtype=f32)
    for got in all_three("BFP", x, attrs):
        assert (got[0].view(np.uint32) == 0x7FFFFFFF).all()   # the whole block: NaN 0x7fffffff
        assert_bits_equal(got[1], np.array([1.0, 2.0, 3.0, 4.0], f32), "finite block")


# MXFP8 E4M3: block max 1.0 (s = 127), emax 8: X = 2^-8, v = 256 x. E4M3 has 3 mantissa
# bits, emin -6, subnormal step 2^-9, max normal 448.
#   0.3 -> 76.8, in [64, 128) the step is 8: 76.8/8 = 9.6 -> 10 -> 80 -> y = 80/256 = 0.3125
#   1e-4 -> 0.0256, in the lowest binade [2^-6, 2^-5), step 2^-9: 13.1 -> 13 -> y = 13 * 2^-17
#   -1e-7 -> rounds to zero -> +0;  0.75 -> 192 exactly.
def test_mxfp8_e4m3_by_hand() -> None:
    x = [1.0, 0.3, 1e-4, -1e-7, 0.75, -0.3] + [0.0] * 26
    y = [1.0, 0.3125, 13 * 2.0 ** -17, 0.0, 0.75, -0.3125] + [0.0] * 26
    expect("MX", [x], dict(element_dtype="fp8_e4m3", block_size=32, axis=1), [y])


def test_mxfp8_e4m3_saturates() -> None:
    # Block max 1.99 (s = 127): v = 509.44 -> step 32 at exponent 8 -> 512 > 448 -> 448.
    expect("MX", [[1.99, -1.99]], dict(element_dtype="fp8_e4m3", block_size=2, axis=1),
           [[448 / 256, -448 / 256]])


# MXFP4 E2M1: values 0, 0.5, 1, 1.5, 2, 3, 4, 6. Block max 1.0 -> X = 2^-2, v = 4x.
#   0.3 -> 1.2 -> 1 -> 0.25;  0.2 -> 0.8 -> 1 -> 0.25;  0.0625 -> 0.25, a tie -> 0 -> +0;
#   0.1875 -> 0.75 tie -> 1.0 -> 0.25;  0.625 -> 2.5 tie -> 2 -> 0.5;  0.875 -> 3.5 tie -> 4 -> 1.0
def test_mxfp4_by_hand() -> None:
    x = [1.0, 0.3, 0.2, 0.0625, 0.1875, 0.625, 0.875, -0.0625]
    y = [1.0, 0.25, 0.25, 0.0, 0.25, 0.5, 1.0, 0.0]
    for mode in (0, 1, 2):  # floating elements always round half to even
        expect("MX", [x], dict(element_dtype="fp4_e2m1", block_size=8, rounding_mode=mode,
                               axis=1), [y])


def test_mxfp6_e2m3_and_e3m2_by_hand() -> None:
    # E2M3 (emax 2, step 1/8 below 2): block max 1.0 -> v = 4x; 0.3 -> 1.2 -> 1.25 -> 0.3125
    expect("MX", [[1.0, 0.3]], dict(element_dtype="fp6_e2m3", block_size=2, axis=1),
           [[1.0, 0.3125]])
    # E3M2 (emax 4): block max 1.0 -> v = 16x; 0.3 -> 4.8, step 1 in [4, 8) -> 5 -> 0.3125
    expect("MX", [[1.0, 0.3]], dict(element_dtype="fp6_e3m2", block_size=2, axis=1),
           [[1.0, 0.3125]])


# MXINT8: block max 1.0 -> X = 1, q = round(64 x) clamped to [-128, 127].
#   0.5 + 2^-7 -> 32.5 (tie);  1.999 -> 127.9 -> 128 -> 127;  -1.999 -> -128 (allowed)
MXINT8_X = [1.0, 0.5 + 2 ** -7, -(0.5 + 2 ** -7), 1.999, -1.999, 0.3, -(2 ** -8), 0.0]
MXINT8_EXPECTED = {
    0: [1.0, 33 / 64, -33 / 64, 127 / 64, -2.0, 19 / 64, NEG0, 0.0],   # -0.25 -> -0 (roundf)
    1: [1.0, 33 / 64, -32 / 64, 127 / 64, -2.0, 19 / 64, NEG0, 0.0],
    2: [1.0, 32 / 64, -32 / 64, 127 / 64, -2.0, 19 / 64, 0.0, 0.0],    # (-0.5, 0) -> +0
}


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_mxint8_by_hand(mode: int) -> None:
    expect("MX", [MXINT8_X], dict(element_dtype="int8", block_size=8, rounding_mode=mode,
                                  axis=1), [MXINT8_EXPECTED[mode]])


def test_float16_output_nan_rule() -> None:
    # MX9 turns a block with Inf into NaN 0x7fffffff, which narrows to float16 0x7fff.
    x = np.array([np.inf, 1.0], dtype=np.float16)
    attrs = dict(bfp_method="to_bfp_prime", block_size=2, sub_block_size=2)
    got = native.bfp_quantize_dequantize(x, **attrs)
    assert got.view(np.uint16).tolist() == [0x7FFF, 0x7FFF]
    got_bf16 = native.bfp_quantize_dequantize(np.array([0x7F80, 0x3F80], np.uint16),
                                              dtype="bfloat16", **attrs)
    assert got_bf16.tolist() == [0x7FFF, 0x7FFF]
