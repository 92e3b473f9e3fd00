"""How long GPTQ-style weight rounding takes on a CNN of a given size:
``python -m ort_mx_ops.benchmarks.gptq_speed [--width 1.3] [--calib 32] [--config MX6]``.

Builds a MobileNetV2-shaped CNN (inverted residual blocks: 1x1 expand, 3x3 depthwise, 1x1
project; a 1x1 head and a 1000-way Gemm) with ``--width`` times the channels (1.3: about
5.3 M parameters, the size of an EfficientNet-Lite0), random He-initialised weights and
random calibration inputs, then times ``quantize_model(..., weight_rounding="gptq")`` against
the same call with round-to-nearest, and prints the tuning steps' own times
(``summary.tuning.timings``).  The cost of the rounding depends on the layers' shapes and the
number of calibration samples, not on the weights' values, so random weights time it as a
trained model would; accuracy is measured on real models in ``accuracy.py``.  A benchmark, not
a test: compare times from one run only.
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["build_cnn", "parameter_count", "main"]

# MobileNetV2's stages: expansion t, output channels c, repeats n, first stride s.
_STAGES = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1)]


def _channels(c: float) -> int:
    """``c`` rounded to a multiple of 8, never below 90 % of it (MobileNet's rule)."""
    v = max(8, int(c + 4) // 8 * 8)
    return v + 8 if v < 0.9 * c else v


def build_cnn(width: float = 1.3, resolution: int = 224, classes: int = 1000,
              seed: int = 0) -> onnx.ModelProto:
    """A float32 MobileNetV2-shaped model, input ``x`` of shape (N, 3, resolution,
    resolution), output ``y`` (N, classes) logits; weights drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def conv(x: str, cin: int, cout: int, k: int, stride: int, groups: int, relu: bool) -> str:
        i = len(nodes)
        w = rng.normal(0.0, np.sqrt(2.0 / (cin // groups * k * k)),
                       (cout, cin // groups, k, k)).astype(np.float32)
        b = rng.normal(0.0, 0.01, cout).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")])
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4, group=groups))
        if not relu:
            return f"c{i}"
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        return f"r{i}"

    cin = _channels(32 * width)
    h = conv("x", 3, cin, 3, 2, 1, True)
    for t, c, n, s in _STAGES:
        cout = _channels(c * width)
        for r in range(n):
            stride = s if r == 0 else 1
            mid = cin * t
            y = conv(h, cin, mid, 1, 1, 1, True) if t != 1 else h
            y = conv(y, mid, mid, 3, stride, mid, True)
            y = conv(y, mid, cout, 1, 1, 1, False)
            if stride == 1 and cin == cout:
                nodes.append(helper.make_node("Add", [h, y], [f"a{len(nodes)}"]))
                y = f"a{len(nodes) - 1}"
            h, cin = y, cout
    head = _channels(1280 * max(1.0, width))
    h = conv(h, cin, head, 1, 1, 1, True)
    nodes.append(helper.make_node("GlobalAveragePool", [h], ["pool"]))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], axis=1))
    wf = rng.normal(0.0, np.sqrt(1.0 / head), (head, classes)).astype(np.float32)
    inits += [numpy_helper.from_array(wf, "wfc"),
              numpy_helper.from_array(np.zeros(classes, np.float32), "bfc")]
    nodes.append(helper.make_node("Gemm", ["flat", "wfc", "bfc"], ["y"]))
    graph = helper.make_graph(
        nodes, "mobilenetv2_shaped", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, ["N", 3, resolution, resolution])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def parameter_count(model: onnx.ModelProto) -> int:
    """Number of elements in the model's initializers."""
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer)


def run(width: float, resolution: int, calib: int, config: str,
        activation: Optional[str]) -> dict[str, Any]:
    """Time round-to-nearest and GPTQ quantization of :func:`build_cnn`'s model."""
    from ort_mx_ops.benchmarks.accuracy import _Reader
    from ort_mx_ops.quantizer import quantize_model
    model = build_cnn(width, resolution)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0.0, 1.0, (1, 3, resolution, resolution)).astype(np.float32)}
             for _ in range(calib)]
    kw = {} if activation is None else {"activation": None if activation == "none" else activation}
    start = time.perf_counter()
    quantize_model(model, None, config, _Reader(feeds), **kw)
    nearest = time.perf_counter() - start
    start = time.perf_counter()
    s = quantize_model(model, None, config, _Reader(feeds), weight_rounding="gptq", **kw)
    gptq = time.perf_counter() - start
    tuned = [c for c in s.tuning.layers if "gptq" in c.applied]
    return {"parameters": parameter_count(model), "width": width, "resolution": resolution,
            "calibration_samples": calib, "config": config, "activation": activation,
            "nearest_s": nearest, "gptq_s": gptq, "layers": len(s.tuning.layers),
            "layers_kept_gptq": len(tuned), "timings_s": dict(s.tuning.timings)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ort_mx_ops.benchmarks.gptq_speed",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=float, default=1.3, help="channel multiplier (default 1.3)")
    p.add_argument("--resolution", type=int, default=224, help="input height and width")
    p.add_argument("--calib", type=int, default=32, help="random calibration inputs")
    p.add_argument("--config", default="MX6", help="weight (and activation) format")
    p.add_argument("--activation", default=None,
                   help="activation format if other than --config's ('none': weight-only)")
    a = p.parse_args(argv)
    r = run(a.width, a.resolution, a.calib, a.config, a.activation)
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in r["timings_s"].items())
    print(f"MobileNetV2-shaped CNN, width {r['width']}, {r['parameters'] / 1e6:.2f} M parameters, "
          f"{r['resolution']}x{r['resolution']} input, {r['calibration_samples']} calibration samples, "
          f"{r['config']}" + (f" weights, activations {r['activation']}" if r["activation"] else ""))
    print(f"round-to-nearest {r['nearest_s']:.1f} s; weight_rounding='gptq' {r['gptq_s']:.1f} s "
          f"({r['layers']} layers, GPTQ kept on {r['layers_kept_gptq']}); steps: {steps}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
