"""Quantize one model with AMD Quark's own quantizer and time it: the Quark side of
``adaquant_speed.py``, run as a script under an interpreter that has Quark (and PyTorch)
installed.  It imports neither ort_mx_ops nor anything of this package, so the package never
needs Quark or PyTorch.

``PYTHON quark_adaquant.py --model IN.onnx --out OUT.onnx --config NAME --calib CAL.npz
[--ff '{"NumIterations": 100}'] --json RESULT.json``: the calibration batches are the
arrays of CAL.npz in name order, each fed as the model's input ``--input``; ``--ff``
overrides the config's FastFinetune options; RESULT.json gets the seconds that Quark's
``quantize_model`` took (the call alone) and the versions.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from typing import Optional, Sequence


class _NpzReader:
    """Quark's calibration data reader protocol: ``get_next`` gives one feed dict, then
    None."""

    def __init__(self, path: str, input_name: str) -> None:
        import numpy as np
        with np.load(path) as data:
            self.feeds = [{input_name: data[k]} for k in sorted(data.files)]

    def get_next(self):
        return self.feeds.pop(0) if self.feeds else None

    def rewind(self) -> None:
        """Quark may read the data more than once; the benchmark gives it one pass."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--calib", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--ff", default="{}", help="JSON dict of FastFinetune overrides")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    import quark
    import torch
    from quark.onnx import ModelQuantizer
    from quark.onnx.quantization.config import Config, get_default_config

    qconf = copy.deepcopy(get_default_config(args.config))
    overrides = json.loads(args.ff)
    if overrides:
        if "FastFinetune" not in qconf.extra_options:
            raise SystemExit(f"{args.config} has no FastFinetune options to override")
        qconf.extra_options["FastFinetune"] = {**qconf.extra_options["FastFinetune"],
                                               **overrides}
    quantizer = ModelQuantizer(Config(global_quant_config=qconf))
    reader = _NpzReader(args.calib, args.input)
    start = time.perf_counter()
    quantizer.quantize_model(args.model, args.out, reader)
    seconds = time.perf_counter() - start
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"seconds": seconds, "config": args.config,
                   "fast_finetune": qconf.extra_options.get("FastFinetune"),
                   "quark": getattr(quark, "__version__", "?"), "torch": torch.__version__,
                   "torch_threads": torch.get_num_threads()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
