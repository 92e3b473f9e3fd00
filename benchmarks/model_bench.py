"""Model-level benchmark: ``ort-mx-bench --model PATH``.

Quantizes one ONNX model with each configuration (the quantizer's defaults), then measures on
one execution provider (``--ep``, default the CPU's), at batch 1, in one process:

* latency: the float model and every quantized model run in turns, round after round, so
  load from elsewhere on the machine hits them alike; reported as median and fastest run,
  and as ratios to the float model from the same rounds.  Each turn's first run finds the
  caches holding the other models' data ("cold": a model run between other work); with
  ``--warm-runs N`` the session then runs N more times, and the median of those is the
  turn's "warm" time (a model served back to back, its weights cached).  The two differ:
  cache misses add about the same time to the float and the quantized model, so the cold
  ratios are the smaller;
* where the time goes: onnxruntime's profiler on separate sessions, per node the median of
  its kernel times over the profiled runs, summed by op type; the share of our ops
  (the quantize-dequantize nodes) and of the layout conversions onnxruntime inserts around
  its blocked NCHWc convolutions (``ReorderInput`` / ``ReorderOutput``);
* that the outputs are real: every quantized model's outputs are finite where the float
  model's are, and their largest difference from the float outputs is recorded;
* on a GPU provider (``--ep CUDA``), every model also runs once on the CPU provider: whether
  the outputs are the same bits, their largest difference and how often the arg-max along
  the last axis agrees (a class or character per position), and which provider ran our nodes.

Writes ``model_results.json`` and ``model_results.md`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import onnx
import onnxruntime as ort

import ort_mx_ops
from ort_mx_ops.benchmarks.graphs import BF16_FUSED
from ort_mx_ops.benchmarks import harness
from ort_mx_ops.benchmarks.harness import EP_DEVICE, machine_info
from ort_mx_ops.formats import BLOCK_OPS, CONFIGS, LEGACY_DOMAIN, PRODUCT_DOMAIN, QUARK_DOMAIN

__all__ = ["main", "build_parser", "run_model_bench", "ModelOptions", "profile_breakdowns",
           "make_feeds", "LAYOUT_OPS", "markdown"]

LAYOUT_OPS = ("ReorderInput", "ReorderOutput")  # onnxruntime's NCHW <-> NCHWc conversions
_OUR_DOMAINS = (QUARK_DOMAIN, LEGACY_DOMAIN, PRODUCT_DOMAIN)
DEFAULT_CONFIGS = ("BFP16", "MX9", "MXFP8E4M3", "MXINT8", "BF16")
CPU_EP = "CPUExecutionProvider"


@dataclass
class ModelOptions:
    model: str
    configs: list[str]
    shapes: dict[str, list[int]] = field(default_factory=dict)  # --shape overrides
    seq_len: int = 128           # free non-batch axes of integer (token) inputs
    threads: int = 1             # intra-op threads; 0: onnxruntime's default
    thread_pool: str = "shared"  # several threads: one pool for every model (session_options)
    warmup: int = 3
    rounds: int = 40             # interleaved timed rounds, at least
    warm_runs: int = 4           # runs per turn after the first (cold) one; 0: none
    min_time: float = 5.0        # seconds of timed rounds, at least (up to max_rounds)
    max_rounds: int = 1000
    profile_runs: int = 20
    extra_models: dict[str, str] = field(default_factory=dict)   # label -> prepared model
    nchwc: bool = False          # also time each config through quantizer.nchwc
    neg_floor: bool = False      # also time each BFP / MX model with Neg in place of our nodes
    ep: str = CPU_EP             # the execution provider timed and profiled
    log: Callable[[str], None] = print


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

def _input_shape(inp: onnx.ValueInfoProto, opts: ModelOptions, integer: bool) -> list[int]:
    if inp.name in opts.shapes:
        return list(opts.shapes[inp.name])
    dims = inp.type.tensor_type.shape.dim
    shape = []
    for axis, d in enumerate(dims):
        if d.HasField("dim_value") and d.dim_value > 0:
            shape.append(int(d.dim_value))
        elif axis == 0:
            shape.append(1)  # batch 1
        elif integer:
            shape.append(opts.seq_len)
        else:
            raise ValueError(f"input {inp.name!r} has a free axis {axis}; give its shape with "
                             f"--shape {inp.name}=1x3x48x320 (for example)")
    return shape


def make_feeds(model: onnx.ModelProto, opts: ModelOptions, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of batch 1 for ``model``: float inputs standard normal, integer inputs token ids
    in [1000, 2000) (an attention mask all ones, token types zero)."""
    rng = np.random.default_rng(seed)
    init_names = {i.name for i in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        if inp.name in init_names:
            continue
        elem = inp.type.tensor_type.elem_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        integer = np.issubdtype(dtype, np.integer)
        shape = _input_shape(inp, opts, integer)
        if integer:
            lname = inp.name.lower()
            if "mask" in lname:
                feeds[inp.name] = np.ones(shape, dtype)
            elif "type" in lname:
                feeds[inp.name] = np.zeros(shape, dtype)
            else:
                feeds[inp.name] = rng.integers(1000, 2000, shape).astype(dtype)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


# ---------------------------------------------------------------------------------------------
# Sessions, timing, profiling
# ---------------------------------------------------------------------------------------------

def _session(path: str, threads: int, profile_prefix: Optional[str] = None,
             optimization: Optional[str] = None, ep: str = CPU_EP,
             thread_pool: str = "shared") -> ort.InferenceSession:
    """A session on ``ep`` with our library for that provider's device registered; a GPU
    provider keeps the CPU provider behind it for the nodes it has no kernel for. Several
    intra-op threads share one pool across sessions unless ``thread_pool`` is "session"
    (harness.session_options says why)."""
    so = harness.session_options(threads, thread_pool)
    so.log_severity_level = 3
    ort_mx_ops.register(so, EP_DEVICE[ep][0])
    if optimization == "disabled":  # a model that is already onnxruntime-optimised
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return ort.InferenceSession(path, so, providers=[ep] if ep == CPU_EP else [ep, CPU_EP])


def _optimization_of(path: str) -> Optional[str]:
    """Models written by our NCHWc rewrite are onnxruntime-optimised already."""
    m = onnx.load(path, load_external_data=False)
    meta = {p.key: p.value for p in m.metadata_props}
    return "disabled" if meta.get("ort_mx_ops.onnxruntime_optimized") else None


def our_op_types(model: onnx.ModelProto) -> set[str]:
    """Op types of the nodes in our custom-op domains."""
    return {n.op_type for n in model.graph.node if n.domain in _OUR_DOMAINS}


def profile_breakdowns(paths: dict[str, str], feeds: dict[str, np.ndarray], runs: int,
                       threads: int, ours: set[str], workdir: str,
                       ep: str = CPU_EP, thread_pool: str = "shared",
                       warm_runs: int = 0) -> dict[str, dict[str, Any]]:
    """Per model of ``paths``, the per-op-type time of one run from onnxruntime's profiler:
    each node's median kernel time over ``runs`` runs (after one warm-up turn), summed per op
    type.  The models run in turns, so load from elsewhere hits them alike: in its turn a
    model runs once (cold: the previous turn ran another model) and then ``warm_runs`` times
    more, whose medians are the ``warm_seconds`` beside each ``seconds`` (none where
    ``warm_runs`` is 0).  Shares are of the summed (cold) node time, so they add up to 1."""
    sessions = {label: _session(path, threads, optimization=_optimization_of(path),
                                profile_prefix=os.path.join(workdir, f"profile{i}"), ep=ep,
                                thread_pool=thread_pool)
                for i, (label, path) in enumerate(paths.items())}
    for _ in range(runs + 1):
        for sess in sessions.values():
            for _ in range(1 + warm_runs):
                sess.run(None, feeds)
    return {label: _breakdown(sess.end_profiling(), ours, 1 + warm_runs)
            for label, sess in sessions.items()}


def _cold_and_warm(durs: list[float], turn: int) -> tuple[float, Optional[float]]:
    """The median of a node's kernel times in its model's turns of ``turn`` runs each (the
    profiler lists them in run order): over each turn's first run, and over the others (None
    where a turn is one run). The first turn (the warm-up) is left out where there are more."""
    if len(durs) > turn:
        durs = durs[turn:]
    cold = durs[::turn]
    warm = [d for i, d in enumerate(durs) if i % turn]
    return statistics.median(cold), (statistics.median(warm) if warm else None)


def _breakdown(prof_path: str, ours: set[str], turn: int = 1) -> dict[str, Any]:
    try:
        events = json.loads(Path(prof_path).read_text())
    finally:
        os.remove(prof_path)
    per_node: dict[str, list[float]] = defaultdict(list)
    node_op: dict[str, str] = {}
    node_shape: dict[str, list[int]] = {}
    node_provider: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            per_node[name].append(float(e["dur"]) * 1e-6)
            node_op[name] = e["args"]["op_name"]
            node_shape[name] = _first_input_shape(e["args"])
            node_provider[name] = e["args"].get("provider", "")
    node_elems = {name: int(np.prod(shape)) for name, shape in node_shape.items()}
    by_op: dict[str, dict[str, float]] = {}
    by_size: dict[str, dict[str, dict[str, float]]] = {"ours": {}, "layout": {}}
    # our nodes and any Neg one by one, so that a model can be set against its +neg form
    nodes: dict[str, dict[str, Any]] = {}
    for name, durs in per_node.items():
        t, tw = _cold_and_warm(durs, turn)
        if node_op[name] in ours or node_op[name] == "Neg":
            nodes[name] = {"op": node_op[name], "seconds": t, "input_shape": node_shape[name],
                           **({"warm_seconds": tw} if tw is not None else {})}
        row = by_op.setdefault(node_op[name], {"seconds": 0.0, "nodes": 0})
        row["seconds"] += t
        row["nodes"] += 1
        if tw is not None:
            row["warm_seconds"] = row.get("warm_seconds", 0.0) + tw
        group = "ours" if node_op[name] in ours else \
            "layout" if node_op[name] in LAYOUT_OPS else None
        if group:
            cell = by_size[group].setdefault(_size_bucket(node_elems[name]),
                                             {"nodes": 0, "seconds": 0.0, "elements": 0})
            cell["nodes"] += 1
            cell["seconds"] += t
            cell["elements"] += node_elems[name]
    total = sum(r["seconds"] for r in by_op.values())
    for r in by_op.values():
        r["share"] = r["seconds"] / total if total > 0 else 0.0
    ours_s = sum(r["seconds"] for op, r in by_op.items() if op in ours)
    layout_s = sum(r["seconds"] for op, r in by_op.items() if op in LAYOUT_OPS)
    return {
        "node_seconds": total,
        "runs": max(((len(d) - turn) // turn for d in per_node.values()), default=0),
        "ops": dict(sorted(by_op.items(), key=lambda kv: -kv[1]["seconds"])),
        "ours_seconds": ours_s,
        "ours_share": ours_s / total if total > 0 else 0.0,
        "ours_nodes": sum(r["nodes"] for op, r in by_op.items() if op in ours),
        # which execution provider ran our nodes: provider -> nodes
        "ours_providers": dict(sorted(Counter(node_provider[n] for n, op in node_op.items()
                                              if op in ours).items())),
        "layout_seconds": layout_s,
        "layout_share": layout_s / total if total > 0 else 0.0,
        "layout_nodes": sum(r["nodes"] for op, r in by_op.items() if op in LAYOUT_OPS),
        # our nodes and the layout conversions by the element count of their input
        "by_size": {g: {b: by_size[g][b] for b in SIZE_BUCKETS if b in by_size[g]}
                    for g in by_size},
        "nodes": nodes,
    }


SIZE_BUCKETS = ("<=1Ki", "1Ki-16Ki", "16Ki-256Ki", ">256Ki")


def _size_bucket(n: int) -> str:
    return SIZE_BUCKETS[0] if n <= 1 << 10 else SIZE_BUCKETS[1] if n <= 1 << 14 else \
        SIZE_BUCKETS[2] if n <= 1 << 18 else SIZE_BUCKETS[3]


def _first_input_shape(args: dict) -> list[int]:
    """The shape of a profiled node's first input ([0] where the profiler gives none)."""
    shapes = args.get("input_type_shape") or []
    if not shapes:
        return [0]
    return [int(d) for d in next(iter(shapes[0].values()), [])]


def _interleaved(sessions: dict[str, ort.InferenceSession], feeds: dict[str, np.ndarray],
                 warmup: int, rounds: int, min_time: float = 0.0, max_rounds: int = 1000,
                 warm_runs: int = 0) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run times (s) per session, cold and warm: after ``warmup`` runs each, the sessions take
    turns, at least ``rounds`` rounds and ``min_time`` seconds (at most ``max_rounds``
    rounds). In its turn a session runs once (the cold time: the previous turn ran another
    model) and then ``warm_runs`` times more (the warm time: their median; no list where
    ``warm_runs`` is 0)."""
    for s in sessions.values():
        for _ in range(warmup):
            s.run(None, feeds)
    cold: dict[str, list[float]] = {k: [] for k in sessions}
    warm: dict[str, list[float]] = {k: [] for k in sessions} if warm_runs > 0 else {}
    order = list(sessions)
    start, r = time.perf_counter(), 0
    while r < rounds or (time.perf_counter() - start < min_time and r < max_rounds):
        # rotate the order so no variant always runs right after the same one
        k = r % len(order)
        for label in order[k:] + order[:k]:
            runs = []
            for _ in range(1 + warm_runs):
                t0 = time.perf_counter()
                sessions[label].run(None, feeds)
                runs.append(time.perf_counter() - t0)
            cold[label].append(runs[0])
            if warm_runs > 0:
                warm[label].append(statistics.median(runs[1:]))
        r += 1
    return cold, warm


def _max_abs_diff(ref: list[np.ndarray], out: list[np.ndarray]) -> float:
    """The largest |out - ref| over all outputs, where both are finite (0.0 where none is)."""
    diff = 0.0
    for a, b in zip(ref, out):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        both = np.isfinite(a64) & np.isfinite(b64)
        if both.any():
            diff = max(diff, float(np.max(np.abs(a64[both] - b64[both]))))
    return diff


def _compare(ref: list[np.ndarray], out: list[np.ndarray]) -> dict[str, Any]:
    """The largest difference of ``out`` from ``ref`` where both are finite, and whether they
    are finite in the same places."""
    finite_ok = all(np.array_equal(np.isfinite(np.asarray(a, np.float64)),
                                   np.isfinite(np.asarray(b, np.float64)))
                    for a, b in zip(ref, out))
    return {"max_abs_diff_vs_float": _max_abs_diff(ref, out),
            "finite_where_float_is": bool(finite_ok)}


def compare_to_cpu(cpu: list[np.ndarray], out: list[np.ndarray]) -> dict[str, Any]:
    """How far one model's outputs on another provider are from its outputs on the CPU
    provider: the same bits or not, the largest difference where both are finite, and the
    share of positions whose arg-max along the last axis agrees (for a classifier or a CTC
    recogniser: the same class or character)."""
    same_bits = all(np.array_equal(np.ascontiguousarray(a).view(np.uint8),
                                   np.ascontiguousarray(b).view(np.uint8))
                    for a, b in zip(cpu, out))
    agree, positions = 0, 0
    for a, b in zip(cpu, out):
        a, b = np.asarray(a), np.asarray(b)
        if a.ndim >= 1 and a.size and np.issubdtype(a.dtype, np.floating):
            agree += int(np.sum(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))
            positions += a.size // a.shape[-1]
    return {"bit_identical_to_cpu": same_bits, "max_abs_diff_vs_cpu": _max_abs_diff(cpu, out),
            "argmax_agreement_vs_cpu": agree / positions if positions else None}


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

NEG_FLOOR = "+neg"  # the label suffix of those variants


def with_neg_nodes(src: str, dst: str) -> int:
    """Writes to ``dst`` the model at ``src`` with each node of our block ops in its main graph
    replaced by ``Neg`` of the same input: the same tensor read and written once with no
    arithmetic, so its latency is the least that any separate node in those places costs
    when it writes a buffer of its own (ours may run in place; its outputs are not
    meaningful). Returns the number of nodes replaced."""
    model = onnx.load(src)
    replaced = 0
    for node in model.graph.node:
        if node.domain in _OUR_DOMAINS and node.op_type in BLOCK_OPS:
            node.op_type, node.domain = "Neg", ""
            del node.input[1:]
            del node.attribute[:]
            replaced += 1
    onnx.save(model, dst)
    return replaced


def _quantize_all(opts: ModelOptions, workdir: str) -> tuple[dict[str, str], dict[str, dict]]:
    """Model paths per variant label (each config, BF16 also as one fused node per tensor,
    with ``opts.nchwc`` each one's pre-optimised form and the float model's, and with
    ``opts.neg_floor`` each BFP / MX model with Neg in place of our nodes) and what was done to
    make each."""
    from ort_mx_ops.quantizer import get_config, quantize_model
    from ort_mx_ops.quantizer.nchwc import optimize_nchwc
    paths, info = {}, {}
    variants: list[tuple[str, Any, dict]] = []
    for config in opts.configs:
        variants.append((config, config, {}))
        if config == "BF16":  # our one-node form (BF16_FUSED): it must give the pair's bits
            variants.append((BF16_FUSED, get_config("BF16").replace(bf16_qdq_fused=True),
                             {"same_as": "BF16"}))
    if opts.nchwc:
        # the control: the float model pre-optimised and run the same way (nothing rewritten)
        paths["float+nchwc"] = os.path.join(workdir, "float_nchwc.onnx")
        optimize_nchwc(opts.model, paths["float+nchwc"], opts.shapes or None)
        info["float+nchwc"] = {"same_as": "float"}
    for config, cfg, extra in variants:
        out = os.path.join(workdir, f"{config}.onnx")
        t0 = time.perf_counter()
        summary = quantize_model(opts.model, out, cfg)
        runtime = sum(len(r.runtime_nodes) for r in summary.sites)
        info[config] = {"quantize_s": time.perf_counter() - t0, "runtime_nodes": runtime,
                        "sites": len(summary.sites), **extra}
        paths[config] = out
        opts.log(f"  quantized {config}: {runtime} runtime nodes")
        if opts.nchwc:
            label = f"{config}+nchwc"
            paths[label] = os.path.join(workdir, f"{config}_nchwc.onnx")
            rep = optimize_nchwc(out, paths[label], opts.shapes or None)
            info[label] = {"runtime_nodes": runtime, "same_as": config, "nchwc_block": rep.block,
                           "nchwc_rewritten": len(rep.rewritten), "nchwc_kept": len(rep.kept),
                           "nchwc_divisions_fused": len(rep.divisions_fused)}
        if opts.neg_floor and config in CONFIGS and CONFIGS[config].op != "BF16":
            for label in [config] + ([f"{config}+nchwc"] if opts.nchwc else []):
                floor = label + NEG_FLOOR
                paths[floor] = os.path.join(workdir, f"{label}_neg.onnx".replace("+", "_"))
                info[floor] = {"neg_nodes": with_neg_nodes(paths[label], paths[floor])}
    return paths, info


def run_model_bench(opts: ModelOptions) -> dict[str, Any]:
    """Measures ``opts.model`` and its quantized versions; returns the results document."""
    if not os.path.isfile(opts.model):
        raise FileNotFoundError(f"model file not found: {opts.model}")
    model = onnx.load(opts.model, load_external_data=False)
    feeds = make_feeds(model, opts)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ort-mx-model-bench-") as workdir:
        paths, qinfo = _quantize_all(opts, workdir)
        variants = {"float": opts.model, **paths, **opts.extra_models}
        ours = set()
        for label, path in variants.items():
            if label != "float":
                ours |= our_op_types(onnx.load(path, load_external_data=False))
        sessions = {label: _session(p, opts.threads, optimization=_optimization_of(p),
                                    ep=opts.ep, thread_pool=opts.thread_pool)
                    for label, p in variants.items()}
        outs = {label: s.run(None, feeds) for label, s in sessions.items()}
        vs_cpu = {}
        if opts.ep != CPU_EP:  # the same models on the CPU provider, one run each
            for label, p in variants.items():
                cpu_out = _session(p, opts.threads, optimization=_optimization_of(p),
                                   thread_pool=opts.thread_pool).run(None, feeds)
                vs_cpu[label] = compare_to_cpu(cpu_out, outs[label])
        checks = {label: _compare(outs["float"], o) for label, o in outs.items()
                  if label != "float"}
        for label, info in qinfo.items():
            if "same_as" in info:  # a rewritten model or another form of a config: same bits
                checks[label]["bit_identical_to_same_as"] = all(
                    np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
                    for a, b in zip(outs[label], outs[info["same_as"]]))
        opts.log(f"  timing {len(sessions)} sessions, {opts.rounds} interleaved rounds")
        times, warm = _interleaved(sessions, feeds, opts.warmup, opts.rounds, opts.min_time,
                                   opts.max_rounds, opts.warm_runs)
        del sessions
        profiles = profile_breakdowns(variants, feeds, opts.profile_runs, opts.threads, ours,
                                      workdir, opts.ep, opts.thread_pool, opts.warm_runs)
        for label, prof in profiles.items():
            opts.log(f"  profiled {label}: ours {prof['ours_share']:.1%}, layout "
                     f"{prof['layout_share']:.1%}")
    f_med, f_min = statistics.median(times["float"]), min(times["float"])
    f_layout = profiles["float"]["layout_seconds"]
    rows = []
    for label in variants:
        med, best = statistics.median(times[label]), min(times[label])
        prof = profiles[label]
        rows.append({
            "variant": label,
            "config": label.split("+")[0] if label.split("+")[0] in CONFIGS else None,
            "median_s": med, "min_s": best, "runs": len(times[label]),
            "times_s": times[label],
            "ratio_to_float": med / f_med, "ratio_to_float_best": best / f_min,
            # per round, this run over the float run of the same round; the median of those
            "ratio_to_float_paired": _paired_median(times[label], times["float"]),
            # summed per-node medians from the profiler: less exposed to load from elsewhere
            "node_time_ratio_to_float": prof["node_seconds"] / profiles["float"]["node_seconds"],
            # the same from the warm runs (--warm-runs): a model run back to back
            **({"warm_median_s": statistics.median(warm[label]),
                "warm_times_s": warm[label],
                "ratio_to_float_warm": statistics.median(warm[label])
                / statistics.median(warm["float"]),
                "ratio_to_float_warm_paired": _paired_median(warm[label], warm["float"])}
               if warm else {}),
            **({"ratio_to_float_nchwc": med / statistics.median(times["float+nchwc"]),
                "ratio_to_float_nchwc_best": best / min(times["float+nchwc"])}
               if "float+nchwc" in times else {}),
            "profile": prof,
            # layout time beyond what the float model itself spends on conversions
            "layout_extra_seconds": prof["layout_seconds"] - f_layout,
            "layout_extra_vs_float_node_time": (prof["layout_seconds"] - f_layout)
            / profiles["float"]["node_seconds"],
            **qinfo.get(label, {}), **checks.get(label, {}), **vs_cpu.get(label, {}),
        })
    add_floor_ratios(rows)
    add_node_floors(rows)
    return {
        "kind": "model",
        "model": os.path.abspath(opts.model),
        "inputs": {k: list(v.shape) for k, v in feeds.items()},
        "machine": machine_info(),
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        # after the runs: how much of onnxruntime's memory (and ours) lay on huge pages
        "memory_pages": harness.process_memory_pages(),
        "options": {"configs": opts.configs, "threads": opts.threads,
                    "thread_pool": opts.thread_pool, "warmup": opts.warmup,
                    "rounds": opts.rounds, "warm_runs": opts.warm_runs,
                    "min_time": opts.min_time,
                    "max_rounds": opts.max_rounds, "profile_runs": opts.profile_runs,
                    "extra_models": opts.extra_models, "nchwc": opts.nchwc,
                    "neg_floor": opts.neg_floor, "ep": opts.ep},
        "results": rows,
    }


def _paired_median(times: list[float], reference: list[float]) -> float:
    """The median over rounds of a run's time over the reference's run in the same round."""
    return statistics.median(t / r for t, r in zip(times, reference))


def add_floor_ratios(rows: list[dict]) -> None:
    """For each variant timed beside its ``+neg`` form (--neg-floor), adds how much slower it
    ran than that floor, paired per round: ``ratio_to_neg_floor_paired`` (cold runs) and, with
    warm runs, ``ratio_to_neg_floor_warm_paired``; and the floor's own paired ratios to the
    float model (``neg_floor_ratio_to_float_paired`` / ``..._warm_paired``). The first is what
    our nodes' arithmetic costs beyond any separate node in their places, measured without the
    float model's run in between."""
    by_label = {r["variant"]: r for r in rows}
    for r in rows:
        floor = by_label.get(r["variant"] + NEG_FLOOR)
        if floor is None:
            continue
        r["ratio_to_neg_floor_paired"] = _paired_median(r["times_s"], floor["times_s"])
        r["neg_floor_ratio_to_float_paired"] = floor["ratio_to_float_paired"]
        if "warm_times_s" in r and "warm_times_s" in floor:
            r["ratio_to_neg_floor_warm_paired"] = _paired_median(r["warm_times_s"],
                                                                 floor["warm_times_s"])
            r["neg_floor_ratio_to_float_warm_paired"] = floor["ratio_to_float_warm_paired"]


def add_node_floors(rows: list[dict]) -> None:
    """For each variant timed beside its ``+neg`` form (--neg-floor), sets its nodes against
    the ``Neg`` in the same place (the same node name; with_neg_nodes keeps names) by the
    profiler's per-node median kernel times, grouped by input shape:
    ``nodes_vs_neg_floor`` lists, largest input first, ``input_shape``, ``nodes``,
    ``seconds`` (ours, summed) and ``neg_seconds``, from the turns' first runs, and where the
    profile has warm runs ``warm_seconds`` and ``warm_neg_seconds`` from the others. Both
    come from the same interleaved profiled runs, so this says which tensors our arithmetic
    costs time on."""
    by_label = {r["variant"]: r for r in rows}
    for r in rows:
        floor = by_label.get(r["variant"] + NEG_FLOOR)
        if floor is None:
            continue
        negs = floor["profile"].get("nodes", {})
        groups: dict[tuple[int, ...], dict[str, Any]] = {}
        for name, node in r["profile"].get("nodes", {}).items():
            neg = negs.get(name)
            if node["op"] == "Neg" or neg is None or neg["op"] != "Neg":
                continue
            g = groups.setdefault(tuple(node["input_shape"]),
                                  {"input_shape": node["input_shape"], "nodes": 0,
                                   "seconds": 0.0, "neg_seconds": 0.0})
            g["nodes"] += 1
            g["seconds"] += node["seconds"]
            g["neg_seconds"] += neg["seconds"]
            if "warm_seconds" in node and "warm_seconds" in neg:
                g["warm_seconds"] = g.get("warm_seconds", 0.0) + node["warm_seconds"]
                g["warm_neg_seconds"] = g.get("warm_neg_seconds", 0.0) + neg["warm_seconds"]
        r["nodes_vs_neg_floor"] = sorted(groups.values(),
                                         key=lambda g: (-int(np.prod(g["input_shape"])),
                                                        g["input_shape"]))


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def _floor_table(rows: list[dict]) -> list[str]:
    """Markdown lines: each variant against its Neg floor (add_floor_ratios)."""
    warm = all("ratio_to_neg_floor_warm_paired" in r for r in rows)
    head = ["variant", f"{NEG_FLOOR} ×float (paired)", f"×{NEG_FLOOR} (paired)"]
    if warm:
        head += [f"{NEG_FLOOR} ×float (warm, paired)", f"×{NEG_FLOOR} (warm, paired)"]
    out = [f"## Above the Neg floor (×{NEG_FLOOR}: the median over rounds of this variant's "
           f"run / its {NEG_FLOOR} form's)", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["variant"], f"{r['neg_floor_ratio_to_float_paired']:.3f}",
                 f"{r['ratio_to_neg_floor_paired']:.3f}"]
        if warm:
            cells += [f"{r['neg_floor_ratio_to_float_warm_paired']:.3f}",
                      f"{r['ratio_to_neg_floor_warm_paired']:.3f}"]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return out


def _node_floor_table(rows: list[dict]) -> list[str]:
    """Markdown lines: per input shape, each variant's nodes against their Neg (add_node_floors),
    as microseconds per node, ours / Neg, cold and (where profiled) warm, and the number of
    such nodes."""
    warm = all("warm_seconds" in g for r in rows for g in r["nodes_vs_neg_floor"])

    def cell(groups: list[dict], n: int) -> str:
        def pair(key: str) -> str:
            a = sum(g[key] for g in groups) / n * 1e6
            b = sum(g[key.replace("seconds", "neg_seconds")] for g in groups) / n * 1e6
            return f"{a:.1f} / {b:.1f}"
        return pair("seconds") + (f" · {pair('warm_seconds')}" if warm else "")

    shapes: list[list[int]] = []
    cells: dict[tuple[str, tuple[int, ...]], str] = {}
    for r in rows:
        for g in r["nodes_vs_neg_floor"]:
            if g["input_shape"] not in shapes:
                shapes.append(g["input_shape"])
            cells[r["variant"], tuple(g["input_shape"])] = \
                f"{cell([g], g['nodes'])} ({g['nodes']})"
    shapes.sort(key=lambda s: (-int(np.prod(s)), s))
    head = ["input shape"] + [r["variant"] for r in rows]
    what = "cold ours / Neg · warm ours / Neg" if warm else "ours / Neg"
    out = [f"## Our nodes against their Neg, by input shape (µs per node from the profile: "
           f"{what}, the Neg of {NEG_FLOOR} in the same place (nodes))", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in shapes:
        out.append(f"| {'x'.join(map(str, shape))} | " +
                   " | ".join(cells.get((r["variant"], tuple(shape)), "–") for r in rows) + " |")
    out.append("| all (µs per run) | " +
               " | ".join(cell(r["nodes_vs_neg_floor"], 1) for r in rows) + " |")
    out.append("")
    return out


def markdown(doc: dict) -> str:
    """Latency ratios and the time breakdown as Markdown tables."""
    m = doc["machine"]
    out = [f"# Model benchmark: {os.path.basename(doc['model'])}", ""]
    out.append(f"- inputs: {', '.join(f'{k} {v}' for k, v in doc['inputs'].items())}; "
               f"onnxruntime {m['versions']['onnxruntime']}, {m['cpu']} "
               f"({', '.join(m['cpu_simd_flags']) or 'no SIMD flags'}); {m['time']}")
    o = doc["options"]
    before, after = doc["load_average_before"][0], doc["load_average_after"][0]
    runs = doc["results"][0]["runs"]
    warm_runs = o.get("warm_runs", 0)
    turn = "one cold run" + (f" and {warm_runs} warm runs" if warm_runs else "")
    shared = harness.uses_shared_pool(o["threads"], o.get("thread_pool", "session"))
    shared_text = " (one pool shared by every model)" if shared else ""
    out.append(f"- execution provider {o.get('ep', CPU_EP)}; intra-op threads "
               f"{o['threads'] or 'default'}"
               f"{shared_text}"
               f"; {runs} interleaved "
               f"rounds after {o['warmup']} warm-up runs, each turn {turn}; profile: per-node "
               f"median of {o['profile_runs']} turns (their first runs; the warm runs' "
               f"medians beside them where shown), in separate sessions run the same way; "
               f"load average {before:.1f} before, "
               f"{after:.1f} after")
    pages = harness.memory_pages_phrase(doc.get("memory_pages"))
    if pages:
        out.append(f"- {pages}")
    if warm_runs:
        out.append("- cold: each turn's first run, after the other models ran (caches hold "
                   "their data); warm: the median of the turn's next runs (a model run back to "
                   "back). ×float and its (best) / (paired) are cold; ×float (warm) is the "
                   "median warm time / the float model's, (warm, paired) the median over "
                   "rounds of the two turns' warm times")
    out.append("- ×float: median latency / the float model's median, from the same rounds; "
               "(best): the same from each one's fastest run; (paired): the median over rounds "
               "of this run / the float run of the same round; node time ×float: summed "
               "per-node median kernel times from the profiler / the float model's. Shares "
               "are of the summed per-node kernel time; layout = ReorderInput + ReorderOutput; extra layout = "
               "its time beyond the float model's, as a share of the float model's node time")
    if o.get("neg_floor"):
        out.append(f"- {NEG_FLOOR}: the same model with Neg in place of each of our nodes (one "
                   "read and one write of the same tensors, no arithmetic): the least any "
                   "separate node in those places costs when it writes a buffer of its own "
                   "(ours may run in place); its outputs are not meaningful")
    out.append("")
    control = any("ratio_to_float_nchwc" in r for r in doc["results"])
    warm = any("ratio_to_float_warm" in r for r in doc["results"])
    head = ["variant", "median ms", "×float", "×float (best)", "×float (paired)"] + \
        (["warm ms", "×float (warm)", "×float (warm, paired)"] if warm else []) + \
        ["node time ×float"] + \
        (["×float+nchwc", "×float+nchwc (best)"] if control else []) + \
        ["our nodes", "our share", "layout nodes", "layout share", "extra layout",
         "max |Δ| vs float"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for r in doc["results"]:
        p = r["profile"]
        diff = "–" if r["variant"] == "float" else f"{r['max_abs_diff_vs_float']:.3g}"
        if "bit_identical_to_same_as" in r:
            diff += (" (bits = " if r["bit_identical_to_same_as"] else " (bits ≠ ") + \
                f"{r['same_as']})"
        ctl = f"{r['ratio_to_float_nchwc']:.3f} | {r['ratio_to_float_nchwc_best']:.3f} | " \
            if control else ""
        hot = f"{r['warm_median_s'] * 1e3:.2f} | {r['ratio_to_float_warm']:.3f} | " \
            f"{r['ratio_to_float_warm_paired']:.3f} | " if warm else ""
        out.append(f"| {r['variant']} | {r['median_s'] * 1e3:.2f} | {r['ratio_to_float']:.3f} | "
                   f"{r['ratio_to_float_best']:.3f} | {r['ratio_to_float_paired']:.3f} | "
                   f"{hot}{r['node_time_ratio_to_float']:.3f} | {ctl}{p['ours_nodes']} | "
                   f"{p['ours_share']:.1%} | {p['layout_nodes']} | {p['layout_share']:.1%} | "
                   f"{r['layout_extra_vs_float_node_time']:+.1%} | {diff} |")
    out.append("")
    above = [r for r in doc["results"] if "ratio_to_neg_floor_paired" in r]
    if above:
        out += _floor_table(above)
    paired = [r for r in doc["results"] if r.get("nodes_vs_neg_floor")]
    if paired:
        out += _node_floor_table(paired)
    if any("bit_identical_to_cpu" in r for r in doc["results"]):
        out.append(f"## On {o['ep']} against the CPU provider (same model, same inputs)")
        out.append("")
        out.append("| variant | our nodes ran on | same bits | max |Δ| vs CPU | "
                   "arg-max agreement |")
        out.append("|---|---|---|---|---|")
        for r in doc["results"]:
            where = ", ".join(f"{p_.replace('ExecutionProvider', '')} {n}"
                              for p_, n in r["profile"].get("ours_providers", {}).items())
            agree = r["argmax_agreement_vs_cpu"]
            out.append(f"| {r['variant']} | {where or '–'} | "
                       f"{'yes' if r['bit_identical_to_cpu'] else 'no'} | "
                       f"{r['max_abs_diff_vs_cpu']:.3g} | "
                       f"{'–' if agree is None else f'{agree:.4f}'} |")
        out.append("")
    out.append("## Our nodes and layout conversions by input size (nodes: ms per run, "
               "elements/ns)")
    out.append("")
    head = ["variant", "group"] + list(SIZE_BUCKETS)
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for r in doc["results"]:
        for group in ("ours", "layout"):
            cells = r["profile"]["by_size"].get(group, {})
            if not cells:
                continue
            row = [f"{c['nodes']}: {c['seconds'] * 1e3:.3f} ms, "
                   f"{c['elements'] / c['seconds'] * 1e-9:.2f}" if (c := cells.get(b)) and
                   c["seconds"] > 0 else "–" for b in SIZE_BUCKETS]
            out.append(f"| {r['variant']} | {group} | " + " | ".join(row) + " |")
    out.append("")
    out.append("## Time by op type (ms per run, share)")
    out.append("")
    ops: list[str] = []
    for r in doc["results"]:
        for op in r["profile"]["ops"]:
            if op not in ops:
                ops.append(op)
    head = ["op type"] + [r["variant"] for r in doc["results"]]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for op in ops[:20]:
        cells = []
        for r in doc["results"]:
            o_ = r["profile"]["ops"].get(op)
            cells.append("–" if o_ is None else
                         f"{o_['seconds'] * 1e3:.2f} ({o_['share']:.0%}, {o_['nodes']})")
        out.append(f"| {op} | " + " | ".join(cells) + " |")
    out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def _parse_shapes(items: list[str]) -> dict[str, list[int]]:
    from ort_mx_ops.quantizer.nchwc import parse_shapes
    try:
        return parse_shapes(items)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ort-mx-bench --model",
        description="Model-level benchmark: quantize a model with each configuration and "
                    "measure quantized vs float batch-1 latency (interleaved, one process) "
                    "and where the time goes (onnxruntime's profiler).")
    p.add_argument("--model", required=True, help="ONNX model (float)")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help=f"comma separated of {', '.join(CONFIGS)}, or 'all'")
    p.add_argument("--shape", action="append", default=[],
                   help="input shape NAME=1x3x48x320 (repeatable); free axes of float inputs "
                        "need one, batch axes default to 1")
    p.add_argument("--seq-len", type=int, default=128,
                   help="length of free non-batch axes of integer (token) inputs")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads (default 1: steadier on a shared machine; 0: ORT's)")
    p.add_argument("--thread-pool", choices=harness.THREAD_POOLS, default="shared",
                   help="with several threads: shared (default) runs every model's session "
                        "on one pool, session gives each its own (see the op benchmark)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=40, help="interleaved timed rounds, at least")
    p.add_argument("--warm-runs", type=int, default=4,
                   help="runs per turn after the first (cold) one, timed as the warm latency "
                        "(a model run back to back); 0: cold runs only (default: %(default)s)")
    p.add_argument("--min-time", type=float, default=5.0,
                   help="seconds of timed rounds, at least (up to --max-rounds)")
    p.add_argument("--max-rounds", type=int, default=1000)
    p.add_argument("--profile-runs", type=int, default=20)
    p.add_argument("--extra", action="append", default=[],
                   help="LABEL=PATH: another prepared model to time beside them")
    p.add_argument("--nchwc", action="store_true",
                   help="also time each config pre-optimised with our nodes inside "
                        "onnxruntime's NCHWc layout (ort_mx_ops.quantizer.nchwc)")
    p.add_argument("--neg-floor", action="store_true",
                   help="also time each BFP / MX model (and its --nchwc form) with Neg in place "
                        "of each of our nodes: one read and one write of the same tensors, no "
                        "arithmetic, the least any separate node writing a buffer of its own "
                        "there costs (label +neg; its outputs are not meaningful)")
    p.add_argument("--ep", default="CPU",
                   help="execution provider to time and profile: CPU, CUDA or ROCM (or its "
                        "full name); on a GPU provider every model also runs once on the CPU "
                        "provider to compare outputs (default: %(default)s)")
    p.add_argument("--tiny", action="store_true", help="smoke run: few rounds (CI)")
    p.add_argument("--out", default="bench-results", help="output folder")
    p.add_argument("--quiet", action="store_true")
    return p


def resolve_ep(name: str) -> str:
    """The full provider name of ``name`` (CPU, CUDA, ROCM or a full name) where this
    onnxruntime has it; SystemExit with the reason otherwise."""
    full = name if name.endswith("ExecutionProvider") else f"{name.upper()}ExecutionProvider"
    full = {k.upper(): k for k in EP_DEVICE}.get(full.upper(), full)
    if full not in EP_DEVICE:
        raise SystemExit(f"--ep: unknown execution provider {name!r}; known: "
                         f"{', '.join(EP_DEVICE)}")
    have = ort.get_available_providers()
    if full not in have:
        raise SystemExit(f"--ep: {full} is not in this onnxruntime ({', '.join(have)})")
    device = EP_DEVICE[full][0]
    if device not in ort_mx_ops.available_devices():
        raise SystemExit(f"--ep: {full} needs the {device} library of ort-mx-ops, which this "
                         "installation does not have (it is built where its compiler was "
                         "found at install time)")
    return full


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    configs = list(CONFIGS) if args.configs == "all" else \
        [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit(f"unknown config {c!r}; known: {', '.join(CONFIGS)}")
    extra = {}
    for item in args.extra:
        label, sep, path = item.partition("=")
        if not sep or not label or not os.path.isfile(path):
            raise SystemExit(f"--extra wants LABEL=PATH of an existing model, got {item!r}")
        extra[label] = path
    if args.warm_runs < 0:
        raise SystemExit(f"--warm-runs must be 0 or more, got {args.warm_runs}")
    ep = resolve_ep(args.ep)
    if args.nchwc and ep != CPU_EP:
        raise SystemExit("--nchwc: onnxruntime's NCHWc layout is the CPU provider's; "
                         f"leave it out with --ep {args.ep}")
    warmup, rounds, min_time, profile_runs = (1, 3, 0.0, 2) if args.tiny else \
        (args.warmup, args.rounds, args.min_time, args.profile_runs)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    opts = ModelOptions(model=args.model, configs=configs, shapes=_parse_shapes(args.shape),
                        seq_len=args.seq_len, threads=args.threads,
                        thread_pool=args.thread_pool, warmup=warmup,
                        rounds=rounds, warm_runs=args.warm_runs, min_time=min_time,
                        max_rounds=max(rounds, args.max_rounds),
                        profile_runs=profile_runs, extra_models=extra, nchwc=args.nchwc,
                        neg_floor=args.neg_floor, ep=ep, log=log)
    try:
        doc = run_model_bench(opts)
    except (FileNotFoundError, ValueError) as exc:
        print(f"ort-mx-bench: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model_results.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "model_results.md").write_text(markdown(doc))
    log(markdown(doc))
    log(f"wrote {out / 'model_results.json'}, {out / 'model_results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
