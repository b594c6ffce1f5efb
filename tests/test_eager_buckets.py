"""Shape buckets in Strict eager mode (engine/eager_buckets.py, docs/eager_shapes.md).

A tensor uploaded from a line that has seen another first size lives on a buffer padded to a
power-of-two bucket, garbage (NaN, the integer maximum) after its rows; ops on it run one
program per bucket, masked where they mix rows. Every result is compared with CPU's, over sizes
within one bucket and across buckets, and the loops count compiles against a bound.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchtpu import storage as st
from torchtpu.engine import eager_buckets

# within bucket 16 (9, 11, 16) and across buckets (2 .. 33)
SIZES = [2, 3, 5, 8, 9, 11, 16, 17, 33]


@pytest.fixture(autouse=True, params=["strict", "defer_and_fuse"])
def mode(request):
    """Every test in both eager modes that bucket (Debug mode takes Strict's path)."""
    eager_buckets.set_eager_buckets("pow2")
    try:
        if request.param == "defer_and_fuse":
            with torch.tpu.defer_and_fuse():
                yield request.param
        else:
            yield request.param
    finally:
        eager_buckets.set_eager_buckets("pow2")


def dynamic(host: torch.Tensor) -> torch.Tensor:
    """``host`` on the tpu, uploaded from the line of a length loop (two first sizes through one
    line): on a bucket-sized buffer, with garbage after its rows."""
    assert host.shape[0] >= 2
    for h in (host[:1], host):
        t = h.to("tpu")
    assert eager_buckets.is_marked(t.untyped_storage())
    buf = st.storage_buffer(t.untyped_storage())
    assert buf.shape[0] == eager_buckets.bucket(host.shape[0])
    return t


def close(got: torch.Tensor, want: torch.Tensor, **kw) -> None:
    assert got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, **kw)


def bucketed(t: torch.Tensor) -> bool:
    """Whether ``t`` is the exact-size result of a bucketed call (on a bucket-sized buffer)."""
    buf = st.storage_buffer(t.untyped_storage())
    return eager_buckets.is_marked(t.untyped_storage()) and buf.shape[0] == eager_buckets.bucket(t.shape[0])


def _compiles() -> int:
    """Programs this process built (op-cache misses, fused programs included): "compiles" would
    count 0 for a program that the host-shared tier-2 cache supplied from an earlier run."""
    return torch.tpu.compile_cache_stats()["misses"]


@pytest.mark.parametrize("n", SIZES)
def test_pointwise(n):
    g = torch.Generator().manual_seed(n)
    a, b = torch.randn(n, 6, generator=g), torch.randn(n, 6, generator=g)
    ta, tb = dynamic(a), dynamic(b)
    y = torch.where(ta > 0, ta * 2 + tb, F.gelu(tb)).sigmoid()
    assert bucketed(y)
    close(y, torch.where(a > 0, a * 2 + b, F.gelu(b)).sigmoid())
    close(ta.t() * 3, a.t() * 3)  # a transposed view of a padded tensor


@pytest.mark.parametrize("n", SIZES)
def test_reductions(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 5, generator=g)
    t = dynamic(x)
    for got, want in [(t.sum(), x.sum()), (t.sum(0), x.sum(0)), (t.sum(1), x.sum(1)), (t.mean(0), x.mean(0)),
                      (t.mean(), x.mean()), (t.amax(0), x.amax(0)), (t.amin(0), x.amin(0)),
                      (t.argmax(0), x.argmax(0)), (t.logsumexp(0), x.logsumexp(0)), (t.prod(0), x.prod(0)),
                      (t.cumsum(0), x.cumsum(0))]:
        close(got, want, rtol=1e-5, atol=1e-5)
    assert bucketed(t.sum(1)) and bucketed(t.cumsum(0))
    i = torch.randint(-5, 5, (n,), generator=g)
    ti = dynamic(i)
    close(ti.sum(), i.sum())
    close((ti > 0).any(), (i > 0).any())
    close((ti > -6).all(), (i > -6).all())


@pytest.mark.parametrize("n", SIZES)
def test_flat_arg_reductions_index_as_cpu(n):
    """Regression (found by tests/test_fuzz_as_cpu.py's script mode): argmin over all dims of a
    transposed padded tensor returned its flat index in the padded layout (6 for 5 at [3, 3] on a
    4-row bucket). A flat index over a padded inner dimension now runs at exact size; over a
    padded leading dimension, or along one dim, it runs padded, as before."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 3, generator=g)
    x[n // 2, 1] = -float("inf")
    x[n - 1, 0] = float("inf")
    t = dynamic(x)
    for fn in (lambda v: v.t().argmin(), lambda v: v.t().argmax(), lambda v: v.argmin(), lambda v: v.argmax(),
               lambda v: v.t().argmin(1), lambda v: v.argmax(0, keepdim=True)):
        close(fn(t), fn(x))


@pytest.mark.parametrize("n", SIZES)
def test_any_and_all_over_no_dims_keep_the_shape(n):
    """Regression (test_fuzz_as_cpu's script mode, 20000 examples): ``any``/``all`` with ``dim=()``
    reduce nothing, but the bucketing analysis took () as every dim, and a padded input's result came
    back with its bucket's rows ([4, 2] for [3, 2])."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 2, generator=g).to(torch.bfloat16)
    x[0, 0] = 0
    t = dynamic(x)
    for fn in (lambda v: v.any(dim=()), lambda v: v.all(dim=()), lambda v: v.all(dim=(0,)), lambda v: v.any()):
        close(fn(t), fn(x))


@pytest.mark.parametrize("n", SIZES)
def test_softmax_and_its_backward(n):
    g = torch.Generator().manual_seed(n)
    x, w = torch.randn(n, 4, generator=g), torch.randn(n, 4, generator=g)
    for dim in (0, 1):
        for fn in (F.softmax, F.log_softmax):
            xc = x.clone().requires_grad_()
            (fn(xc, dim) * w).sum().backward()
            xt = dynamic(x).requires_grad_()
            y = fn(xt, dim)
            assert bucketed(y)
            (y * dynamic(w)).sum().backward()
            close(y.detach(), fn(x, dim), rtol=1e-5, atol=1e-6)
            close(xt.grad, xc.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", SIZES)
def test_contractions(n):
    g = torch.Generator().manual_seed(n)
    a, b = torch.randn(n, 4, generator=g), torch.randn(n, 3, generator=g)
    w, bias = torch.randn(4, 3, generator=g), torch.randn(3, generator=g)
    ta, tb = dynamic(a), dynamic(b)
    with torch.tpu.precision("highest"):
        close(ta.t() @ tb, a.t() @ b, rtol=1e-5, atol=1e-5)  # contracts the padded dim
        y = ta @ w.to("tpu")
        assert bucketed(y)
        close(y, a @ w, rtol=1e-5, atol=1e-5)
        close(torch.addmm(bias.to("tpu"), ta, w.to("tpu")), torch.addmm(bias, a, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", SIZES)
def test_contractions_at_default_precision(n):
    """One bf16 pass (the TPU default): the same numbers as the exact-size programs."""
    g = torch.Generator().manual_seed(n)
    a, b, w = torch.randn(n, 4, generator=g), torch.randn(n, 32, generator=g), torch.randn(4, 32, generator=g)
    ta, tb = dynamic(a), dynamic(b)
    got = [ta.t() @ tb, tb.t() @ ta, ta @ w.to("tpu")]
    eager_buckets.set_eager_buckets("exact")
    ea, eb = a.to("tpu"), b.to("tpu")
    want = [ea.t() @ eb, eb.t() @ ea, ea @ w.to("tpu")]
    for x, y in zip(got, want):
        close(x, y.cpu(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", SIZES)
def test_sort(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 3, generator=g)
    x[torch.randint(0, n, (2,), generator=g), 0] = float("nan")  # NaN sorts last, before no padding
    x[torch.randint(0, n, (2,), generator=g), 1] = float("-inf")
    x[:, 2] = x[:, 2].round()  # ties
    t = dynamic(x)
    for dim in (0, 1):
        for descending in (False, True):
            got = torch.sort(t, dim=dim, descending=descending, stable=True)
            want = torch.sort(x, dim=dim, descending=descending, stable=True)
            assert bucketed(got.values) and bucketed(got.indices)
            close(got.values, want.values)
            close(got.indices, want.indices)
    v, i = torch.sort(t, dim=0)  # the default sort: any order of ties, the indices pick the values
    close(v, torch.sort(x, dim=0).values)
    close(x.gather(0, i.cpu()), v.cpu())
    for dtype in (torch.int64, torch.bool):
        y = torch.randint(0, 3, (n,), generator=g).to(dtype)
        ty = dynamic(y)
        for descending in (False, True):
            got = torch.sort(ty, descending=descending, stable=True)
            want = torch.sort(y, descending=descending, stable=True)
            close(got.values, want.values)
            close(got.indices, want.indices)


@pytest.mark.parametrize("n", SIZES)
def test_index(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 3, generator=g)
    idx = torch.randint(-n, n, (n,), generator=g)  # negative indices count from the actual end
    t, ti = dynamic(x), dynamic(idx)
    assert bucketed(t[ti])
    close(t[ti], x[idx])
    close(t[:, 1].contiguous()[ti], x[:, 1][idx])
    order = torch.sort(t[:, 0].contiguous()).indices
    half = max(1, n // 2)
    close(t[order[:half]], x[torch.sort(x[:, 0]).indices[:half]])
    torch.tpu.synchronize()


def test_index_out_of_range_raises_as_exact():
    x = torch.randn(11, 2)
    bad = torch.tensor([0, 3, 11, 1, 2])
    t = dynamic(x)
    with pytest.raises(IndexError, match="index 11 is out of bounds for dimension 0 with size 11"):
        t[dynamic(bad)]
        torch.tpu.synchronize()
    ok = torch.tensor([0, 3, -11, 10, 2])  # padding never fails the check
    close(t[dynamic(ok)], x[ok])
    torch.tpu.synchronize()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(n, reduction):
    g = torch.Generator().manual_seed(n)
    logits, target = torch.randn(n, 5, generator=g), torch.randint(0, 5, (n,), generator=g)
    target[0] = -100  # ignored
    weight = torch.rand(5, generator=g) + 0.5
    lc = logits.clone().requires_grad_()
    want = F.cross_entropy(lc, target, weight=weight, reduction=reduction)
    want.sum().backward()
    lt = dynamic(logits).requires_grad_()
    got = F.cross_entropy(lt, dynamic(target), weight=weight.to("tpu"), reduction=reduction)
    got.sum().backward()
    close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6)
    close(lt.grad, lc.grad, rtol=1e-5, atol=1e-6)
    assert bucketed(lt.grad)


@pytest.mark.parametrize("n", [3, 9, 17])
def test_ops_that_cannot_run_padded_run_exact(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 2, generator=g)
    t = dynamic(x)
    for got, want in [(t.flip(0), x.flip(0)), (t.roll(1, 0), x.roll(1, 0)), (torch.cat([t, t]), torch.cat([x, x])),
                      (t[1:] + 1, x[1:] + 1), (t.reshape(-1).cumprod(0), x.reshape(-1).cumprod(0)),
                      (t + torch.ones(n, 2, device="tpu"), x + 1)]:
        close(got, want, rtol=1e-5, atol=1e-5)
    a, b = torch.randn(n, generator=g), torch.randn(n + 1, generator=g)
    with pytest.raises(RuntimeError, match="must match the size"):
        dynamic(a) + dynamic(b)  # different lengths: PyTorch's error, as at exact size


def _sort_index(sizes: range) -> None:
    g = torch.Generator().manual_seed(0)
    for n in sizes:
        x = torch.randn(n, generator=g)
        t = x.to("tpu")
        _, order = torch.sort(t)
        picked = t[order[: max(1, n // 2)]]
        got = float((picked * 2.0).sum())
        want = float((x[torch.sort(x).indices[: max(1, n // 2)]] * 2.0).sum())
        assert abs(got - want) <= 1e-4 * max(1.0, abs(want)), n


def test_sort_loop_compiles_a_bounded_number_of_programs(mode):
    before = _compiles()
    _sort_index(range(1, 65))
    if mode == "strict":
        # sort, index (one or two index buckets), its check, mul and sum for the first length
        # (exact) and 6 buckets (2 .. 64); per length (exact) it would be 4 or 5 x 64
        assert _compiles() - before <= 7 * 7 + 5
    else:  # one fused program per bucket (two where the gathered half spans two); exact: 64
        assert _compiles() - before <= 7 * 2 + 2


def test_sort_loop_compiles_per_length_without_buckets(mode):
    eager_buckets.set_eager_buckets("exact")
    before = _compiles()
    _sort_index(range(70, 76) if mode == "strict" else range(80, 86))  # lengths no other test compiles for
    assert _compiles() - before >= (4 if mode == "strict" else 1) * 6


def test_varlen_mlp_compiles_a_bounded_number_of_programs(mode):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    model.load_state_dict(cpu.state_dict())
    model = model.to("tpu")
    before = _compiles()
    with torch.tpu.precision("highest"):
        for n in range(1, 41):
            x, y = torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)
            want = F.cross_entropy(cpu(x), y)
            want.backward()
            got = F.cross_entropy(model(x.to("tpu")), y.to("tpu"))
            got.backward()
            assert abs(float(got) - float(want)) < 1e-5, n
    for p, q in zip(cpu.parameters(), model.parameters()):
        close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
    if mode == "strict":
        # the 14 programs of a step for the first length (exact) and for 6 buckets (2 .. 64), and
        # a few of the gradients' accumulation; per length (exact) it would be 14 x 40
        assert _compiles() - before <= 7 * 14 + 8
    else:  # a fused step per bucket, and the first steps' variants (no gradient yet); exact: 40
        assert _compiles() - before <= 7 * 2 + 2


def test_exact_mode_uploads_exact_buffers():
    eager_buckets.set_eager_buckets("exact")
    for n in (3, 5):
        t = torch.randn(n, 2).to("tpu")
    assert not eager_buckets.is_marked(t.untyped_storage())
    assert st.storage_buffer(t.untyped_storage()).shape == (5, 2)


def test_parameters_keep_exact_buffers():
    for n in (3, 5):
        lin = torch.nn.Linear(2, n).to("tpu")  # Module.to: an upload made inside torch
    assert not eager_buckets.is_marked(lin.weight.untyped_storage())
    assert st.storage_buffer(lin.weight.untyped_storage()).shape == (5, 2)
