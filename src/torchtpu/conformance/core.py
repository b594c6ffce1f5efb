"""Per-op conformance checks: one OpInfo entry, on ``tpu`` against CPU.

For each dtype the op supports, three kinds of check are recorded:

* ``forward``: the op on CPU sample inputs and on ``tpu`` copies of them;
  outputs must match in value (tolerance by dtype), dtype and shape, and live
  on ``tpu``;
* ``backward`` (differentiable ops, float dtypes): gradients of every input
  that requires grad, from a fixed random cotangent, must match CPU's;
* ``errors`` (once per op): each of ``op.error_inputs`` that raises on CPU
  must raise the same exception type on ``tpu``.

Every sample runs under ``torch.tpu.precision("highest")`` (f32-accurate
matrix products), so tolerances are those of the dtype, not of TPU's default
one-pass bf16 matmuls.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..runtime import UnsupportedDtypeError
from .skips import GAUGE_FREE_OUTPUTS, HOST_ARGS, METADATA_ONLY, SKIPS, TIED_INDICES

# Headline dtypes of the summary; the others are checked where cheap.
HEADLINE_DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)
DEFAULT_DTYPES = (*HEADLINE_DTYPES, torch.float16, torch.int32)
SAMPLES_PER_OP = 6
SAMPLE_TIMEOUT_S = 30
# A TPU's compiler takes several times XLA:CPU's time (~0.15 s for a small program where the
# emulator takes ~0.02 s; emulated 64-bit integer loops and 3-D grid samplers 8-25 s a sample on
# a v5e): there the limits, which are there to catch hangs, are this much longer.
TPU_TIME_FACTOR = 3


def sample_timeout_s() -> int:
    """How long one sample may run, on the platform the programs are built for."""
    from ..lowering import target

    return SAMPLE_TIMEOUT_S * (TPU_TIME_FACTOR if target.tpu() else 1)

# (rtol, atol) per dtype. float32 allows for transcendental implementations
# that differ by a few ulp and for different summation orders; reduced
# precision floats allow one rounding step of their own width.
FORWARD_TOL = {
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}
# Gradients chain several ops (and reductions over broadcast dims), so one more
# order of magnitude.
BACKWARD_TOL = {
    torch.float32: (1e-3, 1e-4),
    torch.float64: (1e-6, 1e-6),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}


def op_key(op: Any) -> str:
    """The name an OpInfo entry is known by in reports: ``name[.variant]``."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@functools.cache
def opinfo_by_key() -> dict[str, Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return {op_key(op): op for op in op_db}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class OpResult:
    op: str
    dtype: str  # "-" for error-input checks, which are per op
    kind: str  # forward | backward | errors
    status: str  # pass | fail | unsupported | skip | untested
    detail: str = ""
    samples: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------
# time box
# ---------------------------------------------------------------------------
class SampleTimeout(Exception):
    def __init__(self, message: str = "") -> None:
        super().__init__(message or f"sample exceeded {sample_timeout_s()}s")


@contextlib.contextmanager
def time_box(seconds: float) -> Iterator[None]:
    """Raise SampleTimeout at the first ATen op that starts after ``seconds``.

    Only at an op's start, where nothing of torchtpu's is half-done: an exception injected at any
    bytecode (SIGALRM on the main thread, an asynchronous exception from a timer on the threaded
    worker's, as this did before) could land between a compile and the resolution of its tier-1
    entry, and every later compile of that program then waited forever (a threaded sweep's `tril`
    hung for its whole op budget so, in a loaded test run). A sample stuck inside one op (a compile
    that never ends) is caught by the sweep's per-op budget, which kills the worker process.
    """
    with _Deadline(time.monotonic() + seconds):
        yield


class _Deadline(TorchDispatchMode):
    """A dispatch mode that only checks the clock before passing each op on (thread-local, as
    modes are; autograd carries it to the backward's ops)."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if time.monotonic() > self.deadline:
            raise SampleTimeout
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------------------
# moving samples to tpu
# ---------------------------------------------------------------------------
def _copy_tensor(x: torch.Tensor, shared: dict[tuple[int, torch.dtype], torch.Tensor] | None) -> torch.Tensor:
    """A tpu copy with the same view geometry: the whole storage, then the same strided view.

    Samples include views (offsets into a larger storage, non-contiguous strides);
    ops such as ``as_strided`` read outside the view, so the storage must come along.
    Tensors of one sample that share a CPU storage share one tpu storage (``shared``, by
    storage and dtype): error samples pass an ``out=`` tensor aliasing an input, which
    the op must refuse as CPU does. Without ``shared`` (gradient checks, whose inputs must
    stay separate leaves, as on CPU) each tensor gets its own storage.
    """
    x = x.detach()
    if x.layout != torch.strided or x.is_conj() or x.is_neg():
        return x.to("tpu")
    storage = x.untyped_storage()
    key = (storage.data_ptr(), x.dtype)
    shareable = shared is not None and storage.nbytes() > 0  # empty storages all have address 0
    base = shared.get(key) if shareable else None
    if base is None:
        n = storage.nbytes() // x.element_size() if x.element_size() else 0
        whole = x.storage_offset() == 0 and x.is_contiguous() and n == x.numel()
        base = x.to("tpu") if whole else torch.empty(0, dtype=x.dtype).set_(storage, 0, (n,), (1,)).to("tpu")
        if shareable:
            shared[key] = base
        if whole:
            return base
    return base.as_strided(x.shape, x.stride(), x.storage_offset())


def _map_sample(x: Any, leaf: Callable[[Any], Any]) -> Any:
    """A sample argument with ``leaf`` applied to everything in it that is not a tuple (named
    tuples are leaves), list or dict."""
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_map_sample(y, leaf) for y in x)
    if isinstance(x, list):
        return [_map_sample(y, leaf) for y in x]
    if isinstance(x, dict):
        return {k: _map_sample(v, leaf) for k, v in x.items()}
    return leaf(x)


def _to_tpu(x: Any, grad: bool, shared: dict[tuple[int, torch.dtype], torch.Tensor] | None) -> Any:
    def leaf(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            t = _copy_tensor(v, shared)
            if grad and v.requires_grad:
                t.requires_grad_(True)
            return t
        if isinstance(v, torch.device) and v.type == "cpu":
            return torch.device("tpu")
        if isinstance(v, str) and v == "cpu":
            return "tpu"
        return v

    return _map_sample(x, leaf)


def _sample_to_tpu(sample: Any, grad: bool, key: str = "") -> tuple[Any, tuple, dict]:
    # storages shared within this sample (not for gradients: see _copy_tensor)
    shared: dict[tuple[int, torch.dtype], torch.Tensor] | None = None if grad else {}
    if key in HOST_ARGS:
        return _to_tpu(sample.input, grad, shared), tuple(sample.args), dict(sample.kwargs)
    return (_to_tpu(sample.input, grad, shared), _to_tpu(tuple(sample.args), grad, shared),
            _to_tpu(dict(sample.kwargs), grad, shared))


def _leaves(x: Any) -> list[Any]:
    """Tensors and plain values of a (nested) output, in a fixed order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        out = []
        for y in x:
            out.extend(_leaves(y))
        return out
    if isinstance(x, dict):
        out = []
        for k in sorted(x, key=str):
            out.extend(_leaves(x[k]))
        return out
    return [x]


def _grad_leaves(x: Any) -> list[torch.Tensor]:
    return [t for t in _leaves(x) if isinstance(t, torch.Tensor) and t.requires_grad]


# ---------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------
class Mismatch(AssertionError):
    pass


def _same_picks(x: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether two index tensors select the same values of ``x`` along some dimension.

    Sorting and order statistics may return any of several tied positions (CPU's
    unstable sort and quickselect pick one, XLA's stable sort another); the
    indices are right when they pick the values the CPU's indices pick.
    """
    if got.shape != want.shape or x.dim() == 0:
        return False
    for d in range(x.dim()):
        for g, w in ((got, want), (got.unsqueeze(d), want.unsqueeze(d))):
            if g.dim() != x.dim():
                continue
            try:
                a, c = x.gather(d, g), x.gather(d, w)
            except (RuntimeError, IndexError):
                continue
            if torch.equal(a, c) or (a.is_floating_point() and torch.equal(a.isnan(), c.isnan())
                                      and torch.equal(a.nan_to_num(), c.nan_to_num())):
                return True
    return False


def compare(tpu_out: Any, cpu_out: Any, tol: dict[torch.dtype, tuple[float, float]], values: bool = True,
            what: str = "output", tie_input: torch.Tensor | None = None) -> None:
    """Raise Mismatch unless ``tpu_out`` matches ``cpu_out`` (device, dtype, shape, values)."""
    tl, cl = _leaves(tpu_out), _leaves(cpu_out)
    if len(tl) != len(cl):
        raise Mismatch(f"{what}: {len(tl)} values on tpu, {len(cl)} on cpu")
    for i, (t, c) in enumerate(zip(tl, cl)):
        name = f"{what}[{i}]" if len(cl) > 1 else what
        if isinstance(c, torch.Tensor):
            if not isinstance(t, torch.Tensor):
                raise Mismatch(f"{name}: tpu returned {type(t).__name__}, cpu a tensor")
            if t.device.type != "tpu" and c.device.type == "cpu":
                raise Mismatch(f"{name}: on {t.device}, expected tpu")
            if t.dtype != c.dtype:
                raise Mismatch(f"{name}: dtype {t.dtype} != cpu {c.dtype}")
            if tuple(t.shape) != tuple(c.shape):
                raise Mismatch(f"{name}: shape {tuple(t.shape)} != cpu {tuple(c.shape)}")
            if not values or c.layout != torch.strided:
                continue
            th = t.detach().cpu()
            ch = c.detach()
            if ch.is_complex() or ch.is_floating_point():
                rtol, atol = tol.get(ch.dtype if not ch.is_complex() else ch.real.dtype, (1e-5, 1e-5))
            else:
                rtol, atol = 0.0, 0.0
                if tie_input is not None and ch.dtype == torch.int64 and _same_picks(tie_input, th, ch):
                    continue
            try:
                torch.testing.assert_close(th, ch, rtol=rtol, atol=atol, equal_nan=True, check_dtype=False,
                                           check_stride=False)
            except AssertionError as e:
                lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
                raise Mismatch(f"{name}: " + "; ".join(lines[:3])) from None
        elif isinstance(t, torch.Tensor):
            raise Mismatch(f"{name}: tpu returned a tensor, cpu {type(c).__name__}")
        else:
            if isinstance(c, float) and isinstance(t, float):
                if not (math.isclose(c, t, rel_tol=1e-5, abs_tol=1e-6) or (math.isnan(c) and math.isnan(t))):
                    raise Mismatch(f"{name}: {t!r} != cpu {c!r}")
            elif t != c:
                raise Mismatch(f"{name}: {t!r} != cpu {c!r}")


# ---------------------------------------------------------------------------
# outcome of one sample
# ---------------------------------------------------------------------------
def is_unsupported(e: BaseException) -> bool:
    """A NotImplementedError raised by torchtpu itself (it names the operator)."""
    return isinstance(e, NotImplementedError) and "torchtpu" in str(e)


def first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    text = msg[0] if msg else ""
    if isinstance(e, (AssertionError, KeyError, IndexError, TypeError)) and not isinstance(e, Mismatch):
        # Internal errors: where they come from helps more than the bare message.
        tb = traceback.extract_tb(e.__traceback__)
        own = [f for f in tb if "torchtpu" in f.filename and "conformance" not in f.filename]
        if own:
            f = own[-1]
            text += f" [{f.filename.rsplit('/', 1)[-1]}:{f.lineno}]"
    # torchtpu's unsupported-op message ends with advice that is the same for every op.
    text = text.split(". Set TORCH_TPU_CPU_FALLBACK")[0]
    return f"{type(e).__name__}: {text}"[:440]


# OpInfo draws sample values from the global RNG: a threaded sweep seeds and draws under this
# lock, so an op's samples stay the same whichever ops run beside it.
global_rng_lock = threading.RLock()


def _seed(*parts: Any) -> None:
    """Seed the global RNG from what is being checked: OpInfo draws sample values from it, so
    an op's samples would otherwise depend on every op checked before it in the process (a
    borderline float16 row could flip between sweeps, or between the sweep and a test)."""
    torch.manual_seed(zlib.crc32("/".join(map(str, parts)).encode()))


def _samples(op: Any, dtype: torch.dtype, requires_grad: bool, limit: int) -> list[Any]:
    out = []
    with global_rng_lock:
        _seed(op_key(op), dtype, requires_grad)
        for s in op.sample_inputs("cpu", dtype, requires_grad=requires_grad):
            out.append(s)
            if len(out) >= limit:
                break
    return out


def _variant(op: Any) -> Callable[..., Any]:
    return op.get_op() if hasattr(op, "get_op") else op.op


@dataclass
class _Tally:
    ran: int = 0
    failure: BaseException | None = None
    unsupported: BaseException | None = None
    notes: list[str] = field(default_factory=list)

    def result(self, key: str, dtype: str, kind: str, seconds: float) -> OpResult:
        if self.unsupported is not None:
            return OpResult(key, dtype, kind, "unsupported", first_line(self.unsupported), self.ran, seconds)
        if self.failure is not None:
            return OpResult(key, dtype, kind, "fail", first_line(self.failure), self.ran, seconds)
        if self.ran == 0:
            return OpResult(key, dtype, kind, "untested", "; ".join(self.notes) or "no usable sample", 0, seconds)
        return OpResult(key, dtype, kind, "pass", "; ".join(self.notes), self.ran, seconds)


def describe(x: Any) -> str:
    """A sample argument in a few characters: tensors by dtype and shape, containers shortened."""
    if isinstance(x, torch.Tensor):
        return f"{dtype_name(x.dtype)}{list(x.shape)}"
    if isinstance(x, (list, tuple)):
        inner = ", ".join(describe(v) for v in x[:4]) + (", ..." if len(x) > 4 else "")
        return f"({inner})" if isinstance(x, tuple) else f"[{inner}]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}={describe(v)}" for k, v in list(x.items())[:4]) + "}"
    return repr(x)[:24]


def _naming_sample(e: BaseException, sample: Any) -> BaseException:
    """A mismatch names its sample (a TPU round's report must say which input to re-run)."""
    if not isinstance(e, Mismatch):
        return e
    what = describe(sample.input) + (f", args {describe(tuple(sample.args))}" if sample.args else "") + \
        (f", kwargs {describe(sample.kwargs)}" if sample.kwargs else "")
    return Mismatch(f"sample {what[:140]}: {e}")


def _record(tally: _Tally, e: BaseException) -> None:
    if is_unsupported(e):
        if tally.unsupported is None:
            tally.unsupported = e
    elif tally.failure is None:
        tally.failure = e


def refused_by_design(e: BaseException, *cpu_values: Any) -> str | None:
    """A note when ``e`` is the device refusing a dtype it cannot hold (complex128 on a TPU: a
    documented decision, docs/tpu.md) and the sample's CPU inputs or outputs hold that dtype: the
    sample cannot run there, as a dtype the op lacks on CPU is not checked. A refusal of anything
    else (an op whose lowering made a complex128 of its own) stays a failure."""
    if not isinstance(e, UnsupportedDtypeError):
        return None
    if any(isinstance(t, torch.Tensor) and t.dtype == torch.complex128 for t in _leaves(list(cpu_values))):
        return f"not run on this device, which refuses complex128 by design: {first_line(e)}"
    return None


def _refused_sample(tally: _Tally, e: BaseException, fn: Callable[..., Any], sample: Any) -> bool:
    """Notes a sample the device refuses by design (``refused_by_design``); False for any other error."""
    try:
        with torch.no_grad():
            cpu_out = fn(sample.input, *sample.args, **sample.kwargs)
    except Exception:  # noqa: BLE001
        cpu_out = None
    note = refused_by_design(e, sample.input, sample.args, sample.kwargs, cpu_out)
    if note is not None and note not in tally.notes:
        tally.notes.append(note)
    return note is not None


def _random_sample(key: str, sample: Any) -> bool:
    """A sample that asks for dropout (e.g. attention's dropout_p > 0): its values are random."""
    p = sample.kwargs.get("dropout_p", 0.0)
    if isinstance(p, (int, float)) and p > 0:
        return True
    # multi_head_attention_forward's dropout (its positional dropout_p) applies when training
    return key == "nn.functional.multi_head_attention_forward" and bool(sample.kwargs.get("training")) and any(
        isinstance(a, float) and 0 < a < 1 for a in sample.args)


# The dtypes whose values beyond CPU's tolerance may pass by the float64 rule (nearer_float64_than_cpu):
# CPU's 16-bit kernels round intermediates, and on ill-conditioned problems (the small entries of a
# matrix exponential whose others are O(100)) CPU's float32 itself is off float64 beyond the tolerance
_NEAR_FLOAT64_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _widened(x: Any, dtype: torch.dtype) -> Any:
    """A sample argument with its ``dtype`` tensors as float64 (containers followed)."""
    return _map_sample(x, lambda v: v.detach().to(torch.float64)
                       if isinstance(v, torch.Tensor) and v.dtype == dtype else v)


def nearer_float64_than_cpu(fn: Callable[..., Any], sample: Any, dtype: torch.dtype, actual: Any,
                            expected: Any) -> str | None:
    """Where a 16-bit or float32 result differs from CPU's beyond the tolerance: whether each such
    value is at least as close to the float64 result (the same op on the sample's values widened)
    as CPU's own value is. CPU's 16-bit kernels round some intermediates to the 16-bit type
    (grid_sample's bf16 kernel is 0.068 off float64 where one rounding of the f32 math is 0.004
    off); a lowering that computes in f32 and rounds once is then more accurate, not wrong. In
    float32 the rule meets only ill-conditioned values, where CPU's float32 is itself off float64
    beyond the tolerance (a matrix exponential's entry of 0.148 next to entries of 396: CPU
    3.5e-4 off, tpu 2.1e-4). Returns a note, or None
    when the rule does not hold (or cannot be applied: no float64 kernel, non-float outputs)."""
    if dtype not in _NEAR_FLOAT64_DTYPES:
        return None
    try:
        ref = fn(_widened(sample.input, dtype), *_widened(tuple(sample.args), dtype), **_widened(dict(sample.kwargs), dtype))
    except Exception:  # noqa: BLE001  (no float64 kernel, or float64 changes the op's meaning)
        return None
    return _nearer(_leaves(actual), _leaves(expected), _leaves(ref), FORWARD_TOL[dtype])


def gradients_nearer_float64_than_cpu(op: Any, sample: Any, dtype: torch.dtype, cots: list[torch.Tensor],
                                      actual: list[Any], expected: list[Any]) -> str | None:
    """:func:`nearer_float64_than_cpu` for gradients: the float64 gradients of the sample's values
    widened, for the same cotangents (CPU's bf16 grid_sample gradient for the grid is 11.5 off
    float64 where tpu's is 0.016 off)."""
    if dtype not in _NEAR_FLOAT64_DTYPES:
        return None
    try:
        x, args, kwargs = (_widened(v, dtype) for v in (sample.input, tuple(sample.args), dict(sample.kwargs)))
        leaves = []

        def leaf(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and v.dtype == torch.float64:
                v = v.requires_grad_(True)
                leaves.append(v)
            return v
        x = leaf(x) if isinstance(x, torch.Tensor) else x
        args = tuple(leaf(a) for a in args)
        kwargs = {k: leaf(v) for k, v in kwargs.items()}
        outs = _float_outputs(sample.output_process_fn_grad(op.gradcheck_wrapper(_variant(op), x, *args, **kwargs)))
        ref = torch.autograd.grad(outs, leaves, [c.double() for c in cots], allow_unused=True, materialize_grads=True)
    except Exception:  # noqa: BLE001
        return None
    if len(ref) != len(expected):
        return None  # the widened sample's differentiable inputs are not the sample's
    return _nearer(list(actual), list(expected), list(ref), BACKWARD_TOL[dtype])


def _nearer(tl: list[Any], cl: list[Any], rl: list[Any], tol: tuple[float, float]) -> str | None:
    if not (len(tl) == len(cl) == len(rl)):
        return None
    rtol, atol = tol
    worst_tpu = worst_cpu = 0.0
    for t, c, r in zip(tl, cl, rl):
        if not isinstance(c, torch.Tensor):
            if t != c:
                return None
            continue
        if not (isinstance(t, torch.Tensor) and isinstance(r, torch.Tensor) and c.dtype in _NEAR_FLOAT64_DTYPES
                and r.shape == c.shape == t.shape):
            return None
        t64, c64, r64 = t.detach().cpu().double(), c.detach().double(), r.detach().double()
        nan = r64.isnan()
        if not bool((t64.isnan() | (t64 == c64))[nan].all()):
            return None  # float64 says NaN: so must tpu (or agree with CPU)
        # a NaN where float64 has a number is infinitely far from it (CPU's bf16 matrix_exp: all NaN)
        err_t = torch.where(t64.isnan(), math.inf, (t64 - r64).abs())
        err_c = torch.where(c64.isnan(), math.inf, (c64 - r64).abs())
        same = (t64 == c64) | (t64.isnan() & c64.isnan())
        near_cpu = same | ((t64 - c64).abs() <= atol + rtol * c64.abs())
        ok = near_cpu | (err_t <= err_c) | nan
        if not bool(ok.all()):
            return None
        far = ~near_cpu & ~nan
        if bool(far.any()):
            worst_tpu = max(worst_tpu, err_t[far].max().item())
            worst_cpu = max(worst_cpu, err_c[far].max().item())
    return f"nearer float64 than CPU where they differ (error {worst_tpu:.3g} against CPU's {worst_cpu:.3g})"


def _noted(tally: _Tally, note: str | None) -> bool:
    """Keep the float64 rule's note (once per op and dtype); False where the rule did not hold."""
    if note is None:
        return False
    if not any(n.startswith("nearer float64") for n in tally.notes):
        tally.notes.append(note)
    return True


def cotangent_generator() -> torch.Generator:
    """The backward check's source of cotangents: one per (op, dtype), drawn sample after sample."""
    return torch.Generator().manual_seed(1234)


def cotangents(outs: list[torch.Tensor], gen: torch.Generator) -> list[torch.Tensor]:
    """Random cotangents (CPU tensors) for ``outs``."""
    return [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]


def check_forward(op: Any, dtype: torch.dtype, limit: int = SAMPLES_PER_OP) -> OpResult:
    key = op_key(op)
    start = time.perf_counter()
    tally = _Tally()
    values = key not in METADATA_ONLY
    if not values:
        tally.notes.append("metadata only: " + METADATA_ONLY[key])
    if key in GAUGE_FREE_OUTPUTS:
        tally.notes.append(GAUGE_FREE_OUTPUTS[key])
    fn = _variant(op)
    try:
        samples = _samples(op, dtype, False, limit)
    except Exception as e:  # noqa: BLE001  (sample generation itself is CPU-only)
        return OpResult(key, dtype_name(dtype), "forward", "untested", f"sample generation: {first_line(e)}")
    for sample in samples:
        try:
            with time_box(sample_timeout_s()):
                tin, targs, tkw = _sample_to_tpu(sample, grad=False, key=key)
                try:
                    expected = fn(sample.input, *sample.args, **sample.kwargs)
                except Exception:  # noqa: BLE001, S112  (a sample CPU rejects says nothing about tpu)
                    continue
                actual = fn(tin, *targs, **tkw)
                if key in GAUGE_FREE_OUTPUTS:
                    expected, actual = sample.output_process_fn_grad(expected), sample.output_process_fn_grad(actual)
                ties = sample.input if key in TIED_INDICES and isinstance(sample.input, torch.Tensor) else None
                try:
                    compare(actual, expected, FORWARD_TOL, values=values and not _random_sample(key, sample),
                            tie_input=ties)
                except Mismatch:
                    if key in GAUGE_FREE_OUTPUTS or ties is not None or not _noted(
                            tally, nearer_float64_than_cpu(fn, sample, dtype, actual, expected)):
                        raise
                torch.tpu.synchronize()
            tally.ran += 1
        except Exception as e:  # noqa: BLE001
            if _refused_sample(tally, e, fn, sample):
                continue
            _record(tally, _naming_sample(e, sample))
            if tally.unsupported is not None:
                break
    return tally.result(key, dtype_name(dtype), "forward", time.perf_counter() - start)


def supports_backward(op: Any, dtype: torch.dtype) -> bool:
    if not (dtype.is_floating_point and op.supports_autograd):
        return False
    try:
        return dtype in op.supported_backward_dtypes("cpu")
    except Exception:  # noqa: BLE001
        return False


def _float_outputs(out: Any) -> list[torch.Tensor]:
    return [t for t in _leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad
            and (t.is_floating_point() or t.is_complex())]


def _sum_by_value(x: torch.Tensor, g1: torch.Tensor, g2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _, inverse = torch.unique(x.detach().reshape(-1), return_inverse=True)
    n = int(inverse.max()) + 1 if inverse.numel() else 0
    acc = torch.float64
    s1 = torch.zeros(n, dtype=acc).index_add_(0, inverse, g1.reshape(-1).to(acc))
    s2 = torch.zeros(n, dtype=acc).index_add_(0, inverse, g2.reshape(-1).to(acc))
    return s1.to(g2.dtype).to("tpu"), s2.to(g2.dtype)


def check_backward(op: Any, dtype: torch.dtype, limit: int = SAMPLES_PER_OP) -> OpResult:
    key = op_key(op)
    start = time.perf_counter()
    tally = _Tally()
    values = key not in METADATA_ONLY
    if not values:
        tally.notes.append("metadata only: " + METADATA_ONLY[key])
    fn = _variant(op)
    gen = cotangent_generator()
    try:
        samples = _samples(op, dtype, True, limit)
    except Exception as e:  # noqa: BLE001
        return OpResult(key, dtype_name(dtype), "backward", "untested", f"sample generation: {first_line(e)}")
    for sample in samples:
        try:
            with time_box(sample_timeout_s()):
                tin, targs, tkw = _sample_to_tpu(sample, grad=True, key=key)
                cpu_inputs = _grad_leaves([sample.input, sample.args, sample.kwargs])
                tpu_inputs = _grad_leaves([tin, targs, tkw])
                if not cpu_inputs or len(cpu_inputs) != len(tpu_inputs):
                    continue
                try:
                    cpu_out = sample.output_process_fn_grad(
                        op.gradcheck_wrapper(fn, sample.input, *sample.args, **sample.kwargs))
                    cpu_outs = _float_outputs(cpu_out)
                    if not cpu_outs:
                        continue
                    cots = cotangents(cpu_outs, gen)
                    expected = torch.autograd.grad(cpu_outs, cpu_inputs, cots, allow_unused=True,
                                                   materialize_grads=True)
                except Exception:  # noqa: BLE001, S112  (not differentiable on CPU for this sample)
                    continue
                tpu_out = sample.output_process_fn_grad(op.gradcheck_wrapper(fn, tin, *targs, **tkw))
                tpu_outs = _float_outputs(tpu_out)
                if len(tpu_outs) != len(cpu_outs):
                    raise Mismatch(f"{len(tpu_outs)} differentiable outputs on tpu, {len(cpu_outs)} on cpu")
                actual = torch.autograd.grad(tpu_outs, tpu_inputs, [c.to("tpu") for c in cots], allow_unused=True,
                                             materialize_grads=True)
                actual, expected = list(actual), list(expected)
                if key in TIED_INDICES and isinstance(sample.input, torch.Tensor) and sample.input.requires_grad:
                    # Gradients of tied values may land on any of the tied positions:
                    # compare their sums per distinct input value instead.
                    k = next(i for i, t in enumerate(cpu_inputs) if t is sample.input)
                    actual[k], expected[k] = _sum_by_value(sample.input, actual[k].cpu(), expected[k])
                try:
                    compare(actual, expected, BACKWARD_TOL, values=values and not _random_sample(key, sample),
                            what="grad")
                except Mismatch:
                    if key in TIED_INDICES or not _noted(
                            tally, gradients_nearer_float64_than_cpu(op, sample, dtype, cots, actual, expected)):
                        raise
                torch.tpu.synchronize()
            tally.ran += 1
        except Exception as e:  # noqa: BLE001
            if _refused_sample(tally, e, fn, sample):
                continue
            _record(tally, _naming_sample(e, sample))
            if tally.unsupported is not None:
                break
    return tally.result(key, dtype_name(dtype), "backward", time.perf_counter() - start)


def check_errors(op: Any, limit: int = SAMPLES_PER_OP) -> OpResult:
    key = op_key(op)
    start = time.perf_counter()
    tally = _Tally()
    fn = _variant(op)
    try:
        with global_rng_lock:
            _seed(key, "errors")
            error_inputs = list(op.error_inputs("cpu"))
    except Exception as e:  # noqa: BLE001
        return OpResult(key, "-", "errors", "untested", f"error_inputs generation: {first_line(e)}")
    refused: list[str] = []
    for ei in error_inputs:
        if tally.ran >= limit:
            break
        regex = str(getattr(ei, "error_regex", "") or "")
        if "device" in regex.lower():
            # Cross-device checks: with every tensor moved to tpu there is no mismatch to raise.
            continue
        sample = ei.sample_input
        try:
            with time_box(sample_timeout_s()):
                try:
                    tin, targs, tkw = _sample_to_tpu(sample, grad=False, key=key)
                except UnsupportedDtypeError as e:
                    # A dtype the device cannot hold (complex128 on a TPU): the input cannot reach
                    # the op there, so there is no error of the op's to compare. Noted, not counted.
                    refused.append(first_line(e))
                    continue
                try:
                    fn(sample.input, *sample.args, **sample.kwargs)
                    continue  # CPU does not raise here (the error is another device's)
                except Exception as e:  # noqa: BLE001
                    cpu_exc = e
                try:
                    fn(tin, *targs, **tkw)
                    torch.tpu.synchronize()
                except Exception as e:
                    if is_unsupported(e):
                        raise
                    if not isinstance(e, type(cpu_exc)):
                        raise Mismatch(f"raised {type(e).__name__} ({first_line(e)}), cpu raised "
                                       f"{type(cpu_exc).__name__}") from None
                else:
                    raise Mismatch(f"no error on tpu; cpu raised {first_line(cpu_exc)}")
            tally.ran += 1
        except Exception as e:  # noqa: BLE001
            _record(tally, e)
    if refused:
        tally.notes.append(f"{len(refused)} error input(s) not run, their data refused by the device: {refused[0]}")
    return tally.result(key, "-", "errors", time.perf_counter() - start)


def check_op(op: Any, dtypes: tuple[torch.dtype, ...] = DEFAULT_DTYPES, kinds: tuple[str, ...] = (
        "forward", "backward", "errors"), limit: int = SAMPLES_PER_OP) -> list[OpResult]:
    """Every check of one OpInfo entry; a skipped entry is recorded as such (and counts as failing)."""
    key = op_key(op)
    supported = op.supported_dtypes("cpu")
    results: list[OpResult] = []
    with torch.tpu.precision("highest"):
        for dtype in dtypes:
            if dtype not in supported:
                continue
            if key in SKIPS:
                results.append(OpResult(key, dtype_name(dtype), "forward", "skip", SKIPS[key]))
                if supports_backward(op, dtype):
                    results.append(OpResult(key, dtype_name(dtype), "backward", "skip", SKIPS[key]))
                continue
            if "forward" in kinds:
                results.append(check_forward(op, dtype, limit))
            if "backward" in kinds and supports_backward(op, dtype):
                results.append(check_backward(op, dtype, limit))
        if "errors" in kinds and key not in SKIPS and op.error_inputs_func is not None:
            results.append(check_errors(op, limit))
    return results
