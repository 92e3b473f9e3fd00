"""Measurement: onnxruntime sessions per execution provider, I/O binding to buffers that live
on the provider's device, warm-up, and interleaved repeated runs.

For one (execution provider, dtype, size, layout) point every variant (the references, each
configuration through the product's op, the standard-ONNX graph, another library) gets its own
session on the same input tensor; the variants then run in turns, round after round, so a
burst of load from elsewhere on the machine hits all of them alike, and the ratios
(variant / Neg, variant / copy) compare medians taken in the same rounds.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnxruntime as ort

import ort_mx_ops
from ort_mx_ops.benchmarks import graphs
from ort_mx_ops.formats import CONFIGS

__all__ = ["Options", "EP_DEVICE", "available_eps", "run_sweep", "machine_info", "write_results",
           "load_average_phrase", "ITEMSIZE", "process_memory_pages", "memory_pages_phrase",
           "DEFAULT_SIZES", "TINY_SIZES"]

EP_DEVICE = {"CPUExecutionProvider": ("CPU", "cpu"), "CUDAExecutionProvider": ("CUDA", "cuda"),
             "ROCMExecutionProvider": ("ROCM", "cuda")}  # (library device, OrtValue device)
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
DEFAULT_SIZES = [1 << k for k in range(12, 27, 2)]  # 4 Ki .. 64 Mi elements
TINY_SIZES = [1 << 12, 1 << 14]
# Blocked axis of a [rows, cols] tensor; nchwc: a [1, rows, cols] tensor (rows channels of
# cols pixels) stored in onnxruntime's NCHWc memory order, blocked along the channels (the op
# with nchwc_block = this CPU's NCHWc block; CPU only, BFP / MX configurations only).
LAYOUTS = {"innermost": 1, "outer": 0, "nchwc": 1}


@dataclass
class Options:
    eps: list[str]
    configs: list[str]
    dtypes: list[str]
    layouts: list[str]
    sizes: list[int]
    threads: int = 0            # ORT intra-op threads; 0: ORT's default
    thread_pool: str = "shared"  # "shared": one intra-op pool for every session; "session"
    warmup: int = 2
    min_repeats: int = 5
    max_repeats: int = 30
    min_time: float = 0.3       # seconds of timed runs per variant, at least
    standard: bool = True       # the standard-ONNX graphs
    standard_max_size: int = 1 << 26
    other_library: str | None = None
    log: Callable[[str], None] = print
    extra: dict = field(default_factory=dict)


def available_eps() -> list[str]:
    """The execution providers of the installed onnxruntime that the harness can drive."""
    have = ort.get_available_providers()
    return [ep for ep in EP_DEVICE if ep in have]


def shape_for(n: int) -> tuple[int, int]:
    """A [rows, cols] shape of n = 2^k elements, as square as powers of two allow."""
    k = int(n).bit_length() - 1
    if 1 << k != n:
        raise ValueError(f"sizes must be powers of two, got {n}")
    return (1 << (k // 2), 1 << (k - k // 2))


# ---------------------------------------------------------------------------------------------
# Machine / versions
# ---------------------------------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return sorted(f for f in flags if f.startswith(("avx2", "avx512f", "avx512bw",
                                                                "avx512vl", "avx512dq", "f16c")))
    except OSError:
        pass
    return []


def _gpu_names() -> list[str]:
    for cmd in (["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                ["rocm-smi", "--showproductname"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                return [line.strip() for line in out.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired):
            continue
    return []


def process_memory_pages() -> dict[str, Any] | None:
    """This process's resident memory and the part of it on transparent huge pages (2 MiB on
    x86-64), in KiB, from /proc/self/smaps_rollup; None where the system has no such file.

    onnxruntime takes its buffers from the C library's allocator, so they lie on huge pages
    only where that allocator asks for them (glibc 2.35 and later: GLIBC_TUNABLES=
    glibc.malloc.hugetlb=1 with transparent huge pages in `madvise` or `always` mode)."""
    try:
        text = Path("/proc/self/smaps_rollup").read_text()
    except OSError:
        return None
    fields = dict(re.findall(r"^(\w+):\s+(\d+) kB", text, flags=re.MULTILINE))
    return {"rss_kib": int(fields.get("Rss", 0)),
            "anon_huge_pages_kib": int(fields.get("AnonHugePages", 0)),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES")}


def memory_pages_phrase(pages: dict[str, Any] | None) -> str | None:
    """process_memory_pages' numbers as a report line, or None where there are none."""
    if not pages:
        return None
    tunables = pages["glibc_tunables"]
    return (f"this process's memory after the runs: {pages['rss_kib'] / 1024:.0f} MiB resident, "
            f"{pages['anon_huge_pages_kib'] / 1024:.0f} MiB of it on huge pages (GLIBC_TUNABLES "
            f"{tunables if tunables else 'unset'}; benchmarks/README.md)")


def load_average_phrase(machine: dict[str, Any]) -> str:
    """"; load average L before" from machine_info's one-minute load, or "" where it has none."""
    load = machine.get("load_average")
    return f"; load average {load[0]:.1f} before" if load else ""


def write_results(out: str | Path, stem: str, doc: dict, text: str, quiet: bool = False) -> None:
    """Write ``doc`` as ``<out>/<stem>.json`` and ``text`` (its Markdown) as ``<stem>.md``,
    creating ``out``; unless ``quiet``, print the Markdown and the two paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / f"{stem}.json", out / f"{stem}.md"
    paths[0].write_text(json.dumps(doc, indent=1) + "\n")
    paths[1].write_text(text)
    if not quiet:
        print(text, end="")
        print(f"wrote {paths[0]}, {paths[1]}")


def machine_info() -> dict[str, Any]:
    import onnx
    info = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_simd_flags": _cpu_flags(),
        "mxops_cpu_isa_env": os.environ.get("MXOPS_CPU_ISA"),
        "cpu_isa": __import__("ort_mx_ops.native").native.cpu_isa(),  # the CPU path that runs
        "gpus": _gpu_names(),
        "python": sys.version.split()[0],
        "versions": {"onnxruntime": ort.__version__, "onnx": onnx.__version__,
                     "numpy": np.__version__, "ort_mx_ops": ort_mx_ops.__version__},
        "onnxruntime_providers": ort.get_available_providers(),
        "ort_mx_ops_devices": ort_mx_ops.available_devices(),
    }
    try:
        info["load_average"] = os.getloadavg()
    except OSError:
        pass
    return info


# ---------------------------------------------------------------------------------------------
# Sessions and buffers
# ---------------------------------------------------------------------------------------------

def _make_input(shape, dtype: str, seed: int = 0) -> np.ndarray:
    """Standard normal values (finite and normal), as float32 / float16 / bfloat16 bits."""
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":
        u = x.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return x


class Point:
    """Buffers of one (EP, dtype, shape): an input and one output that every variant writes."""

    def __init__(self, ep: str, dtype: str, shape, seed: int = 0):
        self.ep, self.dtype, self.shape = ep, dtype, tuple(shape)
        self.device = EP_DEVICE[ep][1]
        self.host = _make_input(shape, dtype, seed)
        onnx_type = graphs.ONNX_TYPES[dtype]
        # The input in a buffer of onnxruntime's allocator (64-byte aligned on the CPU), as a
        # node's input is inside a model; numpy's own buffers start 16 bytes past a cache line.
        self.x = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), onnx_type, self.device, 0)
        self.x.update_inplace(self.host)
        self.y = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), onnx_type, self.device, 0)

    def output(self) -> np.ndarray:
        """The output, on the host (float32/float16 as such, bfloat16 as uint16 bits)."""
        if self.dtype == "bfloat16":
            raw = np.empty(self.shape, np.uint16)
            if self.device == "cpu":
                import ctypes
                ctypes.memmove(raw.ctypes.data, self.y.data_ptr(), raw.nbytes)
                return raw
            return raw  # not read back from a device
        return self.y.numpy()

    def poison(self) -> None:
        """Fills the output with NaN so a variant that does not write it is caught."""
        if self.device == "cpu":
            import ctypes
            nbytes = int(np.prod(self.shape)) * ITEMSIZE[self.dtype]
            ctypes.memset(self.y.data_ptr(), 0xFF, nbytes)


class Variant:
    """One session bound to a point's buffers."""

    def __init__(self, kind: str, config: str | None, model: bytes, point: Point, opts: Options,
                 library: str | None):
        self.kind, self.config, self.point = kind, config, point
        so = session_options(opts.threads, opts.thread_pool)
        so.log_severity_level = 3
        if library:
            so.register_custom_ops_library(library)
        providers = [point.ep] if point.ep == "CPUExecutionProvider" else [point.ep,
                                                                          "CPUExecutionProvider"]
        self.session = ort.InferenceSession(model, so, providers=providers)
        self.binding = self.session.io_binding()
        self.binding.bind_ortvalue_input("X", point.x)
        self.binding.bind_ortvalue_output("Y", point.y)
        self.times: list[float] = []

    def run(self) -> float:
        t0 = time.perf_counter()
        self.session.run_with_iobinding(self.binding)
        return time.perf_counter() - t0


class NumpyCopy:
    """np.copyto on the host: a plain single-threaded copy (CPU only)."""

    def __init__(self, point: Point):
        self.kind, self.config, self.point = "ref:numpy_copy", None, point
        self.src = point.host
        self.dst = np.empty_like(point.host)
        self.times: list[float] = []

    def run(self) -> float:
        t0 = time.perf_counter()
        np.copyto(self.dst, self.src)
        return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------------------------

THREAD_POOLS = ("shared", "session")
_shared_pool_threads: int | None = None


def use_shared_pool(threads: int) -> None:
    """Gives this process onnxruntime's global intra-op thread pool of ``threads`` threads
    (0: onnxruntime's default), which sessions made with :func:`session_options` share.

    Why: every variant of a point has its own session, and with a pool per session each
    session's idle workers keep spinning for a while after its run, on the cores where the
    next variant's threads run. On the 2-core development machine that made two intra-op
    threads slower than one for every variant, ``Neg`` included (16 Mi elements: 12.0 ms
    with per-session pools, 3.4 ms shared, 4.3 ms on one thread). One shared pool is also how
    a process serving several models runs. onnxruntime sizes the global pool once per
    process, so asking for another size later is an error."""
    global _shared_pool_threads
    if _shared_pool_threads is None:
        ort.set_global_thread_pool_sizes(threads, 1)
        _shared_pool_threads = threads
    elif _shared_pool_threads != threads:
        raise ValueError(f"this process's shared onnxruntime thread pool has "
                         f"{_shared_pool_threads or 'the default number of'} thread(s); "
                         f"{threads or 'the default'} need another process (or thread_pool="
                         f"'session')")


def uses_shared_pool(threads: int, thread_pool: str) -> bool:
    """Whether sessions with these settings run on the process's shared pool: "shared" with
    more than one thread (one thread needs no pool, so it stays a session's own)."""
    if thread_pool not in THREAD_POOLS:
        raise ValueError(f"thread_pool {thread_pool!r}: one of {', '.join(THREAD_POOLS)}")
    return thread_pool == "shared" and threads != 1


def session_options(threads: int, thread_pool: str) -> ort.SessionOptions:
    """Session options with ``threads`` intra-op threads (0: onnxruntime's default): the
    process's shared pool (:func:`uses_shared_pool`) or a pool of the session's own."""
    so = ort.SessionOptions()
    if uses_shared_pool(threads, thread_pool):
        use_shared_pool(threads)
        so.use_per_session_threads = False
    else:
        so.intra_op_num_threads = threads
    return so


# ---------------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------------

def _library_for(ep: str) -> tuple[str | None, str | None]:
    device = EP_DEVICE[ep][0]
    try:
        return ort_mx_ops.get_library_path(device), None
    except FileNotFoundError as exc:
        return None, str(exc)


@functools.cache
def nchwc_block() -> int:
    """onnxruntime's NCHWc channel block on this CPU (0: it does not use the layout); probed
    once."""
    from ort_mx_ops.quantizer.nchwc import nchwc_block_size
    return nchwc_block_size()


def point_shape(n: int, layout: str) -> tuple[int, ...]:
    """The tensor shape of a point of n elements in ``layout``."""
    shape = shape_for(n)
    return (1, *shape) if layout == "nchwc" else shape


def _build_variants(point: Point, layout: str, opts: Options, errors: list) -> list:
    axis = LAYOUTS[layout]
    variants: list = []
    lanes = 0
    if layout == "nchwc":
        lanes = nchwc_block() if point.device == "cpu" else 0
        if point.device != "cpu":
            reason = "onnxruntime's NCHWc layout is a CPU one"
        elif not lanes:
            reason = "onnxruntime does not use the NCHWc layout on this CPU"
        elif point.shape[1] % lanes:
            reason = f"{point.shape[1]} channels, not a multiple of the NCHWc block {lanes}"
        else:
            reason = ""
        if reason:
            errors.append({"ep": point.ep, "dtype": point.dtype, "layout": layout,
                           "elements": int(np.prod(point.shape)), "kind": "custom", "config": None,
                           "error": reason})
            return variants

    def add(kind: str, config: str | None, build: Callable[[], bytes], library: str | None) -> None:
        try:
            variants.append(Variant(kind, config, build(), point, opts, library))
        except Exception as exc:  # a variant that cannot run here is reported, not fatal
            errors.append({"ep": point.ep, "dtype": point.dtype, "layout": layout,
                           "elements": int(np.prod(point.shape)), "kind": kind, "config": config,
                           "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})

    add("ref:neg", None, lambda: graphs.reference_model("neg", point.shape, point.dtype), None)
    add("ref:copy", None, lambda: graphs.reference_model("copy", point.shape, point.dtype), None)
    if point.device == "cpu":
        variants.append(NumpyCopy(point))
    library, why = _library_for(point.ep)
    n = int(np.prod(point.shape))
    for config in opts.configs:
        if library:
            add("custom", config, lambda c=config: graphs.custom_qdq_model(
                c, point.shape, axis, point.dtype, nchwc_block=lanes), library)
        elif why:
            errors.append({"ep": point.ep, "kind": "custom", "config": config, "error": why})
        if lanes:  # the standard-ONNX graph and other libraries read the plain layout
            continue
        if opts.standard and n <= opts.standard_max_size and config != graphs.BF16_FUSED and not (
                CONFIGS[config].op == "BF16" and point.dtype == "bfloat16"):
            add("standard", config,
                lambda c=config: graphs.standard_qdq_model(c, point.shape, axis, point.dtype), None)
        if opts.other_library and config != graphs.BF16_FUSED:  # (an op of ours alone)
            add("other", config,
                lambda c=config: graphs.custom_qdq_model(c, point.shape, axis, point.dtype),
                opts.other_library)
    return variants


def _check_outputs(variants: list, point: Point) -> dict[tuple, dict]:
    """Runs every variant once on a poisoned output and checks what it wrote: the copy must
    equal the input; the standard-ONNX graph must equal the custom op in value."""
    checks: dict[tuple, dict] = {}
    if point.device != "cpu":
        return checks
    custom_out: dict[str, np.ndarray] = {}
    for v in variants:
        if isinstance(v, NumpyCopy):
            continue
        point.poison()
        v.run()
        out = point.output().copy()
        if v.kind == "ref:copy":
            checks[(v.kind, None)] = {"output_equals_input": bool(
                np.array_equal(out.view(np.uint8), point.host.view(np.uint8)))}
        elif v.kind == "custom":
            custom_out[v.config] = out
            checks[(v.kind, v.config)] = {"output_written": bool(not np.isnan(
                out.astype(np.float32) if point.dtype != "bfloat16" else
                (out.astype(np.uint32) << 16).view(np.float32)).any())}
    for v in variants:
        if v.kind in ("standard", "other") and v.config in custom_out:
            point.poison()
            v.run()
            out = point.output()
            ref = custom_out[v.config]
            if point.dtype == "bfloat16":
                a = (out.astype(np.uint32) << 16).view(np.float32)
                b = (ref.astype(np.uint32) << 16).view(np.float32)
            else:
                a, b = out.astype(np.float32), ref.astype(np.float32)
            mismatches = int(np.count_nonzero(~((a == b) | (np.isnan(a) & np.isnan(b)))))
            checks[(v.kind, v.config)] = {"mismatches_vs_custom": mismatches,
                                          "bits_differ_vs_custom": int(np.count_nonzero(
                                              out.view(np.uint8) != ref.view(np.uint8)))}
    return checks


def _measure(variants: list, opts: Options) -> None:
    """Appends timed runs to each variant's ``times``, interleaved: every round runs each
    pending variant once, in a new random order. (In a fixed order the variant after its own
    configuration's custom op ran warm: the same library under --other-library read 0.97x Neg
    as "other" and 0.84x as "custom", MXINT8 on 64 Ki elements, 0.55 and 0.46 on 1 Mi; in
    random order 0.90 and 0.89, 0.49 and 0.50.)"""
    for v in variants:
        for _ in range(opts.warmup):
            v.run()
    rng = np.random.default_rng(0)
    pending = list(variants)
    while pending:
        for i in rng.permutation(len(pending)):
            pending[i].times.append(pending[i].run())
        pending = [v for v in pending if len(v.times) < opts.max_repeats and (
            len(v.times) < opts.min_repeats or sum(v.times) < opts.min_time)]


def run_sweep(opts: Options) -> dict[str, Any]:
    """Measures every point of ``opts``; returns the results document (see report.py)."""
    results: list[dict] = []
    errors: list[dict] = []
    for ep in opts.eps:
        for dtype in opts.dtypes:
            for n in opts.sizes:
                for layout in opts.layouts:
                    try:
                        point = Point(ep, dtype, point_shape(n, layout))
                    except Exception as exc:
                        errors.append({"ep": ep, "dtype": dtype, "elements": n, "layout": layout,
                                       "kind": "buffers", "error": f"{type(exc).__name__}: {exc}"})
                        continue
                    variants = _build_variants(point, layout, opts, errors)
                    checks = _check_outputs(variants, point)
                    _measure(variants, opts)
                    rows = _rows(variants, point, layout, checks)
                    results += rows
                    opts.log(_progress(ep, dtype, n, layout, rows))
                    del variants, point
    return {"machine": machine_info(), "options": _options_doc(opts), "results": results,
            "errors": errors, "memory_pages": process_memory_pages()}


def _rows(variants: list, point: Point, layout: str, checks: dict) -> list[dict]:
    n = int(np.prod(point.shape))
    nbytes = 2 * n * ITEMSIZE[point.dtype]  # read x + write y
    med = {(v.kind, v.config): float(np.median(v.times)) for v in variants}
    best = {(v.kind, v.config): float(np.min(v.times)) for v in variants}
    neg, copy = med.get(("ref:neg", None)), med.get(("ref:copy", None))
    neg_best, copy_best = best.get(("ref:neg", None)), best.get(("ref:copy", None))
    rows = []
    for v in variants:
        t = med[(v.kind, v.config)]
        rows.append({
            "ep": point.ep, "dtype": point.dtype, "layout": layout, "elements": n,
            "shape": list(point.shape), "axis": LAYOUTS[layout], "kind": v.kind,
            "config": v.config, "median_s": t, "min_s": float(np.min(v.times)),
            "runs": len(v.times), "times_s": [float(x) for x in v.times],
            "elements_per_s": n / t, "gb_per_s": nbytes / t / 1e9,
            "ratio_to_neg": (neg / t) if neg else None,
            "ratio_to_copy": (copy / t) if copy else None,
            # the same from the fastest run of each (less sensitive to load from elsewhere)
            "ratio_to_neg_best": (neg_best / best[(v.kind, v.config)]) if neg_best else None,
            "ratio_to_copy_best": (copy_best / best[(v.kind, v.config)]) if copy_best else None,
            **checks.get((v.kind, v.config), {}),
        })
    return rows


def _progress(ep, dtype, n, layout, rows) -> str:
    short = ep.replace("ExecutionProvider", "")
    parts = []
    for r in rows:
        if r["kind"] == "custom":
            parts.append(f"{r['config']} {r['gb_per_s']:.1f}")
    refs = {r["kind"]: r["gb_per_s"] for r in rows if r["kind"].startswith("ref:")}
    ref_txt = " ".join(f"{k[4:]} {v:.1f}" for k, v in refs.items())
    return f"[{short} {dtype} {n} {layout}] GB/s: {ref_txt} | " + " ".join(parts)


def _options_doc(opts: Options) -> dict:
    doc = asdict(opts)
    doc.pop("log", None)
    return doc
