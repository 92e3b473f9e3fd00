"""Smoke test of the model-level benchmark (``ort-mx-bench --model``): a tiny CNN and a tiny
MatMul model run through it; the report has its structure and its numbers are real (times
positive, shares within [0, 1] and adding up, our nodes counted).  Speed is not asserted."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_mx_ops.benchmarks import model_bench


def _conv_chain(path, channels=16, size=12, dynamic=True):
    """x -> Conv -> Relu -> Conv -> Conv -> y, channels a multiple of onnxruntime's NCHWc
    block so the convolutions run in the blocked layout."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    cin = 3
    for i in range(3):
        w = numpy_helper.from_array(
            (rng.standard_normal((channels, cin, 3, 3)) * 0.2).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1],
                                      name=f"conv{i}"))
        prev = f"c{i}"
        if i == 0:
            nodes.append(helper.make_node("Relu", [prev], ["r0"], name="relu0"))
            prev = "r0"
        cin = channels
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    dims = [1, 3, "h" if dynamic else size, "w" if dynamic else size]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         [1, channels] + dims[2:])], inits)
    onnx.save(helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 13)]),
              str(path))
    return str(path)


def _token_matmul(path):
    """ids -> Gather(embedding) -> MatMul -> y: an integer input with a free sequence axis."""
    rng = np.random.default_rng(1)
    emb = numpy_helper.from_array(rng.standard_normal((2048, 32)).astype(np.float32), "emb")
    w = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "w")
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]),
             helper.make_node("MatMul", ["e", "w"], ["y"])]
    g = helper.make_graph(nodes, "tok", [helper.make_tensor_value_info(
        "ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 32])],
        [emb, w])
    onnx.save(helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 13)]),
              str(path))
    return str(path)


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("model_bench")
    model = _conv_chain(d / "chain.onnx")
    out = d / "out"
    proc = subprocess.run([sys.executable, "-m", "ort_mx_ops.benchmarks", "--model", model,
                           "--shape", "x=1x3x12x12", "--configs", "MX9,MXINT8,BF16", "--tiny",
                           "--out", str(out), "--quiet"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "model_results.json").read_text()), (out / "model_results.md")


def test_report_structure(cnn_run):
    doc, md = cnn_run
    assert doc["kind"] == "model" and doc["inputs"] == {"x": [1, 3, 12, 12]}
    assert [r["variant"] for r in doc["results"]] == ["float", "MX9", "MXINT8", "BF16",
                                                       "BF16fused"]
    text = md.read_text()
    for variant in ("float", "MX9", "MXINT8", "BF16", "BF16fused", "ReorderInput", "Conv"):
        assert f"| {variant} |" in text
    # BF16 in one node per tensor: half the pair's nodes, the pair's bits
    by = {r["variant"]: r for r in doc["results"]}
    assert by["BF16fused"]["profile"]["ours_nodes"] * 2 == by["BF16"]["profile"]["ours_nodes"]
    assert by["BF16fused"]["bit_identical_to_same_as"] and by["BF16fused"]["same_as"] == "BF16"
    assert len(doc["load_average_before"]) == 3
    pages = doc["memory_pages"]  # None only where /proc/self/smaps_rollup is missing
    assert pages is None or pages["rss_kib"] >= pages["anon_huge_pages_kib"] >= 0
    assert pages is None or f"{pages['rss_kib'] / 1024:.0f} MiB resident" in text


def test_numbers_are_real(cnn_run):
    doc, _ = cnn_run
    float_row = doc["results"][0]
    assert float_row["ratio_to_float"] == 1.0 and float_row["profile"]["ours_nodes"] == 0
    for r in doc["results"]:
        assert r["runs"] == len(r["times_s"]) >= 3
        assert all(t > 0 for t in r["times_s"]) and r["min_s"] <= r["median_s"]
        assert r["ratio_to_float"] > 0 and r["ratio_to_float_best"] > 0
        assert r["ratio_to_float_paired"] > 0 and r["node_time_ratio_to_float"] > 0
        # warm: the median of each turn's runs after its first (--warm-runs, default 4)
        assert doc["options"]["warm_runs"] == 4 and len(r["warm_times_s"]) == r["runs"]
        assert all(t > 0 for t in r["warm_times_s"])
        assert r["warm_median_s"] == statistics.median(r["warm_times_s"])
        assert r["ratio_to_float_warm"] == pytest.approx(
            r["warm_median_s"] / float_row["warm_median_s"])
        assert r["ratio_to_float_warm_paired"] > 0
        p = r["profile"]
        assert p["node_seconds"] > 0
        assert all(o["seconds"] > 0 and o["nodes"] >= 1 for o in p["ops"].values())
        shares = [o["share"] for o in p["ops"].values()]
        assert all(0 <= s <= 1 for s in shares)
        assert sum(shares) == pytest.approx(1.0, abs=1e-9)
        assert 0 <= p["ours_share"] + p["layout_share"] <= 1 + 1e-9
        assert p["ours_seconds"] == pytest.approx(
            sum(o["seconds"] for op, o in p["ops"].items()
                if op.endswith(("QuantizeDequantize", "QuantizeLinear", "DequantizeLinear"))))
        for group, seconds, nodes in (("ours", p["ours_seconds"], p["ours_nodes"]),
                                      ("layout", p["layout_seconds"], p["layout_nodes"])):
            cells = p["by_size"][group].values()
            assert sum(c["nodes"] for c in cells) == nodes
            assert sum(c["seconds"] for c in cells) == pytest.approx(seconds)
            assert all(c["elements"] >= c["nodes"] for c in cells)
        if r["variant"] != "float":  # a node on x (3 x 12 x 12), two on 16 x 12 x 12 tensors
            per_site = 2 if r["variant"] == "BF16" else 1
            assert {b: c["nodes"] for b, c in p["by_size"]["ours"].items()} == \
                {"<=1Ki": per_site, "1Ki-16Ki": 2 * per_site}
            assert p["by_size"]["ours"]["<=1Ki"]["elements"] == 432 * per_site
        # three convolutions of 16 channels: onnxruntime converts layouts in every variant
        assert p["ops"]["ReorderOutput"]["nodes"] >= 1
    for r in doc["results"][1:]:
        # one runtime node per Conv input (BF16: a quantize + dequantize pair)
        assert r["profile"]["ours_nodes"] == r["runtime_nodes"] == (6 if r["variant"] == "BF16"
                                                                    else 3)
        assert r["finite_where_float_is"] and 0 < r["max_abs_diff_vs_float"] < 10


def test_token_input_and_errors(tmp_path):
    model = _token_matmul(tmp_path / "tok.onnx")
    opts = model_bench.ModelOptions(model=model, configs=["MXINT8"], seq_len=7, warmup=1,
                                    rounds=2, min_time=0.0, profile_runs=1, warm_runs=0,
                                    log=lambda s: None)
    doc = model_bench.run_model_bench(opts)
    assert doc["inputs"] == {"ids": [1, 7]}
    # warm_runs 0: cold runs only, and the report says nothing of warm ones
    assert all("warm_median_s" not in r and r["runs"] == 2 for r in doc["results"])
    assert "(warm" not in model_bench.markdown(doc)
    q = doc["results"][1]
    # the weight is folded offline: one runtime node, on the MatMul's activation input
    assert q["profile"]["ours_nodes"] == q["runtime_nodes"] == 1
    assert q["profile"]["layout_nodes"] == 0
    with pytest.raises(ValueError, match="--shape x="):
        model_bench.run_model_bench(model_bench.ModelOptions(
            model=_conv_chain(tmp_path / "c.onnx"), configs=["MX9"], log=lambda s: None))
    with pytest.raises(FileNotFoundError):
        model_bench.run_model_bench(model_bench.ModelOptions(
            model=str(tmp_path / "missing.onnx"), configs=["MX9"], log=lambda s: None))
    proc = subprocess.run([sys.executable, "-m", "ort_mx_ops.benchmarks", "--model",
                           str(tmp_path / "missing.onnx")], capture_output=True, text=True)
    assert proc.returncode == 2 and "not found" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "ort_mx_ops.benchmarks", "--model", model,
                           "--warm-runs", "-1"], capture_output=True, text=True)
    assert proc.returncode != 0 and "--warm-runs must be 0 or more" in proc.stderr


def test_nchwc_variants(tmp_path):
    """--nchwc: the pre-optimised float model as control, each config's pre-optimised model,
    bit-identical to the config's own outputs."""
    from ort_mx_ops.quantizer.nchwc import nchwc_block_size
    block = nchwc_block_size()
    if block == 0:
        pytest.skip("onnxruntime uses no NCHWc layout here")
    model = _conv_chain(tmp_path / "chain.onnx")
    opts = model_bench.ModelOptions(model=model, configs=["BFP16", "MXINT8"],
                                    shapes={"x": [1, 3, 12, 12]}, warmup=1, rounds=2,
                                    min_time=0.0, profile_runs=1, nchwc=True,
                                    log=lambda s: None)
    doc = model_bench.run_model_bench(opts)
    rows = {r["variant"]: r for r in doc["results"]}
    assert list(rows) == ["float", "float+nchwc", "BFP16", "BFP16+nchwc", "MXINT8",
                          "MXINT8+nchwc"]
    for label in ("float+nchwc", "BFP16+nchwc", "MXINT8+nchwc"):
        assert rows[label]["bit_identical_to_same_as"] is True
        assert rows[label]["ratio_to_float_nchwc"] > 0
    # conv0 -> relu -> node -> conv1 and conv1 -> node -> conv2: BFP16's blocks of 8 and
    # MXINT8's of 32 are a divisor or a multiple of B (nchwc_block)
    layout = {k: r["profile"]["layout_nodes"] for k, r in rows.items()}
    for config in ("BFP16", "MXINT8"):
        assert rows[config + "+nchwc"]["nchwc_rewritten"] == 2
        assert layout[config + "+nchwc"] == layout[config] - 4


def test_compare_to_cpu():
    """The GPU-provider check: same bits, largest difference, arg-max agreement per position."""
    rng = np.random.default_rng(3)
    cpu = [rng.standard_normal((1, 40, 97)).astype(np.float32), np.arange(5, dtype=np.int64)]
    same = model_bench.compare_to_cpu(cpu, [a.copy() for a in cpu])
    assert same == {"bit_identical_to_cpu": True, "max_abs_diff_vs_cpu": 0.0,
                    "argmax_agreement_vs_cpu": 1.0}
    moved = [cpu[0].copy(), cpu[1]]
    moved[0][0, 3] = 0.0
    moved[0][0, 3, 7] = 100.0  # position 3's arg-max changes, nothing else does
    moved[0][0, 5, 0] = np.nextafter(moved[0][0, 5, 0], np.float32(np.inf))  # one ulp
    r = model_bench.compare_to_cpu(cpu, moved)
    assert r["bit_identical_to_cpu"] is False
    assert r["argmax_agreement_vs_cpu"] == 39 / 40
    assert r["max_abs_diff_vs_cpu"] == pytest.approx(
        float(np.max(np.abs(cpu[0][0, 3].astype(np.float64) - moved[0][0, 3]))))
    # -0.0 against +0.0: equal values, different bits
    z = [np.zeros((2, 3), np.float32)]
    r = model_bench.compare_to_cpu(z, [-z[0]])
    assert r["bit_identical_to_cpu"] is False and r["max_abs_diff_vs_cpu"] == 0.0


def test_ep_option(tmp_path):
    import onnxruntime as ort
    assert model_bench.resolve_ep("cpu") == "CPUExecutionProvider"
    assert model_bench.resolve_ep("CPUExecutionProvider") == "CPUExecutionProvider"
    with pytest.raises(SystemExit, match="unknown execution provider 'TPU'"):
        model_bench.resolve_ep("TPU")
    model = _conv_chain(tmp_path / "c.onnx")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(SystemExit, match="CUDAExecutionProvider is not in this onnxruntime"):
            model_bench.resolve_ep("CUDA")
        proc = subprocess.run([sys.executable, "-m", "ort_mx_ops.benchmarks", "--model", model,
                               "--ep", "CUDA"], capture_output=True, text=True)
        assert proc.returncode != 0 and "--ep: CUDAExecutionProvider is not" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "ort_mx_ops.benchmarks", "--model", model,
                           "--shape", "x=1x3x12x12", "--configs", "MXINT8", "--tiny", "--ep",
                           "cpu", "--out", str(tmp_path / "o"), "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "o" / "model_results.json").read_text())
    assert doc["options"]["ep"] == "CPUExecutionProvider"
    # on the CPU provider there is nothing to compare against, and our nodes ran there
    q = doc["results"][1]
    assert "bit_identical_to_cpu" not in q
    assert q["profile"]["ours_providers"] == {"CPUExecutionProvider": q["profile"]["ours_nodes"]}


def test_two_threads_on_a_shared_pool(tmp_path):
    """--threads 2 runs every model's session on one pool (the default) and says so; the
    quantized model's outputs are still checked against the float one."""
    model = _conv_chain(tmp_path / "c.onnx")
    proc = subprocess.run([sys.executable, "-m", "ort_mx_ops.benchmarks", "--model", model,
                           "--shape", "x=1x3x12x12", "--configs", "MXINT8", "--tiny",
                           "--threads", "2", "--out", str(tmp_path / "o"), "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "o" / "model_results.json").read_text())
    assert doc["options"]["threads"] == 2 and doc["options"]["thread_pool"] == "shared"
    assert "one pool shared by every model" in (tmp_path / "o" / "model_results.md").read_text()
    q = doc["results"][1]
    assert q["variant"] == "MXINT8" and q["profile"]["ours_nodes"] > 0
    assert q["finite_where_float_is"]
    assert model_bench.build_parser().parse_args(["--model", "m"]).thread_pool == "shared"


def test_neg_floor_variants(tmp_path):
    """--neg-floor: each BFP / MX model (and its --nchwc form) once more with Neg in place of
    each of our nodes, none of ours left; BF16 gets none."""
    model = _conv_chain(tmp_path / "chain.onnx")
    opts = model_bench.ModelOptions(model=model, configs=["MX9", "BF16"],
                                    shapes={"x": [1, 3, 12, 12]}, warmup=1, rounds=2,
                                    min_time=0.0, profile_runs=1, nchwc=True, neg_floor=True,
                                    log=lambda s: None)
    doc = model_bench.run_model_bench(opts)
    rows = {r["variant"]: r for r in doc["results"]}
    assert [k for k in rows if k.endswith("+neg")] == ["MX9+neg", "MX9+nchwc+neg"]
    for label in ("MX9+neg", "MX9+nchwc+neg"):
        base = rows[label[:-len("+neg")]]
        assert rows[label]["neg_nodes"] == base["runtime_nodes"] > 0
        assert rows[label]["profile"]["ours_nodes"] == 0
        assert rows[label]["profile"]["ops"]["Neg"]["nodes"] == base["runtime_nodes"]
        assert rows[label]["ratio_to_float_paired"] > 0
        # each variant against its floor, paired per round from the recorded times
        expected = statistics.median(t / f for t, f in zip(base["times_s"], rows[label]["times_s"]))
        assert base["ratio_to_neg_floor_paired"] == pytest.approx(expected, rel=1e-12)
        assert base["neg_floor_ratio_to_float_paired"] == rows[label]["ratio_to_float_paired"]
    assert "ratio_to_neg_floor_paired" not in rows["BF16"]
    for label in ("MX9", "MX9+nchwc"):
        # every one of our nodes met its Neg by name; the groups hold the profiled times
        groups = rows[label]["nodes_vs_neg_floor"]
        assert sum(g["nodes"] for g in groups) == rows[label]["runtime_nodes"]
        assert sum(g["seconds"] for g in groups) == \
            pytest.approx(rows[label]["profile"]["ours_seconds"], rel=1e-12)
        assert sum(g["neg_seconds"] for g in groups) == \
            pytest.approx(rows[label + "+neg"]["profile"]["ops"]["Neg"]["seconds"], rel=1e-12)
        # the warm runs of each profiled turn (ModelOptions.warm_runs) beside the cold ones
        assert sum(g["warm_neg_seconds"] for g in groups) == \
            pytest.approx(rows[label + "+neg"]["profile"]["ops"]["Neg"]["warm_seconds"],
                          rel=1e-12)
        # the 3-channel input and the 16-channel activations, 12 x 12 each
        assert {tuple(g["input_shape"]) for g in groups} <= {(1, 3, 12, 12), (1, 16, 12, 12)}
    assert "nodes_vs_neg_floor" not in rows["BF16"]
    report = model_bench.markdown(doc)
    assert "## Our nodes against their Neg, by input shape" in report
    assert "+neg: the same model with Neg" in report
    assert "## Above the Neg floor" in report
    assert f"| MX9+nchwc | {rows['MX9+nchwc+neg']['ratio_to_float_paired']:.3f} | " \
        f"{rows['MX9+nchwc']['ratio_to_neg_floor_paired']:.3f} |" in report


def test_cold_and_warm_split_each_turn():
    """A node's kernel times in run order: the first turn left out, then each turn's first
    run against its others."""
    durs = [100.0, 101.0, 102.0, 1.0, 2.0, 3.0, 10.0, 20.0, 30.0]
    assert model_bench._cold_and_warm(durs, 3) == (5.5, 11.5)   # cold 1, 10; warm 2, 3, 20, 30
    assert model_bench._cold_and_warm([5.0, 1.0, 2.0, 3.0], 1) == (2.0, None)
    assert model_bench._cold_and_warm([7.0], 1) == (7.0, None)      # one run: nothing left out


def test_node_floors_pair_nodes_by_name_and_group_by_shape():
    """add_node_floors: each of our nodes meets the Neg of the same name in the +neg form;
    sums per input shape, largest first; nodes with no Neg of that name are left out."""
    def node(op, us, shape):
        return {"op": op, "seconds": us * 1e-6, "input_shape": shape}
    rows = [
        {"variant": "MX9", "profile": {"nodes": {
            "a": node("MXFixNeuron", 10, [1, 8, 4, 4]),
            "b": node("MXFixNeuron", 30, [1, 8, 4, 4]),
            "c": node("MXFixNeuron", 50, [1, 16, 8, 8]),
            "own_neg": node("Neg", 1, [1, 16, 8, 8]),      # the model's own Neg: not ours
            "lost": node("MXFixNeuron", 7, [1, 2])}}},     # no Neg of its name in the floor
        {"variant": "MX9+neg", "profile": {"nodes": {
            "a": node("Neg", 4, [1, 8, 4, 4]), "b": node("Neg", 6, [1, 8, 4, 4]),
            "c": node("Neg", 20, [1, 16, 8, 8]), "own_neg": node("Neg", 1, [1, 16, 8, 8])}}},
        {"variant": "BF16", "profile": {"nodes": {}}},
    ]
    model_bench.add_node_floors(rows)
    groups = rows[0]["nodes_vs_neg_floor"]
    assert [g["input_shape"] for g in groups] == [[1, 16, 8, 8], [1, 8, 4, 4]]
    assert [g["nodes"] for g in groups] == [1, 2]
    assert groups[0]["seconds"] == pytest.approx(50e-6) and groups[0]["neg_seconds"] == \
        pytest.approx(20e-6)
    assert groups[1]["seconds"] == pytest.approx(40e-6) and groups[1]["neg_seconds"] == \
        pytest.approx(10e-6)
    assert "nodes_vs_neg_floor" not in rows[1] and "nodes_vs_neg_floor" not in rows[2]
    table = "\n".join(model_bench._node_floor_table(rows[:1]))
    assert "| 1x16x8x8 | 50.0 / 20.0 (1) |" in table
    assert "| 1x8x4x4 | 20.0 / 5.0 (2) |" in table
    assert "| all (µs per run) | 90.0 / 30.0 |" in table
    # with warm runs in the profile, each cell has them after the cold ones
    for r in rows[:2]:
        for name, node in r["profile"]["nodes"].items():
            node["warm_seconds"] = node["seconds"] / 2
    model_bench.add_node_floors(rows)
    assert rows[0]["nodes_vs_neg_floor"][0]["warm_seconds"] == pytest.approx(25e-6)
    assert rows[0]["nodes_vs_neg_floor"][0]["warm_neg_seconds"] == pytest.approx(10e-6)
    table = "\n".join(model_bench._node_floor_table(rows[:1]))
    assert "| 1x16x8x8 | 50.0 / 20.0 · 25.0 / 10.0 (1) |" in table
    assert "| all (µs per run) | 90.0 / 30.0 · 45.0 / 15.0 |" in table


def test_floor_ratios_pair_each_variant_with_its_neg_form():
    """add_floor_ratios: the median over rounds of the variant's run / its +neg form's, cold
    and warm; variants without a +neg form get nothing."""
    rows = [
        {"variant": "MX9", "times_s": [2.0, 3.0, 9.0], "warm_times_s": [1.0, 4.0, 6.0]},
        {"variant": "MX9+neg", "times_s": [1.0, 2.0, 3.0], "warm_times_s": [1.0, 2.0, 2.0],
         "ratio_to_float_paired": 1.25, "ratio_to_float_warm_paired": 1.5},
        {"variant": "BF16", "times_s": [1.0, 1.0, 1.0]},
    ]
    model_bench.add_floor_ratios(rows)
    assert rows[0]["ratio_to_neg_floor_paired"] == 2.0          # median of 2, 1.5, 3
    assert rows[0]["ratio_to_neg_floor_warm_paired"] == 2.0     # median of 1, 2, 3
    assert rows[0]["neg_floor_ratio_to_float_paired"] == 1.25
    assert rows[0]["neg_floor_ratio_to_float_warm_paired"] == 1.5
    assert "ratio_to_neg_floor_paired" not in rows[1] and "ratio_to_neg_floor_paired" not in rows[2]
