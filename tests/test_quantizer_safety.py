"""What the quantizer must never touch: tensors a subgraph reads, weights that are graph
outputs, the input model and every file it references; and what it reports about the files
it writes."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ort_mx_ops
from ort_mx_ops import reference
from ort_mx_ops.formats import CONFIGS
from ort_mx_ops.quantizer import quantize_model

from conftest import assert_bits_equal
from test_quantizer_models import conv_model, feeds_for

F = TensorProto.FLOAT
MXINT8 = dict(CONFIGS["MXINT8"].attrs)


def _run(model: onnx.ModelProto | str, feeds: dict) -> dict[str, np.ndarray]:
    so = ort_mx_ops.register(ort.SessionOptions())
    src = model if isinstance(model, str) else model.SerializeToString()
    sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


# ------------------------------------------------------------------------------------------
# D2: a weight shared with a subgraph
# ------------------------------------------------------------------------------------------

def _branch(name: str, out: str) -> onnx.GraphProto:
    """A subgraph (no inputs) computing ``out = MatMul(x, W)`` from the outer scope."""
    return helper.make_graph([helper.make_node("MatMul", ["x", "W"], [out], name=f"{name}_mm")],
                             name, [], [helper.make_tensor_value_info(out, F, [4, 32])])


def shared_with_subgraph_model(kind: str, branch_out: str = "t_out") -> onnx.ModelProto:
    """Main graph: y = MatMul(x, W).  ``kind`` "If": z = If(cond) with both branches computing
    MatMul(x, W); "Loop": a Loop of one iteration whose body computes MatMul(x, W) as a scan
    output.  W is a 64x32 initializer whose rows span several binades."""
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((64, 32)) *
         2.0 ** rng.integers(-6, 6, size=(64, 32))).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"], name="main_mm")]
    inputs = [helper.make_tensor_value_info("x", F, [4, 64])]
    inits = [numpy_helper.from_array(w, "W")]
    if kind == "If":
        inputs.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
        nodes.append(helper.make_node("If", ["cond"], ["z"], name="branch",
                                      then_branch=_branch("then", branch_out),
                                      else_branch=_branch("else", "e_out")))
        z_shape = [4, 32]
    else:
        inits += [numpy_helper.from_array(np.array(1, np.int64), "trip"),
                  numpy_helper.from_array(np.array(True), "keep_going")]
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
             helper.make_node("MatMul", ["x", "W"], ["scan_out"], name="body_mm")],
            "body",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []),
             helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info("scan_out", F, [4, 32])])
        nodes.append(helper.make_node("Loop", ["trip", "keep_going"], ["z"], name="loop",
                                      body=body))
        z_shape = [1, 4, 32]
    g = helper.make_graph(nodes, "g", inputs,
                          [helper.make_tensor_value_info("y", F, [4, 32]),
                           helper.make_tensor_value_info("z", F, z_shape)], inits)
    m = helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("fold", [True, False])
@pytest.mark.parametrize("kind", ["If", "Loop"])
def test_folding_never_changes_what_a_subgraph_reads(kind, fold):
    # The then-branch names its output as a folded W would be named: no new name may
    # collide with a subgraph's.
    model = shared_with_subgraph_model(kind, branch_out="W_MXINT8_folded")
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((4, 64)).astype(np.float32)}
    if kind == "If":
        feeds["cond"] = np.array(True)
    w = numpy_helper.to_array(model.graph.initializer[0])
    s = quantize_model(model, None, "MXINT8", fold_weights=fold)
    q = s.model
    node = "If 'branch'" if kind == "If" else "Loop 'loop'"
    assert f"subgraphs of {node}: not quantized (they keep reading the float tensors)" \
        in s.skipped
    # The subgraph computes with the float W, exactly as the float model does.
    float_out = _run(model, feeds)
    out = _run(q, feeds)
    np.testing.assert_array_equal(out["z"], float_out["z"])
    stored = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    assert_bits_equal(stored["W"], w)
    # The main MatMul reads a quantized W: W along its rows (axis 0), x along axis 1.
    main = next(n for n in q.graph.node if n.name == "main_mm")
    assert main.input[1] != "W"
    if fold:
        assert_bits_equal(stored[main.input[1]],
                          reference.mx_quantize_dequantize(w, axis=0, **MXINT8))
    xq = reference.mx_quantize_dequantize(feeds["x"], axis=1, **MXINT8)
    want = xq @ reference.mx_quantize_dequantize(w, axis=0, **MXINT8)
    np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert not np.allclose(out["y"], float_out["y"], rtol=1e-4, atol=0)


def test_folding_never_changes_a_weight_that_is_a_graph_output():
    rng = np.random.default_rng(12)
    w = (rng.standard_normal((64, 16)) * 2.0 ** rng.integers(-5, 5, (64, 16))).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", F, [2, 64])],
                          [helper.make_tensor_value_info("y", F, [2, 16]),
                           helper.make_tensor_value_info("W", F, [64, 16])],
                          [numpy_helper.from_array(w, "W")])
    model = helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    q = quantize_model(model, None, "MXFP8E4M3", fold_weights=True).model
    assert [o.name for o in q.graph.output] == ["y", "W"]
    x = rng.standard_normal((2, 64)).astype(np.float32)
    out = _run(q, {"x": x})
    assert_bits_equal(out["W"], w)  # the graph output is the float weight
    attrs = dict(CONFIGS["MXFP8E4M3"].attrs)
    want = (reference.mx_quantize_dequantize(x, axis=1, **attrs) @
            reference.mx_quantize_dequantize(w, axis=0, **attrs))
    np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# ------------------------------------------------------------------------------------------
# D3 / D5: external data, the input's files, the output directory
# ------------------------------------------------------------------------------------------

def _save_with_data(model: onnx.ModelProto, path, location: str) -> None:
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)


def test_external_data_option_writes_and_counts_the_data_file(tmp_path):
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(conv_model(), str(src))
    s = quantize_model(str(src), str(dst), "MXINT8", external_data=True)
    data = tmp_path / "q.onnx.data"
    assert data.exists() and data.stat().st_size >= 16 * 8 * 9 * 4  # w1 at least
    assert s.output_bytes == dst.stat().st_size + data.stat().st_size
    q = onnx.load(str(dst), load_external_data=False)
    external = [i.name for i in q.graph.initializer
                if i.data_location == TensorProto.EXTERNAL]
    assert "w1" in external
    feeds = feeds_for("conv")
    np.testing.assert_array_equal(_run(str(dst), feeds)["y"], _run(s.model, feeds)["y"])
    assert sorted(os.listdir(tmp_path)) == ["f.onnx", "q.onnx", "q.onnx.data"]


def test_input_external_data_file_is_never_overwritten(tmp_path):
    # The input keeps its tensors in "q.onnx.data": the name the output's data would take.
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    _save_with_data(conv_model(), src, "q.onnx.data")
    data = tmp_path / "q.onnx.data"
    before = (_sha(src), _sha(data))
    with pytest.raises(ValueError, match=r"q\.onnx\.data.*input"):
        quantize_model(str(src), str(dst), "MXINT8", external_data=True)
    assert (_sha(src), _sha(data)) == before
    assert not dst.exists()
    # The input still loads and runs as before.
    feeds = feeds_for("conv")
    np.testing.assert_array_equal(_run(str(src), feeds)["y"], _run(conv_model(), feeds)["y"])
    # Writing the model itself over the input's data file is refused too.
    with pytest.raises(ValueError, match="input"):
        quantize_model(str(src), str(data), "MXINT8")
    assert (_sha(src), _sha(data)) == before


def test_input_with_external_data_quantizes_without_touching_it(tmp_path):
    src = tmp_path / "f.onnx"
    _save_with_data(conv_model(), src, "f.weights")
    before = (_sha(src), _sha(tmp_path / "f.weights"))
    s = quantize_model(str(src), str(tmp_path / "q.onnx"), "MX6", external_data=True)
    assert (_sha(src), _sha(tmp_path / "f.weights")) == before
    assert s.output_bytes == sum((tmp_path / n).stat().st_size for n in ("q.onnx", "q.onnx.data"))
    without = quantize_model(conv_model(), None, "MX6").model
    feeds = feeds_for("conv")
    np.testing.assert_array_equal(_run(str(tmp_path / "q.onnx"), feeds)["y"],
                                  _run(without, feeds)["y"])


def test_missing_output_directory_is_refused(tmp_path):
    src = tmp_path / "f.onnx"
    onnx.save(conv_model(), str(src))
    with pytest.raises(FileNotFoundError, match="output directory .*missing.* does not exist"):
        quantize_model(str(src), str(tmp_path / "missing" / "q.onnx"), "MX6")
    assert sorted(os.listdir(tmp_path)) == ["f.onnx"]


def test_external_data_option_on_a_model_of_small_tensors(tmp_path):
    # Tensors under 1 KiB stay in the model: no data file, and the sizes still add up.
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", F, [2, 8])],
                          [helper.make_tensor_value_info("y", F, [2, 4])],
                          [numpy_helper.from_array(np.ones((8, 4), np.float32), "W")])
    model = helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    s = quantize_model(model, str(tmp_path / "q.onnx"), "MXINT8", external_data=True)
    assert sorted(os.listdir(tmp_path)) == ["q.onnx"]
    assert s.output_bytes == (tmp_path / "q.onnx").stat().st_size


def test_shape_inference_writes_nothing_into_the_working_directory(tmp_path, monkeypatch):
    """onnxruntime's symbolic shape inference saves ``sym_shape_infer_temp.onnx`` and data
    files into the current directory when inference is incomplete (here: our op, which it
    does not know); the quantizer must not leave them in (or overwrite) the user's folder."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from ort_mx_ops.quantizer.graph import ModelView

    graph = helper.make_graph(
        [helper.make_node("MXQuantizeDequantize", ["x"], ["y"], domain="com.amd.quark", axis=1),
         helper.make_node("MatMul", ["y", "W"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((64, 300), np.float32), "W")])
    model = helper.make_model(graph, ir_version=8,
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("com.amd.quark", 1)])
    monkeypatch.chdir(tmp_path)
    view = ModelView(model)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert view.shape.get("x") == (1, 64)
