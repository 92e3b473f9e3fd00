"""AdaQuant speed and accuracy, ours against AMD Quark's, on the same model and calibration
data: ``python -m ort_mx_ops.benchmarks.adaquant_speed [--quark PYTHON] ...``.

Quantizes a model that ``rapidocr-onnxruntime`` ships (as ``accuracy.py`` builds its data:
``cls`` the text-direction classifier, ``rec`` the recognizer) with ``--config`` (default
``MXFP8E4M3_ADAQUANT``) and with the same config without AdaQuant, times each
``quantize_model`` call and scores the result on held-out inputs.  With ``--quark PYTHON``
(an interpreter with ``amd-quark`` and PyTorch installed; never this package's dependencies)
it runs Quark's own ``quantize_model`` on the same model, config and calibration batches in a
subprocess (``quark_adaquant.py``), times the call there, and scores Quark's model with this
package's kernels (the same ops, bit-identical).  ``--ff KEY=VALUE`` (Quark's names) sets
the same fast finetune options on both sides.  A benchmark, not a test: run it on an idle
machine and compare times from one run only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["main"]


def _ours(task: Any, config: str, ff: dict) -> dict[str, Any]:
    from ort_mx_ops.benchmarks.accuracy import _Reader, _run
    from ort_mx_ops.quantizer import quantize_model
    kw = {"fast_finetune": ff} if ff and config.upper().endswith("_ADAQUANT") else {}
    start = time.perf_counter()
    s = quantize_model(task.path, None, config, _Reader(task.calib), progress=False, **kw)
    secs = time.perf_counter() - start
    return {"quantizer": "ort_mx_ops", "config": config, "seconds": secs,
            **task.metrics(_run(s.model, task.eval), task.ref),
            **({"model_guard": s.tuning.model_guard["result"]}
               if s.tuning is not None and s.tuning.model_guard else {})}


def _quark(task: Any, config: str, ff: dict, python: str, work: str,
           log: Any) -> dict[str, Any]:
    """Quark's quantize_model on the same data in a subprocess under ``python``."""
    import onnx
    from ort_mx_ops.benchmarks.accuracy import _run
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quark_adaquant.py")
    name = onnx.load(task.path, load_external_data=False).graph.input[0].name
    calib = os.path.join(work, "calib.npz")
    np.savez(calib, **{f"s{i:05d}": next(iter(f.values())) for i, f in enumerate(task.calib)})
    out, res = os.path.join(work, f"quark_{config}.onnx"), os.path.join(work, "res.json")
    cmd = [python, script, "--model", task.path, "--out", out, "--config", config, "--calib",
           calib, "--input", name, "--json", res,
           "--ff", json.dumps(ff if config.upper().endswith("_ADAQUANT") else {})]
    start = time.perf_counter()
    # In the work folder: Quark writes files of its own into the current directory.
    rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False,
                        cwd=work).returncode
    wall = time.perf_counter() - start
    if rc != 0:
        return {"quantizer": "quark", "config": config, "error": f"exit status {rc}",
                "wall_s": wall}
    with open(res, encoding="utf-8") as f:
        info = json.load(f)
    row = {"quantizer": f"quark {info['quark']} (torch {info['torch']})", "config": config,
           "seconds": info["seconds"], "wall_s": wall}
    try:
        row.update(task.metrics(_run(out, task.eval), task.ref))
    except Exception as exc:  # report it; the timing still stands
        row["eval_error"] = f"{type(exc).__name__}: {exc}"
    return row


def main(argv: Optional[Sequence[str]] = None) -> int:
    from ort_mx_ops.benchmarks.accuracy import Task, _run
    from ort_mx_ops.quantizer.cli import _finetune_options
    p = argparse.ArgumentParser(prog="python -m ort_mx_ops.benchmarks.adaquant_speed",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["cls", "rec"], default="cls")
    p.add_argument("--config", default="MXFP8E4M3_ADAQUANT")
    p.add_argument("--calib", type=int, default=8, help="calibration samples (default 8)")
    p.add_argument("--eval", type=int, default=300, help="held-out samples (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ff", action="append", default=[], metavar="KEY=VALUE",
                   help="fast finetune option for both quantizers (Quark's names)")
    p.add_argument("--quark", metavar="PYTHON", help="interpreter with amd-quark installed")
    p.add_argument("--no-plain", action="store_true", help="skip the configs without AdaQuant")
    p.add_argument("--work", help="keep Quark's model and log here (default: a temp dir)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    if not args.config.upper().endswith("_ADAQUANT"):
        p.error("--config must be an *_ADAQUANT config")
    ff = _finetune_options(args.ff)
    task = Task(args.model, args.eval, args.calib, args.seed)
    task.ref = _run(task.path, task.eval)
    configs = [args.config] + ([] if args.no_plain else [args.config[:-len("_ADAQUANT")]])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = os.path.abspath(args.work or tmp)
        os.makedirs(work, exist_ok=True)
        for config in configs:
            rows.append(_ours(task, config, ff))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            if args.quark:
                with open(os.path.join(work, f"quark_{config}.log"), "w") as log:
                    rows.append(_quark(task, config, ff, args.quark, work, log))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    metric = [k for k in rows[0] if k not in ("quantizer", "config", "seconds",
                                               "model_guard")]
    print(f"model {os.path.basename(task.path)}, {len(task.calib)} calibration samples, "
          f"{len(task.eval)} held out, fast finetune {ff or 'defaults'}")
    print("| quantizer | config | quantize s | " + " | ".join(metric) + " |")
    print("|---|---|---:|" + "---:|" * len(metric))
    for r in rows:
        vals = [f"{r[k]:.4f}" if k in r else "–" for k in metric]
        secs = f"{r['seconds']:.1f}" if "seconds" in r else r.get("error", "–")
        print(f"| {r['quantizer']} | {r['config']} | {secs} | " + " | ".join(vals) + " |")
    quark = [r for r in rows if r["config"] == args.config and r["quantizer"] != "ort_mx_ops"
             and "seconds" in r]
    if quark:
        print(f"\n{args.config}: Quark {quark[0]['seconds']:.1f} s / ours "
              f"{rows[0]['seconds']:.1f} s = {quark[0]['seconds'] / rows[0]['seconds']:.1f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"model": task.path, "calib": len(task.calib), "eval": len(task.eval),
                       "fast_finetune": ff, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
