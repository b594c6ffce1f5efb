"""Fused LSTM and GRU cells: what ``nn.LSTM`` and ``nn.GRU`` call on an accelerator.

For CUDA, XPU and PrivateUse1 tensors, ATen's RNN layers compute the gate products
with matmuls and hand the rest of each cell to ``_thnn_fused_lstm_cell`` /
``_thnn_fused_gru_cell`` (their backward: ``_thnn_fused_lstm_cell_backward_impl``,
``_thnn_fused_gru_cell_backward``). PyTorch implements them for CUDA only. These are
the same element-wise math in the op math type (aten/src/ATen/native/cuda/RNN.cu),
including the workspace each forward saves for its backward:
LSTM ``[i, f, g, o]`` (activated gates), GRU ``[r, z, n, hx, hn + b_hn]``.
"""

from __future__ import annotations

import torch

from .builder import Builder, Value
from .elementwise import opmath
from .reductions import reduce_sum
from .registry import LoweringContext, register

aten = torch.ops.aten


def _chunks(b: Builder, v: Value, n: int) -> list[Value]:
    """The n gate blocks of a (batch, n * hidden) value."""
    h = v.shape[1] // n
    return [b.slice(v, [0, k * h], [v.shape[0], (k + 1) * h]) for k in range(n)]


def _bias_chunks(b: Builder, bias: Value | None, n: int, shape: tuple[int, ...], acc: torch.dtype) -> list[Value]:
    if bias is None:
        return [b.constant(0.0, acc, shape)] * n
    h = bias.shape[0] // n
    v = b.convert(bias, acc)
    return [b.broadcast_in_dim(b.slice(v, [k * h], [(k + 1) * h]), shape, [1]) for k in range(n)]


def _sigmoid(b: Builder, x: Value) -> Value:
    return b.unary("logistic", x)


def _one_minus(b: Builder, x: Value) -> Value:
    return b.sub(b.constant(1.0, x.dtype, x.shape), x)


@register(aten._thnn_fused_lstm_cell.default)
def _lstm_cell(ctx: LoweringContext, input_gates: Value, hidden_gates: Value, cx: Value,
               input_bias: Value | None = None, hidden_bias: Value | None = None) -> tuple[Value, Value, Value]:
    b = ctx.b
    dtype = input_gates.dtype
    acc = opmath(dtype)
    shape = cx.shape
    ins = _chunks(b, b.convert(input_gates, acc), 4)
    hid = _chunks(b, b.convert(hidden_gates, acc), 4)
    b1 = _bias_chunks(b, input_bias, 4, shape, acc)
    b2 = _bias_chunks(b, hidden_bias, 4, shape, acc)
    pre = [b.add(b.add(b.add(ins[k], hid[k]), b1[k]), b2[k]) for k in range(4)]
    ig, fg, og = _sigmoid(b, pre[0]), _sigmoid(b, pre[1]), _sigmoid(b, pre[3])
    cg = b.unary("tanh", pre[2])
    cy = b.add(b.mul(fg, b.convert(cx, acc)), b.mul(ig, cg))
    hy = b.mul(og, b.unary("tanh", cy))
    workspace = b.concatenate([b.convert(g, dtype) for g in (ig, fg, cg, og)], 1)
    return b.convert(hy, dtype), b.convert(cy, dtype), workspace


@register(aten._thnn_fused_lstm_cell_backward_impl.default)
def _lstm_cell_backward(ctx: LoweringContext, grad_hy: Value | None, grad_cy: Value | None, cx: Value, cy: Value,
                        workspace: Value, has_bias: bool) -> tuple[Value, Value, Value | None]:
    b = ctx.b
    dtype = workspace.dtype
    acc = opmath(dtype)
    shape = cx.shape
    ig, fg, cg, og = (b.convert(g, acc) for g in _chunks(b, workspace, 4))
    zero = b.constant(0.0, acc, shape)
    go = b.convert(grad_hy, acc) if grad_hy is not None else zero
    goc = b.convert(grad_cy, acc) if grad_cy is not None else zero
    tanh_cy = b.unary("tanh", b.convert(cy, acc))
    gog = b.mul(go, tanh_cy)
    gcx = b.add(b.mul(b.mul(go, og), _one_minus(b, b.mul(tanh_cy, tanh_cy))), goc)
    gig = b.mul(b.mul(b.mul(gcx, cg), _one_minus(b, ig)), ig)
    gfg = b.mul(b.mul(b.mul(gcx, b.convert(cx, acc)), _one_minus(b, fg)), fg)
    gcg = b.mul(b.mul(gcx, ig), _one_minus(b, b.mul(cg, cg)))
    gog = b.mul(b.mul(gog, _one_minus(b, og)), og)
    grad_gates = b.concatenate([b.convert(g, dtype) for g in (gig, gfg, gcg, gog)], 1)
    grad_cx = b.convert(b.mul(gcx, fg), dtype)
    # CUDA sums the stored (rounded) gate gradients
    grad_bias = reduce_sum(b, b.convert(grad_gates, acc), [0]) if has_bias else None
    return grad_gates, grad_cx, None if grad_bias is None else b.convert(grad_bias, dtype)


@register(aten._thnn_fused_gru_cell.default)
def _gru_cell(ctx: LoweringContext, input_gates: Value, hidden_gates: Value, hx: Value,
              input_bias: Value | None = None, hidden_bias: Value | None = None) -> tuple[Value, Value]:
    b = ctx.b
    dtype = input_gates.dtype
    acc = opmath(dtype)
    shape = hx.shape
    ir, ii, in_ = _chunks(b, b.convert(input_gates, acc), 3)
    hr, hi, hn = _chunks(b, b.convert(hidden_gates, acc), 3)
    b1r, b1i, b1n = _bias_chunks(b, input_bias, 3, shape, acc)
    b2r, b2i, b2n = _bias_chunks(b, hidden_bias, 3, shape, acc)
    rg = _sigmoid(b, b.add(b.add(b.add(ir, hr), b1r), b2r))
    ig = _sigmoid(b, b.add(b.add(b.add(ii, hi), b1i), b2i))
    hn_b = b.add(hn, b2n)
    ng = b.unary("tanh", b.add(b.add(in_, b1n), b.mul(rg, hn_b)))
    h = b.convert(hx, acc)
    hy = b.add(ng, b.mul(ig, b.sub(h, ng)))
    workspace = b.concatenate([b.convert(v, dtype) for v in (rg, ig, ng)] + [hx, b.convert(hn_b, dtype)], 1)
    return b.convert(hy, dtype), workspace


@register(aten._thnn_fused_gru_cell_backward.default)
def _gru_cell_backward(ctx: LoweringContext, grad_hy: Value, workspace: Value, has_bias: bool) -> tuple:
    b = ctx.b
    dtype = workspace.dtype
    acc = opmath(dtype)
    rg, ig, ng, hx, hn = (b.convert(v, acc) for v in _chunks(b, workspace, 5))
    go = b.convert(grad_hy, acc)
    gig = b.mul(b.mul(b.mul(go, b.sub(hx, ng)), _one_minus(b, ig)), ig)
    ghx = b.mul(go, ig)
    gin = b.mul(b.mul(go, _one_minus(b, ig)), _one_minus(b, b.mul(ng, ng)))
    ghn = b.mul(gin, rg)
    grg = b.mul(b.mul(b.mul(gin, hn), _one_minus(b, rg)), rg)
    grad_input = b.concatenate([b.convert(g, dtype) for g in (grg, gig, gin)], 1)
    grad_hidden = b.concatenate([b.convert(g, dtype) for g in (grg, gig, ghn)], 1)
    bias_grads: tuple[Value | None, Value | None] = (None, None)
    if has_bias:
        bias_grads = tuple(b.convert(reduce_sum(b, b.convert(g, acc), [0]), dtype)  # type: ignore[assignment]
                           for g in (grad_input, grad_hidden))
    return grad_input, grad_hidden, b.convert(ghx, dtype), *bias_grads


# PyTorch has no meta kernels for the GRU cell, and its LSTM cell's fails without biases
# (it reads their device): the engine needs the output metadata of both.
def _check_cell_sizes(name: str, input_gates: torch.Tensor, hidden_gates: torch.Tensor, prev: torch.Tensor,
                      biases: tuple[torch.Tensor | None, torch.Tensor | None], factor: int) -> None:
    torch._check(input_gates.dim() == 2 and input_gates.shape == hidden_gates.shape,
                 lambda: f"{name}: input_gates {tuple(input_gates.shape)} and hidden_gates "
                         f"{tuple(hidden_gates.shape)} must be the same 2-D shape")
    torch._check(prev.dim() == 2 and input_gates.shape[0] * input_gates.shape[1] == factor * prev.numel(),
                 lambda: f"{name}: the previous state {tuple(prev.shape)} does not match gates "
                         f"{tuple(input_gates.shape)} ({factor} gates)")
    for bias in biases:
        torch._check(bias is None or (bias.dim() == 1 and bias.shape[0] == input_gates.shape[1]),
                     lambda: f"{name}: a bias must be 1-D with {input_gates.shape[1]} elements")


def _lstm_cell_meta(input_gates: torch.Tensor, hidden_gates: torch.Tensor, cx: torch.Tensor,
                    input_bias: torch.Tensor | None = None,
                    hidden_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_cell_sizes("_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, (input_bias, hidden_bias), 4)
    return torch.empty_like(cx), torch.empty_like(cx), torch.empty_like(input_gates)


def _gru_cell_meta(input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor,
                   input_bias: torch.Tensor | None = None,
                   hidden_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    _check_cell_sizes("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, (input_bias, hidden_bias), 3)
    return torch.empty_like(hx), hx.new_empty((hx.shape[0], 5 * hx.shape[1]))


def _gru_cell_backward_meta(grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool) -> tuple:
    torch._check(grad_hy.dim() == 2 and tuple(workspace.shape) == (grad_hy.shape[0], 5 * grad_hy.shape[1]),
                 lambda: "fused_gru_cell_backward: workspace must be (batch, 5 * hidden)")
    n, h = grad_hy.shape
    gates = workspace.new_empty((n, 3 * h))
    bias = workspace.new_empty((3 * h,)) if has_bias else None
    return gates, gates.clone(), torch.empty_like(grad_hy), bias, None if bias is None else bias.clone()


_meta_lib = torch.library.Library("aten", "IMPL")
_meta_lib.impl("_thnn_fused_lstm_cell", _lstm_cell_meta, "Meta")
_meta_lib.impl("_thnn_fused_gru_cell", _gru_cell_meta, "Meta")
_meta_lib.impl("_thnn_fused_gru_cell_backward", _gru_cell_backward_meta, "Meta")
