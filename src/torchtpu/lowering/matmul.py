"""Matrix products with TPU numerics.

XLA's CPU backend ignores ``precision_config``, so the passes a TPU's bf16
matrix unit makes are emitted explicitly: ``medium`` rounds f32 operands to
bf16 and accumulates in f32 (1 pass); ``high`` splits each operand into
hi + lo bf16 parts and sums 3 products; ``highest`` splits into 3 parts and
sums 6 products (f32-accurate).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..engine import precision
from ..runtime import cpu_kernels
from . import target
from .builder import Builder, Value
from .fft import conj
from .registry import LoweringContext, register

aten = torch.ops.aten


def _split(b: Builder, x: Value, parts: int) -> list[Value]:
    """``x`` (f32) as ``parts`` bf16 values that sum to it, largest first; for more than one part,
    one more entry: the first part with its infinities and NaNs zeroed, which the cross products
    (:func:`_pass_operands`) take. An infinite x has no finite remainder (inf - inf is NaN), so
    its low parts are 0, and inf times another operand's zero low part would make the sum NaN
    where the CPU's product is inf; the first-by-first product alone carries them."""
    hi = b.convert(x, torch.bfloat16)
    out = [hi]
    if parts == 1:
        return out
    hi32 = b.convert(hi, torch.float32)
    finite = b.op1("stablehlo.is_finite", [hi32], hi32.shape, torch.bool)
    zero = b.constant(0.0, torch.float32, hi32.shape)
    rest = b.select(finite, b.sub(x, hi32), zero)
    for i in range(1, parts):
        part = b.convert(rest, torch.bfloat16)
        out.append(part)
        if i + 1 < parts:
            rest = b.sub(rest, b.convert(part, torch.float32))
    out.append(b.convert(b.select(finite, hi32, zero), torch.bfloat16))
    return out


def _pass_operands(left: list[Value], right: list[Value], i: int, j: int) -> tuple[Value, Value]:
    """The split parts (:func:`_split`) that the (i, j) pass multiplies: the first parts as they
    are in the first-by-first product, their finite forms in the cross products."""
    finite = len(left) - 1
    return left[finite if i == 0 and j else i], right[finite if j == 0 and i else j]


# (i, j) pairs of split parts whose products each pass sums, smallest first.
_PASSES = {"medium": [(0, 0)], "high": [(1, 0), (0, 1), (0, 0)],
           "highest": [(2, 0), (1, 1), (0, 2), (1, 0), (0, 1), (0, 0)]}


def _fold_transpose(b: Builder, x: Value, batch: Sequence[int], contract: Sequence[int]
                    ) -> tuple[Value, list[int], list[int]]:
    """Read a transposed operand through the dot's dimension numbers instead.

    XLA's CPU backend does not fold a transpose sitting in front of a dot (behind the
    bf16 convert of TPU precision) and materializes it: ~3x the dot's own time for a
    linear layer's ``x @ w.t()``. Exact when the free dims keep their order. A left
    operand that ends up contracted over a leading dim (``x.t() @ g``, a weight
    gradient) is then laid out row-major by :func:`_row_major_lhs`.
    """
    src = b.transpose_source(x)
    if src is None:
        return x, list(batch), list(contract)
    operand, perm = src
    new_batch = [perm[d] for d in batch]
    new_contract = [perm[d] for d in contract]
    free = [perm[d] for d in range(x.rank) if d not in batch and d not in contract]
    if free != sorted(free):
        return x, list(batch), list(contract)
    return operand, new_batch, new_contract


def _row_major_lhs(b: Builder, x: Value, batch: Sequence[int], contract: Sequence[int]
                   ) -> tuple[Value, list[int], list[int]]:
    """The left operand laid out (batch, free, contracting), transposed in a way XLA keeps.

    XLA's CPU backend runs a bf16 dot whose left operand is contracted over a leading dim
    (``x.t() @ g``: every weight gradient) as an f32 dot on a transposed read, about 1.5x
    the time of transposing first and running the bf16 product. A swap of the last two dims
    goes to torchtpu's host transpose kernel where it is registered (XLA's own transpose
    loop costs ~1 ns per element, ~4x the kernel). Otherwise, as XLA's TransposeFolding pass
    folds any 2-D transpose back into the dot, the transpose is written on a view with one
    even dim split in two: the same permutation, not a row-column transpose.
    """
    free = [d for d in range(x.rank) if d not in batch and d not in contract]
    order = [*batch, *free, *contract]
    if order == list(range(x.rank)) or not target.xla_cpu():
        return x, list(batch), list(contract)
    new_batch = list(range(len(batch)))
    new_contract = list(range(len(batch) + len(free), x.rank))
    kernel = cpu_kernels.transpose_target()
    nb = len(batch)
    if (kernel is not None and list(batch) == list(range(nb)) and order[nb:] == [nb + 1, nb]
            and x.dtype in (torch.float32, torch.bfloat16)):
        shape = [*x.shape[:nb], x.shape[nb + 1], x.shape[nb]]
        return b.custom_call(kernel, [x], shape, x.dtype), new_batch, new_contract
    split = next((d for d in range(x.rank) if x.shape[d] >= 2 and x.shape[d] % 2 == 0), None)
    if split is None:
        return b.transpose(x, order), new_batch, new_contract
    halves = (*x.shape[:split], 2, x.shape[split] // 2, *x.shape[split + 1:])
    perm: list[int] = []
    for d in order:
        perm.extend([split, split + 1] if d == split else [d if d < split else d + 1])
    moved = b.transpose(b.reshape(x, halves), perm)
    return b.reshape(moved, [x.shape[d] for d in order]), new_batch, new_contract


def dot(ctx: LoweringContext, a: Value, c: Value, batch: tuple[Sequence[int], Sequence[int]],
        contract: tuple[Sequence[int], Sequence[int]], out_dtype: torch.dtype) -> Value:
    """dot_general with TPU numerics for the operands' dtype and the precision in force."""
    b = ctx.b
    a, ab, ac = _fold_transpose(b, a, batch[0], contract[0])
    c, cb, cc = _fold_transpose(b, c, batch[1], contract[1])
    batch, contract = (ab, cb), (ac, cc)
    common = torch.promote_types(a.dtype, c.dtype)
    if common == torch.float32:
        precision.note_float32_product(ctx.precision)
    if not (common.is_floating_point or common.is_complex) and target.elementwise_integer_products():
        wide = torch.int64 if common == torch.bool else common
        return b.convert(elementwise_dot(b, b.convert(a, wide), b.convert(c, wide), batch, contract), out_dtype)
    if target.native_dot_precision():
        r = _native_dot(ctx, a, c, batch, contract, common)
        if out_dtype == torch.bfloat16 and common == torch.bfloat16 and _has_vector_operand(a, c, batch, contract):
            return b.rounded_to_bf16(r)  # the f32 multiply and sum must stay f32: see rounded_to_bf16
        return b.convert(r, out_dtype)
    if common == torch.float32:
        passes = _PASSES[ctx.precision]
        nparts = max(max(i, j) for i, j in passes) + 1
        pa, pc = _split(b, b.convert(a, torch.float32), nparts), _split(b, b.convert(c, torch.float32), nparts)
        # The bf16 parts enter the dot as bf16, or widened to f32 where that is faster (same
        # numbers). Both operands' parts are widened before any layout, so that a gradient
        # feeding a weight gradient (through the transpose kernel) and its input gradient
        # (`g @ w`) is one value in both: XLA then computes it once. Widened by the kernel
        # instead, it fused the gradient's producer (a GELU or LayerNorm backward) twice, once
        # per form: ~2.5% of a DeferAndFuse GPT step on AVX2.
        part_dtype = torch.bfloat16 if target.bf16_dots() else torch.float32
        pa, pc = [b.convert(part, part_dtype) for part in pa], [b.convert(part, part_dtype) for part in pc]
        lhs_batch, lhs_contract = batch[0], contract[0]
        for k, part in enumerate(pa):
            pa[k], lhs_batch, lhs_contract = _row_major_lhs(b, part, batch[0], contract[0])
        batch, contract = (lhs_batch, batch[1]), (lhs_contract, contract[1])
        acc = None
        for i, j in passes:
            p = b.dot_general(*_pass_operands(pa, pc, i, j), batch, contract, torch.float32)
            acc = p if acc is None else b.add(acc, p)
        return b.convert(acc, out_dtype)
    if common == torch.bfloat16:
        # bf16 x bf16 products are exact in f32, so widening first is the same arithmetic as a
        # bf16 pass with f32 accumulation; XLA's CPU runtime rejects some mixed bf16->f32 dots.
        r = b.dot_general(b.convert(a, torch.float32), b.convert(c, torch.float32), batch, contract, torch.float32)
        return b.convert(r, out_dtype)
    if common == torch.float16:
        r = b.dot_general(b.convert(a, torch.float32), b.convert(c, torch.float32), batch, contract, torch.float32)
        return b.convert(r, out_dtype)
    if common == torch.bool:
        r = b.dot_general(b.convert(a, torch.int64), b.convert(c, torch.int64), batch, contract, torch.int64)
        return b.convert(r, out_dtype)
    return b.convert(b.dot_general(b.convert(a, common), b.convert(c, common), batch, contract, common), out_dtype)


# torch's matmul precision -> the precision_config whose passes a TPU's matrix unit makes.
NATIVE_PRECISION = {"medium": "DEFAULT", "high": "HIGH", "highest": "HIGHEST"}


def _native_dot(ctx: LoweringContext, a: Value, c: Value, batch: tuple[Sequence[int], Sequence[int]],
                contract: tuple[Sequence[int], Sequence[int]], common: torch.dtype) -> Value:
    """The product on a compiler that makes the bf16 passes itself (a TPU).

    f32 takes the passes of the precision in force; bf16 operands enter as they are (their
    products are exact, sums f32); f16, f64 and complex products are exact (HIGHEST), as on
    the CPU emulator. (Integers are :func:`elementwise_dot`'s.)
    """
    b = ctx.b
    if common == torch.float32:
        return b.dot_general(b.convert(a, common), b.convert(c, common), batch, contract, common,
                             precision=NATIVE_PRECISION[ctx.precision])
    if common == torch.bfloat16:
        a, c = b.convert(a, common), b.convert(c, common)
        if _has_vector_operand(a, c, batch, contract):
            # A v5e's compiler turns a product with a vector operand into a multiply and a sum,
            # and took the multiply in bf16: each product rounded before the f32 sum (a bf16
            # `mv` 0.33 off CPU on O(100) values, measured). Written as an f32 multiply and sum
            # (what XLA would make of it) whose bf16 result the caller rounds in integers, the
            # products stay exact, as the matrix unit's are.
            return elementwise_dot(b, b.convert(a, torch.float32), b.convert(c, torch.float32), batch, contract)
        return b.dot_general(a, c, batch, contract, torch.float32)
    wide = torch.float32 if common == torch.float16 else common
    return b.dot_general(b.convert(a, wide), b.convert(c, wide), batch, contract, wide, precision="HIGHEST")


def _has_vector_operand(a: Value, c: Value, batch: tuple[Sequence[int], Sequence[int]],
                        contract: tuple[Sequence[int], Sequence[int]]) -> bool:
    """Whether an operand has no free dimension of size above 1 (mv, dot, vector @ matrix, and
    a one-row batched product such as decoding attention's ``[B, H, 1, D] @ [B, H, D, S]``: XLA
    drops size-1 dimensions before it picks the multiply-and-sum form)."""
    def vector(x: Value, b: Sequence[int], k: Sequence[int]) -> bool:
        return all(x.shape[d] == 1 for d in range(x.rank) if d not in b and d not in k)
    return vector(a, batch[0], contract[0]) or vector(c, batch[1], contract[1])


def elementwise_dot(b: Builder, a: Value, c: Value, batch: tuple[Sequence[int], Sequence[int]],
                    contract: tuple[Sequence[int], Sequence[int]]) -> Value:
    """dot_general as a broadcast product summed over the contracting dims.

    Exact for integers where the compiler has no integer matrix product (a TPU refuses 64-bit
    ones); it materializes batch x free x free x contracting products, so it suits the small
    integer products models make, not large ones.
    """
    (ab, cb), (ac, cc) = batch, contract
    a_free = [d for d in range(a.rank) if d not in ab and d not in ac]
    c_free = [d for d in range(c.rank) if d not in cb and d not in cc]
    nb, nfa, nfc, nk = len(ab), len(a_free), len(c_free), len(ac)
    full = ([a.shape[d] for d in ab] + [a.shape[d] for d in a_free] + [c.shape[d] for d in c_free]
            + [a.shape[d] for d in ac])
    k_dims = list(range(nb + nfa + nfc, nb + nfa + nfc + nk))
    wide_a = b.broadcast_in_dim(b.transpose(a, [*ab, *a_free, *ac]), full,
                                [*range(nb + nfa), *k_dims])
    wide_c = b.broadcast_in_dim(b.transpose(c, [*cb, *c_free, *cc]), full,
                                [*range(nb), *range(nb + nfa, nb + nfa + nfc), *k_dims])
    return b.reduce(b.mul(wide_a, wide_c), k_dims, b.constant(0, a.dtype), "stablehlo.add")


@register(aten.mm.default)
def _mm(ctx: LoweringContext, a: Value, c: Value) -> Value:
    return dot(ctx, a, c, ([], []), ([1], [0]), ctx.out_dtype())


@register(aten.bmm.default)
def _bmm(ctx: LoweringContext, a: Value, c: Value) -> Value:
    return dot(ctx, a, c, ([0], [0]), ([2], [1]), ctx.out_dtype())


@register(aten.mv.default)
def _mv(ctx: LoweringContext, a: Value, v: Value) -> Value:
    return dot(ctx, a, v, ([], []), ([1], [0]), ctx.out_dtype())


@register(aten.dot.default)
def _dot(ctx: LoweringContext, a: Value, v: Value) -> Value:
    return dot(ctx, a, v, ([], []), ([0], [0]), ctx.out_dtype())


@register(aten.vdot.default)
def _vdot(ctx: LoweringContext, a: Value, v: Value) -> Value:
    """dot with the first operand conjugated."""
    return dot(ctx, conj(ctx.b, a), v, ([], []), ([0], [0]), ctx.out_dtype())


def _product_dtype(out: torch.dtype) -> torch.dtype:
    """The dtype an addmm-style product is taken in before its scaled sum: f32 for the
    float types below it, else the output's own (f64, complex)."""
    return out if out == torch.float64 or out.is_complex else torch.float32


def _scaled_sum(ctx: LoweringContext, inp: Value, prod: Value, beta: Any, alpha: Any,
                keep_f32_work: bool = False) -> Value:
    """beta * inp + alpha * prod in f32 for 16-bit outputs. ``keep_f32_work``: the bf16 result
    rounded in integers (``Builder.rounded_to_bf16``), for a product the compiler would otherwise
    take as bf16 multiplies (a matrix-vector product: see ``_native_dot``)."""
    b = ctx.b
    out = ctx.out_dtype()

    def rounded(v: Value) -> Value:
        return b.rounded_to_bf16(v) if keep_f32_work and out == torch.bfloat16 else b.convert(v, out)

    shape = ctx.out_shape()
    acc = torch.float32 if out in (torch.bfloat16, torch.float16) else out
    p = b.convert(prod, acc)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        p = b.mul(p, ctx.scalar(alpha, acc, shape))
    if isinstance(beta, (int, float)) and beta == 0:
        return rounded(p)
    i = b.broadcast_to(b.convert(inp, acc), shape)
    if not (isinstance(beta, (int, float)) and beta == 1):
        i = b.mul(i, ctx.scalar(beta, acc, shape))
    return rounded(b.add(i, p))


@register(aten.addmm.default)
def _addmm(ctx: LoweringContext, inp: Value, a: Value, c: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    prod = dot(ctx, a, c, ([], []), ([1], [0]), _product_dtype(ctx.out_dtype()))
    return _scaled_sum(ctx, inp, prod, beta, alpha,
                       keep_f32_work=_has_vector_operand(a, c, ([], []), ([1], [0])))  # a one-row Linear


@register(aten.baddbmm.default)
def _baddbmm(ctx: LoweringContext, inp: Value, a: Value, c: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    prod = dot(ctx, a, c, ([0], [0]), ([2], [1]), _product_dtype(ctx.out_dtype()))
    return _scaled_sum(ctx, inp, prod, beta, alpha, keep_f32_work=_has_vector_operand(a, c, ([0], [0]), ([2], [1])))


@register(aten.addmv.default)
def _addmv(ctx: LoweringContext, inp: Value, a: Value, v: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    prod = dot(ctx, a, v, ([], []), ([1], [0]), _product_dtype(ctx.out_dtype()))
    return _scaled_sum(ctx, inp, prod, beta, alpha, keep_f32_work=True)


@register(aten.addbmm.default)
def _addbmm(ctx: LoweringContext, inp: Value, a: Value, c: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    out = ctx.out_dtype()
    if out in (torch.bfloat16, torch.float16) and a.shape[0] > 0:
        # CPU accumulates batch by batch with addmm_, rounding to the dtype after each one.
        b = ctx.b
        r = None
        for i in range(a.shape[0]):
            ai = b.reshape(b.slice(a, [i, 0, 0], [i + 1, *a.shape[1:]]), a.shape[1:])
            ci = b.reshape(b.slice(c, [i, 0, 0], [i + 1, *c.shape[1:]]), c.shape[1:])
            prod = dot(ctx, ai, ci, ([], []), ([1], [0]), torch.float32)
            r = _scaled_sum(ctx, inp, prod, beta, alpha) if r is None else _scaled_sum(ctx, r, prod, 1, alpha)
        return r
    # Sum over the batch too: one dot_general contracting (batch, k).
    prod = dot(ctx, a, c, ([], []), ([0, 2], [0, 1]), _product_dtype(ctx.out_dtype()))
    return _scaled_sum(ctx, inp, prod, beta, alpha)


@register(aten.addr.default)
def _addr(ctx: LoweringContext, inp: Value, v1: Value, v2: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    """beta * self + alpha * v1 * v2, each product rounded to the dtype like CPU's elementwise kernel."""
    b = ctx.b
    out = ctx.out_dtype()
    shape = ctx.out_shape()
    x1 = b.broadcast_in_dim(b.convert(v1, out), shape, [0])
    x2 = b.broadcast_in_dim(b.convert(v2, out), shape, [1])
    if out == torch.bool:
        prod = b.binary("and", x1, x2)
        if isinstance(beta, (int, float)) and not beta:
            return prod
        return b.binary("or", b.broadcast_to(b.convert(inp, out), shape), prod)

    def rnd(v: Value) -> Value:
        return b.convert(v, out)

    acc = torch.float32 if out in (torch.bfloat16, torch.float16) else out

    def up(v: Value) -> Value:
        return b.convert(v, acc)

    # the scalars are converted to the tensor dtype first, as CPU's kernel does
    al, be = up(rnd(ctx.scalar(alpha, acc, shape))), up(rnd(ctx.scalar(beta, acc, shape)))
    term = up(rnd(b.mul(up(rnd(b.mul(al, up(x1)))), up(x2))))
    base = up(rnd(b.mul(be, up(b.broadcast_to(b.convert(inp, out), shape)))))
    # beta == 0 ignores self entirely (NaN included)
    r = b.select(b.compare(be, b.constant(0, acc, shape), "EQ"), term, b.add(base, term))
    return rnd(r)


@register(aten._scaled_mm.default)
def _scaled_mm(ctx: LoweringContext, a: Value, c: Value, scale_a: Value, scale_b: Value, bias: Value | None = None,
               scale_result: Value | None = None, out_dtype: Any = None, use_fast_accum: bool = False) -> Value:
    """A float8 matrix product: (a @ c) in f32 times the tensor-wise or row-wise scales, plus the
    bias, in the output dtype. float8 values are exact in bf16, so the default one-pass product
    is exact per term and accumulates in f32, as a TPU's matrix unit does. ``scale_result`` is
    ignored, as PyTorch's CPU kernel ignores it."""
    b = ctx.b
    f32 = torch.float32
    prod = dot(ctx, b.convert(a, f32), b.convert(c, f32), ([], []), ([1], [0]), f32)
    shape = prod.shape
    for scale, dim in ((scale_a, 0), (scale_b, 1)):
        if scale.numel == 1:
            s = ctx.scalar(scale, f32, shape)
        else:  # row-wise: (m, 1) for a, (1, n) for b
            s = b.broadcast_in_dim(b.reshape(b.convert(scale, f32), (shape[dim],)), shape, [dim])
        prod = b.mul(prod, s)
    if bias is not None:
        prod = b.add(prod, b.broadcast_in_dim(b.convert(bias, f32), shape, [1]))
    return b.convert(prod, ctx.out_dtype())
