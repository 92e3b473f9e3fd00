"""``ort-mx-quantize INPUT OUTPUT --config NAME``: the quantizer on the command line.

Calibration data (needed for ``--bf16-activation-scaled``, ``--analyze``,
``--auto-mixed-precision`` and the accuracy algorithms: ``--weight-rounding gptq``,
``--fast-finetune`` or a ``*_ADAQUANT`` config, ``--bias-correction``) comes from ``--calib``,
an .npz whose arrays are named after the model inputs with samples along axis 0 (one batch of
one sample each), or from ``--calib-reader module:callable`` returning a
``CalibrationDataReader``.

``--analyze`` prints the per-tensor sensitivity table (no OUTPUT needed; ``--analysis-json``
and ``--heatmap`` write it).  ``--auto-mixed-precision --candidates A B ... --target T
--metric top1|cosine|sqnr`` searches a format per tensor (with ``--weight-rounding gptq``, on GPTQ-rounded weights;
``--config BF16_MIXED_BFP16`` or
``BF16_MIXED_MXINT8`` run the same search over Quark's preset pair; ``MX9_INT8`` is MX9
activations over MXINT8 weights).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from typing import Optional, Sequence

import numpy as np

from .calibration import NpzReader
from .config import (config_names, DEFAULT_OP_TYPES, PLACEMENTS, MIXED_FORMAT_CONFIGS,
                     WEIGHT_STORAGES)
from .quantize import check_output, quantize_model
from .mixed_precision import DEFAULT_CANDIDATES, MIXED_CONFIGS, auto_mixed_precision
from .sensitivity import analyze_sensitivity

__all__ = ["main", "NpzReader"]


class UsageError(ValueError):
    """A bad flag value, reported as one line naming the flag."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line with status 2, not argparse's usage block
        _fail(f"{message} (see --help)")
        sys.exit(2)


# Python option names that quantize_model's messages may use, as the command line spells them.
_FLAGS = {"a calibration_data_reader": "--calib or --calib-reader",
          "bf16_activation_scaled": "--bf16-activation-scaled",
          "bf16_qdq_to_cast": "--bf16-cast", "bf16_qdq_fused": "--bf16-fused",
          "fold_weights=False": "--no-fold",
          "it needs fold_weights=True": "it cannot be combined with --no-fold",
          "weight_storage=": "--weight-storage ",
          "QuantizationConfig needs an activation or a weight FormatSpec":
          "--activation-config none and --weight-config none leave nothing to quantize"}


def _fail(message: object) -> int:
    """Print ``message`` as the one line of an error; returns the exit status, 2."""
    text = " ".join(str(message).split())
    for name, flag in _FLAGS.items():
        text = text.replace(name, flag)
    print(f"ort-mx-quantize: error: {text}", file=sys.stderr)
    return 2


def _config_name(allow_none: bool, mixed: bool = False):
    """An argparse type: a built-in config name (or "none" where allowed; with ``mixed``
    also the named mixed configs)."""
    def check(name: str) -> str:
        valid = config_names() + config_names(adaquant=True) + \
            (["none"] if allow_none else []) + (
            list(MIXED_FORMAT_CONFIGS) + list(MIXED_CONFIGS) if mixed else [])
        if name.upper() not in {v.upper() for v in valid}:
            raise argparse.ArgumentTypeError(f"unknown config {name!r}; choose one of "
                                             f"{', '.join(valid)}")
        return name
    return check


def _positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _npz_file(path: str) -> str:
    """An argparse type: an .npz that opens and holds arrays (NpzReader reads it later)."""
    try:
        with np.load(path) as npz:
            if not npz.files:
                raise ValueError("it holds no arrays")
    except Exception as exc:  # missing, not a zip, not an .npz
        raise argparse.ArgumentTypeError(f"cannot read {path} ({type(exc).__name__}: {exc})")
    return path


def _load_reader(spec: str):
    """The reader ``MODULE:CALLABLE`` returns; UsageError naming --calib-reader."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise UsageError(f"--calib-reader takes MODULE:CALLABLE, got {spec!r}")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise UsageError(f"--calib-reader: cannot import module {module!r} ({exc})") from None
    except AttributeError:
        raise UsageError(f"--calib-reader: module {module!r} has no {attr!r}") from None
    try:
        reader = factory()
    except Exception as exc:
        raise UsageError(f"--calib-reader: {spec}() raised {type(exc).__name__}: {exc}") \
            from None
    if not callable(getattr(reader, "get_next", None)):
        raise UsageError(f"--calib-reader: {spec}() returned a {type(reader).__name__}, not "
                         "a CalibrationDataReader (no get_next())")
    return reader


def _quantize_nchwc(args: argparse.Namespace, cfg, reader):
    """Quantize into a temporary file beside the output, then write the output through
    quantizer.nchwc; returns the quantization summary and the NCHWc report."""
    from .nchwc import optimize_nchwc, parse_shapes
    if args.external_data:
        raise ValueError("--nchwc writes onnxruntime's optimised graph as one file; "
                         "--external-data does not apply to it")
    check_output(args.input, args.output)
    shapes = parse_shapes(args.nchwc_shape, "--nchwc-shape")
    directory = os.path.dirname(os.path.abspath(args.output))
    with tempfile.TemporaryDirectory(dir=directory, prefix=".ort-mx-quantize-") as tmp:
        plain = os.path.join(tmp, "quantized.onnx")
        summary = quantize_model(args.input, plain, cfg, reader, progress=not args.quiet)
        report = optimize_nchwc(plain, args.output, shapes or None)
    return summary, report


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="ort-mx-quantize", description="Insert BFP / MX / BF16 quantize-dequantize nodes "
        "into an ONNX model (runs with the ort_mx_ops custom-op library). OUTPUT's directory "
        "must exist; every error is one line on stderr with exit status 2.", epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="float ONNX model")
    p.add_argument("output", nargs="?",
                   help="where to write the quantized model (never the input; not with "
                        "--analyze)")
    p.add_argument("--config", metavar="NAME", type=_config_name(False, mixed=True),
                   help=f"format for activations and weights: {', '.join(config_names())}; "
                        "NAME_ADAQUANT (e.g. MX6_ADAQUANT) adds fast finetune (needs --calib); "
                        f"or {', '.join(MIXED_FORMAT_CONFIGS)}, {', '.join(MIXED_CONFIGS)} "
                        "(searched, see --target)")
    p.add_argument("--tensor", action="append", metavar="NAME=CONFIG[:axis=N]",
                   help="a node on this tensor only, no automatic placement (repeatable; "
                        "replaces --config; without :axis=N the tensor's reader chooses the "
                        "axis as the quantizer does)")
    p.add_argument("--weight-config", metavar="NAME", type=_config_name(True),
                   help="a different format for weights (e.g. --config BF16 "
                        "--weight-config MXINT8); 'none' keeps weights float")
    p.add_argument("--activation-config", metavar="NAME", type=_config_name(True),
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
    p.add_argument("--weight-storage", choices=list(WEIGHT_STORAGES), default="folded",
                   help="how folded weights are written: float tensors (folded), packed codes "
                        "for MXDequantize / BFPDequantize (packed, several times smaller), or "
                        "standard DequantizeLinear (onnx; MXFP8, MXINT8, BF16) "
                        "(default: %(default)s)")
    p.add_argument("--legacy-names", action="store_true",
                   help="emit com.vai.quantize BFPFixNeuron / MXFixNeuron")
    p.add_argument("--bf16-cast", action="store_true",
                   help="BF16 as Cast(BFLOAT16) -> Cast(FLOAT) instead of Extended Q/DQ")
    p.add_argument("--bf16-fused", action="store_true",
                   help="BF16 as one BF16QuantizeDequantize node (this library's op: the "
                        "Extended Q/DQ pair's outputs in one pass) instead of the pair")
    p.add_argument("--bf16-weight-scaled", action="store_true",
                   help="BF16: rescale each weight by its range before rounding")
    p.add_argument("--bf16-activation-scaled", action="store_true",
                   help="BF16: rescale activations by their calibrated range (needs --calib)")
    p.add_argument("--calib", metavar="NPZ", type=_npz_file, help="calibration inputs (.npz, samples on axis 0)")
    p.add_argument("--calib-batch", type=_positive_int, default=1,
                   help="calibration batch size")
    p.add_argument("--calib-reader", metavar="MODULE:CALLABLE",
                   help="a callable returning a CalibrationDataReader")
    p.add_argument("--weight-rounding", choices=["nearest", "gptq"], default=None,
                   help="'gptq': error-compensating block rounding from the calibration "
                        "inputs' Hessian (needs --calib); default 'nearest'")
    p.add_argument("--fast-finetune", action="store_true",
                   help="AdaQuant per layer, as the *_ADAQUANT configs (needs --calib)")
    p.add_argument("--ff", action="append", default=[], metavar="KEY=VALUE",
                   help="a fast finetune option, in our or Quark's name (e.g. "
                        "NumIterations=200, LearningRate=1e-4, batch_size=4); implies "
                        "--fast-finetune; repeatable")
    p.add_argument("--bias-correction", action="store_true",
                   help="shift each bias by the mean output error its weight's quantization "
                        "causes (a following Add or BatchNormalization where the layer has "
                        "no bias input; needs --calib)")
    p.add_argument("--cross-layer-equalization", action="store_true",
                   help="equalize the per-channel weight ranges of consecutive layers "
                        "(float outputs unchanged; no calibration data needed)")
    p.add_argument("--hadamard-rotation", action="store_true",
                   help="rotate MatMul/Gemm reduction axes block-wise by a Hadamard matrix "
                        "(folded into the weight, an added float MatMul on the activation)")
    p.add_argument("--nchwc", action="store_true",
                   help="write the model pre-optimised by onnxruntime for this CPU, with the "
                        "nodes inside its NCHWc layout where that keeps every output bit "
                        "(hardware-specific; run it with graph optimisations off: "
                        "docs/quantizer.md)")
    p.add_argument("--nchwc-shape", action="append", default=[], metavar="NAME=D0xD1...",
                   help="with --nchwc: fix an input's shape (repeatable)")
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
                     help="top1, cosine, sqnr, or MODULE:CALLABLE (default %(default)s)")
    amp.add_argument("--objective", choices=["total", "weights"], default="total",
                     help="minimise weight_bits + activation_bits (total) or weight bits "
                          "first (weights)")
    amp.add_argument("--sensitivity-batches", type=_positive_int, default=None, metavar="N",
                     help="rank with the first N stacked calibration batches only (faster)")
    amp.add_argument("--max-batch", type=_positive_int, default=32, metavar="N",
                     help="stack calibration samples of one shape up to N per run")
    amp.add_argument("--analysis-json", metavar="FILE", help="--analyze: write the JSON")
    amp.add_argument("--heatmap", metavar="PNG",
                     help="--analyze: write a layers x formats heat map (needs matplotlib)")
    p.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    p.add_argument("--external-data", action="store_true",
                   help="store the tensors in OUTPUT.data beside the model (automatic from "
                        "2 GiB)")
    return p


def _value(text: str):
    """An option value from the command line: int, float, true/false, else the string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _finetune_options(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--ff takes KEY=VALUE, got {item!r}")
        out[key.strip()] = _value(value.strip())
    return out


def _metric(spec: str):
    """``--metric``: a built-in name, or the callable at MODULE:CALLABLE."""
    if ":" not in spec:
        return spec
    module, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--metric: cannot load {spec} ({exc})") from None


def _run_amp(args: argparse.Namespace, reader, placement: dict):
    """--analyze (prints, returns None) or the mixed-precision search (returns the summary)."""
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
                                sensitivity_batches=args.sensitivity_batches,
                                objective=args.objective,
                                weight_rounding=args.weight_rounding or "nearest", **placement)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``ort-mx-quantize``; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from .config import get_config

    if args.tensor:
        from .surgery import run_tensor_flags
        return run_tensor_flags(args)
    searched = args.auto_mixed_precision or (
        args.config is not None and args.config.upper() in MIXED_CONFIGS)
    if args.analyze and args.auto_mixed_precision:
        parser.error("--analyze and --auto-mixed-precision are separate runs")
    if args.config is None and not (args.analyze or searched):
        parser.error("the following arguments are required: --config (or --tensor); or "
                     "--analyze / --auto-mixed-precision")
    if args.output is None and not args.analyze:
        parser.error("the following arguments are required: output (except with --analyze)")
    if args.analyze or searched:
        placement = dict(op_types_to_quantize=tuple(args.op_types),
                         nodes_to_exclude=tuple(args.exclude),
                         quantize_all_op_types=args.all_op_types,
                         quantize_bias=args.quantize_bias, placement=args.placement)
        try:
            reader = None
            if args.calib:
                reader = NpzReader(args.calib, args.calib_batch)
            elif args.calib_reader:
                reader = _load_reader(args.calib_reader)
            summary = _run_amp(args, reader, placement)
        except (ValueError, OSError, RuntimeError, TypeError) as exc:
            return _fail(exc)
        if summary is None:
            return 0
        return _report(args, summary)

    try:
        formats = {k: v for k, v in (("activation", args.activation_config),
                                     ("weight", args.weight_config)) if v is not None}
        base = get_config(args.config, **formats)
        tuning: dict = {}
        if args.weight_rounding:
            tuning["weight_rounding"] = args.weight_rounding
        if args.fast_finetune or args.ff:
            tuning["fast_finetune"] = {**(base.fast_finetune.__dict__ if base.fast_finetune
                                          else {}), **_finetune_options(args.ff)}
        cfg = base.replace(
            bias_correction=args.bias_correction or base.bias_correction, **tuning,
            cross_layer_equalization=(args.cross_layer_equalization
                                      or base.cross_layer_equalization),
            hadamard_rotation=args.hadamard_rotation or base.hadamard_rotation,
            op_types_to_quantize=tuple(args.op_types), nodes_to_exclude=tuple(args.exclude),
            quantize_all_op_types=args.all_op_types, quantize_bias=args.quantize_bias,
            placement=args.placement, fold_weights=not args.no_fold,
            weight_storage=args.weight_storage,
            legacy_names=args.legacy_names, bf16_qdq_to_cast=args.bf16_cast,
            bf16_qdq_fused=args.bf16_fused,
            bf16_weight_scaled=args.bf16_weight_scaled,
            bf16_activation_scaled=args.bf16_activation_scaled)
        reader = None
        if args.calib:
            reader = NpzReader(args.calib, args.calib_batch)
        elif args.calib_reader:
            reader = _load_reader(args.calib_reader)
        report = None
        if args.nchwc:
            summary, report = _quantize_nchwc(args, cfg, reader)
        else:
            summary = quantize_model(args.input, args.output, cfg, reader,
                                     progress=not args.quiet, external_data=args.external_data)
    except (ValueError, OSError, RuntimeError) as exc:
        return _fail(exc)
    except Exception as exc:  # anything else still ends in one line, not a traceback
        return _fail(f"{type(exc).__name__}: {exc}")
    return _report(args, summary, report)


def _report(args: argparse.Namespace, summary, report=None) -> int:
    """Print the summary (unless --quiet; with the NCHWc rewrite's ``report`` where one was
    made) and write --summary-json."""
    if not args.quiet:
        print(summary)
        if report is not None:
            print(f"NCHWc block {report.block}: {len(report.rewritten)} nodes inside the "
                  f"blocked layout, layout conversions {report.reorders_before} -> "
                  f"{report.reorders_after}; {len(report.kept)} kept their conversions; "
                  f"{len(report.divisions_fused)} Div nodes taken into the node after them")
        print(f"wrote {args.output}")
    if args.summary_json:
        try:
            with open(args.summary_json, "w", encoding="utf-8") as f:
                json.dump(summary.as_dict(), f, indent=2)
        except OSError as exc:
            return _fail(f"--summary-json: cannot write {args.summary_json} ({exc}); the "
                         f"model was written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
