"""Host-CPU kernels called from XLA:CPU programs, and lowerings shaped for XLA's CPU backend."""

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import run_python

from torchtpu.engine import compile_cache
from torchtpu.runtime import cpu_kernels

needs_kernels = pytest.mark.skipif(not cpu_kernels.available(),
                                   reason="the CPU kernels need x86-64 with AVX512F, AVX512BW and AVX512_BF16")

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def module_texts(monkeypatch):
    """The StableHLO text of every program compiled while the test runs."""
    texts = []
    real = compile_cache.compile

    def spy(text, **kwargs):
        texts.append(text if isinstance(text, str) else text.decode())
        return real(text, **kwargs)

    monkeypatch.setattr(compile_cache, "compile", spy)
    return texts


@pytest.mark.parametrize("shape", [(512, 384), (3, 17, 33), (2, 16, 16), (1, 5), (40, 7), (2, 3, 32, 48)])
@pytest.mark.parametrize("in_dtype", [np.float32, BF16])
@pytest.mark.parametrize("out_dtype", [np.float32, BF16])
@needs_kernels
def test_transpose_kernel_is_exact(shape, in_dtype, out_dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 100).astype(np.float32)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0 + 2.0 ** -8]  # 1 + 2^-8: a round-to-even tie in bf16
    flat = x.reshape(-1)
    flat[:len(special)] = special[:flat.size]
    x = x.astype(in_dtype)
    got = cpu_kernels.transpose_host(x, out_dtype)
    want = np.swapaxes(x, -1, -2).astype(out_dtype)  # ml_dtypes rounds to nearest even, as XLA does
    bits = np.uint16 if np.dtype(out_dtype) == BF16 else np.uint32
    nan = np.isnan(want.astype(np.float32))
    assert np.isnan(got.astype(np.float32))[nan].all()
    assert np.array_equal(got.view(bits)[~nan], want.view(bits)[~nan])


@needs_kernels
def test_weight_gradient_transposes_through_the_kernel(module_texts):
    torch.manual_seed(0)
    x, g = torch.randn(512, 384), torch.randn(512, 128)
    out = (x.to("tpu").t() @ g.to("tpu")).cpu()
    assert any(cpu_kernels.TRANSPOSE_TARGET in t for t in module_texts)
    # medium precision: bf16 operands, exact products, f32 accumulation
    want = x.bfloat16().double().t() @ g.bfloat16().double()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)


@needs_kernels
def test_batched_transposed_product_through_the_kernel(module_texts):
    torch.manual_seed(0)
    a, b = torch.randn(6, 40, 24), torch.randn(6, 40, 8)
    out = torch.bmm(a.to("tpu").transpose(1, 2), b.to("tpu")).cpu()
    assert any(cpu_kernels.TRANSPOSE_TARGET in t for t in module_texts)
    want = torch.bmm(a.bfloat16().double().transpose(1, 2), b.bfloat16().double())
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)


def test_kernels_can_be_turned_off():
    r = run_python("""
        import torch, torchtpu
        from torchtpu.engine import compile_cache
        from torchtpu.runtime import cpu_kernels
        texts = []
        real = compile_cache.compile
        compile_cache.compile = lambda text, **kw: (texts.append(text), real(text, **kw))[1]
        torch.manual_seed(0)
        x, g = torch.randn(64, 48), torch.randn(64, 16)
        out = (x.to("tpu").t() @ g.to("tpu")).cpu()
        want = x.bfloat16().double().t() @ g.bfloat16().double()
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)
        print(cpu_kernels.available(), any(cpu_kernels.TRANSPOSE_TARGET in t for t in texts))
    """, env={"TORCH_TPU_CPU_KERNELS": "0", "TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("shape,dims", [((8, 64, 128), (0, 1)), ((512, 384), (0,)), ((3, 500, 7, 1), (1,)),
                                        ((3, 500, 7, 1), (0, 1)), ((2, 96, 5), (0, 1)), ((4, 70, 3), (1,))])
def test_column_reductions(shape, dims, module_texts):
    torch.manual_seed(0)
    x = torch.randn(shape)
    t = x.to("tpu")
    torch.testing.assert_close(t.sum(dims).cpu(), x.sum(dims), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(t.amax(dims).cpu(), x.amax(dims))
    torch.testing.assert_close(t.amin(dims).cpu(), x.amin(dims))
    i = torch.randint(-1000, 1000, shape)
    torch.testing.assert_close(i.to("tpu").sum(dims).cpu(), i.sum(dims))
    # a window along one reduced dim, then a reduce of the partial results
    assert any("stablehlo.reduce_window" in text for text in module_texts)


@needs_kernels
def test_cached_program_with_the_kernel_runs_in_a_new_process(tmp_path):
    """A tier-3 entry that calls the kernel loads in a second process: the handler is
    registered when the client is created, before any executable is deserialized."""
    code = """
        import torch, torchtpu
        torch.manual_seed(0)
        x, g = torch.randn(96, 40), torch.randn(96, 24)
        out = (x.to("tpu").t() @ g.to("tpu")).cpu()
        want = x.bfloat16().double().t() @ g.bfloat16().double()
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)
        s = torch.tpu.compile_cache_stats()
        print(s["compiles"], s["tier3_hits"])
    """
    env = {"TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled", "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(tmp_path)}
    first = run_python(code, env)
    assert first.returncode == 0, first.stderr
    second = run_python(code, env)
    assert second.returncode == 0, second.stderr
    compiles, hits = map(int, second.stdout.split()[-2:])
    assert compiles == 0 and hits >= 1
