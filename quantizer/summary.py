"""What a quantization run did: one record per quantized tensor and a printable report."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import onnx

from .placement import Site

__all__ = ["SiteRecord", "QuantizationSummary"]


@dataclass
class SiteRecord:
    """One quantized tensor: where, how, and what it weighs."""
    tensor: str
    kind: str
    format: str
    op: str
    axis: Optional[int]
    consumer_ops: list[str]
    reason: str
    folded: bool
    numel: int            # weights only (0 for activations)
    itemsize: int
    bits_per_element: float
    output: str
    conflict: str = ""
    bf16_scale: Optional[float] = None
    runtime_nodes: list[str] = field(default_factory=list)
    flatten: bool = False

    @classmethod
    def from_site(cls, site: Site, *, folded: bool, numel: int, itemsize: int,
                  output: str, bf16_scale: Optional[float] = None,
                  runtime_nodes: Optional[list[str]] = None) -> "SiteRecord":
        return cls(tensor=site.tensor, kind=site.kind, format=site.spec.name,
                   op=site.spec.op, axis=site.axis, consumer_ops=list(site.consumer_ops),
                   reason=site.reason, folded=folded, numel=numel, itemsize=itemsize,
                   bits_per_element=site.spec.bits_per_element(), output=output,
                   conflict=site.conflict, bf16_scale=bf16_scale,
                   runtime_nodes=list(runtime_nodes or []), flatten=site.flatten)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


@dataclass
class QuantizationSummary:
    """The outcome of :func:`quantize_model`; ``str(summary)`` is the closing report."""
    config: str
    placement: str
    fold_weights: bool
    sites: list[SiteRecord]
    skipped: list[str]
    conflicts: list[str]
    input_bytes: int
    output_bytes: int = 0
    seconds: float = 0.0
    model: Optional[onnx.ModelProto] = None
    tuning: Optional[Any] = None   # a tuning.TuningReport when an accuracy algorithm ran
    equalization: Optional[Any] = None  # an equalization.EqualizationReport with CLE on
    rotation: Optional[Any] = None  # a rotation.RotationReport with hadamard_rotation on

    def counts(self) -> Counter:
        """Quantized tensors per (format, kind, consumer op type)."""
        c: Counter = Counter()
        for s in self.sites:
            for op in sorted(set(s.consumer_ops)):
                c[(s.format, s.kind, op)] += 1
        return c

    def axes(self) -> Counter:
        """Quantized tensors per (kind, axis)."""
        return Counter((s.kind, "1 of (C, kernel window)" if s.flatten else s.axis)
                       for s in self.sites)

    def runtime_node_count(self) -> int:
        return sum(len(s.runtime_nodes) for s in self.sites)

    def packed_weight_bytes(self) -> tuple[int, int]:
        """(float bytes, bytes in the quantized format with shared scales) of the quantized
        weights: what the weights would take packed, which the ONNX file does not do (it
        stores dequantized float values)."""
        float_bytes = sum(s.numel * s.itemsize for s in self.sites if s.kind == "weight")
        packed = sum(s.numel * s.bits_per_element / 8 for s in self.sites if s.kind == "weight")
        return float_bytes, int(round(packed))

    def as_dict(self) -> dict[str, Any]:
        fb, pb = self.packed_weight_bytes()
        return {"config": self.config, "placement": self.placement,
                "fold_weights": self.fold_weights, "seconds": self.seconds,
                "input_bytes": self.input_bytes, "output_bytes": self.output_bytes,
                "quantized_weight_float_bytes": fb, "quantized_weight_packed_bytes": pb,
                "runtime_nodes": self.runtime_node_count(),
                "sites": [s.as_dict() for s in self.sites],
                "skipped": self.skipped, "conflicts": self.conflicts,
                "tuning": self.tuning.as_dict() if self.tuning is not None else None,
                "equalization": self.equalization.as_dict() if self.equalization is not None
                else None,
                "rotation": self.rotation.as_dict() if self.rotation is not None else None}

    def __str__(self) -> str:
        lines = [f"quantized with {self.config} (placement {self.placement}, weights "
                 f"{'folded offline' if self.fold_weights else 'quantized at run time'}) "
                 f"in {self.seconds:.2f} s"]
        lines.append(f"  {'format':<14}{'kind':<12}{'consumer op':<20}{'tensors':>8}")
        for (fmt, kind, op), n in sorted(self.counts().items()):
            lines.append(f"  {fmt:<14}{kind:<12}{op:<20}{n:>8}")
        axes = ", ".join(f"{kind} axis {'-' if a is None else a}: {n}"
                         for (kind, a), n in sorted(self.axes().items(),
                                                    key=lambda kv: (kv[0][0], str(kv[0][1]))))
        lines.append(f"  axes: {axes or 'none'}")
        special = [s for s in self.sites if s.axis is not None and
                   ("instead" in s.reason or "1 long" in s.reason)]
        grouped: dict[str, list[str]] = {}
        for s in special:
            grouped.setdefault(s.reason, []).append(s.tensor)
        for reason, tensors in grouped.items():
            more = f" and {len(tensors) - 1} more" if len(tensors) > 1 else ""
            lines.append(f"  axis note: {reason} ({tensors[0]}{more})")
        folded = sum(1 for s in self.sites if s.folded)
        lines.append(f"  weights folded: {folded}; runtime nodes inserted: "
                     f"{self.runtime_node_count()}")
        fb, pb = self.packed_weight_bytes()
        lines.append(f"  size: input {_mb(self.input_bytes)}, output {_mb(self.output_bytes)} "
                     f"(float values); quantized weights {_mb(fb)} in float, {_mb(pb)} packed "
                     f"in their formats")
        for c in self.conflicts:
            lines.append(f"  conflict: {c}")
        for s in self.skipped:
            lines.append(f"  skipped: {s}")
        for report in (self.equalization, self.rotation):
            if report is not None:
                lines += ["  " + line for line in report.lines()]
        if self.tuning is not None:
            lines += ["  " + line for line in self.tuning.lines()]
        return "\n".join(lines)
