"""Plain numpy implementations of every operator, written to read like docs/formats.md.

This module is the test oracle for the native kernels and a fallback for anyone without the
native build.  It favours clarity over speed: each function moves the blocked axis last,
pads it with zeros to whole blocks (padding never changes a block's maximum exponent), does
the arithmetic of the spec in float32 / integer numpy arrays, and undoes the layout.

Every function takes and returns numpy arrays of float32, float16 or bfloat16 (bfloat16 is
carried as a ``uint16`` array of bit patterns, marked by ``dtype="bfloat16"`` arguments,
because numpy has no bfloat16 type).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .formats import MX_ELEMENT_FORMATS, BFP_METHODS, MXElementFormat, resolve_attrs
# MXDequantize / BFPDequantize: the numpy readers of packed weights (docs/packed_weights.md).
from .packing import unpack_bfp, unpack_mx

__all__ = [
    "round_half",
    "bfp_quantize_dequantize",
    "mx_quantize_dequantize",
    "bf16_round",
    "float32_to_bfloat16_bits",
    "bfloat16_bits_to_float32",
    "float32_to_float16",
    "extended_quantize_linear",
    "extended_dequantize_linear",
    "bf16_quantize_dequantize",
    "unpack_mx",
    "unpack_bfp",
]

F32 = np.float32


# --------------------------------------------------------------------------------------
# Bit helpers and type conversions (docs/formats.md, "Types")
# --------------------------------------------------------------------------------------

def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=F32).view(np.uint32)


def _from_bits(u: np.ndarray) -> np.ndarray:
    return np.asarray(u, dtype=np.uint32).view(F32)


def exponent_field(x: np.ndarray) -> np.ndarray:
    """e(x): bits 30..23 of the float32 ``x`` as int64 (0..255)."""
    return ((_bits(x) >> 23) & 0xFF).astype(np.int64)


def pow2(k: np.ndarray | int) -> np.ndarray:
    """Exact float32 2^k for -149 <= k <= 127 (subnormal powers included)."""
    return np.ldexp(F32(1.0), np.asarray(k, dtype=np.int32)).astype(F32)


def float32_to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest-even); a NaN keeps sign and top payload, quieted."""
    u = _bits(x).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    nan = ((u >> 16) | 0x0040) & 0xFFFF
    return np.where(is_nan, nan, rounded).astype(np.uint16)


def bfloat16_bits_to_float32(b: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bit patterns to float32 exactly."""
    return _from_bits(np.asarray(b, dtype=np.uint32) << 16)


def float32_to_float16(x: np.ndarray) -> np.ndarray:
    """Round float32 to float16 (nearest-even, as F16C and onnxruntime's Cast).

    numpy rounds finite values correctly; a NaN is rebuilt explicitly so that it keeps its
    sign and its top ten payload bits with the quiet bit set.
    """
    x = np.asarray(x, dtype=F32)
    u = _bits(x)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    nan = (((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF)).astype(np.uint16)
    return np.where(np.isnan(x), nan, h).view(np.float16)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """``convert_to_bfloat_before_bfp``: integer nearest-even on the bit pattern, no special
    case (a finite value near float max becomes Inf; a NaN payload may carry)."""
    u = _bits(x).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return _from_bits(u.astype(np.uint32))


def _widen(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return bfloat16_bits_to_float32(x)
    return np.asarray(x).astype(F32)


def _narrow(y: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return float32_to_bfloat16_bits(y)
    if dtype == "float16":
        return float32_to_float16(y)
    return np.asarray(y, dtype=F32)


def _dtype_name(x: np.ndarray, dtype: str | None) -> str:
    if dtype is not None:
        return dtype
    names = {np.dtype(F32): "float32", np.dtype(np.float16): "float16"}
    if x.dtype not in names:
        raise TypeError(f"unsupported input type {x.dtype}: float32, float16 or bfloat16 "
                        "(a uint16 array with dtype='bfloat16')")
    return names[x.dtype]


# --------------------------------------------------------------------------------------
# Rounding (docs/formats.md, "Rounding")
# --------------------------------------------------------------------------------------

def round_half(v: np.ndarray, rounding_mode: int) -> np.ndarray:
    """round(v) on float32 values for rounding_mode 0 (half away from zero, as C roundf),
    1 (half toward +infinity) and 2 (half to even, +0 for every v in (-0.5, 0))."""
    v = np.asarray(v, dtype=F32)
    with np.errstate(invalid="ignore"):
        a = np.abs(v)
        fa = np.floor(a)
        away = np.copysign(fa + (a - fa >= F32(0.5)).astype(F32), v)  # C roundf
        if rounding_mode == 0:
            return away
        f = np.floor(v)
        d = v - f
        if rounding_mode == 1:
            return np.where((v < 0) & (d == F32(0.5)), np.ceil(v), away).astype(F32)
        if rounding_mode == 2:
            f_is_odd = np.fmod(f, F32(2.0)) != 0
            up = (d > F32(0.5)) | ((d == F32(0.5)) & f_is_odd)
            return np.where(up, f + F32(1.0), f).astype(F32)
    raise ValueError(f"rounding_mode must be 0, 1 or 2, got {rounding_mode}")


# --------------------------------------------------------------------------------------
# Blocking: block_size consecutive indices along the axis (docs/formats.md, "Blocks")
# --------------------------------------------------------------------------------------

def _blocked_apply(x: np.ndarray, axis: int, block_size: int,
                   per_block: Callable[[np.ndarray], np.ndarray], granule: int = 1) -> np.ndarray:
    """Apply ``per_block`` to an array of shape (n_blocks, block_size) holding every block
    of the float32 tensor ``x`` (zero-padded), and scatter the result back.

    Padding never changes a result, so a block longer than the axis is padded only to a
    multiple of ``granule`` (the sub-block size, whose boundaries must stay in place)."""
    if x.ndim <= 1:
        axis = 0  # rank 0 or 1: blocked along the only axis, `axis` ignored
        x = x.reshape(-1)
    else:
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"axis {axis} out of range [-{x.ndim}, {x.ndim - 1}]")
        axis %= x.ndim
    moved = np.moveaxis(x, axis, -1)
    length = moved.shape[-1]
    if block_size > length:
        block_size = -(-length // granule) * granule
    n_blocks = -(-length // block_size)
    padded = np.zeros(moved.shape[:-1] + (n_blocks * block_size,), dtype=F32)
    padded[..., :length] = moved
    blocks = padded.reshape(-1, block_size)
    out = per_block(blocks).reshape(padded.shape)[..., :length]
    return np.ascontiguousarray(np.moveaxis(out, -1, axis))


def _run_blocked(x: np.ndarray, dtype: str | None, axis: int, block_size: int,
                 per_block: Callable[[np.ndarray], np.ndarray],
                 prepare: Callable[[np.ndarray], np.ndarray] = lambda v: v,
                 granule: int = 1) -> np.ndarray:
    """Widen, apply ``per_block`` along ``axis``, narrow; a one-element tensor is returned
    (after ``prepare``) unchanged, as Quark does."""
    x = np.asarray(x)
    dtype = _dtype_name(x, dtype)
    shape = x.shape
    xf = prepare(_widen(x, dtype))
    if xf.size == 1:
        return _narrow(xf, dtype).reshape(shape)
    if xf.size == 0:
        return _narrow(xf, dtype).reshape(shape)
    y = _blocked_apply(xf, axis, block_size, per_block, granule)
    return _narrow(y, dtype).reshape(shape)


def _in_nchwc(x: np.ndarray, lanes: int, axis: int, op: str,
              apply: Callable[[np.ndarray], np.ndarray], channels: int = 0) -> np.ndarray:
    """``nchwc_block = lanes`` (docs/formats.md, "NCHWc layout"): the buffer of ``x`` (shape
    ``[N, C, d2, ...]``) holds the tensor in the memory order ``[N, C/lanes, d2, ..., lanes]``.
    Rebuild the logical tensor, ``apply`` the op along axis 1, and store the result back in
    the same order. ``nchwc_channels = channels`` > 0: the tensor is the first ``channels``
    channels only (C - lanes < channels <= C); the others are padding, whose results are +0."""
    if not lanes:
        return apply(x)
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"{op}: nchwc_block ({lanes}) needs an input of rank >= 2, got rank "
                         f"{x.ndim}")
    if axis not in (1, 1 - x.ndim):
        raise ValueError(f"{op}: axis must be 1 (the channels) with nchwc_block, got {axis}")
    n, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
    if c % lanes:
        raise ValueError(f"{op}: nchwc_block ({lanes}) must divide the channel count, got {c}")
    real = channels or c
    if not c - lanes < real <= c:
        raise ValueError(f"{op}: nchwc_channels ({channels}) must be more than {c - lanes} and "
                         f"at most {c} (the input's {c} channels, nchwc_block {lanes})")
    memory = np.ascontiguousarray(x).reshape(n, c // lanes, *spatial, lanes)
    logical = np.moveaxis(memory, -1, 2).reshape(x.shape)
    y = apply(np.ascontiguousarray(logical[:, :real]))
    if real < c:
        y = np.concatenate([y, np.zeros((n, c - real, *spatial), y.dtype)], axis=1)
    back = np.moveaxis(y.reshape(n, c // lanes, lanes, *spatial), 2, -1)
    return np.ascontiguousarray(back).reshape(x.shape)


def _float32_input(x: np.ndarray, dtype: str | None, attr: str, op: str) -> np.ndarray:
    """``x`` as an array where its element type is float32, else ``ValueError`` naming
    ``attr`` (``"name (value)"``), an attribute that applies to float32 inputs only."""
    x = np.asarray(x)
    if _dtype_name(x, dtype) != "float32":
        raise ValueError(f"{op}: {attr} needs a float32 input; allowed for "
                         f"{_dtype_name(x, dtype)}: 0")
    return x


def _divided(x: np.ndarray, dtype: str | None, divisor: int, op: str) -> np.ndarray:
    """``input_divisor = divisor`` (docs/formats.md, "A divisor before the blocks"): each
    element of float32 ``x`` divided by ``divisor``, correctly rounded, with the NaN an x86
    division gives (the Div node this attribute replaces runs on one); 0: ``x`` itself."""
    if not divisor:
        return x
    x = _float32_input(x, dtype, f"input_divisor ({divisor})", op)
    d = F32(divisor)
    with np.errstate(invalid="ignore"):
        return _with_x86_nan((x / d).astype(F32), x, d)


def _hardswished(x: np.ndarray, dtype: str | None, on: int, op: str) -> np.ndarray:
    """``input_hardswish = 1`` (docs/formats.md, "Hard-swish before the blocks"): each
    element of float32 ``x`` replaced by ``x * clip(x + 3, 0, 6)``, each step rounded to
    float32, with the NaN an x86 processor gives (a NaN x quieted; -Inf gives 0 x -Inf's
    NaN); 0: ``x`` itself."""
    if not on:
        return x
    x = _float32_input(x, dtype, "input_hardswish (1)", op).astype(F32, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):
        t = _with_x86_nan((x + F32(3)).astype(F32), x, F32(3))
        c = np.where(t < 0, F32(0), np.where(t > 6, F32(6), t)).astype(F32)  # NaN stays t
        return _with_x86_nan((x * c).astype(F32), x, c)


# --------------------------------------------------------------------------------------
# BFP and microexponents (docs/formats.md, "BFP" and "Microexponents")
# --------------------------------------------------------------------------------------

def _to_bfp_blocks(blocks: np.ndarray, m: int, rounding_mode: int) -> np.ndarray:
    e = exponent_field(blocks)
    is_special = e == 255
    s = np.where(is_special, 0, e).max(axis=1, keepdims=True)            # step 1
    shared_exp = s - 127
    scale = pow2(shared_exp - (m - 1))                                    # step 2
    max_v = F32(2 ** m - 1) * scale
    with np.errstate(over="ignore", invalid="ignore"):
        v = blocks / scale                                                # step 3
        y = np.clip(round_half(v, rounding_mode) * scale, -max_v, max_v)
    return np.where(is_special, blocks, y).astype(F32)


def _significand_round(M: np.ndarray, t: np.ndarray, m: int, rounding_mode: int,
                       negative: np.ndarray) -> np.ndarray:
    """Drop ``t`` low bits of the integer significand ``M`` with rounding_mode
    (docs/formats.md, "Microexponents", step 3); a quotient already at 2^m - 1 is kept
    (saturation, no carry)."""
    t = np.minimum(t, 62)  # t >= 25 gives 0 anyway; keep the shift inside the word
    q = M >> t
    r = M & ((np.int64(1) << t) - 1)
    h = np.where(t > 0, np.int64(1) << np.maximum(t - 1, 0), 1)  # t == 0: no tail, r < h
    tie_up = {0: np.ones_like(q, dtype=bool),
              1: ~negative,
              2: (q & 1) == 1}[rounding_mode]
    up = (r > h) | ((r == h) & tie_up)
    return np.where((q == 2 ** m - 1) | ~up, q, q + 1)


def _to_bfp_prime_blocks(blocks: np.ndarray, m: int, sub_block_size: int,
                         sub_block_shift_bits: int, rounding_mode: int) -> np.ndarray:
    n, block_size = blocks.shape
    u = _bits(blocks).astype(np.int64)
    e = (u >> 23) & 0xFF
    s = e.max(axis=1, keepdims=True)                                      # step 1
    sub_max = e.reshape(n, block_size // sub_block_size, sub_block_size).max(axis=2)
    shift = np.minimum(s - sub_max, 2 ** sub_block_shift_bits - 1)        # step 2
    shift = np.repeat(shift, sub_block_size, axis=1)
    M = np.where(e == 0, 0, (u & 0x7FFFFF) | 0x800000)                    # step 3
    t = s - shift - e + 24 - m
    negative = (u >> 31) == 1
    Mq = _significand_round(M, t, m, rounding_mode, negative)
    magnitude = Mq.astype(F32) * pow2(np.where(s == 255, 0, s - 127 - shift + 1 - m))
    y = np.where(negative, -magnitude, magnitude)                         # step 4
    nan = _from_bits(np.full(blocks.shape, 0x7FFFFFFF, dtype=np.uint32))
    return np.where(s == 255, nan, y).astype(F32)


def bfp_quantize_dequantize(x: np.ndarray, dtype: str | None = None,
                            **attrs: int | str) -> np.ndarray:
    """``BFPQuantizeDequantize`` / ``BFPFixNeuron``: block floating point (``to_bfp``) or
    microexponents (``to_bfp_prime``), returning an array of the input's type and shape.

    ``attrs`` are the node's attributes (``bfp_method``, ``axis``, ``bit_width``,
    ``block_size``, ``rounding_mode``, ``sub_block_size``, ``sub_block_shift_bits``,
    ``convert_to_bfloat_before_bfp``, ``nchwc_block``, ``nchwc_channels``,
    ``input_divisor``, ``input_hardswish``); missing ones
    take the defaults of ``ort_mx_ops.formats.OPS``, and invalid ones raise ``ValueError`` as
    the native op does."""
    a = resolve_attrs("BFPQuantizeDequantize", attrs)
    method = BFP_METHODS[a["bfp_method"]]
    axis, block_size, rounding_mode = a["axis"], a["block_size"], a["rounding_mode"]
    sub_block_size, sub_block_shift_bits = a["sub_block_size"], a["sub_block_shift_bits"]
    m = a["bit_width"] - 9
    if method == "to_bfp":
        def per_block(b: np.ndarray) -> np.ndarray:
            return _to_bfp_blocks(b, m, rounding_mode)
    else:
        def per_block(b: np.ndarray) -> np.ndarray:
            return _to_bfp_prime_blocks(b, m, sub_block_size, sub_block_shift_bits,
                                        rounding_mode)
    prepare = bf16_round if a["convert_to_bfloat_before_bfp"] else (lambda v: v)
    granule = sub_block_size if method == "to_bfp_prime" else 1
    x = _hardswished(x, dtype, a["input_hardswish"], "BFPQuantizeDequantize")
    x = _divided(x, dtype, a["input_divisor"], "BFPQuantizeDequantize")
    return _in_nchwc(x, a["nchwc_block"], axis, "BFPQuantizeDequantize", lambda v: _run_blocked(
        v, dtype, axis, block_size, per_block, prepare, granule), a["nchwc_channels"])


# --------------------------------------------------------------------------------------
# OCP microscaling (docs/formats.md, "OCP microscaling")
# --------------------------------------------------------------------------------------

def _round_to_element(v: np.ndarray, fmt: MXElementFormat) -> np.ndarray:
    """Round float32 ``v`` to the floating element format: nearest-even, subnormals kept,
    magnitude saturated at the max normal, a zero result is +0."""
    a = np.abs(v).astype(np.float64)  # exact; the steps below are exact in float64
    emin = 1 - fmt.bias
    exp = np.frexp(a)[1] - 1  # floor(log2(a)) for a > 0, exactly
    quantum = np.exp2(np.maximum(exp, emin) - fmt.mantissa_bits)
    r = np.round(a / quantum) * quantum  # numpy rounds half to even
    r = np.minimum(r, fmt.max_normal)
    return np.where(r == 0, 0.0, np.copysign(r, v)).astype(F32)


def _mx_blocks(blocks: np.ndarray, fmt: MXElementFormat, rounding_mode: int) -> np.ndarray:
    e = exponent_field(blocks)
    is_special = e == 255
    s = np.where(is_special, 0, e).max(axis=1, keepdims=True)
    X = pow2(s - 127 - fmt.emax)  # may be a float32 subnormal; not clamped to E8M0
    with np.errstate(over="ignore", invalid="ignore"):
        v = (blocks / X).astype(F32)
        if fmt.is_integer:
            q = np.clip(round_half(v / F32(2.0 ** -6), rounding_mode), -128, 127)
            v = (q * F32(2.0 ** -6)).astype(F32)
        else:
            v = _round_to_element(v, fmt)
        y = (X * v).astype(F32)
    return np.where(is_special, blocks, y)


def mx_quantize_dequantize(x: np.ndarray, dtype: str | None = None,
                           **attrs: int | str) -> np.ndarray:
    """``MXQuantizeDequantize`` / ``MXFixNeuron``: OCP microscaling with an E8M0 shared
    scale and the named element type.  ``attrs`` (``element_dtype``, ``axis``,
    ``block_size``, ``rounding_mode``, ``nchwc_block``, ``nchwc_channels``,
    ``input_divisor``, ``input_hardswish``) default and
    validate as in
    ``ort_mx_ops.formats.OPS``."""
    a = resolve_attrs("MXQuantizeDequantize", attrs)
    fmt = MX_ELEMENT_FORMATS[a["element_dtype"]]
    axis, block_size, rounding_mode = a["axis"], a["block_size"], a["rounding_mode"]
    x = _hardswished(x, dtype, a["input_hardswish"], "MXQuantizeDequantize")
    x = _divided(x, dtype, a["input_divisor"], "MXQuantizeDequantize")
    return _in_nchwc(x, a["nchwc_block"], axis, "MXQuantizeDequantize", lambda v: _run_blocked(
        v, dtype, axis, block_size, lambda b: _mx_blocks(b, fmt, rounding_mode)),
        a["nchwc_channels"])


# --------------------------------------------------------------------------------------
# BF16 quantize / dequantize (docs/formats.md, "BF16")
# --------------------------------------------------------------------------------------

def _per_axis(param: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """Broadcast a per-tensor (one element) or per-channel (1-D) parameter along ``axis``."""
    param = np.asarray(param)
    if param.size == 1:
        return param.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = param.size
    return param.reshape(shape)


def extended_quantize_linear(x: np.ndarray, scale: np.ndarray, zero_point_bf16: np.ndarray,
                             axis: int = 1) -> np.ndarray:
    """``ExtendedQuantizeLinear`` with a bfloat16 zero point: y = bfloat16(x / scale + zp),
    returned as bfloat16 bit patterns (uint16); a NaN becomes 0x7FC1."""
    x = np.asarray(x, dtype=F32)
    s = _per_axis(np.asarray(scale, dtype=F32), x.ndim, axis)
    zp = _per_axis(bfloat16_bits_to_float32(zero_point_bf16), x.ndim, axis)
    with np.errstate(all="ignore"):
        v = (x / s + zp).astype(F32)
    return np.where(np.isnan(v), np.uint16(0x7FC1), float32_to_bfloat16_bits(v))


def _with_x86_nan(r: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """r = a (op) b, where r is NaN replaced by the NaN an x86 processor gives: a NaN operand
    with its quiet bit set (a where both are NaN), else (Inf - Inf, 0 × Inf) 0xFFC00000."""
    a, b = np.broadcast_to(a, r.shape), np.broadcast_to(b, r.shape)
    quiet = lambda v: np.ascontiguousarray(v, dtype=F32).view(np.uint32) | np.uint32(0x400000)  # noqa: E731
    nan = np.where(np.isnan(a), quiet(a), np.where(np.isnan(b), quiet(b), np.uint32(0xFFC00000)))
    bits = np.where(np.isnan(r), nan, np.ascontiguousarray(r, dtype=F32).view(np.uint32))
    return bits.astype(np.uint32).view(F32)


def extended_dequantize_linear(y_bf16: np.ndarray, scale: np.ndarray,
                               zero_point_bf16: np.ndarray, axis: int = 1) -> np.ndarray:
    """``ExtendedDequantizeLinear`` with a bfloat16 zero point:
    x = (float(y) - float(zp)) * scale, float32; a NaN result is the one x86 gives
    (docs/formats.md: the NaN operand, quieted, else 0xFFC00000)."""
    y = bfloat16_bits_to_float32(y_bf16)
    s = _per_axis(np.asarray(scale, dtype=F32), y.ndim, axis)
    zp = _per_axis(bfloat16_bits_to_float32(zero_point_bf16), y.ndim, axis)
    with np.errstate(all="ignore"):
        d = _with_x86_nan((y - zp).astype(F32), y, zp)
        return _with_x86_nan((d * s).astype(F32), d, s)


def bf16_quantize_dequantize(x: np.ndarray, scale: np.ndarray, zero_point_bf16: np.ndarray,
                             axis: int = 1) -> np.ndarray:
    """``BF16QuantizeDequantize`` (our own op): the pair in one node,
    ``extended_dequantize_linear(extended_quantize_linear(x, scale, zp), scale, zp)``, float32."""
    q = extended_quantize_linear(x, scale, zero_point_bf16, axis=axis)
    return extended_dequantize_linear(q, scale, zero_point_bf16, axis=axis)
