"""File size, batch-1 latency, peak memory and output identity of the weight storages.

For each model and configuration: the float model, the folded model (``weight_storage=
"folded"``), the packed one (``"packed"``, same activations) and, where standard ONNX has a
kernel, the ``"onnx"`` one (weights only, ``activation=None``: runs with no custom-op library).
Latency is the median of interleaved batch-1 runs, as a ratio to the model it replaces;
"same optimized graph" saves the graph onnxruntime runs for the expanded and the folded model
and compares them node by node and constant by constant (equal graphs: equal latency up to
noise);
"identical" compares every output bit for bit on the same input (packed ops: with
onnxruntime's ConvBNFusion off, which rewrites only constant, i.e. folded, Conv weights). The ``onnx`` form is
compared with the weights-only folded model converted to the same opset, in sessions with
``session.disable_quant_qdq=1`` (otherwise onnxruntime fuses DequantizeLinear + MatMul into
an int8 kernel of its own). Peak memory is the peak RSS (VmHWM) of a fresh process that loads
the model (the expanded form: loads the packed file and expands it in that process) and runs
it 10 times.

    python benchmarks/weight_storage.py [--models rec det] [--configs MXFP4E2M1 ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

import ort_mx_ops
from ort_mx_ops.formats import CONFIGS
from ort_mx_ops.quantizer import get_config, quantize_model
from ort_mx_ops.quantizer.storage import (StoredWeight, apply_weight_storage,
                                           check_weight_storage,
                                           expand_packed_weights)

MODELS = {"rec": ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
          "det": ("ch_PP-OCRv4_det_infer.onnx", (1, 3, 256, 256)),
          "cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192))}

_RSS_SCRIPT = r"""
import sys, numpy as np, onnx, onnxruntime as ort
path, libs, shape, expand = sys.argv[1], [l for l in sys.argv[2].split(',') if l], sys.argv[3], sys.argv[4]
so = ort.SessionOptions(); so.intra_op_num_threads = 1
so.add_session_config_entry('session.disable_quant_qdq', '1')
for l in libs: so.register_custom_ops_library(l)
if expand == '1':
    from ort_mx_ops.quantizer.storage import expand_packed_weights
    model = expand_packed_weights(onnx.load(path)).SerializeToString()
else:
    model = path
s = ort.InferenceSession(model, so, providers=['CPUExecutionProvider'])
del model
x = np.random.default_rng(0).random(tuple(int(d) for d in shape.split('x')), dtype=np.float32)
for _ in range(10): s.run(None, {s.get_inputs()[0].name: x})
# VmHWM: this process's peak RSS (ru_maxrss would include the parent's from before exec).
print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))
"""


def _model_path(key: str) -> str:
    import importlib.util
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        raise SystemExit("this benchmark reads its models from the rapidocr-onnxruntime package")
    return os.path.join(os.path.dirname(spec.origin), "models", MODELS[key][0])


def _session(path: str, libs: Sequence[str], disabled: Sequence[str] = ()):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    for lib in libs:
        so.register_custom_ops_library(lib)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled))


def _peak_rss_mb(path: str, libs: Sequence[str], shape: tuple[int, ...],
                 expand: bool = False) -> float:
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, path, ",".join(libs),
                          "x".join(map(str, shape)), "1" if expand else "0"], check=True,
                         capture_output=True, text=True)
    return int(out.stdout.split()[-1]) / 1024


def _latencies(paths: Sequence[str], libs: Sequence[list[str]], x: np.ndarray,
               runs: int) -> list[float]:
    """Median batch-1 latency of each model, runs interleaved so drift hits all alike."""
    sessions = [_session(p, l) for p, l in zip(paths, libs)]
    feeds = [{s.get_inputs()[0].name: x} for s in sessions]
    times: list[list[float]] = [[] for _ in sessions]
    for s, f in zip(sessions, feeds):
        s.run(None, f)  # warm-up
    for _ in range(runs):
        for i, (s, f) in enumerate(zip(sessions, feeds)):
            t = time.perf_counter()
            s.run(None, f)
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times]


def optimized_graph(model: str, libs: Sequence[str], workdir: str) -> list[tuple]:
    """The graph onnxruntime runs for ``model`` (a path) after its optimizations, as comparable
    data: each node's type, domain, attributes and inputs, with every constant input replaced
    by a digest of its bytes. Two models with the same optimized graph run the same kernels on
    the same constants, so their latency differs only by noise."""
    import hashlib

    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    for lib in libs:
        so.register_custom_ops_library(lib)
    out = os.path.join(workdir, "optimized_" + os.path.basename(model))
    so.optimized_model_filepath = out
    so.log_severity_level = 3  # the "hardware-specific NCHWc layout" warning of saving
    ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    m = onnx.load(out)
    os.remove(out)
    const = {t.name: f"{list(t.dims)}:{hashlib.sha256(numpy_helper.to_array(t).tobytes()).hexdigest()}"
             for t in m.graph.initializer}
    return [(n.op_type, n.domain, tuple(const.get(i, i) for i in n.input),
             tuple(a.SerializeToString() for a in n.attribute)) for n in m.graph.node]


def _outputs(path: str, libs: Sequence[str], x: np.ndarray,
             disabled: Sequence[str] = ()) -> list[np.ndarray]:
    s = _session(path, libs, disabled)
    return s.run(None, {s.get_inputs()[0].name: x})


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(u.shape == v.shape and u.tobytes() == v.tobytes() for u, v in zip(a, b))


def _stored(summary, cfg) -> list[StoredWeight]:
    return [StoredWeight(r.output, cfg.weight, r.axis, r.flatten)
            for r in summary.sites if r.kind == "weight" and r.folded]


def _write(model: onnx.ModelProto, path: str) -> int:
    onnx.checker.check_model(model)
    onnx.save_model(model, path)
    return os.path.getsize(path)


def measure(key: str, config: str, libs: list[str], tmp: str, runs: int) -> dict:
    """One table row: sizes, latency ratios, identity and peak RSS of every storage."""
    src = _model_path(key)
    shape = MODELS[key][1]
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    row: dict = {"model": key, "config": config, "float_bytes": os.path.getsize(src)}
    cfg = get_config(config)
    s = quantize_model(src, None, cfg)
    folded = os.path.join(tmp, f"{key}_{config}_folded.onnx")
    row["folded_bytes"] = _write(s.model, folded)
    packed_model = onnx.ModelProto()
    packed_model.CopyFrom(s.model)
    apply_weight_storage(packed_model, _stored(s, cfg), "packed")
    packed = os.path.join(tmp, f"{key}_{config}_packed.onnx")
    row["packed_bytes"] = _write(packed_model, packed)
    # The packed file expanded at load time (expand_packed_weights): constant weights again.
    expanded = os.path.join(tmp, f"{key}_{config}_expanded.onnx")
    t = time.perf_counter()
    _write(expand_packed_weights(onnx.load(packed)), expanded)
    row["expand_seconds"] = time.perf_counter() - t
    lat = _latencies([folded, packed, expanded], [libs, libs, libs], x, runs)
    row["packed_latency_x"] = lat[1] / lat[0]
    row["expanded_latency_x"] = lat[2] / lat[0]
    ref = _outputs(folded, libs, x)
    row["packed_identical_defaults"] = _same(ref, _outputs(packed, libs, x))
    # onnxruntime folds BatchNormalization into a Conv's constant (folded) weight, not into
    # a decoded one: compare with that rewrite off.
    no_bn = ["ConvBNFusion"]
    row["packed_identical"] = _same(_outputs(folded, libs, x, no_bn),
                                    _outputs(packed, libs, x, no_bn))
    row["expanded_identical"] = _same(ref, _outputs(expanded, libs, x))
    row["expanded_same_graph"] = optimized_graph(expanded, libs, tmp) == \
        optimized_graph(folded, libs, tmp)
    row["rss_folded_mb"] = _peak_rss_mb(folded, libs, shape)
    row["rss_packed_mb"] = _peak_rss_mb(packed, libs, shape)
    row["rss_expanded_mb"] = _peak_rss_mb(packed, libs, shape, expand=True)
    try:
        check_weight_storage("onnx", cfg.weight)
    except ValueError:
        return row
    wcfg = get_config(config, activation=None)
    ws = quantize_model(src, None, wcfg)
    onnx_model = onnx.ModelProto()
    onnx_model.CopyFrom(ws.model)
    row["onnx_notes"] = apply_weight_storage(onnx_model, _stored(ws, wcfg), "onnx")
    onnx_path = os.path.join(tmp, f"{key}_{config}_onnx.onnx")
    row["onnx_bytes"] = _write(onnx_model, onnx_path)
    # The folded weights-only model at the onnx form's opset (raised to 21 unless every
    # weight stayed in a Cast form): the arithmetic of the model's own ops may change with it.
    from onnx import version_converter
    opset = next(o.version for o in onnx_model.opset_import if o.domain in ("", "ai.onnx"))
    same_opset = version_converter.convert_version(ws.model, opset)
    base = os.path.join(tmp, f"{key}_{config}_wfolded21.onnx")
    _write(same_opset, base)
    lat = _latencies([base, onnx_path], [[], []], x, runs)
    row["onnx_latency_x"] = lat[1] / lat[0]
    row["onnx_identical"] = _same(_outputs(base, [], x), _outputs(onnx_path, [], x))
    row["rss_onnx_mb"] = _peak_rss_mb(onnx_path, [], shape)
    return row


def _mb(n: Optional[int]) -> str:
    return "–" if n is None else f"{n / 1e6:.2f}"


def markdown(rows: list[dict]) -> str:
    head = ("| model | config | float MB | folded MB | packed MB | onnx MB | packed latency × "
            "folded (ops / expanded at load) | onnx latency × folded | packed identical (ops / "
            "expanded) | expanded: same optimized graph as folded | onnx identical | peak RSS MB "
            "folded / packed ops / expanded / onnx |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---|")
    lines = [head]
    for r in rows:
        yn = {True: "yes", False: "no", None: "–"}
        onnx_lat = f"{r['onnx_latency_x']:.2f}" if "onnx_latency_x" in r else "–"
        rss = f"{r['rss_folded_mb']:.0f} / {r['rss_packed_mb']:.0f} / " \
            f"{r['rss_expanded_mb']:.0f} / " + \
            (f"{r['rss_onnx_mb']:.0f}" if "rss_onnx_mb" in r else "–")
        lines.append(
            f"| {r['model']} | {r['config']} | {_mb(r['float_bytes'])} | "
            f"{_mb(r['folded_bytes'])} | {_mb(r['packed_bytes'])} | {_mb(r.get('onnx_bytes'))} "
            f"| {r['packed_latency_x']:.2f} / {r['expanded_latency_x']:.2f} | {onnx_lat} | "
            f"{yn[r['packed_identical']]}{'' if r['packed_identical_defaults'] else '¹'} / "
            f"{yn[r['expanded_identical']]} | {yn[r['expanded_same_graph']]} | "
            f"{yn[r.get('onnx_identical')]} | {rss} |")
    lines.append("\n¹ identical with onnxruntime's ConvBNFusion off; with it on, onnxruntime "
                 "folds BatchNormalization into the folded model's constant Conv weights only.")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["rec", "det"], choices=sorted(MODELS))
    p.add_argument("--configs", nargs="+", default=list(CONFIGS))
    p.add_argument("--runs", type=int, default=30, help="timed runs per model (median)")
    p.add_argument("--library", action="append", default=None,
                   help="custom-op libraries to register (default: ort_mx_ops' CPU library)")
    p.add_argument("--json", help="also write the rows as JSON")
    args = p.parse_args(argv)
    libs = args.library or [ort_mx_ops.get_library_path()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.models:
            for config in args.configs:
                rows.append(measure(key, config, libs, tmp, args.runs))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(markdown(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
