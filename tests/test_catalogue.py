"""The catalogue of ops and formats (ort_mx_ops.formats) against the native library.

``test_python_and_native_catalogues_agree`` compares the Python table with the one the C++
side publishes through ``_native.catalogue()`` field by field.  The other tests check the
catalogue's allowed ranges against what the native kernels and the numpy reference accept,
and that every op it lists runs in onnxruntime under its name and domain.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ort_mx_ops
from conftest import native_and_reference
from ort_mx_ops import _native, formats, reference


def test_python_and_native_catalogues_agree() -> None:
    ours, theirs = formats.catalogue(), _native.catalogue()
    assert set(theirs) == set(ours)
    assert theirs["bfp_methods"] == ours["bfp_methods"]
    assert theirs["mx_element_formats"].keys() == ours["mx_element_formats"].keys()
    for name, fmt in ours["mx_element_formats"].items():
        for key, value in fmt.items():
            assert theirs["mx_element_formats"][name][key] == value, (name, key)
    assert theirs["ops"].keys() == ours["ops"].keys()
    for op, schema in ours["ops"].items():
        native_schema = theirs["ops"][op]
        assert native_schema["domain"] == schema["domain"], op
        assert native_schema["kind"] == schema["kind"], op
        assert native_schema["attrs"].keys() == schema["attrs"].keys(), op
        for attr, spec in schema["attrs"].items():
            got = native_schema["attrs"][attr]
            for key in ("type", "default", "min", "max"):
                assert got[key] == spec[key], (op, attr, key)
            allowed = got["allowed"]
            assert (None if allowed is None else sorted(allowed)) == \
                (None if spec["allowed"] is None else sorted(spec["allowed"])), (op, attr)


def _range_cases():
    """(op, attr, base attrs, accepted values, rejected values) from the catalogue."""
    for op in ("BFPQuantizeDequantize", "MXQuantizeDequantize"):
        schema = formats.OPS[op]
        for a in schema.attrs:
            if a.name == "axis":
                continue
            # The sub-block attributes are checked only for microexponents.
            base = {"bfp_method": "to_bfp_prime"} if a.name.startswith("sub_block") else {}
            if a.allowed is not None:
                yield op, a.name, base, list(a.allowed), ["no_such_value"]
                continue
            ok = [a.min] + ([a.max] if a.max is not None else [])
            bad = [a.min - 1] + ([a.max + 1] if a.max is not None else [])
            yield op, a.name, base, ok, bad


@pytest.mark.parametrize("op,attr,base,ok,bad", list(_range_cases()),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_allowed_ranges_are_what_native_and_reference_accept(op, attr, base, ok, bad) -> None:
    kind = formats.OPS[op].kind
    # nchwc_block needs a channel count it divides (tests/test_nchwc_kernel.py: the rest)
    x = np.random.default_rng(0).standard_normal(
        (2, 128 if attr == "nchwc_block" else 16)).astype(np.float32)
    for fn in native_and_reference(kind):
        for value in ok:
            attrs = dict(base, **{attr: value})
            if attr == "sub_block_size":
                attrs["block_size"] = 16 * value  # a divisor of block_size
            y = fn(x, **attrs)
            assert y.shape == x.shape
        for value in bad:
            with pytest.raises(ValueError, match=attr):
                fn(x, **dict(base, **{attr: value}))


def test_sub_block_size_must_divide_block_size() -> None:
    x = np.ones((2, 16), np.float32)
    for fn in native_and_reference("BFP"):
        with pytest.raises(ValueError, match="sub_block_size"):
            fn(x, bfp_method="to_bfp_prime", block_size=8, sub_block_size=3)


def test_defaults_are_what_a_node_without_attributes_computes() -> None:
    """A node with no attributes must compute what the catalogue's defaults compute."""
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    for kind in ("BFP", "MX"):
        op = formats.FORMAT_FAMILIES[kind]
        defaults = formats.OPS[op].defaults()
        native_fn, reference_fn = native_and_reference(kind)
        want = reference_fn(x, **defaults)
        np.testing.assert_array_equal(native_fn(x).view(np.uint32), want.view(np.uint32))
        np.testing.assert_array_equal(reference_fn(x).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("op", list(formats.OPS))
def test_every_catalogued_op_runs_under_its_name_and_domain(op: str) -> None:
    schema = formats.OPS[op]
    x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(2, 16)
    inits = []
    if schema.kind in ("BF16_QUANTIZE", "BF16_DEQUANTIZE", "BF16_QDQ"):
        inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [1.0]),
                 helper.make_tensor("z", TensorProto.BFLOAT16, [], [0])]
        in_type = TensorProto.BFLOAT16 if schema.kind == "BF16_DEQUANTIZE" else TensorProto.FLOAT
        out_type = TensorProto.FLOAT
        if schema.kind in ("BF16_DEQUANTIZE", "BF16_QDQ"):
            nodes = [helper.make_node(op, ["x", "s", "z"], ["y"], domain=schema.domain)]
        else:  # numpy has no bfloat16: widen the quantized output with a standard Cast
            nodes = [helper.make_node(op, ["x", "s", "z"], ["q"], domain=schema.domain),
                     helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)]
    else:
        in_type = out_type = TensorProto.FLOAT
        nodes = [helper.make_node(op, ["x"], ["y"], domain=schema.domain)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", in_type, [2, 16])],
                              [helper.make_tensor_value_info("y", out_type, [2, 16])], inits)
    model = helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(schema.domain, 1)])
    sess = ort.InferenceSession(model.SerializeToString(),
                                ort_mx_ops.register(ort.SessionOptions()),
                                providers=["CPUExecutionProvider"])
    if schema.kind == "BF16_DEQUANTIZE":
        bits = reference.float32_to_bfloat16_bits(x)
        feed = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, TensorProto.BFLOAT16)
        y = sess.run_with_ort_values(["y"], {"x": feed})[0].numpy()
        np.testing.assert_array_equal(y, reference.bfloat16_bits_to_float32(bits))
        return
    y = sess.run(None, {"x": x})[0]
    if schema.kind in ("BF16_QUANTIZE", "BF16_QDQ"):
        np.testing.assert_array_equal(
            y, reference.bfloat16_bits_to_float32(reference.float32_to_bfloat16_bits(x)))
    else:
        want = native_and_reference(schema.kind)[1](x, **schema.defaults())
        np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))


def test_configs_are_valid_format_specs_with_catalogued_attributes() -> None:
    for name, spec in formats.CONFIGS.items():
        assert spec.name == name
        if spec.op != "BF16":
            formats.resolve_attrs(spec.op_type, spec.full_attrs())
    assert formats.FormatSpec.from_name("mx6") == formats.CONFIGS["MX6"]
    assert formats.FormatSpec.from_name("MX6").attrs is not formats.CONFIGS["MX6"].attrs
