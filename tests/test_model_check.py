"""ort_mx_ops.model_check: every attribute of this library's nodes in a model, checked
against the catalogue (names, types, values), in subgraphs too; and every node that Quark's
conformance cases or the quantizer write passes it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ort_mx_ops
from ort_mx_ops.formats import OPS, QUARK_DOMAIN
from ort_mx_ops.model_check import check_model, main, model_problems
from ort_mx_ops.quantizer import quantize_model

from test_quantizer_models import conv_model

CASES = json.loads((Path(__file__).parent / "data" / "conformance" / "cases.json").read_text())


def _model(op: str = "MXQuantizeDequantize", domain: str = QUARK_DOMAIN,
           **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], name="q0", domain=domain, **attrs)
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])])
    return helper.make_model(graph, ir_version=8,
                             opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(domain, 1)])


def _session_error(model: onnx.ModelProto) -> str:
    so = ort_mx_ops.register(ort.SessionOptions())
    try:
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's error classes vary by version
        return str(exc)
    return ""


# (attributes, the words the one problem must contain)
PROBLEMS = [
    ({"block_size": "4"}, ["'block_size' is string, expected int"]),
    ({"block_size": 32.0}, ["'block_size' is float, expected int"]),
    ({"element_dtype": 3}, ["'element_dtype' is int, expected string"]),
    ({"axis": "0"}, ["'axis' is string, expected int"]),
    ({"blocksize": 32}, ["unknown attribute 'blocksize'", "allowed: axis, block_size, "
                                                           "element_dtype, input_divisor, "
                                                           "input_hardswish, nchwc_block, "
                                                           "nchwc_channels, "
                                                           "rounding_mode"]),
    # One character substituted: beyond what a kernel can find by asking for names.
    ({"block_sise": 32}, ["unknown attribute 'block_sise'"]),
    ({"quark_version": "0.13"}, ["unknown attribute 'quark_version'"]),
    ({"rounding_mode": 3}, ["rounding_mode must be in [0, 2], got 3"]),
    ({"element_dtype": "fp9"}, ["element_dtype must be one of"]),
    ({"block_size": 0}, ["block_size must be in [1, 1073741824], got 0"]),
]


@pytest.mark.parametrize("attrs,words", PROBLEMS, ids=[next(iter(a)) + "-" + str(i)
                                                      for i, (a, _) in enumerate(PROBLEMS)])
def test_each_problem_is_reported_with_node_and_attribute(attrs, words):
    checked, problems = model_problems(_model(**attrs))
    assert checked == 1 and len(problems) == 1
    assert problems[0].startswith("MXQuantizeDequantize node 'q0': ")
    for w in words:
        assert w in problems[0]
    with pytest.raises(ValueError, match="node 'q0'"):
        check_model(_model(**attrs))


@pytest.mark.parametrize("attrs", [a for a, _ in PROBLEMS if "block_sise" not in a
                                   and "quark_version" not in a])
def test_the_kernel_rejects_what_the_check_rejects(attrs):
    # Where the kernel can see the problem (a known or nearby name), both refuse the node.
    assert _session_error(_model(**attrs))


def test_a_clean_model_passes_and_runs():
    model = _model(element_dtype="fp8_e4m3", block_size=32, axis=1)
    assert check_model(model) == 1
    assert not _session_error(model)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_every_quark_conformance_node_passes(case):
    assert model_problems(_model(case["op"], OPS[case["op"]].domain, **case["attrs"])) == (1, [])


def test_subgraph_nodes_are_checked():
    inner = _model(blocksize=16).graph
    inner.name = "then"
    other = _model().graph
    other.name = "else"
    cond = helper.make_node("If", ["c"], ["y"], then_branch=inner, else_branch=other)
    graph = helper.make_graph([cond], "main",
                              [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])])
    checked, problems = model_problems(helper.make_model(graph, ir_version=8))
    assert checked == 2
    assert len(problems) == 1 and "unknown attribute 'blocksize'" in problems[0]


@pytest.mark.parametrize("storage", ["folded", "packed"])
@pytest.mark.parametrize("config", ["MXFP4E2M1", "MX6", "BFP16", "BF16"])
def test_quantizer_output_passes(config, storage):
    model = quantize_model(conv_model(), None, config, weight_storage=storage).model
    checked, problems = model_problems(model)
    assert problems == [] and checked > 0


def test_packed_node_attributes_are_checked():
    model = quantize_model(conv_model(), None, "MXFP4E2M1", weight_storage="packed").model
    node = next(n for n in model.graph.node if n.op_type == "MXDequantize")
    node.attribute.append(helper.make_attribute("rounding_mode", 1))
    node.attribute.remove(next(a for a in node.attribute if a.name == "shape"))
    _, problems = model_problems(model)
    assert any("unknown attribute 'rounding_mode'" in p for p in problems)
    assert any("attribute 'shape' (ints, the output's shape) is required" in p for p in problems)


@pytest.mark.parametrize("value,ok", [(0, True), (1, False)])
def test_packed_bfp_takes_convert_to_bfloat_before_bfp_zero_only(value, ok):
    # docs/packed_weights.md: the attribute may be given, and must be 0; the kernel agrees.
    model = quantize_model(conv_model(), None, "BFP16", weight_storage="packed").model
    node = next(n for n in model.graph.node if n.op_type == "BFPDequantize")
    node.attribute.append(helper.make_attribute("convert_to_bfloat_before_bfp", value))
    _, problems = model_problems(model)
    assert (problems == []) == ok
    if not ok:
        assert "convert_to_bfloat_before_bfp must be in [0, 0], got 1" in problems[0]
    assert bool(_session_error(model)) != ok


def test_cli_one_line_per_problem_and_exit_codes(tmp_path, capsys):
    bad, good = tmp_path / "bad.onnx", tmp_path / "good.onnx"
    onnx.save(_model(blocksize=32, rounding_mode=9), bad)
    onnx.save(_model(), good)
    assert main([str(good)]) == 0
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{bad}: ")  # rounding_mode is checked after names
    (tmp_path / "corrupt.onnx").write_bytes(np.arange(100, dtype=np.uint8).tobytes())
    assert main([str(tmp_path / "corrupt.onnx")]) == 2
    assert "cannot read the model" in capsys.readouterr().err
