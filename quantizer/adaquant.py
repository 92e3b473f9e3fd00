"""Fast finetune (AdaQuant): tune one layer's weight and bias so that, with the weight
quantized by the real kernel, the layer reproduces the float model's output.

The layer is in the linear form of :mod:`.layers` (``Y = A @ M + b`` per group).  Each
iteration quantizes the weight with the kernel, computes the squared error against the float
target on a minibatch of calibration samples, and steps the *float* weight with the gradient
of the quantized one (straight-through estimator) by Adam or SGD.

Few calibration samples overfit (Quark's own AdaQuant lost accuracy on 8 images): part of the
samples is held out, the weights are scored there every few iterations, the best-scoring ones
are kept, training stops early when the held-out error stops improving, and a layer keeps its
new weights only when they beat round-to-nearest on the held-out samples.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping, Optional

import numpy as np

from .layers import Layer, group_matmul

__all__ = ["FastFinetune", "Sample", "LayerFit", "adaquant_layer"]

# Quark's option names and ours.
_QUARK_NAMES = {"DataSize": "data_size", "FixedSeed": "fixed_seed", "BatchSize": "batch_size",
                "NumIterations": "num_iterations", "LearningRate": "learning_rate",
                "OptimAlgorithm": "optim_algorithm", "OptimDevice": "optim_device",
                "InferDevice": "infer_device", "EarlyStop": "early_stop",
                "HoldOut": "hold_out", "Optimizer": "optimizer", "ModelGuard": "model_guard",
                "GuardMetric": "guard_metric", "GuardSignificance": "guard_significance"}

MODEL_GUARDS = ("model", "layers", "off")
GUARD_METRICS = ("argmax", "mse")


@dataclass(frozen=True)
class FastFinetune:
    """Fast finetune options; the defaults are Quark 0.13's for its ``*_ADAQUANT`` configs.

    ``data_size``: calibration samples used (at most); ``fixed_seed``: seed of every random
    choice (same seed, same result); ``batch_size``: samples per iteration;
    ``num_iterations``: iterations per layer; ``learning_rate``: the optimizer's step;
    ``optim_algorithm``: "adaquant" (the only one implemented); ``optim_device`` /
    ``infer_device``: "cpu" (numpy and onnxruntime's CPU provider); ``early_stop``: stop a
    layer once its held-out error has not improved for ``patience`` checks;
    ``hold_out``: fraction of the samples held out to check each layer (at least one sample;
    with a single sample, that fraction of its rows); ``optimizer``: "adam" or "sgd";
    ``max_rows``: rows of the linear form kept per layer (a random subset of the output
    positions: bounds time and memory, the loss stays an unbiased estimate), fewer where
    rows times the layer's K (all groups) would exceed ``max_elements``;
    ``model_guard``: after all layers, the whole quantized model is scored against the float
    model on the held-out samples with and without the finetuned weights, and the finetuned
    ones are kept only when they are not worse ("model"); "layers" then also tries reverting
    each finetuned layer alone and keeps every revert that scores better; "off" keeps every
    layer's own choice; ``guard_metric``: "argmax" (agreement of the outputs' argmax over
    their last axis with float first, relative squared error to break ties) or "mse";
    ``guard_significance``: the model guard also compares the two models unit by unit by
    the metric itself (under "argmax" the output positions whose argmax agrees with float
    in one model and not the other, so a lower error alone does not count; under "mse" the
    held-out samples, by their error) and keeps the finetuned weights only when they are
    better on significantly more units than worse: one-sided exact sign test, p-value at
    most this level (1.0: no test, "not worse" over the set is enough; fewer than 5 units
    that differ never reach 0.05)."""
    data_size: int = 1000
    fixed_seed: int = 1705472343
    batch_size: int = 2
    num_iterations: int = 1000
    learning_rate: float = 1e-5
    optim_algorithm: str = "adaquant"
    optim_device: str = "cpu"
    infer_device: str = "cpu"
    early_stop: bool = True
    hold_out: float = 0.25
    optimizer: str = "adam"
    patience: int = 4
    max_rows: int = 16384
    max_elements: int = 1 << 24
    model_guard: str = "model"
    guard_metric: str = "argmax"
    guard_significance: float = 0.05

    def __post_init__(self) -> None:
        if self.optim_algorithm.lower() != "adaquant":
            raise ValueError(f"optim_algorithm {self.optim_algorithm!r} is not supported; "
                             "use 'adaquant'")
        for dev in (self.optim_device, self.infer_device):
            if str(dev).lower() != "cpu":
                raise ValueError(f"device {dev!r} is not supported: fast finetune runs on "
                                 "the CPU (numpy and onnxruntime's CPU provider)")
        if self.model_guard not in MODEL_GUARDS:
            raise ValueError(f"model_guard must be one of {MODEL_GUARDS}, got "
                             f"{self.model_guard!r}")
        if self.guard_metric not in GUARD_METRICS:
            raise ValueError(f"guard_metric must be one of {GUARD_METRICS}, got "
                             f"{self.guard_metric!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.data_size < 1 or self.batch_size < 1 or self.num_iterations < 0 or \
                self.patience < 1 or self.max_rows < 1 or self.max_elements < 1:
            raise ValueError("data_size, batch_size, patience, max_rows, max_elements must "
                             "be >= 1 and "
                             "num_iterations >= 0")
        if not self.learning_rate > 0:
            raise ValueError("learning_rate must be > 0")
        if not 0 < self.guard_significance <= 1:
            raise ValueError("guard_significance must be in (0, 1]")
        if not 0 < self.hold_out < 1:
            raise ValueError("hold_out must be in (0, 1)")

    @classmethod
    def from_options(cls, options: "FastFinetune | Mapping[str, Any] | bool | None"
                     ) -> Optional["FastFinetune"]:
        """Options from a FastFinetune, a dict (our names or Quark's CamelCase ones), True
        (the defaults) or None / False (off)."""
        if options is None or options is False:
            return None
        if options is True:
            return cls()
        if isinstance(options, cls):
            return options
        if not isinstance(options, Mapping):
            raise TypeError(f"fast_finetune takes a dict, a FastFinetune or True, got "
                            f"{type(options).__name__}")
        valid = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {}
        for key, value in options.items():
            name = _QUARK_NAMES.get(key, key)
            if name not in valid:
                raise ValueError(f"unknown fast_finetune option {key!r}; valid: "
                                 f"{sorted(valid)} (or Quark's {sorted(_QUARK_NAMES)})")
            kw[name] = value
        return cls(**kw)

    def replace(self, **changes: Any) -> "FastFinetune":
        return replace(self, **changes)


@dataclass
class Sample:
    """One calibration sample of one layer in linear form: ``a`` (groups, rows, K) built from
    the quantized model's input, ``y`` (rows, C_out) the float model's output there."""
    a: np.ndarray
    y: np.ndarray


@dataclass
class LayerFit:
    """What fitting did to one layer: the weight to store (its kernel-quantized value is
    what runs), the bias vector (None: unchanged), the mean squared output error on the
    training and held-out samples before (nearest rounding) and after, iterations run, and
    whether the new weights were kept."""
    weight: np.ndarray
    bias: Optional[np.ndarray]
    train_before: float
    train_after: float
    hold_before: float
    hold_after: float
    iterations: int
    kept: bool


def _stack(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray]:
    return (np.concatenate([s.a for s in samples], axis=1),
            np.concatenate([s.y for s in samples], axis=0))


def _loss(layer: Layer, a: np.ndarray, y: np.ndarray, m: np.ndarray,
          b: Optional[np.ndarray]) -> float:
    out, _ = layer.apply_post(layer.linear(a, m, b))
    d = (out - y).astype(np.float64)
    return float(np.mean(d * d)) if d.size else 0.0


class _Gram:
    """The squared error of a layer without ``post`` as a quadratic form: with ``A'`` the
    rows plus a ones column (the bias) and ``M'`` the weight matrix plus the bias row,
    ``sum((A' M' - Y)^2) = tr(M'^T H M') - 2 tr(M'^T G) + sum(Y^2)`` where ``H = A'^T A'``
    and ``G = A'^T Y`` per group.  Each iteration then costs K^2 C whatever the number of
    rows, and uses every training row."""

    def __init__(self, layer: Layer, samples: list[Sample]) -> None:
        g = samples[0].a.shape[0]
        self.h = self.gy = None
        self.yy, self.n = 0.0, 0
        for s in samples:
            rows = s.a.shape[1]
            a = np.concatenate([s.a, np.ones((g, rows, 1), s.a.dtype)], axis=2
                               ).astype(np.float64)
            y = s.y.astype(np.float64).reshape(rows, g, s.y.shape[1] // g).transpose(1, 0, 2)
            h = group_matmul(a.transpose(0, 2, 1), a)
            gy = group_matmul(a.transpose(0, 2, 1), y)
            self.h = h if self.h is None else self.h + h
            self.gy = gy if self.gy is None else self.gy + gy
            self.yy += float(np.sum(y * y))
            self.n += y.size
        # Accumulated in float64; the per-iteration gradient is fine in float32 (2x faster).
        self.h32, self.gy32 = self.h.astype(np.float32), self.gy.astype(np.float32)

    @staticmethod
    def _full(m: np.ndarray, b: Optional[np.ndarray]) -> np.ndarray:
        g, _, co = m.shape
        brow = np.zeros((g, 1, co)) if b is None else np.asarray(b, np.float64).reshape(g, 1, co)
        return np.concatenate([m.astype(np.float64), brow], axis=1)

    def loss(self, m: np.ndarray, b: Optional[np.ndarray]) -> float:
        mf = self._full(m, b)
        hm = group_matmul(self.h, mf)
        sse = float(np.sum(mf * hm) - 2 * np.sum(mf * self.gy) + self.yy)
        return max(sse, 0.0) / max(self.n, 1)

    def grad(self, m: np.ndarray, b: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        mf = self._full(m, b).astype(np.float32)
        d = (group_matmul(self.h32, mf) - self.gy32) * np.float32(2.0 / max(self.n, 1))
        return d[:, :-1, :], d[:, -1, :].reshape(-1)


def adaquant_layer(layer: Layer, w: np.ndarray, bias: Optional[np.ndarray],
                   quantize: Callable[[np.ndarray], np.ndarray], train: list[Sample],
                   hold: list[Sample], opts: FastFinetune,
                   rng: np.random.Generator, train_bias: bool = True) -> LayerFit:
    """Fit ``w`` (the weight tensor, float) and ``bias`` (the layer's bias vector, or None)
    on ``train``, scored on ``hold``; ``quantize`` is the real kernel as the model folds the
    weight.  Targets ``y`` must already have the layer's ``post`` applied.  With
    ``train_bias`` False the bias is part of the layer but stays as it is."""
    w = np.asarray(w, dtype=np.float32)
    if layer.post is None:
        # A linear layer: the quadratic form, full batch (batch_size does not apply).
        g_train, g_hold = _Gram(layer, train), _Gram(layer, hold)
        train_loss, hold_loss = g_train.loss, g_hold.loss
    else:
        a_hold, y_hold = _stack(hold)
        a_all, y_all = _stack(train)
        train_loss = lambda m, b: _loss(layer, a_all, y_all, m, b)  # noqa: E731
        hold_loss = lambda m, b: _loss(layer, a_hold, y_hold, m, b)  # noqa: E731
    wq = quantize(w)
    m0 = layer.weight_matrix(wq)
    hold_before = hold_loss(m0, bias)
    train_before = train_loss(m0, bias)
    best = (hold_before, w, bias, 0)
    cur_w = w.copy()
    cur_b = None if bias is None else bias.astype(np.float32).copy()
    trained = {"w": cur_w, "b": cur_b if train_bias else None}
    state = {"mw": np.zeros_like(cur_w), "vw": np.zeros_like(cur_w),
             "mb": None if cur_b is None else np.zeros_like(cur_b),
             "vb": None if cur_b is None else np.zeros_like(cur_b)}
    lr = np.float32(opts.learning_rate)
    b1, b2, eps = 0.9, 0.999, 1e-8
    n = len(train)
    check_every = max(1, opts.num_iterations // 25)
    stale = 0
    it = 0
    for it in range(1, opts.num_iterations + 1):
        m = layer.weight_matrix(quantize(cur_w))
        if layer.post is None:
            gm, gb = g_train.grad(m, cur_b)
        else:
            pick = rng.choice(n, size=min(opts.batch_size, n), replace=False)
            a_b, y_b = _stack([train[i] for i in pick]) if len(pick) > 1 else \
                (train[pick[0]].a, train[pick[0]].y)
            out, mask = layer.apply_post(layer.linear(a_b, m, cur_b))
            grad = (out - y_b) * np.float32(2.0 / max(out.size, 1))
            if mask is not None:
                grad = grad * mask
            gm, gb = layer.grad_linear(a_b, grad)
        gw = layer.weight_from_matrix(gm)  # straight-through: d Q(w) / d w = 1
        if opts.optimizer == "adam":
            for key, g in (("w", gw), ("b", gb)):
                p = trained[key]
                if p is None:
                    continue
                mom, vel = state["m" + key], state["v" + key]
                mom *= b1
                mom += (1 - b1) * g
                vel *= b2
                vel += (1 - b2) * g * g
                mhat = mom / (1 - b1 ** it)
                vhat = vel / (1 - b2 ** it)
                p -= (lr * mhat / (np.sqrt(vhat) + eps)).astype(np.float32)
        else:
            cur_w -= lr * gw
            if trained["b"] is not None:
                cur_b -= lr * gb.astype(np.float32)
        if it % check_every == 0 or it == opts.num_iterations:
            h = hold_loss(layer.weight_matrix(quantize(cur_w)), cur_b)
            if h < best[0]:
                best = (h, cur_w.copy(), None if cur_b is None else cur_b.copy(), it)
                stale = 0
            else:
                stale += 1
                if opts.early_stop and stale >= opts.patience:
                    break
    hold_after, w_best, b_best, _ = best
    kept = hold_after < hold_before
    if not kept:
        w_best, b_best, hold_after = w, bias, hold_before
    train_after = train_loss(layer.weight_matrix(quantize(w_best)), b_best)
    return LayerFit(weight=w_best, bias=b_best if kept else None, train_before=train_before,
                    train_after=train_after, hold_before=hold_before, hold_after=hold_after,
                    iterations=it, kept=kept)
