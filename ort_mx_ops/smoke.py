"""``ort-mx-smoke``: every op of the library once through onnxruntime, as a table.

For each built-in configuration it builds a one-node model, runs it on a random
tensor with the library registered, and reports whether the output equals
``ort_mx_ops.reference`` bit for bit, the relative RMS error against the input, and the
time per run. A quick check that an installation works.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from . import register, reference
from .formats import CONFIGS, LEGACY_NAMES, FormatSpec
from .quantizer.nodes import NodeFactory


def _model(spec: FormatSpec, legacy: bool = False) -> onnx.ModelProto:
    """A one-node model (the Extended Q/DQ pair for BF16) of ``spec`` blocked along the last
    axis, built by the quantizer's node factory."""
    names = iter(f"t{i}" for i in range(1000))
    factory = NodeFactory(lambda base: next(names), legacy_names=legacy)
    emitted = factory.quantize(spec, "x", "y", axis=-1)
    graph = helper.make_graph(emitted.nodes, "smoke",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=emitted.initializers)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)] +
                             [helper.make_opsetid(d, 1) for d in sorted(emitted.domains)])


def _reference(spec: FormatSpec):
    """The numpy reference of ``spec`` along the last axis."""
    if spec.op == "BF16":
        one, zero = np.float32(1), np.uint16(0)
        return lambda x: reference.extended_dequantize_linear(
            reference.extended_quantize_linear(x, one, zero), one, zero)
    fn = reference.bfp_quantize_dequantize if spec.op == "BFP" else reference.mx_quantize_dequantize
    attrs = spec.node_attrs(-1)
    return lambda x: fn(x, **attrs)


def _cases():
    """(label, op, model, numpy reference function) for every configuration, and the
    legacy names of two."""
    for name, spec in CONFIGS.items():
        op = spec.op_type or "Extended Q/DQ pair"
        yield name, op, _model(spec), _reference(spec)
    for name in ("MX6", "MXFP8E4M3"):
        spec = CONFIGS[name]
        yield f"{name} (legacy)", LEGACY_NAMES[spec.op_type], _model(spec, legacy=True), \
            _reference(spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256, help="tensor rows (default 256)")
    parser.add_argument("--cols", type=int, default=1024, help="tensor columns, the blocked axis")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per op")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((args.rows, args.cols)) * np.exp2(rng.integers(-8, 8, (args.rows, 1)))).astype(np.float32)
    so = register(ort.SessionOptions())
    print(f"onnxruntime {ort.__version__}, input float32 {x.shape}, {args.repeat} runs each\n")
    print(f"| {'config':<20} | {'op':<22} | {'bit-exact vs reference':<22} | {'rel. RMS error':>14} | {'ms / run':>8} |")
    print(f"|{'-' * 22}|{'-' * 24}|{'-' * 24}|{'-' * 16}|{'-' * 10}|")
    all_exact = True
    for label, op, model, ref in _cases():
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        y = sess.run(None, {"x": x})[0]
        start = time.perf_counter()
        for _ in range(args.repeat):
            sess.run(None, {"x": x})
        ms = (time.perf_counter() - start) / args.repeat * 1e3
        exact = np.array_equal(y.view(np.uint32), ref(x).view(np.uint32))
        all_exact &= exact
        err = float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2)))
        print(f"| {label:<20} | {op:<22} | {'yes' if exact else 'NO':<22} | {err:>14.3e} | {ms:>8.2f} |")
    print("\nall ops bit-exact with the numpy reference" if all_exact else "\nMISMATCH against the reference")
    return 0 if all_exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
