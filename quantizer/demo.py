"""``ort-mx-demo``: quantize a real pretrained model with every configuration and compare.

Default: the PP-OCRv4 text recognizer that the ``rapidocr-onnxruntime`` package ships (read
from the installed package, never downloaded), evaluated on text lines rendered here
(:mod:`.ocr_data`): character accuracy and exact-line accuracy by greedy CTC decoding,
agreement with the float model, model size and latency relative to float.  Everything runs
offline.  ``--model`` points it at another model: one with a CTC character list (in its
``character`` metadata or ``--dict``) gets the same OCR evaluation; any other is fed
``--data`` (an .npz of input arrays, samples along axis 0) or random inputs and compared
with its float outputs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, asdict
from typing import Any, Optional, Sequence

import numpy as np
import onnx

from .calibration import NpzReader
from .config import config_names
from .progress import ProgressBar
from .quantize import quantize_model

__all__ = ["main", "find_rapidocr_recognizer", "Row"]


def find_rapidocr_recognizer() -> str:
    """Path of the PP-OCRv4 recognizer inside the installed ``rapidocr_onnxruntime``
    package; raises ``RuntimeError`` saying how to install it when absent."""
    import importlib.util
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.origin:
        raise RuntimeError("the demo's default model comes with the rapidocr-onnxruntime "
                           "package: pip install rapidocr-onnxruntime pillow, or "
                           "pip install \".[demo]\" in the source tree (or pass --model)")
    models = os.path.join(os.path.dirname(spec.origin), "models")
    found = sorted(f for f in os.listdir(models) if "rec" in f and f.endswith(".onnx")) \
        if os.path.isdir(models) else []
    if not found:
        raise RuntimeError(f"no text recognizer (*rec*.onnx) under {models}")
    v4 = [f for f in found if "v4" in f.lower()]
    return os.path.join(models, (v4 or found)[0])


def _characters(model_path: str, dict_path: Optional[str]) -> Optional[list[str]]:
    """The CTC alphabet, index i+1 -> characters[i]: ``--dict`` lines, else the model's
    ``character`` metadata, followed by the space class PaddleOCR appends."""
    if dict_path:
        with open(dict_path, encoding="utf-8") as f:
            chars = [line.rstrip("\r\n") for line in f]
    else:
        m = onnx.load(model_path, load_external_data=False)
        meta = {p.key: p.value for p in m.metadata_props}
        if "character" not in meta:
            return None
        chars = meta["character"].splitlines()
    return chars + [" "]


@dataclass
class Row:
    """One line of the result table."""
    config: str
    placement: str
    file_mb: float
    weights_packed_mb: Optional[float]
    metrics: dict[str, float]
    latency_ms: Optional[float] = None       # None: not timed (--timing-rounds 0)
    latency_vs_float: Optional[float] = None
    quantize_s: float = 0.0
    runtime_nodes: int = 0
    notes: list[str] = field(default_factory=list)


CPU_EP = "CPUExecutionProvider"


def _session(path: str, threads: int, custom_ops: bool, ep: str = CPU_EP):
    """A session on ``ep`` (a GPU provider keeps the CPU provider behind it), with our library
    for that provider's device registered where the model needs it."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    if custom_ops:
        import ort_mx_ops
        from ort_mx_ops.benchmarks.harness import EP_DEVICE
        ort_mx_ops.register(so, EP_DEVICE[ep][0])
    # The rendered lines differ in width: cuDNN's default exhaustive algorithm search would
    # run again for every new input shape, so the CUDA provider takes its heuristic choice.
    gpu = (ep, {"cudnn_conv_algo_search": "HEURISTIC"}) if ep == "CUDAExecutionProvider" else ep
    providers = [ep] if ep == CPU_EP else [gpu, CPU_EP]
    return ort.InferenceSession(path, sess_options=so, providers=providers)


def _run_all(path: str, feeds: list[dict[str, np.ndarray]], threads: int, custom_ops: bool,
             label: str, progress: bool, ep: str = CPU_EP) -> list[np.ndarray]:
    """First output of ``path`` for every feed."""
    sess = _session(path, threads, custom_ops, ep)
    outs = []
    bar = ProgressBar(f"  {label:<22}", len(feeds), enabled=progress)
    for feed in feeds:
        outs.append(sess.run(None, feed)[0])
        bar.update()
    bar.close()
    return outs


def time_interleaved(models: list[tuple[str, bool]], feeds: list[dict[str, np.ndarray]],
                     threads: int, rounds: int, ep: str = CPU_EP) -> list[tuple[float, float]]:
    """Batch-1 latency of each model, timed interleaved so that every model sees the same
    machine load: ``rounds`` times, each feed runs once on every model in turn.  ``models``
    is ``(path, needs_custom_ops)`` with the reference model first.  Returns, per model, the
    median latency of one run (ms) and the median over feeds and rounds of its time divided
    by the reference's time on the same feed in the same round (a paired ratio, steadier
    than a ratio of medians on a shared machine)."""
    sessions = [_session(path, threads, custom, ep) for path, custom in models]
    for sess in sessions:
        sess.run(None, feeds[0])  # warm-up: first-run allocations do not count
    times: list[list[float]] = [[] for _ in models]
    for _ in range(rounds):
        for feed in feeds:
            for k, sess in enumerate(sessions):
                t = time.perf_counter()
                sess.run(None, feed)
                times[k].append((time.perf_counter() - t) * 1e3)
    return [(statistics.median(ts),
             statistics.median(t / r for t, r in zip(ts, times[0]))) for ts in times]


class OcrTask:
    """Rendered text lines, CTC decoding, character and line accuracy."""

    def __init__(self, model_path: str, characters: list[str], lines: int, seed: int,
                 fonts: Sequence[str]) -> None:
        from .ocr_data import render_lines, preprocess, load_fonts
        m = onnx.load(model_path, load_external_data=False)
        self.input_name = m.graph.input[0].name
        self.characters = characters
        self.lines = render_lines(lines, seed=seed, fonts=load_fonts(fonts),
                                  charset=set(characters))
        self.feeds = [{self.input_name: preprocess(l.image)} for l in self.lines]
        self.description = (f"{lines} rendered text lines (seed {seed}, Pillow's built-in font"
                            f"{' + ' + ', '.join(fonts) if fonts else ''})")

    def metrics(self, outs: list[np.ndarray], ref: Optional[list[np.ndarray]]) -> dict[str, float]:
        from .ocr_data import ctc_greedy_decode, edit_distance
        preds = [ctc_greedy_decode(o, self.characters)[0].strip() for o in outs]
        truth = [l.text for l in self.lines]
        dist = sum(edit_distance(p, t) for p, t in zip(preds, truth))
        total = sum(len(t) for t in truth)
        m = {"char_acc": max(0.0, 1.0 - dist / total),
             "line_acc": float(np.mean([p == t for p, t in zip(preds, truth)]))}
        if ref is not None:
            ref_preds = [ctc_greedy_decode(o, self.characters)[0].strip() for o in ref]
            m["same_text_as_float"] = float(np.mean([p == r for p, r in zip(preds, ref_preds)]))
            m["frame_agreement"] = float(np.mean(np.concatenate(
                [(o.argmax(-1) == r.argmax(-1)).ravel() for o, r in zip(outs, ref)])))
        return m

    columns = [("char_acc", "char acc"), ("line_acc", "line acc"),
               ("same_text_as_float", "same text as float"),
               ("frame_agreement", "frame argmax = float")]


class GenericTask:
    """User inputs (an .npz, samples along axis 0) or random ones; agreement with float."""

    def __init__(self, model_path: str, data: Optional[str], samples: int, seed: int) -> None:
        m = onnx.load(model_path, load_external_data=False)
        inits = {i.name for i in m.graph.initializer}
        inputs = [i for i in m.graph.input if i.name not in inits]
        rng = np.random.default_rng(seed)
        self.feeds: list[dict[str, np.ndarray]] = []
        if data:
            reader = NpzReader(data, batch_size=1)
            self.feeds = list(iter(reader.get_next, None))
            self.description = f"{len(self.feeds)} samples from {data}"
        else:
            for _ in range(samples):
                feed = {}
                for i in inputs:
                    t = i.type.tensor_type
                    shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
                             for d in t.shape.dim]
                    dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
                    feed[i.name] = rng.standard_normal(shape).astype(dtype)
                self.feeds.append(feed)
            self.description = f"{samples} random inputs (dynamic dimensions set to 1)"

    def metrics(self, outs: list[np.ndarray], ref: Optional[list[np.ndarray]]) -> dict[str, float]:
        if ref is None:
            return {}
        cos, top1, err = [], [], []
        for o, r in zip(outs, ref):
            a, b = o.astype(np.float64).ravel(), r.astype(np.float64).ravel()
            denom = np.linalg.norm(a) * np.linalg.norm(b)
            cos.append(float(a @ b / denom) if denom else float(np.array_equal(a, b)))
            if o.ndim >= 1 and o.shape[-1] > 1:
                top1.append(float(np.mean(o.argmax(-1) == r.argmax(-1))))
            err.append(float(np.max(np.abs(a - b))) if a.size else 0.0)
        return {"cosine_to_float": float(np.mean(cos)),
                "top1_agreement": float(np.mean(top1)) if top1 else float("nan"),
                "max_abs_err": float(np.max(err))}

    columns = [("cosine_to_float", "cosine to float"), ("top1_agreement", "top-1 = float"),
               ("max_abs_err", "max abs err")]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def render_table(rows: list[Row], columns: list[tuple[str, str]]) -> list[list[str]]:
    head = ["config", "placement", "file MB", "weights packed MB"] + [c[1] for c in columns] + \
        ["latency ms", "x float", "runtime nodes", "quantize s"]
    body = [head]
    for r in rows:
        body.append([r.config, r.placement, f"{r.file_mb:.2f}",
                     "-" if r.weights_packed_mb is None else f"{r.weights_packed_mb:.2f}"] +
                    [_fmt(r.metrics.get(k, float("nan"))) if k in r.metrics else "-"
                     for k, _ in columns] +
                    (["-", "-"] if r.latency_ms is None else
                     [f"{r.latency_ms:.1f}", f"{r.latency_vs_float:.2f}"]) + [str(r.runtime_nodes),
                     f"{r.quantize_s:.1f}" if r.placement != "-" else "-"])
    return body


def _plain(table: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    fmt = lambda row: "  ".join(c.ljust(w) if i < 2 else c.rjust(w)  # noqa: E731
                                for i, (c, w) in enumerate(zip(row, widths)))
    return "\n".join([fmt(table[0]), "  ".join("-" * w for w in widths)] +
                     [fmt(r) for r in table[1:]])


def _markdown(table: list[list[str]]) -> str:
    lines = ["| " + " | ".join(table[0]) + " |",
             "|" + "|".join("---" if i < 2 else "---:" for i in range(len(table[0]))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in table[1:]]
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="ort-mx-demo", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="float ONNX model (default: rapidocr's PP-OCRv4 recognizer)")
    p.add_argument("--configs", nargs="+", default=None, metavar="NAME",
                   help=f"configurations to run (default: all: {' '.join(config_names())})")
    p.add_argument("--lines", type=int, default=100,
                   help="text lines to render and recognize (default 100; more is steadier)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--font", action="append", default=[], metavar="FILE",
                   help="extra .ttf/.otf font to render with (repeatable)")
    p.add_argument("--dict", help="CTC character list, one per line (default: model metadata)")
    p.add_argument("--data", help="generic mode: .npz of input arrays, samples along axis 0")
    p.add_argument("--samples", type=int, default=20, help="generic mode: random samples")
    p.add_argument("--compare-quark", nargs="*", default=None, metavar="NAME",
                   help="also run these configs with Quark's placement and runtime weight "
                        "nodes (no names: MXFP8E4M3 and BFP16)")
    p.add_argument("--rows", nargs="+", default=[], metavar="SPEC",
                   help="extra rows with the accuracy algorithms, each CONFIG[/A=ACT][+ALGO...]"
                        " with ALGO gptq, bc (bias correction), cle (cross-layer equalization), "
                        "hadamard (block rotation of MatMul/Gemm) or adaquant; a *_ADAQUANT "
                        "config runs fast finetune; e.g. MX6+gptq MXFP4E2M1/A=MXINT8+gptq "
                        "MXFP8E4M3_ADAQUANT. Calibrated on --calib-lines other rendered lines "
                        "(generic mode: --calib-data or --samples other random inputs)")
    p.add_argument("--calib-lines", type=int, default=32,
                   help="rendered lines to calibrate the --rows with (default 32), never "
                        "the evaluated ones")
    p.add_argument("--calib-data", help="generic mode: .npz of calibration inputs for --rows")
    p.add_argument("--ff", action="append", default=[], metavar="KEY=VALUE",
                   help="fast finetune option for the adaquant rows (as ort-mx-quantize --ff)")
    p.add_argument("--ep", default="CPU",
                   help="execution provider to run and time the models on: CPU, CUDA or ROCM "
                        "(default CPU); on a GPU provider every model also runs on the CPU "
                        "and a column gives how often the two agree")
    p.add_argument("--threads", type=int, default=0,
                   help="onnxruntime intra-op threads (default: onnxruntime's choice)")
    p.add_argument("--timing-lines", type=int, default=20,
                   help="inputs timed per round, for the latency columns (default 20)")
    p.add_argument("--timing-rounds", type=int, default=3,
                   help="rounds of interleaved timing: each round runs every timed input "
                        "once on every model in turn (default 3; 0: no latency columns)")
    p.add_argument("--out-dir", default="demo_results",
                   help="where the Markdown and JSON tables go (default ./demo_results)")
    p.add_argument("--keep-models", action="store_true",
                   help="keep the quantized models in --out-dir/models")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if args.timing_rounds < 0 or args.timing_lines < 1:
        p.error("--timing-rounds must be >= 0 and --timing-lines >= 1")
    return args


def parse_row(spec: str) -> tuple[str, dict[str, Any]]:
    """``CONFIG[/A=ACT][+ALGO...]`` -> (config name, quantize_model options)."""
    head, *algos = spec.split("+")
    name, _, act = head.partition("/A=")
    opts: dict[str, Any] = {}
    if act:
        opts["activation"] = act
    for algo in algos:
        if algo == "gptq":
            opts["weight_rounding"] = "gptq"
        elif algo == "bc":
            opts["bias_correction"] = True
        elif algo == "adaquant":
            opts["fast_finetune"] = True
        elif algo == "cle":
            opts["cross_layer_equalization"] = True
        elif algo == "hadamard":
            opts["hadamard_rotation"] = True
        else:
            raise ValueError(f"--rows {spec!r}: unknown algorithm {algo!r} "
                             "(gptq, bc, cle, hadamard, adaquant)")
    return name, opts


class _ListReader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds = list(feeds)

    def get_next(self) -> Optional[dict[str, np.ndarray]]:
        return self.feeds.pop(0) if self.feeds else None


def _calibration(args: argparse.Namespace, model_path: str, task: Any,
                 chars: Optional[list[str]]) -> list[dict[str, np.ndarray]]:
    """Calibration inputs for the --rows: rendered lines (another seed, none of the evaluated
    texts) or the generic mode's --calib-data / other random inputs."""
    if chars is not None:
        cal = OcrTask(model_path, chars, args.calib_lines, args.seed + 1000, args.font)
        seen = {line.text for line in task.lines}
        return [f for f, line in zip(cal.feeds, cal.lines) if line.text not in seen]
    if args.calib_data:
        return GenericTask(model_path, args.calib_data, 0, 0).feeds
    return GenericTask(model_path, None, args.samples, args.seed + 1000).feeds


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the demo; prints the table and writes ``<out-dir>/demo.md`` and ``demo.json``."""
    args = parse_args(argv)
    from ort_mx_ops.benchmarks.model_bench import resolve_ep
    ep = resolve_ep(args.ep)
    t_start = time.perf_counter()
    model_path = args.model or find_rapidocr_recognizer()
    configs = args.configs or config_names()
    chars = _characters(model_path, args.dict) if not args.data else None
    task: Any
    if chars is not None:
        task = OcrTask(model_path, chars, args.lines, args.seed, args.font)
    else:
        task = GenericTask(model_path, args.data, args.samples, args.seed)
    runs: list[tuple[str, str, dict[str, Any]]] = [(c, c, {}) for c in configs]
    if args.compare_quark is not None:
        for c in (args.compare_quark or ["MXFP8E4M3", "BFP16"]):
            runs.append((c, c, {"placement": "quark", "fold_weights": False}))
    calib: list[dict[str, np.ndarray]] = []
    if args.rows:
        from .cli import _finetune_options
        ff = _finetune_options(args.ff)
        for spec in args.rows:
            name, opts = parse_row(spec)
            if ff and (opts.get("fast_finetune") or name.upper().endswith("_ADAQUANT")):
                opts["fast_finetune"] = ff
            runs.append((spec, name, opts))
        calib = _calibration(args, model_path, task, chars)
    progress = not args.quiet
    print(f"model: {model_path}\ndata:  {task.description}", file=sys.stderr)

    os.makedirs(args.out_dir, exist_ok=True)
    model_dir = os.path.join(args.out_dir, "models") if args.keep_models else None
    with tempfile.TemporaryDirectory(prefix="ort-mx-demo-") as tmp:
        work = model_dir or tmp
        os.makedirs(work, exist_ok=True)
        ref = _run_all(model_path, task.feeds, args.threads, False, "float", progress, ep)
        rows = [Row("float32", "-", os.path.getsize(model_path) / 1e6, None,
                    task.metrics(ref, None))]
        columns = list(task.columns)
        agree_key = "same_text_as_float" if isinstance(task, OcrTask) else "top1_agreement"
        if ep != CPU_EP:  # the same model on the CPU: how often the outputs agree
            columns.append(("vs_cpu", "same text as CPU" if isinstance(task, OcrTask)
                            else "top-1 = CPU"))

        def vs_cpu(path: str, outs: list[np.ndarray], custom: bool, label: str) -> dict:
            if ep == CPU_EP:
                return {}
            cpu = _run_all(path, task.feeds, args.threads, custom, f"{label} (CPU)", progress)
            return {"vs_cpu": task.metrics(outs, cpu)[agree_key]}

        rows[0].metrics.update(vs_cpu(model_path, ref, False, "float"))
        rows[0].metrics.update({k: 1.0 for k in ("same_text_as_float", "frame_agreement",
                                                 "cosine_to_float", "top1_agreement")
                                if any(k == c for c, _ in task.columns)})
        timed = [(model_path, False)]
        for label, name, opts in runs:
            placement = opts.get("placement", "default")
            fname = label.replace("/", "_").replace("=", "").replace("+", "_")
            out = os.path.join(work, f"{fname}{'_quark' if placement == 'quark' else ''}.onnx")
            reader = _ListReader(calib) if calib else None
            summary = quantize_model(model_path, out, name, reader, progress=progress, **opts)
            outs = _run_all(out, task.feeds, args.threads, True, f"{label} ({placement})",
                            progress, ep)
            _, packed = summary.packed_weight_bytes()
            rows.append(Row(label, placement, summary.output_bytes / 1e6, packed / 1e6,
                            {**task.metrics(outs, ref), **vs_cpu(out, outs, True, label)},
                            None, None, summary.seconds,
                            summary.runtime_node_count(), summary.conflicts + summary.skipped))
            timed.append((out, True))
        if args.timing_rounds > 0:
            if progress:
                print(f"  timing {len(timed)} models interleaved, {args.timing_rounds} "
                      f"round(s) of {min(len(task.feeds), args.timing_lines)} inputs",
                      file=sys.stderr)
            latencies = time_interleaved(timed, task.feeds[:args.timing_lines], args.threads,
                                         args.timing_rounds, ep)
            for row, (ms, ratio) in zip(rows, latencies):
                row.latency_ms, row.latency_vs_float = ms, ratio
    table = render_table(rows, columns)
    text = _plain(table)
    print(text)
    header = (f"# ort-mx-ops quantization demo\n\nmodel: `{os.path.basename(model_path)}`; "
              f"data: {task.description}; latency: median of one-input runs (batch 1) on "
              f"{ep}, all models timed interleaved, 'x float' the median of "
              f"paired ratios to the float model's run on the same input; 'weights packed MB' is what the quantized weights take in "
              f"their format with shared scales (the .onnx stores them dequantized, in "
              f"float32).\n\n")
    with open(os.path.join(args.out_dir, "demo.md"), "w", encoding="utf-8") as f:
        f.write(header + _markdown(table) + "\n")
    with open(os.path.join(args.out_dir, "demo.json"), "w", encoding="utf-8") as f:
        json.dump({"model": model_path, "data": task.description,
                   "rows": [asdict(r) for r in rows]}, f, indent=2)
    print(f"\nwrote {os.path.join(args.out_dir, 'demo.md')} and demo.json "
          f"({time.perf_counter() - t_start:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
