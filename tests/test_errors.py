"""Bad input gets a clear ONNX Runtime error naming the op, the attribute and what is allowed,
and never takes the process down. The risky cases also run in a child process to
prove the process survives them."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper

from conftest import make_session, one_node_model, run_session
from ort_mx_ops import native

BFP = ("BFPQuantizeDequantize", "com.amd.quark")
MX = ("MXQuantizeDequantize", "com.amd.quark")

# (op, attributes, words the message must contain)
BAD_ATTRIBUTES = [
    (BFP, {"block_size": 0}, ["block_size", "0", "1 to 1073741824"]),
    (BFP, {"block_size": -4}, ["block_size", "-4"]),
    (MX, {"block_size": 0}, ["block_size", "1 to 1073741824"]),
    (BFP, {"bfp_method": "to_bfp_fancy"}, ["bfp_method", "to_bfp_fancy", "to_bfp_prime"]),
    (MX, {"element_dtype": "fp3_e1m1"}, ["element_dtype", "fp3_e1m1", "fp8_e4m3", "int8"]),
    (BFP, {"bit_width": 9}, ["bit_width", "10..32"]),
    (BFP, {"bit_width": 33}, ["bit_width", "33"]),
    (BFP, {"rounding_mode": 3}, ["rounding_mode", "3", "half to even"]),
    (MX, {"rounding_mode": -1}, ["rounding_mode", "-1"]),
    (BFP, {"bfp_method": "to_bfp_prime", "block_size": 16, "sub_block_size": 3},
     ["sub_block_size", "3", "divisor of block_size (16)"]),
    (BFP, {"bfp_method": "to_bfp_prime", "sub_block_shift_bits": 9}, ["sub_block_shift_bits", "0..8"]),
    (BFP, {"use_compiler_version_cpu_kernel": 1}, ["use_compiler_version_cpu_kernel", "not implemented"]),
    (BFP, {"block_size": 2 ** 30 + 1}, ["block_size", "1073741825", "1 to 1073741824 (2^30)"]),
    (BFP, {"convert_to_bfloat_before_bfp": 2}, ["convert_to_bfloat_before_bfp", "0 or 1"]),
    (("BFPFixNeuron", "com.vai.quantize"), {"block_size": 0}, ["BFPFixNeuron", "block_size"]),
    (("MXFixNeuron", "com.vai.quantize"), {"element_dtype": "e8m0"}, ["MXFixNeuron", "element_dtype"]),
]


@pytest.mark.parametrize("op,attrs,words", BAD_ATTRIBUTES,
                         ids=[f"{o[0]}-{a}" for o, a, _ in BAD_ATTRIBUTES])
def test_bad_attribute_is_an_ort_error(op, attrs, words) -> None:
    with pytest.raises(Exception) as info:
        sess = make_session(one_node_model(op[0], op[1], attrs))
        run_session(sess, np.ones((2, 16), np.float32), "float32")
    message = str(info.value)
    for word in [op[0], "n0"] + words:  # op, node name, attribute, value / allowed values
        assert word in message, f"{word!r} not in {message!r}"


# (op, attributes, attribute, type found, type expected): a wrong-typed attribute is an error
# at session creation, never read as "unset, use the default".
WRONG_TYPES = [
    (MX, {"block_size": "4"}, "block_size", "string", "int"),
    (BFP, {"bit_width": "12"}, "bit_width", "string", "int"),
    (BFP, {"rounding_mode": "3"}, "rounding_mode", "string", "int"),
    (MX, {"axis": "0"}, "axis", "string", "int"),
    (MX, {"block_size": 32.0}, "block_size", "float", "int"),
    (MX, {"element_dtype": 3}, "element_dtype", "int", "string"),
    (BFP, {"bfp_method": 1}, "bfp_method", "int", "string"),
    (BFP, {"axis": [0]}, "axis", "list of ints", "int"),
    (BFP, {"block_size": [16.0]}, "block_size", "list of floats", "int"),
    (("BFPFixNeuron", "com.vai.quantize"), {"sub_block_size": 2.0}, "sub_block_size", "float", "int"),
    (("ExtendedQuantizeLinear", "com.amd.quark"), {"axis": "1"}, "axis", "string", "int"),
]


def _session_error(op, attrs) -> str:
    if op[0] == "ExtendedQuantizeLinear":
        from test_sessions import bf16_model
        model, _, _ = bf16_model(op[0], op[1], None)
        del model.graph.node[0].attribute[:]
        model.graph.node[0].name = "n0"
        model.graph.node[0].attribute.extend(
            [helper.make_attribute(k, v) for k, v in attrs.items()])
    else:
        model = one_node_model(op[0], op[1], attrs)
    with pytest.raises(Exception) as info:
        make_session(model)  # fails at session creation, before any run
    return str(info.value)


@pytest.mark.parametrize("op,attrs,name,found,expected", WRONG_TYPES,
                         ids=[f"{o[0]}-{a}" for o, a, *_ in WRONG_TYPES])
def test_wrong_attribute_type_is_an_error(op, attrs, name, found, expected) -> None:
    message = _session_error(op, attrs)
    for word in (op[0], "'n0'", f"'{name}'", f"type {found}", f"expected {expected}"):
        assert word in message, f"{word!r} not in {message!r}"


# A misspelt or misplaced attribute name is an error listing the allowed names. ONNX
# Runtime's C API cannot list a node's attributes, so the kernel looks for the names such a
# mistake gives: another op's attribute, or a known name with one character dropped,
# doubled or swapped, or with other separators or case.
UNKNOWN_NAMES = [
    (MX, {"blocksize": 32}, "blocksize", ["axis", "block_size", "element_dtype", "rounding_mode"]),
    (MX, {"block_szie": 32}, "block_szie", ["block_size"]),
    (MX, {"rounding-mode": 1}, "rounding-mode", ["rounding_mode"]),
    (BFP, {"bitwidth": 12}, "bitwidth", ["bit_width", "sub_block_shift_bits"]),
    (BFP, {"blockSize": 16}, "blockSize", ["block_size"]),
    (BFP, {"element_dtype": "int8"}, "element_dtype", ["bfp_method", "bit_width"]),
    (MX, {"bfp_method": "to_bfp"}, "bfp_method", ["element_dtype"]),
    (("MXFixNeuron", "com.vai.quantize"), {"rounding_mod": 2}, "rounding_mod", ["rounding_mode"]),
]


@pytest.mark.parametrize("op,attrs,name,allowed", UNKNOWN_NAMES,
                         ids=[f"{o[0]}-{n}" for o, _, n, _ in UNKNOWN_NAMES])
def test_unknown_attribute_name_is_an_error(op, attrs, name, allowed) -> None:
    message = _session_error(op, attrs)
    for word in [op[0], "'n0'", f"unknown attribute '{name}'", "allowed"] + allowed:
        assert word in message, f"{word!r} not in {message!r}"


QUARK_ATTRIBUTES = [  # every attribute Quark writes on its nodes, at non-default values
    (BFP, dict(bfp_method="to_bfp_prime", axis=0, bit_width=13, block_size=16, rounding_mode=2,
               sub_block_size=2, sub_block_shift_bits=1, convert_to_bfloat_before_bfp=1,
               use_compiler_version_cpu_kernel=0)),
    (("BFPFixNeuron", "com.vai.quantize"), dict(bfp_method="to_bfp_prime_shared", axis=1,
                                                bit_width=16, block_size=8, rounding_mode=1,
                                                sub_block_size=4, sub_block_shift_bits=2)),
    (MX, dict(element_dtype="fp6_e2m3", axis=-1, block_size=32, rounding_mode=2)),
    (("MXFixNeuron", "com.vai.quantize"), dict(element_dtype="int8", axis=1, block_size=16,
                                               rounding_mode=0)),
]


@pytest.mark.parametrize("op,attrs", QUARK_ATTRIBUTES, ids=[o[0] for o, _ in QUARK_ATTRIBUTES])
def test_every_quark_attribute_is_accepted(op, attrs) -> None:
    from ort_mx_ops import reference
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    got = run_session(make_session(one_node_model(op[0], op[1], attrs)), x, "float32")
    fn = reference.bfp_quantize_dequantize if op[0].startswith("BFP") else reference.mx_quantize_dequantize
    expected = fn(x, **{k: v for k, v in attrs.items() if k != "use_compiler_version_cpu_kernel"})
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("axis", [2, -3, 100])
def test_axis_out_of_range(axis: int) -> None:
    sess = make_session(one_node_model(*BFP, {"axis": axis}))
    with pytest.raises(Exception) as info:
        run_session(sess, np.ones((2, 16), np.float32), "float32")
    assert "axis" in str(info.value) and "[-2, 1]" in str(info.value)
    # The same session still runs a valid input afterwards (rank 1 ignores the axis).
    assert run_session(sess, np.ones((8,), np.float32), "float32").shape == (8,)


def test_unsupported_input_type_is_an_error() -> None:
    node = helper.make_node("BFPQuantizeDequantize", ["x"], ["y"], domain="com.amd.quark")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, None)],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
    model = helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.amd.quark", 1)])
    with pytest.raises(Exception) as info:
        make_session(model)
    assert "BFPQuantizeDequantize" in str(info.value) and "double" in str(info.value)


def test_native_module_errors_are_value_errors() -> None:
    x = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="block_size"):
        native.bfp_quantize_dequantize(x, block_size=0)
    with pytest.raises(ValueError, match="element_dtype"):
        native.mx_quantize_dequantize(x, element_dtype="int4")
    with pytest.raises(ValueError, match="axis"):
        native.mx_quantize_dequantize(x, axis=2)
    with pytest.raises(ValueError, match="unknown attribute 'blok_size'"):
        native.mx_quantize_dequantize(x, blok_size=4)
    with pytest.raises(ValueError, match="unsupported input type"):
        native.mx_quantize_dequantize(x.astype(np.float64))


def test_process_survives_every_bad_input() -> None:
    """Every bad input in a child process: each must raise, and the child must
    exit normally afterwards (no abort, no crash)."""
    script = textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r})
        from conftest import make_session, one_node_model, run_session
        cases = {[(op, attrs) for op, attrs, _ in BAD_ATTRIBUTES]!r}
        cases += [(("BFPQuantizeDequantize", "com.amd.quark"), {{"axis": 5}}),
                  (("MXQuantizeDequantize", "com.amd.quark"), {{"axis": -9}})]
        raised = 0
        for (name, domain), attrs in cases:
            try:
                sess = make_session(one_node_model(name, domain, attrs), threads=2)
                run_session(sess, np.ones((3, 40), np.float32), "float32")
            except Exception:
                raised += 1
        print("RAISED", raised, "OF", len(cases))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    n = len(BAD_ATTRIBUTES) + 2
    assert f"RAISED {n} OF {n}" in result.stdout
