"""torchtpu.kernels: StableHLO modules and JAX functions as custom ops on ``tpu``."""

import sys
from typing import Any

import pytest
import torch
from helpers import run_python, xla_tanh_tolerance
from torch._dynamo.utils import counters

from torchtpu import kernels
from torchtpu.engine import deferred

# A module as JAX prints one: module attributes, argument/result attributes, a private helper
# called from @main, and debug locations, all of which the inlining renames or strips.
_MODULE = """#loc1 = loc("x")
module @jit_f attributes {jax.uses_shape_polymorphism = false, mhlo.num_partitions = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3xf32> {mhlo.sharding = "{replicated}"} loc("x"), %arg1: tensor<3xf32> loc("y")) -> (tensor<2x3xf32> {jax.result_info = "result[0]"}, tensor<f32> {jax.result_info = "result[1]"}) {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<3xf32>) -> tensor<2x3xf32> loc(#loc1)
    %1 = call @helper(%arg0, %0) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32> loc(callsite("f"("a.py":1:2) at "g"("b.py":3:4)))
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %2 = stablehlo.reduce(%1 init: %cst) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32>
    return %1, %2 : tensor<2x3xf32>, tensor<f32>
  } loc(#loc1)
  func.func private @helper(%arg0: tensor<2x3xf32>, %arg1: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %0 = stablehlo.multiply %arg0, %arg1 : tensor<2x3xf32>
    return %0 : tensor<2x3xf32>
  }
}
#loc2 = loc("jit(f)/mul"(#loc1))
"""


def test_stablehlo_op_inlines_main_and_helpers():
    f = kernels.stablehlo_op(_MODULE, [((2, 3), torch.float32), ((), torch.float32)], name="mul_sum")
    x, w = torch.randn(2, 3), torch.randn(3)
    y, s = f(x.to("tpu"), w.to("tpu"))
    torch.testing.assert_close(y.cpu(), x * w)
    torch.testing.assert_close(s.cpu(), (x * w).sum())
    assert f.op is torch.ops.torchtpu_kernels.mul_sum.default


def test_inline_module_renames_and_strips():
    funcs, main, args, results = kernels.inline_module(_MODULE, "k_1")
    assert main == "k_1_main"
    assert args == ["tensor<2x3xf32>", "tensor<3xf32>"] and results == ["tensor<2x3xf32>", "tensor<f32>"]
    assert "@k_1_helper(" in funcs and "call @k_1_helper" in funcs
    for gone in ("loc(", "mhlo.sharding", "jax.result_info", "public", "num_partitions", "@main", "@helper"):
        assert gone not in funcs, gone


def test_stablehlo_op_wrong_declared_shape():
    f = kernels.stablehlo_op(_MODULE, [((3, 2), torch.float32), ((), torch.float32)], name="bad_shape")
    with pytest.raises(kernels.KernelError, match=r"returns \(tensor<2x3xf32>, tensor<f32>\) but its outputs "
                                                  r"were declared as \(tensor<3x2xf32>, tensor<f32>\)"):
        f(torch.randn(2, 3).to("tpu"), torch.randn(3).to("tpu"))


def test_missing_jax_is_a_clear_error(monkeypatch):
    @kernels.custom_jax_kernel(name="needs_jax")
    def k(x):
        return x

    monkeypatch.delitem(sys.modules, "jax", raising=False)
    monkeypatch.setitem(sys.modules, "jax", None)  # import jax -> ImportError
    with pytest.raises(ImportError, match="needs JAX, which is not installed"):
        k(torch.ones(2).to("tpu"))


# -- JAX ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jax():
    return pytest.importorskip("jax", reason="JAX is an optional dependency (the dev extra installs it)")


@pytest.fixture(scope="module")
def silu_add(jax):
    @kernels.custom_jax_kernel
    def silu_add(x, y):
        return x * jax.nn.sigmoid(x) + y

    return silu_add


def _reference(x, y):
    x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
    out = x * torch.sigmoid(x) + y
    (out * out).sum().backward()
    return out.detach(), x.grad, y.grad


def _run(fn, x, y):
    xt, yt = x.to("tpu").requires_grad_(), y.to("tpu").requires_grad_()
    out = fn(xt, yt)
    (out * out).sum().backward()
    return out.detach().cpu(), xt.grad.cpu(), yt.grad.cpu()


def test_jax_kernel_strict_forward_backward(silu_add):
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    for got, want in zip(_run(silu_add, x, y), _reference(x, y)):
        torch.testing.assert_close(got, want)


def test_jax_kernel_fuses_in_defer_and_fuse(silu_add):
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    with torch.tpu.eager_mode("defer_and_fuse"):
        xt, yt = x.to("tpu"), y.to("tpu")
        flushes = deferred.stats["flushes"]
        out = silu_add(xt.sin(), yt).exp()
        assert deferred.has_pending()  # recorded with its neighbours, not run
        host = out.cpu()
        assert deferred.stats["flushes"] == flushes + 1  # one fused program
        torch.testing.assert_close(host, (x.sin() * torch.sigmoid(x.sin()) + y).exp())
        for got, want in zip(_run(silu_add, x, y), _reference(x, y)):
            torch.testing.assert_close(got, want)


def test_jax_kernel_under_compile_without_graph_break(silu_add):
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    counters.clear()
    compiled = torch.compile(lambda a, b: silu_add(a, b), backend="tpu")
    for got, want in zip(_run(compiled, x, y), _reference(x, y)):
        torch.testing.assert_close(got, want)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1


def test_lax_kernel_with_user_backward_and_static_args(jax):
    lax = jax.lax

    # deliberately not the true derivative of k*cos(x): the user's formula wins
    @kernels.custom_jax_kernel(static_argnums=(1,), backward=lambda x, g: (g * 2.0,))
    def scaled_cos(x, k):
        return lax.cos(x) * k

    x = torch.randn(6)
    xt = x.to("tpu").requires_grad_()
    out = scaled_cos(xt, 3.0)
    torch.testing.assert_close(out.detach().cpu(), torch.cos(x) * 3.0)
    out.sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), torch.full((6,), 2.0))
    torch.testing.assert_close(scaled_cos(x.to("tpu"), 0.5).cpu(), torch.cos(x) * 0.5)


def test_jax_kernel_several_outputs(jax):
    jnp = jax.numpy

    @kernels.custom_jax_kernel
    def two(x):
        return jnp.tanh(x), x.sum(axis=0)

    x = torch.randn(3, 4)
    a, b = two(x.to("tpu"))
    torch.testing.assert_close(a.cpu(), torch.tanh(x), **xla_tanh_tolerance())
    torch.testing.assert_close(b.cpu(), x.sum(0))


def test_fresh_tuple_kernel_first_called_under_compile(jax):
    jnp = jax.numpy

    @kernels.custom_jax_kernel(static_argnums=(1,))
    def tanh_and_sum(x, k):
        return jnp.tanh(x) * k, x.sum(axis=0)

    def f(x):
        a, b = tanh_and_sum(x, 2.0)
        return a.sum() + b.sum()

    counters.clear()
    x = torch.randn(3, 4)
    xt = x.to("tpu").requires_grad_()
    torch.compile(f, backend="tpu")(xt).backward()
    assert dict(counters["graph_break"]) == {}
    xc = x.clone().requires_grad_()
    ((torch.tanh(xc) * 2).sum() + xc.sum(0).sum()).backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, **xla_tanh_tolerance())


def test_new_shapes_export_again(silu_add):
    for shape in [(2, 3), (7,), (2, 3)]:
        x, y = torch.randn(shape), torch.randn(shape)
        torch.testing.assert_close(silu_add(x.to("tpu"), y.to("tpu")).cpu(), x * torch.sigmoid(x) + y)


def test_pallas_kernel_in_interpret_mode(jax):
    pl = pytest.importorskip("jax.experimental.pallas")

    def body(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + y_ref[...]

    @kernels.custom_jax_kernel
    def pallas_axpy(x, y):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x, y)

    x, y = torch.randn(8, 128), torch.randn(8, 128)
    torch.testing.assert_close(pallas_axpy(x.to("tpu"), y.to("tpu")).cpu(), 2 * x + y)


def _pallas_scaled_add(jax: Any) -> Any:
    """``2 x + y`` and its gradients as Pallas kernels written for a TPU: no ``interpret=True``."""
    pl = pytest.importorskip("jax.experimental.pallas")

    def axpy_body(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + y_ref[...]

    def double_body(g_ref, o_ref):
        o_ref[...] = g_ref[...] * 2.0

    def backward(x, y, g):
        return pl.pallas_call(double_body, out_shape=jax.ShapeDtypeStruct(g.shape, g.dtype))(g), g

    @kernels.custom_jax_kernel(backward=backward)
    def pallas_scaled_add(x, y):
        return pl.pallas_call(axpy_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

    return pallas_scaled_add


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "compiled"])
def test_pallas_kernel_written_for_the_tpu(jax, mode):
    """A Pallas kernel as written for a TPU runs with Mosaic on a TPU and in Pallas' interpret mode
    on the emulator (kernels.pallas_lowering_mode), forward and through its Pallas backward."""
    f = _pallas_scaled_add(jax)
    x, y = torch.randn(8, 128), torch.randn(8, 128)
    xt, yt = (t.to("tpu").requires_grad_() for t in (x, y))
    if mode == "compiled":
        out = torch.compile(f, backend="tpu")(xt, yt)
    else:
        with torch.tpu.eager_mode(mode):
            out = f(xt, yt)
    (out * torch.arange(128.0, device="tpu")).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), 2 * x + y)
    torch.testing.assert_close(xt.grad.cpu(), 2 * torch.arange(128.0).expand(8, 128))
    torch.testing.assert_close(yt.grad.cpu(), torch.arange(128.0).expand(8, 128))


def test_pallas_kernel_exports_as_mosaic_for_a_tpu(jax, monkeypatch):
    """What a TPU is sent for a Pallas kernel: one ``tpu_custom_call`` (Mosaic), no HLO loop; what
    the emulator runs: the interpret mode's plain HLO, no custom call (on a TPU, the same check
    with the platform forced to the emulator's)."""
    f = _pallas_scaled_add(jax)
    kernel = f.kernel
    key = (((8, 128), (8, 128)), (torch.float32, torch.float32), ())
    monkeypatch.setattr(kernels, "_export_platform", lambda: "cpu")
    text, _ = kernel.module_for(*key)
    assert "tpu_custom_call" not in text
    kernel._modules.clear()
    monkeypatch.setattr(kernels, "_export_platform", lambda: "tpu")
    kernel._modules.clear()
    text, _ = kernel.module_for(*key)
    assert text.count("tpu_custom_call") == 1 and "stablehlo.while" not in text


def test_too_new_stablehlo_is_a_clear_error(jax, monkeypatch):
    jnp = jax.numpy

    @kernels.custom_jax_kernel(name="too_new")
    def k(x):
        return jnp.exp(x)

    monkeypatch.setattr(kernels, "_plugin_stablehlo", lambda: (0, 1, 0))
    with pytest.raises(kernels.KernelError, match=r"is newer than the plugin accepts \(StableHLO 0\.1\.0\)"):
        k(torch.ones(3).to("tpu"))


@pytest.mark.fresh_process
def test_a_second_process_takes_the_kernel_program_from_tier_3(jax, tmp_path):
    """A kernel's program is cached like any other: a second process with the same tier-3 directory
    (tier 2 off, so the hit is tier 3's) compiles nothing for it."""
    code = """
        import jax.numpy as jnp
        import torch
        from torchtpu.kernels import custom_jax_kernel

        @custom_jax_kernel
        def scaled_sin(x):
            return jnp.sin(x) * 2

        x = torch.arange(8.0, device="tpu")
        got = scaled_sin(x).cpu()
        torch.testing.assert_close(got, torch.sin(torch.arange(8.0)) * 2)
        s = torch.tpu.compile_cache_stats()
        print(s["compiles"], s["tier3_hits"], s["tier3_writes"])
    """
    env = {"TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(tmp_path), "TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled"}
    first, second = run_python(code, env), run_python(code, env)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr[-1500:], second.stderr[-1500:])
    compiles1, hits1, writes1 = map(int, first.stdout.split())
    compiles2, hits2, writes2 = map(int, second.stdout.split())
    assert writes2 == 0, second.stdout
    assert compiles1 >= 1 and writes1 >= 1 and hits1 == 0, first.stdout
    assert compiles2 == 0 and hits2 == compiles1, (first.stdout, second.stdout)


def test_a_chosen_name_is_the_ops_name_and_taken_once():
    """name= is the op's name (torch.ops.torchtpu_kernels.<name>): a second kernel of that name is an
    error, not silently renamed; kernels named after their functions are numbered apart."""
    spec = [((2, 3), torch.float32), ((), torch.float32)]
    kernels.stablehlo_op(_MODULE, spec, name="chosen_once")
    assert hasattr(torch.ops.torchtpu_kernels, "chosen_once")
    with pytest.raises(ValueError, match="'chosen_once' exists already"):
        kernels.stablehlo_op(_MODULE, spec, name="chosen_once")
    with pytest.raises(ValueError, match="must be an identifier"):
        kernels.stablehlo_op(_MODULE, spec, name="not a name")
    first, second = kernels.stablehlo_op(_MODULE, spec), kernels.stablehlo_op(_MODULE, spec)
    assert first.op is not second.op
    x, w = torch.randn(2, 3), torch.randn(3)
    for f in (first, second):
        torch.testing.assert_close(f(x.to("tpu"), w.to("tpu"))[0].cpu(), x * w)
