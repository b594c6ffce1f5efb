"""Host-CPU kernels called from XLA:CPU programs, and lowerings shaped for XLA's CPU backend."""

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import run_python

from torchtpu.lowering import target
from torchtpu.runtime import cpu_kernels

pytestmark = pytest.mark.emulator_only("the host kernels that XLA:CPU programs call")
needs_kernels = pytest.mark.skipif(not cpu_kernels.available(),
                                   reason="the CPU kernels need x86-64 with AVX2")

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("shape", [(512, 384), (3, 17, 33), (2, 16, 16), (1, 5), (40, 7), (2, 3, 32, 48)])
@pytest.mark.parametrize("in_dtype", [np.float32, BF16])
@pytest.mark.parametrize("out_dtype", [np.float32, BF16])
@pytest.mark.parametrize("avx2_only", [False, True])
@needs_kernels
def test_transpose_kernel_is_exact(shape, in_dtype, out_dtype, avx2_only):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 100).astype(np.float32)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0 + 2.0 ** -8]  # 1 + 2^-8: a round-to-even tie in bf16
    flat = x.reshape(-1)
    flat[:len(special)] = special[:flat.size]
    x = x.astype(in_dtype)
    got = cpu_kernels.transpose_host(x, out_dtype, avx2_only)
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
def test_weight_gradient_kernel_shares_the_rounded_operand(module_texts):
    """A gradient feeding its weight gradient (through the kernel) and its input gradient
    (`g @ w`) enters both in one form, bf16-rounded and widened to f32, so that XLA (whose CSE
    merges the two equal converts) computes it once rather than once per form."""
    torch.manual_seed(0)
    x, g, w = torch.randn(64, 48), torch.randn(64, 32), torch.randn(32, 48)
    with torch.tpu.eager_mode("defer_and_fuse"):
        xt, gt, wt = x.to("tpu"), g.to("tpu"), w.to("tpu")
        dw, dx = gt.t() @ xt, gt @ wt
        dw, dx = dw.cpu(), dx.cpu()
    text = next(t for t in module_texts if cpu_kernels.TRANSPOSE_TARGET in t)
    call = next(line for line in text.splitlines() if cpu_kernels.TRANSPOSE_TARGET in line)
    operand = call.split('"stablehlo.custom_call"(')[1].split(")")[0]
    made = next(line for line in text.splitlines() if line.strip().startswith(f"{operand} ="))
    # the parts enter dots as bf16 where the host multiplies bf16 natively (target.bf16_dots), else widened
    if target.bf16_dots():
        assert "(tensor<64x32xbf16>) -> tensor<32x64xbf16>" in call, call
        assert '"stablehlo.convert"' in made and "(tensor<64x32xf32>) -> tensor<64x32xbf16>" in made, made
    else:
        assert "(tensor<64x32xf32>) -> tensor<32x64xf32>" in call, call
        assert '"stablehlo.convert"' in made and "(tensor<64x32xbf16>) -> tensor<64x32xf32>" in made, made
    gb, xb, wb = (t.bfloat16().double() for t in (g, x, w))
    torch.testing.assert_close(dw.double(), gb.t() @ xb, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(dx.double(), gb @ wb, rtol=1e-5, atol=1e-4)


@needs_kernels
def test_batched_transposed_product_through_the_kernel(module_texts):
    torch.manual_seed(0)
    a, b = torch.randn(6, 40, 24), torch.randn(6, 40, 8)
    out = torch.bmm(a.to("tpu").transpose(1, 2), b.to("tpu")).cpu()
    assert any(cpu_kernels.TRANSPOSE_TARGET in t for t in module_texts)
    want = torch.bmm(a.bfloat16().double().transpose(1, 2), b.bfloat16().double())
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.fresh_process
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
@pytest.mark.fresh_process
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


@pytest.mark.parametrize("bf16_dots", ["1", "0"])
@pytest.mark.fresh_process
def test_dot_operands_as_bf16_or_widened_compute_the_same(bf16_dots):
    """TPU-precision products feed XLA either bf16 operands or the same bf16-rounded values
    widened to f32 (faster on CPUs without bf16 multiplies): both give the numbers of bf16
    products accumulated in f32, at every precision, for plain and weight-gradient layouts."""
    r = run_python("""
        import torch, torchtpu
        from torchtpu.engine import compile_cache
        texts = []
        real = compile_cache.compile
        compile_cache.compile = lambda text, **kw: (texts.append(text), real(text, **kw))[1]
        torch.manual_seed(0)
        x, w, g = torch.randn(96, 40), torch.randn(40, 24), torch.randn(96, 24)
        def parts(t, n):  # t split into n bf16 parts, as the TPU's passes do
            out = []
            for _ in range(n):
                out.append(t.bfloat16().double())
                t = t - out[-1].float()
            return out
        passes = {"medium": [(0, 0)], "high": [(1, 0), (0, 1), (0, 0)],
                  "highest": [(2, 0), (1, 1), (0, 2), (1, 0), (0, 1), (0, 0)]}
        for precision, pairs in passes.items():
            n = max(max(p) for p in pairs) + 1
            for a, b in ((x, w), (x.t(), g)):
                with torch.tpu.precision(precision):
                    out = (a.to("tpu") @ b.to("tpu")).cpu()
                pa, pb = parts(a, n), parts(b, n)
                want = sum(pa[i] @ pb[j] for i, j in pairs)
                torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-5)
        dots = [line for t in texts for line in t.splitlines() if "stablehlo.dot_general" in line]
        print(all("bf16" in d for d in dots), any("bf16" in d for d in dots))
    """, env={"TORCH_TPU_BF16_DOTS": bf16_dots, "TORCH_TPU_TIER2_COMPILATION_CACHE": "disabled"})
    assert r.returncode == 0, r.stderr
    want = ["True", "True"] if bf16_dots == "1" else ["False", "False"]
    assert r.stdout.split()[-2:] == want


def _lapack_registered() -> bool:
    """Whether the client registered the LAPACK kernels; also empties the in-process op cache, so
    that the test's programs are compiled (and their text seen) even if an earlier test ran them."""
    from torchtpu.engine import executor

    torch.zeros(1, device="tpu")  # creates the client, which registers the kernels
    executor.cache_clear()
    return cpu_kernels.linalg_targets() is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 5), (3, 6, 6), (2, 1, 4, 4), (1, 1), (33, 33)])
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_runs_lapack_and_matches_cpu(shape, dtype, uplo, module_texts):
    """The CPU-emulated device's eigh is LAPACK's syevd, as PyTorch's CPU eigh: same values,
    same eigenvectors (signs included), and the triangle named by UPLO is the one read."""
    assert _lapack_registered()
    torch.manual_seed(0)
    a = torch.randn(shape, dtype=dtype)
    a = a + a.mT + torch.triu(torch.randn(shape, dtype=dtype), 1) * (1 if uplo == "L" else 0)
    w, v = torch.linalg.eigh(a, UPLO=uplo)
    wt, vt = torch.linalg.eigh(a.to("tpu"), UPLO=uplo)
    assert any(cpu_kernels.EIGH_TARGET in t for t in module_texts)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(wt.cpu(), w, **tol)
    torch.testing.assert_close(vt.cpu(), v, **tol)
    torch.testing.assert_close(torch.linalg.eigvalsh(a.to("tpu"), UPLO=uplo).cpu(), w, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 5), (7, 3), (3, 7), (2, 6, 4), (2, 3, 4, 9), (1, 1), (40, 24)])
@pytest.mark.parametrize("full_matrices", [False, True])
def test_svd_runs_lapack_and_matches_cpu(shape, dtype, full_matrices, module_texts):
    """The CPU-emulated device's svd is LAPACK's gesdd, as PyTorch's CPU svd: same factors for
    tall, wide and batched matrices, reduced and full; svdvals takes the values-only path."""
    assert _lapack_registered()
    torch.manual_seed(0)
    a = torch.randn(shape, dtype=dtype)
    u, s, vh = torch.linalg.svd(a, full_matrices=full_matrices)
    ut, st, vht = torch.linalg.svd(a.to("tpu"), full_matrices=full_matrices)
    assert any(cpu_kernels.SVD_TARGET in t for t in module_texts)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(st.cpu(), s, **tol)
    torch.testing.assert_close(ut.cpu(), u, **tol)
    torch.testing.assert_close(vht.cpu(), vh, **tol)
    torch.testing.assert_close(torch.linalg.svdvals(a.to("tpu")).cpu(), s, **tol)


def test_lapack_eigh_and_svd_gradients_match_cpu():
    """Backward through the LAPACK kernels (eigh's and svd's formulas use their outputs)."""
    assert _lapack_registered()
    torch.manual_seed(0)
    a = torch.randn(6, 6, dtype=torch.float64)
    sym = a + a.T
    def eigh_loss(x):
        w, v = torch.linalg.eigh(x)
        return v.abs().sum() + w.pow(2).sum()

    def svd_loss(x):
        return torch.linalg.svd(x, full_matrices=False)[0].abs().sum() + torch.linalg.svdvals(x).sum()

    for f, inputs in ((eigh_loss, [sym]), (svd_loss, [a, a[:, :4], a[:4]])):
        for x in inputs:
            xc = x.clone().requires_grad_()
            xt = x.to("tpu").requires_grad_()
            gc, = torch.autograd.grad(f(xc), xc)
            gt, = torch.autograd.grad(f(xt), xt)
            torch.testing.assert_close(gt.cpu(), gc, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 5), (7, 3), (3, 7), (2, 6, 6), (2, 3, 4, 4), (1, 1), (64, 64)])
def test_lu_runs_lapack_and_matches_cpu(shape, dtype, module_texts):
    """The CPU-emulated device's LU is LAPACK's getrf, as PyTorch's CPU LU: the same packed factors
    and pivots, and solve, inv and det built on them match too."""
    assert _lapack_registered()
    torch.manual_seed(0)
    a = torch.randn(shape, dtype=dtype)
    lu, piv = torch.linalg.lu_factor(a)
    lut, pivt = torch.linalg.lu_factor(a.to("tpu"))
    assert any(cpu_kernels.LU_TARGET in t for t in module_texts)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(lut.cpu(), lu, **tol)
    assert torch.equal(pivt.cpu(), piv)
    p, lo, up = torch.linalg.lu(a.to("tpu"))
    torch.testing.assert_close(p.cpu() @ lo.cpu() @ up.cpu(), a, **tol)  # (tpu matmuls round to bf16)
    if shape[-1] == shape[-2]:
        a = a + shape[-1] * torch.eye(shape[-1], dtype=dtype)  # well conditioned
        rhs = torch.randn(*shape[:-1], 2, dtype=dtype)
        torch.testing.assert_close(torch.linalg.solve(a.to("tpu"), rhs.to("tpu")).cpu(), torch.linalg.solve(a, rhs),
                                   **tol)
        torch.testing.assert_close(torch.linalg.inv(a.to("tpu")).cpu(), torch.linalg.inv(a), **tol)
        torch.testing.assert_close(torch.linalg.det(a.to("tpu")).cpu(), torch.linalg.det(a), rtol=1e-4, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 5), (7, 3), (3, 7), (2, 6, 4), (2, 3, 4, 9), (1, 1), (48, 40)])
def test_qr_runs_lapack_and_matches_cpu(shape, dtype, module_texts):
    """The CPU-emulated device's QR is LAPACK's geqrf and orgqr, as PyTorch's CPU QR: the same Q
    and R in every mode, and the same reflectors from geqrf and Q from householder_product."""
    assert _lapack_registered()
    torch.manual_seed(0)
    a = torch.randn(shape, dtype=dtype)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    for mode in ("reduced", "complete", "r"):
        q, r = torch.linalg.qr(a, mode=mode)
        qt, rt = torch.linalg.qr(a.to("tpu"), mode=mode)
        torch.testing.assert_close(rt.cpu(), r, **tol)
        if mode != "r":
            torch.testing.assert_close(qt.cpu(), q, **tol)
    assert any(cpu_kernels.GEQRF_TARGET in t and cpu_kernels.ORGQR_TARGET in t for t in module_texts)
    packed, tau = torch.geqrf(a)
    packed_t, tau_t = torch.geqrf(a.to("tpu"))
    torch.testing.assert_close(packed_t.cpu(), packed, **tol)
    torch.testing.assert_close(tau_t.cpu(), tau, **tol)
    if shape[-2] >= shape[-1]:
        torch.testing.assert_close(torch.linalg.householder_product(packed_t, tau_t).cpu(),
                                   torch.linalg.householder_product(packed, tau), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 5), (2, 6, 6), (2, 3, 4, 4), (1, 1), (40, 40)])
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_runs_lapack_and_matches_cpu(shape, dtype, upper, module_texts):
    """The CPU-emulated device's Cholesky is LAPACK's potrf, reading the triangle the CPU reads.
    Regression: upper=True factored the lower triangle, wrong for an input whose triangles
    differ (the CPU reads only the upper one)."""
    assert _lapack_registered()
    torch.manual_seed(0)
    a = torch.randn(shape, dtype=dtype)
    spd = a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=dtype)
    spd = spd + torch.triu(torch.randn(shape, dtype=dtype), 1) * (-1 if upper else 1)  # the unread triangle differs
    want = torch.linalg.cholesky_ex(spd, upper=upper)
    got = torch.linalg.cholesky_ex(spd.to("tpu"), upper=upper)
    assert any(cpu_kernels.CHOLESKY_TARGET in t for t in module_texts)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(got.L.cpu(), want.L, **tol)
    assert torch.equal(got.info.cpu(), want.info)
    torch.testing.assert_close(torch.cholesky(spd.to("tpu"), upper=upper).cpu(), torch.cholesky(spd, upper=upper), **tol)


def test_lapack_cholesky_of_an_indefinite_matrix_reports_it():
    """info names the first leading minor that is not positive definite, as on CPU; the strict
    factor raises the CPU's error."""
    assert _lapack_registered()
    a = torch.tensor([[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 3.0]])  # second minor singular
    want, got = torch.linalg.cholesky_ex(a), torch.linalg.cholesky_ex(a.to("tpu"))
    assert torch.equal(got.info.cpu(), want.info) and int(want.info) == 2
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(a.to("tpu"))


def test_lapack_lu_of_a_singular_matrix_reports_it():
    """A zero pivot is not a failure: getrf factors on, and info names the first zero pivot."""
    assert _lapack_registered()
    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])
    want = torch.linalg.lu_factor_ex(a)
    got = torch.linalg.lu_factor_ex(a.to("tpu"))
    torch.testing.assert_close(got.LU.cpu(), want.LU)
    assert torch.equal(got.pivots.cpu(), want.pivots) and torch.equal(got.info.cpu(), want.info)
    assert int(want.info) == 3
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.inv(a.to("tpu"))


def test_lapack_kernels_give_nan_for_nan_input_and_handle_empty():
    """A failed decomposition is NaN, not a crash; empty batches and matrices keep their shapes."""
    assert _lapack_registered()
    a = torch.full((2, 3, 3), float("nan"))
    w, v = torch.linalg.eigh(a.to("tpu"))
    assert torch.isnan(w.cpu()).all() and torch.isnan(v.cpu()).all()
    s = torch.linalg.svdvals(a.to("tpu"))
    assert torch.isnan(s.cpu()).all()
    assert torch.isnan(torch.linalg.lu_factor(a.to("tpu"))[0].cpu()).all()
    assert torch.isnan(torch.linalg.qr(a.to("tpu"))[1].cpu()).any()
    for shape in [(0, 4, 4), (3, 0, 0)]:
        e = torch.zeros(shape)
        assert torch.linalg.eigh(e.to("tpu"))[1].shape == torch.linalg.eigh(e)[1].shape
        assert torch.linalg.svd(e.to("tpu"))[0].shape == torch.linalg.svd(e)[0].shape


@pytest.mark.fresh_process
def test_linalg_without_the_kernels_takes_the_portable_lowerings():
    """TORCH_TPU_CPU_KERNELS=0: the Jacobi, LU, QR and Cholesky lowerings (the ones a TPU runs) still
    match CPU, Cholesky reading the triangle the CPU reads."""
    code = """
import torch
from torchtpu.runtime import cpu_kernels
torch.manual_seed(0)
a = torch.randn(6, 6); a = a + a.T
w, v = torch.linalg.eigh(a.to("tpu"))
wc, vc = torch.linalg.eigh(a)
assert cpu_kernels.linalg_targets() is None
torch.testing.assert_close(w.cpu(), wc, rtol=1e-4, atol=1e-4)
torch.testing.assert_close((v.cpu() @ torch.diag(w.cpu()) @ v.cpu().T), a, rtol=1e-4, atol=1e-4)
s = torch.linalg.svdvals(a[:, :4].to("tpu"))
torch.testing.assert_close(s.cpu(), torch.linalg.svdvals(a[:, :4]), rtol=1e-4, atol=1e-4)
lu, piv = torch.linalg.lu_factor(a.to("tpu"))
torch.testing.assert_close(lu.cpu(), torch.linalg.lu_factor(a)[0], rtol=1e-4, atol=1e-4)
q, r = torch.linalg.qr(a[:, :4].to("tpu"))
qc, rc = torch.linalg.qr(a[:, :4])
torch.testing.assert_close(q.cpu(), qc, rtol=1e-4, atol=1e-4)
torch.testing.assert_close(r.cpu(), rc, rtol=1e-4, atol=1e-4)
spd = a @ a.T + 6 * torch.eye(6) + torch.triu(torch.randn(6, 6), 1)  # triangles differ
for upper in (False, True):
    torch.testing.assert_close(torch.linalg.cholesky(spd.to("tpu"), upper=upper).cpu(),
                               torch.linalg.cholesky(spd, upper=upper), rtol=1e-4, atol=1e-4)
print("ok")
"""
    r = run_python(code, env={"TORCH_TPU_CPU_KERNELS": "0"})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr


@pytest.mark.fresh_process
def test_lapack_kernels_come_with_a_later_client_of_the_same_plugin():
    """Regression: when a process's first client of the CPU plugin came from the runtime API (before
    the tpu device set up LAPACK), the plugin counted as registered, and the device then ran its
    eigh, svd, lu, qr and cholesky without the LAPACK kernels for the whole process (an xdist worker
    whose first test was a runtime test failed every LAPACK test)."""
    r = run_python("""
from torchtpu import runtime
from torchtpu._config import config
from torchtpu.runtime import cpu_kernels
plugin = runtime.load_plugin(runtime.resolve_plugin_path(config.plugin))
runtime.Client(plugin, runtime.default_client_options("cpu", 1))
print(cpu_kernels.linalg_targets() is not None)
import torch
torch.zeros(1, device="tpu")
print(cpu_kernels.linalg_targets() is not None)
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"], r.stdout
