"""The walk's structure alone: ``ort-mx-bench --walk-bound``.

With the blocked axis outer, the CPU kernel reads each block's rows twice (the greatest
magnitude down every column, then the results) or keeps them somewhere between the two
passes. This mode compiles ``walk_bound.cc`` (beside this file) with the machine's C++
compiler and times those structures with one vector operation per element in place of a
format's arithmetic, against a negation loop compiled for the baseline instruction set (as
onnxruntime's ``Neg`` is), one thread, on ``[rows, cols]`` float32 tensors blocked along the
rows. A format's kernel does more per element than these walks, so their ratio to the
negation loop bounds what the kernel (``ort-mx-bench --kernel``) can reach with that structure
on this machine. Each walk's output is checked bit for bit (it equals the input).

    ort-mx-bench --walk-bound                          # the default shapes, blocks of 32 rows
    ort-mx-bench --walk-bound --shapes 512x512 --block 16

Walks: ``rows`` (whole rows in order, both passes: the kernel's row walk), ``rows_reversed``
(the second pass from the block's last row up), ``columns`` (one column vector down the
block's rows, twice: the column walk), ``columns_in_registers`` (the same with the rows
kept in vector registers between the passes), ``columns_kept`` (two column vectors at a
time, the first pass copying the rows into a local buffer that the second reads: the column
walk's kept rows), ``strips`` (16 column vectors of each row at a time, 1 KiB with AVX-512:
the block's rows of a strip into column maxima held in registers, then the strip's rows
again; a tile walk as wide as the registers allow), ``tiles_kept`` (128 columns of each row,
512 bytes, copied into a local buffer by the first pass, which the second reads: the
kernel's kept tile).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ort_mx_ops.benchmarks import harness

__all__ = ["SOURCE", "WALKS", "DEFAULT_SHAPES", "parse_shapes", "build", "run", "markdown", "main"]

SOURCE = Path(__file__).with_name("walk_bound.cc")
WALKS = ("rows", "rows_reversed", "columns", "columns_in_registers", "columns_kept", "strips",
         "tiles_kept")
BLOCKS = (8, 16, 32)
# [rows, cols]: the op benchmark's 256 Ki, 1 Mi (rows 2 KiB and 4 KiB apart) and neighbours.
DEFAULT_SHAPES = ((512, 512), (256, 1024), (1024, 512), (1024, 1024))


def parse_shapes(text: str, block: int) -> list[tuple[int, int]]:
    """'512x512,256x1024' -> [(512, 512), (256, 1024)]; ``ValueError`` unless rows are a
    positive multiple of ``block`` and cols of 32 (two of the widest vectors)."""
    shapes = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        try:
            rows, cols = (int(d) for d in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"shape {item!r}: expected ROWSxCOLS") from None
        if rows < 1 or rows % block or cols < 1 or cols % 32:
            raise ValueError(f"shape {item!r}: rows must be a positive multiple of the block "
                             f"({block}) and cols a positive multiple of 32")
        shapes.append((rows, cols))
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise RuntimeError("--walk-bound needs a C++ compiler: none found (set CXX)")
    return cxx


def build(directory: Path) -> Path:
    """Compile walk_bound.cc into ``directory``: the negation loop at the compiler's baseline
    flags, the walks at -march=native. Returns the program; ``RuntimeError`` with the
    compiler's message where a step fails."""
    cxx = _compiler()
    negation, program = directory / "negation.o", directory / "walk_bound"
    flags = [cxx, "-O3", "-std=c++17"]
    steps = [flags + ["-DWALK_BOUND_NEGATION", "-c", str(SOURCE), "-o", str(negation)],
             flags + ["-march=native", str(SOURCE), str(negation), "-o", str(program)]]
    for cmd in steps:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise RuntimeError(f"cannot run the C++ compiler {cxx!r}: {e}") from None
        if done.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} failed ({' '.join(cmd)}):\n{done.stderr}")
    return program


def run(program: Path, shape: tuple[int, int], block: int, rounds: int,
        output_offset: int = 0) -> dict:
    """One run of the program on a [rows, cols] tensor: its JSON, each walk's ``x_negation``
    (the negation loop's best time over the walk's) added. ``output_offset``: bytes from the
    output buffer's 2 MiB boundary to its first element (0: the output's rows in the input's
    L1 sets). ``RuntimeError`` where a walk's output differs from its input or the program
    fails."""
    rows, cols = shape
    done = subprocess.run([str(program), str(rows), str(cols), str(block), str(rounds),
                           str(output_offset)], capture_output=True, text=True)
    if done.returncode != 0:
        doc = json.loads(done.stdout) if done.returncode == 3 and done.stdout.strip() else None
        wrong = [w["name"] for w in doc["walks"] if not w["equal"]] if doc else []
        raise RuntimeError(f"walk_bound {rows}x{cols} block {block}: "
                           + (f"outputs differ from the input: {', '.join(wrong)}" if wrong
                              else f"exit {done.returncode}: {done.stderr.strip()}"))
    doc = json.loads(done.stdout)
    negation = next(w for w in doc["walks"] if w["name"] == "negation")["best_us"]
    for w in doc["walks"]:
        w["x_negation"] = negation / w["best_us"]
    return doc


def markdown(doc: dict) -> str:
    """The results as a Markdown table: each walk's best time and ratio to the negation loop."""
    m, o = doc["machine"], doc["options"]
    lanes = doc["results"][0]["lanes"] if doc["results"] else "?"
    lines = ["# The walk's structure alone (ort-mx-bench --walk-bound)", "",
             f"- {m.get('cpu')}; {lanes} float lanes a vector (-march=native); one thread; "
             f"blocks of {o['block']} rows down the first axis; the output "
             + (f"{o['output_offset']} bytes past the input's L1 sets; " if o["output_offset"]
                else "in the input's L1 sets; ")
             + f"best of {o['rounds']} calls, "
             f"walks taking turns{harness.load_average_phrase(m)}; {m['time']}",
             "- ×negation: a negation loop's time (baseline instructions) over the walk's; "
             "every walk's output checked bit for bit", "",
             "| shape | negation µs | "
             + " | ".join(f"{w} µs (×negation)" for w in WALKS) + " |",
             "|---|---:|" + "---:|" * len(WALKS)]
    for r in doc["results"]:
        by = {w["name"]: w for w in r["walks"]}
        cells = [f"{by[w]['best_us']:.1f} ({by[w]['x_negation']:.2f})" for w in WALKS]
        lines.append(f"| [{r['rows']}, {r['cols']}] | {by['negation']['best_us']:.1f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ort-mx-bench --walk-bound",
        description="The blocked-axis-outer walks' structure alone (one vector operation an "
                    "element), compiled here, against a negation loop, one thread.")
    p.add_argument("--walk-bound", action="store_true", help="this mode")
    p.add_argument("--shapes", default=None,
                   help="ROWSxCOLS, comma separated (default: "
                        + ",".join(f"{r}x{c}" for r, c in DEFAULT_SHAPES) + ")")
    p.add_argument("--block", type=int, choices=BLOCKS, default=32, help="rows a block")
    p.add_argument("--rounds", type=int, default=300, help="calls per walk (best counts)")
    p.add_argument("--output-offset", type=int, default=0,
                   help="bytes the output lies past the input's place in the L1 sets (a "
                        "multiple of 64 below 4096; default 0: the same sets, as two buffers "
                        "on 2 MiB boundaries)")
    p.add_argument("--out", default="bench-results", help="output folder")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if not 0 <= args.output_offset < 4096 or args.output_offset % 64:
        raise SystemExit("--output-offset must be a multiple of 64 in [0, 4096)")
    try:
        shapes = parse_shapes(args.shapes, args.block) if args.shapes else [
            s for s in DEFAULT_SHAPES if s[0] % args.block == 0]
    except ValueError as e:
        raise SystemExit(f"--shapes: {e}") from None
    machine = harness.machine_info()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            program = build(Path(tmp))
            results = [run(program, s, args.block, args.rounds, args.output_offset) for s in shapes]
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    doc = {"machine": machine, "options": {"shapes": [list(s) for s in shapes],
                                           "block": args.block, "rounds": args.rounds,
                                           "output_offset": args.output_offset},
           "results": results}
    text = markdown(doc)
    harness.write_results(args.out, "walk_bound", doc, text, args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
