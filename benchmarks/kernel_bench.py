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

The negation loop is compiled for the baseline instruction set, as onnxruntime's ``Neg`` is;
``x Neg`` is its time over ours (higher is faster). Per array the best of ``--rounds`` calls
counts; a configuration's total is the sum over the shapes, each times its count. Each timed
pair follows an untimed negation of the same array (both find it in the caches, as a node
finds its input), and the arrays are copied onto 2 MiB pages where Linux grants them (the
same cache sets in every run; benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from ort_mx_ops.benchmarks import graphs, harness
from ort_mx_ops.formats import MAX_INPUT_DIVISOR

__all__ = ["CLASSIFIER_SHAPES", "INPUTS", "activation", "parse_shapes", "run", "main"]

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
        input_kind: str = "normal", input_divisor: int = 0) -> list[dict]:
    """Time each configuration on ``shapes`` ([1, C, H, W] float32 tensors of the input
    ``input_kind`` (see :func:`activation`), blocked along C; with ``nchwc_block`` the channels are rounded up to a multiple of it and
    the kernel reads the NCHWc memory order; with ``input_divisor`` the op's attribute of that
    name, each element divided by it as the kernel loads it). Returns one row per configuration: totals and
    per-shape seconds (best calls) of the kernel and of the negation loop, and the fraction
    of the arrays' copies that Linux put on 2 MiB pages (where all of it, the arrays take
    the same cache sets in every run)."""
    from ort_mx_ops import _native

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
        kernel, neg, huge = _native.time_block_op(spec.op, [t for _, _, t in tensors], attrs,
                                                  rounds)
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
             + harness.load_average_phrase(m)
             + f"; arrays on 2 MiB pages: {_huge_pages(doc['results'])}; {m['time']}", "",
             "| config | elements | ours µs | ours el/ns | Neg µs | Neg el/ns | ×Neg |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["results"]:
        lines.append(f"| {r['config']} | {r['elements']} | {r['kernel_s'] * 1e6:.1f} | "
                     f"{r['kernel_el_per_ns']:.2f} | {r['neg_s'] * 1e6:.1f} | "
                     f"{r['neg_el_per_ns']:.2f} | {r['x_neg']:.2f} |")
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

    results = run(configs, shapes, block, args.rounds, input_kind=args.input,
                  input_divisor=args.input_divisor)
    doc = {"machine": harness.machine_info(), "isa": _native.cpu_isa(),
           "options": {"configs": configs, "shapes": [[list(s), n] for s, n in shapes],
                       "nchwc_block": block, "rounds": args.rounds, "input": args.input,
                       "input_divisor": args.input_divisor,
                       "per_shape": args.per_shape},
           "results": results}
    text = markdown(doc)
    harness.write_results(args.out, "kernel_results", doc, text, args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
