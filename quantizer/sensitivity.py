"""Per-tensor sensitivity: how much the model output moves when one tensor is quantized.

The engine here serves both the sensitivity report (``ort-mx-quantize --analyze``) and the
mixed-precision search (:mod:`.mixed_precision`).  It builds one *trial model* from the float
model, once:

* every quantizable weight (the tensors the default placement would quantize) becomes an
  overridable initializer, so a trial feeds the weight already quantized offline (by the
  same :func:`~.quantize.fold_weight` that writes the final model) in place of the float one;
* every quantizable activation goes through a chain of ``If`` nodes, one per candidate
  format, each switched by a boolean graph input: with every switch off the tensor passes
  unchanged, with one on it goes through that format's quantize-dequantize node (the same
  op, attributes and axis the final model gets).

So any assignment of formats to tensors is one ``session.run`` per calibration batch, with
no graph rebuilt and no session created; calibration batches of equal shape are stacked
into larger batches first.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


from .config import FormatSpec, QuantizationConfig
from .graph import ModelView
from .nodes import NodeFactory
from .placement import plan_model
from .progress import ProgressBar
from .quantize import fold_weight, _load, ModelInput

__all__ = ["MixedSite", "TrialModel", "Metric", "resolve_metric", "resolve_candidates",
           "SensitivityReport", "analyze_sensitivity", "sensitivity_of", "bits_of", "name_of",
           "top1_agreement", "mean_cosine", "sqnr_db", "FLOAT"]

FLOAT = "float"  # the candidate name that keeps a tensor in its own float type
_FLOAT_BITS = 32.0
_SQNR_CAP_DB = 300.0  # what "identical outputs" scores in dB (finite, so JSON can hold it)
_TIE_BREAK = 1e-3  # weight of the output noise power in a tensor's ranking loss

Outputs = list  # per calibration batch: the list of model outputs (numpy arrays)


# -- candidates -----------------------------------------------------------------------------
def resolve_candidates(candidates: Sequence[Union[str, FormatSpec, None]]) -> list[Optional[FormatSpec]]:
    """``candidates`` as FormatSpecs (None for float: the names ``"float"``, ``"fp32"``,
    ``"none"`` or None), without repeats, cheapest first.  Raises ``ValueError`` for an
    empty list or an unknown name."""
    out: list[Optional[FormatSpec]] = []
    for c in candidates:
        if c is None or (isinstance(c, str) and c.lower() in (FLOAT, "fp32", "none")):
            spec = None
        elif isinstance(c, FormatSpec):
            spec = c
        elif isinstance(c, str):
            spec = FormatSpec.from_name(c)
        else:
            raise TypeError(f"a candidate is a format name, a FormatSpec or None, got {c!r}")
        if spec not in out:
            out.append(spec)
    if not out:
        raise ValueError("candidates must name at least one format")
    return sorted(out, key=bits_of)


def bits_of(spec: Optional[FormatSpec]) -> float:
    """Storage bits of one element in ``spec`` (float: 32)."""
    return _FLOAT_BITS if spec is None else float(spec.bits_per_element())


def name_of(spec: Optional[FormatSpec]) -> str:
    return FLOAT if spec is None else spec.name


# -- metrics --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """A fidelity measure, higher is better.  ``fn(float_outputs, quantized_outputs)`` takes
    per-batch lists of model outputs.  ``loss`` maps a value to an additive "damage" (0 for
    identical outputs) used to rank tensors and predict the effect of several at once;
    ``value`` is its inverse."""
    name: str
    fn: Callable[[Outputs, Outputs], float]
    loss: Callable[[float], float]
    value: Callable[[float], float]
    first_output_only: bool = True


def _first(outs: Outputs) -> list[np.ndarray]:
    return [np.asarray(o[0]) for o in outs]


def top1_agreement(float_outputs: Outputs, quantized_outputs: Outputs) -> float:
    """Fraction of positions where the argmax of the first output over its last axis equals
    the float model's."""
    agree, total = 0, 0
    for f, q in zip(_first(float_outputs), _first(quantized_outputs)):
        same = f.argmax(axis=-1) == q.argmax(axis=-1)
        agree += int(same.sum())
        total += same.size
    return agree / total if total else 1.0


def mean_cosine(float_outputs: Outputs, quantized_outputs: Outputs) -> float:
    """Mean over samples (axis 0 of the first output) of the cosine similarity with float."""
    sims: list[float] = []
    for f, q in zip(_first(float_outputs), _first(quantized_outputs)):
        f2 = f.astype(np.float64).reshape(f.shape[0] if f.ndim > 1 else 1, -1)
        q2 = q.astype(np.float64).reshape(f2.shape)
        for a, b in zip(f2, q2):
            denom = float(np.linalg.norm(a) * np.linalg.norm(b))
            sims.append(float(a @ b) / denom if denom else float(np.array_equal(a, b)))
    return float(np.mean(sims)) if sims else 1.0


def sqnr_db(float_outputs: Outputs, quantized_outputs: Outputs) -> float:
    """Signal-to-quantization-noise ratio of the first output in dB (capped at 300 dB)."""
    signal, noise = 0.0, 0.0
    for f, q in zip(_first(float_outputs), _first(quantized_outputs)):
        f64 = f.astype(np.float64)
        signal += float(np.sum(f64 * f64))
        noise += float(np.sum((f64 - q.astype(np.float64)) ** 2))
    if not math.isfinite(noise):
        return -_SQNR_CAP_DB
    if noise <= 0:
        return _SQNR_CAP_DB
    if signal <= 0:
        return -_SQNR_CAP_DB
    return float(min(_SQNR_CAP_DB, 10.0 * math.log10(signal / noise)))


def resolve_metric(metric: Union[str, Callable[[Outputs, Outputs], float]]) -> Metric:
    """The :class:`Metric` for ``"top1"``, ``"cosine"``, ``"sqnr"`` or a callable
    ``(float_outputs, quantized_outputs) -> float`` (higher is better; each argument is a
    list over calibration batches of the list of model outputs)."""
    if callable(metric):
        fn = metric
        return Metric(getattr(fn, "__name__", "custom"), fn, lambda v: -float(v),
                      lambda loss: -float(loss), first_output_only=False)
    key = str(metric).lower()
    if key == "top1":
        return Metric("top1", top1_agreement, lambda v: 1.0 - v, lambda l: 1.0 - l)
    if key == "cosine":
        return Metric("cosine", mean_cosine, lambda v: 1.0 - v, lambda l: 1.0 - l)
    if key == "sqnr":
        return Metric("sqnr", sqnr_db, lambda v: 10.0 ** (-v / 10.0),
                      lambda l: _SQNR_CAP_DB if l <= 0 else -10.0 * math.log10(l))
    raise ValueError(f"metric must be 'top1', 'cosine', 'sqnr' or a callable, got {metric!r}")


# -- sites ----------------------------------------------------------------------------------
@dataclass
class MixedSite:
    """One tensor the search may quantize: its kind, block axis, the nodes that read it and
    its element count (weights: the tensor; activations: at the first calibration batch)."""
    index: int
    tensor: str
    kind: str
    axis: Optional[int]
    flatten: bool
    layers: list[str]
    op_types: list[str]
    numel: int = 0
    elem_type: int = TensorProto.FLOAT

    @property
    def label(self) -> str:
        return f"{','.join(self.layers)} ({'W' if self.kind == 'weight' else 'A'})"

    def allows(self, spec: Optional[FormatSpec]) -> bool:
        """BF16's Extended Q/DQ pair takes float32 tensors only."""
        return spec is None or spec.op != "BF16" or self.elem_type == TensorProto.FLOAT


def find_sites(model: onnx.ModelProto, view: ModelView, probe: FormatSpec,
               **options: Any) -> list[MixedSite]:
    """The tensors the default placement quantizes (``options``: the placement options of
    :class:`QuantizationConfig`), with the axis a block format gets on each."""
    cfg = QuantizationConfig(activation=probe, weight=probe, **options)
    plan = plan_model(view, cfg)
    sites = []
    for s in plan.sites:
        layers = [view.graph.node[i].name or f"{view.graph.node[i].op_type}_{i}"
                  for i, _ in s.consumers]
        numel = 0
        if s.kind == "weight":
            numel = int(np.prod(view.weights[s.tensor].tensor.dims))
        sites.append(MixedSite(len(sites), s.tensor, s.kind, s.axis, s.flatten,
                               list(dict.fromkeys(layers)), list(s.consumer_ops), numel,
                               view.elem_type.get(s.tensor, TensorProto.FLOAT)))
    return sites


# -- calibration data -----------------------------------------------------------------------
def read_batches(reader: Any, input_names: Sequence[str], stackable: bool,
                 max_batch: int = 32) -> list[dict[str, np.ndarray]]:
    """Every batch ``reader`` yields; with ``stackable`` (every input's axis 0 is dynamic),
    consecutive batches whose inputs agree in shape after axis 0 and in dtype are
    concatenated into batches of up to ``max_batch`` samples.  Raises ``ValueError`` when
    the reader yields nothing or misses an input."""
    if reader is None:
        raise ValueError("the sensitivity analysis and the mixed-precision search need "
                         "calibration data: pass calibration_data_reader (CLI: --calib or "
                         "--calib-reader)")
    feeds = []
    while True:
        feed = reader.get_next()
        if feed is None:
            break
        missing = [n for n in input_names if n not in feed]
        if missing:
            raise ValueError(f"calibration batch lacks model input(s) {missing}")
        feeds.append({n: np.asarray(feed[n]) for n in input_names})
    if not feeds:
        raise ValueError("the calibration data reader yielded no batches")
    if not stackable:
        return feeds
    out: list[dict[str, np.ndarray]] = []
    group: list[dict[str, np.ndarray]] = []

    def key(f):
        return tuple((a.shape[1:], a.dtype.str) for a in f.values())

    def flush():
        if group:
            out.append({n: np.concatenate([g[n] for g in group]) for n in input_names})
            group.clear()

    for f in feeds:
        if group and (key(f) != key(group[0]) or
                      sum(len(next(iter(g.values()))) for g in group) + len(next(iter(
                          f.values()))) > max_batch):
            flush()
        group.append(f)
    flush()
    return out


# -- the trial model ------------------------------------------------------------------------
class TrialModel:
    """The float model made switchable (see module docs), its session, the calibration
    batches and the float outputs; :meth:`evaluate` scores one assignment."""

    def __init__(self, model_input: ModelInput, calibration_data_reader: Any,
                 candidates: Sequence[Optional[FormatSpec]], metric: Metric,
                 max_batch: int = 32, threads: int = 0, **placement: Any) -> None:
        import onnxruntime as ort
        import ort_mx_ops
        model, in_path = _load(model_input)
        self.model = model
        self.base_dir = os.path.dirname(in_path) if in_path else None
        self.view = ModelView(model, base_dir=self.base_dir)
        self.candidates = list(candidates)
        self.metric = metric
        probe = next((c for c in self.candidates if c is not None and c.op != "BF16"),
                     FormatSpec.from_name("MXINT8"))
        self.sites = find_sites(model, self.view, probe, **placement)
        self.quant = [c for c in self.candidates if c is not None]
        inits = {i.name for i in model.graph.initializer}
        graph_inputs = [i for i in model.graph.input if i.name not in inits]
        self.input_names = [i.name for i in graph_inputs]
        # Axis 0 is a batch axis where it has no fixed length (a name, or -1 / 0 as some
        # exporters write).
        stackable = all(i.type.tensor_type.shape.dim and
                        i.type.tensor_type.shape.dim[0].dim_value <= 0
                        for i in graph_inputs)
        self.batches = read_batches(calibration_data_reader, self.input_names, stackable,
                                    max_batch)
        self.output_names = [o.name for o in model.graph.output]
        wanted = self.output_names[:1] if metric.first_output_only else self.output_names

        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
        float_sess = ort.InferenceSession(self._probe_model().SerializeToString(), so,
                                          providers=["CPUExecutionProvider"])
        acts = [s for s in self.sites if s.kind == "activation"]
        self.float_outputs: Outputs = []
        for b, feed in enumerate(self.batches):
            res = float_sess.run(wanted + ([s.tensor for s in acts] if b == 0 else []), feed)
            self.float_outputs.append(res[:len(wanted)])
            if b == 0:
                for s, v in zip(acts, res[len(wanted):]):
                    s.numel = int(np.asarray(v).size)
        del float_sess
        self.wanted = wanted
        ort_mx_ops.register(so)
        self.session = ort.InferenceSession(self._build().SerializeToString(), so,
                                            providers=["CPUExecutionProvider"])
        self._folded: dict[tuple[int, str], np.ndarray] = {}
        self.weight_models: dict[str, ModelView] = {}  # format name -> tuned weights
        self._cache: dict[tuple, float] = {}
        self.noise: dict[tuple, float] = {}
        self.evaluations = 0
        self.seconds = 0.0

    def _probe_model(self) -> onnx.ModelProto:
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        have = {o.name for o in m.graph.output}
        for s in self.sites:
            if s.kind == "activation" and s.tensor not in have:
                m.graph.output.append(onnx.ValueInfoProto(name=s.tensor))
        return m

    def _switch(self, site: int, spec: FormatSpec) -> str:
        return f"__amp_use_{site}_{self.quant.index(spec)}"

    def _build(self) -> onnx.ModelProto:
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        g = m.graph
        constants = {n.output[0]: i for i, n in enumerate(g.node)
                     if n.op_type == "Constant" and n.output}
        input_names = {i.name for i in g.input}
        counter = iter(range(1 << 30))
        factory = NodeFactory(lambda base: f"__amp{next(counter)}_{base}")
        domains: set[str] = set()
        before: dict[int, list[onnx.NodeProto]] = {}
        consumers = self.view.consumers
        drop: set[int] = set()
        for site in self.sites:
            t = site.tensor
            if site.kind == "weight":
                if t in constants:  # a Constant node's value becomes an initializer we can feed
                    g.initializer.append(numpy_helper.from_array(
                        self.view.weights[t].array(self.base_dir), t))
                    drop.add(constants[t])
                if t not in input_names:
                    ref = self.view.weights[t].tensor
                    g.input.append(helper.make_tensor_value_info(t, ref.data_type,
                                                                 list(ref.dims)))
                continue
            prev = t
            for k, spec in enumerate(self.quant):
                if not site.allows(spec):
                    continue
                sw = self._switch(site.index, spec)
                g.input.append(helper.make_tensor_value_info(sw, TensorProto.BOOL, []))
                y = f"__amp_{site.index}_{k}"
                # Then: the node the quantizer writes; else: the value so far, unchanged.
                emitted = factory.quantize(spec, t, f"{y}_then", site.axis,
                                           elem_type=site.elem_type)
                g.initializer.extend(emitted.initializers)
                domains |= emitted.domains
                then_g = helper.make_graph(emitted.nodes, f"{y}_then_g", [], [
                    helper.make_tensor_value_info(f"{y}_then", site.elem_type, None)])
                else_g = helper.make_graph(
                    [helper.make_node("Identity", [prev], [f"{y}_else"], name=f"{y}_id")],
                    f"{y}_else_g", [],
                    [helper.make_tensor_value_info(f"{y}_else", site.elem_type, None)])
                first = min(i for i, _ in consumers[t])
                before.setdefault(first, []).append(helper.make_node(
                    "If", [sw], [y], name=f"{y}_if", then_branch=then_g, else_branch=else_g))
                prev = y
            # The site's consumers only: other readers of the tensor keep the float value.
            for i, k in consumers[t]:
                if g.node[i].input[k] == t:
                    g.node[i].input[k] = prev
        rebuilt: list[onnx.NodeProto] = []
        for i, n in enumerate(g.node):
            if i not in drop:
                rebuilt.extend(before.get(i, []))
                rebuilt.append(n)
        del g.node[:]
        g.node.extend(rebuilt)
        for domain in sorted(domains - {o.domain for o in m.opset_import}):
            m.opset_import.append(helper.make_opsetid(domain, 1))
        m.ir_version = max(m.ir_version, 4)
        return m

    def use_weights(self, spec: FormatSpec, model: onnx.ModelProto) -> None:
        """From now on a trial that puts a weight in ``spec`` quantizes that weight's values
        in ``model`` (the float model with tuned weights, e.g. by GPTQ for ``spec``)
        instead of the float model's.  Clears the evaluations made so far."""
        self.weight_models[spec.name] = ModelView(model, base_dir=self.base_dir,
                                                  infer_shapes=False)
        self._folded = {k: v for k, v in self._folded.items() if k[1] != spec.name}
        self._cache.clear()
        self.noise.clear()

    def folded(self, site: MixedSite, spec: FormatSpec) -> np.ndarray:
        """``site``'s weight quantized in ``spec`` exactly as the written model stores it."""
        key = (site.index, spec.name)
        if key not in self._folded:
            view = self.weight_models.get(spec.name, self.view)
            values = view.weights[site.tensor].array(self.base_dir)
            self._folded[key] = fold_weight(values, spec, site.axis, 1.0,
                                            site.flatten and spec.op != "BF16")
        return self._folded[key]

    def outputs(self, assignment: Sequence[Optional[FormatSpec]],
                batches: Optional[int] = None) -> Outputs:
        """The model outputs (the metric's) on the first ``batches`` calibration batches
        (None: all) with ``assignment`` (one FormatSpec or None per site)."""
        extra: dict[str, np.ndarray] = {}
        for site, spec in zip(self.sites, assignment):
            if site.kind == "weight":
                if spec is not None:
                    extra[site.tensor] = self.folded(site, spec)
        for site in self.sites:
            if site.kind == "activation":
                for spec in self.quant:
                    if site.allows(spec):
                        extra[self._switch(site.index, spec)] = \
                            np.array(assignment[site.index] == spec)
        return [self.session.run(self.wanted, {**feed, **extra})
                for feed in self.batches[:batches]]

    def evaluate(self, assignment: Sequence[Optional[FormatSpec]],
                 batches: Optional[int] = None) -> float:
        """The metric of ``assignment`` against the float outputs on the first ``batches``
        calibration batches (None: all), cached."""
        key = (batches,) + tuple(name_of(s) for s in assignment)
        if key not in self._cache:
            t = time.perf_counter()
            ref = self.float_outputs[:batches]
            outs = self.outputs(assignment, batches)
            self._cache[key] = float(self.metric.fn(ref, outs))
            # Relative noise power of the first output: breaks the ties of a coarse metric
            # (top-1 on few samples) when ranking tensors.
            self.noise[key] = min(10.0 ** (-sqnr_db(ref, outs) / 10.0), 1.0)
            self.evaluations += 1
            self.seconds += time.perf_counter() - t
        return self._cache[key]

    def noise_of(self, assignment: Sequence[Optional[FormatSpec]],
                 batches: Optional[int] = None) -> float:
        """Noise power over signal power of the first output (0 to 1) for ``assignment``."""
        self.evaluate(assignment, batches)
        return self.noise[(batches,) + tuple(name_of(s) for s in assignment)]


# -- the report -----------------------------------------------------------------------------
@dataclass
class SensitivityReport:
    """Fidelity of the model with one tensor quantized at a time.  ``fidelity[i][fmt]`` is
    the metric when only ``sites[i]`` is in format ``fmt`` (everything else float)."""
    metric: str
    candidates: list[str]
    bits: dict[str, float]
    sites: list[MixedSite]
    fidelity: list[dict[str, float]]
    batches: int
    samples: int
    seconds: float = 0.0
    # Per site and format: the metric's loss plus 1e-3 x the output's relative noise power.
    losses: list[dict[str, float]] = field(default_factory=list)

    def ranking(self) -> list[int]:
        """Site indices, most sensitive first: by the loss at the cheapest format, then at
        the next cheaper ones."""
        order = sorted(self.candidates, key=lambda c: self.bits[c])
        return sorted(range(len(self.sites)),
                      key=lambda i: [-self.losses[i].get(c, 0.0) for c in order])

    def table(self, limit: Optional[int] = None) -> str:
        """The ranked table as text."""
        cols = [c for c in sorted(self.candidates, key=lambda c: self.bits[c]) if c != FLOAT]
        rows = [["rank", "layer", "kind", "elements"] + [f"{c} ({self.bits[c]:g} b)"
                                                         for c in cols]]
        for r, i in enumerate(self.ranking()[:limit], 1):
            s = self.sites[i]
            rows.append([str(r), ",".join(s.layers), s.kind, str(s.numel)] +
                        [f"{self.fidelity[i][c]:.4f}" if c in self.fidelity[i] else "-"
                         for c in cols])
        widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
        lines = [f"sensitivity: {self.metric} of the model output vs float with one tensor "
                 f"quantized ({self.samples} calibration samples in {self.batches} batches, "
                 f"{self.seconds:.1f} s)"]
        for row in rows:
            lines.append("  ".join(v.ljust(w) if k < 3 else v.rjust(w)
                                   for k, (v, w) in enumerate(zip(row, widths))))
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "candidates": self.candidates, "bits": self.bits,
                "batches": self.batches, "samples": self.samples, "seconds": self.seconds,
                "ranking": [self.sites[i].tensor for i in self.ranking()],
                "sites": [{"tensor": s.tensor, "kind": s.kind, "layers": s.layers,
                           "op_types": s.op_types, "axis": s.axis, "numel": s.numel,
                           "fidelity": self.fidelity[s.index]} for s in self.sites]}

    def save_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.as_dict(), f, indent=2)

    @classmethod
    def load_json(cls, path: str, metric: Union[str, Callable] = "top1") -> "SensitivityReport":
        """A report saved by :meth:`save_json` (for ``auto_mixed_precision(sensitivity=...)``
        on the same model, placement and candidates); the losses come from the saved values
        (without the noise tie-break)."""
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        m = resolve_metric(metric)
        if m.name != d["metric"]:
            raise ValueError(f"{path} holds {d['metric']} values, not {m.name}")
        sites = [MixedSite(i, e["tensor"], e["kind"], e["axis"], False, e["layers"],
                           e["op_types"], e["numel"]) for i, e in enumerate(d["sites"])]
        fidelity = [dict(e["fidelity"]) for e in d["sites"]]
        return cls(d["metric"], d["candidates"], d["bits"], sites, fidelity, d["batches"],
                   d["samples"], d["seconds"],
                   [{k: max(m.loss(v), 0.0) for k, v in row.items()} for row in fidelity])

    def save_heatmap(self, path: str) -> None:
        """A PNG heat map, tensors (ranked) down, formats across, weights and activations
        side by side.  Needs matplotlib (the ``bench`` extra)."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise RuntimeError("the sensitivity heat map needs matplotlib: pip install "
                               "'ort_mx_ops[bench]' (or leave out --heatmap)") from exc
        cols = [c for c in sorted(self.candidates, key=lambda c: self.bits[c])
                if any(c in row for row in self.fidelity)]  # measured formats only
        kinds = [k for k in ("weight", "activation") if any(s.kind == k for s in self.sites)]
        order = self.ranking()
        n = max(sum(1 for i in order if self.sites[i].kind == k) for k in kinds)
        fig, axes = plt.subplots(1, len(kinds), squeeze=False,
                                 figsize=(4 + 3.2 * len(kinds), 1.5 + 0.22 * min(n, 150)))
        values = [v for row in self.fidelity for v in row.values()]
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        if hi - lo < 1e-6:  # one value everywhere: still a readable scale around it
            lo, hi = lo - 0.01 * max(abs(lo), 1.0), hi + 0.01 * max(abs(hi), 1.0)
        im = None
        for ax, kind in zip(axes[0], kinds):
            idx = [i for i in order if self.sites[i].kind == kind]
            grid = np.array([[self.fidelity[i].get(c, np.nan) for c in cols] for i in idx])
            im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=lo, vmax=hi)
            ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", fontsize=7)
            ax.set_yticks(range(len(idx)), [",".join(self.sites[i].layers)[:40] for i in idx],
                          fontsize=6)
            ax.set_title(f"{kind}s only", fontsize=9)
        fig.colorbar(im, ax=axes[0].tolist(), label=f"{self.metric} vs float")
        fig.suptitle("sensitivity (most sensitive at the top)", fontsize=10)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)


def sensitivity_of(trial: TrialModel, progress: bool = True, batches: Optional[int] = None,
                   skip_top: bool = False) -> SensitivityReport:
    """One evaluation per (site, quantized candidate): only that site in that format, on the
    first ``batches`` calibration batches (None: all).  ``skip_top``: not the most precise
    candidate of each site (the search starts there and needs only the cheaper ones)."""
    start = time.perf_counter()
    cands = [c for c in trial.candidates if c is not None]
    todo = [(s, c) for s in trial.sites for c in cands if s.allows(c) and not (
        skip_top and c == max((d for d in trial.candidates if s.allows(d)), key=bits_of))]
    bar = ProgressBar("sensitivity", len(todo), enabled=progress)
    fidelity: list[dict[str, float]] = [{} for _ in trial.sites]
    losses: list[dict[str, float]] = [{} for _ in trial.sites]
    base: list[Optional[FormatSpec]] = [None] * len(trial.sites)
    for site, spec in todo:
        assignment = list(base)
        assignment[site.index] = spec
        value = fidelity[site.index][spec.name] = trial.evaluate(assignment, batches)
        # The metric's loss, ties broken by the output's noise power.
        losses[site.index][spec.name] = max(trial.metric.loss(value), 0.0) + \
            _TIE_BREAK * trial.noise_of(assignment, batches)
        bar.update()
    bar.close()
    names = [name_of(c) for c in trial.candidates]
    report = SensitivityReport(
        metric=trial.metric.name, candidates=names,
        bits={name_of(c): bits_of(c) for c in trial.candidates}, sites=trial.sites,
        fidelity=fidelity, batches=len(trial.batches[:batches]),
        samples=sum(len(next(iter(b.values()))) for b in trial.batches[:batches]),
        seconds=time.perf_counter() - start)
    report.losses = losses
    return report


def analyze_sensitivity(model_input: ModelInput, calibration_data_reader: Any,
                        candidates: Sequence[Union[str, FormatSpec, None]] = (
                            "MXFP4E2M1", "MXFP6E2M3", "MXFP8E4M3", "MXINT8", "BF16"),
                        metric: Union[str, Callable] = "top1", *, progress: bool = False,
                        max_batch: int = 32, batches: Optional[int] = None,
                        **placement: Any) -> SensitivityReport:
    """For each tensor the default placement quantizes (``placement``: its options, e.g.
    ``op_types_to_quantize``), the ``metric`` of the model output against float when only
    that tensor is quantized, in each candidate format, on the calibration data.  Print
    ``report.table()``; ``report.save_json(path)`` and ``report.save_heatmap(path)``
    write the JSON and the PNG.  Calibration batches of equal shape are stacked up to
    ``max_batch`` samples; ``batches`` limits the analysis to the first ones (faster)."""
    cands = resolve_candidates(candidates)
    trial = TrialModel(model_input, calibration_data_reader, cands, resolve_metric(metric),
                       max_batch=max_batch, **placement)
    return sensitivity_of(trial, progress, batches)
