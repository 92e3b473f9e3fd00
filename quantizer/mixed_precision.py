"""Automatic mixed precision: the fewest bits per tensor that keep the output good enough.

:func:`auto_mixed_precision` gives every weight and every activation the placement would
quantize one format from a candidate list, so that the chosen metric on the calibration data
meets ``target`` while ``weight_bits + activation_bits`` (see :func:`bits_accounting`) is as
small as the search can make it:

1. Sensitivity: the metric with only one tensor quantized, for every tensor and candidate
   (:mod:`.sensitivity`, one switchable model, no graph rebuilt per trial).
2. Greedy descent: start with every tensor in its most precise candidate; the moves "tensor
   t to cheaper format f" are ranked by the loss they cost alone per bit they save, and
   applied in that order, in growing chunks, each chunk checked on the calibration data
   with everything chosen so far (so interactions count); a chunk that breaks the target
   is halved until the one move that breaks it is found and dropped.
3. Verification: the model is written with the real quantizer and run with the library on
   the calibration data; if it misses the target, the latest moves are undone until it
   meets it.

With ``weight_rounding="gptq"`` the trial model's weights in each cheaper format are the
GPTQ-rounded ones (:func:`~.tuning.tune_model` for that format on every weight, activations
float), so the sensitivity and every check of the search see the rounding the written
model gets; the written model is then GPTQ-rounded for its own mixed assignment
(``quantize_model(..., weight_rounding="gptq")``, with the calibration data).

Named presets after Quark's mixed configs (:data:`MIXED_CONFIGS`) pick the candidates.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import onnx

from .config import FormatSpec, QuantizationConfig, WEIGHT_ROUNDINGS
from .quantize import quantize_model, ModelInput, _Replay
from .progress import ProgressBar
from .sensitivity import (MixedSite, SensitivityReport, TrialModel,
                          bits_of, name_of, resolve_candidates, resolve_metric,
                          sensitivity_of)
from .summary import QuantizationSummary

__all__ = ["auto_mixed_precision", "bits_accounting", "MixedPrecisionSummary",
           "MIXED_CONFIGS", "DEFAULT_CANDIDATES"]

DEFAULT_CANDIDATES = ("MXFP4E2M1", "MXFP6E2M3", "MXFP8E4M3", "MXINT8", "BF16")

# Quark's mixed-precision presets, as candidate lists for the search (what each one is in
# Quark, and where ours differs, is in docs and the README).
MIXED_CONFIGS: dict[str, tuple[str, ...]] = {
    "BF16_MIXED_BFP16": ("BFP16", "BF16"),
    "BF16_MIXED_MXINT8": ("MXINT8", "BF16"),
}


def bits_accounting(sites: Sequence[MixedSite],
                    assignment: Sequence[Optional[FormatSpec]]) -> tuple[float, float]:
    """(weight_bits, activation_bits): the storage bits per element of the quantizable
    weights (resp. activations), shared scales included, averaged with each tensor's
    element count as its weight; a tensor kept float counts 32 bits.  A kind with no
    tensors gives 0."""
    out = []
    for kind in ("weight", "activation"):
        pairs = [(s.numel, bits_of(a)) for s, a in zip(sites, assignment) if s.kind == kind]
        total = sum(n for n, _ in pairs)
        out.append(sum(n * b for n, b in pairs) / total if total else 0.0)
    return out[0], out[1]


@dataclass
class MixedPrecisionSummary(QuantizationSummary):
    """What :func:`auto_mixed_precision` chose: the usual summary of the written model plus
    the bits, the fidelity reached on the calibration data and the format of every tensor."""
    weight_bits: float = 0.0
    activation_bits: float = 0.0
    metric: str = ""
    target: Optional[float] = None
    achieved: float = float("nan")
    met: bool = False
    assignment: dict[str, str] = field(default_factory=dict)
    layers: list[dict[str, Any]] = field(default_factory=list)
    evaluations: int = 0
    search_seconds: float = 0.0
    weight_rounding: str = "nearest"
    sensitivity: Optional[SensitivityReport] = None

    def as_dict(self) -> dict[str, Any]:
        d = super().as_dict()
        d.update({"weight_bits": self.weight_bits, "activation_bits": self.activation_bits,
                  "metric": self.metric, "target": self.target, "achieved": self.achieved,
                  "met": self.met, "assignment": self.assignment, "layers": self.layers,
                  "evaluations": self.evaluations, "search_seconds": self.search_seconds,
                  "weight_rounding": self.weight_rounding})
        return d

    def __str__(self) -> str:
        head = (f"auto mixed precision: {self.metric} {self.achieved:.4f} on the calibration "
                f"data (target {self.target}, {'met' if self.met else 'NOT met'}); "
                f"weight_bits {self.weight_bits:.3f}, activation_bits "
                f"{self.activation_bits:.3f}, {self.weight_rounding} weight rounding; "
                f"{self.evaluations} trial evaluations in "
                f"{self.search_seconds:.1f} s")
        counts: dict[tuple[str, str], int] = {}
        for layer in self.layers:
            key = (layer["kind"], layer["format"])
            counts[key] = counts.get(key, 0) + 1
        mix = ", ".join(f"{k} {f}: {n}" for (k, f), n in sorted(counts.items()))
        return "\n".join([head, f"  tensors per format: {mix}", super().__str__()])


@dataclass
class _Move:
    site: int
    spec: Optional[FormatSpec]
    loss: float
    score: float


def _moves(trial: TrialModel, report: SensitivityReport, start: list[Optional[FormatSpec]],
           totals: dict[str, int], objective: str = "total") -> list[_Move]:
    """Every (site, cheaper candidate) move, ranked by loss alone per averaged bit saved."""
    moves = []
    for site in trial.sites:
        top = start[site.index]
        for spec in trial.candidates:
            if bits_of(spec) >= bits_of(top) or not site.allows(spec):
                continue
            loss = report.losses[site.index].get(name_of(spec), 0.0) if spec else 0.0
            saved = (bits_of(top) - bits_of(spec)) * site.numel / max(totals[site.kind], 1)
            if objective == "weights" and site.kind == "activation":
                saved *= 1e-6  # activations go down only after every weight move was tried
            moves.append(_Move(site.index, spec, loss, (loss + 1e-12) / max(saved, 1e-12)))
    return sorted(moves, key=lambda m: (m.score, bits_of(m.spec)))


def _search(trial: TrialModel, report: SensitivityReport, start: list[Optional[FormatSpec]],
            target: Optional[float], progress: bool, objective: str = "total") -> tuple[list, list[tuple[int, Any, Any]]]:
    """Greedy descent from ``start`` (see module docs).  Returns the assignment and the
    accepted moves in order (site, previous format, new format), for backtracking."""
    totals = {k: sum(s.numel for s in trial.sites if s.kind == k)
              for k in ("weight", "activation")}
    metric = trial.metric
    current = list(start)
    history: list[tuple[int, Any, Any]] = []
    pending = _moves(trial, report, start, totals, objective)
    failed: dict[int, list[_Move]] = {}

    def meets(value: float) -> bool:
        return target is None or value >= target

    def applicable(m: _Move, state: list) -> bool:
        if bits_of(m.spec) >= bits_of(state[m.site]):
            return False
        # A cheaper format no less damaging alone than one that already failed here.
        return not any(bits_of(m.spec) <= bits_of(f.spec) and m.loss >= f.loss
                       for f in failed.get(m.site, []))

    # First chunk: as many moves as the single-tensor losses predict to fit the budget.
    budget = metric.loss(target) - metric.loss(trial.evaluate(current)) if target is not None \
        else float("inf")
    chunk, spent = 0, 0.0
    for m in pending:
        spent += m.loss
        if spent > budget:
            break
        chunk += 1
    chunk = max(chunk, 1)
    bar = ProgressBar("search", len(pending), enabled=progress)
    pos = 0
    while pos < len(pending):
        batch, trial_state, j = [], list(current), pos
        while j < len(pending) and len(batch) < chunk:
            m = pending[j]
            j += 1
            if applicable(m, trial_state):
                batch.append((m, trial_state[m.site]))
                trial_state[m.site] = m.spec
        if not batch:
            bar.update(j - pos)
            pos = j
            continue
        value = trial.evaluate(trial_state)
        if meets(value):
            for m, prev in batch:
                history.append((m.site, prev, m.spec))
            current = trial_state
            bar.update(j - pos)
            pos = j
            chunk *= 2
        elif len(batch) == 1:
            failed.setdefault(batch[0][0].site, []).append(batch[0][0])
            bar.update(j - pos)
            pos = j
            chunk = 1
        else:
            chunk = max(1, len(batch) // 2)
    bar.close()
    return current, history


def _gptq_trial(trial: TrialModel, start: list, placement: dict[str, Any],
                progress: bool) -> None:
    """Give the trial model GPTQ-rounded weights in every format a weight may move to: per
    format, the weights :func:`~.tuning.tune_model` rounds with GPTQ when every weight is in
    that format (activations float), on the calibration batches."""
    from .tuning import tune_model
    specs = [c for c in trial.quant if any(
        s.kind == "weight" and s.allows(c) and bits_of(c) < bits_of(start[s.index])
        for s in trial.sites)]
    for k, spec in enumerate(specs, 1):
        if progress:
            print(f"auto mixed precision: GPTQ rounding of the weights in {spec.name} "
                  f"({k}/{len(specs)})", file=sys.stderr)
        cfg = QuantizationConfig(activation=None, weight=spec, **placement)
        tuned, _ = tune_model(trial.model, cfg, trial.batches, weight_rounding="gptq",
                              base_dir=trial.base_dir, progress=progress)
        trial.use_weights(spec, tuned)


def _verify(model_input: ModelInput, trial: TrialModel, assignment: list,
            summary_opts: dict[str, Any]) -> tuple[QuantizationSummary, float]:
    """Write the model with ``assignment`` through :func:`quantize_model` (the calibration
    batches as its calibration data) and score it with the library on those batches."""
    import onnxruntime as ort
    import ort_mx_ops
    formats = {s.tensor: a for s, a in zip(trial.sites, assignment)}
    summary = quantize_model(model_input, None, QuantizationConfig(
        activation=None, weight=None, tensor_formats=formats, name="mixed"),
        _Replay(trial.batches), **summary_opts)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ort_mx_ops.register(so)
    sess = ort.InferenceSession(summary.model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    outs = [sess.run(trial.wanted, feed) for feed in trial.batches]
    return summary, float(trial.metric.fn(trial.float_outputs, outs))


def _replay(start: list, history: list[tuple[int, Any, Any]], k: int) -> list:
    state = list(start)
    for site, _, spec in history[:k]:
        state[site] = spec
    return state


def _backtrack(model_input: ModelInput, trial: TrialModel, start: list,
               history: list[tuple[int, Any, Any]], target: float, options: dict[str, Any],
               progress: bool) -> tuple[QuantizationSummary, float, list]:
    """Bisect for the longest prefix of ``history`` whose written model meets ``target``
    (the empty prefix, the most precise candidates, is taken as meeting it)."""
    lo, hi = 0, len(history) - 1  # prefix lo meets (assumed for 0), prefix hi + 1 fails
    best = None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        summary, achieved = _verify(model_input, trial, _replay(start, history, mid), options)
        if progress:
            print(f"verification: first {mid} of {len(history)} moves give "
                  f"{achieved:.4f} (target {target})", file=sys.stderr)
        if achieved >= target:
            lo, best = mid, (summary, achieved)
        else:
            hi = mid - 1
    assignment = _replay(start, history, lo)
    if best is None:
        best = _verify(model_input, trial, assignment, options)
    return best[0], best[1], assignment


def auto_mixed_precision(model_input: ModelInput, model_output: Optional[Union[str, os.PathLike]],
                         calibration_data_reader: Any,
                         candidates: Union[str, Sequence[Union[str, FormatSpec, None]]] = DEFAULT_CANDIDATES,
                         target: Optional[float] = None,
                         metric: Union[str, Callable] = "top1", *, progress: bool = False,
                         max_batch: int = 32, sensitivity_batches: Optional[int] = None,
                         sensitivity: Optional[SensitivityReport] = None,
                         objective: str = "total", weight_rounding: str = "nearest",
                         **options: Any) -> MixedPrecisionSummary:
    """Quantize ``model_input`` with a format per tensor from ``candidates`` (format names,
    FormatSpecs, ``"float"``; or a preset name of :data:`MIXED_CONFIGS`) so that ``metric``
    on the calibration data is at least ``target`` with the fewest bits; write the model to
    ``model_output`` (None: only return it as ``summary.model``).

    ``metric``: ``"top1"`` (agreement of the argmax over the last axis of the first output
    with float), ``"cosine"`` (mean cosine similarity of the first output per sample),
    ``"sqnr"`` (dB), or a callable ``(float_outputs, quantized_outputs) -> float``, higher
    is better, each argument a list over calibration batches of the model's outputs.
    ``target`` None: no constraint, every tensor gets its cheapest candidate.  ``options``:
    placement and emission options of :class:`QuantizationConfig` (``op_types_to_quantize``,
    ``nodes_to_exclude``, ``fold_weights``, ...).  Calibration batches of equal shape are
    stacked up to ``max_batch`` samples; the sensitivity pass, which ranks the moves, may use
    only the first ``sensitivity_batches`` (faster; every check of the target uses all).
    ``objective``: ``"total"`` (default) minimises ``weight_bits + activation_bits``;
    ``"weights"`` spends the fidelity budget on weights first (the fewest weight bits,
    activations lowered only where the target still allows).  ``sensitivity``: a report of
    :func:`~.sensitivity.analyze_sensitivity` on the same model, data, candidates and
    metric, to skip that pass.  ``weight_rounding``: ``"nearest"`` (default) or ``"gptq"``
    (error-compensating rounding from the calibration inputs, as in :func:`quantize_model`;
    the search then scores the GPTQ-rounded weights, see module docs; slower).

    Returns a :class:`MixedPrecisionSummary`: the usual summary plus ``weight_bits``,
    ``activation_bits`` (:func:`bits_accounting`), ``achieved`` (the metric of the written
    model on the calibration data), ``met`` and the per-tensor ``assignment``.  When even
    the most precise candidates miss the target, the most precise assignment is written
    and ``met`` is False."""
    start_time = time.perf_counter()
    if objective not in ("total", "weights"):
        raise ValueError(f"objective must be 'total' or 'weights', got {objective!r}")
    if weight_rounding not in WEIGHT_ROUNDINGS:
        raise ValueError(f"weight_rounding must be one of {WEIGHT_ROUNDINGS}, got "
                         f"{weight_rounding!r}")
    if isinstance(candidates, str):
        key = candidates.upper()
        if key not in MIXED_CONFIGS:
            raise ValueError(f"candidates is a list of formats or one of "
                             f"{', '.join(MIXED_CONFIGS)}, got {candidates!r}")
        candidates = MIXED_CONFIGS[key]
    cands = resolve_candidates(candidates)
    metric_obj = resolve_metric(metric)
    placement = {k: options[k] for k in ("op_types_to_quantize", "nodes_to_exclude",
                                         "quantize_all_op_types", "quantize_bias",
                                         "placement") if k in options}
    if target is not None and not isinstance(target, (int, float)):
        raise TypeError(f"target must be a number, got {target!r}")
    trial = TrialModel(model_input, calibration_data_reader, cands, metric_obj,
                       max_batch=max_batch, **placement)
    if not trial.sites:
        raise ValueError("the model has no tensor the placement quantizes (no Conv, "
                         "ConvTranspose, Gemm or MatMul input in float)")
    start = [max((c for c in cands if s.allows(c)), key=bits_of) for s in trial.sites]
    if weight_rounding == "gptq" and target is not None:
        _gptq_trial(trial, start, placement, progress)
    report = sensitivity or sensitivity_of(trial, progress, sensitivity_batches,
                                           skip_top=True)
    if target is None:
        assignment = [min((c for c in cands if s.allows(c)), key=bits_of)
                      for s in trial.sites]
        history: list[tuple[int, Any, Any]] = []
    elif trial.evaluate(start) < target:
        if progress:
            print(f"auto mixed precision: the most precise candidates reach "
                  f"{trial.evaluate(start):.4f} < target {target}; writing those",
                  file=sys.stderr)
        assignment, history = start, []
    else:
        assignment, history = _search(trial, report, start, target, progress, objective)
    options = {**options, "weight_rounding": weight_rounding}
    summary, achieved = _verify(model_input, trial, assignment, options)
    if target is not None and achieved < target and history:
        # The written model misses what the trial model met (onnxruntime fuses and orders
        # float ops differently when weights are constants, and the coarsest formats amplify
        # that): keep the longest prefix of the accepted moves that the written model meets.
        summary, achieved, assignment = _backtrack(model_input, trial, start, history,
                                                   target, options, progress)
    result = _finish(summary, model_input, model_output, trial, assignment, report,
                     achieved, target, start_time)
    result.weight_rounding = weight_rounding
    return result


def _finish(summary: QuantizationSummary, model_input: ModelInput, model_output: Any,
            trial: TrialModel, assignment: list, report: SensitivityReport,
            achieved: float, target: Optional[float], start_time: float) -> MixedPrecisionSummary:
    from .quantize import save_model_atomic, _same_file
    if model_output is not None:
        if not isinstance(model_input, onnx.ModelProto) and \
                _same_file(os.fspath(model_input), os.fspath(model_output)):
            raise ValueError(f"refusing to write the quantized model over its input "
                             f"{os.fspath(model_input)!r}; choose another output path")
        save_model_atomic(summary.model, os.fspath(model_output))
        summary.output_bytes = os.path.getsize(os.fspath(model_output))
    wb, ab = bits_accounting(trial.sites, assignment)
    fields = {f.name: getattr(summary, f.name) for f in dataclasses.fields(QuantizationSummary)}
    fields["config"] = "auto mixed precision"
    fields["seconds"] = time.perf_counter() - start_time
    layers = [{"tensor": s.tensor, "kind": s.kind, "layers": s.layers, "numel": s.numel,
               "format": name_of(a), "bits": bits_of(a)} for s, a in zip(trial.sites, assignment)]
    return MixedPrecisionSummary(
        **fields, weight_bits=wb, activation_bits=ab, metric=trial.metric.name,
        target=target, achieved=achieved, met=target is None or achieved >= target,
        assignment={s.tensor: name_of(a) for s, a in zip(trial.sites, assignment)},
        layers=layers, evaluations=trial.evaluations,
        search_seconds=time.perf_counter() - start_time, sensitivity=report)
