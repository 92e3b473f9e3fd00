"""GPU kernel benchmark: every built-in configuration against a device-to-device copy
of the same bytes, in the same run, on the same buffers.

    python -m ort_mx_ops.benchmarks.gpu_bench      # 256 Mi elements, all configs and dtypes
    python -m ort_mx_ops.benchmarks.gpu_bench --elements 16M --dtypes float32 --json out.json

Drives the C entry point (mxops_gpu_qdq, csrc/cuda/test_entry.cu) of the GPU test library
(build/gpu-tests/ of the source checkout, or $MXOPS_GPU_TEST_LIB_DIR) through ctypes
on PyTorch or CuPy buffers, so onnxruntime-gpu is not needed. Times are CUDA/HIP event times,
the median of --iters runs after warm-up. Bandwidth counts the bytes each kernel must move
(read x, write y); the copy's bandwidth is cudaMemcpyAsync device-to-device of x's bytes.
Target: >= 85 % of the copy's bandwidth at 256 Mi elements (--check exits 1 below it).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
from pathlib import Path


import ort_mx_ops
from ort_mx_ops.formats import CONFIGS

TARGET = 0.85
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def parse_count(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("I")
    return int(float(t[:-1]) * mult[t[-1]]) if t[-1] in mult else int(t)


class Device:
    """Buffers, events, the stream and device-to-device copies through PyTorch or CuPy."""

    def __init__(self):
        try:
            import torch
            if torch.cuda.is_available():
                self.torch, self.cp = torch, None
                self.backend = "ROCM" if getattr(torch.version, "hip", None) else "CUDA"
                self.name = torch.cuda.get_device_name()
                return
        except ImportError:
            pass
        try:
            import cupy
            if cupy.cuda.runtime.getDeviceCount() > 0:
                self.torch, self.cp = None, cupy
                self.backend = "ROCM" if getattr(cupy.cuda.runtime, "is_hip", False) else "CUDA"
                self.name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
                return
        except Exception:
            pass
        sys.exit("gpu_bench: needs a GPU visible to PyTorch or CuPy (pip install torch or cupy)")

    def random(self, n: int, dtype: str, seed: int = 0):
        """n finite values over a wide exponent range, in the storage of `dtype`: normal values
        times 2^k, k in [-20, 20) (float16: [-10, 10), where 2^20 would be Inf)."""
        top = 10 if dtype == "float16" else 20
        if self.torch is not None:
            t = self.torch
            g = t.Generator(device="cuda").manual_seed(seed)
            x = t.randn(n, device="cuda", generator=g)
            x *= t.exp2(t.randint(-top, top, (n,), device="cuda", generator=g).float())
            return x.to({"float32": t.float32, "float16": t.float16, "bfloat16": t.bfloat16}[dtype])
        cp = self.cp
        rs = cp.random.RandomState(seed)
        x = rs.standard_normal(n, dtype=cp.float32)
        x *= cp.exp2(rs.randint(-top, top, n).astype(cp.float32))
        if dtype == "float32":
            return x
        if dtype == "float16":
            return x.astype(cp.float16)
        return (x.view(cp.uint32) >> 16).astype(cp.uint16)

    def empty_like(self, x):
        return self.torch.empty_like(x) if self.torch is not None else self.cp.empty_like(x)

    def ptr(self, x) -> int:
        return x.data_ptr() if self.torch is not None else x.data.ptr

    def stream(self) -> int:
        if self.torch is not None:
            return self.torch.cuda.current_stream().cuda_stream
        return self.cp.cuda.get_current_stream().ptr

    def copy(self, dst, src, nbytes: int) -> None:
        if self.torch is not None:
            dst.copy_(src)  # same dtype, contiguous: cudaMemcpyAsync device to device
        else:
            self.cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes,
                                             self.cp.cuda.runtime.memcpyDeviceToDevice,
                                             self.stream())

    def time_ms(self, fn, warmup: int, iters: int) -> float:
        """Median event time of fn() over iters runs on the current stream."""
        if self.torch is not None:
            Event = lambda: self.torch.cuda.Event(enable_timing=True)  # noqa: E731
            sync = self.torch.cuda.synchronize
            elapsed = lambda a, b: a.elapsed_time(b)  # noqa: E731
        else:
            Event = self.cp.cuda.Event
            sync = self.cp.cuda.runtime.deviceSynchronize
            elapsed = self.cp.cuda.get_elapsed_time
        for _ in range(warmup):
            fn()
        sync()
        times = []
        for _ in range(iters):
            a, b = Event(), Event()
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(elapsed(a, b))
        return statistics.median(times)


def default_library(backend: str) -> str:
    """The GPU test library of ``backend`` where the build left one, else the installed GPU
    library (builds that still link the entry points into it)."""
    folder = Path(os.environ.get("MXOPS_GPU_TEST_LIB_DIR",
                                 Path(__file__).resolve().parents[1] / "build" / "gpu-tests"))
    test_lib = folder / f"libort_mx_ops_{backend.lower()}_tests.so"
    return str(test_lib) if test_lib.exists() else ort_mx_ops.get_library_path(backend)


def load_library(device: Device, path: str | None) -> ctypes.CDLL:
    lib = ctypes.CDLL(path or default_library(device.backend))
    lib.mxops_gpu_qdq.restype = ctypes.c_int
    lib.mxops_gpu_qdq.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                  ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p,
                                  ctypes.c_size_t]
    lib.mxops_gpu_bf16_qdq.restype = ctypes.c_int
    lib.mxops_gpu_bf16_qdq.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    return lib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--elements", default="256Mi", help="elements per tensor (256Mi)")
    ap.add_argument("--row", type=int, default=4096, help="length of the last axis (4096)")
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="built-in configuration names (docs/formats.md)")
    ap.add_argument("--axes", default="inner,outer",
                    help="inner: blocks along the last axis; outer: along the first")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--library", help="path of the GPU test library (default: see the module docs)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when a run is below 85 %% of the copy bandwidth")
    args = ap.parse_args()

    dev = Device()
    lib = load_library(dev, args.library)
    n = parse_count(args.elements)
    row = args.row
    n -= n % row
    shape = (n // row, row)
    err = ctypes.create_string_buffer(1024)
    shape_arr = (ctypes.c_int64 * 2)(*shape)
    results = []
    print(f"device: {dev.name} ({dev.backend}), {n} elements as {shape}, "
          f"median of {args.iters} runs")
    print(f"{'config':<11} {'dtype':<9} {'axis':<6} {'ms':>8} {'GB/s':>8} {'copy GB/s':>10} "
          f"{'of copy':>8}")
    for dtype in args.dtypes.split(","):
        x = dev.random(n, dtype)
        y = dev.empty_like(x)
        nbytes = n * ITEMSIZE[dtype]
        copy_ms = dev.time_ms(lambda: dev.copy(y, x, nbytes), args.warmup, args.iters)
        copy_gbs = 2 * nbytes / copy_ms / 1e6
        for name in args.configs.split(","):
            cfg = CONFIGS[name]
            for axis_name in args.axes.split(","):
                axis = 1 if axis_name == "inner" else 0
                if cfg.op == "BF16":
                    if dtype != "float32" or axis_name != "inner":
                        continue
                    rows = bf16_rows(dev, lib, x, n, shape_arr, err, args)
                    for label, ms, moved in rows:
                        gbs = moved / ms / 1e6
                        results.append(dict(config=label, dtype=dtype, axis="-", ms=ms, gbs=gbs,
                                            copy_gbs=copy_gbs, ratio=gbs / copy_gbs))
                        print(f"{label:<11} {dtype:<9} {'-':<6} {ms:8.3f} {gbs:8.1f} "
                              f"{copy_gbs:10.1f} {gbs / copy_gbs:8.1%}")
                    continue
                attrs = ";".join(f"{k}={v}" for k, v in dict(cfg.attrs, axis=axis).items())

                def run(attrs=attrs, op=cfg.op):
                    rc = lib.mxops_gpu_qdq(op.encode(), attrs.encode(), dtype.encode(), shape_arr,
                                           2, dev.ptr(x), dev.ptr(y), dev.stream(), err, len(err))
                    if rc != 0:
                        raise RuntimeError(err.value.decode())

                ms = dev.time_ms(run, args.warmup, args.iters)
                gbs = 2 * nbytes / ms / 1e6
                results.append(dict(config=name, dtype=dtype, axis=axis_name, ms=ms, gbs=gbs,
                                    copy_gbs=copy_gbs, ratio=gbs / copy_gbs))
                flag = "" if gbs / copy_gbs >= TARGET else "  < target"
                print(f"{name:<11} {dtype:<9} {axis_name:<6} {ms:8.3f} {gbs:8.1f} "
                      f"{copy_gbs:10.1f} {gbs / copy_gbs:8.1%}{flag}")
        del x, y
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=dev.name, backend=dev.backend,
                                                   elements=n, shape=shape, results=results),
                                              indent=1))
    below = [r for r in results if r["ratio"] < TARGET]
    print(f"{len(results) - len(below)} of {len(results)} runs at >= {TARGET:.0%} "
          "of the copy bandwidth")
    return 1 if args.check and below else 0


def bf16_rows(dev: Device, lib: ctypes.CDLL, x, n: int, shape_arr, err, args):
    """BF16 quantize (float32 -> bfloat16 bits) and dequantize, per-tensor scale."""
    scale = dev.random(1, "float32", seed=1)
    zp = dev.random(1, "bfloat16", seed=2)
    q = dev.random(n, "bfloat16", seed=3)
    back = dev.empty_like(x)

    def quant():
        rc = lib.mxops_gpu_bf16_qdq(0, shape_arr, 2, 1, 0, dev.ptr(x), dev.ptr(scale), dev.ptr(zp),
                                    dev.ptr(q), dev.stream(), err, len(err))
        if rc != 0:
            raise RuntimeError(err.value.decode())

    def dequant():
        rc = lib.mxops_gpu_bf16_qdq(1, shape_arr, 2, 1, 0, dev.ptr(q), dev.ptr(scale), dev.ptr(zp),
                                    dev.ptr(back), dev.stream(), err, len(err))
        if rc != 0:
            raise RuntimeError(err.value.decode())

    return [("BF16-Q", dev.time_ms(quant, args.warmup, args.iters), 6 * n),
            ("BF16-DQ", dev.time_ms(dequant, args.warmup, args.iters), 6 * n)]


if __name__ == "__main__":
    sys.exit(main())
