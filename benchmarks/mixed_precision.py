"""Auto mixed precision on real models, measured on held-out data.

``python -m ort_mx_ops.benchmarks.mixed_precision [--model ocr|cls] --targets 0.99 0.995``

* ``ocr``: rapidocr's PP-OCRv4 text recognizer.  Calibration: text lines rendered with one
  seed, padded to one width and stacked; evaluation: the demo's lines (another seed),
  one line per run, character accuracy by CTC decoding and agreement with float.
* ``cls``: rapidocr's text-direction classifier (a MobileNet-style CNN, two classes: upright
  or upside down).  Lines rendered with their own seeds, half of them turned 180 degrees,
  resized to 48 x 192 as rapidocr does; evaluation: top-1 agreement with float.

``--metric char`` (OCR only) is the search's metric: the character agreement of the CTC
decoded text with float's, 1 - edit distance / float's length, over the calibration lines.
``--weight-rounding gptq`` gives the search and the written model GPTQ-rounded weights.

For each target the search runs on the calibration data only; the table reports the
held-out fidelity, weight_bits, activation_bits and the latency relative to float
(median of single-sample runs, same process).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Optional, Sequence

import numpy as np

from ort_mx_ops.quantizer.demo import OcrTask, _characters, find_rapidocr_recognizer
from ort_mx_ops.quantizer.mixed_precision import auto_mixed_precision, DEFAULT_CANDIDATES
from ort_mx_ops.quantizer.ocr_data import (ctc_greedy_decode, edit_distance, load_fonts,
                                           preprocess, render_lines)
from ort_mx_ops.quantizer.sensitivity import SensitivityReport


class ListReader:
    """A CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds = list(feeds)

    def get_next(self) -> Optional[dict[str, np.ndarray]]:
        return self.feeds.pop(0) if self.feeds else None


def _pad_groups(images: list[np.ndarray], group: int = 8) -> list[np.ndarray]:
    """(1, 3, H, W_i) arrays sorted by width and, in groups of ``group``, padded with zeros
    on the right to the group's widest (so that each group stacks into one batch)."""
    images = sorted(images, key=lambda a: a.shape[-1])
    out = []
    for k in range(0, len(images), group):
        part = images[k:k + group]
        width = max(a.shape[-1] for a in part)
        out += [np.pad(a, ((0, 0), (0, 0), (0, 0), (0, width - a.shape[-1]))) for a in part]
    return out


def ocr_calibration(model: str, lines: int, seed: int) -> list[dict[str, np.ndarray]]:
    chars = _characters(model, None)
    rendered = render_lines(lines, seed=seed, fonts=load_fonts(), charset=set(chars))
    return [{"x": a} for a in _pad_groups([preprocess(l.image) for l in rendered])]


def char_agreement(characters: list[str]):
    """The search metric ``--metric char``: over every line of every calibration batch,
    1 - (edit distance of the quantized model's decoded text to float's) / (float's
    length)."""
    def char_agreement(float_outputs: list, quantized_outputs: list) -> float:
        dist = total = 0
        for f, q in zip(float_outputs, quantized_outputs):
            for ref, got in zip(ctc_greedy_decode(f[0], characters),
                                ctc_greedy_decode(q[0], characters)):
                dist += edit_distance(got, ref)
                total += len(ref)
        return 1.0 - dist / max(total, 1)
    return char_agreement


def find_rapidocr_classifier() -> str:
    path = os.path.join(os.path.dirname(find_rapidocr_recognizer()),
                        "ch_ppocr_mobile_v2.0_cls_infer.onnx")
    if not os.path.exists(path):
        raise RuntimeError(f"no text-direction classifier at {path}")
    return path


def cls_inputs(lines: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Rendered lines, every other one turned 180 degrees, resized to height 48 keeping the
    aspect ratio (at most 192 wide), scaled to [-1, 1] and padded to 48 x 192."""
    from PIL import Image
    out = []
    for k, line in enumerate(render_lines(lines, seed=seed, fonts=load_fonts())):
        img = line.image if k % 2 == 0 else line.image[::-1, ::-1]
        h, w = img.shape[:2]
        new_w = min(192, max(8, int(np.ceil(48 * w / h))))
        x = np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize((new_w, 48),
                                                                          Image.BILINEAR),
                       dtype=np.float32).transpose(2, 0, 1) / 255.0
        x = (x - 0.5) / 0.5
        out.append({"x": np.pad(x, ((0, 0), (0, 0), (0, 192 - new_w)))[None]})
    return out


def _session(path: str, custom: bool):
    import onnxruntime as ort
    import ort_mx_ops
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if custom:
        ort_mx_ops.register(so)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_feeds(path: str, feeds: list[dict[str, np.ndarray]], custom: bool,
              repeats: int = 1) -> tuple[list[np.ndarray], float]:
    """First output for every feed and the median single-run latency in ms."""
    sess = _session(path, custom)
    sess.run(None, feeds[0])
    outs, times = [], []
    for r in range(repeats):
        for feed in feeds:
            t = time.perf_counter()
            o = sess.run(None, feed)[0]
            times.append((time.perf_counter() - t) * 1e3)
            if r == 0:
                outs.append(o)
    return outs, statistics.median(times)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["ocr", "cls"], default="ocr")
    p.add_argument("--targets", type=float, nargs="+", default=[0.99])
    p.add_argument("--metric", default="top1",
                   help="top1, cosine, sqnr, or (ocr) char: see the module docs")
    p.add_argument("--weight-rounding", choices=["nearest", "gptq"], default="nearest")
    p.add_argument("--candidates", nargs="+", default=list(DEFAULT_CANDIDATES))
    p.add_argument("--calib", type=int, default=24, help="calibration samples")
    p.add_argument("--sensitivity-batches", type=int, default=None,
                   help="stacked calibration batches (of 8) the sensitivity pass uses "
                        "(default: all)")
    p.add_argument("--eval", type=int, default=100, help="held-out samples")
    p.add_argument("--out", default="bench-results/mixed_precision")
    p.add_argument("--heatmap", action="store_true", help="also write the sensitivity PNG")
    p.add_argument("--objective", choices=["total", "weights"], default="total",
                   help="what the search minimises (see auto_mixed_precision)")
    p.add_argument("--sensitivity-json", metavar="FILE",
                   help="reuse the sensitivity a previous run of the same model, data and "
                        "candidates saved")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    if args.model == "ocr":
        model = find_rapidocr_recognizer()
        calib = ocr_calibration(model, args.calib, seed=1000)
        task = OcrTask(model, _characters(model, None), args.eval, 0, [])
        feeds = task.feeds

        def score(outs, ref):
            m = task.metrics(outs, ref)
            return {"char_acc": m["char_acc"], "same_text_as_float": m.get("same_text_as_float", 1.0),
                    "frame_agreement": m.get("frame_agreement", 1.0)}
    else:
        model = find_rapidocr_classifier()
        calib = cls_inputs(args.calib, seed=1000)
        feeds = cls_inputs(args.eval, seed=7)

        def score(outs, ref):
            agree = float(np.mean([o.argmax(-1) == r.argmax(-1)
                                   for o, r in zip(outs, ref)])) if ref else 1.0
            return {"top1_agreement": agree}

    metric: Any = args.metric
    if args.metric == "char":
        if args.model != "ocr":
            p.error("--metric char is for --model ocr")
        metric = char_agreement(_characters(model, None))
    ref, float_ms = run_feeds(model, feeds, False, repeats=2)
    rows: list[dict[str, Any]] = [{"target": "float", **score(ref, None if args.model == "ocr"
                                                               else []),
                                   "weight_bits": 32.0, "activation_bits": 32.0,
                                   "latency_x_float": 1.0}]
    if args.model == "ocr":
        rows[0].update(task.metrics(ref, ref))
    # Computed by the first search (or loaded), reused by the next targets.
    report = SensitivityReport.load_json(args.sensitivity_json, metric) \
        if args.sensitivity_json else None
    with tempfile.TemporaryDirectory() as tmp:
        for target in args.targets:
            out = os.path.join(tmp, f"{args.model}_{target}.onnx")
            s = auto_mixed_precision(model, out, ListReader(calib), args.candidates, target,
                                     metric, progress=True, max_batch=8,
                                     sensitivity_batches=args.sensitivity_batches,
                                     sensitivity=report, objective=args.objective,
                                     weight_rounding=args.weight_rounding)
            if report is None:
                report = s.sensitivity
                print(report.table(limit=15))
                report.save_json(os.path.join(args.out, f"{args.model}_sensitivity.json"))
                if args.heatmap:
                    report.save_heatmap(os.path.join(args.out,
                                                     f"{args.model}_sensitivity.png"))
            print(s.__str__().splitlines()[0], file=sys.stderr)
            outs, ms = run_feeds(out, feeds, True, repeats=2)
            rows.append({"target": target, "calib_" + args.metric: s.achieved,
                         **score(outs, ref), "weight_bits": s.weight_bits,
                         "activation_bits": s.activation_bits, "latency_x_float": ms / float_ms,
                         "evaluations": s.evaluations, "search_s": s.search_seconds,
                         "formats": _mix(s)})
            print(f"held out: {rows[-1]}", file=sys.stderr)  # before the next target's search
    keys = list(dict.fromkeys(k for r in rows for k in r if k != "formats"))
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.4f}" if isinstance(r.get(k), float) else str(r.get(k, ""))
                                for k in keys) + " |")
    for r in rows[1:]:
        print(f"target {r['target']}: {r['formats']}")
    with open(os.path.join(args.out, f"{args.model}.json"), "w", encoding="utf-8") as f:
        json.dump({"model": model, "calibration_samples": args.calib,
                   "held_out_samples": args.eval, "metric": args.metric,
                   "weight_rounding": args.weight_rounding, "objective": args.objective,
                   "candidates": args.candidates, "rows": rows}, f, indent=2)
    return 0


def _mix(summary) -> str:
    counts: dict[str, int] = {}
    for layer in summary.layers:
        k = f"{layer['kind'][0].upper()}:{layer['format']}"
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))


if __name__ == "__main__":
    sys.exit(main())
