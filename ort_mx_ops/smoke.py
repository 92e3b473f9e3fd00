"""``ort-mx-smoke``: every op of the library once through onnxruntime, as a table.

For each configuration of SPEC section 3 it builds a one-node model, runs it on a random
tensor with the library registered, and reports whether the output equals
``ort_mx_ops.reference`` bit for bit, the relative RMS error against the input, and the
time per run. A quick check that an installation works.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from . import register, reference
from .formats import CONFIGS, LEGACY_DOMAIN, QUARK_DOMAIN


def _block_model(op: str, domain: str, attrs: dict):
    node = helper.make_node(op, ["x"], ["y"], domain=domain, **attrs)
    graph = helper.make_graph([node], "smoke", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


def _bf16_model():
    """ExtendedQuantizeLinear -> ExtendedDequantizeLinear with scale 1 and a bfloat16 zero 0."""
    inits = [helper.make_tensor("scale", TensorProto.FLOAT, [], [1.0]),
             helper.make_tensor("zp", TensorProto.BFLOAT16, [], b"\x00\x00", raw=True)]
    nodes = [helper.make_node("ExtendedQuantizeLinear", ["x", "scale", "zp"], ["q"], domain=QUARK_DOMAIN),
             helper.make_node("ExtendedDequantizeLinear", ["q", "scale", "zp"], ["y"], domain=QUARK_DOMAIN)]
    graph = helper.make_graph(nodes, "smoke", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(QUARK_DOMAIN, 1)])


def _cases():
    """(label, model, numpy reference function) for every configuration and legacy name."""
    for name, cfg in CONFIGS.items():
        if cfg.op == "BF16":
            yield name, "Extended Q/DQ pair", _bf16_model(), lambda x: reference.extended_dequantize_linear(
                reference.extended_quantize_linear(x, np.float32(1), np.uint16(0)), np.float32(1), np.uint16(0))
            continue
        op = "BFPQuantizeDequantize" if cfg.op == "BFP" else "MXQuantizeDequantize"
        fn = reference.bfp_quantize_dequantize if cfg.op == "BFP" else reference.mx_quantize_dequantize
        attrs = dict(cfg.attrs, axis=-1)
        yield name, op, _block_model(op, QUARK_DOMAIN, attrs), (lambda x, fn=fn, a=attrs: fn(x, **a))
    for name, op, fn, attrs in [("MX6 (legacy)", "BFPFixNeuron", reference.bfp_quantize_dequantize, CONFIGS["MX6"].attrs),
                                ("MXFP8E4M3 (legacy)", "MXFixNeuron", reference.mx_quantize_dequantize, CONFIGS["MXFP8E4M3"].attrs)]:
        attrs = dict(attrs, axis=-1)
        yield name, op, _block_model(op, LEGACY_DOMAIN, attrs), (lambda x, fn=fn, a=attrs: fn(x, **a))


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
