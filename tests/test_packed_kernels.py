"""The C++ decoders of packed weights without ONNX Runtime: the CPU kernel and the GPU kernel
(csrc/cuda/packed_dequantize.cu compiled for the host emulation of csrc/cuda/host_emulation.h,
grids capped at 3 CTAs so the grid-stride loops run several rounds), each bit for bit against
the numpy reader ort_mx_ops.packing and the native kernels' folded values, through a test-only
C entry (tests/packed_entry.cc)."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ort_mx_ops import native, packing
from ort_mx_ops.formats import CONFIGS

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "tests/packed_entry.cc", ROOT / "csrc/common/packed_params.cc",
           ROOT / "csrc/common/params.cc", ROOT / "csrc/cpu/packed_cpu.cc",
           ROOT / "csrc/cuda/packed_dequantize.cu"]
BLOCK_CONFIGS = [name for name, c in CONFIGS.items() if c.op != "BF16"]


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> ctypes.CDLL:
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the packed-weight kernels")
    out = tmp_path_factory.mktemp("packed_kernels")
    flags = ["-std=c++17", "-O1", "-fPIC", "-ffp-contract=off", "-DMXOPS_GPU_EMULATION",
             "-DMXOPS_GPU_MAX_CTAS=3", f"-I{ROOT / 'csrc'}"]
    objs = []
    for src in SOURCES:
        obj = out / (src.name + ".o")
        lang = ["-x", "c++"] if src.suffix == ".cu" else []
        subprocess.run([cxx, *flags, *lang, "-c", str(src), "-o", str(obj)], check=True)
        objs.append(str(obj))
    path = out / "libpacked_kernels.so"
    subprocess.run([cxx, "-shared", "-o", str(path), *objs, "-pthread"], check=True)
    lib = ctypes.CDLL(str(path))
    lib.packed_decode.restype = ctypes.c_char_p
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.packed_decode.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, vp, ctypes.c_int,
                                  vp, i64, vp, i64, vp, i64, vp, vp, i64, vp]
    return lib


def _ptr(a: np.ndarray | None):
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


def decode(lib, gpu: bool, p: packing.PackedWeight, shifts_absent: bool = False) -> np.ndarray:
    """Runs the kernel; the output starts as a poison pattern so unwritten elements show."""
    attrs = ";".join(f"{k}={v}" for k, v in {**p.attrs, "axis": p.axis}.items())
    shape = np.array(p.shape, dtype=np.int64)
    y = np.full(max(int(np.prod(p.shape)), 1), 0x7FA5A5A5, np.uint32).view(np.float32)
    shifts = None if (p.op == "MX" or shifts_absent) else np.ascontiguousarray(p.shifts)
    err = lib.packed_decode(
        int(gpu), int(p.op == "MX"), attrs.encode(), _ptr(shape), len(p.shape),
        _ptr(p.payload), p.payload.size, _ptr(p.scales), p.scales.size, _ptr(shifts),
        0 if shifts is None else shifts.size, _ptr(p.exception_indices),
        _ptr(p.exception_values), p.exception_indices.size, _ptr(y))
    if err:
        raise ValueError(err.decode())
    return y[:int(np.prod(p.shape))].reshape(p.shape)


def _packed_case(config: str, shape, axis: int, seed: int) -> tuple[packing.PackedWeight,
                                                                      np.ndarray]:
    c = CONFIGS[config]
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * rng.choice([1e-30, 1e-3, 1, 300], size=shape))
    x = x.astype(np.float32)
    if x.size >= 8:
        x.reshape(-1)[[1, 4, 6]] = [np.nan, -np.inf, -0.0]
    attrs = {**c.attrs, "axis": axis}
    if c.op == "MX":
        y = native.mx_quantize_dequantize(x, **attrs)
        p = packing.pack_mx(y, attrs["element_dtype"], axis, attrs["block_size"])
    else:
        y = native.bfp_quantize_dequantize(x, **attrs)
        p = packing.pack_bfp(y, attrs["bfp_method"], attrs["bit_width"], axis,
                             attrs["block_size"], attrs.get("sub_block_size", 2),
                             attrs.get("sub_block_shift_bits", 1))
    return p, y


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu_emulated"])
@pytest.mark.parametrize("config", BLOCK_CONFIGS)
def test_kernels_decode_bit_exact(lib, gpu, config):
    for k, (shape, axis) in enumerate([((6, 37, 3), 1), ((6, 37, 3), 2), ((6, 37, 3), 0),
                                       ((45,), 0), ((1,), 0), ((130, 3), -2)]):
        p, y = _packed_case(config, shape, axis, k)
        got = decode(lib, gpu, p)
        want = packing.unpack(p)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (config, shape, axis)
        assert np.array_equal(got.view(np.uint32), y.view(np.uint32))


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu_emulated"])
def test_kernels_decode_large_tensor(lib, gpu):
    # More than one CPU task (2^16 elements) and many grid-stride rounds.
    p, y = _packed_case("MXFP6E2M3", (300, 700), 1, 9)
    assert np.array_equal(decode(lib, gpu, p).view(np.uint32), y.view(np.uint32))


def test_kernel_input_errors(lib):
    p, _ = _packed_case("MX6", (8, 32), 1, 1)
    short = packing.PackedWeight(p.op, p.attrs, p.shape, p.axis, p.payload[:-1], p.scales,
                                 p.shifts)
    with pytest.raises(ValueError, match="payload"):
        decode(lib, False, short)
    with pytest.raises(ValueError, match="shifts"):
        decode(lib, False, p, shifts_absent=True)
    bad = packing.PackedWeight(p.op, p.attrs, p.shape, p.axis, p.payload, p.scales, p.shifts,
                               np.array([256], np.int64), np.array([1.0], np.float32))
    with pytest.raises(ValueError, match="out of range"):
        decode(lib, False, bad)
    wrong = packing.PackedWeight("MX", {"element_dtype": "fp5", "block_size": 32}, (4,), 0,
                                 np.zeros(4, np.uint8), np.zeros(1, np.uint8))
    with pytest.raises(ValueError, match="element_dtype"):
        decode(lib, False, wrong)
