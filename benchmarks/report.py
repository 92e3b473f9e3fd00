"""Outputs of a benchmark run: the JSON document, a Markdown report and PNG plots."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from ort_mx_ops.benchmarks.harness import memory_pages_phrase, uses_shared_pool

_LAYOUTS = ("innermost", "outer", "nchwc")  # harness.LAYOUTS, in the tables' order

__all__ = ["write_json", "markdown", "write_markdown", "write_plots", "fmt_size", "runs_phrase"]


def fmt_size(n: int) -> str:
    for unit, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return str(n)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def runs_phrase(min_runs: int, max_runs: int, warmup: int) -> str:
    """How each time was taken, e.g. "median of 5–30 interleaved runs after 2 warm-up runs"
    or "median of 2 interleaved runs after 1 warm-up run"."""
    runs = _count(max_runs, "interleaved run") if min_runs >= max_runs else \
        f"{min_runs}–{max_runs} interleaved runs"
    after = f"after {_count(warmup, 'warm-up run')}" if warmup else "without warm-up"
    return f"{'one run' if max_runs == 1 else 'median of ' + runs} {after}"


def write_json(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def _short(ep: str) -> str:
    return ep.replace("ExecutionProvider", "")


def _index(results: list[dict]) -> dict:
    idx = {}
    for r in results:
        idx[(r["ep"], r["dtype"], r["layout"], r["elements"], r["kind"], r["config"])] = r
    return idx


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def markdown(doc: dict) -> str:
    """Summary per EP and dtype at the largest size, then the size sweep of the custom op."""
    m = doc["machine"]
    res = doc["results"]
    idx = _index(res)
    out = ["# ort-mx-ops benchmark", ""]
    out.append(f"- machine: {m['cpu']} ({m['cpu_count']} CPUs; SIMD flags "
               f"{', '.join(m['cpu_simd_flags']) or 'none'}){'; GPUs: ' + ', '.join(m['gpus']) if m['gpus'] else ''}")
    v = m["versions"]
    out.append(f"- onnxruntime {v['onnxruntime']}, onnx {v['onnx']}, numpy {v['numpy']}, "
               f"ort_mx_ops {v['ort_mx_ops']}, Python {m['python']}; {m['time']}")
    o = doc["options"]
    # (documents from before thread_pool existed ran a pool per session)
    shared = uses_shared_pool(o["threads"], o.get("thread_pool", "session"))
    pool_text = "one pool shared by every session" if shared else "one pool per session"
    out.append(f"- intra-op threads: {o['threads'] or 'onnxruntime default'} ({pool_text}); "
               f"{runs_phrase(o['min_repeats'], o['max_repeats'], o['warmup'])}; GB/s counts "
               "bytes read + written; ×Neg / ×copy = the reference's "
               "median time / this one's, measured in the same rounds; (best): the same from "
               "each one's fastest run")
    pages = memory_pages_phrase(doc.get("memory_pages"))
    if pages:
        out.append(f"- {pages}")
    out.append("")
    groups = sorted({(r["ep"], r["dtype"]) for r in res})
    for ep, dtype in groups:
        sizes = sorted({r["elements"] for r in res if r["ep"] == ep and r["dtype"] == dtype})
        if not sizes:
            continue
        n = sizes[-1]
        out.append(f"## {_short(ep)}, {dtype}, {fmt_size(n)} elements")
        out.append("")
        has_other = any(r["kind"] == "other" for r in res if r["ep"] == ep)
        head = ["config", "layout", "ms", "Gelem/s", "GB/s", "×Neg", "×copy", "×Neg (best)",
                "×copy (best)", "standard ONNX GB/s", "speed-up vs standard"]
        if has_other:
            head += ["other library GB/s", "speed-up vs other"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        worst = None
        for layout in _LAYOUTS:
            refs = []
            for kind, label in (("ref:neg", "Neg (onnxruntime)"), ("ref:copy", "copy (Identity)"),
                                ("ref:numpy_copy", "copy (numpy)")):
                r = idx.get((ep, dtype, layout, n, kind, None))
                if r:
                    refs.append(r)
                    out.append(f"| *{label}* | {layout} | {r['median_s'] * 1e3:.2f} | "
                               f"{r['elements_per_s'] / 1e9:.2f} | {r['gb_per_s']:.1f} | "
                               f"{_ratio(r['ratio_to_neg'])} | {_ratio(r['ratio_to_copy'])} | "
                               f"{_ratio(r['ratio_to_neg_best'])} | {_ratio(r['ratio_to_copy_best'])} | | |"
                               + (" | |" if has_other else ""))
            configs = [r["config"] for r in res if r["ep"] == ep and r["dtype"] == dtype and
                       r["layout"] == layout and r["elements"] == n and r["kind"] == "custom"]
            for c in configs:
                r = idx[(ep, dtype, layout, n, "custom", c)]
                s = idx.get((ep, dtype, layout, n, "standard", c))
                row = [c, layout, f"{r['median_s'] * 1e3:.2f}", f"{r['elements_per_s'] / 1e9:.2f}",
                       f"{r['gb_per_s']:.1f}", _ratio(r["ratio_to_neg"]), _ratio(r["ratio_to_copy"]),
                       _ratio(r["ratio_to_neg_best"]), _ratio(r["ratio_to_copy_best"]),
                       f"{s['gb_per_s']:.2f}" if s else "–",
                       f"{r['elements_per_s'] / s['elements_per_s']:.1f}×" if s else "–"]
                if has_other:
                    ot = idx.get((ep, dtype, layout, n, "other", c))
                    row += [f"{ot['gb_per_s']:.2f}" if ot else "–",
                            f"{r['elements_per_s'] / ot['elements_per_s']:.1f}×" if ot else "–"]
                out.append("| " + " | ".join(row) + " |")
                if r["ratio_to_neg"] is not None and (worst is None or
                                                      r["ratio_to_neg"] < worst["ratio_to_neg"]):
                    worst = r
        out.append("")
        if worst:
            out.append(f"Worst configuration against Neg: **{worst['config']}** "
                       f"({worst['layout']}) at {worst['ratio_to_neg']:.2f}× Neg, "
                       f"{_ratio(worst['ratio_to_copy'])}× copy.")
            out.append("")
        bad = [r for r in res if r["ep"] == ep and r["dtype"] == dtype and
               r.get("mismatches_vs_custom")]
        if bad:
            out.append("Standard-ONNX / other-library outputs that differ in value from the "
                       "product's op: " + ", ".join(
                           f"{r['kind']} {r['config']} {r['layout']} {fmt_size(r['elements'])}: "
                           f"{r['mismatches_vs_custom']}" for r in bad[:20]))
            out.append("")
        # sweep
        if len(sizes) > 1:
            out.append(f"### {_short(ep)}, {dtype}: product op GB/s by size")
            out.append("")
            out.append("| config | layout | " + " | ".join(fmt_size(s) for s in sizes) + " |")
            out.append("|---|---|" + "---|" * len(sizes))
            rows = sorted({(r["kind"], r["config"] or "", r["layout"]) for r in res
                           if r["ep"] == ep and r["dtype"] == dtype and
                           r["kind"] in ("custom", "ref:neg", "ref:copy")},
                          key=lambda k: (k[0] != "ref:neg", k[0] != "ref:copy", k[2], k[1]))
            for kind, config, layout in rows:
                label = config if kind == "custom" else f"*{kind[4:]}*"
                cells = []
                for s in sizes:
                    r = idx.get((ep, dtype, layout, s, kind, config or None))
                    cells.append(f"{r['gb_per_s']:.1f}" if r else "–")
                out.append(f"| {label} | {layout} | " + " | ".join(cells) + " |")
            out.append("")
    if doc.get("errors"):
        out.append("## Variants that did not run")
        out.append("")
        seen = set()
        for e in doc["errors"]:
            key = (e.get("ep"), e.get("kind"), e.get("config"), e.get("dtype"), e["error"])
            if key in seen:
                continue
            seen.add(key)
            out.append(f"- {_short(e.get('ep', ''))} {e.get('dtype', '')} {e.get('kind')} "
                       f"{e.get('config') or ''}: {e['error']}")
        out.append("")
    return "\n".join(out)


def write_markdown(doc: dict, path: Path) -> Path:
    path.write_text(markdown(doc))
    return path


def write_plots(doc: dict, out_dir: Path) -> list[Path]:
    """One PNG per execution provider: GB/s against size, one line per configuration
    (the product's op), Neg and the copy dashed; a panel per (dtype, layout)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = doc["results"]
    order = list(dict.fromkeys(r["config"] for r in res if r["kind"] == "custom"))
    paths = []
    for ep in sorted({r["ep"] for r in res}):
        panels = sorted({(r["dtype"], r["layout"]) for r in res if r["ep"] == ep},
                        key=lambda p: (["float32", "float16", "bfloat16"].index(p[0]), p[1]))
        cols = 2 if len(panels) > 1 else 1
        rows_n = (len(panels) + cols - 1) // cols
        fig, axes = plt.subplots(rows_n, cols, figsize=(7 * cols, 4.5 * rows_n), squeeze=False)
        for ax, (dtype, layout) in zip(axes.flat, panels):
            lines: dict[tuple, list] = defaultdict(list)
            for r in res:
                if r["ep"] == ep and r["dtype"] == dtype and r["layout"] == layout and \
                        r["kind"] in ("custom", "ref:neg", "ref:copy"):
                    lines[(r["kind"], r["config"])].append((r["elements"], r["gb_per_s"]))
            for (kind, config), pts in sorted(lines.items(), key=lambda k: (k[0][0], k[0][1] or "")):
                pts.sort()
                xs, ys = zip(*pts)
                if kind == "custom":
                    color = plt.cm.tab20(order.index(config) % 20) if config in order else None
                    ax.plot(xs, ys, marker="o", markersize=3, label=config, color=color)
                else:
                    ax.plot(xs, ys, linestyle="--", color="black" if kind == "ref:neg" else "gray",
                            label={"ref:neg": "Neg (onnxruntime)", "ref:copy": "copy"}[kind])
            ax.set_xscale("log", base=2)
            ax.set_xlabel("elements")
            ax.set_ylabel("GB/s (read + write)")
            ax.set_title(f"{_short(ep)} · {dtype} · blocked axis {layout}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.suptitle(f"ort-mx-ops throughput, {_short(ep)}")
        fig.tight_layout()
        path = out_dir / f"throughput_{_short(ep).lower()}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def load(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
