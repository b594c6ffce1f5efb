"""Argument errors CPU raises that PyTorch 2.13's meta kernels miss or raise with another type.

The engine runs these on the meta arguments before the meta kernel, whenever an op call's key
is not cached yet (registry.register_meta_check). They depend only on what the key fixes
(shapes, dtypes, static values), so a cached key has passed them. Messages are CPU's.
A check registered for the functional overload gets its arguments; one registered for an out=
overload gets all of that overload's arguments, out tensors included.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .registry import (
    register_argument_check,
    register_meta_arguments,
    register_meta_check,
    register_meta_outputs,
)

aten = torch.ops.aten

_SCALAR_TYPE_NAMES = {
    torch.float16: "Half", torch.float32: "Float", torch.float64: "Double", torch.bfloat16: "BFloat16",
    torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble", torch.bool: "Bool", torch.uint8: "Byte",
    torch.int8: "Char", torch.int16: "Short", torch.int32: "Int", torch.int64: "Long",
}


def scalar_type_name(dtype: torch.dtype) -> str:
    """c10's name of a dtype, as CPU error messages print it (Float, Long...)."""
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


_CPP_TYPE_NAMES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int", torch.int32: "int", torch.int16: "short int", torch.int8: "signed char",
    torch.uint8: "unsigned char", torch.bool: "bool",
}


def cpp_type_name(dtype: torch.dtype) -> str:
    """The C++ type name of a dtype, as messages built from a TypeMeta print it (float, double...)."""
    return _CPP_TYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


@register_meta_check(aten.cat.default)
def _cat(tensors: Any, dim: int = 0) -> None:
    for i, t in enumerate(tensors):  # the meta kernel raises IndexError
        if t.dim() == 0:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
    # CPU's wording of a size mismatch; legacy empty (0,) tensors are skipped, as CPU does
    shaped = [(i, t) for i, t in enumerate(tensors) if not (t.dim() == 1 and t.numel() == 0)]
    if not shaped:
        return
    first = shaped[0][1]
    check_dim(first, dim)  # CPU wraps the dim against the first tensor before it compares ranks
    d = dim % first.dim()
    for i, t in shaped[1:]:
        if t.dim() != first.dim():
            raise RuntimeError(f"Tensors must have same number of dimensions: got {first.dim()} and {t.dim()}")
        for k in range(first.dim()):
            if k != d and t.shape[k] != first.shape[k]:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. Expected size "
                                   f"{first.shape[k]} but got size {t.shape[k]} for tensor number {i} in the list.")


@register_meta_check(aten.complex.default)
def _complex(real: torch.Tensor, imag: torch.Tensor) -> None:
    floating = (torch.float16, torch.float32, torch.float64)
    if real.dtype not in floating or imag.dtype not in floating:  # the meta kernel asserts
        raise RuntimeError(f"Expected both inputs to be Half, Float or Double tensors but got "
                           f"{scalar_type_name(real.dtype)} and {scalar_type_name(imag.dtype)}")
    if real.dtype != imag.dtype:  # the meta kernel promotes
        raise RuntimeError(f"Expected object of scalar type {scalar_type_name(real.dtype)} but got scalar type "
                           f"{scalar_type_name(imag.dtype)} for second argument")


@register_meta_check(aten.embedding.default)
def _embedding(weight: torch.Tensor, indices: torch.Tensor, *rest: Any) -> None:
    if weight.dim() != 2:  # the meta kernel asserts
        raise RuntimeError("'weight' must be 2-D")
    if indices.dtype not in (torch.int64, torch.int32):
        raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the following scalar types: "
                           f"Long, Int; but got torch.{scalar_type_name(indices.dtype)}Tensor instead (while checking "
                           "arguments for embedding)")


@register_meta_check(aten.masked_scatter.default)
def _masked_scatter(x: torch.Tensor, mask: torch.Tensor, source: torch.Tensor) -> None:
    if mask.dtype != torch.bool:  # the meta kernel accepts a uint8 mask
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype "
                           f"{scalar_type_name(mask.dtype)}")


def _index_func_checks(func: str, x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> None:
    """CPU's argument checks of index_add_ and index_reduce_ (index_func_meta_impl), in its order;
    the meta kernels let these through (to XLA's refusal, or to a silently wrong result)."""
    rank = max(x.dim(), 1)
    if not -rank <= dim < rank:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})")
    if index.dim() > 1:
        raise IndexError(f"{func}(): Index is supposed to be a vector, but got dim: {index.dim()} with type: "
                         f"{scalar_type_name(index.dtype)} and size: {list(index.shape)}")
    if index.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"{func}(): Expected dtype int32/int64 for index but got: {scalar_type_name(index.dtype)}")
    if x.dtype != source.dtype:
        raise RuntimeError(f"{func}(): self ({scalar_type_name(x.dtype)}) and source "
                           f"({scalar_type_name(source.dtype)}) must have the same scalar type")
    if x.dim() == 0 and index.numel() != 1:  # regression: tpu's message had another type
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    d = dim % rank
    n = index.numel()
    if source.dim() > 0 and n != source.shape[d]:
        raise RuntimeError(f"{func}(): Number of indices ({n}) should be equal to source.size(dim): "
                           f"({source.shape[d]}), for dim: {dim}")
    if x.dim() > 0 and source.dim() > 0 and (
            source.dim() != x.dim() or any(a != b for i, (a, b) in enumerate(zip(x.shape, source.shape)) if i != d)):
        raise RuntimeError(f"source tensor shape must match self tensor shape, excluding the specified dimension. "
                           f"Got self.shape = {list(x.shape)} source.shape = {list(source.shape)}")


@register_meta_check(aten.index_add.default)
def _index_add(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, alpha: Any = 1) -> None:
    _index_func_checks("index_add_", x, dim, index, source)


@register_meta_check(aten.index_reduce.default)
def _index_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, reduce: str,
                  include_self: bool = True) -> None:
    # regression: a wrong-sized source, a float index or reduce="sum" gave a result, not CPU's error
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got {reduce}.")
    _index_func_checks("index_reduce_", x, dim, index, source)


@register_meta_check(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def _index_fill(x: torch.Tensor, dim: int, index: torch.Tensor, value: Any) -> None:
    # regression: a float index filled rows on tpu
    if index.dtype != torch.int64:
        raise IndexError("index_fill_(): Expected dtype int64 for index.")
    check_dim(x, dim)


@register_meta_check(aten.put.default)
def _put(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> None:
    # regression: a float index wrote elements on tpu
    if index.dtype != torch.int64:
        raise RuntimeError(f"put_(): Expected a long tensor for index, but got {scalar_type_name(index.dtype)}")


def _nonzero_reduction_dims(func: str, x: torch.Tensor, dims: list[int], shown: list[int]) -> None:
    for d, name in zip(dims, shown):
        if x.dim() > 0 and x.shape[d % x.dim()] == 0:
            raise IndexError(f"{func}(): Expected reduction dim {name} to have non-zero size.")


def _nonzero_reduction_dim(func: str, x: torch.Tensor, dim: int) -> None:
    """One reduction dim, which CPU's message shows wrapped (max, min, median, mode, kthvalue)."""
    _nonzero_reduction_dims(func, x, [dim], [dim % max(x.dim(), 1)])


def _max_min_dim(func: str) -> Callable[..., None]:
    def check(x: torch.Tensor, dim: int, keepdim: bool = False) -> None:
        # regression: zeros(3, 0).max(1) gave -inf where CPU raises (the dim is shown wrapped)
        _nonzero_reduction_dim(func, x, dim)

    return check


@register_meta_check(aten.median.dim, aten.nanmedian.dim)
def _median_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> None:
    # regression: accepted bool and an empty reduction dim on tpu (CPU checks the dim first)
    _nonzero_reduction_dim("median", x, dim)
    if x.dtype == torch.bool:
        raise NotImplementedError('"median_out" not implemented for \'Bool\'')


@register_meta_check(aten.median.default, aten.nanmedian.default)
def _median_all(x: torch.Tensor) -> None:
    if x.dtype == torch.bool and x.numel() > 0:  # regression: accepted on tpu (CPU returns early when empty)
        raise NotImplementedError('"median_tpu" not implemented for \'Bool\'')


@register_meta_check(aten.mode.default)
def _mode(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> None:
    _nonzero_reduction_dim("mode", x, dim)  # regression: accepted on tpu


@register_meta_check(aten.kthvalue.default)
def _kthvalue(x: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False) -> None:
    # regression: bool was accepted and an empty dim was another exception type on tpu
    check_dim(x, dim)
    _nonzero_reduction_dim("kthvalue", x, dim)
    size = x.shape[dim] if x.dim() else 1
    if not 1 <= k <= size:  # (before the dtype: regression, a bool x raised NotImplementedError)
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {dim % max(x.dim(), 1)}")
    if x.dtype == torch.bool and x.dim() > 0:  # (a 0-dim x is copied, bool too)
        raise NotImplementedError('"kthvalue_tpu" not implemented for \'Bool\'')


register_meta_check(aten.max.dim)(_max_min_dim("max"))
register_meta_check(aten.min.dim)(_max_min_dim("min"))


def _amax_amin(func: str) -> Callable[..., None]:
    def check(x: torch.Tensor, dim: Any = (), keepdim: bool = False) -> None:
        dims = [dim] if isinstance(dim, int) else list(dim)
        if not dims and x.numel() == 0:
            raise RuntimeError(f"{func}(): Expected reduction dim to be specified for input.numel() == 0. "
                               f"Specify the reduction dim with the 'dim' argument.")
        _nonzero_reduction_dims(func, x, dims, dims)  # (shown as given)

    return check


register_meta_check(aten.amax.default)(_amax_amin("amax"))
register_meta_check(aten.amin.default)(_amax_amin("amin"))


def _no_bool_arg(func: str) -> Callable[..., None]:
    def check(x: torch.Tensor, dim: Any = None, *args: Any, **kwargs: Any) -> None:
        if x.dtype == torch.bool:  # regression: accepted on tpu
            raise RuntimeError(f"{func}(): does not support bool input")
        if dim is None and x.numel() == 0:  # regression: the meta kernel's RuntimeError on tpu
            raise IndexError(f"{func}(): Expected reduction dim to be specified for input.numel() == 0.")
        if dim is not None and x.dim() and -x.dim() <= dim < x.dim() and x.shape[dim] == 0:
            raise IndexError(f"{func}(): Expected reduction dim {dim % x.dim()} to have non-zero size.")

    return check


register_meta_check(aten.argmax.default)(_no_bool_arg("argmax"))
register_meta_check(aten.argmin.default)(_no_bool_arg("argmin"))


@register_meta_check(aten.relu.default, aten.relu_.default)
def _relu(x: torch.Tensor) -> None:
    if x.dtype == torch.bool:  # regression: accepted on tpu
        raise RuntimeError("Boolean inputs not supported for relu")


def _floating_only(func: str) -> Callable[..., None]:
    def check(x: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        if not (x.dtype.is_floating_point or x.dtype.is_complex):  # regression: XLA's compile error on tpu
            raise RuntimeError(f"{func} only support floating point and complex dtypes")

    return check


register_meta_check(aten.std.correction, aten.var.correction)(_floating_only("std and var"))
register_meta_check(aten.std_mean.correction)(_floating_only("std_mean"))
register_meta_check(aten.var_mean.correction)(_floating_only("var_mean"))


def _shapes_broadcast(a: Any, b: Any) -> bool:
    """Whether two operands broadcast: CPU's TensorIterator refuses shapes before its kernels
    refuse dtypes, so a dtype check of a kernel leaves unbroadcastable shapes to the meta kernel."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return True
    try:
        torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        return False
    return True


def _integral_only(kernel: str) -> Callable[..., None]:
    # shifts, gcd and lcm have no bool kernel either, on CPU and CUDA (regression: XLA's compile error)
    takes_bool = not (kernel.endswith("shift") or kernel in ("gcd", "lcm"))

    def check(a: Any, b: Any, *rest: Any, **kwargs: Any) -> None:  # (gcd.out: out=)
        if not _shapes_broadcast(a, b):
            return
        dtype = torch.result_type(a, b)
        if dtype.is_floating_point or dtype.is_complex or (dtype == torch.bool and not takes_bool):
            raise NotImplementedError(f'"{kernel}_tpu" not implemented for \'{scalar_type_name(dtype)}\'')

    return check


for _kernel, _ops in (("bitwise_and", (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)),
                      ("bitwise_or", (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)),
                      ("bitwise_xor", (aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)),
                      ("lshift", (aten.__lshift__.Tensor, aten.__lshift__.Scalar, aten.bitwise_left_shift.Tensor,
                                  aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor)),
                      ("rshift", (aten.__rshift__.Tensor, aten.__rshift__.Scalar, aten.bitwise_right_shift.Tensor,
                                  aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor))):
    register_meta_check(*_ops)(_integral_only(_kernel))


# gcd and lcm: integers only, as CPU's kernels (regression: XLA's compile error naming
# ``stablehlo.or`` for float inputs)
for _kernel in ("gcd", "lcm"):
    _packet = getattr(aten, _kernel)
    register_meta_check(_packet.default, _packet.out, getattr(aten, _kernel + "_").default)(_integral_only(_kernel))


@register_meta_check(aten.complex.out)
def _complex_out(real: torch.Tensor, imag: torch.Tensor, out: torch.Tensor) -> None:
    _complex(real, imag)
    want = torch.complex128 if real.dtype == torch.float64 else torch.complex64
    if real.dtype == torch.float16:
        want = torch.complex32
    if out.dtype != want:  # complex writes no other dtype (no cast into out)
        raise RuntimeError(f"Expected object of scalar type {scalar_type_name(want)} but got scalar type "
                           f"{scalar_type_name(out.dtype)} for argument 'out'")


@register_meta_check(aten.aminmax.out)
def _aminmax_out(x: torch.Tensor, dim: Any, keepdim: bool, low: torch.Tensor, high: torch.Tensor) -> None:
    for t in (low, high):
        if t.dtype != x.dtype:
            raise RuntimeError(f"Expected out tensor to have dtype {cpp_type_name(x.dtype)}, but got "
                               f"{cpp_type_name(t.dtype)} instead")


@register_meta_check(aten.multinomial.out)
def _multinomial_out(x: torch.Tensor, num_samples: int, replacement: bool, generator: Any, out: torch.Tensor) -> None:
    if out.dtype != torch.int64:
        raise RuntimeError(f"multinomial expects Long tensor out, got: {scalar_type_name(out.dtype)}")


@register_meta_check(aten.multinomial.default)
def _multinomial(x: torch.Tensor, num_samples: int, replacement: bool = False, generator: Any = None) -> None:
    # the meta kernel checks the input's rank and dtype, not these
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    n = x.shape[-1] if x.dim() else 1
    if not replacement and num_samples > n:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if n > 2**24:
        raise RuntimeError("number of categories cannot exceed 2^24")


@register_meta_check(aten._linalg_eigh.default)
def _check_eigh_dtype(a: Any, uplo: str = "L", compute_v: bool = True) -> None:
    # CPU's kernel dispatches over floating and complex types (half types are computed here)
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        raise NotImplementedError(f"\"linalg_eigh\" not implemented for '{scalar_type_name(a.dtype)}'")


# -- matrix products: CPU's shape and dtype errors, in CPU's order (the meta kernels word them
# otherwise, or let mixed dtypes through) ---------------------------------------------------
def _shapes_multiply(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() == 2 and b.dim() == 2 and a.shape[1] != b.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
                           f"{b.shape[0]}x{b.shape[1]})")


@register_meta_check(aten.mm.default)
def _mm(a: torch.Tensor, b: torch.Tensor, *rest: Any) -> None:
    _shapes_multiply(a, b)
    if a.dtype != b.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {cpp_type_name(a.dtype)} != "
                           f"{cpp_type_name(b.dtype)}")
    if a.dtype == torch.bool and a.dim() == 2 and b.dim() == 2 and a.numel() and b.numel():
        # regression: a result on tpu (CUDA has no bool mm either; CPU returns an empty or zero
        # result before its kernel)
        raise NotImplementedError('"addmm_impl_cpu_" not implemented for \'Bool\'')


@register_meta_check(aten.addmm.default)
def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *rest: Any) -> None:
    if a.dtype != b.dtype:
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got {scalar_type_name(a.dtype)} and "
                           f"{scalar_type_name(b.dtype)}")
    if bias.dtype != b.dtype:
        raise RuntimeError(f"self and mat2 must have the same dtype, but got {scalar_type_name(bias.dtype)} and "
                           f"{scalar_type_name(b.dtype)}")
    _shapes_multiply(a, b)


def _same_batch_dtypes(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype != b.dtype:
        raise RuntimeError(f"expected scalar type {scalar_type_name(a.dtype)} but found {scalar_type_name(b.dtype)}")


@register_meta_check(aten.bmm.default)
def _bmm(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        return  # the meta kernel's shape error comes first
    if a.shape[0] * a.shape[1] * b.shape[2] == 0 or a.shape[2] == 0:
        return  # CPU returns an empty or zero result before its kernel's dtype checks
    # CPU's kernel dispatches on the first operand's dtype before it compares the two
    if a.dtype == torch.bool:  # regression: a result on tpu (CUDA's bmm has no bool kernel either)
        raise NotImplementedError('"bmm" not implemented for \'Bool\'')
    _same_batch_dtypes(a, b)


@register_meta_check(aten.baddbmm.default)
def _baddbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *rest: Any) -> None:
    _same_batch_dtypes(a, b)
    if bias.dtype != a.dtype:
        raise RuntimeError(f"Input dtypes must be the same, got: input {cpp_type_name(bias.dtype)}, batch1: "
                           f"{cpp_type_name(a.dtype)}, batch2: {cpp_type_name(b.dtype)}")


@register_meta_check(aten.dot.default, aten.vdot.default)
def _dot(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dtype != b.dtype:
        raise RuntimeError(f"dot : expected both vectors to have same dtype, but found {scalar_type_name(a.dtype)} "
                           f"and {scalar_type_name(b.dtype)}")
    if a.dim() == 1 and b.dim() == 1 and a.numel() != b.numel():
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{a.numel()}] and src [{b.numel()}] to have the "
                           f"same number of elements, but got {a.numel()} and {b.numel()} elements respectively")
    if a.dim() != 1 or b.dim() != 1:
        return  # the meta kernel's shape error comes first
    if a.dtype == torch.bool:  # regression: a result on tpu (CUDA's dot has no bool kernel either)
        raise NotImplementedError('"dot" not implemented for \'Bool\'')


# -- softmax: the dim's range, and the kernels CPU lacks for integer inputs ----------------
def check_dim(x: torch.Tensor, dim: int) -> None:
    """CPU's IndexError for a dim outside ``x``'s range (a 0-dim tensor takes -1 and 0)."""
    rank = max(x.dim(), 1)
    if not -rank <= dim < rank:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})")


def _check_softmax(name: str, x: torch.Tensor, dim: int) -> None:
    check_dim(x, dim)
    rank = max(x.dim(), 1)
    if x.numel() and not (x.dtype.is_floating_point or x.dtype.is_complex):  # (CPU returns empty ones early)
        kernel = f"{name}_lastdim_kernel_impl" if dim % rank == rank - 1 else f"{name}_kernel_impl"
        raise NotImplementedError(f'"{kernel}" not implemented for \'{scalar_type_name(x.dtype)}\'')


@register_meta_check(aten._softmax.default)
def _softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> None:
    _check_softmax("softmax", x, dim)


@register_meta_check(aten._log_softmax.default)
def _log_softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> None:
    _check_softmax("log_softmax", x, dim)


@register_meta_outputs(aten._softmax.default, aten._log_softmax.default)
def _softmax_of_empty_bool(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor | None:
    """CPU returns an empty input before its dtype dispatch, bool included; the decomposition
    behind the meta kernel subtracts bools and raises (regression: tpu raised a RuntimeError)."""
    return torch.empty_like(x) if x.dtype == torch.bool and x.numel() == 0 else None


# -- indexing, convolution, losses, normalization: CPU's types and wording ----------------
_INDEX_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)


@register_meta_check(aten.index.Tensor)
def _index_dtypes(x: torch.Tensor, indices: Any, *rest: Any) -> None:
    """CPU raises IndexError (the meta kernel a RuntimeError, and index_put's none at all)."""
    for index in indices:
        if index is not None and index.dtype not in _INDEX_DTYPES:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    check_mask_shapes(x, indices)
    check_integer_indices(x, indices)


def check_integer_indices(x: torch.Tensor, indices: Any) -> None:
    """Integer indices must broadcast together (CPU's IndexError; the meta kernel's is a
    RuntimeError), and one into a size-0 dim is out of range whatever its values: CPU says so
    before it computes anything, even when the result is empty (regression: x[i] of a [0, 2, 0] x
    returned an empty [1, 2, 0] on tpu). Not when the indices broadcast to nothing: nothing is
    indexed then. Masks are left to the host kernels, which turn them into integer indices first."""
    given = [i for i in indices if i is not None]
    if not given or any(i.dtype in (torch.bool, torch.uint8) for i in given):
        return
    try:
        shape = torch.broadcast_shapes(*(i.shape for i in given))
    except RuntimeError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                         + ", ".join(str(list(i.shape)) for i in given)) from None
    if math.prod(shape) == 0:
        return
    for d, index in enumerate(indices):
        if index is not None and d < x.dim() and x.shape[d] == 0:
            raise IndexError("index is out of bounds for dimension with size 0")


def check_mask_shapes(x: torch.Tensor, indices: Any) -> None:
    """A boolean mask must have the shape of the dims it indexes (regression: x[mask] took a
    mask of another length on tpu). Also called by the host kernels of index and index_put,
    before they turn masks into coordinates."""
    d = 0
    for index in indices:
        if index is not None and index.dtype in (torch.bool, torch.uint8):
            for k in range(index.dim()):
                if d + k < x.dim() and index.shape[k] != x.shape[d + k]:
                    raise IndexError(f"The shape of the mask {list(index.shape)} at index {k} does not match the "
                                     f"shape of the indexed tensor {list(x.shape)} at index {d + k}")
            d += index.dim()
        else:
            d += 1


@register_meta_check(aten.index_put.default, aten._index_put_impl.default)
def _index_put(x: torch.Tensor, indices: Any, values: torch.Tensor, *rest: Any) -> None:
    _index_dtypes(x, indices)  # (CPU computes the indexing before it checks the dtypes)
    if values.dtype != x.dtype:  # regression: a float value was written into an int64 tensor on tpu
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{scalar_type_name(x.dtype)} for the destination and {scalar_type_name(values.dtype)} "
                           f"for the source.")
    if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
        return  # (the indexing result's shape depends on the mask's values)
    try:
        shape = aten.index.Tensor(x, list(indices)).shape
    except (RuntimeError, IndexError):
        return  # the meta kernel's own error
    if not _broadcasts(values.shape, shape) or torch.broadcast_shapes(values.shape, shape) != shape:
        # regression: XLA's compile error on tpu
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
                           f"indexing result of shape {list(shape)}")


def _broadcasts(a: Any, b: Any) -> bool:
    try:
        torch.broadcast_shapes(a, b)
    except RuntimeError:
        return False
    return True


@register_meta_check(aten.convolution.default)
def _convolution(x: torch.Tensor, w: torch.Tensor, bias: Any, stride: Any, padding: Any, dilation: Any,
                 transposed: bool, output_padding: Any, groups: int) -> None:
    """The channel check, worded as CPU's (the meta kernel says "Invalid channel dimensions", and a
    transposed convolution passed it to XLA, which failed to compile)."""
    if x.dim() < 2 or w.dim() < 2:
        return
    expected = w.shape[0] if transposed else w.shape[1] * groups
    if x.shape[1] != expected:
        given = "transposed=1" if transposed else f"groups={groups}"
        raise RuntimeError(f"Given {given}, weight of size {list(w.shape)}, expected input{list(x.shape)} to have "
                           f"{expected} channels, but got {x.shape[1]} channels instead")


@register_meta_check(aten.native_layer_norm.default)
def _layer_norm_shape(x: torch.Tensor, normalized_shape: Any, *rest: Any) -> None:
    shape = list(normalized_shape)
    if x.dim() < len(shape) or list(x.shape[x.dim() - len(shape):]) != shape:
        raise RuntimeError(f"Given normalized_shape={shape}, expected input with shape [*, "
                           f"{', '.join(str(s) for s in shape)}], but got input of size{list(x.shape)}")


@register_meta_check(aten.topk.default)
def _topk(x: torch.Tensor, k: int, dim: int = -1, *rest: Any) -> None:
    check_dim(x, dim)  # (first: regression, a 0-dim bool x with dim 1 raised the dtype's error)
    size = x.shape[dim] if x.dim() else 1
    if not 0 <= k <= size:
        raise RuntimeError("selected index k out of range")
    if x.dtype == torch.bool:  # regression: a result on tpu (CUDA's topk has no bool kernel either)
        raise RuntimeError("topk does not support bool dtypes")


@register_meta_check(aten.stack.default)
def _stack(tensors: Any, dim: int = 0) -> None:
    if tensors:  # CPU wraps the dim first (regression: tpu raised the size mismatch instead)
        rank = tensors[0].dim() + 1
        if not -rank <= dim < rank:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], but got {dim})")
    for i, t in enumerate(tensors[1:], 1):  # the meta kernel's message loses the second shape
        if t.shape != tensors[0].shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(tensors[0].shape)} at "
                               f"entry 0 and {list(t.shape)} at entry {i}")


@register_meta_check(aten.sort.default, aten.sort.stable)
def _sort_dim(x: torch.Tensor, *args: Any) -> None:
    check_dim(x, next((a for a in args if isinstance(a, int) and not isinstance(a, bool)), -1))  # meta wraps any


@register_meta_check(aten.index_select.default)
def _index_select_dtype(x: torch.Tensor, dim: int, index: torch.Tensor) -> None:
    check_dim(x, dim)  # regression: a 0-dim x took dim 1 on tpu
    if x.dim() == 0 and index.numel() != 1:  # regression: tpu checked the values instead
        raise RuntimeError(f"index_select(): Index to scalar can have only 1 value, got {index.numel()} value(s)")
    if index.dtype not in (torch.int64, torch.int32):
        raise RuntimeError("index_select(): Expected dtype int32 or int64 for index")
    if x.dim() > 1 and x.numel() == 0 and index.numel() > 0 and x.shape[dim] == 0:
        raise RuntimeError("index_select(): self indexing axis dim should be positive")


@register_meta_check(aten.nll_loss_forward.default)
def _nll_loss(x: torch.Tensor, target: torch.Tensor, weight: Any, *rest: Any) -> None:
    """The target's dtype (the meta kernel takes int32 too), then the weight's size (the meta
    kernel asserts)."""
    if target.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {scalar_type_name(target.dtype)}")
    _nll_loss_weight(x, weight)


@register_meta_check(aten.nll_loss2d_forward.default)
def _nll_loss2d(x: torch.Tensor, target: torch.Tensor, weight: Any, *rest: Any) -> None:
    """CPU's 2-d kernel takes int64 targets only (the 1-d one uint8 too)."""
    if target.dtype != torch.int64:
        raise RuntimeError(f"expected scalar type Long but found {scalar_type_name(target.dtype)}")
    _nll_loss_weight(x, weight)


def _nll_loss_weight(x: torch.Tensor, weight: Any) -> None:
    classes = x.shape[1] if x.dim() >= 2 else x.shape[0] if x.dim() == 1 else 1
    if weight is not None and weight.numel() != classes:
        raise RuntimeError(f"weight tensor should be defined either for all {classes} classes or no classes but got "
                           f"weight tensor of shape: {list(weight.shape)}")


_WHERE_UINT8 = ("where received a uint8 condition tensor. This behavior is deprecated and will be removed in a "
                 "future version of PyTorch. Use a boolean condition instead.")
_warned_where_uint8 = False


@register_meta_arguments(aten.where.self)
def _where_uint8_condition(cond: torch.Tensor, *rest: Any) -> list[Any]:
    """CPU takes a uint8 condition as a bool one, with a deprecation warning once per process;
    the meta kernel refuses it. The lowering compares it with zero."""
    global _warned_where_uint8
    if cond.dtype != torch.uint8:
        return [cond, *rest]
    if not _warned_where_uint8:
        _warned_where_uint8 = True
        warnings.warn(_WHERE_UINT8, UserWarning, stacklevel=2)
    return [cond.to(torch.bool), *rest]


def _uint8_target_as_long(at: int) -> Callable[..., list[Any]]:
    """CPU's 1-d nll_loss kernels take a uint8 target (argument ``at``); the meta kernel's
    gather refuses it, so the meta call gets an int64 one."""

    def adapt(*args: Any) -> list[Any]:
        if args[at].dtype != torch.uint8:
            return list(args)
        return [*args[:at], args[at].to(torch.int64), *args[at + 1:]]

    return adapt


register_meta_arguments(aten.nll_loss_forward.default)(_uint8_target_as_long(1))  # (self, target, ...)
register_meta_arguments(aten.nll_loss_backward.default)(_uint8_target_as_long(2))  # (grad, self, target, ...)


@register_meta_check(aten.where.self)
def _where_condition(cond: torch.Tensor, *rest: Any) -> None:
    if cond.dtype not in (torch.bool, torch.uint8):  # uint8: the meta kernel's own error
        raise RuntimeError(f"where expected condition to be a boolean tensor, but got a tensor with dtype "
                           f"{scalar_type_name(cond.dtype)}")


@register_meta_check(aten.flip.default)
def _flip_dims(x: torch.Tensor, dims: Any) -> None:
    rank = max(x.dim(), 1)
    seen = set()
    for d in dims:
        if -rank <= d < rank:
            if d % rank in seen:
                raise RuntimeError(f"dim {d % rank} appears multiple times in the list of dims")
            seen.add(d % rank)


@register_meta_check(aten.trace.default)
def _trace_matrix(x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {x.dim()}")


# -- found by tests/test_fuzz_as_cpu.py ----------------------------------------------------------
def _float_kernel(kernel: str, bool_only: bool = False) -> Callable[..., None]:
    """CPU's (and CUDA's) kernels of these dispatch over floating types only (``bool_only``: all
    but bool); the meta kernels refuse other dtypes with another exception type, or accept them
    (to XLA's compile error, or a result)."""

    def check(x: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        refused = x.dtype == torch.bool if bool_only else not (x.dtype.is_floating_point or x.dtype.is_complex)
        if refused:
            raise NotImplementedError(f'"{kernel}" not implemented for \'{scalar_type_name(x.dtype)}\'')

    return check


# (celu and selu: CPU's composites call elu; a compiled graph keeps them whole, compile._decompositions)
for _kernel, _ops in (("leaky_relu_cpu", (aten.leaky_relu.default,)),
                      ("elu_cpu", (aten.elu.default, aten.celu.default, aten.selu.default)),
                      ("softplus_cpu", (aten.softplus.default,)), ("hardswish_cpu", (aten.hardswish.default,)),
                      ("mish_cpu", (aten.mish.default,)), ("GeluKernelImpl", (aten.gelu.default,)),
                      ("silu_cpu", (aten.silu.default,)), ("hardsigmoid_cpu", (aten.hardsigmoid.default,)),
                      ("hardshrink_cpu", (aten.hardshrink.default,)),
                      ("log_sigmoid_cpu", (aten.log_sigmoid_forward.default,))):
    register_meta_check(*_ops)(_float_kernel(_kernel))


@register_meta_check(aten.logcumsumexp.default)
def _logcumsumexp(x: torch.Tensor, dim: int) -> None:
    check_dim(x, dim)  # (first: regression, a bool x with a bad dim raised the dtype's error)
    _float_kernel("logcumsumexp_out_cpu")(x)
for _n in (1, 2, 3):
    register_meta_check(getattr(aten, f"reflection_pad{_n}d").default)(
        _float_kernel(f"reflection_pad{_n}d", bool_only=True))
    register_meta_check(getattr(aten, f"replication_pad{_n}d").default)(
        _float_kernel(f"replication_pad{_n}d", bool_only=True))


def _scalar_overflows(value: Any, dtype: torch.dtype) -> bool:
    """c10::overflows, as Scalar::to<T>() checks a fill value: a float into an integer type must be
    finite and in range; an integer into an unsigned type may be negative down to -max (it wraps);
    any value fits bool; a float type takes infinities and NaN, not finite values beyond its max."""
    if dtype == torch.bool or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if dtype.is_floating_point:
        return math.isfinite(value) and abs(value) > torch.finfo(dtype).max
    if dtype.is_complex:
        return False
    info = torch.iinfo(dtype)
    if isinstance(value, float):
        return not math.isfinite(value) or not info.min <= value <= info.max
    if info.min == 0:
        return value > info.max or value < -info.max
    return not info.min <= value <= info.max


_C_TYPE_NAMES = {torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int",
                 torch.int64: "int64_t", torch.float32: "float", torch.float64: "double",
                 torch.bfloat16: "c10::BFloat16", torch.float16: "c10::Half"}


def _check_fill_value(value: Any, dtype: torch.dtype) -> None:
    if _scalar_overflows(value, dtype):
        raise RuntimeError(f"value cannot be converted to type {_C_TYPE_NAMES.get(dtype, str(dtype))} without overflow")


# Fill values travel as runtime scalars, not in the op's cache key, so these are argument checks
# (run on every call; a meta check runs once per key). Each repeats the static checks CPU makes
# before it converts the value, to raise in CPU's order.
@register_argument_check(aten.fill.Scalar)
def _fill(x: torch.Tensor, value: Any) -> None:
    _check_fill_value(value, x.dtype)  # regression: fill_(int32, inf) gave int max


@register_argument_check(aten.full.default)
def _full_value(size: Any, value: Any, dtype: Any = None, *rest: Any) -> None:
    if dtype is None:  # (full infers it from the value: bool, int64, or the default float type)
        dtype = torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else \
            torch.get_default_dtype()
    _check_fill_value(value, dtype)  # regression: full((2,), 2**31, dtype=int32) wrapped to -2**31


@register_argument_check(aten.scalar_tensor.default)
def _scalar_tensor_value(value: Any, dtype: Any = None, *rest: Any) -> None:
    # regression: where(cond, int32, 2**31), whose composite makes scalar_tensor(2**31, dtype=int32)
    # (DeferAndFuse's native fast path runs argument checks too: csrc/defer.cpp)
    _check_fill_value(value, torch.get_default_dtype() if dtype is None else dtype)


@register_argument_check(aten.masked_fill.Scalar)
def _masked_fill_value(x: torch.Tensor, mask: torch.Tensor, value: Any) -> None:
    _check_fill_value(value, x.dtype)  # regression: a NaN into int64 raised ValueError


@register_argument_check(aten.scatter.value)
def _scatter_value(x: torch.Tensor, dim: int, index: torch.Tensor, value: Any) -> None:
    check_dim(x, dim)
    if index.numel():  # (CPU returns before converting the value when there is nothing to write)
        _check_fill_value(value, x.dtype)  # regression: scatter(uint8, value=inf) wrote 255


@register_argument_check(aten.index_fill.int_Scalar)
def _index_fill_value(x: torch.Tensor, dim: int, index: torch.Tensor, value: Any) -> None:
    _index_fill(x, dim, index, value)
    _check_fill_value(value, x.dtype)  # regression: index_fill(uint8, inf) raised OverflowError


@register_argument_check(aten.constant_pad_nd.default)
def _constant_pad_value(x: torch.Tensor, pad: Any, value: Any = 0) -> None:
    # regression: F.pad(uint8, value=nan) gave a result; CPU converts the value only where it pads
    # (with no positive pad it only narrows, and F.pad(uint8, (0, 0), value=inf) is fine there)
    if any(int(p) > 0 for p in pad):
        _check_fill_value(value, x.dtype)


@register_meta_check(aten.threshold.default)
def _threshold_dtype(x: torch.Tensor, threshold: Any, value: Any) -> None:
    _float_kernel("threshold_cpu", bool_only=True)(x)


@register_argument_check(aten.threshold.default)
def _threshold(x: torch.Tensor, threshold: Any, value: Any) -> None:
    _threshold_dtype(x, threshold, value)
    _check_fill_value(threshold, x.dtype)
    _check_fill_value(value, x.dtype)  # regression: threshold(uint8, 1.0, -2.0) gave a result


def _in_place_shape(x: torch.Tensor, *others: Any) -> None:
    """An in-place op's operands must broadcast to self's shape; CPU checks it before the dtypes
    (regression: int32.bitwise_and_ of a larger other raised another error, clamp_ none)."""
    shapes = [o.shape for o in others if isinstance(o, torch.Tensor)]
    if not shapes:
        return
    try:
        shape = torch.broadcast_shapes(x.shape, *shapes)
    except RuntimeError:
        return  # the meta kernel's own error
    if shape != x.shape:
        raise RuntimeError(f"output with shape {list(x.shape)} doesn't match the broadcast shape {list(shape)}")


@register_meta_check(aten.clamp_.Tensor)
def _clamp_in_place(x: torch.Tensor, lo: Any = None, hi: Any = None) -> None:
    _in_place_shape(x, lo, hi)


def _in_place_cast(x: torch.Tensor, other: Any, *rest: Any, **kwargs: Any) -> None:
    """An in-place binary op writes its result type into self, which must be able to hold it
    (regression: uint8.mul_(float) was computed; the meta kernels of in-place ops do not check)."""
    _in_place_shape(x, other)
    result = torch.result_type(x, other)
    if not torch.can_cast(result, x.dtype):
        raise RuntimeError(f"result type {scalar_type_name(result)} can't be cast to the desired output type "
                           f"{scalar_type_name(x.dtype)}")


for _name in ("add_", "sub_", "mul_", "remainder_", "fmod_", "bitwise_and_", "bitwise_or_", "bitwise_xor_",
              "maximum", "minimum"):
    _packet = getattr(aten, _name)
    for _overload in ("Tensor", "Scalar"):
        if _name.endswith("_") and _overload in _packet.overloads():
            register_meta_check(getattr(_packet, _overload))(_in_place_cast)


@register_meta_check(aten.div_.Tensor, aten.div_.Scalar)
def _div_in_place(x: torch.Tensor, other: Any) -> None:
    """True division of integers gives the default float type."""
    _in_place_shape(x, other)
    result = torch.result_type(x, other)
    if not (result.is_floating_point or result.is_complex):
        result = torch.get_default_dtype()
    if not torch.can_cast(result, x.dtype):
        raise RuntimeError(f"result type {scalar_type_name(result)} can't be cast to the desired output type "
                           f"{scalar_type_name(x.dtype)}")


@register_meta_check(aten.logsumexp.default)
def _logsumexp(x: torch.Tensor, dim: Any, keepdim: bool = False) -> None:
    """CPU's (device-independent) logsumexp reduces all dims for dim=() but adds the [1, ...]
    maxes into the [] result in place, which refuses the broadcast (regression: a result on tpu)."""
    if isinstance(dim, (list, tuple)) and not dim and not keepdim and x.dim() > 0 and x.numel() > 0:
        raise RuntimeError(f"output with shape [] doesn't match the broadcast shape {[1] * x.dim()}")


@register_meta_check(aten.mean.default)
def _mean(x: torch.Tensor, dtype: Any = None) -> None:
    _mean_dim(x, None, False, dtype)  # CPU's dtype name (the meta kernel prints torch.int64)


@register_meta_check(aten.mean.dim)
def _mean_dim(x: torch.Tensor, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> None:
    # CPU checks the dtype before the dims (regression: an out-of-range dim's IndexError on tpu)
    if dtype is None and not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating point or "
                           f"complex dtype. Got: {scalar_type_name(x.dtype)}")


@register_meta_check(aten.mv.default)
def _mv(a: torch.Tensor, v: torch.Tensor) -> None:
    if a.dtype != v.dtype:  # regression: int64 @ int32 gave a result on tpu
        # CPU's mv makes its result with the vector's dtype and names (result, matrix, vector)
        raise RuntimeError(f"addmv input tensors must have the same dtype, but got {scalar_type_name(v.dtype)}, "
                           f"{scalar_type_name(a.dtype)}, and {scalar_type_name(v.dtype)}")
    if a.dim() == 2 and v.dim() == 1 and a.shape[1] != v.shape[0]:
        raise RuntimeError(f"size mismatch, got input ({a.shape[0]}), mat ({a.shape[0]}x{a.shape[1]}), "
                           f"vec ({v.shape[0]})")
    if a.dim() != 2 or v.dim() != 1:
        return  # the meta kernel's shape error comes first
    if a.dtype == torch.bool and a.numel() > 0:  # regression: a result on tpu (CUDA has no bool addmv either)
        raise NotImplementedError('"addmv_impl_cpu" not implemented for \'Bool\'')


@register_meta_arguments(aten.nansum.default)
def _nansum_all_dims(x: torch.Tensor, dim: Any = None, *rest: Any) -> list[Any]:
    """nansum(x, dim=()) reduces all dims on CPU, as sum does; PyTorch's meta kernel reduces none
    (regression: nansum(x, (), keepdim=True) kept x's shape)."""
    if isinstance(dim, (list, tuple)) and not dim:
        dim = list(range(x.dim()))
    return [x, dim, *rest]


@register_meta_check(aten.clamp_min.default, aten.clamp_max.default)
def _clamp_one_bound_bool(x: torch.Tensor, bound: Any) -> None:
    # regression: a result on tpu (CPU's and CUDA's scalar kernels have no bool case; a bool x
    # with an int bound computes in int64, which they have)
    if torch.result_type(x, bound) == torch.bool:
        raise NotImplementedError("\"clamp_scalar_cpu\" not implemented for 'Bool'")


@register_meta_check(aten.clamp.default, aten.clamp.Tensor)
def _clamp_bool(x: torch.Tensor, lo: Any = None, hi: Any = None) -> None:
    """A bool result: the scalar kernels refuse it, the tensor one with both bounds too (with one
    it is maximum or minimum, which take bool). Regression: clamp(bool, max=True) gave a result."""
    try:
        dtype = aten.clamp.default(x, lo, hi).dtype if not isinstance(lo, torch.Tensor) and not isinstance(
            hi, torch.Tensor) else aten.clamp.Tensor(x, lo, hi).dtype
    except (RuntimeError, TypeError):
        return  # the meta kernel's own error
    if dtype != torch.bool:
        return
    tensors = isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor)
    if tensors and lo is not None and hi is not None:
        raise NotImplementedError("\"clamp_cpu\" not implemented for 'Bool'")
    if not tensors:
        kernel = "clamp_scalar_cpu" if lo is not None and hi is not None else (
            "clamp_max_scalar_cpu" if lo is None else "clamp_min_scalar_cpu")
        raise NotImplementedError(f"\"{kernel}\" not implemented for 'Bool'")


register_meta_check(aten.glu.default)(_float_kernel("glu_cpu"))  # regression: glu(bool) gave a result


@register_meta_check(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_rounding_bool(a: torch.Tensor, b: Any, rounding_mode: str | None = None) -> None:
    # regression: XLA's compile error on tpu (CPU's and CUDA's rounding kernels have no bool case)
    if rounding_mode in ("trunc", "floor") and _shapes_broadcast(a, b) and torch.result_type(a, b) == torch.bool:
        raise NotImplementedError(f'"div_{rounding_mode}_cpu" not implemented for \'Bool\'')


@register_meta_check(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide_bool(a: torch.Tensor, b: Any) -> None:
    if _shapes_broadcast(a, b) and torch.result_type(a, b) == torch.bool:  # (as div's floor rounding)
        raise NotImplementedError('"div_floor_cpu" not implemented for \'Bool\'')


def _cum_extreme_dim(func: str) -> Callable[..., None]:
    def check(x: torch.Tensor, dim: int) -> None:
        if x.dim() == 0 and dim not in (-1, 0):  # regression: the meta kernel took any dim of a 0-dim x
            raise IndexError(f"{func}(): Expected reduction dim -1 or 0 for scalar but got {dim}")

    return check


register_meta_check(aten.cummax.default)(_cum_extreme_dim("cummax"))
register_meta_check(aten.cummin.default)(_cum_extreme_dim("cummin"))


# Rounding of a bool: integer dtypes are copied, bool reaches the floating kernels (CPU's and
# CUDA's), which refuse it (regression: a result on tpu).
for _name in ("ceil", "floor", "round", "trunc"):
    register_meta_check(getattr(aten, _name).default)(_float_kernel(f"{_name}_vml_cpu", bool_only=True))
register_meta_check(aten.frac.default)(_float_kernel("frac_cpu"))  # regression: integers took it on tpu


@register_meta_check(aten.bitwise_not.default)
def _bitwise_not(x: torch.Tensor) -> None:
    if x.dtype.is_floating_point or x.dtype.is_complex:  # regression: XLA's compile error on tpu
        raise NotImplementedError(f'"bitwise_not_cpu" not implemented for \'{scalar_type_name(x.dtype)}\'')


def _is_bool(v: Any) -> bool:
    return v.dtype == torch.bool if isinstance(v, torch.Tensor) else isinstance(v, bool)


@register_meta_check(aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Tensor, aten.rsub.Scalar)
def _sub_bool(a: Any, b: Any, *rest: Any) -> None:
    """CPU's sub_check refuses any bool operand (regression: bool - int8 and friends gave a
    result on tpu, bool - True an XLA compile error)."""
    if _is_bool(a) and _is_bool(b):
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or "
                           "`logical_xor()` operator instead.")
    if _is_bool(a) or _is_bool(b):
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to "
                           "invert a mask, use the `~` or `logical_not()` operator instead.")


def _binary_kernel(kernel: str, floating: bool = False) -> Callable[..., None]:
    """A binary op whose CPU (and CUDA) kernel has no case for the result dtype: bool (or, with
    ``floating``, any non-floating type). Regression: XLA's compile error on tpu."""

    def check(a: Any, b: Any, *rest: Any) -> None:
        if not _shapes_broadcast(a, b):
            return
        dtype = torch.result_type(a, b)
        refused = not (dtype.is_floating_point or dtype.is_complex) if floating else dtype == torch.bool
        if refused:
            raise NotImplementedError(f'"{kernel}" not implemented for \'{scalar_type_name(dtype)}\'')

    return check


register_meta_check(aten.fmod.Tensor, aten.fmod.Scalar)(_binary_kernel("fmod_cpu"))
register_meta_check(aten.remainder.Tensor, aten.remainder.Scalar)(_binary_kernel("remainder_cpu"))
register_meta_check(aten.hypot.default)(_binary_kernel("hypot_cpu", floating=True))


def _shift_bool_operands(*args: Any) -> list[Any]:
    """CPU shifts a bool operand in the result's integer type (bool << int64 is int64); the meta
    kernel refuses bool operands (regression: tpu raised), so its call gets them converted."""
    a, b = args[0], args[1]
    dtype = torch.result_type(a, b)
    if dtype == torch.bool:
        return list(args)
    conv = [v.to(dtype) if isinstance(v, torch.Tensor) and v.dtype == torch.bool else
            (int(v) if isinstance(v, bool) else v) for v in (a, b)]
    return [*conv, *args[2:]]


for _ops in ((aten.__lshift__.Tensor, aten.__lshift__.Scalar, aten.bitwise_left_shift.Tensor,
              aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor),
             (aten.__rshift__.Tensor, aten.__rshift__.Scalar, aten.bitwise_right_shift.Tensor,
              aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor)):
    register_meta_arguments(*_ops)(_shift_bool_operands)


register_meta_check(aten.pow.Tensor_Tensor, aten.pow.Scalar)(_binary_kernel("pow"))  # regression: bool ** bool gave a result


@register_argument_check(aten.hardtanh.default)
def _hardtanh_limits(x: torch.Tensor, lo: Any = -1, hi: Any = 1) -> None:
    # the limits are runtime scalars: the meta kernel's check ran only for the key's first call
    # (regression: hardtanh(uint8, -1., 1.) after one with other limits gave a result)
    if x.dtype == torch.uint8 and (lo < 0 or hi < 0):
        raise RuntimeError("cannot do hardtanh on an unsigned type with negative limits")


@register_argument_check(aten.clamp.default)
def _clamp_bounds_fit(x: torch.Tensor, lo: Any = None, hi: Any = None) -> None:
    # CPU converts the scalar bounds into the result type with an overflow check; they are runtime
    # scalars, so this runs per call (regression: clamp(uint8, 0, 2**31) gave a result)
    for bound in (lo, hi):
        if bound is not None and not isinstance(bound, torch.Tensor):
            _check_fill_value(bound, torch.result_type(x, bound))


# -- CPU's wording where the meta kernels word a check otherwise (same exception type) ----------
@register_meta_check(aten.gather.default)
def _gather(x: torch.Tensor, dim: int, index: torch.Tensor, *rest: Any) -> None:
    check_dim(x, dim)
    if index.numel() and index.dtype not in (torch.int32, torch.int64):  # (CPU returns an empty index first)
        raise RuntimeError("gather(): Expected dtype int32/int64 for index")


@register_meta_check(aten.take.default)
def _take(x: torch.Tensor, index: torch.Tensor) -> None:
    if index.dtype != torch.int64:
        raise RuntimeError(f"take(): Expected a long tensor for index, but got {scalar_type_name(index.dtype)}")


@register_meta_check(aten.scatter_reduce.two)
def _scatter_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str,
                    *rest: Any) -> None:
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    if reduce == "mean" and x.dtype == torch.bool and index.numel():
        # CPU's kernel has no boolean mean (XLA refused the division: a CompileError, found by the fuzz);
        # CPU checks the dim first (index bounds too, which are known only on the device here)
        check_dim(x, dim)
        raise NotImplementedError('"scatter_gather_tensor_cpu_reduce_mean" not implemented for \'Bool\'')


@register_meta_check(aten.roll.default)
def _roll(x: torch.Tensor, shifts: Any, dims: Any = ()) -> None:
    if len(dims) and len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")


@register_meta_check(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(x: torch.Tensor, mask: torch.Tensor, value: Any) -> None:
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{cpp_type_name(mask.dtype)}")
