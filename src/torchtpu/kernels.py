"""Custom kernels: a StableHLO module or a JAX function as a torch op on ``tpu``.

* :func:`stablehlo_op` takes a StableHLO text module (its ``func.func @main`` and any helper
  functions) and declared output shapes, and gives a ``torchtpu_kernels::<name>`` custom op.
* :func:`custom_jax_kernel` takes a JAX function (jax.numpy, lax, Pallas) and exports it with
  ``jax.export`` per (shapes, dtypes, static arguments) for the plugin's platform, on JAX's CPU
  client (JAX only lowers: it never opens the TPU, which torchtpu's client owns).

Both lower through one registered lowering: the module's functions are renamed apart
(``@main`` -> ``@k_<hash>_main``), made private, appended to the program torchtpu builds, and
called with ``func.call``. So the op is one program in Strict mode, a node that fuses with its
neighbours in DeferAndFuse, and a node of a ``torch.compile`` graph (no graph break), cached in
the three tiers like any program. See docs/custom_kernels.md.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .lowering import registry
from .lowering.builder import ELEMENT_TYPES, tensor_type

NAMESPACE = "torchtpu_kernels"
_lib = torch.library.Library(NAMESPACE, "DEF")
_names: set[str] = set()


class KernelError(RuntimeError):
    """A custom kernel's module does not fit its declaration, or cannot be lowered."""


# -- StableHLO text surgery ----------------------------------------------------------------------

def _skip_string(text: str, i: int) -> int:
    """Index after the string literal that starts at ``text[i] == '"'``."""
    i += 1
    while text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _match_close(text: str, i: int) -> int:
    """Index after the bracket closing the one at ``text[i]`` (strings skipped)."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    depth = []
    while True:
        c = text[i]
        if c == '"':
            i = _skip_string(text, i)
            continue
        if c in pairs:
            depth.append(pairs[c])
        elif depth and c == depth[-1]:
            depth.pop()
            if not depth:
                return i + 1
        i += 1


def strip_locations(text: str) -> str:
    """The module without debug locations (``loc(...)`` and ``#locN = ...`` lines)."""
    text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#loc"))
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = _skip_string(text, i)
            out.append(text[i:j])
            i = j
        elif c == "l" and text.startswith("loc(", i) and not (i and (text[i - 1].isalnum() or text[i - 1] in "_.$#-")):
            while out and out[-1] == " ":
                out.pop()
            i = _match_close(text, i + 3)
        else:
            out.append(c)
            i += 1
    return "".join(out)


_FUNC = re.compile(r"func\.func\s+(?:(?:public|private|nested)\s+)?@([\w.$-]+)\s*\(")


def _top_level_functions(text: str) -> list[tuple[str, str, str, str]]:
    """(name, arguments, results, body) of each ``func.func`` in pretty syntax."""
    funcs = []
    pos = 0
    while True:
        m = _FUNC.search(text, pos)
        if m is None:
            return funcs
        args_end = _match_close(text, m.end() - 1)
        args = text[m.end():args_end - 1]
        rest = text[args_end:]
        body_start = args_end
        results = ""
        arrow = re.match(r"\s*->\s*", rest)
        if arrow:
            j = args_end + arrow.end()
            if text[j] == "(":
                k = _match_close(text, j)
                results = text[j + 1:k - 1]
            else:  # one result without parentheses: up to "attributes" or the body
                # (a result with attributes is always parenthesized)
                k = j
                while not text.startswith((" attributes", " {"), k):
                    k += 1
                results = text[j:k]
            body_start = k
        attrs = re.match(r"\s*attributes\s*", text[body_start:])
        if attrs:
            body_start = _match_close(text, body_start + attrs.end())
        brace = text.index("{", body_start)
        body_end = _match_close(text, brace)
        funcs.append((m.group(1), args, results, text[brace:body_end]))
        pos = body_end


def _split_top(text: str) -> list[str]:
    parts, depth, cur, i = [], 0, [], 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j = _skip_string(text, i)
            cur.append(text[i:j])
            i = j
            continue
        if c in "(<{[":
            depth += 1
        elif c in ")>}]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _drop_attr_dict(decl: str) -> str:
    """``%a: tensor<..> {mhlo.sharding = ...}`` -> ``%a: tensor<..>`` (argument and result
    attributes, JAX's sharding/layout/result names, do not belong on a private callee)."""
    i = decl.find("{")
    while i >= 0 and decl.count('"', 0, i) % 2:
        i = decl.find("{", i + 1)
    return decl[:i].strip() if i >= 0 else decl.strip()


def inline_module(text: str, prefix: str) -> tuple[str, str, list[str], list[str]]:
    """Rename the functions of a StableHLO module apart for inlining into another module.

    Returns (functions text, name of the renamed ``@main``, its argument types, its result types).
    """
    text = strip_locations(text)
    funcs = _top_level_functions(text)
    names = [f[0] for f in funcs]
    if "main" not in names:
        raise KernelError("torchtpu.kernels: the StableHLO module has no func.func @main (the pretty "
                          "`func.func @main(...)` syntax is expected)")
    renames = {n: f"{prefix}_{n}" for n in names}
    sym = re.compile(r"@([\w.$-]+)")
    out = []
    main_args: list[str] = []
    main_results: list[str] = []
    for name, args, results, body in funcs:
        arg_decls = [_drop_attr_dict(a) for a in _split_top(args)]
        res_decls = [_drop_attr_dict(r) for r in _split_top(results)]
        if name == "main":
            main_args = [a.split(":", 1)[1].strip() for a in arg_decls]
            main_results = res_decls
        body = sym.sub(lambda m: "@" + renames.get(m.group(1), m.group(1)), body)
        out.append(f"  func.func private @{renames[name]}({', '.join(arg_decls)}) -> ({', '.join(res_decls)}) "
                   f"{body}\n")
    return "".join(out), renames["main"], main_args, main_results


# -- the op and its lowering ----------------------------------------------------------------------

class _Kernel:
    """What one custom op lowers: ``module_for(shapes, dtypes, static) -> (text, out specs)``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._inlined: dict[Any, tuple[str, str, list[tuple[tuple[int, ...], torch.dtype]]]] = {}

    def module_for(self, shapes: tuple, dtypes: tuple, static: tuple
                   ) -> tuple[str, list[tuple[tuple[int, ...], torch.dtype]]]:
        raise NotImplementedError

    def out_specs(self, shapes: tuple, dtypes: tuple, static: tuple) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return self.module_for(shapes, dtypes, static)[1]

    def inlined(self, shapes: tuple, dtypes: tuple, static: tuple
                ) -> tuple[str, str, list[tuple[tuple[int, ...], torch.dtype]]]:
        key = (shapes, dtypes, static)
        hit = self._inlined.get(key)
        if hit is None:
            text, specs = self.module_for(shapes, dtypes, static)
            prefix = "k_" + hashlib.sha256(text.encode()).hexdigest()[:16]
            funcs, main, arg_types, res_types = inline_module(text, prefix)
            want_args = [tensor_type(s, d) for s, d in zip(shapes, dtypes)]
            if arg_types != want_args:
                raise KernelError(f"torchtpu.kernels: {self.name}'s module takes ({', '.join(arg_types)}) "
                                  f"but was called with ({', '.join(want_args)})")
            want_res = [tensor_type(s, d) for s, d in specs]
            if res_types != want_res:
                raise KernelError(f"torchtpu.kernels: {self.name}'s module returns ({', '.join(res_types)}) "
                                  f"but its outputs were declared as ({', '.join(want_res)})")
            hit = self._inlined[key] = (funcs, main, specs)
        return hit


_KERNELS: dict[str, _Kernel] = {}


def _decode_static(static: str) -> tuple:
    return ast.literal_eval(static) if static else ()


def _define(kernel: _Kernel) -> Any:
    name = kernel.name
    if name in _names:
        raise ValueError(f"torchtpu.kernels: a kernel named {name!r} exists already")
    _names.add(name)
    _KERNELS[name] = kernel
    # ``static``: the static arguments' repr (ast.literal_eval reads them back), or "". No default:
    # the dispatcher drops an argument equal to its default, which register_autograd's structure
    # check of the backward's return then counts differently.
    _lib.define(f"{name}(Tensor[] inputs, str static) -> Tensor[]")

    def meta(inputs: list[torch.Tensor], static: str) -> list[torch.Tensor]:
        specs = kernel.out_specs(tuple(tuple(t.shape) for t in inputs), tuple(t.dtype for t in inputs),
                                 _decode_static(static))
        return [inputs[0].new_empty(s, dtype=d) if inputs else torch.empty(s, dtype=d, device="meta")
                for s, d in specs]

    torch.library.register_fake(f"{NAMESPACE}::{name}", meta, lib=_lib)
    op = getattr(getattr(torch.ops, NAMESPACE), name).default

    @registry.register(op)
    def _lower(ctx: registry.LoweringContext, inputs: list, static: str) -> list:
        shapes = tuple(v.shape for v in inputs)
        dtypes = tuple(v.dtype for v in inputs)
        funcs, main, specs = kernel.inlined(shapes, dtypes, _decode_static(static))
        ctx.b.add_functions(main, funcs)
        return ctx.b.call(main, inputs, specs)

    from . import _C
    from .engine.opplan import plan_for

    _C._register_kernel_front(NAMESPACE, [(name, functools.partial(plan_for, op))])
    return op


def _kernel_name(name: str | None, default: str) -> str:
    """A name the user chose is the op's name (``torch.ops.torchtpu_kernels.<name>``): taken, it is
    an error (_define). Without one, the function's name, numbered apart from earlier kernels."""
    if name is None:
        return _unique_name(default)
    if not name.isidentifier():
        raise ValueError(f"torchtpu.kernels: a kernel name must be an identifier, got {name!r}")
    return name


def _unique_name(base: str) -> str:
    base = re.sub(r"\W", "_", base) or "kernel"
    name, n = base, 1
    while name in _names:
        n += 1
        name = f"{base}_{n}"
    return name


class _StableHLOKernel(_Kernel):
    def __init__(self, name: str, text: str, out_specs: list[tuple[tuple[int, ...], torch.dtype]]) -> None:
        super().__init__(name)
        self.text = text
        self.specs = out_specs

    def module_for(self, shapes: tuple, dtypes: tuple, static: tuple) -> tuple[str, list]:
        return self.text, self.specs


def stablehlo_op(module_text: str, out_specs: Sequence[tuple[Sequence[int], torch.dtype]], *,
                 name: str | None = None) -> Callable[..., Any]:
    """A StableHLO text module (``func.func @main`` and helpers) as an op on ``tpu`` tensors.

    ``out_specs``: (shape, dtype) of each result of ``@main``. Returns ``f(*tensors)``, which gives
    one tensor or, for several results, a tuple; ``f.op`` is the ``torch.ops`` overload.
    """
    specs = [(tuple(int(d) for d in s), dt) for s, dt in out_specs]
    for _, dt in specs:
        if dt not in ELEMENT_TYPES:
            raise TypeError(f"torchtpu.kernels.stablehlo_op: unsupported dtype {dt}")
    kernel = _StableHLOKernel(_kernel_name(name, "stablehlo_op"), module_text, specs)
    op = _define(kernel)
    single = len(specs) == 1

    def call(*tensors: torch.Tensor) -> Any:
        outs = op(list(tensors), "")
        return outs[0] if single else tuple(outs)

    call.op = op  # type: ignore[attr-defined]
    return call


# -- JAX ------------------------------------------------------------------------------------------

def _import_jax() -> Any:
    """JAX, imported on first use, on its CPU platform (it only lowers; torchtpu owns the chip)."""
    if "jax" not in sys.modules:
        os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        import jax
        from jax import export  # noqa: F401
    except ImportError as e:
        raise ImportError("torchtpu.kernels.custom_jax_kernel needs JAX, which is not installed: "
                          "pip install 'jax[cpu]' (JAX only lowers the kernel; it never runs it)") from e
    return jax


def _export_platform() -> str:
    from .lowering import target

    return "tpu" if target.tpu() else "cpu"


@contextlib.contextmanager
def pallas_lowering_mode() -> Any:
    """Where a kernel is exported: on a TPU, as written (a Pallas TPU kernel lowers with Mosaic to a
    ``tpu_custom_call``); on the CPU emulator, with Pallas' TPU interpret mode on, so the same kernel,
    written for a TPU without ``interpret=True``, lowers to plain HLO loops the CPU plugin runs."""
    if _export_platform() == "tpu":
        yield
        return
    from jax._src import config

    flag = config.pallas_tpu_interpret_mode_context_manager
    previous = flag.swap_local(True)
    try:
        yield
    finally:
        flag.set_local(previous)


def _jax_dtype(jnp: Any, dtype: torch.dtype) -> Any:
    return jnp.dtype(str(dtype).removeprefix("torch."))


def _torch_dtype(dtype: Any) -> torch.dtype:
    return getattr(torch, str(dtype))


class _JaxKernel(_Kernel):
    def __init__(self, name: str, fn: Callable[..., Any], static_argnums: tuple[int, ...]) -> None:
        super().__init__(name)
        self.fn = fn
        self.static_argnums = static_argnums
        self.returns_tuple: bool | None = None
        self._modules: dict[Any, tuple[str, list]] = {}
        self._shapes: dict[Any, list] = {}

    def bound(self, static: tuple) -> Callable[..., Any]:
        """``fn`` with its static arguments bound, taking the array arguments in order."""
        fn, nums = self.fn, self.static_argnums

        def f(*arrays: Any) -> Any:
            it, st = iter(arrays), iter(static)
            n = len(arrays) + len(static)
            return fn(*[next(st) if i in nums else next(it) for i in range(n)])

        return f

    def _avals(self, jax: Any, shapes: tuple, dtypes: tuple) -> list:
        return [jax.ShapeDtypeStruct(s, _jax_dtype(jax.numpy, d)) for s, d in zip(shapes, dtypes)]

    def out_specs(self, shapes: tuple, dtypes: tuple, static: tuple) -> list:
        key = (shapes, dtypes, static)
        hit = self._shapes.get(key)
        if hit is None:
            jax = _import_jax()
            out = jax.eval_shape(self.bound(static), *self._avals(jax, shapes, dtypes))
            self.returns_tuple = isinstance(out, (tuple, list))
            leaves = jax.tree_util.tree_leaves(out)
            hit = self._shapes[key] = [(tuple(a.shape), _torch_dtype(a.dtype)) for a in leaves]
        return hit

    def module_for(self, shapes: tuple, dtypes: tuple, static: tuple) -> tuple[str, list]:
        key = (shapes, dtypes, static)
        hit = self._modules.get(key)
        if hit is None:
            jax = _import_jax()
            specs = self.out_specs(shapes, dtypes, static)
            with pallas_lowering_mode():
                exported = jax.export.export(jax.jit(self.bound(static), keep_unused=True),
                                             platforms=[_export_platform()])(*self._avals(jax, shapes, dtypes))
            _check_version(exported)
            hit = self._modules[key] = (exported.mlir_module(), specs)
        return hit


# The newest StableHLO the default plugin (xla-cpu-pjrt) parses; JAX newer than that may print
# ops or attributes it does not know.
PLUGIN_STABLEHLO = (1, 13, 3)


def _plugin_stablehlo() -> tuple[int, ...]:
    from . import _device_state

    v = _device_state.client().plugin.attributes().get("stablehlo_current_version")
    return tuple(int(x) for x in v) if v else PLUGIN_STABLEHLO


def _check_version(exported: Any) -> None:
    """Refuse a module that cannot be written as the plugin's StableHLO version (JAX's own check:
    serializing it as a portable artifact for that version), naming both versions."""
    from jax._src.lib.mlir.dialects import hlo

    plugin = ".".join(map(str, _plugin_stablehlo()))
    try:
        hlo.serialize_portable_artifact_str(exported.mlir_module(), plugin)
    except ValueError as e:  # a feature newer than the plugin's version
        raise KernelError(
            f"torchtpu.kernels: the module JAX {sys.modules['jax'].__version__} exported (StableHLO "
            f"{hlo.get_current_version()}) is newer than the plugin accepts (StableHLO {plugin}): {e}") from e


def _jax_op(jax_fn: Callable[..., Any], name: str, static_argnums: tuple[int, ...]) -> tuple[Any, _JaxKernel]:
    """The op ``torch.ops.torchtpu_kernels.<name>(inputs: list[Tensor], static: str) -> list[Tensor]``
    running ``jax_fn``, without autograd (the caller registers it); ``static`` is the repr of the
    tuple of static arguments, or "" for none."""
    kernel = _JaxKernel(name, jax_fn, static_argnums)
    return _define(kernel), kernel


def jax_op(jax_fn: Callable[..., Any], *, name: str, static_argnums: Sequence[int] = ()) -> Any:
    """A JAX function as a raw op, for library code that registers its own backward: called as
    ``op(list_of_tensors, repr(static_args_tuple))``, returns the list of result tensors."""
    return _jax_op(jax_fn, _kernel_name(name, name), tuple(static_argnums))[0]


def custom_jax_kernel(jax_fn: Callable[..., Any] | None = None, *, name: str | None = None,
                      static_argnums: Sequence[int] | int = (),
                      backward: Callable[..., Any] | None = None) -> Any:
    """A JAX function as a torch op on ``tpu`` tensors (usable as a decorator, with or without
    arguments). Array arguments are torch.Tensors; ``static_argnums`` name arguments passed as
    Python constants (hashable literals). Autograd: through ``jax.vjp`` of the function, or
    ``backward(*primals, *cotangents) -> gradients``, itself a JAX function, exported the same way.
    """
    if jax_fn is None:
        return lambda f: custom_jax_kernel(f, name=name, static_argnums=static_argnums, backward=backward)
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    base = _kernel_name(name, getattr(jax_fn, "__name__", "jax_kernel"))
    op, kernel = _jax_op(jax_fn, base, nums)

    k = len(nums)

    def vjp_fn(*args: Any) -> Any:
        # the backward kernel: the forward's static arguments, the number of inputs (static too),
        # then the primals and the cotangents
        jax = _import_jax()
        static, n_in, arrays = args[:k], args[k], args[k + 1:]
        primals, cts = arrays[:n_in], arrays[n_in:]
        if backward is not None:
            grads = backward(*primals, *cts)
        else:
            _, pullback = jax.vjp(kernel.bound(tuple(static)), *primals)
            grads = pullback(tuple(cts) if kernel.returns_tuple else cts[0])
        return tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)

    bwd_op, _ = _jax_op(vjp_fn, _unique_name(base + "_backward"), tuple(range(k + 1)))

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        tensors, static = inputs
        ctx.save_for_backward(*tensors, *output)
        ctx.n = len(tensors)
        ctx.static = static

    def backward_fn(ctx: Any, grads: list) -> tuple:
        saved = ctx.saved_tensors
        ins, outs = saved[:ctx.n], saved[ctx.n:]
        cts = [g if g is not None else torch.zeros_like(o) for g, o in zip(grads, outs)]
        st = _decode_static(ctx.static) + (ctx.n,)
        return list(bwd_op(list(ins) + cts, repr(st))), None

    torch.library.register_autograd(f"{NAMESPACE}::{base}", backward_fn, setup_context=setup_context, lib=_lib)

    @functools.wraps(jax_fn)
    def call(*args: Any) -> Any:
        tensors = [a for i, a in enumerate(args) if i not in nums]
        static = tuple(a for i, a in enumerate(args) if i in nums)
        outs = op(tensors, repr(static) if static else "")
        return tuple(outs) if kernel.returns_tuple else outs[0]

    call.op = op  # type: ignore[attr-defined]
    call.kernel = kernel  # type: ignore[attr-defined]  # its exports, per shapes (tests read the modules)
    call.backward_op = bwd_op  # type: ignore[attr-defined]
    return call

