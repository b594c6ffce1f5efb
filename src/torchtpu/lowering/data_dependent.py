"""Ops whose output shape depends on the data: they sync with the host.

``nonzero``, ``masked_select``, ``unique``, boolean-mask indexing and
``repeat_interleave`` with a tensor of repeats cannot be one static-shape XLA
program. Each is computed in two steps: a device program that yields the
result size (a count), read back to the host (the sync), then static-shape
programs with that size (``nonzero_static`` and friends, which are ordinary
lowerings). The list of syncing ops is in ``docs/data_dependent_ops.md``.

The same host-kernel mechanism serves ops that write to arguments their
schema does not mark as written: ``native_batch_norm`` updates the running
statistics in place, so it runs the functional variant and copies the new
statistics back.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .builder import Builder, Value
from .meta_checks import check_mask_shapes, scalar_type_name
from .registry import LoweringContext, register, register_host_kernel
from .views import check_out_overlap

aten = torch.ops.aten


# -- static-shape building blocks (lowerings) -----------------------------------
def _prefix_positions(b: Builder, flat_mask: Value) -> Value:
    """For each true element of a 1-d mask, its rank among the true elements (int64)."""
    from .reductions import _scan

    ones = b.convert(flat_mask, torch.int64)
    inclusive = _scan(b, ones, 0, "stablehlo.add", 0)
    return b.sub(inclusive, b.constant(1, torch.int64, inclusive.shape))


@register(aten.nonzero_static.default)
def _nonzero_static(ctx: LoweringContext, x: Value, size: int, fill_value: int = -1) -> Value:
    b = ctx.b
    nd = x.rank
    if nd == 0 or size == 0:
        if nd == 0 and size > 0:
            return b.constant(fill_value, torch.int64, (size, 0))
        return b.constant(fill_value, torch.int64, (size, nd))
    n = x.numel
    flat = b.reshape(b.convert(x, torch.bool), (n,))
    pos = _prefix_positions(b, flat)
    # false elements scatter out of bounds, which drops them
    target = b.select(flat, pos, b.constant(size, torch.int64, (n,)))
    lin = b.iota((n,), 0, torch.int64)
    coords = []
    for d in range(nd):
        stride = math.prod(x.shape[d + 1:])
        c = b.div(lin, b.constant(stride, torch.int64, (n,))) if stride != 1 else lin
        c = b.binary("remainder", c, b.constant(x.shape[d], torch.int64, (n,)))
        coords.append(b.reshape(c, (n, 1)))
    upd = b.concatenate(coords, 1)
    base = b.constant(fill_value, torch.int64, (size, nd))
    region = b.region([((), torch.int64), ((), torch.int64)], lambda bb, a, c: c)
    attrs = ("scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], "
             "scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
             "indices_are_sorted = true, unique_indices = true")
    return b.op1("stablehlo.scatter", [base, b.reshape(target, (n, 1)), upd], (size, nd), torch.int64,
                 attrs=attrs, region=region)


@register(aten.masked_scatter.default)
def _masked_scatter(ctx: LoweringContext, x: Value, mask: Value, source: Value) -> Value:
    """Static shape: the k-th true position of ``mask`` takes ``source.flatten()[k]``."""
    b = ctx.b
    shape = ctx.out_shape()
    n = math.prod(shape)
    xv = b.broadcast_to(b.convert(x, ctx.out_dtype()), shape)
    m = b.broadcast_to(b.convert(mask, torch.bool), shape)
    if n == 0 or source.numel == 0:
        return xv
    flat_m = b.reshape(m, (n,))
    pos = _prefix_positions(b, flat_m)
    pos = b.clamp(b.constant(0, torch.int64, (n,)), pos, b.constant(source.numel - 1, torch.int64, (n,)))
    from .indexing import take_rows

    src = b.reshape(b.convert(source, ctx.out_dtype()), (source.numel,))
    picked = take_rows(b, src, pos, 0)
    return b.select(m, b.reshape(picked, shape), xv)


# -- host kernels ----------------------------------------------------------------
def _count_true(mask: torch.Tensor) -> int:
    """The sync: how many elements of ``mask`` are nonzero, read back to the host."""
    return int(aten.count_nonzero.default(mask).item())


@register_host_kernel(aten.nonzero.default)
def nonzero(x: torch.Tensor) -> torch.Tensor:
    n = _count_true(x)
    return aten.nonzero_static.default(x, size=n, fill_value=-1)


@register_host_kernel(aten.argwhere.default)
def argwhere(x: torch.Tensor) -> torch.Tensor:
    return nonzero(x)


@register_host_kernel(aten.masked_select.default)
def masked_select(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype != torch.bool:
        raise RuntimeError("masked_select: expected BoolTensor for mask")  # CPU's wording
    xb, mb = torch.broadcast_tensors(x, mask)
    flat_idx = nonzero(mb.reshape(-1)).reshape(-1)
    return aten.index_select.default(xb.reshape(-1), 0, flat_idx)


def _prepared_indices(x: torch.Tensor, indices: list[Any]) -> list[Any]:
    """Advanced-indexing indices as the engine takes them: on ``x``'s device (CPU and CUDA index
    tensors of another device are moved, so ``x[torch.tensor([1, 3])]`` works on tpu as it does
    on CUDA), and boolean ones as their nonzero() long coordinates (one per masked dim)."""
    indices = [t.to(x.device) if isinstance(t, torch.Tensor) and t.device != x.device else t for t in indices]
    check_mask_shapes(x, indices)  # (CPU's IndexError: the coordinates would hide a mask's shape)
    expanded = _expand_bool_indices(indices)
    return expanded if expanded is not None else indices


def _expand_bool_indices(indices: list[Any]) -> list[Any] | None:
    """Boolean index tensors -> their nonzero() long coordinates (one per masked dim)."""
    if not any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in indices):
        return None
    out: list[Any] = []
    for t in indices:
        if isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8):
            nz = nonzero(t)
            out.extend(nz[:, k] for k in range(t.dim()))
        else:
            out.append(t)
    return out


def _engine(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    from ..engine import executor

    return executor.run(op, args, kwargs)


@register_host_kernel(aten.index.Tensor)
def index(x: torch.Tensor, indices: list[Any]) -> torch.Tensor:
    return _engine(aten.index.Tensor, x, _prepared_indices(x, list(indices)))


def _index_put_kernel(op: torch._ops.OpOverload):
    def kernel(x: torch.Tensor, indices: list[Any], values: torch.Tensor, accumulate: bool = False,
               *rest: Any) -> Any:
        return _engine(op, x, _prepared_indices(x, list(indices)), values, accumulate, *rest)

    return kernel


for _op in (aten.index_put.default, aten.index_put_.default):
    register_host_kernel(_op)(_index_put_kernel(_op))


@register_host_kernel(aten._index_put_impl_.default)
def _index_put_impl_(x: torch.Tensor, indices: list[Any], values: torch.Tensor, accumulate: bool = False,
                     unsafe: bool = False) -> torch.Tensor:
    # the engine lowers index_put_; `unsafe` only skips CPU-side index checks
    return _engine(aten.index_put_.default, x, _prepared_indices(x, list(indices)), values, accumulate)


@register_host_kernel(aten.repeat_interleave.Tensor)
def repeat_interleave(repeats: torch.Tensor, output_size: int | None = None) -> torch.Tensor:
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.numel() and bool((repeats < 0).any()):  # a read, as CPU's kernel makes
        raise RuntimeError("repeats can not be negative")
    total = int(repeats.sum().item()) if output_size is None else int(output_size)
    dev = repeats.device
    if total == 0:
        return torch.empty(0, dtype=repeats.dtype, device=dev)
    # marks[k] = how many source rows start at output position k; its running sum is the row id
    ends = repeats.to(torch.int64).cumsum(0)
    marks = torch.zeros(total + 1, dtype=torch.int64, device=dev)
    marks = marks.index_add(0, ends, torch.ones_like(ends))
    return marks[:total].cumsum(0).to(repeats.dtype)


@register_host_kernel(aten.equal.default)
def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    return bool((a == b).all().item())


def _unique_sorted(x: torch.Tensor, return_inverse: bool, return_counts: bool, consecutive: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dev = x.device
    flat = x.reshape(-1)
    n = flat.numel()
    if n == 0:
        empty = torch.empty(0, dtype=torch.int64, device=dev)
        return flat.clone(), torch.empty(x.shape, dtype=torch.int64, device=dev), empty
    if consecutive:
        s, order = flat, None
    else:
        s, order = torch.sort(flat, stable=True)
    new_group = torch.ones(n, dtype=torch.bool, device=dev)
    if n > 1:
        new_group[1:] = s[1:] != s[:-1]
    firsts, inverse, counts = _groups(new_group, order, return_inverse, return_counts)
    return s.index_select(0, firsts), inverse.reshape(x.shape) if return_inverse else inverse, counts


def _groups(new_group: torch.Tensor, order: torch.Tensor | None, return_inverse: bool, return_counts: bool
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The groups of a sorted run (``new_group`` marks where each starts): the positions of their
    first elements, each original element's group (``order``: the sort's permutation, None when
    unsorted), and their sizes. Reads only the number of groups; the last two are empty unless
    asked for."""
    dev = new_group.device
    group = new_group.to(torch.int64).cumsum(0) - 1
    k = _count_true(new_group)
    firsts = nonzero(new_group).reshape(-1)
    inverse = torch.empty(0, dtype=torch.int64, device=dev)
    if return_inverse:
        inverse = group if order is None else torch.empty_like(group).scatter(0, order, group)
    counts = torch.empty(0, dtype=torch.int64, device=dev)
    if return_counts:
        counts = torch.zeros(k, dtype=torch.int64, device=dev).index_add(0, group, torch.ones_like(group))
    return firsts, inverse, counts


@register_host_kernel(aten._unique2.default)
def unique2(x: torch.Tensor, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Always sorted: an unsorted unique may return any order, and CPU's is sorted too.
    return _unique_sorted(x, return_inverse, return_counts, consecutive=False)


@register_host_kernel(aten._unique.default)
def unique(x: torch.Tensor, sorted: bool = True, return_inverse: bool = False
           ) -> tuple[torch.Tensor, torch.Tensor]:
    v, inv, _ = _unique_sorted(x, return_inverse, False, consecutive=False)
    return v, inv


@register_host_kernel(aten.unique_consecutive.default)
def unique_consecutive(x: torch.Tensor, return_inverse: bool = False, return_counts: bool = False,
                       dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if dim is not None:
        return _unique_slices(x, dim, return_inverse, return_counts, consecutive=True)
    return _unique_sorted(x, return_inverse, return_counts, consecutive=True)


@register_host_kernel(aten.unique_dim.default)
def unique_dim(x: torch.Tensor, dim: int, sorted: bool = True, return_inverse: bool = False,
               return_counts: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _unique_slices(x, dim, return_inverse, return_counts, consecutive=False)


@register_host_kernel(aten.unique_dim_consecutive.default)
def unique_dim_consecutive(x: torch.Tensor, dim: int, return_inverse: bool = False, return_counts: bool = False
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _unique_slices(x, dim, return_inverse, return_counts, consecutive=True)


def _unique_slices(x: torch.Tensor, dim: int, return_inverse: bool, return_counts: bool, consecutive: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.unique(x, dim=...)``: the distinct slices along ``dim`` in lexicographic order (CPU's),
    or runs of equal neighbouring slices. The slices are sorted on the device by one stable sort per
    element of a slice, last element first (a radix sort), so the first element ranks highest."""
    dim = dim % max(x.dim(), 1)
    if any(d == 0 for i, d in enumerate(x.shape) if i != dim):
        raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique cannot be applied")
    dev = x.device
    n = x.shape[dim]
    empty = torch.empty(0, dtype=torch.int64, device=dev)
    if n == 0:
        return x.clone(), empty, empty
    moved = x.movedim(dim, 0)
    rows = moved.reshape(n, -1)
    order = torch.arange(n, device=dev)
    if not consecutive:
        for c in range(rows.shape[1] - 1, -1, -1):
            _, step = torch.sort(rows[:, c].index_select(0, order), stable=True)
            order = order.index_select(0, step)
    ranked = rows.index_select(0, order)
    new_group = torch.ones(n, dtype=torch.bool, device=dev)
    if n > 1:
        new_group[1:] = (ranked[1:] != ranked[:-1]).any(1)
    firsts, inverse, counts = _groups(new_group, order, return_inverse, return_counts)
    return moved.index_select(0, order.index_select(0, firsts)).movedim(0, dim), inverse, counts


# -- batch norm: running statistics are updated in place --------------------------
def _copy_stats(dst: torch.Tensor | None, src: torch.Tensor) -> None:
    if dst is not None:
        dst.copy_(src)


def _like_cpu(results: tuple, x: torch.Tensor, training: bool) -> tuple:
    """The saved statistics as CPU's kernel returns them: in the input's dtype, empty in eval mode.

    (PyTorch's meta kernel says float32 and (C,) instead; CPU is the reference here.)
    """
    out, mean, rstd = results
    if not training:
        empty = torch.empty(0, dtype=x.dtype, device=x.device)
        return out, empty, empty.clone()
    return out, mean.to(x.dtype), rstd.to(x.dtype)


@register_host_kernel(aten.native_batch_norm.default)
def native_batch_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                      running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
                      momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r = _native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)
    return _like_cpu(r, x, training)


def _native_batch_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                       running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
                       momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if training and running_mean is not None and running_var is not None:
        out, mean, rstd, new_rm, new_rv = _engine(aten._native_batch_norm_legit_functional.default, x, weight,
                                                  bias, running_mean, running_var, True, momentum, eps)
        _copy_stats(running_mean, new_rm)
        _copy_stats(running_var, new_rv)
        return out, mean, rstd
    if training:
        return _engine(aten._native_batch_norm_legit.no_stats, x, weight, bias, True, momentum, eps)
    return _engine(aten._native_batch_norm_legit_no_training.default, x, weight, bias, running_mean, running_var,
                   momentum, eps)


@register_host_kernel(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                            running_mean: torch.Tensor, running_var: torch.Tensor, training: bool, momentum: float,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@register_host_kernel(aten._batch_norm_with_update.default)
def batch_norm_with_update(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                           running_mean: torch.Tensor, running_var: torch.Tensor, momentum: float, eps: float
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    out, mean, rstd = native_batch_norm(x, weight, bias, running_mean, running_var, True, momentum, eps)
    reserve = torch.empty(0, dtype=torch.uint8, device=x.device)
    return out, mean, rstd, reserve


def _into(out: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    if out.dtype != r.dtype:
        raise RuntimeError(f"Expected out tensor to have dtype {r.dtype}, but got {out.dtype} instead")
    if tuple(out.shape) != tuple(r.shape):
        out.resize_(r.shape)
    out.copy_(r)
    return out


@register_host_kernel(aten.nonzero.out)
def nonzero_out(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return _into(out, nonzero(x))


@register_host_kernel(aten.masked_select.out)
def masked_select_out(x: torch.Tensor, mask: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    check_out_overlap(out, x, mask)
    return _into(out, masked_select(x, mask))


# -- factory out= variants whose functional twin has a different argument list ----
def _factory_out(functional: torch._ops.OpOverload, nargs: int):
    def kernel(*args: Any, out: torch.Tensor) -> torch.Tensor:
        r = functional(*args[:nargs], dtype=out.dtype, device=out.device)
        return _into(out, r)

    return kernel


register_host_kernel(aten.arange.out)(_factory_out(aten.arange.default, 1))
register_host_kernel(aten.arange.start_out)(_factory_out(aten.arange.start_step, 3))
register_host_kernel(aten.linspace.out)(_factory_out(aten.linspace.default, 3))
register_host_kernel(aten.logspace.out)(_factory_out(aten.logspace.default, 4))
register_host_kernel(aten.eye.out)(_factory_out(aten.eye.default, 1))
register_host_kernel(aten.eye.m_out)(_factory_out(aten.eye.m, 2))


@register_host_kernel(aten.bincount.default)
def bincount(x: torch.Tensor, weights: torch.Tensor | None = None, minlength: int = 0) -> torch.Tensor:
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:  # CPU's dispatch, first
        raise NotImplementedError(f'"bincount_cpu" not implemented for \'{scalar_type_name(x.dtype)}\'')
    if x.dim() != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and weights.shape != x.shape:
        raise RuntimeError("weights should be 1-d and have the same length as input")
    n = minlength
    if x.numel():
        if int(x.min().item()) < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        n = max(int(x.max().item()) + 1, minlength)  # the sync: the output size is the largest value
    if weights is None:
        dtype, src = torch.int64, torch.ones(x.shape, dtype=torch.int64, device=x.device)
    else:
        dtype = weights.dtype if weights.dtype in (torch.float32, torch.float64) else torch.float64
        src = weights.to(dtype)
    return torch.zeros(n, dtype=dtype, device=x.device).index_add(0, x.to(torch.int64), src)


# -- complex <-> real views: the same storage read as the other dtype ------------
@register_host_kernel(aten.view_as_real.default)
def view_as_real(t: torch.Tensor) -> torch.Tensor:
    if not t.is_complex():
        raise RuntimeError("view_as_real is only supported for complex tensors")
    part = torch.float32 if t.dtype == torch.complex64 else torch.float64
    flat = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0).view(part)
    return flat.as_strided((*t.shape, 2), (*[2 * s for s in t.stride()], 1), 2 * t.storage_offset())


@register_host_kernel(aten.view_as_complex.default)
def view_as_complex(t: torch.Tensor) -> torch.Tensor:
    if t.dtype not in (torch.float32, torch.float64):
        raise RuntimeError("view_as_complex is only supported for float and double tensors, but got a tensor of "
                           f"scalar type: {t.dtype}")
    if t.dim() == 0 or t.shape[-1] != 2:
        raise RuntimeError("Tensor must have a last dimension of size 2")
    if t.stride(-1) != 1:
        raise RuntimeError("Tensor must have a last dimension with stride 1")
    if any(s % 2 for s in t.stride()[:-1]) or t.storage_offset() % 2:
        raise RuntimeError("Tensor must have a stride divisible by 2 for all but last dimension")
    cplx = torch.complex64 if t.dtype == torch.float32 else torch.complex128
    n = t.untyped_storage().nbytes() // t.element_size()
    flat = t.as_strided((n - n % 2,), (1,), 0).view(cplx)
    return flat.as_strided(t.shape[:-1], [s // 2 for s in t.stride()[:-1]], t.storage_offset() // 2)


@register_host_kernel(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad: torch.Tensor, x: torch.Tensor, kernel_size: list[int],
                                   output_size: list[int], indices: torch.Tensor) -> torch.Tensor:
    # PyTorch has no meta kernel for this op (the engine needs one); the output is x-shaped, so the
    # scatter-add is written with ordinary tpu ops instead.
    lead = x.dim() - 3
    flat_x = torch.zeros((*x.shape[:lead], x.shape[-3:].numel()), dtype=grad.dtype, device=x.device)
    g = grad.reshape(*grad.shape[:lead], -1)
    i = indices.reshape(*indices.shape[:lead], -1)
    return flat_x.scatter_add(lead, i, g).reshape(x.shape)


@register_host_kernel(aten.rrelu_with_noise.default)
def rrelu_with_noise(x: torch.Tensor, noise: torch.Tensor, lower: float = 0.125, upper: float = 1.0 / 3.0,
                     training: bool = False, generator: torch.Generator | None = None) -> torch.Tensor:
    # the schema writes `noise` and returns a new tensor: the functional variant, then a copy back
    out, new_noise = _engine(aten.rrelu_with_noise_functional.default, x, noise, lower, upper, training, generator)
    if training:
        noise.copy_(new_noise)
    return out
