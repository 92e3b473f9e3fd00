"""The GPU kernels on a real device, bit for bit against the CPU kernels.

Through the GPU test library's C entry points (csrc/cuda/test_entry.cu, linked by setup.py
into build/gpu-tests/) on device buffers from PyTorch or CuPy, so no onnxruntime-gpu is
needed; and through ONNX Runtime's CUDA execution provider where onnxruntime-gpu is installed.
The tests skip, saying why, on a machine without a GPU or without PyTorch/CuPy. Where a GPU
and its compiler (nvcc / hipcc) are present, a missing GPU or test library fails them: a
CPU-only install must not pass as tested.

On a GPU machine: pip install . && pip install torch (or cupy) && pytest tests/test_gpu_kernels.py
"""
from __future__ import annotations

import ctypes
import os
import shutil
import zlib

import numpy as np
import pytest

import gpu_cases as gc
import ort_mx_ops
from ort_mx_ops import reference


# ------------------------------------------------------------------------------------------
# Device buffers through PyTorch or CuPy
# ------------------------------------------------------------------------------------------

class TorchDevice:
    name = "torch"

    def __init__(self):
        import torch
        self.torch = torch
        self.backend = "ROCM" if getattr(torch.version, "hip", None) else "CUDA"

    def upload(self, a: np.ndarray):
        a = np.ascontiguousarray(a)
        signed = {np.dtype(np.uint16): np.int16, np.dtype(np.uint32): np.int32}
        view = a.view(signed[a.dtype]) if a.dtype in signed else a
        return self.torch.from_numpy(view.copy()).cuda()

    def empty(self, n: int, dtype: np.dtype, fill: int):
        """n elements of dtype's size holding the bit pattern `fill`, made on the device."""
        bits = 8 * dtype.itemsize
        signed = fill - (1 << bits) if fill >= 1 << (bits - 1) else fill
        return self.torch.full((n,), signed, device="cuda",
                               dtype={4: self.torch.int32, 2: self.torch.int16}[dtype.itemsize])

    def download(self, t, dtype: np.dtype) -> np.ndarray:
        self.torch.cuda.synchronize()
        return t.cpu().numpy().view(dtype)  # same bits, read as `dtype`

    def ptr(self, t) -> int:
        return t.data_ptr()

    def stream(self) -> int:
        return self.torch.cuda.current_stream().cuda_stream

    def free_bytes(self) -> int:
        return self.torch.cuda.mem_get_info()[0]

    def tile(self, period: np.ndarray, reps: int):
        """`period` repeated `reps` times along a new leading axis, on the device, flat."""
        return self.upload(period).reshape(1, -1).repeat(reps, 1).reshape(-1)

    def count_tile_mismatches(self, y, want_bits: np.ndarray, reps: int) -> int:
        """Elements of y (as bits) that differ from `want_bits` tiled `reps` times."""
        want = self.upload(want_bits).reshape(1, -1)
        return int((y.reshape(reps, -1) != want).sum().item())


class CupyDevice:
    name = "cupy"

    def __init__(self):
        import cupy
        self.cp = cupy
        self.backend = "ROCM" if getattr(cupy.cuda.runtime, "is_hip", False) else "CUDA"

    def upload(self, a: np.ndarray):
        return self.cp.asarray(np.ascontiguousarray(a))

    def empty(self, n: int, dtype: np.dtype, fill: int):
        return self.cp.full(n, fill, dtype={4: np.uint32, 2: np.uint16}[dtype.itemsize])

    def download(self, a, dtype: np.dtype) -> np.ndarray:
        self.cp.cuda.runtime.deviceSynchronize()
        return self.cp.asnumpy(a).view(dtype)

    def ptr(self, a) -> int:
        return a.data.ptr

    def stream(self) -> int:
        return self.cp.cuda.get_current_stream().ptr

    def free_bytes(self) -> int:
        return self.cp.cuda.runtime.memGetInfo()[0]

    def tile(self, period: np.ndarray, reps: int):
        return self.cp.tile(self.upload(period).reshape(-1), reps)

    def count_tile_mismatches(self, y, want_bits: np.ndarray, reps: int) -> int:
        want = self.upload(want_bits).reshape(1, -1)
        return int((y.reshape(reps, -1) != want).sum())


def _find_device():
    reasons = []
    try:
        import torch
        if torch.cuda.is_available():
            return TorchDevice(), ""
        reasons.append("PyTorch sees no GPU")
    except ImportError:
        reasons.append("PyTorch is not installed")
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return CupyDevice(), ""
        reasons.append("CuPy sees no GPU")
    except Exception as e:  # ImportError, or CuPy's error when no driver is present
        reasons.append(f"CuPy unavailable ({type(e).__name__})")
    return None, "; ".join(reasons)


DEVICE, NO_DEVICE_REASON = _find_device()


@pytest.fixture(scope="module")
def device():
    if DEVICE is None:
        pytest.skip(f"needs a GPU through PyTorch or CuPy: {NO_DEVICE_REASON}")
    return DEVICE


def _compiler_present(backend: str) -> bool:
    if backend == "ROCM":
        return shutil.which("hipcc") is not None or os.path.exists("/opt/rocm/bin/hipcc")
    return shutil.which("nvcc") is not None


@pytest.fixture(scope="module")
def gpu_lib(device) -> ctypes.CDLL:
    path = gc.test_library_path(device.backend)
    missing = [p for p in (path,) if not p.exists()]
    if device.backend not in ort_mx_ops.available_devices():
        missing.append(f"the installed {device.backend} library")
    if missing:
        why = f"the {device.backend} library or its test library was not built: {missing}"
        if _compiler_present(device.backend):
            pytest.fail(f"a GPU and its compiler are present but {why}; reinstall without "
                        f"MXOPS_NO_{device.backend}=1 and read the build log")
        pytest.skip(why)
    return gc.bind(ctypes.CDLL(str(path)))


def run_device(device, lib, case: gc.Case, x: np.ndarray) -> np.ndarray:
    dt = x.dtype
    n = x.size
    pad = 64 // dt.itemsize  # room for the misaligned cases
    xs = np.zeros(n + pad, dtype=dt)
    xs[case.offset:case.offset + n] = x.reshape(-1)
    xd = device.upload(xs)
    poison = gc.POISON[case.dtype]
    assert not np.any(gc.bits(x) == poison), "the input holds the poison pattern"
    yd = device.empty(n + pad, dt, poison)
    off = case.offset * dt.itemsize
    gc.call_qdq(lib, case.op, case.attr_string, case.dtype, case.shape, device.ptr(xd) + off,
                device.ptr(yd) + off, device.stream())
    y = device.download(yd, dt)
    x_after = device.download(xd, dt)
    assert np.array_equal(gc.bits(x_after), gc.bits(xs)), "the kernel wrote its input"
    out_bits = gc.bits(y)
    untouched = np.concatenate([out_bits[:case.offset], out_bits[case.offset + n:]])
    assert np.all(untouched == poison), "the kernel wrote outside the output"
    return y[case.offset:case.offset + n].reshape(case.shape).copy()


CASES = gc.all_cases()


def test_execution_provider_name(device, gpu_lib):
    want = "ROCMExecutionProvider" if device.backend == "ROCM" else "CUDAExecutionProvider"
    assert gpu_lib.mxops_gpu_execution_provider().decode() == want


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_gpu_matches_cpu(device, gpu_lib, case):
    x = gc.make_input(case.shape, case.dtype, case.seed, case.specials)
    want = gc.cpu_reference(case, x)
    got = run_device(device, gpu_lib, case, x)
    diff = np.flatnonzero(gc.bits(got) != gc.bits(want))
    assert diff.size == 0, (
        f"{diff.size} of {x.size} elements differ; first at {diff[:5]}: got "
        f"{gc.bits(got).reshape(-1)[diff[:5]]}, want {gc.bits(want).reshape(-1)[diff[:5]]}")


@pytest.mark.parametrize("name", [n for n, c in gc.CONFIGS.items() if c.op != "BF16"])
@pytest.mark.parametrize("shape,axis", [((4096, 1024), 1), ((1024, 4096), 0),
                                        ((8, 3, 1000, 37), 2), ((3, 1 << 20), 1)])
def test_gpu_matches_cpu_large(device, gpu_lib, name, shape, axis):
    """Large tensors: many CTAs, grid-stride loops, every lane group busy."""
    cfg = gc.CONFIGS[name]
    for dtype in gc.DTYPES:
        case = gc.Case(f"{name}-large", cfg.op, dict(cfg.attrs, axis=axis), dtype, shape,
                       seed=zlib.crc32(f"{name}{shape}{dtype}".encode()))
        x = gc.make_input(shape, dtype, case.seed)
        want = gc.cpu_reference(case, x)
        got = run_device(device, gpu_lib, case, x)
        assert np.array_equal(gc.bits(got), gc.bits(want)), f"{name} {dtype} {shape} axis {axis}"


# Over 2^32 elements: a period of rows that divides neither 2^31 nor 2^32, tiled on the
# device, so every element's expected bits are the CPU result for its place in the period and
# an index that wraps at 2^31 or 2^32 reads or writes a row of another phase.
HUGE_ELEMENTS = (1 << 32) + (1 << 20)
HUGE_COLUMNS = 1000


@pytest.mark.parametrize("name,axis,period_rows", [("MXINT8", 1, 999), ("MX9", 1, 999),
                                                   ("BFP16", 0, 992), ("MXFP4E2M1", 0, 992)])
def test_gpu_over_2_32_elements(device, gpu_lib, name, axis, period_rows):
    cfg = gc.CONFIGS[name]
    reps = -(-HUGE_ELEMENTS // (period_rows * HUGE_COLUMNS))
    shape = (period_rows * reps, HUGE_COLUMNS)
    n = shape[0] * shape[1]
    need = 5 * n  # x and y in float16, and a boolean comparison of the same length
    free = device.free_bytes()
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of device memory, {free / 2**30:.1f} free")
    case = gc.Case(f"{name}-huge", cfg.op, dict(cfg.attrs, axis=axis), "float16",
                   (period_rows, HUGE_COLUMNS), seed=zlib.crc32(name.encode()))
    period = gc.make_input(case.shape, "float16", case.seed)
    want = gc.bits(gc.cpu_reference(case, period))
    xd = device.tile(period, reps)
    yd = device.empty(n, np.dtype(np.float16), gc.POISON["float16"])
    gc.call_qdq(gpu_lib, case.op, case.attr_string, "float16", shape, device.ptr(xd),
                device.ptr(yd), device.stream())
    wrong = device.count_tile_mismatches(yd, want, reps)
    assert wrong == 0, f"{wrong} of {n} elements differ from the CPU result of their period"


@pytest.mark.parametrize("shape,axis,per_channel", [
    ((5, 7), 1, False), ((64, 33), 1, True), ((4, 3, 6), -1, True), ((1000,), 0, True)])
def test_gpu_bf16_quantize_dequantize(device, gpu_lib, shape, axis, per_channel):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 100).astype(np.float32)
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 3.4e38]
    channels = shape[axis % len(shape)] if per_channel else 1
    scale = (rng.random(channels) * 2 + 0.25).astype(np.float32)
    zp = (np.float32(rng.standard_normal(channels)).view(np.uint32) >> 16).astype(np.uint16)
    xd, sd, zd = device.upload(x), device.upload(scale), device.upload(zp)
    qd = device.empty(x.size, np.dtype(np.uint16), gc.POISON["bfloat16"])
    gc.call_bf16_qdq(gpu_lib, 0, shape, axis, per_channel, device.ptr(xd), device.ptr(sd),
                     device.ptr(zd), device.ptr(qd), device.stream())
    q = device.download(qd, np.dtype(np.uint16)).reshape(shape)
    assert np.array_equal(q, gc.bf16_reference(0, x, scale, zp, axis))
    dd = device.empty(x.size, np.dtype(np.float32), gc.POISON["float32"])
    gc.call_bf16_qdq(gpu_lib, 1, shape, axis, per_channel, device.ptr(qd), device.ptr(sd),
                     device.ptr(zd), device.ptr(dd), device.stream())
    d = device.download(dd, np.dtype(np.float32)).reshape(shape)
    assert np.array_equal(gc.bits(d), gc.bits(gc.bf16_reference(1, q, scale, zp, axis)))
    fd = device.empty(x.size, np.dtype(np.float32), gc.POISON["float32"])  # the fused node
    gc.call_bf16_qdq(gpu_lib, 2, shape, axis, per_channel, device.ptr(xd), device.ptr(sd),
                     device.ptr(zd), device.ptr(fd), device.stream())
    assert np.array_equal(gc.bits(device.download(fd, np.dtype(np.float32)).reshape(shape)),
                          gc.bits(d))


def test_gpu_bf16_nan_results(device, gpu_lib):
    """NaN results of the BF16 dequantize and the fused node are x86's (the CPU's), not the
    GPU's canonical NaN: payloads carried, Inf - Inf and 0 x Inf giving 0xFFC00000."""
    y, x, scale, zp = gc.bf16_nan_cases()
    shape = y.shape
    yd, xd, sd, zd = device.upload(y), device.upload(x), device.upload(scale), device.upload(zp)
    for direction, src, want in ((1, yd, gc.bf16_reference(1, y, scale, zp, 1)),
                                 (2, xd, reference.bf16_quantize_dequantize(x, scale, zp, 1))):
        out = device.empty(y.size, np.dtype(np.float32), gc.POISON["float32"])
        gc.call_bf16_qdq(gpu_lib, direction, shape, 1, True, device.ptr(src), device.ptr(sd),
                         device.ptr(zd), device.ptr(out), device.stream())
        got = device.download(out, np.dtype(np.float32)).reshape(shape)
        assert np.array_equal(gc.bits(got), gc.bits(want)), (direction, gc.bits(got), gc.bits(want))


# ------------------------------------------------------------------------------------------
# Through ONNX Runtime's CUDA execution provider (onnxruntime-gpu)
# ------------------------------------------------------------------------------------------

def _ort_gpu_provider() -> tuple[str | None, str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime is not installed"
    available = ort.get_available_providers()
    for provider, device in (("CUDAExecutionProvider", "CUDA"), ("ROCMExecutionProvider", "ROCM")):
        if provider in available:
            if device not in ort_mx_ops.available_devices():
                return None, f"{provider} is available but the {device} library was not built"
            return provider, ""
    return None, ("this onnxruntime has no CUDAExecutionProvider/ROCMExecutionProvider "
                  "(install onnxruntime-gpu)")


ORT_PROVIDER, NO_ORT_REASON = _ort_gpu_provider()
ORT_CASES = list(gc.config_cases(shapes=[((6, 64), 1), ((5, 37), -1), ((2, 19, 33), 1),
                                         ((333,), 0)]))
OPS = {"BFP": ("BFPQuantizeDequantize", "com.amd.quark"),
       "MX": ("MXQuantizeDequantize", "com.amd.quark")}


def _ort_session(model, provider: str):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # every node on the GPU
    ort_mx_ops.register(so, "ROCM" if provider.startswith("ROCM") else "CUDA")
    return ort.InferenceSession(model.SerializeToString(), so, providers=[provider])


@pytest.mark.skipif(ORT_PROVIDER is None, reason=NO_ORT_REASON or "no GPU provider")
@pytest.mark.parametrize("case", ORT_CASES, ids=[c.name for c in ORT_CASES])
def test_ort_gpu_provider_matches_cpu(case):
    from conftest import one_node_model, run_session
    op, domain = OPS[case.op]
    x = gc.make_input(case.shape, case.dtype, case.seed, case.specials)
    want = gc.cpu_reference(case, x)
    sess = _ort_session(one_node_model(op, domain, dict(case.attrs), case.dtype,
                                       rank=len(case.shape)), ORT_PROVIDER)
    got = run_session(sess, x, case.dtype)
    assert np.array_equal(gc.bits(got), gc.bits(want))


@pytest.mark.skipif(ORT_PROVIDER is None, reason=NO_ORT_REASON or "no GPU provider")
@pytest.mark.parametrize("per_channel", [False, True])
def test_ort_gpu_provider_bf16_pair(per_channel):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 8, 5)) * 10).astype(np.float32)
    c = 8 if per_channel else 1
    scale = (rng.random(c) + 0.5).astype(np.float32)
    zp = np.zeros(c, np.uint16)
    shape = [c] if per_channel else []
    inits = [numpy_helper.from_array(scale.reshape(shape), "s"),
             helper.make_tensor("z", TensorProto.BFLOAT16, shape, zp.tolist(), raw=False)]
    nodes = [helper.make_node("ExtendedQuantizeLinear", ["x", "s", "z"], ["q"],
                              domain="com.amd.quark", axis=1),
             helper.make_node("ExtendedDequantizeLinear", ["q", "s", "z"], ["y"],
                              domain="com.amd.quark", axis=1)]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
                              initializer=inits)
    model = helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.amd.quark", 1)])
    got = _ort_session(model, ORT_PROVIDER).run(None, {"x": x})[0]
    q = gc.bf16_reference(0, x, scale, zp, 1)
    want = gc.bf16_reference(1, q, scale, zp, 1)
    assert np.array_equal(gc.bits(got), gc.bits(want))
