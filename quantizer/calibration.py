"""Calibration: feed a CalibrationDataReader through the float model and record ranges.

The reader is anything with ``get_next()`` returning a dict of input name -> array, and
None when done (the protocol of ``onnxruntime.quantization.CalibrationDataReader``).  Only
BF16 activation rescaling needs ranges; for BFP and MX formats the shared scale comes from
each block at run time, so calibration has nothing to compute.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Protocol

import numpy as np
import onnx

from .progress import ProgressBar

__all__ = ["CalibrationDataReader", "NpzReader", "collect_abs_max"]


class CalibrationDataReader(Protocol):
    def get_next(self) -> Optional[dict[str, np.ndarray]]: ...


class NpzReader:
    """CalibrationDataReader over an .npz: arrays named after inputs, samples on axis 0,
    yielded ``batch_size`` at a time."""

    def __init__(self, path: str, batch_size: int = 1) -> None:
        self.arrays = dict(np.load(path))
        if not self.arrays:
            raise ValueError(f"{path} holds no arrays")
        self.n = min(len(a) for a in self.arrays.values())
        self.batch_size = batch_size
        self.pos = 0

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def get_next(self) -> Optional[dict[str, np.ndarray]]:
        if self.pos >= self.n:
            return None
        sl = slice(self.pos, self.pos + self.batch_size)
        self.pos += self.batch_size
        return {k: a[sl] for k, a in self.arrays.items()}


def _reader_length(reader: Any) -> Optional[int]:
    try:
        return len(reader)  # type: ignore[arg-type]
    except TypeError:
        return None


def collect_abs_max(model: onnx.ModelProto, tensors: Iterable[str], reader: CalibrationDataReader,
                    session_options: Any = None, providers: Optional[list[str]] = None,
                    progress: bool = True) -> dict[str, float]:
    """MinMax calibration: max |x| of each named float tensor over every batch the reader
    yields, running ``model`` (float, unquantized) in onnxruntime.  Raises ``ValueError``
    when the reader yields nothing."""
    import onnxruntime as ort

    tensors = list(dict.fromkeys(tensors))
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    for name in tensors:
        if name not in existing:
            # The type is left open: onnxruntime fills it in from the producer.
            probe.graph.output.append(onnx.ValueInfoProto(name=name))
    sess = ort.InferenceSession(probe.SerializeToString(), sess_options=session_options,
                                providers=providers or ["CPUExecutionProvider"])
    bar = ProgressBar("calibrating", _reader_length(reader), enabled=progress)
    out: dict[str, float] = {name: 0.0 for name in tensors}
    batches = 0
    try:
        while True:
            feed = reader.get_next()
            if feed is None:
                break
            values = sess.run(tensors, feed)
            for name, v in zip(tensors, values):
                v = np.asarray(v, dtype=np.float32)
                finite = v[np.isfinite(v)]
                if finite.size:
                    out[name] = max(out[name], float(np.abs(finite).max()))
            batches += 1
            bar.update()
    finally:
        bar.close()
    if batches == 0:
        raise ValueError("the calibration data reader yielded no batches")
    return out
