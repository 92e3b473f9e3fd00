"""Command line of the benchmark: ``ort-mx-bench`` / ``python -m ort_mx_ops.benchmarks``.

    ort-mx-bench                                 # every EP, config, dtype; 4 Ki .. 64 Mi
    ort-mx-bench --tiny                          # smoke sweep (seconds)
    ort-mx-bench --sizes 16Mi --dtypes float32   # the CPU target point
    ort-mx-bench --other-library /path/to/libcustom_ops.so   # e.g. Quark's, same op names
    ort-mx-bench --model model.onnx [--configs MX9,MXINT8]  # model level: see model_bench.py
    ort-mx-bench --kernel [--configs MXINT8] [--nchwc] [--input hardswish]  # the CPU kernel alone: kernel_bench.py
    ort-mx-bench --walk-bound [--shapes 512x512] [--block 32]  # the walks' structure alone: walk_bound.py
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ort_mx_ops.benchmarks import graphs, harness, report

__all__ = ["main", "parse_size"]


def parse_size(text: str) -> int:
    """'4096', '4Ki', '16Mi', '1M' -> elements."""
    t = text.strip()
    units = {"ki": 1 << 10, "k": 1 << 10, "mi": 1 << 20, "m": 1 << 20, "gi": 1 << 30, "g": 1 << 30}
    for suffix in sorted(units, key=len, reverse=True):
        if t.lower().endswith(suffix):
            return int(float(t[: -len(suffix)]) * units[suffix])
    return int(t)


def _list(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ort-mx-bench",
        description="Benchmark the ort-mx-ops quantize-dequantize ops per onnxruntime "
                    "execution provider, against Neg, a copy, the same op built from "
                    "standard ONNX ops, and optionally another custom-op library.")
    p.add_argument("--ep", default="all",
                   help="execution providers, comma separated (CPU, CUDA, ROCM or full names); "
                        "default: every one the installed onnxruntime has")
    p.add_argument("--configs", default="all",
                   help=f"comma separated of {', '.join(graphs.BENCH_CONFIGS)} "
                        f"({graphs.BF16_FUSED}: BF16 as our one-node BF16QuantizeDequantize)")
    p.add_argument("--dtypes", default="float32,float16,bfloat16",
                   help=f"input types, comma separated, of {', '.join(harness.ITEMSIZE)} "
                        "(default: %(default)s; --tiny: float32)")
    p.add_argument("--layouts", default="innermost,outer",
                   help="comma separated, of innermost (blocked axis 1 of a [rows, cols] "
                        "tensor), outer (blocked axis 0) and nchwc (a [1, rows, cols] tensor in "
                        "onnxruntime's NCHWc memory order, blocked along its rows; CPU, BFP / MX "
                        "configurations) (default: %(default)s)")
    p.add_argument("--sizes", default=None,
                   help="elements, powers of two, comma separated (e.g. 4Ki,1Mi,16Mi); "
                        "default 4Ki..64Mi by factors of 4")
    p.add_argument("--tiny", action="store_true",
                   help="smoke sweep: 4Ki and 16Ki elements, float32, few repeats")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ORT default)")
    p.add_argument("--thread-pool", choices=harness.THREAD_POOLS, default="shared",
                   help="shared (default): every session on one intra-op pool (onnxruntime's "
                        "global pool), so no session's idle workers spin against another's "
                        "run; session: a pool per session (onnxruntime's default)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per variant, at least")
    p.add_argument("--max-repeats", type=int, default=30)
    p.add_argument("--min-time", type=float, default=0.3,
                   help="seconds of timed runs per variant, at least (up to --max-repeats)")
    p.add_argument("--no-standard", action="store_true",
                   help="skip the standard-ONNX graphs")
    p.add_argument("--standard-max-size", default="64Mi",
                   help="largest size at which the (slow) standard-ONNX graphs run")
    p.add_argument("--other-library", default=None,
                   help="another custom-op library with the same op names (e.g. Quark's)")
    p.add_argument("--out", default="bench-results", help="output folder")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--model", default=None,
                   help="model-level mode: quantized vs float latency of this ONNX model and "
                        "where the time goes (ort-mx-bench --model M --help for its options)")
    p.add_argument("--kernel", action="store_true",
                   help="kernel mode: the CPU block kernel called directly against a negation "
                        "loop, on activation shapes (ort-mx-bench --kernel --help for its "
                        "options)")
    p.add_argument("--walk-bound", action="store_true",
                   help="the blocked-axis-outer walks' structure alone, compiled here, against "
                        "a negation loop (ort-mx-bench --walk-bound --help for its options)")
    return p


def _resolve_eps(text: str) -> list[str]:
    have = harness.available_eps()
    if text == "all":
        return have
    eps = []
    for name in _list(text):
        full = name if name.endswith("ExecutionProvider") else f"{name.upper()}ExecutionProvider"
        full = full.replace("CPUEXECUTIONPROVIDER", "CPUExecutionProvider")
        if full not in harness.EP_DEVICE:
            raise SystemExit(f"unknown execution provider {name!r}")
        if full not in have:
            raise SystemExit(f"{full} is not in this onnxruntime ({', '.join(have)})")
        eps.append(full)
    return eps


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--model" or a.startswith("--model=") for a in argv):
        from ort_mx_ops.benchmarks import model_bench  # the model-level mode
        return model_bench.main(argv)
    if "--kernel" in argv:
        from ort_mx_ops.benchmarks import kernel_bench  # the CPU kernel called directly
        return kernel_bench.main(argv)
    if "--walk-bound" in argv:
        from ort_mx_ops.benchmarks import walk_bound  # the walks' structure alone
        return walk_bound.main(argv)
    args = build_parser().parse_args(argv)
    configs = list(graphs.BENCH_CONFIGS) if args.configs == "all" else _list(args.configs)
    for c in configs:
        if c not in graphs.BENCH_CONFIGS:
            raise SystemExit(f"unknown config {c!r}; known: {', '.join(graphs.BENCH_CONFIGS)}")
    dtypes = _list(args.dtypes)
    for d in dtypes:
        if d not in harness.ITEMSIZE:
            raise SystemExit(f"unknown dtype {d!r}")
    layouts = _list(args.layouts)
    for lay in layouts:
        if lay not in harness.LAYOUTS:
            raise SystemExit(f"unknown layout {lay!r}; known: {', '.join(harness.LAYOUTS)}")
    sizes = [parse_size(s) for s in _list(args.sizes)] if args.sizes else (
        harness.TINY_SIZES if args.tiny else harness.DEFAULT_SIZES)
    for n in sizes:
        harness.shape_for(n)  # powers of two only
    if args.tiny:
        if not args.sizes and args.dtypes == build_parser().get_default("dtypes"):
            dtypes = ["float32"]
        warmup, repeats, max_repeats, min_time = 1, 2, 2, 0.0
    else:
        warmup, repeats, max_repeats, min_time = (args.warmup, args.repeats,
                                                  max(args.repeats, args.max_repeats), args.min_time)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    opts = harness.Options(
        eps=_resolve_eps(args.ep), configs=configs, dtypes=dtypes, layouts=layouts, sizes=sizes,
        threads=args.threads, thread_pool=args.thread_pool, warmup=warmup,
        min_repeats=repeats, max_repeats=max_repeats,
        min_time=min_time, standard=not args.no_standard,
        standard_max_size=parse_size(args.standard_max_size),
        other_library=args.other_library, log=log)
    t0 = time.perf_counter()
    doc = harness.run_sweep(opts)
    doc["wall_s"] = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [report.write_json(doc, out / "results.json"),
             report.write_markdown(doc, out / "results.md")]
    if not args.no_plots:
        try:
            paths += report.write_plots(doc, out)
        except ImportError:
            print("ort-mx-bench: matplotlib not installed (pip install matplotlib, or "
                  "pip install \".[bench]\" in the source tree); no plots", file=sys.stderr)
    for p in paths:
        log(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
