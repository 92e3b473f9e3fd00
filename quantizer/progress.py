"""A one-line progress bar for long quantizer steps (calibration, evaluation, per-layer work)."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """A one-line progress bar on stderr (``\\r``-updated on a terminal, a line every 10% when
    redirected) with the rate and, when ``total`` is known, the time left; ``total`` may be
    None when the work does not know its length."""

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
            eta = (self.total - self.count) / rate if rate > 0 else 0.0
            text = (f"{self.label} [{bar}] {self.count}/{self.total} {rate:.1f}/s "
                    f"ETA {max(eta, 0.0):.0f} s")
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
