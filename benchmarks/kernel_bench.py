"""The CPU kernel alone: ``ort-mx-bench --kernel``.

Calls the block quantize-dequantize kernel directly (``ort_mx_ops._native.time_block_op``: no
onnxruntime session, no per-node overhead) on a set of activation shapes, one thread, and a
negation loop on the same arrays in the same rounds, so a change to the CPU walker shows
without onnxruntime's per-call cost around it. The default shapes are the activations of 4 Ki
elements and more that the quantizer's default placement quantizes in the OCR demo's direction
classifier (``ch_ppocr_mobile_v2.0_cls``, input 1x3x48x192), each as often as the model has it;
blocked along the channels, as there.

    ort-mx-bench --kernel                                   # every BFP / MX configuration
    ort-mx-bench --kernel --configs MXINT8,BFP16 --per-shape
    ort-mx-bench --kernel --shapes 256x16x16,64x56x56*2 --nchwc
    ort-mx-bench --kernel --nchwc --input hardswish         # inputs with -0, as after Hardswish
    MXOPS_CPU_ISA=avx2 ort-mx-bench --kernel                # another SIMD path
    ort-mx-bench --kernel --nchwc --input-divisor 6         # each element divided by 6 first
    ort-mx-bench --kernel --in-place                        # the output written over the input
    ort-mx-bench --kernel --other-native old/ort_mx_ops/_native.cpython-311-x86_64-linux-gnu.so

The negation loop is compiled for the baseline instruction set, as onnxruntime's ``Neg`` is;
``x Neg`` is its time over ours (higher is faster). Per array the best of ``--rounds`` calls
counts; a configuration's total is the sum over the shapes, each times its count. Each timed
pair follows an untimed negation of the same array (both find it in the caches, as a node
finds its input), and the arrays are copied onto 2 MiB pages where Linux grants them (the
same cache sets in every run; benchmarks/README.md). ``--other-native`` times another build's
``_native`` module (a file of another checkout's build) in the same process, the two builds in
alternating rounds, and reports each one's median over the rounds.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from types import ModuleType

import numpy as np

from ort_mx_ops.benchmarks import graphs, harness
from ort_mx_ops.formats import MAX_INPUT_DIVISOR

__all__ = ["CLASSIFIER_SHAPES", "INPUTS", "activation", "parse_shapes", "run", "compare",
           "load_other_native", "main"]

# (channels, height, width), count: see the module docstring.
CLASSIFIER_SHAPES: tuple[tuple[tuple[int, int, int], int], ...] = (
    ((200, 2, 96), 4), ((104, 3, 96), 1), ((3, 48, 192), 1), ((24, 12, 96), 1),
    ((88, 3, 96), 4), ((104, 2, 96), 1), ((8, 24, 96), 2), ((32, 6, 96), 3),
    ((24, 6, 96), 1), ((48, 3, 96), 2), ((40, 3, 96), 2), ((8, 12, 96), 2),
    ((32, 3, 96), 1), ((32, 2, 96), 3), ((8, 6, 96), 2), ((16, 3, 96), 5))


def parse_shapes(text: str) -> list[tuple[tuple[int, int, int], int]]:
    """'200x2x96*4,16x3x96' -> [((200, 2, 96), 4), ((16, 3, 96), 1)]: channels x height x
    width, optionally * how often it occurs."""
    shapes = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        dims, _, count = item.partition("*")
        try:
            c, h, w = (int(d) for d in dims.lower().split("x"))
            n = int(count) if count else 1
        except ValueError:
            raise ValueError(f"shape {item!r}: expected CxHxW or CxHxW*count") from None
        if min(c, h, w, n) < 1:
            raise ValueError(f"shape {item!r}: every dimension and the count must be >= 1")
        shapes.append(((c, h, w), n))
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


# The inputs --input offers: standard normal values, or Hardswish of three times those (as a
# CNN's activations after Hardswish: a sixth of the elements -0, from the inputs below -3).
INPUTS = ("normal", "hardswish")


def activation(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A float32 array of ``shape`` of the input ``kind`` (one of INPUTS)."""
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "normal":
        return x
    if kind == "hardswish":
        x = np.float32(3) * x
        return x * np.clip(x / np.float32(6) + np.float32(0.5), 0, 1)  # x * 0 = -0 for x < -3
    raise ValueError(f"unknown input {kind!r}; known: {', '.join(INPUTS)}")


def block_configs() -> list[str]:
    """The benchmark's BFP / MX configurations (BF16 has no block kernel)."""
    return [c for c in graphs.BENCH_CONFIGS if graphs.config_spec(c).op in ("BFP", "MX")]


def run(configs: list[str], shapes: list[tuple[tuple[int, int, int], int]],
        nchwc_block: int = 0, rounds: int = 200, seed: int = 0,
        input_kind: str = "normal", input_divisor: int = 0,
        native: ModuleType | None = None, in_place: bool = False) -> list[dict]:
    """Time each configuration on ``shapes`` ([1, C, H, W] float32 tensors of the input
    ``input_kind`` (see :func:`activation`), blocked along C; with ``nchwc_block`` the channels are rounded up to a multiple of it and
    the kernel reads the NCHWc memory order; with ``input_divisor`` the op's attribute of that
    name, each element divided by it as the kernel loads it; ``native``: the ``_native`` module
    to time, this package's by default; ``in_place``: the kernel writes its output over its
    input, as a node that onnxruntime runs in place, the input copied back before each call).
    Returns one row per configuration: totals and per-shape seconds (best calls) of the
    kernel and of the negation loop, and the fraction
    of the arrays' copies that Linux put on 2 MiB pages (where all of it, the arrays take
    the same cache sets in every run)."""
    if native is None:
        from ort_mx_ops import _native as native

    rng = np.random.default_rng(seed)
    tensors = []
    for (c, h, w), count in shapes:
        if nchwc_block:
            c = -(-c // nchwc_block) * nchwc_block
        tensors.append(((1, c, h, w), count, activation(input_kind, (1, c, h, w), rng)))
    rows = []
    for config in configs:
        spec = graphs.config_spec(config)
        if spec.op not in ("BFP", "MX"):
            raise ValueError(f"{config}: no block kernel (BFP / MX configurations only)")
        attrs = dict(spec.attrs, axis=1)
        if nchwc_block:
            attrs["nchwc_block"] = nchwc_block
        if input_divisor:
            attrs["input_divisor"] = input_divisor
        # in_place passed only when set: a build from before the option takes the call without it
        extra = {"in_place": True} if in_place else {}
        try:
            kernel, neg, huge = native.time_block_op(spec.op, [t for _, _, t in tensors], attrs,
                                                      rounds, **extra)
        except TypeError:
            if not in_place:
                raise
            raise ValueError("this _native build's time_block_op has no in_place (a build from "
                             "before the option)") from None
        per_shape = [{"shape": list(shape), "count": count, "kernel_s": k, "neg_s": n,
                      "x_neg": n / k}
                     for (shape, count, _), k, n in zip(tensors, kernel, neg)]
        elements = sum(int(np.prod(shape)) * count for shape, count, _ in tensors)
        total_k = sum(r["kernel_s"] * r["count"] for r in per_shape)
        total_n = sum(r["neg_s"] * r["count"] for r in per_shape)
        rows.append({"config": config, "elements": elements, "kernel_s": total_k,
                     "neg_s": total_n, "kernel_el_per_ns": elements / total_k * 1e-9,
                     "neg_el_per_ns": elements / total_n * 1e-9, "x_neg": total_n / total_k,
                     "huge_page_fraction": huge, "shapes": per_shape})
    return rows


def load_other_native(path: str) -> ModuleType:
    """Another build's ``_native`` extension module, loaded from the file ``path`` under a name
    of its own beside this package's (each build keeps its own symbols)."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location("ort_mx_ops_other_build._native", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: not a Python extension module")
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as e:
        raise ValueError(f"{path}: cannot load it as ort_mx_ops' _native module ({e})") from None
    if not hasattr(module, "time_block_op"):
        raise ValueError(f"{path}: has no time_block_op (not ort_mx_ops' _native module)")
    return module


def compare(configs: list[str], shapes: list[tuple[tuple[int, int, int], int]],
            other: ModuleType, alternations: int = 10, **run_kwargs) -> list[dict]:
    """:func:`run` with this package's kernel and with ``other`` (:func:`load_other_native`) in
    ``alternations`` rounds, the order alternating. Returns :func:`run`'s rows (from the first
    round, totals replaced by the medians over the rounds of this build's) with each
    configuration's ``other_kernel_s`` / ``other_neg_s`` (the other build's medians),
    ``other_x_neg`` and ``time_vs_other`` (this build's kernel time / the other's)."""
    from ort_mx_ops import _native

    builds = {"this": _native, "other": other}
    times: dict[str, dict[str, list[tuple[float, float]]]] = {"this": {}, "other": {}}
    first = None
    for r in range(alternations):
        for name in (("this", "other") if r % 2 == 0 else ("other", "this")):
            rows = run(configs, shapes, native=builds[name], **run_kwargs)
            if first is None and name == "this":
                first = rows
            for row in rows:
                times[name].setdefault(row["config"], []).append((row["kernel_s"], row["neg_s"]))
    out = []
    for row in first or []:
        mine, theirs = times["this"][row["config"]], times["other"][row["config"]]
        k, n = (statistics.median(t[i] for t in mine) for i in (0, 1))
        ok, on = (statistics.median(t[i] for t in theirs) for i in (0, 1))
        out.append(dict(row, kernel_s=k, neg_s=n, x_neg=n / k,
                        kernel_el_per_ns=row["elements"] / k * 1e-9,
                        neg_el_per_ns=row["elements"] / n * 1e-9, other_kernel_s=ok,
                        other_neg_s=on, other_x_neg=on / ok, time_vs_other=k / ok))
    return out


def _huge_pages(rows: list[dict]) -> str:
    """The rows' huge-page fractions in words: all, none, or the range in percent."""
    fractions = [r.get("huge_page_fraction", 0.0) for r in rows] or [0.0]
    if min(fractions) >= 1.0:
        return "all"
    if max(fractions) <= 0.0:
        return "none"
    return f"{min(fractions):.0%}-{max(fractions):.0%}"


def markdown(doc: dict) -> str:
    """The report of :func:`main` as Markdown."""
    o = doc["options"]
    m = doc["machine"]
    lines = ["# Kernel benchmark (the CPU kernel called directly)", "",
             f"- {m['cpu']}; SIMD path {doc['isa']}; one thread; best of {o['rounds']} calls "
             f"per array; nchwc_block {o['nchwc_block']}; input {o.get('input', 'normal')}"
             + (f" divided by {o['input_divisor']}" if o.get("input_divisor") else "")
             + ("; in place (the output over the input)" if o.get("in_place") else "")
             + harness.load_average_phrase(m)
             + f"; arrays on 2 MiB pages: {_huge_pages(doc['results'])}; {m['time']}", "",
             "| config | elements | ours µs | ours el/ns | Neg µs | Neg el/ns | ×Neg |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["results"]:
        lines.append(f"| {r['config']} | {r['elements']} | {r['kernel_s'] * 1e6:.1f} | "
                     f"{r['kernel_el_per_ns']:.2f} | {r['neg_s'] * 1e6:.1f} | "
                     f"{r['neg_el_per_ns']:.2f} | {r['x_neg']:.2f} |")
    if o.get("other_native"):
        lines += ["", f"## Against another build ({o['other_native']}; {o['alternations']} "
                  "alternating rounds, medians)", "",
                  "| config | this µs | other µs | time / other's | ×Neg this | ×Neg other |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in doc["results"]:
            lines.append(f"| {r['config']} | {r['kernel_s'] * 1e6:.1f} | "
                         f"{r['other_kernel_s'] * 1e6:.1f} | {r['time_vs_other']:.3f} | "
                         f"{r['x_neg']:.2f} | {r['other_x_neg']:.2f} |")
    if o["per_shape"]:
        lines += ["", "## Per shape (×Neg)", "",
                  "| shape [1, C, H, W] | count | " + " | ".join(r["config"] for r in doc["results"]) + " |",
                  "|---|---:|" + "---:|" * len(doc["results"])]
        for i, s in enumerate(doc["results"][0]["shapes"] if doc["results"] else []):
            cells = " | ".join(f"{r['shapes'][i]['x_neg']:.2f}" for r in doc["results"])
            lines.append(f"| {s['shape']} | {s['count']} | {cells} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ort-mx-bench --kernel",
        description="The CPU block kernel called directly (no onnxruntime), against a "
                    "negation loop on the same arrays, one thread.")
    p.add_argument("--kernel", action="store_true", help="this mode")
    p.add_argument("--configs", default="all",
                   help=f"comma separated of {', '.join(block_configs())} (default: all)")
    p.add_argument("--shapes", default=None,
                   help="CxHxW[*count], comma separated (default: the OCR demo's direction "
                        "classifier's activations of 4 Ki elements and more)")
    p.add_argument("--nchwc", action="store_true",
                   help="the NCHWc view: channels rounded up to this CPU's NCHWc block, the "
                        "kernel reading onnxruntime's blocked memory order")
    p.add_argument("--rounds", type=int, default=200, help="calls per array (best counts)")
    p.add_argument("--input", choices=INPUTS, default="normal",
                   help="the arrays' values: standard normal, or Hardswish of three times "
                        "those (a sixth -0, as a CNN's activations after Hardswish)")
    p.add_argument("--input-divisor", type=int, default=0, metavar="D",
                   help="the op's input_divisor attribute: each element divided by D as the "
                        "kernel loads it (as a Div by D before the node; default: none)")
    p.add_argument("--in-place", action="store_true",
                   help="the kernel writes its output over its input, as a node that "
                        "onnxruntime runs in place (the input copied back before each call)")
    p.add_argument("--other-native", default=None, metavar="PATH",
                   help="another build's _native extension module (ort_mx_ops/_native*.so of "
                        "another checkout), timed in alternating rounds with this one")
    p.add_argument("--alternations", type=int, default=10,
                   help="rounds of the two builds with --other-native (default 10)")
    p.add_argument("--per-shape", action="store_true", help="also a table per shape")
    p.add_argument("--out", default="bench-results", help="output folder")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    known = block_configs()
    configs = known if args.configs == "all" else [c.strip() for c in args.configs.split(",")
                                                   if c.strip()]
    for c in configs:
        if c not in known:
            raise SystemExit(f"unknown or non-block config {c!r}; known: {', '.join(known)}")
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if not 0 <= args.input_divisor <= MAX_INPUT_DIVISOR:
        raise SystemExit(f"--input-divisor must be 1 ... {MAX_INPUT_DIVISOR} (0: none)")
    if args.alternations < 1:
        raise SystemExit("--alternations must be at least 1")
    other = None
    if args.other_native:
        try:
            other = load_other_native(args.other_native)
        except (OSError, ValueError) as e:
            raise SystemExit(f"--other-native: {e}") from None
    try:
        shapes = parse_shapes(args.shapes) if args.shapes else list(CLASSIFIER_SHAPES)
    except ValueError as e:
        raise SystemExit(f"--shapes: {e}") from None
    block = 0
    if args.nchwc:
        block = harness.nchwc_block()
        if not block:
            raise SystemExit("--nchwc: onnxruntime uses no NCHWc layout on this CPU")
    from ort_mx_ops import _native

    kwargs = dict(nchwc_block=block, rounds=args.rounds, input_kind=args.input,
                  input_divisor=args.input_divisor, in_place=args.in_place)
    try:
        if other is not None:
            results = compare(configs, shapes, other, args.alternations, **kwargs)
        else:
            results = run(configs, shapes, **kwargs)
    except ValueError as e:
        raise SystemExit(f"ort-mx-bench --kernel: {e}") from None
    doc = {"machine": harness.machine_info(), "isa": _native.cpu_isa(),
           "options": {"configs": configs, "shapes": [[list(s), n] for s, n in shapes],
                       "nchwc_block": block, "rounds": args.rounds, "input": args.input,
                       "input_divisor": args.input_divisor, "in_place": args.in_place,
                       "other_native": args.other_native,
                       "alternations": args.alternations if other is not None else None,
                       "per_shape": args.per_shape},
           "results": results}
    text = markdown(doc)
    harness.write_results(args.out, "kernel_results", doc, text, args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
