"""Index bounds: which values each indexing op accepts, and the device check of them.

XLA clamps an out-of-range gather or scatter index without a word, so an op that
the CPU refuses would compute a wrong answer here. Each indexing op registers the
ranges its index arguments must lie in (``register_index_bounds``), with the
exception type and message the CPU raises. Debug mode checks them on the host
as the op returns; Strict and DeferAndFuse check them on the device, with
``torchtpu::index_bounds_flag``, and report at the next synchronization
(engine/index_checks.py), as CUDA reports a device-side assert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .builder import Builder, Value
from .registry import (
    LoweringContext,
    register,
    register_graph_only,
    register_host_kernel,
    register_index_bounds,
)

aten = torch.ops.aten


@dataclass(frozen=True)
class Bound:
    """``index`` must lie in [low, high) (``exempt``, e.g. nll_loss's ignore_index, is allowed
    too), or with ``nonzero`` (a divisor) be nonzero, low and high unused; otherwise the op
    raises ``error(message.format(value=v, position=p))`` for the first offending value ``v``,
    at flat position ``p`` of ``index``."""

    index: torch.Tensor
    low: int
    high: int
    error: type[Exception]
    message: str
    exempt: int | None = None
    nonzero: bool = False


# The flag is int64 [code, value, position]: code 0 while every check passed, else the code of the
# first failed check (engine/index_checks.py maps codes to messages), its first offending index
# value and that value's flat position in the index.
_lib = torch.library.Library("torchtpu", "DEF")
# low, high and code are Scalars, so runtime values of the program: an index into a tensor of a
# new size (whose bounds and message code differ) reuses the program (eager loops over 100 sizes
# compiled one check per size)
_lib.define("index_bounds_flag(Tensor flag, Tensor index, Scalar low, Scalar high, int? exempt, Scalar code, "
            "bool nonzero=False) -> Tensor")
_lib.impl("index_bounds_flag", lambda flag, index, low, high, exempt, code, nonzero=False: torch.empty_like(flag),
          "Meta")
INDEX_BOUNDS_FLAG = torch.ops.torchtpu.index_bounds_flag.default
_INT64_MIN = torch.iinfo(torch.int64).min


def _int64(b: Builder, x: int | Value, shape: tuple[int, ...]) -> Value:
    """A bound (a constant, or a runtime scalar of the program) as int64 of ``shape``."""
    if not isinstance(x, Value):
        return b.constant(x, torch.int64, shape)
    x = b.convert(b.reshape(x, ()) if x.shape else x, torch.int64)
    return b.broadcast_to(x, shape) if shape else x


def fold_bound(b: Builder, flag: Value, index: Value, low: int | Value, high: int | Value, exempt: int | None,
               code: int | Value, nonzero: bool = False) -> Value:
    """``flag`` with this check folded in: unchanged unless it is still clear and some value of
    ``index`` lies outside [low, high) (other than ``exempt``), or with ``nonzero`` is zero."""
    n = index.numel
    idx = b.reshape(b.convert(index, torch.int64), (n,))
    shape = idx.shape
    bad = b.binary("or", b.compare(idx, _int64(b, low, shape), "LT"),
                   b.compare(idx, _int64(b, high, shape), "GE"))
    if nonzero:
        bad = b.compare(idx, b.constant(0, torch.int64, shape), "EQ")
    if exempt is not None:
        bad = b.binary("and", bad, b.compare(idx, b.constant(exempt, torch.int64, shape), "NE"))
    # the first offending position (n when none) and the value there, as the CPU reports them
    iota = b.iota(shape, 0, torch.int64)
    position = b.reduce(b.select(bad, iota, b.constant(n, torch.int64, shape)), [0], b.constant(n, torch.int64),
                        "stablehlo.minimum")
    at = b.compare(iota, b.broadcast_to(position, shape), "EQ")
    value = b.reduce(b.select(at, idx, b.constant(_INT64_MIN, torch.int64, shape)), [0],
                     b.constant(_INT64_MIN, torch.int64), "stablehlo.maximum")
    old = [b.reshape(b.slice(flag, [k], [k + 1]), ()) for k in range(3)]
    first = b.binary("and", b.compare(old[0], b.constant(0, torch.int64), "EQ"),
                     b.compare(position, b.constant(n, torch.int64), "LT"))
    new = [_int64(b, code, ()), value, position]
    return b.concatenate([b.reshape(b.select(first, v, o), (1,)) for v, o in zip(new, old)], 0)


@register(INDEX_BOUNDS_FLAG)
def _index_bounds_flag(ctx: LoweringContext, flag: Value, index: Value, low: int | Value, high: int | Value,
                       exempt: int | None, code: int | Value, nonzero: bool = False) -> Value:
    return fold_bound(ctx.b, flag, index, low, high, exempt, code, nonzero)


# -- the ranges of each op's index arguments, as the CPU kernels check them ----------------
def _dim_size(x: torch.Tensor, dim: int) -> tuple[int, int]:
    """(wrapped dim, its size); a 0-d tensor indexes like a 1-element one."""
    if x.dim() == 0:
        return 0, 1
    dim = dim % x.dim()
    return dim, x.shape[dim]


def _out_of_dim(dim: int, size: int) -> str:
    """The CPU's message for an index outside a dim ({value}: the index)."""
    return f"index {{value}} is out of bounds for dimension {dim} with size {size}"


@register_index_bounds(aten.embedding.default)
def _embedding_bounds(weight: torch.Tensor, indices: torch.Tensor, *rest: Any) -> list[Bound]:
    return [Bound(indices, 0, weight.shape[0], IndexError, "index out of range in self")]


@register_index_bounds(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag_bounds(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                          *rest: Any) -> list[Bound]:
    n = weight.shape[0]
    bounds = [Bound(indices, 0, n, RuntimeError,
                    f"Index {{position}} of input takes value {{value}} which is not in the valid range [0, {n})")]
    if _computed_on_device(offsets) and offsets.numel():
        # CPU's message prints offsets[0] as a 0-dim tensor
        legacy = {torch.int64: "Long", torch.int32: "Int"}.get(offsets.dtype, "Long")
        bounds.append(Bound(offsets[:1], 0, 1, RuntimeError, "offsets[0] has to be 0, i.e., the first sequence in the "
                            "mini-batch has to start from position 0. However, got {value}\n"
                            f"[ torch.{legacy}Tensor{{{{}}}} ]"))
    return bounds


@register_index_bounds(aten.index_select.default, aten.index_reduce.default)
def _index_select_bounds(x: torch.Tensor, dim: int, index: torch.Tensor, *rest: Any) -> list[Bound]:
    d, size = _dim_size(x, dim)
    if rest == () and x.dim() > 1 and (d == 1 or x.numel() == 0):
        # CPU's index_select takes a fast path for dim 1 of a matrix or more, and another for an
        # empty x, each with a RuntimeError of its own (index_select_out_cpu_dim1_; regression:
        # tpu raised the IndexError); a 0-d or 1-d x takes neither
        return [Bound(index, 0, size, RuntimeError, f"INDICES element is out of DATA bounds, id={{value}} "
                      f"axis_dim={size}")]
    return [Bound(index, 0, size, IndexError, "index out of range in self")]


def _slices_empty(x: torch.Tensor, d: int) -> bool:
    """Whether the slices of ``x`` along dim ``d`` hold no elements: CPU's kernels then copy or
    fill nothing and check no index (regression: tpu raised for x of shape [3, 1, 0])."""
    return x.dim() > 0 and any(s == 0 for i, s in enumerate(x.shape) if i != d)


@register_index_bounds(aten.index_copy.default)
def _index_copy_bounds(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> list[Bound]:
    d, size = _dim_size(x, dim)
    if _slices_empty(x, d):
        return []
    return [Bound(index, 0, size, IndexError, "index_copy_(): " + _out_of_dim(d, size))]


@register_index_bounds(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def _index_fill_bounds(x: torch.Tensor, dim: int, index: torch.Tensor, value: Any) -> list[Bound]:
    """Negative indices count from the end."""
    d, size = _dim_size(x, dim)
    if _slices_empty(x, d):
        return []
    return [Bound(index, -size, size, IndexError, _out_of_dim(d, size))]


@register_index_bounds(aten.gather.default, aten.scatter.src, aten.scatter.value, aten.scatter.reduce,
                       aten.scatter.value_reduce, aten.scatter_add.default, aten.scatter_reduce.two)
def _dim_index_bounds(x: torch.Tensor, dim: int, index: torch.Tensor, *rest: Any) -> list[Bound]:
    d, size = _dim_size(x, dim)
    return [Bound(index, 0, size, RuntimeError, _out_of_dim(d, size))]


@register_index_bounds(aten.index_add.default)
def _index_add_bounds(x: torch.Tensor, dim: int, index: torch.Tensor, *rest: Any) -> list[Bound]:
    """CPU's index_add_ of an x of more than one dim (index_add_cpu_out) checks nothing when x or the
    index is empty, and goes through scatter_add_, whose error is a RuntimeError, along the first or
    last dim with an int64 index, alpha 1 and a source of x's sizes but at dim; otherwise it raises
    its own IndexError (regression: tpu raised the RuntimeError for all)."""
    d, size = _dim_size(x, dim)
    source = rest[0] if rest else None
    alpha = rest[1] if len(rest) > 1 else 1
    if x.dim() > 1 and (x.numel() == 0 or index.numel() == 0):
        return []
    scatter_path = (x.dim() > 1 and d in (0, x.dim() - 1) and index.dtype == torch.int64 and alpha == 1
                    and isinstance(source, torch.Tensor) and source.dim() == x.dim()
                    and all(a == b for i, (a, b) in enumerate(zip(x.shape, source.shape)) if i != d))
    if scatter_path:
        return [Bound(index, 0, size, RuntimeError, _out_of_dim(d, size))]
    return [Bound(index, 0, size, IndexError, "index out of range in self")]


def _broadcast_or_none(shapes: list) -> tuple:
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return ()  # (the meta kernel has reported it already)


@register_index_bounds(aten.index.Tensor, aten.index_put.default)
def _advanced_index_bounds(x: torch.Tensor, indices: list, *rest: Any) -> list[Bound]:
    """Negative indices count from the end; a boolean mask takes as many dims as it has.

    The CPU's message numbers a dim among the indexed ones only (``x[:, i]`` reports dim 0).
    """
    bounds = []
    d = 0  # the dim of x the next index applies to
    indexed = 0  # how many dims were indexed before it
    free = []  # the dims no index tensor applies to
    for t in indices:
        if t is None:
            free.append(d)
        d += t.dim() if t is not None and t.dtype in (torch.bool, torch.uint8) else 1
    free += range(d, x.dim())
    d = 0
    given = [t.shape for t in indices if t is not None and t.dtype not in (torch.bool, torch.uint8)]
    if any(x.shape[i] == 0 for i in free if i < x.dim()) or (given and 0 in _broadcast_or_none(given)):
        # the result (or the written part) has no elements: CPU's kernel checks no index
        # (regression: x[i] of an x of shape [2, 0, 4] raised on tpu; so did x[i, j] with i and j
        # broadcasting to nothing)
        return []
    for t in indices:
        if t is not None and t.dtype in (torch.bool, torch.uint8):
            d += t.dim()
            indexed += t.dim()
            continue
        if t is not None and d < x.dim():
            size = x.shape[d]
            bounds.append(Bound(t, -size, size, IndexError, _out_of_dim(indexed, size)))
            indexed += 1
        d += 1
    return bounds


@register_index_bounds(aten.take.default, aten.put.default)
def _flat_index_bounds(x: torch.Tensor, index: torch.Tensor, *rest: Any) -> list[Bound]:
    n = x.numel()
    return [Bound(index, -n, n, IndexError, f"out of range: tried to access index {{value}} on a tensor of {n} elements.")]


@register_index_bounds(aten.nll_loss_forward.default)
def _nll_loss_bounds(x: torch.Tensor, target: torch.Tensor, weight: Any, reduction: int,
                     ignore_index: int) -> list[Bound]:
    classes = x.shape[-1] if x.dim() < 2 else x.shape[1]
    return [Bound(target, 0, classes, IndexError, "Target {value} is out of bounds.", exempt=ignore_index)]


# -- integer division by zero -----------------------------------------------------------------
# CPU raises for an integer quotient or remainder by zero; XLA returns junk. The divisor must
# be nonzero: the same flag reports it at the next synchronization, and a divisor known on the
# host (a Python number) raises at once.
@register_index_bounds(aten.div.Tensor_mode, aten.div.Scalar_mode, aten.floor_divide.default,
                       aten.floor_divide.Scalar, aten.remainder.Tensor, aten.remainder.Scalar,
                       aten.remainder.Scalar_Tensor, aten.fmod.Tensor, aten.fmod.Scalar)
def _divisor_bounds(a: Any, c: Any, rounding_mode: Any = "floor") -> list[Bound]:
    if rounding_mode is None or not (isinstance(a, torch.Tensor) or isinstance(c, torch.Tensor)):
        return []
    dtype = torch.result_type(a, c)
    if dtype.is_floating_point or dtype.is_complex:
        return []
    divisor = c if isinstance(c, torch.Tensor) else torch.tensor(c)
    return [Bound(divisor, 0, 0, RuntimeError, "ZeroDivisionError", nonzero=True)]


# -- LAPACK-style info checks (aten._linalg_check_errors) in compiled graphs ----------------
_SENTINEL = 987654321  # an info value no message of PyTorch's contains by itself


def linalg_check_bounds(info: torch.Tensor, api_name: str, is_matrix: bool) -> list[Bound]:
    """``_linalg_check_errors(info, api_name, is_matrix)`` as a Bound: info must be 0 (in [0, 1)).

    The message is PyTorch's own: its CPU check is run once on a sentinel info, and the
    sentinel (and, for a batch, the element's number) become the flag's value and position.
    """
    probe = torch.zeros(max(info.numel(), 1), dtype=torch.int32)
    probe[0] = _SENTINEL
    try:
        torch.ops.aten._linalg_check_errors(probe.reshape(info.shape) if info.numel() else probe[0],
                                            api_name, is_matrix=is_matrix)
        return []  # (no message for this api: PyTorch itself would not raise)
    except RuntimeError as e:  # LinAlgError, or RuntimeError for lu_factor
        error, message = type(e), str(e).replace("{", "{{").replace("}", "}}")
    message = message.replace(str(_SENTINEL), "{value}").replace("(Batch element 0)", "(Batch element {position})")
    return [Bound(info, 0, 1, error, message)]


def _computed_on_device(t: Any) -> bool:
    """Whether checks derived from ``t`` can be computed: an eager call's tpu tensor. A compiled
    graph's fold gets example values, and only checks a node's own value, so it skips them."""
    return isinstance(t, torch.Tensor) and t.device.type == "tpu" and not torch._subclasses.fake_tensor.is_fake(t)


def _outside_unit_interval(p: torch.Tensor) -> torch.Tensor:
    """1 if some element of ``p`` is NaN or outside [0, 1], else 0 (an int64 scalar)."""
    return (~((p >= 0) & (p <= 1))).any().to(torch.int64)


@register_index_bounds(aten.binary_cross_entropy.default)
def _binary_cross_entropy_bounds(x: torch.Tensor, *rest: Any) -> list[Bound]:
    if not _computed_on_device(x) or not x.numel():
        return []
    return [Bound(_outside_unit_interval(x), 0, 1, RuntimeError, "all elements of input should be between 0 and 1")]


_BERNOULLI_MESSAGE = ("Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could this error message be "
                      "improved?  If so, please report an enhancement request to PyTorch.)")


@register_index_bounds(aten.bernoulli.default)
def _bernoulli_bounds(p: torch.Tensor, *rest: Any) -> list[Bound]:
    if not _computed_on_device(p) or not p.numel():
        return []
    return [Bound(_outside_unit_interval(p), 0, 1, RuntimeError, _BERNOULLI_MESSAGE)]


@register_index_bounds(aten.bernoulli.Tensor)
def _bernoulli_tensor_bounds(x: torch.Tensor, p: torch.Tensor, *rest: Any) -> list[Bound]:
    return _bernoulli_bounds(p)


@register_index_bounds(aten.normal.Tensor_Tensor, aten.normal.float_Tensor)
def _normal_std_bounds(mean: Any, std: Any, *rest: Any) -> list[Bound]:
    """CPU refuses a tensor std with a negative or NaN element."""
    if not _computed_on_device(std) or not std.numel():
        return []
    return [Bound((~(std >= 0)).any().to(torch.int64), 0, 1, RuntimeError, "normal expects all elements of std >= 0.0")]


@register_index_bounds(aten.multinomial.default)
def _multinomial_bounds(probs: torch.Tensor, *rest: Any) -> list[Bound]:
    """CPU refuses a negative, infinite or NaN probability, then a row summing to zero or less; the
    sampler would draw from such rows without a word. The checks are derived tensors, computed on
    the device by eager calls."""
    if not _computed_on_device(probs) or not probs.numel():
        return []
    bad = ((probs < 0) | ~torch.isfinite(probs)).any().to(torch.int64)
    empty = (probs.sum(-1) <= 0).any().to(torch.int64)
    return [Bound(bad, 0, 1, RuntimeError, "probability tensor contains either `inf`, `nan` or element < 0"),
            Bound(empty, 0, 1, RuntimeError, "invalid multinomial distribution (sum of probabilities <= 0)")]


# torch._assert_async(cond[, msg]): CPU raises at once when cond is zero; CUDA asserts on the device
# and reports later. Compiled graphs keep it whole (F.one_hot's decomposition asserts its classes):
# there the condition is a check on the index flag, raising CPU's error at the next synchronization.
# Eagerly it reads the condition, as CPU does.
_ASSERT_MESSAGE = "Expected Tensor with single nonzero value, but got zero"


def _check_single_value(numel: int) -> None:
    if numel != 1:
        amount = "no values" if numel == 0 else "more than one value"
        raise RuntimeError(f"Boolean value of Tensor with {amount} is ambiguous")


@register_index_bounds(aten._assert_async.default, aten._assert_async.msg)
def _assert_async_bounds(cond: torch.Tensor, msg: str | None = None) -> list[Bound]:
    _check_single_value(cond.numel())
    message = (_ASSERT_MESSAGE if msg is None else msg).replace("{", "{{").replace("}", "}}")
    return [Bound(cond, 0, 0, RuntimeError, message, nonzero=True)]


@register_graph_only(aten._assert_async.default, aten._assert_async.msg)
def _assert_async(ctx: LoweringContext, cond: Value, msg: str | None = None) -> None:
    if cond.dtype.is_floating_point or cond.dtype.is_complex:
        # the flag reads integers: 0.5 would count as zero
        raise NotImplementedError(f"torchtpu: aten::_assert_async of a {cond.dtype} condition in a compiled graph")
    _check_single_value(cond.numel)


@register_host_kernel(aten._assert_async.default, aten._assert_async.msg)
def assert_async(cond: torch.Tensor, msg: str | None = None) -> None:
    host = cond.cpu()
    if msg is None:
        torch._assert_async(host)
    else:
        torch._assert_async(host, msg)


_C_TYPE_NAMES = {torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int",
                 torch.int64: "int64_t", torch.float32: "float", torch.float64: "double",
                 torch.bfloat16: "c10::BFloat16", torch.float16: "c10::Half"}


def _fill_value_overflows(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """1 if the 0-dim ``value``, as CPU's ``value.item()`` converted to ``dtype`` (c10::overflows,
    see meta_checks._scalar_overflows), overflows, else 0 (an int64 scalar); None where it cannot."""
    if dtype == torch.bool or value.dtype == torch.bool or dtype.is_complex or value.dtype.is_complex:
        return None
    if dtype.is_floating_point:
        if not value.dtype.is_floating_point or torch.finfo(value.dtype).max <= torch.finfo(dtype).max:
            return None
        v = value.float()
        return (v.isfinite() & (v.abs() > torch.finfo(dtype).max)).to(torch.int64)
    info = torch.iinfo(dtype)
    if value.dtype.is_floating_point:
        v = value.float()
        return (~v.isfinite() | (v < float(info.min)) | (v > float(info.max))).to(torch.int64)
    v = value.to(torch.int64)
    low = -info.max if info.min == 0 else info.min  # (an integer wraps into an unsigned type)
    return ((v < low) | (v > info.max)).to(torch.int64)


def _fill_value_bounds(x: torch.Tensor, value: Any) -> list[Bound]:
    """CPU reads a tensor fill value with item() and converts it with an overflow check; here the
    value stays on the device, so the check does too (regression: masked_fill(uint8, tensor(-2.))
    filled on tpu)."""
    if not _computed_on_device(value) or value.numel() != 1:
        return []
    flag = _fill_value_overflows(value.reshape(()), x.dtype)
    if flag is None:
        return []
    name = _C_TYPE_NAMES.get(x.dtype, str(x.dtype))
    return [Bound(flag, 0, 1, RuntimeError, f"value cannot be converted to type {name} without overflow")]


@register_index_bounds(aten.masked_fill.Tensor)
def _masked_fill_tensor_bounds(x: torch.Tensor, mask: torch.Tensor, value: Any) -> list[Bound]:
    return _fill_value_bounds(x, value)
