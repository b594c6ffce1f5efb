"""CTC loss: the alpha (forward) and beta (backward) recursions of Graves et al. (2006).

Follows PyTorch's CPU kernel (aten/src/ATen/native/LossCTC.cpp) step for step,
vectorized over the batch and the extended-label axis. ``log_probs`` is
(T, N, C); the extended labels l' = (blank, l1, blank, l2, ..., blank) are
(N, L) with L = 2 * max(target_lengths) + 1. Each recursion is one
``stablehlo.while`` over time (never unrolled); per-sample lengths become
masks, so a sample's alpha freezes at its own input length and extended
labels past its own target length hold -inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .builder import Builder, Value
from .indexing import take_rows
from .reductions import _scan, reduce_max, reduce_sum
from .registry import LoweringContext, register, register_host_kernel

aten = torch.ops.aten

Step = Callable[[Builder, Value, list[Value], list[Value]], list[Value]]


# -- small pieces ---------------------------------------------------------------
def _neg_inf(b: Builder, dtype: torch.dtype, shape: Sequence[int]) -> Value:
    return b.constant(-math.inf, dtype, shape)


def _lengths(b: Builder, lengths: Value | Sequence[int]) -> Value:
    """int[] (static, the .default overloads) or an integer tensor (.Tensor overloads) as int64 (N,)."""
    if isinstance(lengths, Value):
        return b.reshape(b.convert(lengths, torch.int64), (lengths.numel,))
    return b.dense_constant(np.asarray(list(lengths), dtype=np.int64).reshape(-1), torch.int64)


def _logsumexp(b: Builder, xs: Sequence[Value]) -> Value:
    """log(sum exp(x)) exactly as the CPU kernel writes it: the max is 0 when all are -inf (no -inf - -inf)."""
    m = xs[0]
    for x in xs[1:]:
        m = b.maximum(m, x)
    m = b.select(b.compare(m, _neg_inf(b, m.dtype, m.shape), "EQ"), b.constant(0.0, m.dtype, m.shape), m)
    total = b.unary("exponential", b.sub(xs[0], m))
    for x in xs[1:]:
        total = b.add(total, b.unary("exponential", b.sub(x, m)))
    return b.add(b.unary("log", total), m)


def _shift(b: Builder, v: Value, k: int) -> Value:
    """v[:, s - k] along the label axis (k < 0 looks ahead), -inf where that falls off the edge."""
    n, l = v.shape
    fill = _neg_inf(b, v.dtype, ())
    if k > 0:
        return b.slice(b.pad(v, fill, [0, k], [0, 0]), [0, 0], [n, l])
    return b.slice(b.pad(v, fill, [0, 0], [0, -k]), [0, -k], [n, l - k])


def _broadcast_rows(b: Builder, v: Value, shape: Sequence[int], dim: int) -> Value:
    """A per-sample (N,) vector broadcast along ``shape`` with the batch at ``dim``."""
    return b.broadcast_in_dim(v, shape, [dim])


# -- extended labels ------------------------------------------------------------
def _target_labels(b: Builder, targets: Value, target_lengths: Value, n: int, smax: int) -> Value:
    """(N, smax) int64: sample n's k-th target label (arbitrary but in range past its own length)."""
    tg = b.convert(targets, torch.int64)
    if targets.rank == 2:
        width = min(smax, targets.shape[1])
        lab = b.slice(tg, [0, 0], [n, width])
        if width < smax:
            lab = b.pad(lab, b.constant(0, torch.int64), [0, 0], [0, smax - width])
        return lab
    # 1-D: the samples' targets concatenated; sample n starts at sum(target_lengths[:n])
    total = targets.shape[0]
    if total == 0:
        return b.constant(0, torch.int64, (n, smax))
    offsets = b.sub(_scan(b, target_lengths, 0, "stablehlo.add", 0), target_lengths)
    pos = b.add(_broadcast_rows(b, offsets, (n, smax), 0), b.iota((n, smax), 1, torch.int64))
    pos = b.clamp(b.constant(0, torch.int64, (n, smax)), pos, b.constant(total - 1, torch.int64, (n, smax)))
    return take_rows(b, tg, pos, 0)


def _extended_labels(b: Builder, targets: Value, target_lengths: Value, n: int, length: int, blank: int) -> Value:
    """(N, L) int64 l': blank at even s, target label (s - 1) / 2 at odd s."""
    smax = (length - 1) // 2
    if smax == 0:
        return b.constant(blank, torch.int64, (n, 1))
    blanks = b.constant(blank, torch.int64, (n, smax, 1))
    lab = b.reshape(_target_labels(b, targets, target_lengths, n, smax), (n, smax, 1))
    pairs = b.reshape(b.concatenate([blanks, lab], 2), (n, 2 * smax))
    return b.pad(pairs, b.constant(blank, torch.int64), [0, 0], [0, 1])


def _label_log_probs(b: Builder, lp: Value, ext: Value, valid: Value) -> Value:
    """(T, N, L): log_probs[t, n, l'(n, s)], -inf past each sample's own 2 * target_length."""
    t, n, _ = lp.shape
    l = ext.shape[1]
    idx = b.concatenate([b.reshape(b.iota((n, l), 0, torch.int64), (n, l, 1)), b.reshape(ext, (n, l, 1))], 2)
    # T rides along as the gather's window dimension, placed first
    attrs = ("dimension_numbers = #stablehlo.gather<offset_dims = [0], collapsed_slice_dims = [1, 2], "
             "start_index_map = [1, 2], index_vector_dim = 2>, "
             f"slice_sizes = array<i64: {t}, 1, 1>, indices_are_sorted = false")
    picked = b.op1("stablehlo.gather", [lp, idx], (t, n, l), lp.dtype, attrs=attrs)
    mask = b.broadcast_in_dim(valid, (t, n, l), [1, 2])
    return b.select(mask, picked, _neg_inf(b, lp.dtype, (t, n, l)))


def _shift_int(b: Builder, v: Value, k: int) -> Value:
    """v[:, s - k] for integer v, -1 where that falls off the edge."""
    n, l = v.shape
    return b.slice(b.pad(v, b.constant(-1, v.dtype), [0, k], [0, 0]), [0, 0], [n, l])


def _label_masks(b: Builder, ext: Value, target_lengths: Value) -> tuple[Value, Value]:
    """(valid, skip): s <= 2 * target_length, and whether s may be reached from s - 2 (l'(s) != l'(s - 2))."""
    n, l = ext.shape
    s = b.iota((n, l), 1, torch.int64)
    two_len = b.add(target_lengths, target_lengths)
    valid = b.compare(s, _broadcast_rows(b, two_len, (n, l), 0), "LE")
    prev2 = _shift_int(b, ext, 2)
    skip = b.binary("and", b.compare(s, b.constant(2, torch.int64, (n, l)), "GE"), b.compare(ext, prev2, "NE"))
    return valid, skip


# -- the time loop --------------------------------------------------------------
def _time_loop(b: Builder, steps: int, consts: list[Value], state: list[Value], step: Step) -> list[Value]:
    """``state = step(bb, i, consts, state)`` for i = 0 .. steps - 1 as one stablehlo.while.

    ``consts`` ride along unchanged: the loop regions only see their own arguments.
    """
    nc = len(consts)
    types = [((), torch.int64)] + [(v.shape, v.dtype) for v in (*consts, *state)]

    def cond(bb: Builder, i: Value, *rest: Value) -> Value:
        return bb.compare(i, bb.constant(steps, torch.int64), "LT")

    def body(bb: Builder, i: Value, *rest: Value) -> list[Value]:
        new = step(bb, i, list(rest[:nc]), list(rest[nc:]))
        return [bb.add(i, bb.constant(1, torch.int64)), *rest[:nc], *new]

    regions = b.region(types, cond) + ", " + b.region(types, body)
    outs = b.op("stablehlo.while", [b.constant(0, torch.int64), *consts, *state], types, region=regions)
    return outs[1 + nc:]


def _row(bb: Builder, x: Value, t: Value, batch_first: bool) -> Value:
    """Time step ``t`` of a (T, N, K) or (N, T, K) array as (N, K)."""
    zero = bb.constant(0, torch.int64)
    if batch_first:
        n, _, k = x.shape
        return bb.reshape(bb.dynamic_slice(x, [zero, t, zero], [n, 1, k]), (n, k))
    _, n, k = x.shape
    return bb.reshape(bb.dynamic_slice(x, [t, zero, zero], [1, n, k]), (n, k))


def _active(bb: Builder, t: Value, in_len: Value, shape: Sequence[int]) -> Value:
    """(N, K) mask: t < input_length[n]."""
    n = in_len.shape[0]
    return _broadcast_rows(bb, bb.compare(bb.broadcast_in_dim(t, (n,), []), in_len, "LT"), shape, 0)


def _alpha_step(bb: Builder, t: Value, consts: list[Value], state: list[Value]) -> list[Value]:
    """alpha_t(s) = lse(alpha_{t-1}(s), alpha_{t-1}(s-1), alpha_{t-1}(s-2) if skip) + lp(t, l'(s))."""
    lp_ext, skip, in_len = consts
    prev, log_alpha = state
    shape = prev.shape
    neg = _neg_inf(bb, prev.dtype, shape)
    new = bb.add(_logsumexp(bb, [prev, _shift(bb, prev, 1), bb.select(skip, _shift(bb, prev, 2), neg)]),
                 _row(bb, lp_ext, t, batch_first=False))
    active = _active(bb, t, in_len, shape)
    row = bb.reshape(bb.select(active, new, neg), (shape[0], 1, shape[1]))
    zero = bb.constant(0, torch.int64)
    log_alpha = bb.dynamic_update_slice(log_alpha, row, [zero, t, zero])
    return [bb.select(active, new, prev), log_alpha]


def _alpha(b: Builder, lp_ext: Value, skip: Value, in_len: Value) -> tuple[Value, Value]:
    """(log_alpha (N, T, L), alpha at each sample's last input step (N, L)).

    The loop starts from a virtual alpha_{-1} that is 0 at s = 0 and -inf elsewhere, which
    makes step 0 produce the CPU's initial row (lp(0, blank), lp(0, l1), -inf, ...). A sample
    with input_length 0 keeps that virtual row, whose readout gives the CPU's 0 / inf loss.
    """
    t, n, l = lp_ext.shape
    s = b.iota((n, l), 1, torch.int64)
    start = b.select(b.compare(s, b.constant(0, torch.int64, (n, l)), "EQ"), b.constant(0.0, lp_ext.dtype, (n, l)),
                     _neg_inf(b, lp_ext.dtype, (n, l)))
    buf = _neg_inf(b, lp_ext.dtype, (n, t, l))
    last, log_alpha = _time_loop(b, t, [lp_ext, skip, in_len], [start, buf], _alpha_step)
    return log_alpha, last


def _pick(b: Builder, v: Value, s_index: Value) -> Value:
    """v[n, s_index[n]] for (N, L) v; -inf where s_index is out of range."""
    n, l = v.shape
    hit = b.compare(b.iota((n, l), 1, torch.int64), _broadcast_rows(b, s_index, (n, l), 0), "EQ")
    return reduce_max(b, b.select(hit, v, _neg_inf(b, v.dtype, (n, l))), [1])


def _nll(b: Builder, last: Value, target_lengths: Value) -> Value:
    """-log p(l | x) = -lse(alpha_{T-1}(2S), alpha_{T-1}(2S - 1)); the second is -inf when S = 0."""
    two_len = b.add(target_lengths, target_lengths)
    end = _pick(b, last, two_len)
    before = _pick(b, last, b.sub(two_len, b.constant(1, torch.int64, two_len.shape)))
    return b.neg(_logsumexp(b, [end, before]))


# -- lowerings ------------------------------------------------------------------
def _prepare(b: Builder, lp: Value, targets: Value, target_lengths: Any, length: int, blank: int
             ) -> tuple[Value, Value, Value, Value, Value]:
    """(target_lengths, extended labels, valid mask, skip mask, label log-probs) shared by both directions."""
    n = lp.shape[1]
    tl = _lengths(b, target_lengths)
    ext = _extended_labels(b, targets, tl, n, length, blank)
    valid, skip = _label_masks(b, ext, tl)
    return tl, ext, valid, skip, _label_log_probs(b, lp, ext, valid)


@register(aten._ctc_loss)
def _ctc_loss(ctx: LoweringContext, log_probs: Value, targets: Value, input_lengths: Any, target_lengths: Any,
              blank: int = 0, zero_infinity: bool = False) -> tuple[Value, Value]:
    # zero_infinity only matters to the backward (F.ctc_loss zeroes inf losses itself)
    b = ctx.b
    length = ctx.out_shape(1)[2]
    tl, _, _, skip, lp_ext = _prepare(b, log_probs, targets, target_lengths, length, blank)
    log_alpha, last = _alpha(b, lp_ext, skip, _lengths(b, input_lengths))
    return b.convert(_nll(b, last, tl), ctx.out_dtype(0)), b.convert(log_alpha, ctx.out_dtype(1))


def _beta_step(bb: Builder, i: Value, consts: list[Value], state: list[Value]) -> list[Value]:
    """One step of the beta recursion at t = T - 1 - i, collecting alpha + beta per class.

    beta_t(s) = lse(beta_{t+1}(s), beta_{t+1}(s+1), beta_{t+1}(s+2) if skip(s+2)) + lp(t, l'(s));
    collected[t, n, c] = lse over s with l'(s) = c of alpha_t(s) + beta_t(s).
    """
    lp_ext, skip_ahead, in_len, valid, onehot, log_alpha = consts
    nxt, collected = state
    shape = nxt.shape
    t = bb.sub(bb.constant(lp_ext.shape[0] - 1, torch.int64), i)
    neg = _neg_inf(bb, nxt.dtype, shape)
    new = bb.add(_logsumexp(bb, [nxt, _shift(bb, nxt, -1), bb.select(skip_ahead, _shift(bb, nxt, -2), neg)]),
                 _row(bb, lp_ext, t, batch_first=False))
    active = _active(bb, t, in_len, shape)
    beta = bb.select(active, new, neg)
    # read alpha only where the CPU kernel does: its other entries may be uninitialized
    alpha = bb.select(bb.binary("and", active, valid), _row(bb, log_alpha, t, batch_first=True), neg)
    per_class = _collect_by_label(bb, bb.add(alpha, beta), onehot)
    zero = bb.constant(0, torch.int64)
    collected = bb.dynamic_update_slice(collected, bb.reshape(per_class, (1, *per_class.shape)), [t, zero, zero])
    return [bb.select(active, new, nxt), collected]


def _collect_by_label(b: Builder, ab: Value, onehot: Value) -> Value:
    """(N, C): logsumexp of ab (N, L) over the s whose label is c (-inf for labels not in l')."""
    n, l, c = onehot.shape
    neg = _neg_inf(b, ab.dtype, (n, l, c))
    sel = b.select(onehot, b.broadcast_in_dim(ab, (n, l, c), [0, 1]), neg)
    m = reduce_max(b, sel, [1])
    m = b.select(b.compare(m, _neg_inf(b, m.dtype, m.shape), "EQ"), b.constant(0.0, m.dtype, m.shape), m)
    total = reduce_sum(b, b.unary("exponential", b.sub(sel, b.broadcast_in_dim(m, (n, l, c), [0, 2]))), [1])
    return b.add(b.unary("log", total), m)


def _collected(b: Builder, lp: Value, lp_ext: Value, ext: Value, valid: Value, skip: Value, in_len: Value,
               tl: Value, log_alpha: Value) -> Value:
    """(T, N, C) log of sum_{s: l'(s) = c} alpha_t(s) beta_t(s), from a backward-in-time loop.

    The loop starts from a virtual beta_T that is 0 at s = 2 * target_length and -inf elsewhere,
    which makes each sample's first active step (t = input_length - 1) the CPU's initial row.
    """
    t, n, c = lp.shape
    l = ext.shape[1]
    s = b.iota((n, l), 1, torch.int64)
    two_len = _broadcast_rows(b, b.add(tl, tl), (n, l), 0)
    end = b.select(b.compare(s, two_len, "EQ"), b.constant(0.0, lp.dtype, (n, l)), _neg_inf(b, lp.dtype, (n, l)))
    skip_ahead = b.slice(b.pad(skip, b.constant(False, torch.bool), [0, 0], [0, 2]), [0, 2], [n, l + 2])
    onehot = b.compare(b.broadcast_in_dim(ext, (n, l, c), [0, 1]), b.iota((n, l, c), 2, torch.int64), "EQ")
    consts = [lp_ext, skip_ahead, in_len, valid, onehot, log_alpha]
    _, collected = _time_loop(b, t, consts, [end, _neg_inf(b, lp.dtype, (t, n, c))], _beta_step)
    return collected


@register(aten._ctc_loss_backward)
def _ctc_loss_backward(ctx: LoweringContext, grad: Value, log_probs: Value, targets: Value, input_lengths: Any,
                       target_lengths: Any, neg_log_likelihood: Value, log_alpha: Value, blank: int,
                       zero_infinity: bool = False) -> Value:
    """grad[t, n, c] = (exp(lp) - exp(collected + nll - lp)) * grad_out[n], zero past input_length[n]."""
    b = ctx.b
    dtype = log_probs.dtype
    t, n, c = log_probs.shape
    tl, ext, valid, skip, lp_ext = _prepare(b, log_probs, targets, target_lengths, log_alpha.shape[2], blank)
    in_len = _lengths(b, input_lengths)
    la = b.convert(log_alpha, dtype)
    collected = _collected(b, log_probs, lp_ext, ext, valid, skip, in_len, tl, la)
    full = (t, n, c)
    nll = _broadcast_rows(b, b.reshape(b.convert(neg_log_likelihood, dtype), (n,)), full, 1)
    gout = _broadcast_rows(b, b.reshape(b.convert(grad, dtype), (n,)), full, 1)
    g = b.sub(b.unary("exponential", log_probs),
              b.unary("exponential", b.sub(b.add(collected, nll), log_probs)))
    g = b.mul(g, gout)
    zeros = b.constant(0.0, dtype, full)
    keep = b.compare(b.iota(full, 0, torch.int64), _broadcast_rows(b, in_len, full, 1), "LT")
    if zero_infinity:
        keep = b.binary("and", keep, b.compare(nll, b.constant(math.inf, dtype, full), "NE"))
    return b.convert(b.select(keep, g, zeros), ctx.out_dtype())


# _ctc_loss.Tensor's log_alpha is (N, T, 2 * max(target_lengths) + 1): a shape that depends on the
# lengths' values. PyTorch's own kernel copies the lengths to the host and calls the int[] overload;
# so does this one (a sync), while the .default lowering keeps the lengths static.
@register_host_kernel(aten._ctc_loss.Tensor)
def ctc_loss_tensor_lengths(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                            target_lengths: torch.Tensor, blank: int = 0, zero_infinity: bool = False
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    from ..engine import executor

    for name, v in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
            raise RuntimeError(f"{name} must be integral")
    il = input_lengths.to("cpu", torch.int64).reshape(-1).tolist()
    tl = target_lengths.to("cpu", torch.int64).reshape(-1).tolist()
    return executor.run(aten._ctc_loss.default, (log_probs, targets, il, tl, blank, zero_infinity), {})


# PyTorch has no meta kernels for the backward; the engine needs the output metadata.
def _backward_meta(grad: torch.Tensor, log_probs: torch.Tensor, *rest: Any) -> torch.Tensor:
    return torch.empty_like(log_probs, memory_format=torch.contiguous_format)


_meta_lib = torch.library.Library("aten", "IMPL")
_meta_lib.impl("_ctc_loss_backward", _backward_meta, "Meta")
_meta_lib.impl("_ctc_loss_backward.Tensor", _backward_meta, "Meta")
