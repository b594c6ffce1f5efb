"""Reading a strided view out of a flat storage, and writing one back.

Every program takes whole storage buffers as inputs and reshapes each to its
flat 1-D storage (a buffer has the dims of the result that made it, see
:func:`dense_to_storage`; its row-major elements are the storage). A tensor argument is a
(dtype, shape, stride, offset) window on one of them; the program itself cuts
the window out (a reshape when contiguous, slice/reshape/transpose when it is a
strided box, a gather otherwise), so a view never costs an extra launch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .builder import Builder, Value


@dataclass(frozen=True, slots=True)
class ViewSpec:
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


def is_contiguous(shape: Sequence[int], stride: Sequence[int]) -> bool:
    expected = 1
    for d, s in zip(reversed(shape), reversed(stride)):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


# -- dtype reinterpretation --------------------------------------------------
def reinterpret(b: Builder, flat: Value, dtype: torch.dtype) -> Value:
    """View a flat buffer's bytes as another dtype (``Tensor.view(dtype)``)."""
    if flat.dtype == dtype:
        return flat
    if flat.dtype.is_complex or dtype.is_complex:
        # bitcast_convert cannot cross real <-> complex: go through interleaved (re, im) parts.
        if flat.dtype.is_complex:
            n = flat.shape[0]
            re = b.reshape(b.real(flat), (n, 1))
            im = b.reshape(b.imag(flat), (n, 1))
            return reinterpret(b, b.reshape(b.concatenate([re, im], 1), (2 * n,)), dtype)
        part = torch.float32 if dtype == torch.complex64 else torch.float64
        parts = reinterpret(b, flat, part)
        m = parts.shape[0] // 2
        pairs = b.reshape(b.slice(parts, [0], [2 * m]), (m, 2))
        re = b.reshape(b.slice(pairs, [0, 0], [m, 1]), (m,))
        im = b.reshape(b.slice(pairs, [0, 1], [m, 2]), (m,))
        return b.op1("stablehlo.complex", [re, im], (m,), dtype)
    if flat.dtype == torch.bool or dtype == torch.bool:
        # i1 has no byte representation in StableHLO: go through uint8 values.
        if flat.dtype == torch.bool:
            flat = b.convert(flat, torch.uint8)
            return reinterpret(b, flat, dtype)
        as_u8 = reinterpret(b, flat, torch.uint8)
        return b.convert(as_u8, torch.bool)
    src, dst = flat.dtype.itemsize, dtype.itemsize
    n = flat.shape[0]
    if src == dst:
        return b.bitcast_convert(flat, dtype, (n,))
    if src > dst:
        ratio = src // dst
        wide = b.bitcast_convert(flat, dtype, (n, ratio))
        return b.reshape(wide, (n * ratio,))
    ratio = dst // src
    usable = (n // ratio) * ratio
    if usable != n:
        flat = b.slice(flat, [0], [usable])
    grouped = b.reshape(flat, (usable // ratio, ratio))
    return b.bitcast_convert(grouped, dtype, (usable // ratio,))


# -- reading ---------------------------------------------------------------
def fit(b: Builder, flat: Value, length: int) -> Value:
    """Pad a flat buffer with zeros (or trim it) to exactly ``length`` elements."""
    n = flat.shape[0]
    if n == length:
        return flat
    if n > length:
        return b.slice(flat, [0], [length])
    zero = b.constant(0, flat.dtype)
    return b.pad(flat, zero, [0], [length - n])


def _strided_box(view: ViewSpec):
    """Describe ``view`` as a sub-box of a dense tensor, or None if it overlaps."""
    kept = [i for i, d in enumerate(view.shape) if d != 1 and view.stride[i] != 0]
    order = sorted(kept, key=lambda i: -view.stride[i])
    strides = [view.stride[i] for i in order]
    sizes = [view.shape[i] for i in order]
    k = len(order) - 1
    if k < 0:
        return order, [1], [1], [1]
    for i in range(1, k):
        if strides[i] <= 0 or strides[i - 1] % strides[i] != 0 or sizes[i] > strides[i - 1] // strides[i]:
            return None
    if k >= 1 and ((sizes[k] - 1) * strides[k] + 1 > strides[k - 1] or strides[k] <= 0):
        return None
    if k == 0:
        base = [sizes[0] * strides[0]]
        limits = [(sizes[0] - 1) * strides[0] + 1]
        steps = [strides[0]]
        return order, base, limits, steps
    base = [sizes[0]] + [strides[i - 1] // strides[i] for i in range(1, k)] + [strides[k - 1]]
    limits = sizes[:k] + [(sizes[k] - 1) * strides[k] + 1]
    steps = [1] * k + [strides[k]]
    return order, base, limits, steps


def _gather_indices(b: Builder, view: ViewSpec) -> Value:
    idx = b.constant(view.offset, torch.int64, view.shape)
    for d, (size, stride) in enumerate(zip(view.shape, view.stride)):
        if size == 1 or stride == 0:
            continue
        io = b.iota(view.shape, d, torch.int64)
        idx = b.add(idx, b.mul(io, b.constant(stride, torch.int64, view.shape)))
    return idx


def read_view(b: Builder, flat: Value, view: ViewSpec) -> Value:
    """The dense value of ``view`` over the flat storage value ``flat``."""
    flat = reinterpret(b, flat, view.dtype)
    shape = view.shape
    if view.numel == 0:
        return b.constant(0, view.dtype, shape)
    if is_contiguous(shape, view.stride):
        part = fit(b, b.slice(flat, [view.offset], [min(flat.shape[0], view.offset + view.numel)])
                    if view.offset < flat.shape[0] else b.constant(0, flat.dtype, (0,)), view.numel)
        return b.reshape(part, shape)
    box = _strided_box(view)
    if box is None:
        idx = _gather_indices(b, view)
        flat = fit(b, flat, max(flat.shape[0], 1 + view.offset + sum((d - 1) * s for d, s in
                                                                        zip(shape, view.stride))))
        return gather_flat(b, flat, idx)
    order, base, limits, steps = box
    total = math.prod(base)
    # Start the window at the view's offset with its inner box coordinates taken out, and the
    # box slice at those coordinates. A window starting at the offset itself runs past the
    # storage's end by them (q, k and v of a fused [.., 3 * d] projection, say), and the
    # padding it then needs costs a copy of the whole storage. Each inner dim is moved while
    # the view stays inside it; the outermost keeps the rest of the offset.
    start, first = view.offset, [0] * len(base)
    inner = 1
    for i in range(len(base) - 1, 0, -1):
        coordinate = (view.offset // inner) % base[i]
        if coordinate + limits[i] > base[i]:
            break
        first[i] = coordinate
        start -= coordinate * inner
        inner *= base[i]
    window = b.slice(fit(b, flat, max(flat.shape[0], start + total)), [start], [start + total])
    boxed = b.reshape(window, base)
    boxed = b.slice(boxed, first, [f + n for f, n in zip(first, limits)], steps)
    # boxed dims follow `order`; put them back in view order, then restore
    # size-1 and broadcast (stride-0) dims.
    kept_sorted = sorted(order)
    perm = [order.index(i) for i in kept_sorted]
    boxed = b.transpose(boxed, perm) if len(order) > 1 else boxed
    if not order:
        boxed = b.reshape(boxed, ())
    kept_shape = [shape[i] for i in kept_sorted]
    boxed = b.reshape(boxed, kept_shape)
    return b.broadcast_in_dim(boxed, shape, kept_sorted)


def gather_flat(b: Builder, flat: Value, idx: Value) -> Value:
    """``flat[idx]`` for a 1-D ``flat`` and an integer index tensor of any shape."""
    rank = idx.rank
    attrs = ("dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], "
             f"index_vector_dim = {rank}>, slice_sizes = array<i64: 1>, indices_are_sorted = false")
    return b.op1("stablehlo.gather", [flat, idx], idx.shape, flat.dtype, attrs=attrs)


# -- writing ---------------------------------------------------------------
def write_view(b: Builder, flat: Value, storage_numel: int, view: ViewSpec, value: Value) -> Value:
    """A new flat storage value equal to ``flat`` with ``view`` replaced by ``value``.

    ``flat`` is in the storage buffer's dtype; the result is too, and has
    exactly ``storage_numel`` elements.
    """
    buf_dtype = flat.dtype
    value = b.convert(value, view.dtype)
    if flat.shape[0] != storage_numel:
        flat = fit(b, flat, storage_numel)
    if view.numel == 0:
        return flat
    # Work in the view's dtype, then reinterpret back.
    if buf_dtype != view.dtype:
        work = reinterpret(b, flat, view.dtype)
    else:
        work = flat
    n = work.shape[0]
    if is_contiguous(view.shape, view.stride):
        vflat = b.reshape(value, (view.numel,))
        if view.offset == 0 and view.numel == n:
            new = vflat
        else:
            parts = []
            if view.offset > 0:
                parts.append(b.slice(work, [0], [view.offset]))
            parts.append(vflat)
            if view.offset + view.numel < n:
                parts.append(b.slice(work, [view.offset + view.numel], [n]))
            new = b.concatenate(parts, 0)
    else:
        idx = _gather_indices(b, view)
        new = _scatter(b, work, idx, value)
    if buf_dtype != view.dtype:
        new = reinterpret(b, new, buf_dtype)
        new = fit(b, new, storage_numel)
    return new


def write_views(b: Builder, flat: Value, storage_numel: int, writes: Sequence[tuple[ViewSpec, Value]]) -> Value:
    """``write_view`` of each (view, value) in order, with each run of contiguous, disjoint views in
    the buffer's dtype written by one concatenation: a foreach op over tensors that share one
    storage (optimizer state packed flat, say) writes dozens of views of it, and a concatenation
    per view chains that many copies of the whole storage, which XLA's simplifier then struggles
    to undo (it reported a circular simplification loop on such a chain)."""
    run: list[tuple[ViewSpec, Value]] = []
    covered: list[tuple[int, int]] = []

    def flush_run(flat: Value) -> Value:
        if len(run) == 1:
            flat = write_view(b, flat, storage_numel, *run[0])
        elif run:
            flat = _write_disjoint(b, flat, storage_numel, run)
        run.clear()
        covered.clear()
        return flat

    for view, value in writes:
        batchable = (view.numel > 0 and view.dtype == flat.dtype and is_contiguous(view.shape, view.stride)
                     and view.offset + view.numel <= storage_numel)
        span = (view.offset, view.offset + view.numel)
        if batchable and not any(lo < span[1] and span[0] < hi for lo, hi in covered):
            run.append((view, value))
            covered.append(span)
            continue
        flat = flush_run(flat)
        if batchable:
            run.append((view, value))
            covered.append(span)
        else:
            flat = write_view(b, flat, storage_numel, view, value)
    return flush_run(flat)


def _write_disjoint(b: Builder, flat: Value, storage_numel: int, writes: Sequence[tuple[ViewSpec, Value]]) -> Value:
    """``flat`` with disjoint contiguous views replaced, as one concatenation of the values and the
    old storage's slices between them."""
    if flat.shape[0] != storage_numel:
        flat = fit(b, flat, storage_numel)
    parts, at = [], 0
    for view, value in sorted(writes, key=lambda w: w[0].offset):
        if view.offset > at:
            parts.append(b.slice(flat, [at], [view.offset]))
        parts.append(b.reshape(b.convert(value, view.dtype), (view.numel,)))
        at = view.offset + view.numel
    if at < storage_numel:
        parts.append(b.slice(flat, [at], [storage_numel]))
    return parts[0] if len(parts) == 1 else b.concatenate(parts, 0)


def _scatter(b: Builder, flat: Value, idx: Value, updates: Value) -> Value:
    rank = idx.rank
    region = b.region([((), flat.dtype), ((), flat.dtype)], lambda bb, old, upd: upd)
    attrs = ("scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], "
             f"scatter_dims_to_operand_dims = [0], index_vector_dim = {rank}>, "
             "indices_are_sorted = false, unique_indices = false")
    return b.op1("stablehlo.scatter", [flat, idx, updates], flat.shape, flat.dtype, attrs=attrs, region=region)


def dense_to_storage(b: Builder, value: Value, stride: Sequence[int]) -> Value:
    """Lay out a dense result as the buffer of a new tensor with ``stride``.

    The buffer keeps the result's dims, in memory order: its row-major elements
    are the storage. Not flattened to 1-D, because XLA's CPU backend then indexes
    every element through the flat position (a division per broadcast operand):
    a bias add written to a 1-D output took 3x, a head transpose 6x the time of
    the same fusion writing its natural shape. Only dense layouts (a permutation
    of a contiguous one) are produced by the engine; the permutation is
    recovered from the strides.
    """
    if is_contiguous(value.shape, stride):
        return value
    return b.transpose(value, _memory_order(stride))


def _memory_order(stride: Sequence[int]) -> list[int]:
    return sorted(range(len(stride)), key=lambda i: (-stride[i], i))


def dense_buffer_shape(shape: Sequence[int], stride: Sequence[int]) -> tuple[int, ...]:
    """The shape of the buffer :func:`dense_to_storage` makes for a result of ``shape``."""
    if is_contiguous(shape, stride):
        return tuple(shape)
    return tuple(shape[i] for i in _memory_order(stride))


def flat(b: Builder, buffer: Value) -> Value:
    """A storage buffer's value as the flat 1-D storage that views are cut from."""
    return buffer if buffer.rank == 1 else b.reshape(buffer, (buffer.numel,))


def is_dense_permutation(shape: Sequence[int], stride: Sequence[int]) -> bool:
    order = _memory_order(stride)
    return is_contiguous([shape[i] for i in order], [stride[i] for i in order])


def dense_bytes(dtype: torch.dtype, shape: Sequence[int], stride: Sequence[int], offset: int) -> tuple[int, int] | None:
    """The byte range a dense tensor covers in its storage; None for other layouts (PyTorch's
    overlap test gives up on those too)."""
    if not is_dense_permutation(shape, stride):
        return None
    lo = offset * dtype.itemsize
    return lo, lo + math.prod(shape) * dtype.itemsize


def raise_if_overlapping(a: tuple[int, int] | None, b: tuple[int, int] | None) -> None:
    """PyTorch's assert_no_overlap on two byte ranges of one storage."""
    if a is not None and b is not None and a[0] < b[1] and b[0] < a[1]:
        raise RuntimeError(
            "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
            "single memory location. Please clone() the tensor before performing the operation.")


def check_out_overlap(out: torch.Tensor, *inputs: torch.Tensor) -> None:
    """assert_no_overlap between an out= tensor and inputs, for kernels that see the tensors (host kernels)."""
    for t in inputs:
        if out.untyped_storage()._cdata == t.untyped_storage()._cdata:
            raise_if_overlapping(dense_bytes(out.dtype, out.shape, out.stride(), out.storage_offset()),
                                 dense_bytes(t.dtype, t.shape, t.stride(), t.storage_offset()))
