"""Interpolation: nearest, nearest-exact, (bi/tri)linear and bicubic upsampling, antialiased
bilinear and bicubic resampling, and their backwards.

Every mode is separable: the output is the input with one small matrix applied
along each spatial dimension (a row of source weights per output position).
The matrices are built on the host at trace time with exactly CPU's source
index arithmetic (float32, ``area_pixel_compute_source_index`` and friends),
so forward is a chain of dot products (a gather for nearest, which keeps
integers exact) and backward applies the transposed matrices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .builder import Builder, Value
from .conv import _apply_along
from .elementwise import opmath
from .indexing import take_rows
from .registry import LoweringContext, register

aten = torch.ops.aten
_F = np.float32


def _scale_value(scale: float | None, n_in: int, n_out: int, dtype: type = _F) -> np.floating:
    if scale is not None and scale > 0:
        return dtype(1.0 / scale)
    return dtype(n_in) / dtype(n_out)


def _area_scale(n_in: int, n_out: int, align_corners: bool, scale: float | None, dtype: type = _F) -> np.floating:
    """ATen's area_pixel_compute_scale, in ``dtype`` arithmetic (the kernel's scalar type)."""
    if align_corners:
        return dtype(n_in - 1) / dtype(n_out - 1) if n_out > 1 else dtype(0)
    return _scale_value(scale, n_in, n_out, dtype)


def _source_index(scale: np.float32, dst: int, align_corners: bool, cubic: bool) -> np.float32:
    if align_corners:
        return _F(scale * _F(dst))
    src = _F(scale * _F(_F(dst) + _F(0.5)) - _F(0.5))
    return _F(0) if (not cubic and src < 0) else src


def nearest_indices(n_in: int, n_out: int, scale: float | None, exact: bool) -> np.ndarray:
    idx = np.zeros(n_out, dtype=np.int64)
    for i in range(n_out):
        if not exact and n_out == n_in:
            idx[i] = i
        elif not exact and n_out == 2 * n_in:
            idx[i] = i >> 1
        else:
            s = _scale_value(scale, n_in, n_out)
            v = _F(_F(_F(i) + _F(0.5)) * s) if exact else _F(_F(i) * s)
            idx[i] = min(math.floor(v), n_in - 1)
    return idx


def linear_matrix(n_in: int, n_out: int, align_corners: bool, scale: float | None) -> np.ndarray:
    m = np.zeros((n_out, n_in), dtype=np.float32)
    s = _area_scale(n_in, n_out, align_corners, scale)
    for i in range(n_out):
        real = _source_index(s, i, align_corners, cubic=False)
        i0 = int(real)
        off = 1 if i0 < n_in - 1 else 0
        lam1 = _F(min(max(_F(real - _F(i0)), _F(0)), _F(1)))
        m[i, i0] += _F(1) - lam1
        m[i, i0 + off] += lam1
    return m


def _cubic_coeffs(t: np.float32) -> list[np.float32]:
    a = _F(-0.75)

    def c1(x: np.float32) -> np.float32:
        return _F(_F(_F(_F(a + 2) * x) - _F(a + 3)) * x * x + 1)

    def c2(x: np.float32) -> np.float32:
        return _F(_F(_F(_F(a * x) - _F(5 * a)) * x + _F(8 * a)) * x - _F(4 * a))

    return [c2(_F(t + 1)), c1(t), c1(_F(1 - t)), c2(_F(2 - t))]


def cubic_matrix(n_in: int, n_out: int, align_corners: bool, scale: float | None) -> np.ndarray:
    m = np.zeros((n_out, n_in), dtype=np.float32)
    s = _area_scale(n_in, n_out, align_corners, scale)
    for i in range(n_out):
        real = _source_index(s, i, align_corners, cubic=True)
        base = math.floor(real)
        t = _F(real - _F(base))
        for k, w in enumerate(_cubic_coeffs(t)):
            j = min(max(base - 1 + k, 0), n_in - 1)
            m[i, j] += w
    return m


def _linear_filter(x: float) -> float:
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def _cubic_filter(x: float, a: float = -0.5) -> float:
    x = abs(x)
    if x < 1.0:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2.0:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return 0.0


def antialias_matrix(n_in: int, n_out: int, align_corners: bool, scale: float | None, cubic: bool,
                     dtype: type = _F) -> np.ndarray:
    """(n_out, n_in) weights of ATen's antialiased (PIL-style) resampling: when shrinking,
    the filter is stretched by the scale, so each output averages all the input it covers;
    weights are normalized per output. ``dtype``: the arithmetic of CPU's kernel (its scalar)."""
    interp_size = 4 if cubic else 2
    filt = _cubic_filter if cubic else _linear_filter
    s = _area_scale(n_in, n_out, align_corners, scale, dtype)
    support = dtype(interp_size * 0.5) * s if s >= 1.0 else dtype(interp_size * 0.5)
    invscale = dtype(1.0) / s if s >= 1.0 else dtype(1.0)
    max_size = math.ceil(support) * 2 + 1
    m = np.zeros((n_out, n_in), dtype=np.float64)
    for i in range(n_out):
        center = s * dtype(i + 0.5)
        xmin = max(int(center - support + dtype(0.5)), 0)
        xsize = min(max(min(int(center + support + dtype(0.5)), n_in) - xmin, 0), max_size)
        w = [dtype(filt(float((dtype(j + xmin) - center + dtype(0.5)) * invscale))) for j in range(xsize)]
        total = dtype(sum(w, dtype(0.0)))
        for j, wj in enumerate(w):
            m[i, xmin + j] = wj / total if total != 0 else wj
    return m


def _scales(scales: Sequence[float | None] | None, n: int) -> list[float | None]:
    return list(scales) if scales is not None else [None] * n


def _apply_matrices(b: Builder, v: Value, mats: Sequence[np.ndarray], transpose: bool) -> Value:
    lead = v.rank - len(mats)
    for i, m in enumerate(mats):
        mm = m.T.copy() if transpose else m
        v = _apply_along(b, v, b.dense_constant(mm, v.dtype), lead + i)
    return v


def _mats(kind: str, in_sp: Sequence[int], out_sp: Sequence[int], align_corners: bool,
          scales: Sequence[float | None], dtype: torch.dtype = torch.float32) -> list[np.ndarray]:
    if kind.endswith("_aa"):
        arith = np.float64 if dtype == torch.float64 else _F
        return [antialias_matrix(a, c, align_corners, s, kind == "cubic_aa", arith)
                for a, c, s in zip(in_sp, out_sp, scales)]
    if kind == "cubic":
        return [cubic_matrix(a, c, align_corners, s) for a, c, s in zip(in_sp, out_sp, scales)]
    return [linear_matrix(a, c, align_corners, s) for a, c, s in zip(in_sp, out_sp, scales)]


def _nearest_forward(ctx: LoweringContext, x: Value, out_size: Sequence[int], scales: Sequence[float | None],
                     exact: bool) -> Value:
    b = ctx.b
    nsp = len(out_size)
    lead = x.rank - nsp
    v = x
    for i, (n_in, n_out) in enumerate(zip(x.shape[lead:], out_size)):
        idx = nearest_indices(n_in, n_out, scales[i], exact)
        v = take_rows(b, v, b.dense_constant(idx, torch.int64), lead + i)
    return v


def _nearest_backward(ctx: LoweringContext, grad: Value, in_size: Sequence[int], scales: Sequence[float | None],
                      exact: bool) -> Value:
    b = ctx.b
    nsp = len(scales)
    lead = grad.rank - nsp
    mats = []
    for n_in, n_out, s in zip(in_size[lead:], grad.shape[lead:], scales):
        m = np.zeros((n_out, n_in), dtype=np.float32)
        m[np.arange(n_out), nearest_indices(n_in, n_out, s, exact)] = 1.0
        mats.append(m)
    acc = opmath(grad.dtype)
    r = _apply_matrices(b, b.convert(grad, acc), mats, transpose=True)
    return b.convert(r, ctx.out_dtype())


def _register_nearest(fwd: torch._ops.OpOverload, bwd: torch._ops.OpOverload, nsp: int, exact: bool) -> None:
    def forward(ctx: LoweringContext, x: Value, output_size: list[int], *scales: float | None) -> Value:
        return _nearest_forward(ctx, x, output_size, _scales(scales, nsp), exact)

    def backward(ctx: LoweringContext, grad: Value, output_size: list[int], input_size: list[int],
                 *scales: float | None) -> Value:
        return _nearest_backward(ctx, grad, input_size, _scales(scales, nsp), exact)

    register(fwd)(forward)
    register(bwd)(backward)


for _n, (_f, _b) in {1: (aten.upsample_nearest1d.default, aten.upsample_nearest1d_backward.default),
                     2: (aten.upsample_nearest2d.default, aten.upsample_nearest2d_backward.default),
                     3: (aten.upsample_nearest3d.default, aten.upsample_nearest3d_backward.default)}.items():
    _register_nearest(_f, _b, _n, exact=False)
for _n, (_f, _b) in {1: (aten._upsample_nearest_exact1d.default, aten._upsample_nearest_exact1d_backward.default),
                     2: (aten._upsample_nearest_exact2d.default, aten._upsample_nearest_exact2d_backward.default),
                     3: (aten._upsample_nearest_exact3d.default, aten._upsample_nearest_exact3d_backward.default)
                     }.items():
    _register_nearest(_f, _b, _n, exact=True)


def _register_weighted(fwd: torch._ops.OpOverload, bwd: torch._ops.OpOverload, nsp: int, kind: str) -> None:
    def forward(ctx: LoweringContext, x: Value, output_size: list[int], align_corners: bool,
                *scales: float | None) -> Value:
        b = ctx.b
        lead = x.rank - nsp
        mats = _mats(kind, x.shape[lead:], output_size, align_corners, _scales(scales, nsp), x.dtype)
        acc = opmath(x.dtype) if x.dtype.is_floating_point else torch.float32
        return b.convert(_apply_matrices(b, b.convert(x, acc), mats, transpose=False), ctx.out_dtype())

    def backward(ctx: LoweringContext, grad: Value, output_size: list[int], input_size: list[int],
                 align_corners: bool, *scales: float | None) -> Value:
        b = ctx.b
        lead = grad.rank - nsp
        mats = _mats(kind, input_size[lead:], output_size, align_corners, _scales(scales, nsp), grad.dtype)
        acc = opmath(grad.dtype)
        return b.convert(_apply_matrices(b, b.convert(grad, acc), mats, transpose=True), ctx.out_dtype())

    register(fwd)(forward)
    register(bwd)(backward)


_register_weighted(aten.upsample_linear1d.default, aten.upsample_linear1d_backward.default, 1, "linear")
_register_weighted(aten.upsample_bilinear2d.default, aten.upsample_bilinear2d_backward.default, 2, "linear")
_register_weighted(aten.upsample_trilinear3d.default, aten.upsample_trilinear3d_backward.default, 3, "linear")
_register_weighted(aten.upsample_bicubic2d.default, aten.upsample_bicubic2d_backward.default, 2, "cubic")
_register_weighted(aten._upsample_bilinear2d_aa.default, aten._upsample_bilinear2d_aa_backward.default, 2,
                   "linear_aa")
_register_weighted(aten._upsample_bicubic2d_aa.default, aten._upsample_bicubic2d_aa_backward.default, 2, "cubic_aa")
