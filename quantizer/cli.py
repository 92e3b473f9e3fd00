"""``ort-mx-quantize INPUT OUTPUT --config NAME``: the quantizer on the command line.

Calibration data (needed for ``--bf16-activation-scaled``, ``--analyze`` and
``--auto-mixed-precision``) comes from ``--calib``, an .npz whose arrays are named after the
model inputs with samples along axis 0 (one batch of one sample each), or from
``--calib-reader module:callable`` returning a ``CalibrationDataReader``.

``--analyze`` prints the per-tensor sensitivity table (no OUTPUT needed; ``--analysis-json``
and ``--heatmap`` write it).  ``--auto-mixed-precision --candidates A B ... --target T
--metric top1|cosine|sqnr`` searches a format per tensor (``--config BF16_MIXED_BFP16`` or
``BF16_MIXED_MXINT8`` run the same search over Quark's preset pair; ``MX9_INT8`` is MX9
activations over MXINT8 weights).
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
from .mixed_precision import DEFAULT_CANDIDATES, MIXED_CONFIGS, auto_mixed_precision
from .sensitivity import analyze_sensitivity

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
    p.add_argument("output", nargs="?",
                   help="where to write the quantized model (never the input; not with "
                        "--analyze)")
    p.add_argument("--config", metavar="NAME",
                   help=f"format for activations and weights: {', '.join(config_names())}; "
                        f"or MX9_INT8, {', '.join(MIXED_CONFIGS)} (searched)")
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
    amp = p.add_argument_group("sensitivity and automatic mixed precision")
    amp.add_argument("--analyze", action="store_true",
                     help="print the sensitivity of the output to each tensor in each "
                          "candidate format (needs --calib); no model is written")
    amp.add_argument("--auto-mixed-precision", action="store_true",
                     help="choose a format per tensor from --candidates meeting --target")
    amp.add_argument("--candidates", nargs="+", metavar="NAME", default=None,
                     help="formats to choose from ('float' keeps a tensor float); default: "
                          + " ".join(DEFAULT_CANDIDATES))
    amp.add_argument("--target", type=float, default=None,
                     help="fidelity to meet on the calibration data (default: none, every "
                          "tensor in its cheapest candidate)")
    amp.add_argument("--metric", default="top1", metavar="NAME",
                     help="top1, cosine, sqnr, or module:callable (default %(default)s)")
    amp.add_argument("--sensitivity-batches", type=int, default=None, metavar="N",
                     help="rank with the first N stacked calibration batches only (faster)")
    amp.add_argument("--max-batch", type=int, default=32, metavar="N",
                     help="stack calibration samples of one shape up to N per run")
    amp.add_argument("--analysis-json", metavar="FILE", help="--analyze: write the JSON")
    amp.add_argument("--heatmap", metavar="PNG",
                     help="--analyze: write a layers x formats heat map (needs matplotlib)")
    p.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    return p


def _metric(spec: str):
    if ":" in spec:
        module, _, attr = spec.partition(":")
        return getattr(importlib.import_module(module), attr)
    return spec


def _run_amp(args: argparse.Namespace, reader, placement: dict) -> object:
    """--analyze (returns None after printing) or --auto-mixed-precision (the summary)."""
    preset = args.config.upper() if args.config and args.config.upper() in MIXED_CONFIGS \
        else None
    candidates = args.candidates or (MIXED_CONFIGS[preset] if preset else DEFAULT_CANDIDATES)
    if args.analyze:
        report = analyze_sensitivity(args.input, reader, candidates, _metric(args.metric),
                                     progress=not args.quiet, max_batch=args.max_batch,
                                     batches=args.sensitivity_batches, **placement)
        print(report.table())
        if args.analysis_json:
            report.save_json(args.analysis_json)
            print(f"wrote {args.analysis_json}")
        if args.heatmap:
            report.save_heatmap(args.heatmap)
            print(f"wrote {args.heatmap}")
        return None
    return auto_mixed_precision(args.input, args.output, reader, candidates, args.target,
                                _metric(args.metric), progress=not args.quiet,
                                max_batch=args.max_batch,
                                sensitivity_batches=args.sensitivity_batches, **placement)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``ort-mx-quantize``; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    searched = args.auto_mixed_precision or (
        args.config is not None and args.config.upper() in MIXED_CONFIGS)
    if args.analyze and args.auto_mixed_precision:
        parser.error("--analyze and --auto-mixed-precision are separate runs")
    if args.config is None and not (args.analyze or searched):
        parser.error("--config is required (or --analyze / --auto-mixed-precision)")
    if args.output is None and not args.analyze:
        parser.error("OUTPUT is required (except with --analyze)")
    try:
        reader = None
        if args.calib:
            reader = NpzReader(args.calib, args.calib_batch)
        elif args.calib_reader:
            reader = _load_reader(args.calib_reader)
        if args.analyze or searched:
            placement = dict(op_types_to_quantize=tuple(args.op_types),
                             nodes_to_exclude=tuple(args.exclude),
                             quantize_all_op_types=args.all_op_types,
                             quantize_bias=args.quantize_bias, placement=args.placement)
            summary = _run_amp(args, reader, placement)
            if summary is None:
                return 0
        else:
            summary = _quantize(args, reader)
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


def _quantize(args: argparse.Namespace, reader):
    """The plain run: one config (with the kind and placement flags) over the model."""
    from .config import get_config
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
    return quantize_model(args.input, args.output, cfg, reader, progress=not args.quiet)


if __name__ == "__main__":
    sys.exit(main())
