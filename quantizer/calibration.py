"""Calibration: feed a CalibrationDataReader through the float model and record ranges.

The reader is anything with ``get_next()`` returning a dict of input name -> array, and
None when done (the protocol of ``onnxruntime.quantization.CalibrationDataReader``).  Only
BF16 activation rescaling needs ranges; for BFP and MX formats the shared scale comes from
each block at run time, so calibration has nothing to compute (SPEC section 5).
"""
from __future__ import annotations

import sys
import time
from typing import Any, Iterable, Optional, Protocol, TextIO

import numpy as np
import onnx

__all__ = ["CalibrationDataReader", "ProgressBar", "collect_abs_max"]


class CalibrationDataReader(Protocol):
    def get_next(self) -> Optional[dict[str, np.ndarray]]: ...


class ProgressBar:
    """A one-line progress bar on stderr (``\\r``-updated on a terminal, a line every 10% when
    redirected); ``total`` may be None when the reader does not know its length."""

    def __init__(self, label: str, total: Optional[int] = None, stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self.label, self.total, self.count = label, total, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.start = time.perf_counter()
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_decile = -1

    def update(self, n: int = 1) -> None:
        self.count += n
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        rate = self.count / elapsed if elapsed > 0 else 0.0
        if self.total:
            frac = min(self.count / self.total, 1.0)
            bar = "#" * int(frac * 30) + "." * (30 - int(frac * 30))
            text = f"{self.label} [{bar}] {self.count}/{self.total} {rate:.1f}/s"
            decile = int(frac * 10)
        else:
            text = f"{self.label} {self.count} batches {rate:.1f}/s"
            decile = self.count // 10
        if self._tty:
            self.stream.write("\r" + text)
            self.stream.flush()
        elif decile != self._last_decile:
            self.stream.write(text + "\n")
        self._last_decile = decile

    def close(self) -> None:
        if self.enabled and self._tty:
            self.stream.write("\n")
            self.stream.flush()


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
