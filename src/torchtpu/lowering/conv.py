"""Convolution (1d/2d/3d, transposed, grouped, dilated) and pooling.

Everything is one ``stablehlo.convolution`` or ``stablehlo.reduce_window``.
The backward passes follow the classic transposition rules (as in JAX's
``conv_general_dilated`` VJPs): the input gradient is a convolution of the
output gradient with the spatially reversed kernel, the weight gradient a
convolution of the input with the output gradient, batch and feature
dimensions swapped. A transposed convolution is the input gradient of a
plain one, so it reuses that rule.

float32 convolutions make the same bf16 passes as matrix products (see
``matmul.py``): a TPU's convolutions run on the same matrix unit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..engine import precision
from . import target
from .builder import Builder, Value, _i64_array, precision_config
from .elementwise import opmath
from .matmul import _PASSES, NATIVE_PRECISION, _pass_operands, _split, elementwise_dot
from .registry import LoweringContext, register, register_output_layout

aten = torch.ops.aten


def _dilate(n: int, d: int) -> int:
    return 0 if n == 0 else 1 + d * (n - 1)


def _spec(kind: str, nsp: int) -> str:
    """A dimension spec: 'bf' / 'oi' / 'fb' / 'io' followed by the spatial dims, NCHW-style."""
    return kind + "".join(str(i) for i in range(nsp))


def _spec_attr(spec: str) -> str:
    return "[" + ", ".join(spec) + "]"


def conv_general(b: Builder, lhs: Value, rhs: Value, lhs_spec: str, rhs_spec: str, out_spec: str,
                 strides: Sequence[int], padding: Sequence[tuple[int, int]], lhs_dil: Sequence[int],
                 rhs_dil: Sequence[int], feature_groups: int = 1, batch_groups: int = 1,
                 precision: str | None = None) -> Value:
    """One stablehlo.convolution; specs name each tensor dimension (b, f, o, i or a spatial index).
    ``precision`` as in :meth:`Builder.dot_general`."""
    nsp = len(strides)
    lb, lf = lhs.shape[lhs_spec.index("b")], lhs.shape[lhs_spec.index("f")]
    del lf
    ro = rhs.shape[rhs_spec.index("o")]
    out_sizes: dict[str, int] = {"b": lb // batch_groups, "f": ro}
    for i in range(nsp):
        n = lhs.shape[lhs_spec.index(str(i))]
        k = rhs.shape[rhs_spec.index(str(i))]
        din = _dilate(n, lhs_dil[i]) + padding[i][0] + padding[i][1]
        dk = _dilate(k, rhs_dil[i])
        out_sizes[str(i)] = max(0, (din - dk) // strides[i] + 1) if din >= dk else 0
    shape = [out_sizes[c] for c in out_spec]
    pad = ", ".join(f"[{lo}, {hi}]" for lo, hi in padding)
    attrs = (f"batch_group_count = {batch_groups} : i64, "
             f"dimension_numbers = #stablehlo.conv<{_spec_attr(lhs_spec)}x{_spec_attr(rhs_spec)}->"
             f"{_spec_attr(out_spec)}>, feature_group_count = {feature_groups} : i64, "
             f"lhs_dilation = {_i64_array(lhs_dil)}, "
             f"padding = dense<[{pad}]> : tensor<{nsp}x2xi64>, rhs_dilation = {_i64_array(rhs_dil)}, "
             f"window_strides = {_i64_array(strides)}")
    if nsp == 0:
        attrs = attrs.replace("padding = dense<[]> : tensor<0x2xi64>, ", "")
    if precision is not None:
        attrs += ", " + precision_config(precision)
    return b.op1("stablehlo.convolution", [lhs, rhs], shape, lhs.dtype, attrs=attrs)


def _conv_tpu(ctx: LoweringContext, lhs: Value, rhs: Value, *args: Any, **kw: Any) -> Value:
    """conv_general with TPU numerics: f32 in bf16 passes, low-precision floats accumulated in f32."""
    b = ctx.b
    dtype = torch.promote_types(lhs.dtype, rhs.dtype)
    if dtype == torch.float32:
        precision.note_float32_product(ctx.precision)
    if not (dtype.is_floating_point or dtype.is_complex) and target.elementwise_integer_products():
        wide = torch.int64 if dtype == torch.bool else dtype
        return elementwise_conv(b, b.convert(lhs, wide), b.convert(rhs, wide), *args, **kw)
    if target.native_dot_precision():
        return _conv_native(ctx, lhs, rhs, dtype, *args, **kw)
    if dtype == torch.float32:
        passes = _PASSES[ctx.precision]
        nparts = max(max(i, j) for i, j in passes) + 1
        pl = [b.convert(p, torch.float32) for p in _split(b, b.convert(lhs, torch.float32), nparts)]
        pr = [b.convert(p, torch.float32) for p in _split(b, b.convert(rhs, torch.float32), nparts)]
        acc = None
        for i, j in passes:
            p = conv_general(b, *_pass_operands(pl, pr, i, j), *args, **kw)
            acc = p if acc is None else b.add(acc, p)
        return acc
    if dtype in (torch.bfloat16, torch.float16):
        return conv_general(b, b.convert(lhs, torch.float32), b.convert(rhs, torch.float32), *args, **kw)
    if dtype == torch.bool:
        dtype = torch.int64
    return conv_general(b, b.convert(lhs, dtype), b.convert(rhs, dtype), *args, **kw)


def _conv_native(ctx: LoweringContext, lhs: Value, rhs: Value, dtype: torch.dtype, *args: Any, **kw: Any) -> Value:
    """The convolution on a compiler that makes the bf16 passes itself (a TPU), with the
    numerics of :func:`matmul._native_dot`: f32 at the precision in force, bf16 exact
    products (in f32 at one pass), f16, f64 and complex exact."""
    b = ctx.b
    if dtype in (torch.float32, torch.bfloat16):
        precision = NATIVE_PRECISION[ctx.precision] if dtype == torch.float32 else "DEFAULT"
        return conv_general(b, b.convert(lhs, torch.float32), b.convert(rhs, torch.float32), *args, **kw,
                            precision=precision)
    wide = torch.float32 if dtype == torch.float16 else dtype
    return conv_general(b, b.convert(lhs, wide), b.convert(rhs, wide), *args, **kw, precision="HIGHEST")


def elementwise_conv(b: Builder, lhs: Value, rhs: Value, lhs_spec: str, rhs_spec: str, out_spec: str,
                     strides: Sequence[int], padding: Sequence[tuple[int, int]], lhs_dil: Sequence[int],
                     rhs_dil: Sequence[int], feature_groups: int = 1, batch_groups: int = 1) -> Value:
    """:func:`conv_general` as a sum over the kernel's taps of elementwise products (exact for
    integers, which a TPU's compiler cannot convolve at 64 bits): each tap is a strided window
    of the padded input, multiplied with that tap's weights and summed over input features."""
    if batch_groups != 1:
        raise NotImplementedError("torchtpu: integer convolution with batch groups")
    nsp = len(strides)
    sp = [str(i) for i in range(nsp)]
    x = b.transpose(lhs, [lhs_spec.index(c) for c in ["b", "f", *sp]])  # (N, C, *S)
    w = b.transpose(rhs, [rhs_spec.index(c) for c in ["o", "i", *sp]])  # (O, C/g, *K)
    n, c = x.shape[0], x.shape[1]
    o, cg = w.shape[0], w.shape[1]
    g = feature_groups
    zero = b.constant(0, x.dtype)
    x = b.pad(x, zero, [0, 0, *(lo for lo, _ in padding)], [0, 0, *(hi for _, hi in padding)],
              [0, 0, *(d - 1 for d in lhs_dil)])
    kernel = w.shape[2:]
    out_sp = [max(0, (x.shape[2 + i] - ((kernel[i] - 1) * rhs_dil[i] + 1)) // strides[i] + 1) for i in range(nsp)]
    # grouped: x (N, g, C/g, *S) and w (g, O/g, C/g, *K); batch g, contract C/g
    xg = b.reshape(x, [n, g, c // g, *x.shape[2:]])
    wg = b.reshape(w, [g, o // g, cg, *kernel])
    acc = None
    for tap in itertools.product(*(range(k) for k in kernel)):
        start = [t * d for t, d in zip(tap, rhs_dil)]
        window = b.slice(xg, [0, 0, 0, *start],
                         [n, g, c // g, *(s + max(m - 1, 0) * st + 1 for s, m, st in zip(start, out_sp, strides))],
                         [1, 1, 1, *strides])  # (N, g, C/g, *out)
        weights = b.slice(wg, [0, 0, 0, *tap], [g, o // g, cg, *(t + 1 for t in tap)])
        weights = b.reshape(weights, [g, o // g, cg])
        part = elementwise_dot(b, window, weights, ([1], [0]), ([2], [2]))  # (g, N, *out, O/g)
        acc = part if acc is None else b.add(acc, part)
    if acc is None:  # an empty kernel
        acc = b.constant(0, x.dtype, [g, n, *out_sp, o // g])
    r = b.transpose(acc, [1, 0, 2 + nsp, *range(2, 2 + nsp)])  # (N, g, O/g, *out)
    r = b.reshape(r, [n, o, *out_sp])
    return b.transpose(r, [["b", "f", *sp].index(ch) for ch in out_spec])


def _vjp_lhs_padding(in_sp: Sequence[int], k_sp: Sequence[int], strides: Sequence[int], out_sp: Sequence[int],
                     padding: Sequence[int], lhs_dil: Sequence[int], rhs_dil: Sequence[int]
                     ) -> list[tuple[int, int]]:
    pads = []
    for n, k, s, o, p, ld, rd in zip(in_sp, k_sp, strides, out_sp, padding, lhs_dil, rhs_dil):
        before = _dilate(k, rd) - p - 1
        after = _dilate(n, ld) + _dilate(k, rd) - 1 - _dilate(o, s) - before
        pads.append((before, after))
    return pads


def _vjp_rhs_padding(in_sp: Sequence[int], k_sp: Sequence[int], strides: Sequence[int], out_sp: Sequence[int],
                     padding: Sequence[int], lhs_dil: Sequence[int], rhs_dil: Sequence[int]
                     ) -> list[tuple[int, int]]:
    pads = []
    for n, k, s, o, p, ld, rd in zip(in_sp, k_sp, strides, out_sp, padding, lhs_dil, rhs_dil):
        hi = (_dilate(o, s) - _dilate(n, ld)) + (_dilate(k, rd) - p - 1)
        pads.append((p, hi))
    return pads


def _grouped_kernel_for_input_grad(b: Builder, w: Value, groups: int) -> Value:
    """(O, I/g, k...) -> (O/g, I, k...) with groups major in I: the kernel of the input-gradient conv."""
    if groups == 1:
        return w
    o, ig = w.shape[0], w.shape[1]
    rest = list(w.shape[2:])
    v = b.reshape(w, [groups, o // groups, ig, *rest])
    v = b.transpose(v, [1, 0, 2, *range(3, 3 + len(rest))])
    return b.reshape(v, [o // groups, groups * ig, *rest])


def conv_input_grad(ctx: LoweringContext, grad: Value, w: Value, in_shape: Sequence[int], stride: Sequence[int],
                    padding: Sequence[int], dilation: Sequence[int], groups: int) -> Value:
    """d(conv(x, w))/dx applied to ``grad``: also the forward of a transposed convolution."""
    b = ctx.b
    nsp = len(stride)
    kern = b.reverse(_grouped_kernel_for_input_grad(b, w, groups), list(range(2, 2 + nsp)))
    pads = _vjp_lhs_padding(in_shape[2:], w.shape[2:], stride, grad.shape[2:], padding, [1] * nsp, dilation)
    r = _conv_tpu(ctx, grad, kern, _spec("bf", nsp), _spec("io", nsp), _spec("bf", nsp), [1] * nsp, pads,
                  list(stride), list(dilation), feature_groups=groups)
    return _fit_spatial(b, r, in_shape)


def conv_weight_grad(ctx: LoweringContext, grad: Value, x: Value, w_shape: Sequence[int], stride: Sequence[int],
                     padding: Sequence[int], dilation: Sequence[int], groups: int) -> Value:
    """d(conv(x, w))/dw applied to ``grad``."""
    nsp = len(stride)
    pads = _vjp_rhs_padding(x.shape[2:], w_shape[2:], stride, grad.shape[2:], padding, [1] * nsp, dilation)
    r = _conv_tpu(ctx, x, grad, _spec("fb", nsp), _spec("io", nsp), _spec("fb", nsp), list(dilation), pads,
                  [1] * nsp, list(stride), batch_groups=groups)
    return _fit_spatial(ctx.b, r, w_shape)


def _fit_spatial(b: Builder, v: Value, shape: Sequence[int]) -> Value:
    """Crop (or zero-pad) trailing spatial positions that a stride leaves over."""
    if tuple(v.shape) == tuple(shape):
        return v
    lim = [min(a, c) for a, c in zip(v.shape, shape)]
    v = b.slice(v, [0] * v.rank, lim)
    if tuple(v.shape) != tuple(shape):
        v = b.pad(v, b.constant(0, v.dtype), [0] * v.rank, [c - a for a, c in zip(v.shape, shape)])
    return v


def _expand(v: Sequence[int], n: int) -> list[int]:
    v = list(v)
    return v * n if len(v) == 1 else v


@register(aten.convolution.default)
def _convolution(ctx: LoweringContext, x: Value, w: Value, bias: Value | None, stride: list[int],
                 padding: list[int], dilation: list[int], transposed: bool, output_padding: list[int],
                 groups: int) -> Value:
    b = ctx.b
    out = ctx.out_dtype()
    out_shape = ctx.out_shape()
    nsp = w.rank - 2
    stride, padding, dilation = _expand(stride, nsp), _expand(padding, nsp), _expand(dilation, nsp)
    # PyTorch's argument checks (the meta kernel does not make them all)
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError("dilation should be greater than zero")
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    if transposed:
        # The input gradient of the plain convolution whose kernel is w (in: out channels of w).
        r = conv_input_grad(ctx, x, w, out_shape, stride, padding, dilation, groups)
    else:
        r = _conv_tpu(ctx, x, w, _spec("bf", nsp), _spec("oi", nsp), _spec("bf", nsp), stride,
                      [(p, p) for p in padding], [1] * nsp, dilation, feature_groups=groups)
    if bias is not None:
        r = b.add(r, b.broadcast_in_dim(b.convert(bias, r.dtype), r.shape, [1]))
    return b.convert(r, out)


@register(aten.convolution_backward.default)
def _convolution_backward(ctx: LoweringContext, grad: Value, x: Value, w: Value, bias_sizes: list[int] | None,
                          stride: list[int], padding: list[int], dilation: list[int], transposed: bool,
                          output_padding: list[int], groups: int, output_mask: list[bool]) -> tuple:
    b = ctx.b
    nsp = w.rank - 2
    stride, padding, dilation = _expand(stride, nsp), _expand(padding, nsp), _expand(dilation, nsp)
    gx = gw = gb = None
    if output_mask[0]:
        if transposed:
            gx = _conv_tpu(ctx, grad, w, _spec("bf", nsp), _spec("oi", nsp), _spec("bf", nsp), stride,
                           [(p, p) for p in padding], [1] * nsp, dilation, feature_groups=groups)
            gx = _fit_spatial(b, gx, x.shape)
        else:
            gx = conv_input_grad(ctx, grad, w, x.shape, stride, padding, dilation, groups)
        gx = b.convert(gx, ctx.out_dtype(0))
    if output_mask[1]:
        if transposed:
            # y = conv_input_grad(x, w): w's gradient pairs the output gradient (as conv input) with x.
            gw = conv_weight_grad(ctx, x, grad, w.shape, stride, padding, dilation, groups)
        else:
            gw = conv_weight_grad(ctx, grad, x, w.shape, stride, padding, dilation, groups)
        gw = b.convert(gw, ctx.out_dtype(1))
    if output_mask[2]:
        acc = opmath(grad.dtype)
        g = b.convert(grad, acc)
        dims = [0, *range(2, grad.rank)]
        gb = b.convert(b.reduce(g, dims, b.constant(0, acc), "stablehlo.add"), ctx.out_dtype(2))
    return gx, gw, gb


# -- pooling -------------------------------------------------------------------
def _pool_params(x: Value, nsp: int, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int] | None = None) -> tuple[list[int], list[int], list[int], list[int]]:
    k = _expand(kernel, nsp)
    s = _expand(stride, nsp) if stride else list(k)
    p = _expand(padding, nsp)
    d = _expand(dilation, nsp) if dilation else [1] * nsp
    return k, s, p, d


def _high_pad(n: int, out: int, k: int, s: int, p: int, d: int) -> int:
    """High padding that makes a window of ``out`` positions (covers ceil_mode's partial window)."""
    return max(0, (out - 1) * s + d * (k - 1) + 1 - n - p)


@register(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool_with_indices(ctx: LoweringContext, x: Value, kernel: list[int], stride: list[int] = (),
                           padding: list[int] = 0, dilation: list[int] = 1, ceil_mode: bool = False
                           ) -> tuple[Value, Value]:
    b = ctx.b
    nsp = 2 if ctx.op is aten.max_pool2d_with_indices.default else 3
    k, s, p, d = _pool_params(x, nsp, kernel, stride, _as_list(padding), _as_list(dilation))
    out_shape = ctx.out_shape(0)
    lead = x.rank - nsp
    sp = x.shape[lead:]
    # Flat index within each spatial plane, as PyTorch returns it.
    idx = None
    for i in range(nsp):
        term = b.iota(x.shape, lead + i, torch.int64)
        scale = math.prod(sp[i + 1:])
        if scale != 1:
            term = b.mul(term, b.constant(scale, torch.int64, x.shape))
        idx = term if idx is None else b.add(idx, term)
    window = [1] * lead + k
    strides = [1] * lead + s
    dil = [1] * lead + d
    pads = [(0, 0)] * lead + [(p[i], _high_pad(sp[i], out_shape[lead + i], k[i], s[i], p[i], d[i]))
                              for i in range(nsp)]
    floating = x.dtype.is_floating_point
    init_v = b.constant(-math.inf if floating else _int_min(x.dtype), x.dtype)
    init_i = b.constant(torch.iinfo(torch.int64).max, torch.int64)

    def body(bb: Builder, av: Value, ai: Value, ev: Value, ei: Value) -> list[Value]:
        better = bb.compare(ev, av, "GT")
        if floating:
            better = bb.binary("or", better, bb.binary("and", bb.compare(ev, ev, "NE"), bb.compare(av, av, "EQ")))
        same = bb.compare(ev, av, "EQ")
        if floating:
            same = bb.binary("or", same, bb.binary("and", bb.compare(ev, ev, "NE"), bb.compare(av, av, "NE")))
        take = bb.binary("or", better, bb.binary("and", same, bb.compare(ei, ai, "LT")))
        return [bb.select(take, ev, av), bb.select(take, ei, ai)]

    region = b.region([((), x.dtype), ((), torch.int64), ((), x.dtype), ((), torch.int64)], body)
    pad_attr = ", ".join(f"[{lo}, {hi}]" for lo, hi in pads)
    attrs = (f"window_dimensions = {_i64_array(window)}, window_strides = {_i64_array(strides)}, "
             f"base_dilations = {_i64_array([1] * x.rank)}, window_dilations = {_i64_array(dil)}, "
             f"padding = dense<[{pad_attr}]> : tensor<{x.rank}x2xi64>")
    vals, inds = b.op("stablehlo.reduce_window", [x, idx, init_v, init_i],
                      [(out_shape, x.dtype), (out_shape, torch.int64)], attrs=attrs, region=region)
    return vals, inds


def _max_first_index_body(floating: bool):
    """Reducer of (value, index) pairs: the maximum, NaN winning, ties to the lowest index (PyTorch's rule)."""

    def body(bb: Builder, av: Value, ai: Value, ev: Value, ei: Value) -> list[Value]:
        first = bb.compare(ei, ai, "LT")
        better = bb.compare(ev, av, "GT")
        same = bb.compare(ev, av, "EQ")
        if floating:
            e_nan, a_nan = bb.compare(ev, ev, "NE"), bb.compare(av, av, "NE")
            not_a = bb.unary("not", a_nan)
            better = bb.binary("or", bb.binary("and", e_nan, not_a), bb.binary("and", better, not_a))
            same = bb.binary("or", bb.binary("and", same, not_a), bb.binary("and", e_nan, a_nan))
        take = bb.binary("or", better, bb.binary("and", same, first))
        return [bb.select(take, ev, av), bb.select(take, ei, ai)]

    return body


def _int_min(dtype: torch.dtype) -> int | bool:
    if dtype == torch.bool:
        return False
    return torch.iinfo(dtype).min


@register(aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default)
def _max_pool_backward(ctx: LoweringContext, grad: Value, x: Value, kernel: list[int], stride: list[int],
                       padding: list[int], dilation: list[int], ceil_mode: bool, indices: Value) -> Value:
    """Scatter-add each output gradient to the input position its max came from."""
    nsp = 2 if ctx.op is aten.max_pool2d_with_indices_backward.default else 3
    return scatter_to_argmax(ctx, grad, x, indices, nsp)


def scatter_to_argmax(ctx: LoweringContext, grad: Value, x: Value, indices: Value, nsp: int) -> Value:
    b = ctx.b
    lead = x.rank - nsp
    plane = math.prod(x.shape[lead:])
    outer = math.prod(x.shape[:lead])
    n_out = math.prod(grad.shape[lead:])
    acc = opmath(grad.dtype)
    g = b.reshape(b.convert(grad, acc), (outer, n_out))
    idx = b.reshape(b.convert(indices, torch.int64), (outer, n_out, 1))
    rows = b.reshape(b.iota((outer, n_out), 0, torch.int64), (outer, n_out, 1))
    coords = b.concatenate([rows, idx], 2)
    base = b.constant(0, acc, (outer, plane))
    region = b.region([((), acc), ((), acc)], lambda bb, a, c: bb.add(a, c))
    attrs = ("scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], "
             "scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>, "
             "indices_are_sorted = false, unique_indices = false")
    r = b.op1("stablehlo.scatter", [base, coords, g], (outer, plane), acc, attrs=attrs, region=region)
    return b.convert(b.reshape(r, x.shape), ctx.out_dtype())


def _avg_divisor(b: Builder, x_shape: Sequence[int], lead: int, k: Sequence[int], s: Sequence[int],
                 p: Sequence[int], out_sp: Sequence[int], count_include_pad: bool, acc: torch.dtype) -> Value:
    """Per-output-position divisor: window size clipped to the padded (or the real) input."""
    nsp = len(k)
    sp = list(x_shape[lead:])
    ones = b.constant(1.0, acc, sp)
    if count_include_pad:
        # Padding counts, but not the extra high padding a ceil_mode window reaches into.
        ones = b.pad(ones, b.constant(1.0, acc), list(p), list(p))
        base_pad = [(0, _high_pad(sp[i] + 2 * p[i], out_sp[i], k[i], s[i], 0, 1)) for i in range(nsp)]
    else:
        base_pad = [(p[i], _high_pad(sp[i], out_sp[i], k[i], s[i], p[i], 1)) for i in range(nsp)]
    cnt = b.reduce_window(ones, b.constant(0.0, acc), "stablehlo.add", list(k), list(s), base_pad)
    return b.broadcast_in_dim(cnt, [*x_shape[:lead], *out_sp], list(range(lead, lead + nsp)))


def _avg_pool(ctx: LoweringContext, x: Value, nsp: int, kernel: list[int], stride: list[int], padding: list[int],
              ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> Value:
    b = ctx.b
    k, s, p, _ = _pool_params(x, nsp, kernel, stride, padding)
    out_shape = ctx.out_shape()
    lead = x.rank - nsp
    sp = x.shape[lead:]
    out_sp = out_shape[lead:]
    acc = opmath(x.dtype) if x.dtype.is_floating_point else torch.float64
    v = b.convert(x, acc)
    pads = [(0, 0)] * lead + [(p[i], _high_pad(sp[i], out_sp[i], k[i], s[i], p[i], 1)) for i in range(nsp)]
    total = b.reduce_window(v, b.constant(0.0, acc), "stablehlo.add", [1] * lead + k, [1] * lead + s, pads)
    if divisor_override:
        r = b.div(total, b.constant(float(divisor_override), acc, total.shape))
    else:
        r = b.div(total, _avg_divisor(b, x.shape, lead, k, s, p, out_sp, count_include_pad, acc))
    if not x.dtype.is_floating_point:
        # Integer average pooling truncates like the CPU kernel's integer division.
        r = b.convert(r, torch.int64)
    return b.convert(r, ctx.out_dtype())


@register(aten.avg_pool2d.default)
def _avg_pool2d(ctx: LoweringContext, x: Value, kernel: list[int], stride: list[int] = (), padding: list[int] = 0,
                ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None
                ) -> Value:
    return _avg_pool(ctx, x, 2, kernel, stride, _as_list(padding), ceil_mode, count_include_pad, divisor_override)


@register(aten.avg_pool3d.default)
def _avg_pool3d(ctx: LoweringContext, x: Value, kernel: list[int], stride: list[int] = (), padding: list[int] = 0,
                ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: int | None = None
                ) -> Value:
    return _avg_pool(ctx, x, 3, kernel, stride, _as_list(padding), ceil_mode, count_include_pad, divisor_override)


def _as_list(v: Any) -> list[int]:
    return [v] if isinstance(v, int) else list(v)


def _avg_pool_backward(ctx: LoweringContext, grad: Value, x: Value, nsp: int, kernel: list[int],
                       stride: list[int], padding: list[int], ceil_mode: bool, count_include_pad: bool,
                       divisor_override: int | None) -> Value:
    """Spread each output gradient (over its divisor) evenly back over its window."""
    b = ctx.b
    k, s, p, _ = _pool_params(x, nsp, kernel, stride, padding)
    lead = x.rank - nsp
    sp = list(x.shape[lead:])
    out_sp = list(grad.shape[lead:])
    acc = opmath(grad.dtype)
    g = b.convert(grad, acc)
    if divisor_override:
        g = b.div(g, b.constant(float(divisor_override), acc, g.shape))
    else:
        g = b.div(g, _avg_divisor(b, x.shape, lead, k, s, p, out_sp, count_include_pad, acc))
    # Transposed window sum: dilate by the stride, pad by k-1, sum windows of k.
    dil = b.pad(g, b.constant(0.0, acc), [0] * g.rank, [0] * g.rank, [0] * lead + [si - 1 for si in s])
    full = b.reduce_window(dil, b.constant(0.0, acc), "stablehlo.add", [1] * lead + k, [1] * g.rank,
                           [(0, 0)] * lead + [(ki - 1, ki - 1) for ki in k])
    # full covers padded-input positions [0, (out-1)*s + k); keep the real input's.
    start = [0] * lead + list(p)
    limit = [*x.shape[:lead], *[min(p[i] + sp[i], full.shape[lead + i]) for i in range(nsp)]]
    r = b.slice(full, start, limit)
    if tuple(r.shape) != tuple(x.shape):
        r = b.pad(r, b.constant(0.0, acc), [0] * r.rank, [a - c for a, c in zip(x.shape, r.shape)])
    return b.convert(r, ctx.out_dtype())


@register(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(ctx: LoweringContext, grad: Value, x: Value, kernel: list[int], stride: list[int],
                         padding: list[int], ceil_mode: bool, count_include_pad: bool,
                         divisor_override: int | None) -> Value:
    return _avg_pool_backward(ctx, grad, x, 2, kernel, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)


@register(aten.avg_pool3d_backward.default)
def _avg_pool3d_backward(ctx: LoweringContext, grad: Value, x: Value, kernel: list[int], stride: list[int],
                         padding: list[int], ceil_mode: bool, count_include_pad: bool,
                         divisor_override: int | None) -> Value:
    return _avg_pool_backward(ctx, grad, x, 3, kernel, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)


# -- adaptive average pooling: separable averaging matrices --------------------
def _adaptive_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) averaging weights of PyTorch's adaptive windows [floor(i*n/o), ceil((i+1)*n/o))."""
    m = np.zeros((n_out, n_in), dtype=np.float32)
    for i in range(n_out):
        lo = (i * n_in) // n_out
        hi = -((-(i + 1) * n_in) // n_out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


def _apply_along(b: Builder, v: Value, m: Value, dim: int) -> Value:
    """Contract ``v``'s dimension ``dim`` with the columns of ``m`` (out, in); the result keeps dim order."""
    # exact f32 weights and sums on every backend (a TPU would otherwise take one bf16 pass)
    r = b.dot_general(v, m, ([], []), ([dim], [1]), v.dtype, precision="HIGHEST")
    perm = list(range(v.rank - 1))
    perm.insert(dim, v.rank - 1)
    return b.transpose(r, perm)


def _adaptive_avg(ctx: LoweringContext, v: Value, in_sp: Sequence[int], out_sp: Sequence[int],
                  backward: bool) -> Value:
    b = ctx.b
    lead = v.rank - len(in_sp)
    # in_sp / out_sp are always the forward's sizes; backward applies the transpose.
    for i, (n_in, n_out) in enumerate(zip(in_sp, out_sp)):
        m = _adaptive_matrix(n_in, n_out)
        if backward:
            m = m.T.copy()
        v = _apply_along(b, v, b.dense_constant(m, v.dtype), lead + i)
    return v


@register(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool(ctx: LoweringContext, x: Value, output_size: list[int]) -> Value:
    acc = opmath(x.dtype)
    nsp = len(output_size)
    out_sp = ctx.out_shape()[-nsp:]
    r = _adaptive_avg(ctx, ctx.b.convert(x, acc), x.shape[-nsp:], out_sp, backward=False)
    return ctx.b.convert(r, ctx.out_dtype())


@register(aten._adaptive_avg_pool2d_backward.default, aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_pool_backward(ctx: LoweringContext, grad: Value, x: Value) -> Value:
    acc = opmath(grad.dtype)
    nsp = 2 if ctx.op is aten._adaptive_avg_pool2d_backward.default else 3
    r = _adaptive_avg(ctx, ctx.b.convert(grad, acc), x.shape[-nsp:], grad.shape[-nsp:], backward=True)
    return ctx.b.convert(r, ctx.out_dtype())



# -- adaptive max pooling --------------------------------------------------------
def _adaptive_windows(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """(n_out, K) source positions (clamped) and validity of PyTorch's adaptive windows."""
    starts = [(i * n_in) // n_out for i in range(n_out)]
    ends = [-((-(i + 1) * n_in) // n_out) for i in range(n_out)]
    k = max(e - s for s, e in zip(starts, ends))
    pos = np.array([[min(s + j, n_in - 1) for j in range(k)] for s in starts], dtype=np.int64)
    valid = np.array([[s + j < e for j in range(k)] for s, e in zip(starts, ends)])
    return pos, valid


@register(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def _adaptive_max_pool(ctx: LoweringContext, x: Value, output_size: list[int]) -> tuple[Value, Value]:
    """Gather each (variable-size) window into a padded block, then a (value, index) max over it."""
    b = ctx.b
    nsp = len(output_size)
    lead = x.rank - nsp
    sp = x.shape[lead:]
    out_sp = ctx.out_shape(0)[lead:]
    v = x
    flat_idx = np.zeros((), dtype=np.int64)
    mask = np.ones((), dtype=bool)
    for i, (n_in, n_out) in enumerate(zip(sp, out_sp)):
        pos, valid = _adaptive_windows(n_in, n_out)
        k = pos.shape[1]
        # after this dim: (..., o_1, K_1, ..., o_i, K_i, rest)
        axis = lead + 2 * i
        g = take_rows_flat(b, v, pos.reshape(-1), axis)
        v = b.reshape(g, [*g.shape[:axis], n_out, k, *g.shape[axis + 1:]])
        stride = math.prod(sp[i + 1:])
        flat_idx = np.add.outer(flat_idx, pos * stride)
        mask = np.logical_and.outer(mask, valid)
    block = v.shape
    win_dims = [lead + 2 * i + 1 for i in range(nsp)]
    bdims = list(range(lead, lead + 2 * nsp))
    idx = b.broadcast_in_dim(b.dense_constant(flat_idx, torch.int64), block, bdims)
    valid_v = b.broadcast_in_dim(b.dense_constant(mask.astype(np.int8), torch.int8), block, bdims)
    valid_b = b.compare(valid_v, b.constant(0, torch.int8, block), "NE")
    floating = x.dtype.is_floating_point
    low = b.constant(-math.inf if floating else _int_min(x.dtype), x.dtype, block)
    v = b.select(valid_b, v, low)
    big = b.constant(torch.iinfo(torch.int64).max, torch.int64, block)
    idx = b.select(valid_b, idx, big)

    body = _max_first_index_body(floating)

    init_v = b.constant(-math.inf if floating else _int_min(x.dtype), x.dtype)
    init_i = b.constant(torch.iinfo(torch.int64).max, torch.int64)
    vals, inds = b.reduce_multi([v, idx], [init_v, init_i], win_dims, body)
    return vals, inds


def take_rows_flat(b: Builder, v: Value, positions: np.ndarray, axis: int) -> Value:
    from .indexing import take_rows

    return take_rows(b, v, b.dense_constant(positions, torch.int64), axis)


@register(aten.adaptive_max_pool2d_backward.default, aten.adaptive_max_pool3d_backward.default)
def _adaptive_max_pool_backward(ctx: LoweringContext, grad: Value, x: Value, indices: Value) -> Value:
    nsp = 2 if ctx.op is aten.adaptive_max_pool2d_backward.default else 3
    return scatter_to_argmax(ctx, grad, x, indices, nsp)



# -- replication / reflection padding backward: transposed index maps ---------------
def _pad_index(n_in: int, lo: int, hi: int, mode: str) -> np.ndarray:
    out = []
    for i in range(n_in + lo + hi):
        j = i - lo
        if mode == "replicate":
            j = min(max(j, 0), n_in - 1)
        else:
            # reflect without repeating the edge: -1 -> 1, n -> n - 2
            period = 2 * (n_in - 1) if n_in > 1 else 1
            j = abs(j) % period if period else 0
            if j >= n_in:
                j = period - j
        out.append(j)
    return np.array(out, dtype=np.int64)


def _pad_backward(ctx: LoweringContext, grad: Value, x: Value, padding: list[int], mode: str) -> Value:
    b = ctx.b
    nsp = len(padding) // 2
    acc = opmath(grad.dtype)
    v = b.convert(grad, acc)
    for i in range(nsp):
        # padding lists the last dimension first
        d = x.rank - 1 - i
        lo, hi = padding[2 * i], padding[2 * i + 1]
        n_in = x.shape[d]
        idx = _pad_index(n_in, lo, hi, mode)
        keep = [k for k in range(len(idx)) if 0 <= k < v.shape[d]]
        m = np.zeros((len(idx), n_in), dtype=np.float32)
        m[np.arange(len(idx)), idx] = 1.0
        m = m[keep]
        v = _apply_along(b, v, b.dense_constant(m.T.copy(), acc), d)
    return b.convert(v, ctx.out_dtype())


for _n in (1, 2, 3):
    register(getattr(aten, f"replication_pad{_n}d_backward").default)(
        lambda ctx, g, x, padding: _pad_backward(ctx, g, x, padding, "replicate"))
    register(getattr(aten, f"reflection_pad{_n}d_backward").default)(
        lambda ctx, g, x, padding: _pad_backward(ctx, g, x, padding, "reflect"))


# -- fractional max pooling: window starts from the given random samples --------------
def _fractional_starts(b: Builder, u: Value, n_in: int, n_out: int, k: int) -> Value:
    """CPU's generate_intervals: int((i + u) * alpha) - int(u * alpha), the last one n_in - k; shape u + (n_out,)."""
    shape = (*u.shape, n_out)
    if n_out == 1:
        return b.constant(n_in - k, torch.int64, shape)
    alpha = b.constant((n_in - k) / (n_out - 1), torch.float32, shape)
    ub = b.broadcast_in_dim(b.convert(u, torch.float32), shape, list(range(u.rank)))
    i = b.iota(shape, u.rank, torch.float32)
    first = b.convert(b.mul(b.add(i, ub), alpha), torch.int64)  # truncation, as the C++ cast
    base = b.convert(b.mul(ub, alpha), torch.int64)
    starts = b.sub(first, base)
    last = b.compare(b.iota(shape, u.rank, torch.int64), b.constant(n_out - 1, torch.int64, shape), "EQ")
    return b.select(last, b.constant(n_in - k, torch.int64, shape), starts)


def _fractional_max_pool(ctx: LoweringContext, x: Value, kernel: list[int], output_size: list[int],
                         samples: Value, nsp: int) -> tuple[Value, Value]:
    b = ctx.b
    batched = x.rank == nsp + 2
    v = x if batched else b.reshape(x, (1, *x.shape))
    n, c = v.shape[0], v.shape[1]
    sp = v.shape[2:]
    u = b.reshape(samples, (n, c, nsp))
    # CPU's conventions: in 2d samples[..., 0] drives the width (the last dim), in 3d the first dim
    pos = []
    for d in range(nsp):
        j = nsp - 1 - d if nsp == 2 else d
        ud = b.reshape(b.slice(u, [0, 0, j], [n, c, j + 1]), (n, c))
        st = _fractional_starts(b, ud, sp[d], output_size[d], kernel[d])  # (n, c, o_d)
        full = (n, c, output_size[d], kernel[d])
        pos.append(b.add(b.broadcast_in_dim(st, full, [0, 1, 2]), b.iota(full, 3, torch.int64)))
    # window block (n, c, o_0, k_0, ..., o_{d-1}, k_{d-1}) of coordinates, gathered in one go
    block = (n, c, *[s for d in range(nsp) for s in (output_size[d], kernel[d])])
    coords = [b.iota(block, 0, torch.int64), b.iota(block, 1, torch.int64)]
    flat = None
    for d in range(nsp):
        pd = b.broadcast_in_dim(pos[d], block, [0, 1, 2 + 2 * d, 3 + 2 * d])
        coords.append(pd)
        stride = math.prod(sp[d + 1:])
        term = b.mul(pd, b.constant(stride, torch.int64, block)) if stride != 1 else pd
        flat = term if flat is None else b.add(flat, term)
    idx = b.concatenate([b.reshape(cc, (*block, 1)) for cc in coords], len(block))
    dims = ", ".join(str(i) for i in range(v.rank))
    attrs = (f"dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [{dims}], start_index_map = [{dims}], "
             f"index_vector_dim = {len(block)}>, slice_sizes = array<i64: {', '.join(['1'] * v.rank)}>, "
             "indices_are_sorted = false")
    vals = b.op1("stablehlo.gather", [v, idx], block, v.dtype, attrs=attrs)
    floating = v.dtype.is_floating_point

    body = _max_first_index_body(floating)

    init_v = b.constant(-math.inf if floating else _int_min(v.dtype), v.dtype)
    init_i = b.constant(torch.iinfo(torch.int64).max, torch.int64)
    out, inds = b.reduce_multi([vals, flat], [init_v, init_i], [3 + 2 * d for d in range(nsp)], body)
    if not batched:
        out, inds = b.reshape(out, out.shape[1:]), b.reshape(inds, inds.shape[1:])
    return out, inds


@register(aten.fractional_max_pool2d.default, aten.fractional_max_pool3d.default)
def _fractional_max_pool_lower(ctx: LoweringContext, x: Value, kernel: list[int], output_size: list[int],
                               samples: Value) -> tuple[Value, Value]:
    nsp = 2 if ctx.op is aten.fractional_max_pool2d.default else 3
    return _fractional_max_pool(ctx, x, list(kernel), list(output_size), samples, nsp)


@register(aten.fractional_max_pool2d_backward.default)
def _fractional_max_pool_backward(ctx: LoweringContext, grad: Value, x: Value, kernel: list[int],
                                  output_size: list[int], indices: Value) -> Value:
    return scatter_to_argmax(ctx, grad, x, indices, 2)


# -- output memory format ----------------------------------------------------------------
def _channels_last(t: torch.Tensor) -> bool:
    """A 4-D tensor laid out channels-last (and not also plainly contiguous)."""
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def _restride_channels_last(m: torch.Tensor | None) -> torch.Tensor | None:
    if m is None or m.dim() != 4:
        return m
    return m.contiguous(memory_format=torch.channels_last)


@register_output_layout(aten.convolution.default)
def _convolution_layout(metas: list, x: torch.Tensor, w: torch.Tensor, *rest: Any) -> list:
    """As PyTorch's CPU and CUDA kernels (not its meta kernel): a 2-D convolution of a
    channels-last input or weight returns channels-last."""
    if _channels_last(x) or _channels_last(w):
        return [_restride_channels_last(metas[0])]
    return metas


@register_output_layout(aten.convolution_backward.default)
def _convolution_backward_layout(metas: list, grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                                 *rest: Any) -> list:
    """Its input and weight gradients follow the forward's rule."""
    if _channels_last(x) or _channels_last(w) or _channels_last(grad):
        return [_restride_channels_last(metas[0]), _restride_channels_last(metas[1]), *metas[2:]]
    return metas
