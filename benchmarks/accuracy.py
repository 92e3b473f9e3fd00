"""Accuracy of the quantizer's algorithms on held-out data: ``python -m
ort_mx_ops.benchmarks.accuracy --model rec|det|cls --rows SPEC...``.

The three models are the ones the ``rapidocr-onnxruntime`` package ships (read from the
installed package):

* ``rec``: the PP-OCRv4 text recognizer on rendered text lines: character accuracy against
  the true text, as ``ort-mx-demo`` measures it.
* ``det``: the PP-OCRv4 text detector (a segmentation CNN) on pages of rendered lines: IoU of
  the text mask (probability > 0.3) with the float model's, and pixel agreement.
* ``cls``: the text-direction classifier (a 2-class MobileNet) on lines, half of them turned
  by 180 degrees: top-1 agreement with float and accuracy against the truth.

Calibration inputs are rendered with another seed than the evaluated ones and never share a
text with them.  Each row is ``CONFIG[/A=ACT][+gptq][+bc][+cle][+hadamard][+adaquant]`` as
in ``ort-mx-demo --rows``; the table goes to stdout (Markdown) and ``--json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Optional, Sequence

import numpy as np
import onnx

__all__ = ["main"]


def _rapidocr_model(kind: str) -> str:
    import importlib.util
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.origin:
        raise RuntimeError("these models come with rapidocr-onnxruntime: "
                           "pip install 'ort_mx_ops[demo]'")
    models = os.path.join(os.path.dirname(spec.origin), "models")
    found = sorted(f for f in os.listdir(models) if f"_{kind}" in f and f.endswith(".onnx"))
    if not found:
        raise RuntimeError(f"no *_{kind}*.onnx under {models}")
    return os.path.join(models, found[-1])


def _lines(n: int, seed: int, exclude: set[str] = frozenset()):
    from ort_mx_ops.quantizer.ocr_data import render_lines
    return [line for line in render_lines(n, seed=seed) if line.text not in exclude]


def _page(lines, rng: np.random.Generator, height: int = 256, width: int = 640) -> np.ndarray:
    """Paste up to 4 rendered lines on a light page, normalised as PP-OCR detectors expect."""
    from PIL import Image
    page = np.full((height, width, 3), int(rng.integers(200, 256)), np.uint8)
    y = int(rng.integers(4, 24))
    for line in lines:
        img = line.image
        h, w = img.shape[:2]
        if w > width - 8:
            img = np.asarray(Image.fromarray(img).resize((width - 8, h)))
            w = width - 8
        if y + h > height:
            break
        x = int(rng.integers(0, width - w + 1))
        page[y:y + h, x:x + w] = img
        y += h + int(rng.integers(6, 30))
    x = page.astype(np.float32) / 255.0
    x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225],
                                                                     np.float32)
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def _cls_input(image: np.ndarray, flip: bool) -> np.ndarray:
    from PIL import Image
    img = image[::-1, ::-1] if flip else image
    h, w = img.shape[:2]
    new_w = min(192, max(8, int(np.ceil(48 * w / h))))
    resized = np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize((new_w, 48)),
                         np.float32)
    x = np.zeros((48, 192, 3), np.float32)
    x[:, :new_w] = (resized / 255.0 - 0.5) / 0.5
    return x.transpose(2, 0, 1)[None]


class Task:
    """Evaluation and calibration inputs of one model and its metric."""

    def __init__(self, kind: str, n_eval: int, n_calib: int, seed: int) -> None:
        self.kind = kind
        self.path = _rapidocr_model(kind)
        name = onnx.load(self.path, load_external_data=False).graph.input[0].name
        rng = np.random.default_rng(seed)
        if kind == "rec":
            from ort_mx_ops.quantizer.demo import OcrTask, _characters
            chars = _characters(self.path, None)
            self.ocr = OcrTask(self.path, chars, n_eval, seed, [])
            self.eval = self.ocr.feeds
            seen = {line.text for line in self.ocr.lines}
            cal = OcrTask(self.path, chars, n_calib, seed + 1000, [])
            self.calib = [f for f, line in zip(cal.feeds, cal.lines) if line.text not in seen]
        elif kind == "det":
            ev = _lines(4 * n_eval, seed)
            cal = _lines(4 * n_calib, seed + 1000, {line.text for line in ev})
            self.eval = [{name: _page(ev[i:i + 4], rng)} for i in range(0, len(ev), 4)]
            self.calib = [{name: _page(cal[i:i + 4], rng)} for i in range(0, len(cal), 4)]
        else:
            ev = _lines(n_eval, seed)
            cal = _lines(n_calib, seed + 1000, {line.text for line in ev})
            self.truth = [i % 2 for i in range(len(ev))]
            self.eval = [{name: _cls_input(line.image, bool(t))} for line, t in
                         zip(ev, self.truth)]
            self.calib = [{name: _cls_input(line.image, bool(i % 2))}
                          for i, line in enumerate(cal)]

    def metrics(self, outs: list[np.ndarray], ref: list[np.ndarray]) -> dict[str, float]:
        if self.kind == "rec":
            m = self.ocr.metrics(outs, ref)
            return {"char_acc": m["char_acc"], "same_text_as_float": m["same_text_as_float"]}
        if self.kind == "det":
            ious, agree = [], []
            for o, r in zip(outs, ref):
                a, b = o > 0.3, r > 0.3
                union = np.logical_or(a, b).sum()
                ious.append(np.logical_and(a, b).sum() / union if union else 1.0)
                agree.append(np.mean(a == b))
            return {"mask_iou_vs_float": float(np.mean(ious)),
                    "pixel_agreement": float(np.mean(agree))}
        pred = [int(o.reshape(-1).argmax()) for o in outs]
        fl = [int(r.reshape(-1).argmax()) for r in ref]
        return {"top1_agreement": float(np.mean([p == f for p, f in zip(pred, fl)])),
                "accuracy": float(np.mean([p == t for p, t in zip(pred, self.truth)]))}


def _run(model: Any, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    import onnxruntime as ort
    import ort_mx_ops
    so = ort.SessionOptions()
    ort_mx_ops.register(so)
    data = model if isinstance(model, str) else model.SerializeToString()
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return [sess.run(None, f)[0] for f in feeds]


class _Reader:
    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.feeds = list(feeds)

    def get_next(self) -> Optional[dict[str, np.ndarray]]:
        return self.feeds.pop(0) if self.feeds else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    from ort_mx_ops.quantizer import quantize_model
    from ort_mx_ops.quantizer.cli import _finetune_options
    from ort_mx_ops.quantizer.demo import parse_row
    p = argparse.ArgumentParser(prog="python -m ort_mx_ops.benchmarks.accuracy",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["rec", "det", "cls"], default="rec")
    p.add_argument("--rows", nargs="+", required=True, metavar="SPEC")
    p.add_argument("--eval", type=int, default=100, help="held-out samples (default 100)")
    p.add_argument("--calib", type=int, default=32, help="calibration samples (default 32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ff", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    task = Task(args.model, args.eval, args.calib, args.seed)
    ref = _run(task.path, task.eval)
    ff = _finetune_options(args.ff)
    rows = []
    print(f"model {os.path.basename(task.path)}: {len(task.eval)} held-out, "
          f"{len(task.calib)} calibration samples", file=sys.stderr)
    for spec in args.rows:
        name, opts = parse_row(spec)
        if ff and (opts.get("fast_finetune") or name.upper().endswith("_ADAQUANT")):
            opts["fast_finetune"] = ff
        t = time.perf_counter()
        s = quantize_model(task.path, None, name, _Reader(task.calib),
                           progress=not args.quiet, **opts)
        secs = time.perf_counter() - t
        m = task.metrics(_run(s.model, task.eval), ref)
        guard = s.tuning.model_guard if s.tuning is not None else None
        steps = s.tuning.timings if s.tuning is not None else {}
        rows.append({"row": spec, "config": s.config, "quantize_s": secs, **m,
                     **({"model_guard": guard} if guard else {}),
                     **({"tuning_s": steps} if steps else {})})
        print(f"{spec:<32} " + " ".join(f"{k} {v:.4f}" for k, v in m.items()) +
              f"  ({secs:.1f} s" + "".join(f", {k} {v:.1f} s" for k, v in steps.items()) +
              ")" + (f"; model guard: {guard['result']}" if guard else ""),
              file=sys.stderr, flush=True)
    keys = [k for k in rows[0] if k not in ("row", "config", "model_guard", "tuning_s")]
    print("| row | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for r in rows:
        print(f"| {r['row']} | " + " | ".join(
            f"{r[k]:.1f}" if k == "quantize_s" else f"{r[k]:.4f}" for k in keys) + " |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"model": task.path, "eval": len(task.eval), "calib": len(task.calib),
                       "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
