"""Packed weights in numpy (ort_mx_ops.packing, docs/packed_weights.md): the bit streams and
code values against hand-computed bytes, and pack -> unpack against the native kernels'
folded values, bit for bit, for every configuration, axis and awkward shape."""
from __future__ import annotations

import numpy as np
import pytest

from ort_mx_ops import native, packing, reference
from ort_mx_ops.formats import CONFIGS

BLOCK_CONFIGS = [name for name, c in CONFIGS.items() if c.op != "BF16"]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _fold(x: np.ndarray, op: str, attrs: dict) -> np.ndarray:
    fn = native.mx_quantize_dequantize if op == "MX" else native.bfp_quantize_dequantize
    return fn(x, **attrs)


def _pack(y: np.ndarray, op: str, attrs: dict) -> packing.PackedWeight:
    a = dict(attrs)
    if op == "MX":
        return packing.pack_mx(y, a["element_dtype"], a["axis"], a.get("block_size", 32))
    return packing.pack_bfp(y, a.get("bfp_method", "to_bfp"), a.get("bit_width", 16), a["axis"],
                            a.get("block_size", 8), a.get("sub_block_size", 2),
                            a.get("sub_block_shift_bits", 1))


def _weights(shape: tuple[int, ...], seed: int, specials: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) *
         rng.choice([1e-30, 1e-3, 1.0, 300.0], size=shape)).astype(np.float32)
    if specials and x.size >= 8:
        flat = x.reshape(-1)
        flat[[0, 2, 3, 5, 6, 7]] = [np.inf, -np.inf, np.nan, -0.0, 1e-42, 3.4e38]
        flat[-1] = -np.float32(1e-45)
    return x


# ------------------------------------------------------------------------------------------
# Bit streams and code values, hand-computed
# ------------------------------------------------------------------------------------------

def test_bit_streams_match_the_documented_byte_layout():
    assert packing.pack_bits([1, 2, 3], 4).tolist() == [0x21, 0x03]
    # 6-bit: b0 = c0 | (c1 & 3) << 6, b1 = c1 >> 2 | (c2 & 15) << 4, b2 = c2 >> 4 | c3 << 2
    assert packing.pack_bits([0x3F, 0x01, 0x2A, 0x15], 6).tolist() == [0x7F, 0xA0, 0x56]
    assert packing.pack_bits([0xAB, 0x01], 8).tolist() == [0xAB, 0x01]
    assert packing.pack_bits([1, 0, 1, 1, 0, 0, 0, 0, 1], 1).tolist() == [0x0D, 0x01]
    assert packing.pack_bits([5, 2, 7], 3).tolist() == [0b11010101, 0b1]


@pytest.mark.parametrize("width", range(1, 25))
def test_bit_stream_round_trip(width):
    rng = np.random.default_rng(width)
    codes = rng.integers(0, 2 ** width, size=37, dtype=np.uint32)
    stream = packing.pack_bits(codes, width)
    assert stream.size == -(-37 * width // 8)
    assert np.array_equal(packing.unpack_bits(stream, width, 37), codes)


def test_bit_stream_errors():
    with pytest.raises(ValueError, match="fit"):
        packing.pack_bits([16], 4)
    with pytest.raises(ValueError, match="width"):
        packing.pack_bits([1], 25)
    with pytest.raises(ValueError, match="need"):
        packing.unpack_bits(np.zeros(2, np.uint8), 6, 3)


def test_code_values_hand_computed():
    fp4 = packing.mx_code_values("fp4_e2m1")
    assert fp4[:8].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert fp4[8] == 0 and np.signbit(fp4[8]) and fp4[15] == -6.0
    e4m3 = packing.mx_code_values("fp8_e4m3")
    assert e4m3[0x7E] == 448.0 and np.isnan(e4m3[0x7F]) and e4m3[0x01] == 2.0 ** -9
    e5m2 = packing.mx_code_values("fp8_e5m2")
    assert e5m2[0x7B] == 57344.0 and e5m2[0x7C] == np.inf and np.isnan(e5m2[0x7D])
    assert e5m2[0xFC] == -np.inf
    i8 = packing.mx_code_values("int8")
    assert i8[0x7F] == 127 / 64 and i8[0x80] == -2.0 and i8[0xFF] == -1 / 64
    e3m2 = packing.mx_code_values("fp6_e3m2")
    assert e3m2[0x1F] == 28.0 and e3m2[0x01] == 0.0625
    e2m3 = packing.mx_code_values("fp6_e2m3")
    assert e2m3[0x1F] == 7.5 and e2m3[0x01] == 0.125


def test_decoding_hand_computed():
    # MX fp4: codes 7 (6.0) and 9 (-0.5), scale byte 128 (X = 2): 12.0 and -1.0
    y = reference.unpack_mx(packing.pack_bits([7, 9], 4), np.array([128], np.uint8),
                            "fp4_e2m1", axis=0, block_size=32, shape=(2,))
    assert y.tolist() == [12.0, -1.0]
    # Scale byte 255: the whole block is NaN 0x7FFFFFFF
    y = reference.unpack_mx(packing.pack_bits([7, 9], 4), np.array([255], np.uint8),
                            "fp4_e2m1", axis=0, block_size=32, shape=(2,))
    assert _bits(y).tolist() == [0x7FFFFFFF] * 2
    # BFP16 (m = 7): exponent 127, q = 64 -> 64 * 2^(0 - 6) = 1.0; sign bit 7 set -> -1.0;
    # a lone sign bit is -0.
    y = reference.unpack_bfp(np.array([0x40, 0xC0, 0x80], np.uint8), np.array([127], np.uint8),
                             "to_bfp", 16, axis=0, block_size=8, shape=(3,))
    assert y.tolist() == [1.0, -1.0, 0.0] and np.signbit(y[2])
    # Microexponents (m = 7): exponent 127, sub-block shifts 0 and 1: quantum 2^-6, 2^-7
    y = reference.unpack_bfp(np.array([0x40, 0x40, 0x40, 0x40], np.uint8),
                             np.array([127], np.uint8), "to_bfp_prime", 16, axis=0,
                             block_size=4, shape=(4,), shifts=packing.pack_bits([0, 1], 1),
                             sub_block_size=2, sub_block_shift_bits=1)
    assert y.tolist() == [1.0, 1.0, 0.5, 0.5]
    # An exception overrides the decoded value
    y = reference.unpack_mx(np.array([0x38], np.uint8), np.array([127], np.uint8), "fp8_e4m3",
                            axis=0, block_size=32, shape=(1,),
                            exception_indices=np.array([0]),
                            exception_values=np.array([np.inf], np.float32))
    assert y.tolist() == [np.inf]


# ------------------------------------------------------------------------------------------
# pack -> unpack against the native kernels
# ------------------------------------------------------------------------------------------

SHAPES = [((5, 37, 3), (0, 1, 2, -1)), ((33,), (0,)), ((1,), (0,)), ((2, 1, 1), (1,)),
          ((7, 65), (0, 1)), ((3, 0, 4), (1,))]


@pytest.mark.parametrize("config", BLOCK_CONFIGS)
@pytest.mark.parametrize("specials", [False, True])
def test_round_trip_bit_exact_every_config_axis_and_shape(config, specials):
    c = CONFIGS[config]
    for k, (shape, axes) in enumerate(SHAPES):
        x = _weights(shape, 10 * k + specials, specials)
        for axis in axes:
            attrs = {**c.attrs, "axis": axis}
            y = _fold(x, c.op, attrs)
            p = _pack(y, c.op, attrs)
            width = (packing.mx_code_width(attrs["element_dtype"]) if c.op == "MX"
                     else packing.bfp_code_width(attrs["bit_width"]))
            assert p.payload.size == -(-x.size * width // 8)
            out = packing.unpack(p)
            assert out.shape == y.shape
            assert np.array_equal(_bits(out), _bits(y)), (config, shape, axis)


@pytest.mark.parametrize("config", BLOCK_CONFIGS)
def test_ordinary_weights_need_no_exceptions(config):
    c = CONFIGS[config]
    x = np.random.default_rng(3).standard_normal((64, 96)).astype(np.float32) * 0.05
    for axis in (0, 1):
        attrs = {**c.attrs, "axis": axis}
        p = _pack(_fold(x, c.op, attrs), c.op, attrs)
        assert p.exception_indices.size == 0
        assert p.nbytes < x.nbytes / 3.5


@pytest.mark.parametrize("attrs", [
    {"bfp_method": "to_bfp", "bit_width": 10, "block_size": 5},
    {"bfp_method": "to_bfp", "bit_width": 32, "block_size": 3},
    {"bfp_method": "to_bfp_prime", "bit_width": 13, "block_size": 12, "sub_block_size": 4,
     "sub_block_shift_bits": 3},
    {"bfp_method": "to_bfp_prime", "bit_width": 32, "block_size": 8, "sub_block_size": 2,
     "sub_block_shift_bits": 8},
    {"bfp_method": "to_bfp_prime", "bit_width": 11, "block_size": 16, "sub_block_size": 2,
     "sub_block_shift_bits": 0},
    {"bfp_method": "to_bfp_prime", "bit_width": 16, "block_size": 64},
])
def test_round_trip_other_bfp_attributes(attrs):
    x = _weights((9, 41), 5, True)
    for axis in (0, 1):
        a = {**attrs, "axis": axis, "rounding_mode": 2}
        y = _fold(x, "BFP", a)
        assert np.array_equal(_bits(packing.unpack(_pack(y, "BFP", a))), _bits(y))


@pytest.mark.parametrize("element_dtype", ["fp8_e5m2", "fp4_e2m1", "int8", "fp6_e3m2"])
@pytest.mark.parametrize("block_size", [1, 7, 64])
@pytest.mark.parametrize("rounding_mode", [0, 1])
def test_round_trip_other_mx_attributes(element_dtype, block_size, rounding_mode):
    x = _weights((6, 50), 7, True)
    a = {"element_dtype": element_dtype, "block_size": block_size, "axis": 1,
         "rounding_mode": rounding_mode}
    y = _fold(x, "MX", a)
    assert np.array_equal(_bits(packing.unpack(_pack(y, "MX", a))), _bits(y))


def test_tiny_blocks_keep_their_scale_without_e8m0():
    # A block of float32 subnormals has a scale below 2^-127: exact through exceptions in
    # E8M0 form, and without any when the scale is a float32 (standard-ONNX storage).
    x = (np.random.default_rng(1).standard_normal((4, 32)) * 1e-41).astype(np.float32)
    y = _fold(x, "MX", {"element_dtype": "fp8_e4m3", "axis": 1})
    e8m0 = packing.pack_mx(y, "fp8_e4m3", 1)
    free = packing.pack_mx(y, "fp8_e4m3", 1, e8m0=False)
    assert np.array_equal(_bits(packing.unpack(e8m0)), _bits(y))
    assert np.array_equal(_bits(packing.unpack(free)), _bits(y))
    assert free.exception_indices.size == 0 and free.scales.min() < 0


def test_packing_errors():
    with pytest.raises(TypeError, match="float32"):
        packing.pack_mx(np.zeros(4, np.float16), "int8", 0)
    with pytest.raises(ValueError, match="element_dtype"):
        packing.pack_mx(np.zeros(4, np.float32), "fp3", 0)
    with pytest.raises(ValueError, match="bfp_method"):
        packing.pack_bfp(np.zeros(4, np.float32), "to_bfq", 16, 0)
    with pytest.raises(ValueError, match="payload"):
        reference.unpack_mx(np.zeros(3, np.uint8), np.zeros(1, np.uint8), "fp4_e2m1", 0, 32,
                            (8,))
    with pytest.raises(ValueError, match="scales"):
        reference.unpack_mx(np.zeros(4, np.uint8), np.zeros(2, np.uint8), "fp4_e2m1", 0, 32,
                            (8,))
    with pytest.raises(ValueError, match="shifts"):
        reference.unpack_bfp(np.zeros(8, np.uint8), np.zeros(1, np.uint8), "to_bfp_prime", 16,
                             0, 16, (8,))
    with pytest.raises(ValueError, match="out of range"):
        reference.unpack_mx(np.zeros(1, np.uint8), np.zeros(1, np.uint8), "int8", 0, 32, (1,),
                            np.array([1]), np.array([1.0], np.float32))
