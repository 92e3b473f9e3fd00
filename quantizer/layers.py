"""Numpy forward passes and weight/bias gradients of the layers the accuracy algorithms tune.

Every supported layer (Conv, ConvTranspose, Gemm, MatMul with a constant weight) is brought
into one *linear form*: per group ``g``, ``Y[:, g] = A[g] @ M[g] + b[g]`` where ``A`` holds
the input as rows (im2col for convolutions: one row per output pixel, one column per
(input channel, kernel offset)) and ``M`` is the weight as a (K, C_out / groups) matrix.
AdaQuant, GPTQ and bias correction work on that form: the gradient w.r.t. ``M`` is
``A^T dY`` and the Hessian of the layer's squared output error is ``A^T A``.

A ConvTranspose is a Conv over its input with ``stride - 1`` zeros inserted between pixels,
padded by ``dilation * (k - 1) - pad`` and run with the kernel flipped and its two channel
axes swapped; that is how it is brought into the same form.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

__all__ = ["Layer", "LINEAR_OPS", "group_matmul"]

LINEAR_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def group_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a[g] @ b[g]`` for every group g.  One group: BLAS (np.dot handles transposed views);
    several (grouped and depthwise convolutions, small matrices): one einsum loop, because
    numpy's batched matmul skips BLAS for transposed operands and a threaded BLAS spends
    more time waking its threads than computing such small products."""
    if a.shape[0] == 1:
        return np.dot(a[0], b[0])[None]
    return np.einsum("gij,gjk->gik", a, b)


def _ints(v: Optional[Sequence[int]], n: int, default: int) -> tuple[int, ...]:
    return tuple(int(a) for a in v) if v is not None and len(v) else (default,) * n


@dataclass
class Layer:
    """One layer with a constant weight: ``op`` (one of :data:`LINEAR_OPS`), its ONNX
    attributes, and the weight's shape.  ``post`` is an elementwise op applied to the output
    that the fit should see through ("Relu", or ("Clip", lo, hi)); None for none."""
    op: str
    weight_shape: tuple[int, ...]
    attrs: dict = field(default_factory=dict)
    post: Optional[object] = None

    def __post_init__(self) -> None:
        if self.op not in LINEAR_OPS:
            raise ValueError(f"unsupported layer {self.op!r}; supported: {LINEAR_OPS}")
        self.weight_shape = tuple(int(d) for d in self.weight_shape)
        if self.op in ("Conv", "ConvTranspose"):
            nsp = len(self.weight_shape) - 2
            if nsp < 1:
                raise ValueError(f"{self.op} weight must have rank >= 3, got {self.weight_shape}")
            a = self.attrs
            self.group = int(a.get("group", 1))
            self.kernel = self.weight_shape[2:]
            self.strides = _ints(a.get("strides"), nsp, 1)
            self.dilations = _ints(a.get("dilations"), nsp, 1)
            self.output_padding = _ints(a.get("output_padding"), nsp, 0)
            if a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", "VALID", b"VALID"):
                raise ValueError(f"{self.op} with auto_pad={a['auto_pad']!r} is not supported")
            if a.get("output_shape") is not None:
                raise ValueError("ConvTranspose with output_shape is not supported")
            pads = _ints(a.get("pads"), 2 * nsp, 0)
            self.pads_begin, self.pads_end = pads[:nsp], pads[nsp:]
        elif self.op == "Gemm":
            self.trans_a = int(self.attrs.get("transA", 0))
            self.trans_b = int(self.attrs.get("transB", 0))
            self.alpha = float(self.attrs.get("alpha", 1.0))
            self.beta = float(self.attrs.get("beta", 1.0))
            if len(self.weight_shape) != 2:
                raise ValueError(f"Gemm weight must be 2-D, got {self.weight_shape}")
        elif len(self.weight_shape) != 2:
            raise ValueError(f"MatMul weight must be 2-D here, got {self.weight_shape}")

    # -- sizes ---------------------------------------------------------------------------
    @property
    def groups(self) -> int:
        return self.group if self.op in ("Conv", "ConvTranspose") else 1

    @property
    def out_channels(self) -> int:
        w = self.weight_shape
        if self.op == "Conv":
            return w[0]
        if self.op == "ConvTranspose":
            return w[1] * self.group
        if self.op == "Gemm":
            return w[0] if self.trans_b else w[1]
        return w[1]

    # -- weight <-> matrix ----------------------------------------------------------------
    def weight_matrix(self, w: np.ndarray) -> np.ndarray:
        """The weight as (groups, K, C_out / groups); K indexes (input channel, kernel
        offset) for convolutions, the contracted axis otherwise."""
        g = self.groups
        if self.op == "Conv":
            co = w.shape[0]
            return w.reshape(g, co // g, -1).transpose(0, 2, 1)
        if self.op == "ConvTranspose":
            ci, cog = w.shape[0], w.shape[1]
            flipped = w[(slice(None), slice(None)) + (slice(None, None, -1),) * len(self.kernel)]
            # (g, ci/g, co/g, k...) -> (g, co/g, ci/g, k...) -> rows (ci/g * k), cols co/g
            m = flipped.reshape((g, ci // g, cog) + self.kernel).swapaxes(1, 2)
            return m.reshape(g, cog, -1).transpose(0, 2, 1)
        if self.op == "Gemm" and self.trans_b:
            return w.T[None]
        return w[None]

    def weight_from_matrix(self, m: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`weight_matrix` (and its adjoint: it only moves elements)."""
        g = self.groups
        if self.op == "Conv":
            return m.transpose(0, 2, 1).reshape(self.weight_shape)
        if self.op == "ConvTranspose":
            ci, cog = self.weight_shape[0], self.weight_shape[1]
            t = m.transpose(0, 2, 1).reshape((g, cog, ci // g) + self.kernel).swapaxes(1, 2)
            t = t.reshape(self.weight_shape)
            return t[(slice(None), slice(None)) + (slice(None, None, -1),) * len(self.kernel)]
        if self.op == "Gemm" and self.trans_b:
            return m[0].T
        return m[0]

    def k_index(self) -> np.ndarray:
        """For each (group, K row) of :meth:`weight_matrix`, the flat index of one element
        of the weight tensor in that row (the first output column): lets callers map weight
        layout (e.g. quantization blocks) onto K."""
        idx = np.arange(int(np.prod(self.weight_shape))).reshape(self.weight_shape)
        return self.weight_matrix(idx)[:, :, 0]

    # -- input -> rows ---------------------------------------------------------------------
    def _conv_geometry(self, x: np.ndarray):
        """Padded (and, for ConvTranspose, zero-inserted) input, kernel, strides, dilations
        of the equivalent Conv."""
        nsp = len(self.kernel)
        if self.op == "Conv":
            pads = [(0, 0), (0, 0)] + list(zip(self.pads_begin, self.pads_end))
            return np.pad(x, pads), self.strides
        # ConvTranspose: insert stride-1 zeros, pad by d*(k-1)-p (+ output_padding at end).
        n, c = x.shape[:2]
        sp = x.shape[2:]
        up_shape = tuple((s - 1) * st + 1 for s, st in zip(sp, self.strides))
        up = np.zeros((n, c) + up_shape, dtype=x.dtype)
        up[(slice(None), slice(None)) + tuple(slice(None, None, st) for st in self.strides)] = x
        pads = [(0, 0), (0, 0)]
        for i in range(nsp):
            full = self.dilations[i] * (self.kernel[i] - 1)
            lo, hi = full - self.pads_begin[i], full - self.pads_end[i] + self.output_padding[i]
            pads.append((lo, hi))
        neg = [(max(-lo, 0), max(-hi, 0)) for lo, hi in pads]
        up = np.pad(up, [(max(lo, 0), max(hi, 0)) for lo, hi in pads])
        if any(a or b for a, b in neg):  # pads larger than the kernel reach: crop instead
            up = up[tuple(slice(a, up.shape[i] - b) for i, (a, b) in enumerate(neg))]
        return up, (1,) * nsp

    def rows(self, x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
        """``A``: the input as (groups, rows, K) float32, and the output's shape."""
        x = np.asarray(x, dtype=np.float32)
        if self.op in ("Conv", "ConvTranspose"):
            return self._im2col(x)
        if self.op == "Gemm":
            a = (x.T if self.trans_a else x) * np.float32(self.alpha)
            return a[None], (a.shape[0], self.out_channels)
        lead = x.shape[:-1]
        return x.reshape(1, -1, x.shape[-1]), lead + (self.out_channels,)

    def _im2col(self, x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
        xp, strides = self._conv_geometry(x)
        n, c = xp.shape[:2]
        g = self.group
        nsp = len(self.kernel)
        out_sp = tuple((xp.shape[2 + i] - self.dilations[i] * (self.kernel[i] - 1) - 1)
                       // strides[i] + 1 for i in range(nsp))
        if any(o < 1 for o in out_sp):
            raise ValueError(f"{self.op}: output would be empty for input {x.shape}")
        patches = []
        for off in np.ndindex(*self.kernel):
            sl = tuple(slice(o * d, o * d + (os - 1) * s + 1, s) for o, d, os, s in
                       zip(off, self.dilations, out_sp, strides))
            patches.append(xp[(slice(None), slice(None)) + sl])
        # (kk, n, c, out...) -> (g, n, out..., c/g, kk)
        p = np.stack(patches, axis=0).reshape((len(patches), n, g, c // g) + out_sp)
        order = (2, 1) + tuple(range(4, 4 + nsp)) + (3, 0)
        a = np.ascontiguousarray(p.transpose(order)).reshape(g, -1, (c // g) * len(patches))
        return a, (n, self.out_channels) + out_sp

    # -- rows -> output ----------------------------------------------------------------------
    def to_output(self, y_rows: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
        """(rows, C_out) -> the layer's output layout."""
        if self.op in ("Conv", "ConvTranspose"):
            n = out_shape[0]
            nd = len(out_shape)
            return y_rows.reshape((n,) + out_shape[2:] + (out_shape[1],)).transpose(
                (0, nd - 1) + tuple(range(1, nd - 1)))
        return y_rows.reshape(out_shape)

    def from_output(self, y: np.ndarray) -> np.ndarray:
        """The layer's output (or a gradient of that shape) as (rows, C_out)."""
        if self.op in ("Conv", "ConvTranspose"):
            nd = y.ndim
            return y.transpose((0,) + tuple(range(2, nd)) + (1,)).reshape(-1, y.shape[1])
        return y.reshape(-1, y.shape[-1])

    def bias_vector(self, b: Optional[np.ndarray]) -> Optional[np.ndarray]:
        """The bias as a length-C_out vector the rows add (Gemm's beta applied); None where
        the layer has none or its C broadcasts other than along the output channels."""
        if b is None:
            return None
        b = np.asarray(b, dtype=np.float32)
        if self.op == "Gemm":
            if b.size == 1:
                return None
            if b.shape not in ((self.out_channels,), (1, self.out_channels)):
                return None
            return b.reshape(-1) * np.float32(self.beta)
        return b.reshape(-1) if b.size == self.out_channels else None

    def bias_from_vector(self, v: np.ndarray, like: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`bias_vector` in ``like``'s shape and dtype."""
        if self.op == "Gemm":
            v = v / np.float32(self.beta)
        return v.reshape(np.shape(like)).astype(np.asarray(like).dtype)

    # -- linear form -------------------------------------------------------------------------
    def linear(self, a: np.ndarray, m: np.ndarray, bvec: Optional[np.ndarray]) -> np.ndarray:
        """(rows, C_out) = per group A[g] @ M[g], plus the bias vector."""
        y = group_matmul(a, m)  # (g, rows, co/g)
        y = y.transpose(1, 0, 2).reshape(a.shape[1], y.shape[0] * y.shape[2])  # 0 rows too
        return y + bvec if bvec is not None else y

    def apply_post(self, y: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """``post`` applied to ``y``, and the mask where its derivative is 1 (None: all)."""
        if self.post is None:
            return y, None
        lo, hi = (0.0, np.inf) if self.post == "Relu" else self.post[1:]
        mask = (y > lo) & (y < hi)
        return np.clip(y, lo, hi), mask

    def grad_linear(self, a: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gradients w.r.t. M and the bias vector of a loss whose gradient w.r.t. the
        (rows, C_out) output is ``dy``."""
        g = a.shape[0]
        dyg = dy.reshape(dy.shape[0], g, -1).transpose(1, 0, 2)
        return group_matmul(a.transpose(0, 2, 1), dyg), dy.sum(axis=0)

    # -- whole-tensor conveniences (tests, callers without the linear form) -------------------
    def forward(self, x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray] = None) -> np.ndarray:
        """The layer's output for input ``x`` (``post`` not applied)."""
        a, shape = self.rows(x)
        y = self.linear(a, self.weight_matrix(np.asarray(w, np.float32)), self.bias_vector(b))
        if self.op == "Gemm" and b is not None and self.bias_vector(b) is None:
            y = y + np.float32(self.beta) * np.asarray(b, np.float32)
        return self.to_output(y, shape)

    def gradients(self, x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray],
                  dy: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """dL/dw (weight's shape) and dL/db (bias's shape, None without a bias) given
        dL/dy = ``dy`` of the output's shape."""
        a, _ = self.rows(x)
        gm, gb = self.grad_linear(a, self.from_output(np.asarray(dy, np.float32)))
        gw = self.weight_from_matrix(gm)
        if b is None or self.bias_vector(b) is None:
            return gw, None
        if self.op == "Gemm":
            gb = gb * np.float32(self.beta)
        return gw, gb.reshape(np.shape(b))
