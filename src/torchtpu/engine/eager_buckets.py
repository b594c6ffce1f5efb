"""Shape buckets for eager calls: one program per power-of-two bucket, not per size.

A loop whose tensors change length every iteration compiles every op once per length. Here a
tensor can live on a *bucket-sized* buffer: its storage has CPU's exact size, its buffer
``bucket(n)`` rows (the next power of two, padding on dim 0 only), and the storage is the
buffer's row-major prefix. Every program cuts a tensor out of its storage (``views.read_view``),
so ops that know nothing of buckets read the exact tensor and stay correct.

Padded buffers come from host uploads whose call site has seen two different first sizes for
one dtype and trailing shape, and from the outputs of bucketed calls; such storages are marked
(``_MARK``). A call with an argument on a marked storage, read at its bucket size, is a
*bucketed call*: its program is keyed by the bucket shapes, and the actual sizes are a runtime
vector. Whether the op may run padded is decided once per program by ``bucketing.analyze`` on a
one-op graph with symbolic sizes (the analysis of compiled graphs, with ``EAGER_RULES``): valid
elements must stay where they are, and ops that mix positions along a padded dim get masks
(reductions' identities, contractions' zeros, sort's last value...). An op it cannot place runs
at exact size, as before. Results bind with CPU's shape on the bucket-sized buffer (no copy).
Strict and Debug run the call (``try_run``); DeferAndFuse records it bucketed (``try_record``),
so that its fused region is keyed by bucketed op keys.

``TORCH_TPU_EAGER_BUCKETS=exact`` (or ``set_eager_buckets("exact")``) turns it off
(docs/eager_shapes.md).
"""

from __future__ import annotations

import logging
import math
import operator
import os
import types
from typing import Any

import numpy as np
import torch
import torch.fx

from .. import _C
from .._config import config
from ..lowering.builder import Builder
from ..lowering.views import is_contiguous
from ..runtime import env
from . import bucketing

_MARK = "_tpu_bucketed"  # attribute of a storage whose buffer may be bucket-sized
EXACT = object()  # try_run's answer for a call that runs at exact size
_exact_keys: set[Any] = set()  # bucketed keys whose op cannot run padded (the analysis said so)
_MAX_PADDED_BYTES = 1 << 28  # a larger upload keeps an exact buffer (padding may double it)

_mode: str = "pow2"


def set_eager_buckets(mode: str) -> None:
    """``"pow2"`` (default): eager calls on changing sizes share a program per power-of-two
    bucket; ``"exact"``: one program per size."""
    global _mode
    if mode not in ("pow2", "exact"):
        raise ValueError(f"torchtpu: eager buckets are 'pow2' or 'exact', got {mode!r}")
    _mode = mode


def enabled() -> bool:
    return _mode == "pow2"


set_eager_buckets(env.read("TORCH_TPU_EAGER_BUCKETS"))


def bucket(n: int) -> int:
    """The bucket of a dim of ``n`` (n >= 1): the next power of two."""
    return 1 << (n - 1).bit_length()


def mark(storage: torch.UntypedStorage) -> None:
    setattr(storage, _MARK, True)


def is_marked(storage: torch.UntypedStorage) -> bool:
    return getattr(storage, _MARK, False)


# -- uploads ----------------------------------------------------------------------------------
# (code, line, dtype, trailing shape) -> the first size seen there, or -1 once a second was
_sites: dict[tuple, int] = {}
_MAX_SITES = 4096
_LIBRARY_DIRS = (os.path.dirname(torch.__file__) + os.sep,
                 os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


def upload_rows(host: torch.Tensor, caller: types.FrameType | None) -> int | None:
    """The rows of the buffer to upload ``host`` into when it should be padded, else None.

    Only uploads written in user code (``caller``, the frame of ``x.to("tpu")``) whose line has
    seen another first size for the same dtype and trailing shape: a loop over lengths. Uploads
    made inside torch (``Module.to``'s parameters) or torchtpu keep exact buffers."""
    if _mode != "pow2" or host.dim() == 0 or host.shape[0] == 0 or caller is None:
        return None
    if caller.f_code.co_filename.startswith(_LIBRARY_DIRS):
        return None
    rows = host.shape[0]
    key = (caller.f_code, caller.f_lineno, host.dtype, tuple(host.shape[1:]))
    first = _sites.get(key)
    if first is None:
        if len(_sites) >= _MAX_SITES:
            _sites.clear()
        _sites[key] = rows
        return None
    if first == rows:
        return None
    _sites[key] = -1
    padded = bucket(rows)
    if padded * (host.numel() // rows) * host.element_size() > _MAX_PADDED_BYTES:
        return None
    return padded


def pad_rows(host: torch.Tensor, rows: int) -> torch.Tensor:
    """``host`` followed by garbage rows up to ``rows``: NaN, or the type's largest value (no
    program may read them as data; garbage makes a test fail where one does)."""
    extra = rows - host.shape[0]
    if extra == 0:
        return host
    pad = torch.empty((extra, *host.shape[1:]), dtype=host.dtype)
    if host.dtype.is_floating_point or host.dtype.is_complex:
        pad.fill_(float("nan"))
    else:
        pad.fill_(True if host.dtype == torch.bool else torch.iinfo(host.dtype).max)
    return torch.cat([host.contiguous(), pad])


# -- bucketed calls ---------------------------------------------------------------------------
def _dynamic_dim(spec: tuple, sk: tuple) -> tuple[int, int, int] | None:
    """(dim, actual size, bucket) of a tensor spec on a marked storage that can be read at bucket
    size: a permutation of a contiguous prefix of its storage whose outermost dim (``dim``)
    pads within the buffer. None: the tensor is read at its exact size."""
    if sk[0] != "B" or sk[2] != spec[2] or len(spec) > 6 or spec[5] != 0:
        return None
    shape, stride = spec[3], spec[4]
    dims = sorted((d for d in range(len(shape)) if shape[d] > 1), key=lambda d: stride[d])
    if not dims:
        return None
    expected = 1
    for d in dims:
        if stride[d] != expected:
            return None
        expected *= shape[d]
    outer = dims[-1]
    size = shape[outer]
    padded = bucket(size)
    if padded * stride[outer] > math.prod(sk[1]):
        return None
    return outer, size, padded


def try_run(plan: Any, values: list[Any], specs: list, skeys: tuple, col: Any, precision: str) -> Any:
    """Run the call bucketed when an argument lives on a marked storage and the op can run padded;
    else return EXACT (the caller runs it at exact size)."""
    call = _bucketed_call(plan, specs, skeys, col, precision)
    if call is None:
        return EXACT
    from . import executor

    bspecs, bskeys, key, dynamic, sizes = call
    entry = executor._cache.get(key)
    slot = len(col.inputs)
    col.inputs.append(("host", np.array(sizes, dtype=np.int64)))
    if entry is None:
        try:
            entry = _compile(plan, values, bspecs, bskeys, col, key, precision, dynamic, sizes, slot)
        except Exception:  # noqa: BLE001  NotBucketable, or a rule that did not expect this call:
            # the exact call is always correct, and raises PyTorch's own error where there is one
            col.inputs.pop()
            _refuse(key)
            return EXACT
    else:
        executor.stats.hits += 1
    shapes = _exact_shapes(entry.shape_dims, sizes)
    new_tensors = executor.execute_and_bind(col, bskeys, entry.entry, shapes)
    for t, dims in zip(new_tensors, _new_dims(entry)):
        if t is not None and dims is not None:
            mark(t.untyped_storage())
    if config.check_nan:
        executor._check_nan(plan, new_tensors)
    return executor.op_result(plan, values, new_tensors)


def try_record(plan: Any, values: list[Any], specs: list, skeys: tuple, col: Any, precision: str) -> Any:
    """DeferAndFuse: record the call bucketed (its node emitted with the masks into the fused
    program, which is then keyed by the bucketed op key), or return EXACT."""
    call = _bucketed_call(plan, specs, skeys, col, precision)
    if call is None:
        return EXACT
    from . import deferred, executor

    bspecs, bskeys, key, dynamic, sizes = call
    hook = _recorded.get(key)
    if hook is None:
        try:
            hook = _plan_record(plan, values, bspecs, dynamic, sizes, len(col.inputs))
        except Exception:  # noqa: BLE001  (as in try_run: the exact call)
            _refuse(key)
            return EXACT
        _recorded[key] = hook
    col.inputs.append(("host", np.array(sizes, dtype=np.int64)))
    new_tensors = deferred.record_bucketed(plan, values, bspecs, bskeys, col, key, hook,
                                           _exact_shapes(hook.shape_dims, sizes))
    for t, dims in zip(new_tensors, hook.shape_dims):
        if t is not None and dims is not None:
            mark(t.untyped_storage())
    return executor.op_result(plan, values, new_tensors)


def _bucketed_call(plan: Any, specs: list, skeys: tuple, col: Any, precision: str) -> tuple | None:
    """(bucket specs, storage keys, bucketed op key, padded dims, actual sizes) of a call with an
    argument on a marked storage that reads at bucket size, or None (an exact call)."""
    for s in col.storages:  # (a loop, not any(): this runs before every eager call)
        if getattr(s, _MARK, False):
            break
    else:
        return None
    sizes: list[int] = []  # per symbol: its actual size (one symbol per distinct size)
    dynamic: dict[tuple, tuple[int, int]] = {}  # spec path -> (dim, symbol)
    bspecs = list(specs)
    read_whole: set[int] = set()
    for i, s in enumerate(specs):
        if s[0] == "T":
            bspecs[i] = _bucket_spec(s, (i,), skeys, col, sizes, dynamic, read_whole)
        elif s[0] == "L":
            bspecs[i] = ("L", tuple(_bucket_spec(x, (i, j), skeys, col, sizes, dynamic, read_whole)
                                    if x[0] == "T" else x for j, x in enumerate(s[1])))
    if not dynamic:
        return None
    for i, s in enumerate(specs):  # broadcast operands of a padded length (a sum's gradient)
        if s[0] == "T":
            bspecs[i] = _expanded_spec(bspecs[i], (i,), sizes, dynamic)
        elif s[0] == "L":
            bspecs[i] = ("L", tuple(_expanded_spec(x, (i, j), sizes, dynamic) if x[0] == "T" else x
                                    for j, x in enumerate(bspecs[i][1])))
    # a padded read needs the storage's whole buffer: its numel in the key is the buffer's
    bskeys = tuple((sk[0], sk[1], sk[2], math.prod(sk[1])) if k in read_whole else sk for k, sk in enumerate(skeys))
    pattern = tuple(sorted(dynamic.items()))
    key = _C._op_key((plan, precision, col.has_f64, tuple(bspecs), bskeys, ("bucketed", pattern)))
    if key in _exact_keys:
        return None
    return bspecs, bskeys, key, dynamic, sizes


def _refuse(key: Any) -> None:
    if len(_exact_keys) >= _MAX_SITES:
        _exact_keys.clear()
    _exact_keys.add(key)


def _exact_shapes(shape_dims: list[tuple[int, ...] | None], sizes: list[int]) -> list[tuple[int, ...] | None]:
    return [None if dims is None else tuple(sizes[-d - 1] if d < 0 else d for d in dims) for dims in shape_dims]


def _bucket_spec(s: tuple, path: tuple, skeys: tuple, col: Any, sizes: list[int], dynamic: dict,
                 read_whole: set[int]) -> tuple:
    """The spec of one tensor argument in a bucketed call (its bucket shape if it pads)."""
    if not getattr(col.storages[s[1]], _MARK, False):
        return s
    found = _dynamic_dim(s, skeys[s[1]])
    if found is None:
        return s
    dim, size, padded = found
    if size not in sizes:
        sizes.append(size)
    dynamic[path] = (dim, sizes.index(size))
    read_whole.add(s[1])
    shape = list(s[3])
    shape[dim] = padded
    return ("T", s[1], s[2], tuple(shape), s[4], s[5])


def _expanded_spec(s: tuple, path: tuple, sizes: list[int], dynamic: dict) -> tuple:
    """A tensor expanded (stride 0) along a dim of a padded call's actual length reads the same
    at the bucket length: that dim pads too, so that it matches the padded operands."""
    if path in dynamic or len(s) > 6:
        return s
    for d, (size, stride) in enumerate(zip(s[3], s[4])):
        if stride == 0 and size in sizes:
            dynamic[path] = (d, sizes.index(size))
            shape = list(s[3])
            shape[d] = bucket(size)
            return ("T", s[1], s[2], tuple(shape), s[4], s[5])
    return s


class _Bucketed:
    """A bucketed call's program: the executor's Entry, and per output the dims of its exact
    shape (an int, or ``-1 - symbol`` for an actual size), None where the buffer's shape is it."""

    __slots__ = ("entry", "shape_dims")

    def __init__(self, entry: Any, shape_dims: list[tuple[int, ...] | None]) -> None:
        self.entry = entry
        self.shape_dims = shape_dims


def _new_dims(entry: _Bucketed) -> list[tuple[int, ...] | None]:
    """shape_dims of the new tensors only (op_result's order), not of written storages."""
    return [dims for spec, dims in zip(entry.entry.outputs, entry.shape_dims) if spec[0] in ("new", "none")]


def _compile(plan: Any, values: list[Any], bspecs: list, bskeys: tuple, col: Any, key: Any, precision: str,
             dynamic: dict, sizes: list[int], slot: int) -> _Bucketed:
    from . import compile_cache, executor

    graph_plan, node = _analyze(plan, values, bspecs, dynamic, sizes)
    try:
        metas, func_args = executor.op_metas(plan, values, bspecs)
    except Exception as e:  # noqa: BLE001  (the exact call raises PyTorch's own error, if any)
        raise bucketing.NotBucketable(f"meta at bucket sizes: {e}") from None
    b = Builder()
    input_values, storage_vals = executor.program_inputs(b, col, bskeys)
    masks = _mask_hook(graph_plan, node, _buckets(graph_plan, bspecs, dynamic), b, input_values[slot])
    outputs, out_values = executor.emit_op(b, plan, bspecs, values, bskeys, input_values, storage_vals, metas,
                                           func_args, precision, masks)
    shape_dims = _output_dims(graph_plan, outputs)
    text = b.module(out_values)
    exe = compile_cache.compile_program(
        text, f"aten::{plan.op.__name__}({executor.describe_arguments(values)}) [bucketed]", eager=True)
    executor.stats.misses += 1
    entry = _Bucketed(executor.Entry(exe, outputs, [executor._to_out_meta(m) for m in metas]), shape_dims)
    with executor._cache_lock:
        executor._cache[key] = entry
    return entry


class RecordedHook:
    """What emitting a recorded bucketed node needs (deferred._emit): its masks, and per output
    the dims of its exact shape (see _Bucketed)."""

    __slots__ = ("buckets", "graph_plan", "node", "shape_dims", "slot")

    def __init__(self, graph_plan: bucketing.Plan, node: torch.fx.Node, buckets: dict, slot: int,
                 shape_dims: list[tuple[int, ...] | None]) -> None:
        self.graph_plan = graph_plan
        self.node = node
        self.buckets = buckets
        self.slot = slot  # the collected input of the actual sizes
        self.shape_dims = shape_dims

    def arg_hook(self, b: Builder, input_values: list[Any]) -> Any:
        """emit_op's ``arg_hook`` for this node, in the fused program ``b``."""
        return _mask_hook(self.graph_plan, self.node, self.buckets, b, input_values[self.slot])


def _buckets(graph_plan: bucketing.Plan, bspecs: list, dynamic: dict) -> dict:
    """Each size symbol of the one-op graph -> its bucket (the padded dim's size in the call's specs)."""
    return {graph_plan.symbols[k]: _spec_at(bspecs, path)[3][dim] for path, (dim, k) in dynamic.items()}


def _mask_hook(graph_plan: bucketing.Plan, node: torch.fx.Node, buckets: dict, b: Builder, sizes: Any) -> Any:
    """emit_op's ``arg_hook`` for a bucketed call: the analysis's masks, with the actual ``sizes``
    (the program's input Value), as MaskHook applies them to a compiled graph's node."""
    hook = bucketing.MaskHook(graph_plan, b, sizes, buckets)

    def arg_hook(args: list) -> tuple[list, Any]:
        args, _, post = hook(node, args, {})
        return args, post
    return arg_hook


# bucketed key -> its RecordedHook (DeferAndFuse; bounded like the refusals)
_recorded: dict[Any, RecordedHook] = {}


def _plan_record(plan: Any, values: list[Any], bspecs: list, dynamic: dict, sizes: list[int], slot: int
                 ) -> RecordedHook:
    """The analysis of a call to record bucketed: what _compile checks, without compiling."""
    from . import executor

    graph_plan, node = _analyze(plan, values, bspecs, dynamic, sizes)
    metas, _ = executor.op_metas(plan, values, bspecs)
    outputs = []
    for m in metas:
        if m is None:
            outputs.append(("none",))
            continue
        stride = m.stride() if executor.is_dense_permutation(m.shape, m.stride()) else \
            executor.contiguous_strides(m.shape)
        outputs.append(("new", m.dtype, tuple(m.shape), tuple(stride)))
    if len(_recorded) >= _MAX_SITES:
        _recorded.clear()
    return RecordedHook(graph_plan, node, _buckets(graph_plan, bspecs, dynamic), slot,
                        _output_dims(graph_plan, outputs))


def _spec_at(specs: list, path: tuple) -> tuple:
    s = specs[path[0]]
    return s[1][path[1]] if len(path) > 1 else s


def _output_dims(graph_plan: bucketing.Plan, outputs: list[tuple]) -> list[tuple[int, ...] | None]:
    """Per output, its exact shape's dims (see _Bucketed); NotBucketable unless each padded output
    is a contiguous prefix of its buffer (padded on its first dim only)."""
    if len(graph_plan.output_layouts) != len(outputs):
        raise bucketing.NotBucketable("outputs do not match the graph's")
    dims_out: list[tuple[int, ...] | None] = []
    for spec, lay, exprs in zip(outputs, graph_plan.output_layouts, graph_plan.outputs):
        if spec[0] != "new" or lay is None or not bucketing._is_padded(lay):
            dims_out.append(None)
            continue
        shape, stride = spec[2], spec[3]
        if bucketing._is_padded(lay, range(1, len(lay))) or not is_contiguous(shape, stride):
            raise bucketing.NotBucketable("a padded output that is not its buffer's prefix")
        dims: list[int] = []
        for d, e in enumerate(exprs):
            if e.free_symbols:
                if d != 0 or e not in graph_plan.symbols:
                    raise bucketing.NotBucketable(f"output size {e}")
                dims.append(-1 - graph_plan.symbols.index(e))
            else:
                dims.append(int(e))
        dims_out.append(tuple(dims))
    return dims_out


# -- the one-op graph ---------------------------------------------------------------------------
def _analyze(plan: Any, values: list[Any], bspecs: list, dynamic: dict, sizes: list[int]
             ) -> tuple[bucketing.Plan, torch.fx.Node]:
    """``bucketing.analyze`` of the call as a one-op graph whose padded dims are symbols (one per
    distinct actual size, hinted with it, so that meta kernels see this call's sizes)."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    from . import executor

    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)
    symbols = []
    for k, n in enumerate(sizes):
        sym = shape_env.create_symbol(n, ConstantSource(f"eager_bucket_{k}"), dynamic_dim=DimDynamic.DYNAMIC)
        symbols.append(shape_env.create_symintnode(sym, hint=n))
    graph = torch.fx.Graph()
    for k, s in enumerate(symbols):
        graph.placeholder(f"s{k}").meta["val"] = s

    def fake(spec: Any, value: Any, path: tuple) -> tuple[Any, Any]:
        """(value for the meta call, argument of the graph node)"""
        kind = spec[0] if isinstance(spec, tuple) and spec else None
        if kind == "T":
            shape: list[Any] = list(spec[3])
            if path in dynamic:
                dim, k = dynamic[path]
                shape[dim] = symbols[k]
            with mode:
                t = torch.empty_strided(shape, spec[4], dtype=spec[2])
            p = graph.placeholder(f"t{len(graph.nodes)}")
            p.meta["val"] = t
            return t, p
        if kind == "L":
            pairs = [fake(x, v, (path[0], j)) for j, (x, v) in enumerate(zip(spec[1], value))]
            return [a for a, _ in pairs], [n for _, n in pairs]
        if kind == "G":
            raise bucketing.NotBucketable("a random op")
        if isinstance(value, torch.device) and value.type == "tpu":
            return torch.device("cpu"), torch.device("cpu")
        return value, value

    pairs = [fake(s, v, (i,)) for i, (s, v) in enumerate(zip(bspecs, values))]
    func_args = [pairs[i][0] for i in plan.func_arg_positions]
    node_args = tuple(pairs[i][1] for i in plan.func_arg_positions)
    # FakeTensorMode logs a meta kernel's failure at ERROR level (printed where logging is not
    # configured): here a failure only means the call runs exact, which raises it, if anything
    log = logging.getLogger("torch._subclasses.fake_tensor")
    disabled, log.disabled = log.disabled, True
    try:
        with mode:
            out = executor._call_meta(plan, [a for a, _ in pairs], func_args)
    except Exception as e:  # noqa: BLE001  (the exact call raises PyTorch's own error, if any)
        raise bucketing.NotBucketable(f"meta with symbolic sizes: {e}") from None
    finally:
        log.disabled = disabled
    if any(g.expr.free_symbols for g in shape_env.guards):
        # the meta kernel branched on a size: another size of the bucket may take another branch
        raise bucketing.NotBucketable("a guard on a symbolic size")
    node = graph.call_function(plan.functional, node_args)
    node.meta["val"] = out
    if isinstance(out, (list, tuple)):
        outs = []
        for j, v in enumerate(out):
            item = graph.call_function(operator.getitem, (node, j))
            item.meta["val"] = v
            outs.append(item)
        graph.output(outs)
    else:
        graph.output([node])
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    return bucketing.analyze(gm, eager=True), node
