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
