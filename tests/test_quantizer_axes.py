"""Axis policy per op type: reduction axes, depthwise weights, batch/token axes."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_mx_ops.quantizer import quantize_model
from ort_mx_ops.quantizer.config import get_config
from ort_mx_ops.quantizer.graph import ModelView
from ort_mx_ops.quantizer.placement import plan_model

F = TensorProto.FLOAT


def one_op(op: str, a_shape, b_shape, b_is_weight: bool = True, y_shape=None,
           **attrs) -> onnx.ModelProto:
    """A model y = op(a, b) with ``a`` a graph input and ``b`` an initializer or an input
    (shapes may hold dim names for dynamic dimensions)."""
    inputs = [helper.make_tensor_value_info("a", F, a_shape)]
    inits = []
    if b_is_weight:
        inits.append(numpy_helper.from_array(
            np.random.default_rng(0).standard_normal(b_shape).astype(np.float32), "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", F, b_shape))
    node = helper.make_node(op, ["a", "b"], ["y"], name="n", **attrs)
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", F, y_shape)],
                          inits)
    return helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def axes(model: onnx.ModelProto, config: str = "MXINT8", **opts) -> dict[str, object]:
    plan = plan_model(ModelView(model), get_config(config, **opts))
    return {s.tensor: (s.axis, s.flatten) if s.flatten else s.axis for s in plan.sites}


@pytest.mark.parametrize("a_shape,b_shape,want", [
    ([4, 32], [32, 16], {"a": 1, "b": 0}),                  # plain 2-D
    (["B", 7, 32], [32, 16], {"a": 2, "b": 0}),             # batched A, 2-D weight
    ([2, 3, 5, 32], [32, 16], {"a": 3, "b": 0}),
    ([4, 32], [32], {"a": 1, "b": 0}),                      # 1-D B
])
def test_matmul_reduction_axes(a_shape, b_shape, want):
    assert axes(one_op("MatMul", a_shape, b_shape)) == want


def test_matmul_with_activation_b_broadcast_ranks():
    # B (batch, heads, K, N) as an activation: second-to-last axis, rank 4.
    got = axes(one_op("MatMul", [2, 8, 5, 16], [2, 8, 16, 5], b_is_weight=False))
    assert got == {"a": 3, "b": 2}


@pytest.mark.parametrize("trans_a,trans_b,want", [
    (0, 0, {"a": 1, "b": 0}), (1, 0, {"a": 0, "b": 0}),
    (0, 1, {"a": 1, "b": 1}), (1, 1, {"a": 0, "b": 1}),
])
def test_gemm_axes_follow_trans_attributes(trans_a, trans_b, want):
    a_shape = [32, 4] if trans_a else [4, 32]
    b_shape = [16, 32] if trans_b else [32, 16]
    assert axes(one_op("Gemm", a_shape, b_shape, transA=trans_a, transB=trans_b)) == want


def test_conv_axes_and_depthwise_weight():
    assert axes(one_op("Conv", ["N", 16, 8, 8], [32, 16, 3, 3])) == {"a": 1, "b": 1}
    # Depthwise: weight (C, 1, kh, kw) is blocked over each channel's 3x3 window.
    assert axes(one_op("Conv", ["N", 16, 8, 8], [16, 1, 3, 3], group=16)) == \
        {"a": 1, "b": (1, True)}
    # Quark's placement keeps axis 1 there: one exponent per weight.
    assert axes(one_op("Conv", ["N", 16, 8, 8], [16, 1, 3, 3], group=16),
                placement="quark") == {"a": 1, "b": 1}


def test_conv_transpose_weight_blocks_input_channels():
    # ConvTranspose weight is (C_in, C_out / group, kh, kw): it contracts over axis 0.
    assert axes(one_op("ConvTranspose", ["N", 16, 8, 8], [16, 4, 3, 3])) == {"a": 1, "b": 0}


def test_dynamic_contraction_axis_moves_to_a_fixed_axis():
    # Attention probabilities (B, H, T, T) times V (B, H, T, D): both contract over the
    # dynamic key-token axis T.  V moves to D; P has only H fixed, which it uses.
    got = axes(one_op("MatMul", ["B", 8, "T", "T"], ["B", 8, "T", 64], b_is_weight=False))
    assert got == {"a": 1, "b": 3}
    # With no fixed axis at all, the activation stays float and the plan says why.
    plan = plan_model(ModelView(one_op("MatMul", ["B", "T"], ["T", 16], b_is_weight=False)),
                      get_config("MX6"))
    assert [(s.tensor, s.axis) for s in plan.sites] == [("b", 1)]
    assert any("batch/token" in msg for msg in plan.skipped)


def test_depthwise_runtime_and_folded_forms_agree():
    import onnxruntime as ort
    import ort_mx_ops
    model = one_op("Conv", [1, 16, 6, 6], [16, 1, 3, 3], group=16, y_shape=[1, 16, 4, 4])
    x = np.random.default_rng(1).standard_normal((1, 16, 6, 6)).astype(np.float32)
    outs = []
    for fold in (True, False):
        q = quantize_model(model, None, "MXFP8E4M3", fold_weights=fold).model
        so = ort_mx_ops.register(ort.SessionOptions())
        sess = ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
        outs.append(sess.run(["y"], {"a": x})[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)
