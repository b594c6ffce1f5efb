"""torch.compile(model, backend="tpu"): graphs lowered to one executable each."""

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import count_launches
from torch import nn

from torchtpu.examples.gpt import GPT, GPTConfig, make_batch


def test_compiled_mlp_forward_backward_matches_eager():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).to("tpu")
    m2 = copy.deepcopy(m)
    x = torch.randn(5, 8, device="tpu")
    cm = torch.compile(m2, backend="tpu")
    with torch.tpu.precision("highest"):
        ref = m(x)
        out = cm(x)
        torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-5, atol=1e-5)
        ref.square().sum().backward()
        out.square().sum().backward()
    for p, q in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu(), rtol=1e-4, atol=1e-5)


def test_compiled_gpt_training_step_matches_eager():
    torch.manual_seed(0)
    cfg = GPTConfig(seq=32, d_model=64, layers=2)
    base = GPT(cfg)
    me, mc = copy.deepcopy(base).to("tpu"), copy.deepcopy(base).to("tpu")
    oe = torch.optim.AdamW(me.parameters(), lr=3e-3)
    oc = torch.optim.AdamW(mc.parameters(), lr=3e-3)

    def step(model, opt, x, y):
        loss = model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    cstep = torch.compile(step, backend="tpu")
    g = torch.Generator().manual_seed(0)
    with torch.tpu.precision("highest"):
        for _ in range(4):
            x, y = make_batch(cfg, 4, g)
            x, y = x.to("tpu"), y.to("tpu")
            le = step(me, oe, x, y).item()
            lc = cstep(mc, oc, x, y).item()
            assert abs(le - lc) <= 1e-4 * abs(le), (le, lc)


def test_whole_training_step_compiles_to_one_graph():
    """Forward, backward and optimizer.step() in one Dynamo graph, hence one XLA program.

    By default Dynamo breaks the graph at ``loss.backward()`` (the backend then runs the two
    halves, see the test above). torch 2.13's ``trace_autograd_ops`` traces the backward as
    autograd.grad plus gradient accumulation instead. ``zero_grad`` stays outside the compiled
    function: Dynamo skips tracing it, and with it inside the step the flag's rewrite leaves the
    parameters unchanged, with any backend, CPU ``eager`` included (a PyTorch limitation).
    """
    # config.patch, not monkeypatch: the flag is a hidden config entry, and monkeypatch's undo
    # leaves it unreadable for later tests that trace a backward
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        _whole_training_step_in_one_graph()
    torch._dynamo.reset()  # no graph traced under the flag outlives this test


def _whole_training_step_in_one_graph():
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = GPTConfig(seq=32, d_model=64, layers=2)
    base = GPT(cfg)
    me, mc = copy.deepcopy(base).to("tpu"), copy.deepcopy(base).to("tpu")
    oe = torch.optim.AdamW(me.parameters(), lr=3e-3)
    oc = torch.optim.AdamW(mc.parameters(), lr=3e-3, capturable=True)

    def step(model, opt, x, y):
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        return loss

    g = torch.Generator().manual_seed(0)
    batches = [tuple(t.to("tpu") for t in make_batch(cfg, 4, g)) for _ in range(3)]
    explained = torch._dynamo.explain(step)(copy.deepcopy(mc), torch.optim.AdamW(
        copy.deepcopy(mc).parameters(), capturable=True), *batches[0])
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    torch._dynamo.reset()
    cstep = torch.compile(step, backend="tpu")
    with torch.tpu.precision("highest"):
        for x, y in batches:
            le = step(me, oe, x, y).item()
            lc = cstep(mc, oc, x, y).item()
            oe.zero_grad(set_to_none=True)
            oc.zero_grad(set_to_none=True)
            assert abs(le - lc) <= 1e-4 * abs(le), (le, lc)
    # The parameters moved (the failure mode above leaves them as they were) and moved alike:
    # 3 steps at lr 3e-3 move a weight up to ~1e-2; capturable and plain AdamW round apart.
    for p0, pe, pc in zip(base.parameters(), me.parameters(), mc.parameters()):
        assert (pc.cpu() - p0).abs().max() > 1e-3
        torch.testing.assert_close(pc.cpu(), pe.cpu(), rtol=1e-3, atol=1e-4)


def test_backend_registered_by_entry_point():
    assert "tpu" in torch._dynamo.list_backends()


def test_changing_python_scalar_does_not_recompile_each_step():
    w = torch.randn(4, device="tpu")

    @torch.compile(backend="tpu")
    def f(w, lr):
        return w * lr + 1

    f(w, 0.1)
    f(w, 0.2)
    before = torch.tpu.compile_cache_stats()["misses"]
    for lr in (0.3, 0.4, 0.5, 0.6):
        out = f(w, lr)
    assert torch.tpu.compile_cache_stats()["misses"] == before
    torch.testing.assert_close(out.cpu(), w.cpu() * 0.6 + 1)


def test_compiled_autocast_bfloat16():
    m = nn.Linear(8, 4).to("tpu")
    x = torch.randn(3, 8, device="tpu")

    @torch.compile(backend="tpu")
    def f(x):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            return m(x)

    out = f(x)
    assert out.dtype == torch.bfloat16
    with torch.autocast("tpu", dtype=torch.bfloat16):
        ref = m(x)
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), rtol=1e-2, atol=1e-2)


def test_compiled_precision_follows_context():
    a = torch.randn(64, 1024, dtype=torch.float64)
    b = torch.randn(1024, 64, dtype=torch.float64)
    exact = a @ b
    f = torch.compile(lambda x, y: x @ y, backend="tpu")
    errs = {}
    for p in ("medium", "highest"):
        with torch.tpu.precision(p):
            out = f(a.float().to("tpu"), b.float().to("tpu")).cpu().double()
        errs[p] = ((out - exact).norm() / exact.norm()).item()
    assert errs["medium"] > 1e-3, errs
    assert errs["highest"] < 1e-6, errs


def test_dynamic_shapes_are_correct():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).to("tpu")
    f = torch.compile(m, backend="tpu", dynamic=True)
    with torch.tpu.precision("highest"):
        for n in (3, 5, 9):
            x = torch.randn(n, 8, device="tpu")
            out = f(x)
            assert out.shape == (n, 4)
            torch.testing.assert_close(out.cpu(), m(x).cpu(), rtol=1e-5, atol=1e-5)


def test_dynamic_gpt_sequence_lengths_match_static():
    torch.manual_seed(0)
    m = GPT(GPTConfig(seq=64, d_model=64, layers=1)).to("tpu").eval()
    f = torch.compile(m, backend="tpu", dynamic=True)
    with torch.no_grad(), torch.tpu.precision("highest"):
        for t in (3, 7, 20):
            idx = torch.randint(0, 256, (1, t)).to("tpu")
            torch.testing.assert_close(f(idx).cpu(), m(idx).cpu(), rtol=1e-5, atol=1e-5)


def test_saved_views_of_inputs_are_not_copied():
    """A forward graph that saves a view of an input (a weight's transpose, kept for the
    backward) hands out a view of the input rather than a copy made by the program."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchtpu.engine.graph_runner import GraphProgram

    def f(w, x):
        wt = torch.ops.aten.t.default(w)
        return torch.ops.aten.mm.default(x, wt), wt, torch.ops.aten.permute.default(w, [1, 0])[1:]

    w, x = torch.randn(6, 4), torch.randn(3, 4)
    gm = make_fx(f, tracing_mode="fake")(w, x)
    wt_dev, x_dev = w.to("tpu"), x.to("tpu")
    with torch.tpu.precision("highest"):
        out, wt, tail = GraphProgram(gm, "views")([wt_dev, x_dev])
    for view, ref in ((wt, w.t()), (tail, w.t()[1:])):
        assert view.untyped_storage()._cdata == wt_dev.untyped_storage()._cdata
        assert view.stride() == ref.stride() and view.storage_offset() == ref.storage_offset()
        torch.testing.assert_close(view.cpu(), ref)
    torch.testing.assert_close(out.cpu(), x @ w.t())


def test_outputs_viewing_one_intermediate_share_its_buffer():
    """Outputs that together view all of one intermediate (q, k and v cut from one projection;
    a softmax saved as itself and reshaped) are views of one output buffer, not copies; a
    small slice of a large intermediate is still copied, so it does not keep the rest alive."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchtpu.engine.graph_runner import GraphProgram

    aten = torch.ops.aten

    def f(x, w):
        qkv = aten.mm.default(x, w)
        q, k, v = aten.split_with_sizes.default(qkv, [4, 4, 4], 1)
        s = aten._softmax.default(aten.mm.default(x, x.t()), 1, False)
        big = aten.mul.Tensor(w, 2.0)
        return (aten.t.default(q), aten.view.default(k, [5, 2, 2]), v, aten.detach.default(s),
                aten.view.default(s, [25]), aten.slice.Tensor(big, 1, 0, 1))

    x, w = torch.randn(5, 3), torch.randn(3, 12)
    gm = make_fx(f, tracing_mode="fake")(x, w)
    with torch.tpu.precision("highest"):
        outs = GraphProgram(gm, "shared")([x.to("tpu"), w.to("tpu")])
    refs = f(x, w)
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    for out, ref in zip(outs[:5], refs[:5]):  # views of a shared buffer keep eager's layout
        assert out.stride() == ref.stride() and out.storage_offset() == ref.storage_offset()
    storage = [o.untyped_storage()._cdata for o in outs]
    assert storage[0] == storage[1] == storage[2]  # q, k, v: one buffer
    assert storage[3] == storage[4] != storage[0]  # the softmax, once
    assert outs[5].untyped_storage().nbytes() == 3 * 4  # the slice alone


def test_compiled_graph_reports_out_of_range_indices_like_eager():
    """Regression: compiled gathers clamped out-of-range indices silently (the CPU raises)."""
    import pytest

    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    emb = nn.Embedding(5, 3).to("tpu")

    def t(v):
        return torch.tensor(v).to("tpu")

    def f(x, i, target, tokens):
        return torch.gather(x, 1, i).sum() + nn.functional.cross_entropy(x, target) + emb(tokens).sum()

    cf = torch.compile(f, backend="tpu")
    good = (t([[1], [2], [3]]), t([0, 1, 2]), t([0, 4]))
    first = cf(x, *good).item()
    cases = [((t([[1], [7], [3]]), good[1], good[2]), RuntimeError,
              "index 7 is out of bounds for dimension 1 with size 4"),
             ((good[0], t([0, 9, 2]), good[2]), IndexError, "Target 9 is out of bounds."),
             ((good[0], good[1], t([0, 5])), IndexError, "index out of range in self")]
    for args, error, message in cases:
        out = cf(x, *args)  # the same compiled program: the check does not wait for the device
        with pytest.raises(error) as info:
            out.item()
        assert str(info.value).startswith(message)
    assert cf(x, *good).item() == first  # reported once; valid indices raise nothing



def _programs(monkeypatch):
    """The GraphPrograms torch.compile makes from now on."""
    from torchtpu.engine import graph_runner

    made = []
    init = graph_runner.GraphProgram.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(graph_runner.GraphProgram, "__init__", recording_init)
    return made


def test_compiled_dynamic_graph_reports_out_of_range_indices(monkeypatch):
    """Regression: graphs traced with symbolic shapes (dynamic=True, or Dynamo's automatic dynamic
    shapes after a size change) left indices unchecked, so bad ones were clamped silently.
    (This graph cannot run at bucket sizes: a gather along a padded dim.)"""
    emb = nn.Embedding(5, 3).to("tpu")

    def t(v):
        return torch.tensor(v).to("tpu")

    def f(x, i, target, tokens):
        return torch.gather(x, 1, i).sum() + nn.functional.cross_entropy(x, target) + emb(tokens).sum()

    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    good = (x, t([[1], [2], [3]]), t([0, 1, 2]), t([0, 4, 1]))
    cases = [((x, t([[1], [7], [3]]), good[2], good[3]), RuntimeError,
              "index 7 is out of bounds for dimension 1 with size 4"),
             ((x, good[1], t([0, 9, 2]), good[3]), IndexError, "Target 9 is out of bounds."),
             ((x, good[1], good[2], t([0, 5, 1])), IndexError, "index out of range in self")]
    made = _programs(monkeypatch)
    torch._dynamo.reset()
    cf = torch.compile(f, backend="tpu", dynamic=True)
    first = cf(*good).item()
    assert first == pytest.approx(f(*good).item(), rel=1e-5)
    assert made[0].symbolic and made[0].bounded
    for args, error, message in cases:
        out = cf(*args)
        with pytest.raises(error) as info:
            out.item()
        assert str(info.value).startswith(message)
    assert cf(*good).item() == first


def test_compiled_bucketed_graph_reports_out_of_range_indices(monkeypatch):
    """Regression: a graph run at bucket sizes (dynamic=True) did not check its indices. Its
    padding holds whatever the graph computed there: it must not be taken for a bad index."""
    emb = nn.Embedding(5, 3).to("tpu")
    head = nn.Linear(2, 5).to("tpu")  # a parameter: its sizes stay static

    def f(tokens, rows):
        # tokens in [-5, 0): a padded position (0 in the input) becomes index 5, out of range
        return emb(tokens + 5).sum(1) * head.weight.index_select(0, rows).sum(1)

    def t(v):
        return torch.tensor(v).to("tpu")

    made = _programs(monkeypatch)
    torch._dynamo.reset()
    cf = torch.compile(f, backend="tpu", dynamic=True)
    for n in (3, 5, 6):  # sizes 3, 5, 6 run padded to buckets 4, 8, 8
        tokens, rows = t([-5, -1, -3, -2, -4, -1][:n]), t([0, 4, 2, 1, 3, 0][:n])
        torch.testing.assert_close(cf(tokens, rows).cpu(), f(tokens, rows).cpu())
    assert any(isinstance(p._plan, bucketing_plan()) and p.bounded for p in made)
    for tokens, rows in (([-5, 0, -3], [0, 4, 2]), ([-5, -1, -3, -2, -4], [0, 4, 7, 1, 3])):
        out = cf(t(tokens), t(rows))
        with pytest.raises(IndexError, match="^index out of range in self"):
            out.cpu()
    tokens, rows = t([-5, -1, -3]), t([0, 4, 2])
    torch.testing.assert_close(cf(tokens, rows).cpu(), f(tokens, rows).cpu())


def bucketing_plan() -> type:
    from torchtpu.engine import bucketing

    return bucketing.Plan


def test_compiled_linalg_checks_raise_the_cpu_error():
    """Regression: torch.compile of linalg.inv, cholesky and lu_factor failed ("cannot lower graph
    node with_effects": AOTAutograd wraps their LAPACK-info check in an effect). They now run, and
    a singular or indefinite input raises the CPU's exception and message at the next read."""
    sing = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    good = torch.tensor([[4.0, 1.0], [1.0, 3.0]])
    cases = [(torch.linalg.inv, sing), (torch.linalg.cholesky, -torch.eye(2)),
             (lambda x: torch.linalg.lu_factor(x)[0], sing),
             (torch.linalg.inv, torch.stack([good, sing, sing]))]  # batched: names the element
    for f, bad in cases:
        torch._dynamo.reset()
        cf = torch.compile(f, backend="tpu")
        torch.testing.assert_close(cf(good.to("tpu")).cpu(), f(good))
        with pytest.raises(RuntimeError) as cpu_error:
            f(bad)
        out = cf(bad.to("tpu"))
        with pytest.raises(RuntimeError) as tpu_error:
            out.cpu()
        assert type(tpu_error.value) is type(cpu_error.value)
        assert str(tpu_error.value).startswith(str(cpu_error.value))
        torch.testing.assert_close(cf(good.to("tpu")).cpu(), f(good))  # reported once


@pytest.mark.parametrize("case", ["to_tpu", "to_cpu", "cpu_only"])
def test_graphs_crossing_devices_run_eagerly_with_correct_devices(case, monkeypatch):
    """Regression: a compiled function moving a CPU tensor to tpu, or only on CPU tensors, failed
    ("Expected all tensors to be on the same device"), and one returning ``b.cpu() * 2`` gave a tpu
    tensor. Such graphs now run op by op, each op on its own device, with a warning."""
    import torchtpu.compile

    monkeypatch.setattr(torchtpu.compile, "_warned_eager", set())  # it warns once per graph kind
    torch._dynamo.reset()
    a, b = torch.arange(3.0), torch.arange(3.0).to("tpu")
    fn, args, device, expected = {
        "to_tpu": (lambda a, b: a.to("tpu") * b, (a, b), "tpu", torch.tensor([0.0, 1, 4])),
        "to_cpu": (lambda b: b.cpu() * 2, (b,), "cpu", torch.tensor([0.0, 2, 4])),
        "cpu_only": (lambda a: a * 2 + 1, (a,), "cpu", torch.tensor([1.0, 3, 5])),
    }[case]
    with pytest.warns(UserWarning, match="moves tensors between devices"):
        got = torch.compile(fn, backend="tpu")(*args)
    assert got.device.type == device
    torch.testing.assert_close(got.cpu(), expected)


def test_one_hot_and_assert_async_in_compiled_graphs():
    """Regression: F.one_hot failed to compile (no lowering for aten::_assert_async.msg). The assert
    becomes a device check: an out-of-range class raises CPU's error at the next synchronization."""
    torch._dynamo.reset()
    f = torch.compile(lambda i: torch.nn.functional.one_hot(i, 6), backend="tpu")
    classes = torch.tensor([0, 5, 2])
    assert torch.equal(f(classes.to("tpu")).cpu(), torch.nn.functional.one_hot(classes, 6))
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
        f(torch.tensor([0, 7, 2], device="tpu")).cpu()


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_assert_async_eager_matches_cpu(mode):
    """Regression: torch._assert_async was unimplemented on tpu; it now raises CPU's errors."""
    cases = [(torch.tensor(True), "boom"), (torch.tensor(False), "boom"), (torch.tensor(0),), (torch.tensor(2.5),),
             (torch.tensor([1, 1]),)]
    with torch.tpu.eager_mode(mode):
        for args in cases:
            try:
                torch._assert_async(*args)
                expected = None
            except RuntimeError as e:
                expected = str(e)
            if expected is None:
                torch._assert_async(args[0].to("tpu"), *args[1:])
            else:
                with pytest.raises(RuntimeError, match=expected):
                    torch._assert_async(args[0].to("tpu"), *args[1:])


def test_default_backend_compiles_tpu_graphs(recwarn):
    """Regression: a CUDA script's plain ``torch.compile(model)`` (Inductor) failed on tpu tensors
    with "No module named 'jax'" (Inductor's "tpu" code generator is Pallas). Graphs holding tpu
    tensors now go to the "tpu" backend: the same results, training included, without a warning."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
    ref = copy.deepcopy(model).to("tpu")
    model = model.to("tpu")
    x = torch.randn(4, 8).to("tpu")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]

    def step(m, opt):
        opt.zero_grad()
        loss = m(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    compiled = torch.compile(step)
    tpu_backend = torch.compile(step, backend="tpu")
    for _ in range(3):
        torch.testing.assert_close(compiled(model, opts[0]).cpu(), tpu_backend(ref, opts[1]).cpu())
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.cpu())
    # (the process's one note on the default matmul precision comes with whichever product is
    # lowered first: this test's, when it runs first in its process)
    assert not [w for w in recwarn if "torchtpu" in str(w.message) and "precision 'medium'" not in str(w.message)]
    torch._dynamo.reset()


def test_inductor_settings_on_tpu_graphs_warn_once():
    import torchtpu.compile as tpu_compile

    torch._dynamo.reset()
    tpu_compile._warned_inductor_settings = False
    x = torch.ones(3).to("tpu")
    with pytest.warns(UserWarning, match="Inductor settings"):
        out = torch.compile(lambda a: a * 2 + 1, mode="max-autotune")(x)
    torch.testing.assert_close(out.cpu(), torch.full((3,), 3.0))
    torch._dynamo.reset()


def test_graphs_without_tpu_tensors_are_left_to_inductor():
    from torchtpu.compile import holds_tpu_tensors

    gm = torch.fx.symbolic_trace(lambda a: a + 1)
    assert not holds_tpu_tensors(gm, [torch.ones(2)])
    assert holds_tpu_tensors(gm, [torch.ones(2, device="tpu")])


def _branchy(x, y):
    return torch.cond(x.sum() > 0, lambda x, y: (x * 2 + y).sin(), lambda x, y: x - y.exp(), (x, y))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_compiles_to_one_program_with_backward(sign):
    """Regression: torch.cond in a compiled graph raised "cannot lower graph node cond". It is now
    a stablehlo.if: both branches, forward and backward, match CPU."""
    x = sign * (torch.rand(4) + 0.1)
    y = torch.randn(4)
    xr = x.clone().requires_grad_()
    ref = _branchy(xr, y)
    ref.sum().backward()
    xt = x.to("tpu").requires_grad_()
    out = torch.compile(_branchy, backend="tpu")(xt, y.to("tpu"))
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    torch.testing.assert_close(xt.grad.cpu(), xr.grad)


def test_while_loop_and_nested_cond_compile():
    from torch._higher_order_ops import while_loop

    def collatz_steps(n, scale):
        def body(i, v, acc):
            v = torch.cond(v % 2 == 0, lambda v: v // 2, lambda v: 3 * v + 1, (v,))
            return i + 1, v, acc + scale.sum()
        return while_loop(lambda i, v, acc: v != 1, body, (torch.zeros_like(n), n, torch.zeros_like(scale.sum())))

    n, scale = torch.tensor(27), torch.tensor([0.5, 0.25])
    want = collatz_steps(n, scale)
    got = torch.compile(collatz_steps, backend="tpu")(n.to("tpu"), scale.to("tpu"))
    assert [int(t) for t in want[:2]] == [111, 1]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)


def test_cond_in_a_dynamic_graph():
    """Graphs with symbolic sizes get concrete values per size, for the branches' nodes too."""
    compiled = torch.compile(_branchy, backend="tpu", dynamic=True)
    for n in (3, 5, 9):
        x, y = torch.randn(n), torch.randn(n)
        torch.testing.assert_close(compiled(x.to("tpu"), y.to("tpu")).cpu(), _branchy(x, y))


def test_graph_with_an_unlowerable_node_runs_eagerly_with_a_warning():
    """A node the graph lowering cannot take (here a boolean-mask assignment whose values depend on
    the mask's count) no longer fails the compiled function: its graph runs op by op in the
    current eager mode, once warned; nothing ran before the fallback, so results are exact."""
    def f(x):
        y = x.clone()
        y[x > 0] = x[x > 0] * 2
        return y + 1

    x = torch.randn(5, 4)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="tpu")
    with pytest.warns(UserWarning, match="runs op by op"):
        got = compiled(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), f(x))
    torch.testing.assert_close(compiled(x.to("tpu")).cpu(), f(x))  # the fallback sticks, silently
    torch._dynamo.reset()


def test_compiled_boolean_mask_assignments_lower_as_selects():
    def f(x):
        y = x.clone()
        y[y > 0.5] = -1.0
        y[x[:, 0] > 0] = torch.arange(4.0, device=x.device)
        y[:, x[0] > 0] = 7.0
        y.index_put_((x < -1,), torch.tensor(2.0, device=x.device), accumulate=True)
        return y

    x = torch.randn(5, 4)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x.to("tpu")).cpu(), f(x))
    torch._dynamo.reset()


def test_dynamo_does_not_trace_host_kernels_run_under_compiled_code():
    """Regression: after a graph break, Dynamo's frame hook is live while the rest of the compiled
    function runs eagerly, and it traced torchtpu's host kernels (x[x > 0]'s boolean indexing,
    entered straight from the dispatcher), warning about our C++ functions and the lru_cache."""
    def f(x):
        y = x[x > 0]
        return y.sum() + x.nonzero().shape[0]

    x = torch.randn(6, 3)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), f(x))
    traced = [str(w.message) for w in caught if "Dynamo" in str(w.message) and "torchtpu" in str(w.message)
              or "executor.py" in str(w.message)]
    assert not traced, traced
    torch._dynamo.reset()


# -- compiled graphs inside DeferAndFuse: recorded as one op (engine/graph_node.py) --------------

def _compiled_gpt_step(layers: int, batch: int) -> tuple[GPT, Any]:
    """A small GPT on tpu and its training step (compiled loss, AdamW), returning the loss."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=64, seq=16, d_model=32, layers=layers, heads=2)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = torch.compile(model.loss, backend="tpu")
    x, y = (t.to("tpu") for t in make_batch(model.cfg, batch, torch.Generator().manual_seed(0)))

    def step() -> torch.Tensor:
        loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return model, step


def _compiled_gpt_losses(mode: str, steps: int, read_each_step: bool) -> tuple[list[float], Any]:
    model, step = _compiled_gpt_step(layers=2, batch=8)
    losses = []
    with torch.tpu.eager_mode(mode):
        for _ in range(steps):
            loss = step()
            losses.append(loss.item() if read_each_step else loss.detach())
        torch.tpu.synchronize()
    return [float(v) for v in losses], model


def test_compiled_training_step_in_defer_and_fuse_is_one_launch(monkeypatch):
    """The forward and backward graphs are recorded like eager ops, so with the eager optimizer
    they make one program: one launch per step, with a read per step or without (a step's
    forward graph cuts the recording: deferred.cut_before_step). The losses are Strict's."""
    strict, _ = _compiled_gpt_losses("strict", 6, read_each_step=True)
    launches = count_launches(monkeypatch)
    fused, _ = _compiled_gpt_losses("defer_and_fuse", 6, read_each_step=True)
    torch.testing.assert_close(fused, strict, rtol=2e-3, atol=2e-3)
    per_step = launches[0]
    launches[0] = 0
    _compiled_gpt_losses("defer_and_fuse", 6, read_each_step=False)
    assert per_step <= 6 + 2, per_step  # (+2: the parameters' and inputs' first transfers' programs)
    assert launches[0] <= 6 + 2, launches[0]


def test_compiled_steps_in_defer_and_fuse_without_reads_compile_few_programs(monkeypatch):
    """Regression: without reads, DeferAndFuse's chunk cuts fell at other ops of each step until
    the step's period was found, and each new cut point made a new program holding whole graphs
    (a 12-layer GPT spent ~90 s compiling them on the emulator; on a TPU the 100M GPT timed out).
    A training step's forward graph now cuts the recording: one program per step from the
    second window on."""
    from torchtpu.engine import deferred

    _, step = _compiled_gpt_step(layers=4, batch=4)
    with torch.tpu.defer_and_fuse():
        compiles = []
        for _ in range(4):
            before = deferred.stats["compiles"]
            for _ in range(5):
                step()
            torch.tpu.synchronize()
            compiles.append(deferred.stats["compiles"] - before)
    assert sum(compiles[1:]) <= 2 and compiles[-1] == 0, compiles


@pytest.mark.parametrize("fuse, per_step", [("backward", 2), ("optimizer", 1)])
def test_compiled_training_step_in_strict_mode_is_one_or_two_launches(fuse, per_step, monkeypatch):
    """Strict mode records a compiled training step from its forward graph through its backward
    (then the optimizer step is a second program) or through the optimizer step (step_recording.py):
    two launches per step, or one, instead of four (forward graph, autograd's gradient seed,
    backward graph, optimizer step), with the op-by-op losses; the mode still reads "strict"."""
    from torchtpu import step_recording

    monkeypatch.setattr(step_recording, "_FUSE_COMPILED", "off")
    launches = count_launches(monkeypatch)
    separate, _ = _compiled_gpt_losses("strict", 6, read_each_step=True)
    per_step_separate = launches[0]
    monkeypatch.setattr(step_recording, "_FUSE_COMPILED", fuse)
    launches[0] = 0
    fused, _ = _compiled_gpt_losses("strict", 6, read_each_step=True)
    torch.testing.assert_close(fused, separate, rtol=2e-3, atol=2e-3)
    assert per_step_separate >= 4 * 6, per_step_separate
    assert launches[0] <= per_step * 6 + 2, launches[0]  # (+2: the parameters' and inputs' first transfers)
    assert torch.tpu.get_eager_mode() == "strict" and not step_recording.recording()


def test_a_compiled_steps_two_programs_compile_side_by_side(monkeypatch):
    """Strict mode's first compiled training step: the forward-through-backward program is cut at
    the optimizer's pre-hook and compiles in the background while the optimizer step is recorded,
    and the optimizer step's program starts compiling before the first one is done (before, the
    step's end waited for the first compile, then compiled the second: a first step paid both).
    The losses are those of the steps run op by op."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from torchtpu import step_recording
    from torchtpu.engine import deferred

    monkeypatch.setattr(step_recording, "_FUSE_COMPILED", "off")
    separate, _ = _compiled_gpt_losses("strict", 3, read_each_step=True)
    monkeypatch.setattr(step_recording, "_FUSE_COMPILED", "backward")
    deferred.cache_clear()
    torch.tpu.clear_compile_cache(1)
    finished_before_start: list[int] = []  # per background compile: how many had finished when it began
    finished: list[int] = []
    two_in_flight = threading.Event()
    compile_fused = deferred._compile_fused

    def held(*args):
        finished_before_start.append(len(finished))
        if len(finished_before_start) >= 2:
            two_in_flight.set()
        two_in_flight.wait(5)  # without the overlap, the first compile goes on alone after 5 s
        try:
            return compile_fused(*args)
        finally:
            finished.append(1)

    monkeypatch.setattr(deferred, "_compiler", ThreadPoolExecutor(4, thread_name_prefix="torchtpu-compile-test"))
    monkeypatch.setattr(deferred, "_compile_fused", held)
    fused, _ = _compiled_gpt_losses("strict", 3, read_each_step=True)
    assert finished_before_start[:2] == [0, 0], finished_before_start
    torch.testing.assert_close(fused, separate, rtol=2e-3, atol=2e-3)


def test_recorded_compiled_steps_without_reads_make_one_program_variant(monkeypatch):
    """A graph with index checks (the GPT's embeddings) takes the device's check flag. The flag
    it took was a dead input (donated) when it came from the step before and a live one after a
    sync (the clear flag), so steps without reads compiled the step's program twice."""
    from torchtpu import step_recording
    from torchtpu.engine import deferred

    monkeypatch.setattr(step_recording, "_FUSE_COMPILED", "backward")
    _, step = _compiled_gpt_step(layers=1, batch=4)
    step().item()  # the first step: its programs, the optimizer's state created
    before = deferred.stats["compiles"]
    for _ in range(5):
        loss = step()
    loss.item()
    assert deferred.stats["compiles"] - before <= 1, deferred.stats["compiles"] - before  # the optimizer's next step


def _strict_steps(model: nn.Module, steps: list[str], fuse: str, monkeypatch) -> tuple[list[float], list]:
    """Losses and parameters after compiled training steps in Strict mode, each step the ``steps``
    entry: "outside" (zero_grad before backward, set_to_none=False), "inside" (after the step),
    "read" (the loss read between forward and backward), "accumulate" (two micro-batches)."""
    from torchtpu import step_recording

    monkeypatch.setattr(step_recording, "_FUSE_COMPILED", fuse)
    torch._dynamo.reset()
    m = copy.deepcopy(model).to("tpu")
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    f = torch.compile(m, backend="tpu")
    g = torch.Generator().manual_seed(0)
    losses = []
    for kind in steps:
        if kind == "outside":
            opt.zero_grad(set_to_none=False)
        for _ in range(2 if kind == "accumulate" else 1):
            x = torch.randn(8, 6, generator=g).to("tpu")
            loss = f(x).square().mean()
            if kind == "read":
                losses.append(loss.item())
                assert not step_recording.recording()  # a read ends the recording
            loss.backward()
        assert torch.tpu.get_eager_mode() == "strict"
        opt.step()
        assert not step_recording.recording()
        if kind != "outside":
            opt.zero_grad(set_to_none=kind != "inside")
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in m.parameters()]


def test_compiled_steps_in_strict_mode_match_op_by_op_with_zero_grad_inside_or_outside(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
    kinds = ["inside", "outside", "outside", "read", "accumulate", "inside", "accumulate", "read"]
    with torch.tpu.precision("highest"):
        separate = _strict_steps(model, kinds, "off", monkeypatch)
        for fuse in ("backward", "optimizer"):
            torch.testing.assert_close(_strict_steps(model, kinds, fuse, monkeypatch), separate, rtol=1e-5, atol=1e-6)


def test_strict_step_recording_ends_at_a_read_and_eager_ops_run_at_once(monkeypatch):
    """A compiled training forward begins recording; a read ends it, and later ops launch one by
    one again (an inference graph never begins it)."""
    from torchtpu import step_recording

    torch._dynamo.reset()
    m = nn.Linear(4, 4).to("tpu")
    f = torch.compile(m, backend="tpu")
    x = torch.randn(2, 4).to("tpu")
    f(x).sum().item()  # compiles
    launches = count_launches(monkeypatch)
    y = f(x)
    assert step_recording.recording() and launches[0] == 0
    assert torch.tpu.get_eager_mode() == "strict"
    z = y.detach() * 2
    assert launches[0] == 0  # recorded with the graph
    torch.testing.assert_close(z.cpu(), m(x).detach().cpu() * 2)
    assert not step_recording.recording()
    launches[0] = 0
    w = z + 1
    assert launches[0] == 1  # Strict again: launched at once
    with torch.no_grad():
        f(w)
    assert not step_recording.recording() and launches[0] == 2


def test_compiled_graph_writing_its_inputs_in_defer_and_fuse():
    """A graph that writes its inputs (BatchNorm's running statistics) writes them when recorded."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU())
    x = torch.randn(16, 6)
    results = {}
    for mode in ("strict", "defer_and_fuse"):
        torch._dynamo.reset()
        m = copy.deepcopy(base).to("tpu")
        f = torch.compile(m, backend="tpu")
        with torch.tpu.eager_mode(mode):
            for _ in range(3):
                out = f(x.to("tpu"))
            results[mode] = (out.cpu(), m[1].running_mean.cpu(), m[1].running_var.cpu(),
                             int(m[1].num_batches_tracked.cpu()))
    for a, b in zip(results["defer_and_fuse"], results["strict"]):
        torch.testing.assert_close(a, b)
    assert results["strict"][3] == 3


def test_compiled_graph_index_checks_in_defer_and_fuse():
    """The graph's index checks fold into the device's flag: a bad index raises at the read."""
    torch._dynamo.reset()
    emb = nn.Embedding(5, 3).to("tpu")
    f = torch.compile(lambda i: emb(i) * 2, backend="tpu")
    with torch.tpu.defer_and_fuse():
        ok = f(torch.tensor([0, 4]).to("tpu")).cpu()
        torch.testing.assert_close(ok, emb.weight.detach().cpu()[[0, 4]] * 2)
        with pytest.raises(IndexError, match="index out of range in self"):
            f(torch.tensor([1, 5]).to("tpu")).cpu()


def test_compiled_graph_that_does_not_lower_in_defer_and_fuse_runs_as_before(monkeypatch):
    """A graph with a node that has no lowering (a mask assignment whose values depend on the
    mask's count) is not recorded: it takes Strict's path, which runs it op by op once warned."""
    made = _programs(monkeypatch)
    torch._dynamo.reset()

    def f(x):
        y = x.clone()
        y[x > 0] = x[x > 0] * 2
        return y + 1

    x = torch.randn(5, 4)
    with torch.tpu.defer_and_fuse(), pytest.warns(UserWarning, match="runs op by op"):
        got = torch.compile(f, backend="tpu")(x.to("tpu")).cpu()
    torch.testing.assert_close(got, f(x))
    assert any(p._node is None for p in made)  # (the graph with the mask assignment)
    torch._dynamo.reset()


def _assemble_spec_by_spec(specs, outs, args):
    """graph_runner's results assembled spec by spec (as before ResultPlan): the reference."""
    results = []
    for spec in specs:
        if spec.kind == "tensor":
            results.append(outs[spec.index])
        elif spec.kind == "input":
            results.append(args[spec.index])
        elif spec.kind == "input_view":
            results.append(args[spec.index].as_strided(*spec.value))
        elif spec.kind == "output_view":
            results.append(outs[spec.index].as_strided(*spec.value))
        else:
            results.append(spec.value)
    return results


@pytest.mark.parametrize("kinds", ["", "t", "i", "v", "o", "I", "tiovIt", "vvi", "oOoti"])
def test_result_plan_assembles_a_graphs_results_as_spec_by_spec(kinds):
    """graph_runner.ResultPlan (planned once per graph, one itemgetter per call) returns what the
    spec-by-spec assembly returned: the same objects, views of the same storages with the same
    layouts, constants, in order; for no result and one result too, and again when the number of
    arguments or outputs changes."""
    from torchtpu.engine.graph_runner import OutSpec, ResultPlan

    outs = [torch.arange(12.0), torch.arange(6.0).reshape(2, 3)]
    args = [torch.ones(4, 3), torch.zeros(5)]
    specs = []
    for n, k in enumerate(kinds):
        if k == "t":
            specs.append(OutSpec("tensor", n % 2))
        elif k == "i":
            specs.append(OutSpec("input", n % 2))
        elif k == "v":
            specs.append(OutSpec("value", value=n if n % 2 else None))
        elif k in "oO":
            specs.append(OutSpec("output_view", 0, ((3, 2), (1, 3), n % 3)))
        else:
            specs.append(OutSpec("input_view", 0, ((3, 2), (1, 3), 1)))
    plan = ResultPlan(specs)
    for outs_now, args_now in [(outs, args), (outs, args), (outs + [torch.ones(1)], args), (outs, args[:1] + args)]:
        got = plan(outs_now, args_now)
        want = _assemble_spec_by_spec(specs, outs_now, args_now)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            if isinstance(w, torch.Tensor) and w._is_view():
                assert g._is_view() and g._base is w._base
                assert (g.shape, g.stride(), g.storage_offset()) == (w.shape, w.stride(), w.storage_offset())
                torch.testing.assert_close(g, w)
            else:
                assert g is w


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_a_saved_view_of_an_input_follows_the_inputs_storage_offset(mode):
    """A compiled graph hands out a view of an input (a weight's transpose saved for the backward)
    as a view of the input it is called with. Its storage offset was the traced input's, so a call
    on a weight at another offset of its storage (parameters packed into one flat storage; Dynamo's
    guards do not check offsets) gave the backward the wrong elements: gradients off by 26."""
    torch.manual_seed(0)
    flat = torch.randn(24)
    x = torch.randn(5, 4)

    def fn(a, b):
        return (a @ b.t()).pow(2).sum()

    compiled = torch.compile(fn, backend="tpu")
    with torch.tpu.eager_mode(mode), torch.tpu.precision("highest"):
        tflat = flat.to("tpu")
        for offset in (0, 4, 12):
            xc = x.clone().requires_grad_()
            want = fn(xc, flat[offset:offset + 12].view(3, 4))
            want.backward()
            xt = x.to("tpu").requires_grad_()
            got = compiled(xt, tflat[offset:offset + 12].view(3, 4))
            got.backward()
            torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)


_U8 = torch.tensor([[1, 2], [3, 4]], dtype=torch.uint8)
_I32 = torch.tensor([1, 2], dtype=torch.int32)
# Arguments a compiled graph holds as constants or metadata, at the edges CPU's kernels check. Eager
# checks them (meta_checks: per key, and per call for runtime scalars); a compiled graph's lowering did
# not: each case failed before, with OverflowError from the program's literal, a CompileError from XLA
# (ui8 -1), or a result where CPU raises (full and where wrapped 2**31; softmax took an out-of-range dim,
# index_copy a negative index).
COMPILED_CHECK_CASES = {
    "pad inf": (lambda t: F.pad(t, (0, 1), value=float("inf")), [_U8]),
    "pad inf, crop only": (lambda t: F.pad(t, (0, 0), value=float("inf")), [_U8]),
    "fill_ inf": (lambda t: t.clone().fill_(float("inf")), [_U8]),
    "full 2**31 int32": (lambda t: t + torch.full((2,), 2**31, dtype=torch.int32, device=t.device), [_I32]),
    "threshold uint8 negative": (lambda t: torch.threshold(t, 1.0, -2.0), [_U8]),
    "where int32 2**31": (lambda t: torch.where(t > 1, t, 2**31), [_I32]),
    "index_fill inf": (lambda t: t.index_fill(0, torch.tensor([0], device=t.device), float("inf")), [_U8]),
    "clamp uint8 min -1 wraps": (lambda t: t.clamp(min=-1), [_U8]),
    "scatter value inf": (lambda t: t.scatter(0, torch.zeros(1, 2, dtype=torch.long, device=t.device),
                                              float("inf")), [_U8]),
    "softmax dim out of range": (lambda t: torch.softmax(t, 3, dtype=torch.float32), [torch.zeros(2, 2, 2)]),
    "softmax int": (lambda t: torch.softmax(t, 0), [_I32]),
    "var int64": (lambda t: t.var(), [torch.tensor(2)]),
    "mm bool float": (lambda a, c: a @ c, [torch.ones(3, 3, dtype=torch.bool), torch.ones(3, 1)]),
    "index_select float index": (lambda t, i: t.index_select(0, i), [torch.zeros(2, 2), torch.zeros(1)]),
    # decomposed by PyTorch's core decompositions, these lost CPU's checks: kept whole now
    "index_copy negative index": (lambda t, i, c: t.index_copy(1, i, c),
                                  [torch.zeros(2, 2), torch.tensor([-1, 1, 1]), torch.ones(2, 3)]),
    "index_copy": (lambda t, i, c: t.index_copy(1, i, c),
                   [torch.zeros(2, 3), torch.tensor([2, 0, 1]), torch.arange(6.0).reshape(2, 3)]),
    "celu uint8": (lambda t: F.celu(t), [_U8]),
}


@pytest.mark.parametrize("name", sorted(COMPILED_CHECK_CASES))
def test_a_compiled_graph_checks_and_converts_arguments_as_cpu(name: str):
    fn, args = COMPILED_CHECK_CASES[name]
    try:
        want = ("ok", fn(*args))
    except (RuntimeError, IndexError, NotImplementedError) as ex:
        want = (type(ex), str(ex))
    torch.compiler.reset()
    try:
        got = ("ok", torch.compile(fn, backend="tpu")(*[a.to("tpu") for a in args]).cpu())
        torch.tpu.synchronize()  # (an index error found on the device is raised here)
    except Exception as ex:  # noqa: BLE001  (the exception is what is compared)
        got = (type(ex), str(ex))
    assert got[0] is want[0], (want, got)
    if want[0] == "ok":
        torch.testing.assert_close(got[1], want[1], check_dtype=True)
    else:
        assert got[1].split(" (torchtpu: detected on the device")[0] == want[1], (want, got)
