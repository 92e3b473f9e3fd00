"""ONNX models the benchmark runs: the product's op, the same quantize-dequantize built from
standard ONNX ops, and the memory-bound references (Neg, a copy).

Every model has one input ``X`` and one output ``Y`` of the same shape and element type, a 2-D
tensor ``[rows, cols]`` blocked along ``axis`` (1: the blocked axis is innermost, 0: outer).

The standard-ONNX form (``standard_qdq_model``) uses only default-domain ops (Reshape, Abs,
ReduceMax, Log, Floor, Pow, Where, Div, Mul, Round, Min, Max, Clip, Sign, Cast), so any ONNX
runtime executes it. It is the same operation as the custom op for finite normal float32 inputs
and rounding_mode 2 (the built-in configurations): ONNX ``Round`` is half to even, the
block exponent is that of the block's largest magnitude, found as floor(log2) from ``Log`` and
corrected by one step either way so it is exact, and every scaling is by an exact power of two.
It does not reproduce the special cases (Inf / NaN handling, subnormal flushing of the
microexponent formats, the sign of a zero result), and needs the blocked axis to be a multiple
of the block size.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ort_mx_ops.formats import CONFIGS, MX_ELEMENT_FORMATS
from ort_mx_ops.quantizer.nodes import NodeFactory

__all__ = ["ONNX_TYPES", "BF16_FUSED", "BENCH_CONFIGS", "config_spec", "custom_qdq_model",
           "standard_qdq_model", "reference_model", "geometry"]

ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
              "bfloat16": TensorProto.BFLOAT16}
OPSET = 18
# BF16 as our one BF16QuantizeDequantize node (the quantizer's bf16_qdq_fused): benchmarked
# beside the built-in configurations, whose BF16 is the Extended Q/DQ pair.
BF16_FUSED = "BF16fused"
BENCH_CONFIGS = (*CONFIGS, BF16_FUSED)


def config_spec(config: str):
    """The FormatSpec of a benchmark configuration (BF16_FUSED: BF16's)."""
    return CONFIGS["BF16" if config == BF16_FUSED else config]


def geometry(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, length, inner) of a tensor blocked along ``axis``."""
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, int(shape[axis]), inner


def _model(nodes: list, shape, dtype: str, initializers=(), domains=()) -> bytes:
    t = ONNX_TYPES[dtype]
    graph = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info("X", t, list(shape))],
                              [helper.make_tensor_value_info("Y", t, list(shape))],
                              initializer=list(initializers))
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model.SerializeToString()


def custom_qdq_model(config: str, shape, axis: int, dtype: str, nchwc_block: int = 0) -> bytes:
    """The product's (or a drop-in library's) op for the built-in ``config``, built by the
    quantizer's node factory (BF16: the Extended Q/DQ pair with scale 1; BF16_FUSED: one
    BF16QuantizeDequantize). ``nchwc_block`` > 0: the BFP / MX node reads its input in
    onnxruntime's blocked NCHWc memory order (attribute ``nchwc_block``; axis 1)."""
    spec = config_spec(config)
    if spec.op == "BF16" and dtype != "float32":
        raise ValueError("the BF16 quantize-dequantize ops take float32 tensors")
    if nchwc_block and spec.op == "BF16":
        raise ValueError("BF16 has no NCHWc form (nchwc_block is a BFP / MX attribute)")
    names = iter(f"t{i}" for i in range(1000))
    factory = NodeFactory(lambda base: next(names), bf16_fused=config == BF16_FUSED)
    emitted = factory.quantize(spec, "X", "Y", axis)
    if nchwc_block:
        for node in emitted.nodes:
            node.attribute.append(helper.make_attribute("nchwc_block", nchwc_block))
    return _model(emitted.nodes, shape, dtype, emitted.initializers, sorted(emitted.domains))


def reference_model(kind: str, shape, dtype: str) -> bytes:
    """``neg``: onnxruntime's Neg; ``copy``: Identity from the graph input to the graph output,
    which the runtime must copy (an output buffer is bound, and the harness checks it)."""
    op = {"neg": "Neg", "copy": "Identity"}[kind]
    return _model([helper.make_node(op, ["X"], ["Y"])], shape, dtype)


class _Builder:
    """Small helper to write standard-ONNX graphs."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.inits: list = []
        self.n = 0

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def const(self, value: Any, dtype=np.float32) -> str:
        arr = np.asarray(value, dtype=dtype)
        name = self.name("c")
        self.inits.append(onnx.numpy_helper.from_array(arr, name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def reduce_max(self, x: str, axis: int) -> str:
        return self.op("ReduceMax", x, self.const([axis], np.int64), keepdims=1)

    def floor_log2(self, a: str, lowest: float) -> str:
        """floor(log2(a)) for a >= 0, exact for normal a (Log's error is corrected by one step
        either way), clamped below at ``lowest`` (which a = 0 gives)."""
        e0 = self.op("Floor", self.op("Div", self.op("Log", a), self.const(math.log(2.0))))
        two = self.const(2.0)
        one = self.const(1.0)
        e1 = self.op("Where", self.op("Greater", self.op("Pow", two, e0), a),
                     self.op("Sub", e0, one), e0)
        e2 = self.op("Where", self.op("LessOrEqual", self.op("Pow", two, self.op("Add", e1, one)), a),
                     self.op("Add", e1, one), e1)
        return self.op("Max", e2, self.const(lowest))

    def pow2(self, e: str) -> str:
        return self.op("Pow", self.const(2.0), e)


def standard_qdq_model(config: str, shape, axis: int, dtype: str) -> bytes:
    """``config`` built from default-domain ONNX ops (see the module docstring)."""
    cfg = config_spec(config)
    b = _Builder()
    x = "X"
    if dtype != "float32":
        x = b.op("Cast", x, to=TensorProto.FLOAT)
    if cfg.op == "BF16":
        y = b.op("Cast", b.op("Cast", x, to=TensorProto.BFLOAT16), to=TensorProto.FLOAT)
    else:
        outer, length, inner = geometry(tuple(shape), axis)
        bs = int(cfg.attrs["block_size"])
        if length % bs:
            raise ValueError(f"the standard-ONNX form needs the blocked axis ({length}) to be a "
                             f"multiple of block_size ({bs})")
        if cfg.op == "BFP" and cfg.attrs["bfp_method"] == "to_bfp_prime":
            y5 = _prime(b, x, cfg.attrs, outer, length, inner)
            y = b.op("Reshape", y5, b.const(list(shape), np.int64))
        else:
            x4 = b.op("Reshape", x, b.const([outer, length // bs, bs, inner], np.int64))
            e = b.floor_log2(b.reduce_max(b.op("Abs", x4), 2), -126.0)
            if cfg.op == "BFP":
                y4 = _to_bfp(b, x4, e, int(cfg.attrs["bit_width"]) - 9)
            else:
                y4 = _mx(b, x4, e, MX_ELEMENT_FORMATS[cfg.attrs["element_dtype"]])
            y = b.op("Reshape", y4, b.const(list(shape), np.int64))
    if dtype != "float32":
        y = b.op("Cast", y, to=ONNX_TYPES[dtype])
    b.nodes.append(helper.make_node("Identity", [y], ["Y"]))
    return _model(b.nodes, shape, dtype, b.inits)


def _to_bfp(b: _Builder, x4: str, e: str, m: int) -> str:
    scale = b.pow2(b.op("Sub", e, b.const(float(m - 1))))
    max_v = b.op("Mul", scale, b.const(float(2 ** m - 1)))
    y = b.op("Mul", b.op("Round", b.op("Div", x4, scale)), scale)
    return b.op("Min", b.op("Max", y, b.op("Neg", max_v)), max_v)


def _mx(b: _Builder, x4: str, e: str, fmt) -> str:
    scale = b.pow2(b.op("Sub", e, b.const(float(fmt.emax))))
    v = b.op("Div", x4, scale)
    if fmt.is_integer:
        q = b.op("Clip", b.op("Round", b.op("Mul", v, b.const(64.0))), b.const(-128.0),
                 b.const(127.0))
        v = b.op("Div", q, b.const(64.0))
    else:
        emin = 1 - fmt.bias
        ev = b.floor_log2(b.op("Abs", v), float(emin))
        quantum = b.pow2(b.op("Sub", ev, b.const(float(fmt.mantissa_bits))))
        r = b.op("Mul", b.op("Round", b.op("Div", v, quantum)), quantum)
        v = b.op("Clip", r, b.const(-fmt.max_normal), b.const(fmt.max_normal))
    return b.op("Mul", v, scale)


def _prime(b: _Builder, x: str, attrs: dict, outer: int, length: int, inner: int) -> str:
    m = int(attrs["bit_width"]) - 9
    bs, sub = int(attrs["block_size"]), int(attrs["sub_block_size"])
    cap = float(2 ** int(attrs["sub_block_shift_bits"]) - 1)
    x5 = b.op("Reshape", x, b.const([outer, length // bs, bs // sub, sub, inner], np.int64))
    a = b.op("Abs", x5)
    sub_max = b.reduce_max(a, 3)
    e_sub = b.floor_log2(sub_max, -126.0)
    e_blk = b.floor_log2(b.reduce_max(sub_max, 2), -126.0)
    shift = b.op("Min", b.op("Sub", e_blk, e_sub), b.const(cap))
    quantum = b.pow2(b.op("Add", b.op("Sub", e_blk, shift), b.const(float(1 - m))))
    q = b.op("Min", b.op("Round", b.op("Div", a, quantum)), b.const(float(2 ** m - 1)))
    return b.op("Mul", b.op("Sign", x5), b.op("Mul", q, quantum))
