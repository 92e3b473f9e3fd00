"""Cases and drivers shared by the GPU kernel tests (test_gpu_kernels.py on a real device,
test_gpu_emulated.py on host threads): tensors, attributes and the C entry points of the GPU
test library (csrc/cuda/test_entry.cu; setup.py links it beside each GPU library into
build/gpu-tests/, never into the installed package), checked bit for bit against the CPU
kernels.
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from pathlib import Path

from ort_mx_ops import _native, reference
from ort_mx_ops.formats import CONFIGS

DTYPES = ("float32", "float16", "bfloat16")
ROOT = Path(__file__).resolve().parents[1]


def test_library_path(backend: str) -> Path:
    """Where setup.py puts the test library of `backend` ("CUDA" or "ROCM");
    $MXOPS_GPU_TEST_LIB_DIR overrides the folder."""
    folder = Path(os.environ.get("MXOPS_GPU_TEST_LIB_DIR", ROOT / "build" / "gpu-tests"))
    return folder / f"libort_mx_ops_{backend.lower()}_tests.so"

# Values that exercise every special path: zeros of both signs, infinities, NaNs with
# payloads, float32 subnormals and float16 subnormals, values near float max.
SPECIALS_F32 = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-40, -1e-40, 3e38, -3.4e38, 1e-45,
     6e-8, -6e-8, 65504.0, 65520.0, 0.5, -0.5, 1.5, -2.5, 1e-20, 5.877e-39],
    dtype=np.float32)
# Output buffers start as these signalling-NaN patterns, which no kernel writes: computed NaNs
# are quiet, and a float32 NaN passed through unchanged comes from the input, whose tensors
# (make_input) never hold them. An element left unwritten therefore shows as this pattern.
POISON = {"float32": 0x7FA5A5A5, "float16": 0x7D5A, "bfloat16": 0x7FA5}
POISON_BY_ITEMSIZE = {4: POISON["float32"], 2: POISON["bfloat16"]}
NAN_PAYLOADS_F32 = np.array([0x7fc00001, 0xffc12345, 0x7f800001, 0x7fffffff], dtype=np.uint32)


@dataclass(frozen=True)
class Case:
    name: str
    op: str               # "BFP" or "MX"
    attrs: dict[str, Any]
    dtype: str            # "float32", "float16", "bfloat16"
    shape: tuple[int, ...]
    offset: int = 0       # elements to shift the buffers by (misaligned vector paths)
    seed: int = 0
    specials: int = 16    # one element in this many is a special value (make_input)

    @property
    def attr_string(self) -> str:
        return attr_string(self.attrs)


def attr_string(attrs: dict[str, Any]) -> str:
    return ";".join(f"{k}={v}" for k, v in attrs.items())


def _with(attrs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    d = dict(attrs)
    d.update(extra)
    return d


def make_input(shape: tuple[int, ...], dtype: str, seed: int, specials: int = 16) -> np.ndarray:
    """A tensor whose blocks have very different magnitudes, with special values mixed in (one
    element in `specials`). bfloat16 is returned as uint16 bit patterns."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    mag = np.exp2(rng.integers(-30, 30, size=n)).astype(np.float32)
    x = (rng.standard_normal(n).astype(np.float32) * mag).astype(np.float32)
    if dtype == "float16":
        x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 14, size=n))).astype(np.float32)
    # Exact rounding ties (k + 1/2) * 2^j for every rounding mode, and a run of zeros.
    ties = ((rng.integers(-300, 300, n) + 0.5) * np.exp2(rng.integers(-12, 4, n)))
    x = np.where(rng.random(n) < 0.25, ties.astype(np.float32), x).astype(np.float32)
    if n >= 24:
        start = int(rng.integers(0, n - 8))
        x[start:start + 8] = 0.0
    if n >= 8:
        k = max(1, n // specials)
        idx = rng.choice(n, size=k, replace=False)
        x[idx] = rng.choice(SPECIALS_F32, size=k)
        if dtype == "float32" and n >= 32:
            j = rng.choice(n, size=min(4, n // 8), replace=False)
            x.view(np.uint32)[j] = rng.choice(NAN_PAYLOADS_F32, size=j.size)
    if dtype == "float32":
        out = x
    elif dtype == "float16":
        with np.errstate(over="ignore"):
            out = x.astype(np.float16)
    else:
        u = x.view(np.uint32)
        out = ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        out[np.isnan(x)] = (u[np.isnan(x)] >> 16).astype(np.uint16) | 0x40
    return out.reshape(shape)


def cpu_reference(case: Case, x: np.ndarray) -> np.ndarray:
    return _native.quantize_dequantize(case.op, x, dict(case.attrs),
                                       "bfloat16" if case.dtype == "bfloat16" else "")


def storage_dtype(dtype: str) -> np.dtype:
    return np.dtype(np.float32 if dtype == "float32" else
                    np.float16 if dtype == "float16" else np.uint16)


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16)


# ------------------------------------------------------------------------------------------
# The cases
# ------------------------------------------------------------------------------------------

# (shape, axis): blocked axis innermost (odd and even lengths, vector and scalar paths),
# outer (wide and narrow inner), rank 1, rank 4.
SHAPES_INNER = [((6, 64), 1), ((5, 37), -1), ((3, 4, 96), 2), ((1000,), 0), ((333,), 1)]
SHAPES_OUTER = [((2, 19, 33), 1), ((40, 3), 0), ((3, 20, 2, 5), 1), ((64, 8), 0)]


def config_cases(shapes=SHAPES_INNER + SHAPES_OUTER, dtypes=DTYPES) -> Iterator[Case]:
    """Every built-in configuration (except BF16, a Q/DQ pair), each dtype, inner
    and outer axes, odd lengths."""
    seed = 0
    for name, cfg in CONFIGS.items():
        if cfg.op == "BF16":
            continue
        for dtype in dtypes:
            for shape, axis in shapes:
                seed += 1
                yield Case(f"{name}-{dtype}-{shape}-ax{axis}", cfg.op, _with(cfg.attrs, axis=axis),
                           dtype, shape, seed=seed)


def variant_cases(dtypes=DTYPES) -> Iterator[Case]:
    """Attributes beyond the named configs that take other kernel paths: every rounding mode,
    convert_to_bfloat_before_bfp, block sizes that are odd, not powers of two, longer than a
    register block, sub-blocks of every layout, misaligned buffers, one element, empty."""
    bfp = CONFIGS["BFP16"].attrs
    mx9 = CONFIGS["MX9"].attrs
    mx6 = CONFIGS["MX6"].attrs
    fp8 = CONFIGS["MXFP8E4M3"].attrs
    fp4 = CONFIGS["MXFP4E2M1"].attrs
    int8 = CONFIGS["MXINT8"].attrs
    variants: list[tuple[str, str, dict[str, Any], list[tuple[tuple[int, ...], int]]]] = []
    inner = [((4, 48), 1), ((3, 35), 1)]
    outer = [((2, 41, 7), 1)]
    for mode in (0, 1, 2):
        variants.append((f"bfp-r{mode}", "BFP", _with(bfp, rounding_mode=mode), inner + outer))
        variants.append((f"mx9-r{mode}", "BFP", _with(mx9, rounding_mode=mode), inner + outer))
        variants.append((f"int8-r{mode}", "MX", _with(int8, rounding_mode=mode), inner + outer))
        variants.append((f"fp8-r{mode}", "MX", _with(fp8, rounding_mode=mode), inner))
    variants += [
        ("bfp-bf16first", "BFP", _with(bfp, convert_to_bfloat_before_bfp=1), inner + outer),
        ("mx6-bf16first", "BFP", _with(mx6, convert_to_bfloat_before_bfp=1), inner + outer),
        ("bfp-bs7", "BFP", _with(bfp, block_size=7), inner + outer),
        ("bfp-bs1", "BFP", _with(bfp, block_size=1), inner + outer),
        ("bfp-bs100", "BFP", _with(bfp, block_size=100), [((3, 250), 1), ((2, 130, 5), 1)]),
        ("bfp-bs512", "BFP", _with(bfp, block_size=512), [((2, 1100), 1), ((1200,), 0)]),
        ("fp4-bs40", "MX", _with(fp4, block_size=40), [((3, 120), 1), ((3, 90), 1), ((50, 3), 0)]),
        ("fp4-bs33", "MX", _with(fp4, block_size=33), [((2, 70), 1), ((2, 70, 3), 1)]),
        # to_bfp_prime sub-block layouts: inside a lane's vector, across lanes, across whole
        # slices of a long block, a segmented scan (odd sizes), and the per-thread fallback.
        ("prime-bs8-sub2", "BFP", _with(mx9, block_size=8, sub_block_size=2), inner + outer),
        ("prime-bs16-sub8", "BFP", _with(mx9, sub_block_size=8), inner + outer),
        ("prime-bs16-sub16", "BFP", _with(mx9, sub_block_size=16), inner),
        ("prime-bs16-sub1", "BFP", _with(mx9, sub_block_size=1), inner),
        ("prime-bs12-sub3", "BFP", _with(mx9, block_size=12, sub_block_size=3), inner + outer),
        ("prime-bs12-sub4", "BFP", _with(mx9, block_size=12, sub_block_size=4), inner + outer),
        ("prime-bs24-sub6", "BFP", _with(mx9, block_size=24, sub_block_size=6),
         [((3, 48), 1), ((2, 50), 1), ((2, 50, 3), 1)]),
        ("prime-bs256-sub128", "BFP", _with(mx9, block_size=256, sub_block_size=128),
         [((2, 512), 1), ((2, 300), 1), ((300, 2), 0)]),
        ("prime-bs512-sub256", "BFP", _with(mx9, block_size=512, sub_block_size=256),
         [((2, 1024), 1)]),
        ("prime-bs96-sub3", "BFP", _with(mx9, block_size=96, sub_block_size=3),
         [((2, 200), 1), ((100, 2), 0)]),
        ("prime-bs64-sub32", "BFP", _with(mx9, block_size=64, sub_block_size=32),
         [((3, 64), 1), ((2, 200), 1), ((70, 2), 0)]),
        ("prime-bs64-sub4", "BFP", _with(mx9, block_size=64, sub_block_size=4),
         [((3, 64), 1), ((2, 200), 1), ((70, 2), 0)]),
        ("prime-shift3", "BFP", _with(mx9, sub_block_shift_bits=3), inner + outer),
        ("identity", "BFP", _with(bfp, convert_to_bfloat_before_bfp=1),
         [((1, 1, 1), 2), ((1,), 0)]),
        ("identity-mx", "MX", fp8, [((1, 1), 1)]),
        ("empty", "MX", fp8, [((0, 5), 1), ((3, 0), 1)]),
    ]
    seed = 10_000
    for name, op, attrs, shapes in variants:
        for dtype in dtypes:
            for shape, axis in shapes:
                seed += 1
                yield Case(f"{name}-{dtype}-{shape}-ax{axis}", op, _with(attrs, axis=axis),
                           dtype, shape, seed=seed)
    # Enough blocks for several CTAs, so grid-stride loops run more than one round where the
    # grid is capped (the emulated build caps it at 3 CTAs).
    for name in ("BFP16", "MX9", "MXFP4E2M1", "MXINT8"):
        cfg = CONFIGS[name]
        for dtype in dtypes:
            for shape, axis in (((64, 256), 1), ((256, 64), 0), ((33, 300), 1), ((30, 7, 40), 1)):
                seed += 1
                yield Case(f"{name}-{dtype}-{shape}-ax{axis}-many", cfg.op,
                           _with(cfg.attrs, axis=axis), dtype, shape, seed=seed)
    # Buffers one element off a 16-byte boundary: the scalar path must take over.
    for name in ("BFP16", "MX9", "MXFP6E2M3"):
        cfg = CONFIGS[name]
        for dtype in dtypes:
            seed += 1
            yield Case(f"{name}-{dtype}-misaligned", cfg.op, _with(cfg.attrs, axis=1), dtype,
                       (4, 64), offset=1, seed=seed)


def finite_cases(dtypes=DTYPES) -> Iterator[Case]:
    """Every built-in configuration on tensors with few special values, so that most blocks
    are finite (the kernels' plain forms) and a few, also in the same warp, are not."""
    seed = 20_000
    for name, cfg in CONFIGS.items():
        if cfg.op == "BF16":
            continue
        for dtype in dtypes:
            for shape, axis in [((48, 128), 1), ((96, 64), 0), ((3, 64, 40), 1)]:
                seed += 1
                yield Case(f"{name}-{dtype}-{shape}-ax{axis}-finite", cfg.op,
                           _with(cfg.attrs, axis=axis), dtype, shape, seed=seed, specials=512)


def all_cases(dtypes=DTYPES) -> list[Case]:
    return (list(config_cases(dtypes=dtypes)) + list(variant_cases(dtypes=dtypes))
            + list(finite_cases(dtypes=dtypes)))


# ------------------------------------------------------------------------------------------
# The C entry points
# ------------------------------------------------------------------------------------------

def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declares the signatures of the GPU library's C entry points."""
    lib.mxops_gpu_qdq.restype = ctypes.c_int
    lib.mxops_gpu_qdq.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                  ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_char_p, ctypes.c_size_t]
    lib.mxops_gpu_bf16_qdq.restype = ctypes.c_int
    lib.mxops_gpu_bf16_qdq.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
                                       ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.mxops_gpu_execution_provider.restype = ctypes.c_char_p
    lib.mxops_gpu_execution_provider.argtypes = []
    return lib


def shape_array(shape: tuple[int, ...]):
    return (ctypes.c_int64 * max(1, len(shape)))(*shape)


def call_qdq(lib: ctypes.CDLL, op: str, attrs: str, dtype: str, shape: tuple[int, ...],
             x_ptr: int, y_ptr: int, stream: int = 0) -> None:
    err = ctypes.create_string_buffer(1024)
    rc = lib.mxops_gpu_qdq(op.encode(), attrs.encode(), dtype.encode(), shape_array(shape),
                           len(shape), x_ptr, y_ptr, stream, err, len(err))
    if rc != 0:
        raise ValueError(err.value.decode())


def call_bf16_qdq(lib: ctypes.CDLL, direction: int, shape: tuple[int, ...], axis: int,
                  per_channel: bool, x_ptr: int, scale_ptr: int, zp_ptr: int, y_ptr: int,
                  stream: int = 0) -> None:
    err = ctypes.create_string_buffer(1024)
    rc = lib.mxops_gpu_bf16_qdq(direction, shape_array(shape), len(shape), axis,
                                int(per_channel), x_ptr, scale_ptr, zp_ptr, y_ptr, stream, err,
                                len(err))
    if rc != 0:
        raise ValueError(err.value.decode())


def bf16_nan_cases() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Inputs whose BF16 dequantization is NaN in every way, along axis 1 of an [8, 6] tensor:
    (y as bfloat16 bits, x as float32 for the fused op, scale, zero point bits). Rows hold NaN
    payloads (quiet, signalling, negative), +-Inf, 1, +-0; the six channels an ordinary one, a
    NaN zero point, an Inf zero point (Inf - Inf), a NaN scale, a zero scale (0 x Inf) and a
    signalling-NaN zero point with a NaN scale."""
    column = np.array([0x7FC1, 0x7F81, 0xFFC5, 0x7F80, 0xFF80, 0x3F80, 0x0000, 0x8000], np.uint16)
    y = np.repeat(column[:, None], 6, axis=1)
    x = (y.astype(np.uint32) << 16).view(np.float32)
    x[0, :] = np.array([0x7FA00001], np.uint32).view(np.float32)[0]  # a float32 signalling NaN
    scale = np.array([1.5, 2.0, 0.5, 0.0, 0.0, 0.0], np.float32)
    scale.view(np.uint32)[3] = 0x7FA00001
    scale.view(np.uint32)[5] = 0xFFC00123
    zp = np.array([0x3F80, 0x7FC3, 0x7F80, 0x4000, 0x0000, 0x7F85], np.uint16)
    return y, x, scale, zp


def bf16_reference(direction: int, x: np.ndarray, scale: np.ndarray, zp: np.ndarray,
                   axis: int) -> np.ndarray:
    """The numpy reference's BF16 quantize (direction 0: bfloat16 bits of x / scale + zp, NaN
    -> 0x7FC1) or dequantize (1: (y - zp) * scale, x86's NaN results)."""
    if direction == 0:
        return reference.extended_quantize_linear(x, scale, zp, axis=axis)
    return reference.extended_dequantize_linear(x, scale, zp, axis=axis)


Runner = Callable[[Case, np.ndarray], np.ndarray]
