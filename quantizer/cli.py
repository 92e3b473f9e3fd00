"""``ort-mx-quantize INPUT OUTPUT --config NAME``: the quantizer on the command line.

Calibration data (needed only for ``--bf16-activation-scaled``) comes from ``--calib``, an
.npz whose arrays are named after the model inputs with samples along axis 0 (one batch of
one sample each), or from ``--calib-reader module:callable`` returning a
``CalibrationDataReader``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Optional, Sequence

from .calibration import NpzReader
from .config import config_names, DEFAULT_OP_TYPES, PLACEMENTS
from .quantize import quantize_model

__all__ = ["main", "NpzReader"]


def _load_reader(spec: str):
    module, _, attr = spec.partition(":")
    if not attr:
        raise SystemExit("--calib-reader takes module:callable")
    return getattr(importlib.import_module(module), attr)()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ort-mx-quantize", description="Insert BFP / MX / BF16 quantize-dequantize nodes "
        "into an ONNX model (runs with the ort_mx_ops custom-op library).", epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="float ONNX model")
    p.add_argument("output", help="where to write the quantized model (never the input)")
    p.add_argument("--config", required=True, metavar="NAME",
                   help=f"format for activations and weights: {', '.join(config_names())}")
    p.add_argument("--weight-config", metavar="NAME",
                   help="a different format for weights (e.g. --config BF16 "
                        "--weight-config MXINT8); 'none' keeps weights float")
    p.add_argument("--activation-config", metavar="NAME",
                   help="a different format for activations; 'none' keeps them float")
    p.add_argument("--op-types", nargs="+", default=list(DEFAULT_OP_TYPES), metavar="OP",
                   help="op types whose inputs are quantized (default: %(default)s)")
    p.add_argument("--all-op-types", action="store_true",
                   help="quantize the float inputs of every op")
    p.add_argument("--exclude", nargs="+", default=[], metavar="NODE",
                   help="names of nodes whose inputs stay float")
    p.add_argument("--quantize-bias", action="store_true", help="also quantize Conv/Gemm bias")
    p.add_argument("--placement", choices=list(PLACEMENTS), default="default",
                   help="'quark' reproduces Quark's placement (every op's inputs, axis 1)")
    p.add_argument("--no-fold", action="store_true",
                   help="keep a runtime node on each weight instead of folding it offline")
    p.add_argument("--legacy-names", action="store_true",
                   help="emit com.vai.quantize BFPFixNeuron / MXFixNeuron")
    p.add_argument("--bf16-cast", action="store_true",
                   help="BF16 as Cast(BFLOAT16) -> Cast(FLOAT) instead of Extended Q/DQ")
    p.add_argument("--bf16-weight-scaled", action="store_true",
                   help="BF16: rescale each weight by its range before rounding")
    p.add_argument("--bf16-activation-scaled", action="store_true",
                   help="BF16: rescale activations by their calibrated range (needs --calib)")
    p.add_argument("--calib", metavar="NPZ", help="calibration inputs (.npz, samples on axis 0)")
    p.add_argument("--calib-batch", type=int, default=1, help="calibration batch size")
    p.add_argument("--calib-reader", metavar="MODULE:CALLABLE",
                   help="a callable returning a CalibrationDataReader")
    p.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``ort-mx-quantize``; returns the process exit status."""
    args = build_parser().parse_args(argv)
    from .config import get_config

    try:
        base = get_config(args.config)
        cfg = base.replace(
            activation=base.activation if args.activation_config is None
            else args.activation_config,
            weight=base.weight if args.weight_config is None else args.weight_config,
            op_types_to_quantize=tuple(args.op_types), nodes_to_exclude=tuple(args.exclude),
            quantize_all_op_types=args.all_op_types, quantize_bias=args.quantize_bias,
            placement=args.placement, fold_weights=not args.no_fold,
            legacy_names=args.legacy_names, bf16_qdq_to_cast=args.bf16_cast,
            bf16_weight_scaled=args.bf16_weight_scaled,
            bf16_activation_scaled=args.bf16_activation_scaled)
        reader = None
        if args.calib:
            reader = NpzReader(args.calib, args.calib_batch)
        elif args.calib_reader:
            reader = _load_reader(args.calib_reader)
        summary = quantize_model(args.input, args.output, cfg, reader, progress=not args.quiet)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"ort-mx-quantize: error: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(summary)
        print(f"wrote {args.output}")
    if args.summary_json:
        with open(args.summary_json, "w", encoding="utf-8") as f:
            json.dump(summary.as_dict(), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
