"""The op-handler registry, the layers it reports, and the quantizer options built on it:
separate activation / weight formats by name, weight-only, and per-tensor formats."""
from __future__ import annotations

import onnx
import pytest
from onnx import numpy_helper

from ort_mx_ops.formats import CONFIGS
from ort_mx_ops.quantizer import (COMPUTE_OPS, DEFAULT_OP_TYPES, FormatSpec, Layer, OpHandler,
                                  fold_weight, get_config, handler_for, layers, quantize_model,
                                  register_handler)
from ort_mx_ops.quantizer.graph import ModelView
from ort_mx_ops.quantizer.handlers import HANDLERS
from ort_mx_ops.quantizer.simulate import run_reference

from conftest import assert_bits_equal
from test_quantizer import custom_nodes, node_attrs, run
from test_quantizer_axes import one_op
from test_quantizer_models import conv_model, feeds_for, matmul_model


def test_compute_ops_are_the_registered_contracting_handlers() -> None:
    assert COMPUTE_OPS == DEFAULT_OP_TYPES == ("Conv", "ConvTranspose", "Gemm", "MatMul")
    assert all(HANDLERS[op].contracted_inputs == (0, 1) for op in COMPUTE_OPS)
    node = onnx.helper.make_node("Relu", ["x"], ["y"])
    assert type(handler_for(node, ModelView(conv_model()))) is OpHandler


def test_layers_of_a_conv_model() -> None:
    got = {l.node_name: l for l in layers(ModelView(conv_model()))}
    assert got["conv1"] == Layer(0, "conv1", "Conv", "x", "c1", "w1", 1, 1, False, "b1")
    # The depthwise weight is a Constant node's output, blocked over its kernel window.
    assert got["conv2"] == Layer(3, "conv2", "Conv", "r1", "c2", "w2", 1, 1, True, None)
    assert got["conv3"] == Layer(5, "conv3", "Conv", "r2", "y", "w3", 1, 1, False, None)


def test_layers_of_matmul_gemm_and_conv_transpose() -> None:
    got = {l.node_name: l for l in layers(ModelView(matmul_model()))}
    # MatMuls of two activations have no weight; Gemm with transB blocks W along axis 1.
    assert set(got) == {"proj", "gemm"}
    assert (got["proj"].weight, got["proj"].weight_axis, got["proj"].bias) == ("W1", 0, None)
    assert (got["gemm"].input, got["gemm"].weight, got["gemm"].weight_axis,
            got["gemm"].bias) == ("x2", "Wg", 1, "bg")
    ct = layers(ModelView(one_op("ConvTranspose", ["N", 16, 8, 8], [16, 4, 3, 3])))
    assert [(l.weight, l.weight_axis, l.input, l.output) for l in ct] == [("b", 0, "a", "y")]


def test_layer_axis_is_the_axis_the_quantizer_folds_along() -> None:
    model = conv_model()
    s = quantize_model(model, None, "MX6")
    folded = {r.tensor: (r.axis, r.flatten) for r in s.sites if r.kind == "weight"}
    for layer in layers(ModelView(model)):
        assert folded[layer.weight] == (layer.weight_axis, layer.flatten)


def test_a_registered_handler_extends_the_placement() -> None:
    """A handler for a new op type: its contracted input is blocked along its axis."""
    @register_handler
    class _MulHandler(OpHandler):
        op_type = "Mul"
        contracted_inputs = (0,)
        other_inputs = ()

        def reduction_axis(self, input_idx: int) -> tuple[int, str]:
            return 0, "test axis"
    try:
        model = one_op("Mul", [8, 32], [8, 32], y_shape=[8, 32])
        s = quantize_model(model, None, "MXINT8", op_types_to_quantize=["Mul"])
        assert [(r.tensor, r.axis, r.reason) for r in s.sites] == [("a", 0, "test axis")]
    finally:
        del HANDLERS["Mul"]


def test_activation_format_by_name_gives_mixed_formats() -> None:
    model = conv_model()
    s = quantize_model(model, None, "MXFP4E2M1", activation="MXINT8")
    q = s.model
    assert s.config == "A:MXINT8/W:MXFP4E2M1"
    assert {(r.kind, r.format) for r in s.sites} == {("activation", "MXINT8"),
                                                     ("weight", "MXFP4E2M1")}
    assert {node_attrs(n)["element_dtype"] for n in custom_nodes(q)} == {b"int8"}
    w1 = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w1"))
    stored = numpy_helper.to_array(next(i for i in q.graph.initializer if i.name == "w1"))
    assert_bits_equal(stored, fold_weight(w1, CONFIGS["MXFP4E2M1"], 1))
    feeds = feeds_for("conv")
    assert_bits_equal(run(q, feeds)["y"], run_reference(q, feeds)[0])


def test_weight_only_and_default_unchanged() -> None:
    q = quantize_model(conv_model(), None, "MX6", activation=None).model
    assert custom_nodes(q) == []
    assert get_config("MX6", activation=None).weight == CONFIGS["MX6"]
    plain = quantize_model(conv_model(), None, "MX6")
    assert plain.config == "MX6" and len(custom_nodes(plain.model)) == 3


def test_tensor_formats_override_single_tensors() -> None:
    model = conv_model()
    s = quantize_model(model, None, "MXFP8E4M3", fold_weights=False,
                       tensor_formats={"r1": None, "r2": "MX6", "w3": FormatSpec.from_name("BF16"),
                                       "nowhere": "MX9"})
    by = {r.tensor: r.format for r in s.sites}
    assert "r1" not in by
    assert by["r2"] == "MX6" and by["w3"] == "BF16" and by["x"] == "MXFP8E4M3"
    assert any("nowhere" in m for m in s.skipped)
    feeds = feeds_for("conv")
    assert_bits_equal(run(s.model, feeds)["y"], run_reference(s.model, feeds)[0])


def test_bad_formats_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown quantization config 'MXFP5'"):
        quantize_model(conv_model(), None, "MX6", activation="MXFP5")
    with pytest.raises(TypeError, match="a format is"):
        get_config("MX6", tensor_formats={"x": 3})
    with pytest.raises(ValueError, match="bit_width"):
        FormatSpec("BFP", {"bit_width": 40})
