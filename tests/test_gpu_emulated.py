"""The GPU kernels' logic, checked without a GPU: csrc/cuda/*.cu compiled as C++ against the
host emulation in csrc/cuda/host_emulation.h (lane groups on host threads, shuffles as
exchanges), driven through the same C entry points as on a device, bit for bit against the
CPU kernels. This catches indexing, tail, lane-group and sub-block mistakes on any machine;
test_gpu_kernels.py checks the real compiled kernels where a GPU is present.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import gpu_cases as gc

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "csrc" / "cuda").glob("*.cu")) + [ROOT / "csrc/common/params.cc"]


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


@pytest.fixture(scope="module")
def emulated(tmp_path_factory) -> ctypes.CDLL:
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler to build the emulated GPU kernels")
    out = tmp_path_factory.mktemp("gpu_emulation")
    # At most 3 CTAs per launch, so the kernels' grid-stride loops run several rounds.
    flags = ["-std=c++17", "-O1", "-fPIC", "-ffp-contract=off", "-DMXOPS_GPU_EMULATION",
             "-DMXOPS_GPU_MAX_CTAS=3", f"-I{ROOT / 'csrc'}"]

    def compile_one(src: Path) -> Path:
        obj = out / (src.name + ".o")
        lang = ["-x", "c++"] if src.suffix == ".cu" else []
        subprocess.run([cxx, *flags, *lang, "-c", str(src), "-o", str(obj)], check=True)
        return obj

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        objs = list(pool.map(compile_one, SOURCES))
    lib = out / "libmxops_gpu_emulated.so"
    subprocess.run([cxx, "-shared", "-o", str(lib), *map(str, objs), "-pthread"], check=True)
    return gc.bind(ctypes.CDLL(str(lib)))


class GuardedBuffer:
    """`nbytes` of memory ending exactly at an inaccessible page, so a kernel that reads or
    writes past the end of its tensor crashes the test instead of passing by luck."""

    _libc = ctypes.CDLL(None, use_errno=True)

    def __init__(self, nbytes: int, dtype: np.dtype):
        page = mmap.PAGESIZE
        self.size = (nbytes + page - 1) // page * page + page
        self.map = mmap.mmap(-1, self.size, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        guard = base + self.size - page
        if self._libc.mprotect(ctypes.c_void_p(guard), page, 0) != 0:  # PROT_NONE
            raise OSError(ctypes.get_errno(), "mprotect failed")
        start = self.size - page - nbytes
        self.array = np.frombuffer(self.map, dtype=dtype, count=nbytes // dtype.itemsize,
                                   offset=start)
        self.ptr = base + start


def run_emulated(lib: ctypes.CDLL, case: gc.Case, x: np.ndarray) -> np.ndarray:
    """Runs the emulated kernels on x. The tensors end at an inaccessible page (trailing
    reads and writes crash) unless case.offset asks for a misaligned start; then both sit at
    `offset` elements past a 64-byte boundary with poisoned padding around them."""
    n, dt = x.size, x.dtype
    if case.offset == 0 and n > 0:
        xg, yg = GuardedBuffer(n * dt.itemsize, dt), GuardedBuffer(n * dt.itemsize, dt)
        xg.array[:] = x.reshape(-1)
        gc.bits(yg.array)[:] = gc.POISON[case.dtype]
        gc.call_qdq(lib, case.op, case.attr_string, case.dtype, case.shape, xg.ptr, yg.ptr)
        assert np.array_equal(gc.bits(xg.array), gc.bits(x.reshape(-1))), "the input was written"
        return yg.array.reshape(case.shape).copy()
    poison = gc.POISON[case.dtype]
    xb = np.zeros(n + 64, dtype=dt)
    yb = np.zeros(n + 64, dtype=dt)
    gc.bits(yb)[:] = poison  # bits() of a contiguous array is a view
    pad_x = (-(xb.ctypes.data % 64) // dt.itemsize) % (64 // dt.itemsize) + case.offset
    pad_y = (-(yb.ctypes.data % 64) // dt.itemsize) % (64 // dt.itemsize) + case.offset
    xv = xb[pad_x:pad_x + n]
    yv = yb[pad_y:pad_y + n]
    xv[:] = x.reshape(-1)
    gc.call_qdq(lib, case.op, case.attr_string, case.dtype, case.shape, xv.ctypes.data,
                yv.ctypes.data)
    assert np.array_equal(gc.bits(xv), gc.bits(x.reshape(-1))), "the input was written"
    outside = np.concatenate([gc.bits(yb)[:pad_y], gc.bits(yb)[pad_y + n:]])
    assert np.all(outside == poison), "the kernel wrote outside its output"
    return yv.reshape(case.shape).copy()


CASES = gc.all_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_emulated_kernels_match_cpu(emulated, case):
    x = gc.make_input(case.shape, case.dtype, case.seed, case.specials)
    want = gc.cpu_reference(case, x)
    got = run_emulated(emulated, case, x)
    assert got.shape == want.shape
    diff = np.flatnonzero(gc.bits(got) != gc.bits(want))
    assert diff.size == 0, (
        f"{diff.size} of {x.size} elements differ; first at {diff[:5]}: "
        f"got {gc.bits(got).reshape(-1)[diff[:5]]}, want {gc.bits(want).reshape(-1)[diff[:5]]}, "
        f"x {gc.bits(x).reshape(-1)[diff[:5]]}")


def test_emulated_execution_provider(emulated):
    assert emulated.mxops_gpu_execution_provider() == b"CUDAExecutionProvider"


@pytest.mark.parametrize("attrs,message", [
    ("bfp_method=nope", "bfp_method"),
    ("block_size=0", "block_size"),
    ("rounding_mode=3", "rounding_mode"),
    ("bfp_method=to_bfp_prime;sub_block_size=3", "sub_block_size"),
    ("axis=5", "axis"),
    ("colour=2", "unknown attribute"),
    ("block_size", "key=value"),
    # onnxruntime's NCHWc layout is its CPU provider's: the GPU kernels refuse it
    ("nchwc_block=8", "nchwc_block' = 8 is for the CPU kernels only"),
])
def test_emulated_bad_attributes_are_errors(emulated, attrs, message):
    x = np.zeros((4, 16), np.float32)
    y = np.zeros_like(x)
    with pytest.raises(ValueError, match=message):
        gc.call_qdq(emulated, "BFP", attrs, "float32", x.shape, x.ctypes.data, y.ctypes.data)


def test_emulated_bad_dtype_and_op(emulated):
    x = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="dtype"):
        gc.call_qdq(emulated, "BFP", "", "float64", x.shape, x.ctypes.data, x.ctypes.data)
    with pytest.raises(ValueError, match="op must be"):
        gc.call_qdq(emulated, "FOO", "", "float32", x.shape, x.ctypes.data, x.ctypes.data)


@pytest.mark.parametrize("shape,axis,per_channel", [
    ((5, 7), 1, False), ((5, 7), 1, True), ((4, 3, 6), 1, True), ((4, 3, 6), -1, True),
    ((9,), 0, True), ((2, 0, 3), 1, False)])
def test_emulated_bf16_quantize_dequantize(emulated, shape, axis, per_channel):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 100).astype(np.float32)
    if x.size > 4:
        x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 3.4e38]
    channels = shape[axis % len(shape)] if per_channel else 1
    scale = (rng.random(channels) * 2 + 0.25).astype(np.float32)
    zp = (np.float32(rng.standard_normal(channels)).view(np.uint32) >> 16).astype(np.uint16)
    q = np.full(shape, gc.POISON["bfloat16"], np.uint16)
    gc.call_bf16_qdq(emulated, 0, shape, axis, per_channel, x.ctypes.data, scale.ctypes.data,
                     zp.ctypes.data, q.ctypes.data)
    assert np.array_equal(q, gc.bf16_reference(0, x, scale, zp, axis))
    d = np.full(shape, gc.POISON["float32"], np.uint32).view(np.float32)
    gc.call_bf16_qdq(emulated, 1, shape, axis, per_channel, q.ctypes.data, scale.ctypes.data,
                     zp.ctypes.data, d.ctypes.data)
    assert np.array_equal(gc.bits(d), gc.bits(gc.bf16_reference(1, q, scale, zp, axis)))
    # BF16QuantizeDequantize: the pair's bits in one kernel
    f = np.full(shape, gc.POISON["float32"], np.uint32).view(np.float32)
    gc.call_bf16_qdq(emulated, 2, shape, axis, per_channel, x.ctypes.data, scale.ctypes.data,
                     zp.ctypes.data, f.ctypes.data)
    assert np.array_equal(gc.bits(f), gc.bits(d))
