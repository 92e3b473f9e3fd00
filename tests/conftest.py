"""Shared helpers: one-node ONNX models and sessions with the CPU library registered."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ort_mx_ops
from ort_mx_ops import native, reference

ELEM_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
              "bfloat16": TensorProto.BFLOAT16}


def one_node_model(op: str, domain: str, attrs: dict, elem: str = "float32",
                   rank: int | None = None) -> onnx.ModelProto:
    """A model with a single custom node y = op(x); `rank` None leaves the shape unknown."""
    shape = None if rank is None else [None] * rank
    node = helper.make_node(op, ["x"], ["y"], domain=domain, name="n0", **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", ELEM_TYPES[elem], shape)],
        [helper.make_tensor_value_info("y", ELEM_TYPES[elem], shape)])
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


def make_session(model: onnx.ModelProto, threads: int = 1) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    ort_mx_ops.register(so)
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def ort_value(x: np.ndarray, elem: str) -> ort.OrtValue:
    """An OrtValue over the memory of `x`, of type `elem` (bfloat16: uint16 bit patterns)."""
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x, ELEM_TYPES[elem])


# Output buffers start as these signalling-NaN patterns. No op writes one: computed NaNs are
# quiet (and 16-bit stores set the quiet bit), and a float32 NaN passed through unchanged is
# the input's own pattern, which run_session checks is not the poison. So an element left
# unwritten shows as a mismatch even where a NaN is expected.
POISON = {"float32": 0x7FA5A5A5, "float16": 0x7D5A, "bfloat16": 0x7FA5}


def poisoned_like(x: np.ndarray, elem: str) -> np.ndarray:
    """An array of x's shape and dtype filled with the poison pattern of `elem`."""
    y = np.empty_like(x)
    bits(y)[...] = POISON[elem]
    return y


def run_session(sess: ort.InferenceSession, x: np.ndarray, elem: str) -> np.ndarray:
    """Runs y = f(x) with I/O binding into a fresh numpy buffer, so bfloat16 (which numpy
    cannot name) round-trips as uint16 bit patterns."""
    x = np.require(x, requirements="C")  # (ascontiguousarray would turn rank 0 into rank 1)
    assert not np.any(bits(x) == POISON[elem]), "the input holds the poison pattern"
    y = poisoned_like(x, elem)  # every element must be written
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", ort_value(x, elem))
    binding.bind_ortvalue_output("y", ort_value(y, elem))
    sess.run_with_iobinding(binding)
    return y


def run_one_node(op: str, domain: str, attrs: dict, x: np.ndarray, elem: str,
                 threads: int = 1) -> np.ndarray:
    """Runs y = op(x) through onnxruntime in a one-node model and returns y."""
    return run_session(make_session(one_node_model(op, domain, attrs, elem), threads), x, elem)


def native_and_reference(op: str):
    """(native function, numpy reference function) of the block op `op` ("BFP" or "MX")."""
    if op == "BFP":
        return native.bfp_quantize_dequantize, reference.bfp_quantize_dequantize
    return native.mx_quantize_dequantize, reference.mx_quantize_dequantize


def bits(a: np.ndarray) -> np.ndarray:
    """The bit patterns of an array, for bit-exact comparison (NaN payloads count); a view
    when `a` is C-contiguous."""
    a = np.require(a, requirements="C")
    return a.view({4: np.uint32, 2: np.uint16}[a.dtype.itemsize])


def assert_bits_equal(actual: np.ndarray, expected: np.ndarray, context: str = "") -> None:
    assert actual.shape == expected.shape, f"{context}: shape {actual.shape} != {expected.shape}"
    a, e = bits(actual), bits(expected)
    if not np.array_equal(a, e):
        idx = np.flatnonzero(a.reshape(-1) != e.reshape(-1))
        sample = [(int(i), hex(a.reshape(-1)[i]), hex(e.reshape(-1)[i])) for i in idx[:5]]
        pytest.fail(f"{context}: {idx.size} of {a.size} elements differ (index, got, "
                    f"expected): {sample}")


SPECIAL_VALUES = np.array([
    0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38,  # zeros, Inf, NaN, float max
    1e-45, -1e-45, 1.1754942e-38, 5.877472e-39,                       # subnormals
    1.1754944e-38, 0.5, -0.5, 1.5, 2.5, -2.5, 0.75, 1.00390625,       # smallest normal, ties
], dtype=np.float32)


def sample_tensor(shape: tuple[int, ...], rng: np.random.Generator,
                  specials: bool = True) -> np.ndarray:
    """float32 test data: normals over a wide exponent range (so blocks differ in scale),
    exact rounding ties (k + 1/2) * 2^j, blocks of zeros and, optionally, special values."""
    n = int(np.prod(shape))
    values = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    ties = ((rng.integers(-300, 300, n) + 0.5) * np.exp2(rng.integers(-12, 4, n)))
    pick = rng.random(n)
    values = np.where(pick < 0.2, ties.astype(np.float32), values)
    if n >= 16:
        start = int(rng.integers(0, n - 8))
        values[start:start + 8] = 0.0                                   # a run of zeros
    if specials:
        idx = rng.choice(n, size=min(n // 4, len(SPECIAL_VALUES)), replace=False)
        values[idx] = SPECIAL_VALUES[: idx.size]
    return values.reshape(shape)


def as_dtype(x32: np.ndarray, elem: str) -> np.ndarray:
    """The float32 array converted to the storage of `elem` (bfloat16 as uint16 bits)."""
    from ort_mx_ops.reference import float32_to_bfloat16_bits, float32_to_float16
    if elem == "float16":
        return float32_to_float16(x32)
    if elem == "bfloat16":
        return float32_to_bfloat16_bits(x32)
    return x32.astype(np.float32)
