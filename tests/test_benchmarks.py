"""Smoke test of the benchmark harness: the tiny sweep runs and writes well-formed JSON,
Markdown and PNG outputs. Times are not checked (speed is reported by benchmarks, not tests)."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from conftest import assert_bits_equal, native_and_reference
from ort_mx_ops.benchmarks import graphs, report
from ort_mx_ops.benchmarks.cli import build_parser
from ort_mx_ops.formats import CONFIGS

import ort_mx_ops

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny sweep's output folder; plots only where matplotlib is installed, so that the
    JSON and Markdown checks never depend on it."""
    out = tmp_path_factory.mktemp("bench")
    plots = [] if _has_matplotlib() else ["--no-plots"]
    proc = subprocess.run([sys.executable, "-m", "ort_mx_ops.benchmarks", "--tiny", "--ep", "CPU",
                           "--out", str(out), "--quiet", *plots], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_tiny_sweep_json(tiny_run):
    doc = json.loads((tiny_run / "results.json").read_text())
    assert doc["machine"]["versions"]["onnxruntime"] == ort.__version__
    assert "CPUExecutionProvider" in doc["machine"]["onnxruntime_providers"]
    res = doc["results"]
    kinds = {(r["kind"], r["config"], r["layout"], r["elements"]) for r in res}
    for n in (4096, 16384):
        for layout in ("innermost", "outer"):
            assert ("ref:neg", None, layout, n) in kinds
            assert ("ref:copy", None, layout, n) in kinds
            for config in CONFIGS:
                assert ("custom", config, layout, n) in kinds
                assert ("standard", config, layout, n) in kinds
    for r in res:
        assert r["ep"] == "CPUExecutionProvider" and r["dtype"] == "float32"
        assert r["median_s"] > 0 and r["runs"] >= 1 and len(r["times_s"]) == r["runs"]
        assert r["gb_per_s"] > 0 and r["elements_per_s"] > 0
        assert r["ratio_to_neg"] > 0 and r["ratio_to_copy"] > 0
        assert np.prod(r["shape"]) == r["elements"]
        if r["kind"] == "ref:copy":
            assert r["output_equals_input"]  # the copy really copies
        if r["kind"] == "custom":
            assert r["output_written"]
        if r["kind"] == "standard":
            # same op in value for finite normal inputs (signed zeros may differ)
            assert r["mismatches_vs_custom"] == 0, r
    assert not [e for e in doc["errors"] if e["kind"] in ("custom", "standard", "ref:neg")]


def test_tiny_sweep_markdown(tiny_run):
    md = (tiny_run / "results.md").read_text()
    assert md.startswith("# ort-mx-ops benchmark")
    assert "| config | layout |" in md and "Worst configuration against Neg" in md
    for config in CONFIGS:
        assert f"| {config} | innermost |" in md
    # --tiny: exactly 2 timed runs after 1 warm-up run, said so in plain words.
    assert "median of 2 interleaved runs after 1 warm-up run;" in md
    assert "2–2" not in md and "1 warm-up runs" not in md


def test_tiny_sweep_records_the_memory_pages(tiny_run):
    doc = json.loads((tiny_run / "results.json").read_text())
    pages = doc["memory_pages"]
    if not Path("/proc/self/smaps_rollup").exists():
        assert pages is None
        return
    assert pages["rss_kib"] > 0 and 0 <= pages["anon_huge_pages_kib"] <= pages["rss_kib"]
    assert pages["glibc_tunables"] == os.environ.get("GLIBC_TUNABLES")
    md = (tiny_run / "results.md").read_text()
    assert f"{pages['rss_kib'] / 1024:.0f} MiB resident" in md


def _transparent_huge_pages_mode() -> str | None:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else None


def test_glibc_tunable_puts_onnxruntime_buffers_on_huge_pages():
    """What benchmarks/README.md tells users: with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 the
    buffers onnxruntime allocates lie on transparent huge pages (glibc 2.35+, THP madvise or
    always), which process_memory_pages reports."""
    libc, version = platform.libc_ver()
    if libc != "glibc" or tuple(int(v) for v in version.split(".")[:2]) < (2, 35):
        pytest.skip(f"needs glibc 2.35 or later (here: {libc or 'no glibc'} {version})")
    if _transparent_huge_pages_mode() not in ("madvise", "always"):
        pytest.skip(f"transparent huge pages are {_transparent_huge_pages_mode()} here")
    script = (
        "import numpy as np, onnx, onnxruntime as ort\n"
        "from onnx import helper, TensorProto\n"
        "from ort_mx_ops.benchmarks.harness import process_memory_pages\n"
        "x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [8, 1024, 1024])\n"
        "y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [8, 1024, 1024])\n"
        "g = helper.make_graph([helper.make_node('Neg', ['x'], ['y'])], 'g', [x], [y])\n"
        "m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)])\n"
        "s = ort.InferenceSession(m.SerializeToString(), providers=['CPUExecutionProvider'])\n"
        "out = s.run(None, {'x': np.ones((8, 1024, 1024), np.float32)})[0]\n"
        "assert (out == -1).all()\n"
        "print(process_memory_pages()['anon_huge_pages_kib'])\n")
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the input and the output are 32 MiB each; without the tunable none of it lies on huge
    # pages (THP in madvise mode). At least one 2 MiB page, as a fragmented machine's kernel
    # may back the rest with small pages.
    assert int(proc.stdout.split()[-1]) >= 2048


def test_runs_phrase_counts_and_ranges():
    assert report.runs_phrase(5, 30, 2) == "median of 5–30 interleaved runs after 2 warm-up runs"
    assert report.runs_phrase(3, 3, 0) == "median of 3 interleaved runs without warm-up"
    assert report.runs_phrase(1, 1, 1) == "one run after 1 warm-up run"


def test_help_lists_allowed_values_and_defaults():
    text = " ".join(build_parser().format_help().split())
    assert "float32, float16, bfloat16 (default: float32,float16,bfloat16; --tiny: float32)" \
        in text
    assert "of innermost (blocked axis 1 of a [rows, cols] tensor), outer (blocked axis 0) and " \
        "nchwc (a [1, rows, cols] tensor in onnxruntime's NCHWc memory order, blocked along its " \
        "rows; CPU, BFP / MX configurations) (default: innermost,outer)" in text


def test_tiny_sweep_png(tiny_run):
    pytest.importorskip("matplotlib")
    png = tiny_run / "throughput_cpu.png"
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000


@pytest.mark.parametrize("config", [c for c in CONFIGS])
@pytest.mark.parametrize("axis", [0, 1])
def test_standard_onnx_graph_matches_op(config, axis):
    """The standard-ONNX form is the same op in value on finite normal inputs of wide range."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((64, 96)) * 2.0 ** rng.integers(-40, 40, (64, 96))).astype(np.float32)
    so = ort.SessionOptions()
    ort_mx_ops.register(so)
    want = ort.InferenceSession(graphs.custom_qdq_model(config, x.shape, axis, "float32"),
                                so).run(None, {"X": x})[0]
    got = ort.InferenceSession(graphs.standard_qdq_model(config, x.shape, axis, "float32")
                               ).run(None, {"X": x})[0]
    np.testing.assert_array_equal(got, want)


def test_parse_size():
    from ort_mx_ops.benchmarks.cli import parse_size
    assert parse_size("4Ki") == 4096 and parse_size("16Mi") == 1 << 24 and parse_size("512") == 512


@pytest.mark.parametrize("config", [c for c, s in CONFIGS.items() if s.op != "BF16"])
@pytest.mark.parametrize("lanes", [8, 16])
def test_nchwc_layout_graph_reads_the_blocked_memory(config, lanes):
    """The nchwc layout's graph is the op with nchwc_block: bit for bit the numpy reference of
    the tensor stored in the NCHWc memory order."""
    spec = CONFIGS[config]
    rng = np.random.default_rng(lanes)
    x = (rng.standard_normal((1, 64, 96)) * 2.0 ** rng.integers(-20, 20, (1, 64, 96))).astype(np.float32)
    so = ort.SessionOptions()
    ort_mx_ops.register(so)
    got = ort.InferenceSession(graphs.custom_qdq_model(config, x.shape, 1, "float32", nchwc_block=lanes),
                               so, providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    _, ref = native_and_reference(spec.op)
    assert_bits_equal(got, ref(x, **dict(spec.attrs, axis=1, nchwc_block=lanes)), f"{config} L={lanes}")
    with pytest.raises(ValueError, match="NCHWc"):
        graphs.custom_qdq_model("BF16", x.shape, 1, "float32", nchwc_block=lanes)


def test_nchwc_layout_sweep(tmp_path):
    """--layouts nchwc: a [1, rows, cols] point with our op for every BFP / MX configuration
    (BF16 reported as not run), or, where onnxruntime keeps no NCHWc layout on this CPU, that
    reason; the Markdown table has the layout's rows."""
    from ort_mx_ops.quantizer.nchwc import nchwc_block_size
    proc = subprocess.run([sys.executable, "-m", "ort_mx_ops.benchmarks", "--ep", "CPU",
                           "--sizes", "4Ki", "--layouts", "nchwc", "--dtypes", "float32",
                           "--warmup", "0", "--repeats", "1", "--max-repeats", "2", "--min-time", "0",
                           "--no-plots", "--quiet", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "results.json").read_text())
    custom = {r["config"]: r for r in doc["results"] if r["kind"] == "custom"}
    if nchwc_block_size() == 0:
        assert not custom and any("NCHWc" in e["error"] for e in doc["errors"])
        return
    assert set(custom) == {c for c, s in CONFIGS.items() if s.op != "BF16"}
    for r in custom.values():
        assert r["layout"] == "nchwc" and r["shape"] == [1, 64, 64] and r["ratio_to_neg"] > 0
        assert r["output_written"]
    assert {e["config"] for e in doc["errors"] if "NCHWc" in e["error"]} >= {"BF16", "BF16fused"}
    assert not any(r["kind"] == "standard" for r in doc["results"])
    md = (tmp_path / "results.md").read_text()
    assert "| MXINT8 | nchwc |" in md


def test_tiny_sweep_records_the_thread_pool(tiny_run):
    doc = json.loads((tiny_run / "results.json").read_text())
    assert doc["options"]["thread_pool"] == "shared"
    assert "one pool shared by every session" in (tiny_run / "results.md").read_text()


def test_thread_pool_choice():
    """A shared pool is onnxruntime's global one, sized once per process (run in a child
    process: this one's sessions must keep their own pools); one thread needs none."""
    code = """
import numpy as np, onnxruntime as ort
from ort_mx_ops.benchmarks import graphs, harness
so = harness.session_options(2, "shared")
assert so.use_per_session_threads is False
x = np.linspace(-3, 3, 64 * 64, dtype=np.float32).reshape(64, 64)
sess = ort.InferenceSession(graphs.reference_model("neg", (64, 64), "float32"), so,
                            providers=["CPUExecutionProvider"])
assert np.array_equal(sess.run(None, {"X": x})[0], -x)
own = harness.session_options(1, "shared")
assert own.use_per_session_threads is True and own.intra_op_num_threads == 1
assert harness.session_options(3, "session").intra_op_num_threads == 3
def refused(threads, pool, says):
    try:
        harness.session_options(threads, pool)
    except ValueError as e:
        assert says in str(e), e
    else:
        raise AssertionError(f"session_options({threads}, {pool!r}) was accepted")
refused(3, "shared", "2 thread(s)")  # the shared pool is sized once per process
refused(2, "global", "shared, session")
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_thread_pool_option():
    assert build_parser().parse_args([]).thread_pool == "shared"
    assert build_parser().parse_args(["--thread-pool", "session"]).thread_pool == "session"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--thread-pool", "global"])
