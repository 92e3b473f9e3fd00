"""Packed weight storage: the byte layout of docs/packed_weights.md, written and read in numpy.

A quantized weight (the values a BFP / MX quantize-dequantize produced, "folded") is stored as

- ``payload``: one code per element, in the tensor's own (row-major) order, packed LSB-first
  into a bit stream (4-bit codes two per byte, 6-bit codes four per three bytes, ...);
- ``scales``: one byte per block, in the order of the tensor's shape with the blocked axis
  replaced by its block count (MX: the E8M0 scale; BFP: the shared exponent);
- ``shifts`` (microexponents only): one code per sub-block, packed like the payload;
- ``exception_indices`` / ``exception_values``: the flat indices and exact float32 values of
  the (rare) elements that the codes cannot express, e.g. Inf or NaN.

:func:`pack_mx` / :func:`pack_bfp` take the folded values and choose codes; every element is
then decoded again and compared bit for bit, so whatever cannot be coded becomes an exception
and :func:`unpack` always returns the folded values exactly. The decoders here are the numpy
twins of ``csrc/common/packed_decode.h`` (the ``MXDequantize`` / ``BFPDequantize`` kernels).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .formats import BFP_METHODS, MX_ELEMENT_FORMATS, MXElementFormat

__all__ = ["PackedWeight", "pack_bits", "unpack_bits", "pack_mx", "pack_bfp", "unpack_mx",
           "unpack_bfp", "unpack", "mx_code_width", "bfp_code_width", "mx_code_values",
           "NAN_BLOCK_BITS"]

F32 = np.float32
NAN_BLOCK_BITS = 0x7FFFFFFF  # what every element of a block with scale byte 255 decodes to


# --------------------------------------------------------------------------------------
# Bit streams
# --------------------------------------------------------------------------------------

def pack_bits(codes: np.ndarray, width: int) -> np.ndarray:
    """Codes (each < 2^width, 1 <= width <= 24) as a little-endian bit stream: code i fills
    bits [i*width, (i+1)*width), bit j of the stream being bit j % 8 of byte j // 8. Unused
    high bits of the last byte are zero."""
    if not 1 <= width <= 24:
        raise ValueError(f"code width must be in [1, 24], got {width}")
    codes = np.asarray(codes, dtype=np.uint32).reshape(-1)
    if codes.size and int(codes.max()) >> width:
        raise ValueError(f"a code does not fit in {width} bits")
    bits = ((codes[:, None] >> np.arange(width, dtype=np.uint32)) & 1).astype(np.uint8)
    return np.packbits(bits.reshape(-1), bitorder="little")


def unpack_bits(stream: np.ndarray, width: int, count: int) -> np.ndarray:
    """The first ``count`` codes of ``width`` bits from a stream written by :func:`pack_bits`
    (uint32). Raises ValueError if the stream is too short."""
    stream = np.asarray(stream, dtype=np.uint8).reshape(-1)
    need = -(-count * width // 8)
    if stream.size < need:
        raise ValueError(f"packed stream has {stream.size} bytes; {count} codes of {width} "
                         f"bits need {need}")
    bits = np.unpackbits(stream[:need], bitorder="little")[:count * width]
    weights = (np.uint32(1) << np.arange(width, dtype=np.uint32))
    return (bits.reshape(count, width).astype(np.uint32) * weights).sum(axis=1,
                                                                        dtype=np.uint32)


# --------------------------------------------------------------------------------------
# Geometry: the tensor as [outer, length, inner], blocks of block_size along length
# --------------------------------------------------------------------------------------

def _geometry(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    if len(shape) <= 1:
        n = int(np.prod(shape)) if shape else 1
        return 1, n, 1
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"axis {axis} out of range for shape {shape}")
    axis %= len(shape)
    outer = int(np.prod(shape[:axis]))
    inner = int(np.prod(shape[axis + 1:]))
    return outer, int(shape[axis]), inner


def _to_blocks(y: np.ndarray, geom: tuple[int, int, int], block: int) -> np.ndarray:
    """(outer, inner, n_blocks, block) view of ``y`` (zero-padded along the axis)."""
    outer, length, inner = geom
    moved = y.reshape(outer, length, inner).transpose(0, 2, 1)
    nb = -(-length // block)
    padded = np.zeros((outer, inner, nb * block), dtype=y.dtype)
    padded[..., :length] = moved
    return padded.reshape(outer, inner, nb, block)


def _from_blocks(blocks: np.ndarray, geom: tuple[int, int, int]) -> np.ndarray:
    """Inverse of :func:`_to_blocks`: flat array in tensor order."""
    outer, length, inner = geom
    flat = blocks.reshape(outer, inner, -1)[..., :length]
    return np.ascontiguousarray(flat.transpose(0, 2, 1)).reshape(-1)


def _per_group(values: np.ndarray, geom: tuple[int, int, int], group: int) -> np.ndarray:
    """Per-element view (outer, length, inner) of per-group values stored as
    (outer, ceil(length / group), inner), a group being ``group`` consecutive indices."""
    outer, length, inner = geom
    table = values.reshape(outer, -(-length // group), inner)
    return table[:, np.arange(length) // group, :]


def _pow2(k: np.ndarray) -> np.ndarray:
    """Exact float32 2^k, k clamped to [-149, 127] as the C++ core's pow2."""
    return np.ldexp(F32(1.0), np.clip(np.asarray(k, dtype=np.int32), -149, 127)).astype(F32)


def _exponent_field(y: np.ndarray) -> np.ndarray:
    return ((np.ascontiguousarray(y, dtype=F32).view(np.uint32) >> 23) & 0xFF).astype(np.int32)


# --------------------------------------------------------------------------------------
# Element codes
# --------------------------------------------------------------------------------------

def mx_code_width(element_dtype: str) -> int:
    """Bits per element code of an MX element type (8 for int8)."""
    fmt = _mx_format(element_dtype)
    return 8 if fmt.is_integer else 1 + fmt.exponent_bits + fmt.mantissa_bits


def bfp_code_width(bit_width: int) -> int:
    """Bits per element code of BFP / microexponents: a sign and bit_width - 9 magnitude bits."""
    return bit_width - 8


def _mx_format(element_dtype: str) -> MXElementFormat:
    fmt = MX_ELEMENT_FORMATS.get(element_dtype)
    if fmt is None:
        raise ValueError(f"element_dtype must be one of {sorted(MX_ELEMENT_FORMATS)}, "
                         f"got {element_dtype!r}")
    return fmt


def mx_code_values(element_dtype: str) -> np.ndarray:
    """float32 value of every code of the element type (index = code): OCP encodings, sign in
    the top bit; int8 codes are two's complement times 2^-6. Codes above the max normal are
    ±Inf (fp8_e5m2 exponent 31, mantissa 0) or NaN, as the OCP formats define them."""
    fmt = _mx_format(element_dtype)
    width = mx_code_width(element_dtype)
    codes = np.arange(2 ** width, dtype=np.int64)
    if fmt.is_integer:
        return (codes.astype(np.uint8).view(np.int8).astype(F32) * F32(2.0 ** -6)).astype(F32)
    mb, eb = fmt.mantissa_bits, fmt.exponent_bits
    sign = codes >> (width - 1)
    e = (codes >> mb) & ((1 << eb) - 1)
    mant = codes & ((1 << mb) - 1)
    emin = 1 - fmt.bias
    mag = np.where(e == 0, np.ldexp(mant.astype(np.float64), emin - mb),
                   np.ldexp((mant + (1 << mb)).astype(np.float64), e - fmt.bias - mb))
    special = mag > fmt.max_normal
    inf = special & (eb == 5) & (mant == 0)
    mag = np.where(special, np.where(inf, np.inf, np.nan), mag)
    return np.where(sign == 1, -mag, mag).astype(F32)


def _nearest_code(v: np.ndarray, values: np.ndarray, negative_zero: Optional[int]) -> np.ndarray:
    """For each float64 ``v``, a code whose value is nearest (exact when ``v`` is one); a zero
    keeps its sign where the format has a negative zero code ``negative_zero``."""
    codes = np.nonzero(np.isfinite(values))[0]
    order = np.argsort(values[codes], kind="stable")
    sorted_vals = values[codes][order].astype(np.float64)
    sorted_codes = codes[order]
    vv = np.where(np.isfinite(v), v, 0.0)
    hi = np.clip(np.searchsorted(sorted_vals, vv), 1, len(sorted_vals) - 1)
    lo = hi - 1
    pick = np.where(np.abs(sorted_vals[hi] - vv) < np.abs(vv - sorted_vals[lo]), hi, lo)
    code = sorted_codes[pick]
    code = np.where(vv == 0, 0, code)
    if negative_zero is not None:
        code = np.where((vv == 0) & np.signbit(vv), negative_zero, code)
    return code.astype(np.uint32)


# --------------------------------------------------------------------------------------
# Decoding (numpy twin of csrc/common/packed_decode.h)
# --------------------------------------------------------------------------------------

def _decode_mx(codes: np.ndarray, scale_bytes: np.ndarray, element_dtype: str) -> np.ndarray:
    """Per element: X * value(code), X = 2^(byte - 127); byte 255 gives NAN_BLOCK_BITS."""
    values = mx_code_values(element_dtype)[codes]
    X = _pow2(scale_bytes.astype(np.int32) - 127)
    with np.errstate(invalid="ignore", over="ignore"):
        y = (X * values).astype(F32)
    special = ~np.isfinite(values)
    y = np.where(special, values, y)  # Inf / NaN codes decode to themselves, unscaled
    return np.where(scale_bytes == 255, np.uint32(NAN_BLOCK_BITS).view(F32), y).astype(F32)


def _decode_signed(codes: np.ndarray, m: int, quantum: np.ndarray,
                   nan_block: np.ndarray) -> np.ndarray:
    """± float(magnitude) * quantum for sign-magnitude codes (sign above m magnitude bits)."""
    mag = (codes & ((1 << m) - 1)).astype(F32) * quantum
    bits = mag.astype(F32).view(np.uint32) | ((codes >> m).astype(np.uint32) << 31)
    bits = np.where(nan_block, np.uint32(NAN_BLOCK_BITS), bits)
    return bits.astype(np.uint32).view(F32)


def _apply_exceptions(y: np.ndarray, indices: Optional[np.ndarray],
                      values: Optional[np.ndarray]) -> np.ndarray:
    if indices is None or len(indices) == 0:
        return y
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    values = np.asarray(values, dtype=F32).reshape(-1)
    if indices.shape != values.shape:
        raise ValueError("exception_indices and exception_values differ in length")
    if indices.min() < 0 or indices.max() >= y.size:
        raise ValueError(f"exception index out of range [0, {y.size})")
    y = y.copy()
    y[indices] = values
    return y


def _check_len(name: str, array: np.ndarray, expected: int) -> np.ndarray:
    array = np.asarray(array, dtype=np.uint8).reshape(-1)
    if array.size != expected:
        raise ValueError(f"{name} has {array.size} bytes; this shape and block size need "
                         f"{expected}")
    return array


def unpack_mx(payload: np.ndarray, scales: np.ndarray, element_dtype: str, axis: int,
              block_size: int, shape: tuple[int, ...],
              exception_indices: Optional[np.ndarray] = None,
              exception_values: Optional[np.ndarray] = None) -> np.ndarray:
    """The float32 tensor of ``shape`` that an ``MXDequantize`` node with these inputs and
    attributes produces (docs/packed_weights.md)."""
    shape = tuple(int(d) for d in shape)
    geom = _geometry(shape, axis)
    outer, length, inner = geom
    n = outer * length * inner
    width = mx_code_width(element_dtype)
    codes = unpack_bits(_check_len("payload", payload, -(-n * width // 8)), width, n)
    nb = -(-length // block_size)
    scales = np.asarray(scales)
    if scales.dtype != np.int16:  # int16: unclipped exponents of pack_mx(e8m0=False)
        scales = _check_len("scales", scales, outer * nb * inner)
    elif scales.size != outer * nb * inner:
        raise ValueError(f"scales has {scales.size} entries; need {outer * nb * inner}")
    per_elem = _per_group(scales, geom, block_size).reshape(-1)
    y = _decode_mx(codes, per_elem, element_dtype)
    return _apply_exceptions(y, exception_indices, exception_values).reshape(shape)


def unpack_bfp(payload: np.ndarray, exponents: np.ndarray, bfp_method: str, bit_width: int,
               axis: int, block_size: int, shape: tuple[int, ...],
               shifts: Optional[np.ndarray] = None, sub_block_size: int = 2,
               sub_block_shift_bits: int = 1,
               exception_indices: Optional[np.ndarray] = None,
               exception_values: Optional[np.ndarray] = None) -> np.ndarray:
    """The float32 tensor of ``shape`` that a ``BFPDequantize`` node produces: to_bfp elements
    are ±q * 2^(E - 127 - (m - 1)); to_bfp_prime elements ±q * 2^(E - shift - 127 + 1 - m),
    E the block's exponent byte (255: the whole block is NaN), m = bit_width - 9."""
    method = _bfp_method(bfp_method)
    shape = tuple(int(d) for d in shape)
    geom = _geometry(shape, axis)
    outer, length, inner = geom
    n = outer * length * inner
    m = bit_width - 9
    width = bfp_code_width(bit_width)
    codes = unpack_bits(_check_len("payload", payload, -(-n * width // 8)), width, n)
    nb = -(-length // block_size)
    exponents = _check_len("exponents", exponents, outer * nb * inner)
    E = _per_group(exponents, geom, block_size).reshape(-1).astype(np.int32)
    if method == "to_bfp":
        quantum = _pow2(E - 127 - (m - 1))
        nan_block = np.zeros(n, dtype=bool)
    else:
        shift = _shift_per_element(shifts, geom, sub_block_size, sub_block_shift_bits)
        quantum = _pow2(E - shift - 127 + 1 - m)
        nan_block = E == 255
    y = _decode_signed(codes, m, quantum, nan_block)
    return _apply_exceptions(y, exception_indices, exception_values).reshape(shape)


def _shift_per_element(shifts: Optional[np.ndarray], geom: tuple[int, int, int],
                       sub_block_size: int, shift_bits: int) -> np.ndarray:
    outer, length, inner = geom
    n_sub = outer * -(-length // sub_block_size) * inner
    if shift_bits == 0:
        return np.zeros(outer * length * inner, dtype=np.int32)
    if shifts is None:
        raise ValueError("to_bfp_prime with sub_block_shift_bits > 0 needs the shifts input")
    stream = _check_len("shifts", shifts, -(-n_sub * shift_bits // 8))
    table = unpack_bits(stream, shift_bits, n_sub).astype(np.int32)
    return _per_group(table, geom, sub_block_size).reshape(-1)


# --------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------

@dataclass
class PackedWeight:
    """One packed weight: the inputs and attributes of its dequantize node.

    ``op`` is ``"MX"`` (``MXDequantize``) or ``"BFP"`` (``BFPDequantize``); ``attrs`` holds
    the format attributes (element_dtype, or bfp_method / bit_width / sub_block_size /
    sub_block_shift_bits) plus ``block_size``; ``shape`` and ``axis`` the tensor's geometry."""
    op: str
    attrs: dict[str, Any]
    shape: tuple[int, ...]
    axis: int
    payload: np.ndarray
    scales: np.ndarray
    shifts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    exception_indices: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    exception_values: np.ndarray = field(default_factory=lambda: np.zeros(0, F32))

    @property
    def nbytes(self) -> int:
        """Bytes the packed arrays take."""
        return int(self.payload.nbytes + self.scales.nbytes + self.shifts.nbytes +
                   self.exception_indices.nbytes + self.exception_values.nbytes)


def _float32_input(folded: np.ndarray) -> np.ndarray:
    folded = np.asarray(folded)
    if folded.dtype != F32:
        raise TypeError(f"packing takes float32 weights, got {folded.dtype}; keep other types "
                        "in the folded storage")
    return np.ascontiguousarray(folded)


def _exceptions(folded: np.ndarray, decoded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = folded.reshape(-1).view(np.uint32)
    b = decoded.reshape(-1).view(np.uint32)
    idx = np.nonzero(a != b)[0].astype(np.int64)
    return idx, folded.reshape(-1)[idx].astype(F32)


def _mx_codes(blocks: np.ndarray, scale_byte: np.ndarray,
              element_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Codes nearest to blocks / X and whether each block then decodes bit for bit."""
    fmt = _mx_format(element_dtype)
    width = mx_code_width(element_dtype)
    values = mx_code_values(element_dtype)
    X = _pow2(scale_byte.astype(np.int32) - 127).astype(np.float64)[..., None]
    with np.errstate(invalid="ignore"):
        v = blocks.astype(np.float64) / X
    negative_zero = None if fmt.is_integer else 1 << (width - 1)
    codes = _nearest_code(v.reshape(-1), values, negative_zero).reshape(v.shape)
    bytes_each = np.broadcast_to(scale_byte[..., None], codes.shape)
    decoded = _decode_mx(codes, bytes_each, element_dtype)
    exact = (decoded.view(np.uint32) == blocks.view(np.uint32)).all(axis=-1)
    return codes, exact


def pack_mx(folded: np.ndarray, element_dtype: str, axis: int, block_size: int = 32,
            e8m0: bool = True) -> PackedWeight:
    """Pack the float32 output of ``MXQuantizeDequantize`` (same element_dtype, axis,
    block_size). The scale byte is E - emax clipped to [0, 254], E the block's largest finite
    exponent field; for a block that this does not code exactly, E - emax - 1 is tried (an
    int8 element of -128 lies one binade above the scale's). Codes are the elements nearest
    to y / X; elements that still decode differently become exceptions.

    ``e8m0=False`` (for float32 scales, the standard-ONNX storage): no clipping at 0, so a
    block of float32 subnormals keeps its own scale 2^(E - 127 - emax) < 2^-127; ``scales``
    is then int16."""
    y = _float32_input(folded)
    _mx_format(element_dtype)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    geom = _geometry(y.shape, axis)
    blocks = _to_blocks(y, geom, block_size)
    e = _exponent_field(blocks)
    s = np.where(e == 255, 0, e).max(axis=-1)
    low, dtype = (0, np.uint8) if e8m0 else (-149 + 127, np.int16)
    scale_byte = np.clip(s - _mx_format(element_dtype).emax, low, 254).astype(dtype)
    codes, exact = _mx_codes(blocks, scale_byte, element_dtype)
    lower = np.maximum(scale_byte.astype(np.int32) - 1, low).astype(dtype)
    if not exact.all():
        codes_lower, exact_lower = _mx_codes(blocks, lower, element_dtype)
        use_lower = ~exact & exact_lower
        scale_byte = np.where(use_lower, lower, scale_byte)
        codes = np.where(use_lower[..., None], codes_lower, codes)
    scales = np.ascontiguousarray(scale_byte.transpose(0, 2, 1)).reshape(-1)
    packed = PackedWeight("MX", {"element_dtype": element_dtype, "block_size": int(block_size)},
                          tuple(y.shape), int(axis),
                          pack_bits(_from_blocks(codes, geom), mx_code_width(element_dtype)),
                          scales)
    decoded = unpack(packed)
    packed.exception_indices, packed.exception_values = _exceptions(y, decoded)
    return packed


def _bfp_method(name: str) -> str:
    method = BFP_METHODS.get(name)
    if method is None:
        raise ValueError(f"bfp_method must be one of {sorted(BFP_METHODS)}, got {name!r}")
    return method


def pack_bfp(folded: np.ndarray, bfp_method: str, bit_width: int, axis: int,
             block_size: int = 8, sub_block_size: int = 2,
             sub_block_shift_bits: int = 1) -> PackedWeight:
    """Pack the float32 output of ``BFPQuantizeDequantize`` (same attributes): the exponent
    byte is the block's largest exponent field (finite ones for to_bfp; 255 for a
    to_bfp_prime block of NaNs), the shift of a sub-block min(E - its largest exponent field,
    2^shift_bits - 1), the code the sign and |y| / quantum; elements whose decoded value
    differs become exceptions."""
    y = _float32_input(folded)
    method = _bfp_method(bfp_method)
    if not 10 <= bit_width <= 32:
        raise ValueError(f"bit_width must be in [10, 32], got {bit_width}")
    prime = method == "to_bfp_prime"
    if block_size < 1 or (prime and (sub_block_size < 1 or block_size % sub_block_size)):
        raise ValueError("block_size must be >= 1 and (to_bfp_prime) a multiple of "
                         "sub_block_size")
    if prime and not 0 <= sub_block_shift_bits <= 8:
        raise ValueError("sub_block_shift_bits must be in [0, 8]")
    m = bit_width - 9
    geom = _geometry(y.shape, axis)
    blocks = _to_blocks(y, geom, block_size)
    e = _exponent_field(blocks)
    attrs: dict[str, Any] = {"bfp_method": method, "bit_width": int(bit_width),
                             "block_size": int(block_size)}
    shifts_stream = np.zeros(0, np.uint8)
    if not prime:
        E = np.where(e == 255, 0, e).max(axis=-1)
        quantum = _pow2(E - 127 - (m - 1))[..., None]
    else:
        E = e.max(axis=-1)
        sub = e.reshape(e.shape[:-1] + (block_size // sub_block_size, sub_block_size))
        shift = np.minimum(E[..., None] - sub.max(axis=-1), (1 << sub_block_shift_bits) - 1)
        quantum = np.repeat(_pow2(E[..., None] - shift - 127 + 1 - m), sub_block_size, axis=-1)
        attrs.update(sub_block_size=int(sub_block_size),
                     sub_block_shift_bits=int(sub_block_shift_bits))
        if sub_block_shift_bits:
            n_sub = -(-geom[1] // sub_block_size)
            table = shift.reshape(shift.shape[0], shift.shape[1], -1)[..., :n_sub]
            table = np.ascontiguousarray(table.transpose(0, 2, 1)).reshape(-1)
            shifts_stream = pack_bits(table, sub_block_shift_bits)
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.abs(blocks.astype(np.float64)) / quantum.astype(np.float64)
    q = np.where(np.isfinite(q), np.clip(np.rint(q), 0, (1 << m) - 1), 0).astype(np.uint32)
    codes = q | (np.signbit(blocks).astype(np.uint32) << m)
    codes = _from_blocks(codes, geom)
    exponents = np.ascontiguousarray(E.transpose(0, 2, 1)).reshape(-1).astype(np.uint8)
    packed = PackedWeight("BFP", attrs, tuple(y.shape), int(axis),
                          pack_bits(codes, bfp_code_width(bit_width)), exponents, shifts_stream)
    decoded = unpack(packed)
    packed.exception_indices, packed.exception_values = _exceptions(y, decoded)
    return packed


def unpack(packed: PackedWeight) -> np.ndarray:
    """The float32 tensor a :class:`PackedWeight` stands for (its dequantize node's output)."""
    a = packed.attrs
    if packed.op == "MX":
        return unpack_mx(packed.payload, packed.scales, a["element_dtype"], packed.axis,
                         a["block_size"], packed.shape, packed.exception_indices,
                         packed.exception_values)
    if packed.op == "BFP":
        return unpack_bfp(packed.payload, packed.scales, a["bfp_method"], a["bit_width"],
                          packed.axis, a["block_size"], packed.shape, packed.shifts,
                          a.get("sub_block_size", 2), a.get("sub_block_shift_bits", 1),
                          packed.exception_indices, packed.exception_values)
    raise ValueError(f"PackedWeight.op must be 'MX' or 'BFP', got {packed.op!r}")
