"""Error-compensating weight rounding for block formats (GPTQ-style).

The weight is brought into the linear form of :mod:`.layers` (per group a (K, C_out) matrix
``M``; the layer computes ``A @ M``).  Its quantization blocks run along K (the reduction
axis), each block being one output column's run of consecutive K rows.  The rows of ``M``
are visited block by block; at the start of a block its shared exponent is fixed from the
*already-updated* weights, then each row (each sub-block, for microexponent formats) is
rounded by the real kernel with that exponent held fixed, and its rounding error is pushed
onto the rows not yet quantized through the inverse Hessian ``H = A^T A`` of the layer's
calibration inputs (Frantar et al., "GPTQ", 2022, in its Cholesky form).

Holding the exponent fixed uses the kernel itself: the row is quantized as a block together
with an *anchor* element ``2^e`` (``e``: the block's exponent) and, for microexponent formats,
a zero that completes the anchor's sub-block, so the kernel derives exactly the block's
shared scale and the row's sub-block shift.  Values above the block's range are clipped to
its largest exponent first (the kernel saturates them).  Finally each whole block is run
through the kernel until it no longer changes, so that the result is exactly representable:
re-quantizing it returns it unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .config import FormatSpec
from .layers import Layer, group_matmul

__all__ = ["gptq_quantize", "block_ids", "hessian_add", "kernel_rows", "GptqResult"]

Quantize = Callable[[np.ndarray], np.ndarray]


def block_ids(shape: tuple[int, ...], spec: FormatSpec, axis: Optional[int],
              flatten: bool) -> np.ndarray:
    """An int array of ``shape``: the index of the quantization block each weight element
    belongs to (``flatten``: blocks run over each output channel's flattened window)."""
    if spec.op == "BF16":
        return np.arange(int(np.prod(shape))).reshape(shape)
    bs = spec.block_size
    if flatten and len(shape) > 2:
        view = (shape[0], int(np.prod(shape[1:])))
        return block_ids(view, spec, 1, False).reshape(shape)
    if len(shape) <= 1:
        return (np.arange(int(np.prod(shape))) // bs).reshape(shape)
    axis = axis % len(shape)
    length = shape[axis]
    bs = min(bs, length)  # a block longer than the axis is the whole axis
    pos = np.arange(length) // bs
    nb = -(-length // bs)
    others = [d for i, d in enumerate(shape) if i != axis]
    other_idx = np.arange(int(np.prod(others))).reshape(others)
    ids = np.expand_dims(other_idx, axis) * nb + pos.reshape(
        [length if i == axis else 1 for i in range(len(shape))])
    return ids


def _chunks(layer: Layer, ids: np.ndarray) -> Optional[list[np.ndarray]]:
    """The runs of K rows that form whole blocks, in visiting order, the same in every group
    and for every output column; None where the blocks do not run along K (a weight blocked
    along its output axis), which GPTQ cannot use."""
    m = layer.weight_matrix(ids)  # (g, K, co)
    chunks: list[np.ndarray] = []
    g, k, co = m.shape
    seen = np.zeros(k, dtype=bool)
    for r in range(k):
        if seen[r]:
            continue
        rows = np.nonzero(m[0, :, 0] == m[0, r, 0])[0]
        seen[rows] = True
        chunks.append(rows)
    # Every block must be exactly one (group, column) x chunk.
    for rows in chunks:
        sub = m[:, rows, :]
        if not (sub == sub[:, :1, :]).all():
            return None
        firsts = sub[:, 0, :].ravel()
        if len(np.unique(firsts)) != firsts.size:
            return None
    return chunks


def hessian_add(h: Optional[np.ndarray], a: np.ndarray) -> np.ndarray:
    """``h + A^T A`` per group in float64 (``h`` None: start from zero); ``a`` is (g, rows, K)."""
    g, _, k = a.shape
    if g > 1 and k <= 32:
        # Depthwise-like: many tiny products; one vectorised dot per pair of K columns.
        # One transposing copy, not k strided ones (same values: float32 -> float64 is exact).
        cols = np.ascontiguousarray(a.transpose(2, 0, 1), dtype=np.float64)
        upd = np.empty((g, k, k))
        for i in range(k):
            for j in range(i, k):
                upd[:, i, j] = upd[:, j, i] = np.einsum("gr,gr->g", cols[i], cols[j])
    else:
        a64 = a.astype(np.float64)
        upd = group_matmul(a64.transpose(0, 2, 1), a64)
    return upd if h is None else h + upd


@dataclass
class GptqResult:
    weight: np.ndarray         # exactly representable in the format, the weight's shape
    fallback: str = ""         # why nearest rounding was used instead, if it was


def _anchored(spec: FormatSpec, quantize_rows: Callable[[np.ndarray, int], np.ndarray],
              rows: np.ndarray, exp_anchor: np.ndarray) -> np.ndarray:
    """Quantize ``rows`` (n, m) as part of blocks whose largest magnitude is ``exp_anchor``
    (n,) (a power of two, or 0), by the kernel with an anchor sub-block in front."""
    if spec.op == "BF16":
        return quantize_rows(rows, 1)
    gran = _granule(spec)
    n, m = rows.shape
    lim = (exp_anchor * np.float32(2.0 - 2.0 ** -23)).astype(np.float32)[:, None]
    clipped = np.clip(rows, -lim, lim).astype(np.float32)
    block = np.zeros((n, gran + m), dtype=np.float32)
    block[:, 0] = exp_anchor
    block[:, gran:] = clipped
    return quantize_rows(block, gran + m)[:, gran:]


def kernel_rows(spec: FormatSpec) -> Callable[[np.ndarray, int], np.ndarray]:
    """``f(x, block_size)``: the real kernel of ``spec`` on a 2-D float32 array blocked along
    axis 1 with ``block_size`` elements per block (BF16: elementwise rounding)."""
    from .quantize import fold_weight, _native
    if spec.op == "BF16":
        return lambda x, bs: fold_weight(x, spec, None)
    native = _native()
    fn = native.bfp_quantize_dequantize if spec.op == "BFP" else native.mx_quantize_dequantize
    base = spec.node_attrs(1)
    gran = _granule(spec)

    def run(x: np.ndarray, bs: int) -> np.ndarray:
        bs = -(-int(bs) // gran) * gran  # a short block is padded to whole sub-blocks
        return np.asarray(fn(np.ascontiguousarray(x, dtype=np.float32),
                             **{**base, "block_size": bs}))
    return run


def _granule(spec: FormatSpec) -> int:
    """Elements that share a sub-block shift (microexponent formats), else 1."""
    a = spec.full_attrs()
    if spec.op == "BFP" and a["bfp_method"] != "to_bfp":
        return int(a["sub_block_size"])
    return 1


def _pow2_floor(x: np.ndarray) -> np.ndarray:
    """Largest power of two <= x (0 for 0), elementwise, float32."""
    mant, exp = np.frexp(x.astype(np.float32))
    return np.where(x > 0, np.ldexp(np.float32(0.5), exp), 0.0).astype(np.float32)


def gptq_quantize(layer: Layer, w: np.ndarray, h: np.ndarray, spec: FormatSpec,
                  axis: Optional[int], flatten: bool, quantize: Quantize,
                  quantize_rows: Callable[[np.ndarray, int], np.ndarray],
                  damp: float = 0.01) -> GptqResult:
    """GPTQ-round weight ``w`` of ``layer`` given the per-group Hessian ``h`` (g, K, K).

    ``quantize(w)`` is the real kernel on the whole weight as the model folds it (used for
    the fallback and the final check); ``quantize_rows(x, block_size)`` runs the kernel on a
    2-D float32 array blocked along axis 1 with the spec's attributes and ``block_size``.
    ``damp`` adds that fraction of the mean Hessian diagonal (numerical safety)."""
    w = np.asarray(w, dtype=np.float32)
    ids = block_ids(w.shape, spec, axis, flatten)
    chunks = _chunks(layer, ids)
    if chunks is None:
        return GptqResult(quantize(w), "blocks do not run along the reduction axis")
    gran = _granule(spec)
    order = np.concatenate(chunks)
    m = layer.weight_matrix(w).astype(np.float64)[:, order, :]   # (g, K, co)
    hp = h[:, order][:, :, order].copy()
    g, k, co = m.shape
    diag = np.einsum("gii->gi", hp)
    dead = diag <= 0
    for gi in range(g):
        hp[gi][dead[gi], dead[gi]] = 1.0
    mean_diag = np.maximum(np.einsum("gii->gi", hp).mean(axis=1), 1e-12)
    hp += damp * mean_diag[:, None, None] * np.eye(k)[None]
    try:
        hinv = np.linalg.inv(hp)
        u = np.linalg.cholesky(hinv).transpose(0, 2, 1)   # upper: H^-1 = U^T U
    except np.linalg.LinAlgError:
        return GptqResult(quantize(w), "the Hessian is not positive definite")
    q = np.zeros_like(m)
    start = 0
    for rows in chunks:
        stop = start + len(rows)
        # Shared exponent of each (group, column) block from the updated weights.
        block = m[:, start:stop, :]
        anchor = _pow2_floor(np.abs(block).max(axis=1).astype(np.float32)).reshape(-1)
        err = np.zeros((g, stop - start, co))
        for j in range(start, stop, gran):
            je = min(j + gran, stop)
            cur = m[:, j:je, :]                                       # (g, s, co)
            flat = cur.transpose(0, 2, 1).reshape(g * co, je - j).astype(np.float32)
            qj = _anchored(spec, quantize_rows, flat, anchor).reshape(g, co, je - j)
            qj = qj.transpose(0, 2, 1).astype(np.float64)
            q[:, j:je, :] = qj
            # Push each row's error on to the later rows of the block, one row at a time.
            for r in range(j, je):
                e = (m[:, r, :] - q[:, r, :]) / u[:, r, r][:, None]
                err[:, r - start, :] = e
                # Rows of one sub-block are rounded together; the later ones keep their
                # rounding and only their error is recomputed from the updated values.
                m[:, r + 1:stop, :] -= u[:, r, r + 1:stop][:, :, None] * e[:, None, :]
        # The rest of the matrix gets the block's errors at once (lazy batch update).
        m[:, stop:, :] -= np.matmul(u[:, start:stop, stop:].transpose(0, 2, 1), err)
        # Make the block a fixed point of the kernel (its exponent may have dropped).
        qb = q[:, start:stop, :].transpose(0, 2, 1).reshape(g * co, stop - start)
        qb = qb.astype(np.float32)
        for _ in range(4):
            nxt = quantize_rows(qb, stop - start)
            if np.array_equal(nxt, qb):
                break
            qb = nxt
        q[:, start:stop, :] = qb.reshape(g, co, stop - start).transpose(0, 2, 1)
        start = stop
    inv = np.empty_like(order)
    inv[order] = np.arange(k)
    out = layer.weight_from_matrix(q[:, inv, :].astype(np.float32))
    final = quantize(out)
    if not np.array_equal(final, out):
        return GptqResult(final, "result was not a fixed point of the kernel")
    return GptqResult(out)
