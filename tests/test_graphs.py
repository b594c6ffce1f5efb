"""torch.tpu.TPUGraph / torch.tpu.graph: a captured training step replayed as one program."""

import math

import pytest
import torch
from helpers import count_launches
from torch import nn

from torchtpu.examples.gpt import GPT, GPTConfig, make_batch
from torchtpu.graphs import CaptureError, TPUGraph

CFG = GPTConfig(vocab=64, seq=16, d_model=32, heads=2, layers=2)


def _model_and_optimizer(dropout: float = 0.0):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**CFG.__dict__, "dropout": dropout})).to("tpu")
    # eps: gradients near 0 would turn rounding differences into whole steps (m / sqrt(v) ~ +-1)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3, eps=1e-3, capturable=True)


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [make_batch(CFG, 4, g) for _ in range(n)]


def _eager_losses(batches, compiled: bool = False) -> tuple[list[float], list[torch.Tensor]]:
    model, opt = _model_and_optimizer()
    loss_fn = torch.compile(model.loss, backend="tpu") if compiled else model.loss
    losses = []
    for x, y in batches:
        loss = loss_fn(x.to("tpu"), y.to("tpu"))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def _graph_losses(batches, compiled: bool = False, warmup: int = 1) -> tuple[list[float], list[torch.Tensor], TPUGraph]:
    model, opt = _model_and_optimizer()
    loss_fn = torch.compile(model.loss, backend="tpu") if compiled else model.loss
    static_x, static_y = (t.to("tpu") for t in batches[0])
    losses = []
    for x, y in batches[:warmup]:  # warm-up steps, run as usual (they create the optimizer's state)
        static_x.copy_(x.to("tpu"))
        static_y.copy_(y.to("tpu"))
        loss = loss_fn(static_x, static_y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        static_loss = loss_fn(static_x, static_y)
        static_loss.backward()
        opt.step()
    for x, y in batches[warmup:]:
        static_x.copy_(x.to("tpu"))
        static_y.copy_(y.to("tpu"))
        g.replay()
        losses.append(static_loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()], g


@pytest.mark.parametrize("compiled, mode", [(False, "strict"), (True, "strict"), (False, "debug"),
                                           (True, "defer_and_fuse")])
def test_a_replayed_training_step_matches_running_it(compiled, mode):
    """Forward, backward and a capturable AdamW step captured once (nothing runs at capture), then
    replayed on new batches copied into the captured inputs: the losses and parameters of running
    every step as usual, in each eager mode, the model compiled or not."""
    batches = _batches(6)
    with torch.tpu.eager_mode(mode):
        ref_losses, ref_params = _eager_losses(batches, compiled)
        losses, params, _ = _graph_losses(batches, compiled)
        assert torch.tpu.get_eager_mode() == mode
    # The reference and the replay are different programs (Debug runs the reference op by op; Strict and
    # DeferAndFuse fuse its optimizer step apart from the forward and backward): XLA's fusions round
    # differently, and at the default precision a product's inputs are rounded to bf16, where a last-bit
    # difference moves a term by 2^-8 relative. A bound of 1e-6 held on one workstation's CPU and not on
    # another's (an AMD EPYC host: 5.4e-6 on a weight of 0.15 after five steps, the losses within 3.2e-6
    # relative), as XLA:CPU's code generation follows the host's vector units.
    tol = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(losses, ref_losses, **tol)
    for got, want in zip(params, ref_params):
        torch.testing.assert_close(got, want, **tol)


def _stepped_once() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    """The model and its optimizer after one step (which creates the optimizer's state), and the batch."""
    model, opt = _model_and_optimizer()
    x, y = (t.to("tpu") for t in _batches(1)[0])
    model.loss(x, y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt, x, y


def test_a_replay_is_one_launch(monkeypatch):
    model, opt, x, y = _stepped_once()
    g = TPUGraph()
    with torch.tpu.graph(g):
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
    torch.tpu.synchronize()
    launches = count_launches(monkeypatch)
    for _ in range(5):
        g.replay()
    torch.tpu.synchronize()
    assert launches[0] == 5, launches[0]
    assert torch.tpu.get_eager_mode() == "strict" and not torch.tpu.is_current_stream_capturing()


def test_nothing_runs_at_capture_and_new_tensors_wait_for_the_first_replay():
    w = torch.ones(3, device="tpu")
    g = TPUGraph()
    with torch.tpu.graph(g):
        assert torch.tpu.is_current_stream_capturing()
        w.mul_(2)
        out = w + 1
    torch.testing.assert_close(w.cpu(), torch.ones(3))  # as CUDA: the capture did not run
    with pytest.raises(RuntimeError, match="captured tpu graph that has not been replayed yet"):
        out.cpu()
    g.replay()
    torch.testing.assert_close(out.cpu(), torch.full((3,), 3.0))
    g.replay()
    torch.testing.assert_close((w.cpu(), out.cpu()), (torch.full((3,), 4.0), torch.full((3,), 5.0)))


def test_a_compiled_functions_first_call_may_be_inside_the_capture(module_texts):
    """Nothing runs at capture, so a ``torch.compile`` function needs no warm-up call before it: Dynamo
    traces inside the capture and only the captured program compiles, not the function's own (a
    decode step's own program cost the v5e 5-7 s of a 15 s first generation). A greedy step that
    writes a cache at a position, as decoding does."""
    torch.manual_seed(0)
    w = torch.randn(8, 8)

    def make_step(device):
        cache, wd = torch.zeros(6, 8, device=device), w.to(device)

        def step(x, pos):
            cache.index_copy_(0, pos, torch.tanh(x @ wd))
            return cache.sum(0, keepdim=True) / 6, pos + 1
        return step, cache

    step, want_cache = make_step("cpu")
    want_x, want_pos = torch.ones(1, 8), torch.zeros(1, dtype=torch.long)
    for _ in range(5):
        want_x, want_pos = step(want_x, want_pos)
    step, cache = make_step("tpu")
    compiled = torch.compile(step, backend="tpu")
    x, pos = torch.ones(1, 8, device="tpu"), torch.zeros(1, dtype=torch.long, device="tpu")
    g = TPUGraph()
    with torch.tpu.graph(g):  # the compiled function's first call
        new_x, new_pos = compiled(x, pos)
        x.copy_(new_x)
        pos.copy_(new_pos)
    for _ in range(5):
        g.replay()
    torch.testing.assert_close((x.cpu(), pos.cpu(), cache.cpu()), (want_x, want_pos, want_cache), rtol=1e-2, atol=1e-2)
    assert len([t for t in module_texts if "dot_general" in t]) == 1  # the captured program's product only


def test_a_read_inside_the_capture_raises_and_leaves_capture_mode():
    x = torch.ones(2, device="tpu")
    g = TPUGraph()
    match = "read or synchronization is not permitted while a tpu graph is being"
    with pytest.raises(CaptureError, match=match), torch.tpu.graph(g):
        x.mul_(5)
        fresh = x + 1
        (x * 2).sum().item()
    assert not torch.tpu.is_current_stream_capturing() and torch.tpu.get_eager_mode() == "strict"
    torch.testing.assert_close((x * 3).cpu(), torch.full((2,), 3.0))  # the in-place update never ran
    with pytest.raises(RuntimeError, match="the tpu graph capture that writes it raised"):
        fresh.cpu()


def test_a_host_to_device_copy_inside_the_capture_raises():
    """A CUDA graph's replay copies again from the host memory's current contents; a tpu graph
    cannot, and a copy frozen at capture would silently feed the same batch forever."""
    static_x = torch.zeros(4, device="tpu")
    match = "a copy from the host to a tpu tensor is not permitted while a tpu graph is being captured"
    with pytest.raises(CaptureError, match=match), torch.tpu.graph(TPUGraph()):
        static_x.copy_(torch.ones(4))
    static_x.copy_(torch.ones(4))  # outside a capture, as usual
    torch.testing.assert_close(static_x.cpu(), torch.ones(4))


def test_a_non_capturable_optimizer_step_under_capture_raises():
    p = nn.Parameter(torch.ones(2, device="tpu"))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.ones(2, device="tpu")
    opt.step()
    with pytest.raises(CaptureError, match="needs capturable=True"), torch.tpu.graph(TPUGraph()):
        opt.step()


def test_a_tensor_freed_inside_the_capture_that_it_reads_is_refused():
    model, opt = _model_and_optimizer()
    x, y = (t.to("tpu") for t in _batches(1)[0])
    model.loss(x, y).backward()
    opt.step()  # the optimizer's state, made outside the capture
    model.loss(x, y).backward()  # gradients exist before the capture, which accumulates into them
    before = [p.detach().cpu() for p in model.parameters()]
    match = "read a tensor that was freed before the capture ended"
    with pytest.raises(CaptureError, match=match), torch.tpu.graph(TPUGraph()):
        model.loss(x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    # nothing ran: the parameters the captured step updated keep their values, and train on
    for p, want in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach().cpu(), want)
    opt.zero_grad(set_to_none=True)
    model.loss(x, y).backward()
    opt.step()
    assert all(torch.isfinite(p.detach().cpu()).all() for p in model.parameters())


@pytest.mark.parametrize("random", [False, True])
def test_a_replay_after_a_tensor_it_reads_was_freed_raises(random):
    """A replay reads the captured tensors' current buffers (weakly held): one freed since raises,
    on the path of a graph whose parameters are all tensors' buffers and on that of one drawing a seed."""
    import gc

    a = torch.ones(64, device="tpu")
    out = torch.zeros(64, device="tpu")
    g = TPUGraph()
    with torch.tpu.graph(g):
        out.copy_(torch.nn.functional.dropout(a, 0.5) if random else a * 2)
    g.replay()
    assert set(out.cpu().unique().tolist()) <= ({0.0, 2.0} if random else {2.0})
    a.fill_(3.0)  # a replay reads the tensor's new value
    g.replay()
    assert set(out.cpu().unique().tolist()) <= ({0.0, 6.0} if random else {6.0})
    del a
    gc.collect()
    with pytest.raises(CaptureError, match="a tensor the captured tpu graph reads was freed"):
        g.replay()


def test_random_ops_draw_new_seeds_each_replay():
    x = torch.ones(64, device="tpu")
    g = TPUGraph()
    with torch.tpu.graph(g):
        out = torch.nn.functional.dropout(x, 0.5)
    g.replay()
    first = out.cpu()
    g.replay()
    second = out.cpu()
    assert set(first.unique().tolist()) <= {0.0, 2.0} and not torch.equal(first, second)


def test_replay_before_capture_and_captures_do_not_nest():
    g = TPUGraph()
    with pytest.raises(CaptureError, match="before the graph was captured"):
        g.replay()
    with torch.tpu.graph(g), pytest.raises(CaptureError, match="do not nest"):
        TPUGraph().capture_begin()
    g.replay()  # an empty capture replays as nothing
    with pytest.raises(CaptureError, match="captured already"):
        g.capture_begin()


def test_make_graphed_callables_trains_as_the_module_does():
    """A module's forward and backward replayed as two captured graphs inside autograd (the loss
    and optimizer around it run as usual): the losses and parameters of the module itself."""

    def run(graphed: bool) -> tuple[list[float], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to("tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(2)
        data = [(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)) for _ in range(5)]
        if graphed:
            model = torch.tpu.make_graphed_callables(model, (torch.randn(6, 8).to("tpu"),))
            opt.zero_grad(set_to_none=True)  # the warm-up's backward left no gradients (autograd.grad)
        losses = []
        for x, y in data:
            loss = (model(x.to("tpu")) - y.to("tpu")).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in model.parameters()]

    with torch.tpu.precision("highest"):
        plain, graphed = run(False), run(True)
    torch.testing.assert_close(graphed, plain, rtol=1e-5, atol=1e-6)


def test_make_graphed_callables_takes_functions_and_input_gradients():
    """A function of two tensors returning two: its outputs and both inputs' gradients, call after
    call on new values copied into the static inputs, as the CPU computes them."""
    w = torch.randn(5, 3).to("tpu").requires_grad_()

    def f(x, w):
        return torch.tanh(x @ w), (x * 2).sum()

    with torch.tpu.precision("highest"):
        graphed = torch.tpu.make_graphed_callables(f, (torch.randn(4, 5).to("tpu").requires_grad_(), w))
        for seed in range(3):
            x = torch.randn(4, 5, generator=torch.Generator().manual_seed(seed))
            xt = x.to("tpu").requires_grad_()
            out, total = graphed(xt, w)
            (out.sum() + total).backward()
            xc, wc = x.clone().requires_grad_(), w.detach().cpu().requires_grad_()
            want, want_total = f(xc, wc)
            (want.sum() + want_total).backward()
            torch.testing.assert_close((out.cpu(), total.cpu()), (want.detach(), want_total.detach()))
            torch.testing.assert_close((xt.grad.cpu(), w.grad.cpu()), (xc.grad, wc.grad))
            w.grad = None


def test_a_replayed_step_updates_batch_norm_statistics_and_accumulates_micro_batches():
    """Module buffers updated in place (batch norm's running statistics, its batch counter) and
    gradients accumulated over two micro-batches inside one capture: after replays, the state of
    running the same steps as usual."""

    def run(captured: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).to("tpu")
        # SGD: Adam would turn the rounding noise of the first bias's ~0 gradient (batch norm
        # follows it) into whole steps
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(3)
        batches = [[torch.randn(5, 6, generator=g) for _ in range(2)] for _ in range(4)]
        static = [b.to("tpu") for b in batches[0]]

        def step():
            for x in static:
                model(x).square().mean().backward()
            opt.step()

        graph = None
        for i, micro in enumerate(batches):
            for s, x in zip(static, micro):
                s.copy_(x.to("tpu"))
            if not captured or i == 0:
                step()
                opt.zero_grad(set_to_none=True)
                continue
            if graph is None:
                graph = TPUGraph()
                with torch.tpu.graph(graph):
                    step()
            graph.replay()  # (the capture's gradients are its outputs: written, not accumulated, each time)
        return [t.detach().cpu() for t in (*model.parameters(), *model.buffers())]

    with torch.tpu.precision("highest"):
        torch.testing.assert_close(run(True), run(False), rtol=1e-5, atol=1e-6)


def _state_storages(opt: torch.optim.Optimizer) -> set[int]:
    return {t.untyped_storage()._cdata for st in opt.state.values() for t in st.values()}


def test_a_capturable_optimizers_state_is_packed_into_one_storage_after_its_first_step():
    """A capturable AdamW's moments and step counts (3 tensors per parameter) become views of one
    flat storage after its first step, so a captured step passes them as one argument (libtpu
    charges each argument and result: docs/tpu.md); it trains as the same optimizer unpacked."""
    batches = _batches(4)
    (model, opt), (ref_model, ref_opt) = _model_and_optimizer(), _model_and_optimizer()
    n_params = len(list(model.parameters()))
    x, y = (t.to("tpu") for t in batches[0])
    for m, o in ((model, opt), (ref_model, ref_opt)):
        m.loss(x, y).backward()
        o.step()
        o.zero_grad(set_to_none=True)
    assert len(_state_storages(opt)) == 1
    with torch.no_grad():  # the reference unpacked: a storage per tensor again (not packed anew)
        for t in (t for st in ref_opt.state.values() for t in st.values()):
            t.set_(t.clone().untyped_storage(), 0, t.shape, t.stride())
    assert len(_state_storages(ref_opt)) == 3 * n_params
    for bx, by in batches[1:]:
        for m, o in ((model, opt), (ref_model, ref_opt)):
            m.loss(bx.to("tpu"), by.to("tpu")).backward()
            o.step()
            o.zero_grad(set_to_none=True)
    for got, want in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(got.detach().cpu(), want.detach().cpu(), rtol=1e-5, atol=1e-6)
    assert len(_state_storages(opt)) == 1 and len(_state_storages(ref_opt)) == 3 * n_params
    g = TPUGraph()
    with torch.tpu.graph(g):
        model.loss(x, y).backward()
        opt.step()
    buffers = [a for a in g._args if a[0] == "buf"]
    # the parameters, the packed state, the batch and a few constants (unpacked: 4 per parameter)
    assert len(buffers) <= n_params + 5, len(buffers)
    g.replay()
    assert len(_state_storages(opt)) == 1 and all(st["step"].item() == 5 for st in opt.state.values())


def test_packed_optimizer_state_saves_loads_and_is_packed_again():
    """state_dict() of packed state saves and loads as any state; loaded state (new tensors) is
    packed again after the next step, and training goes on as it would have."""
    import io

    model, opt, x, y = _stepped_once()
    saved = io.BytesIO()
    torch.save(opt.state_dict(), saved)
    want = [t.detach().cpu().clone() for st in opt.state.values() for t in st.values()]
    saved.seek(0)
    opt.load_state_dict(torch.load(saved))  # torch.save keeps the shared storage
    got = [t.detach().cpu() for st in opt.state.values() for t in st.values()]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert len(_state_storages(opt)) == 1
    saved.seek(0)
    opt.load_state_dict(torch.load(saved, map_location="cpu"))  # each tensor moved to tpu alone
    got = [t.detach().cpu() for st in opt.state.values() for t in st.values()]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert len(_state_storages(opt)) == len(got)  # one storage per tensor, until the next step
    model.loss(x, y).backward()
    opt.step()
    assert len(_state_storages(opt)) == 1
    assert all(st["step"].item() == 2 for st in opt.state.values())


def test_a_foreach_op_over_views_of_one_storage_writes_it_once(module_texts):
    """An in-place op writing many contiguous views of one storage (a foreach op over packed
    optimizer state) writes them as one concatenation, not one copy of the storage per view."""
    flat = torch.arange(40, dtype=torch.float32)
    views = [flat[i * 8:(i + 1) * 8] for i in range(5)]
    tflat = flat.to("tpu")
    tviews = [tflat[i * 8:(i + 1) * 8] for i in range(5)]
    torch._foreach_mul_(views, 3.0)
    torch._foreach_mul_(tviews, 3.0)
    assert torch.equal(tflat.cpu(), flat)
    foreach = [t for t in module_texts if t.count("stablehlo.multiply") == 5]
    assert foreach and all(t.count("stablehlo.concatenate") == 1 for t in foreach), foreach
    # a view overlapping an earlier one of the same op is written after it, at its own place
    torch._foreach_copy_([flat[0:8], flat[4:12], flat[20:24]], [torch.ones(8), torch.full((8,), 2.0), torch.zeros(4)])
    torch._foreach_copy_([tflat[0:8], tflat[4:12], tflat[20:24]],
                         [torch.ones(8, device="tpu"), torch.full((8,), 2.0, device="tpu"), torch.zeros(4, device="tpu")])
    assert torch.equal(tflat.cpu(), flat)


def test_optimizer_state_is_packed_in_chunks_of_bounded_size(monkeypatch):
    """Packing copies the state; a flat storage of at most CHUNK_BYTES at a time bounds the device
    memory that takes. Any optimizer's state packs on request (torch.tpu.pack_optimizer_state)."""
    from torchtpu import packed_state

    monkeypatch.setattr(packed_state, "CHUNK_BYTES", 3 * 64 * 4)
    params = [torch.nn.Parameter(torch.randn(64, device="tpu")) for _ in range(7)]
    opt = torch.optim.Adam(params, lr=0.1)  # not capturable: not packed by itself
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    assert len(_state_storages(opt)) == 14 + 7  # (the step counts live on the host)
    want = [t.detach().cpu().clone() for st in opt.state.values() for t in st.values()]
    assert torch.tpu.pack_optimizer_state(opt) == 14
    assert len(_state_storages(opt)) == 5 + 7  # 14 tensors of 256 bytes, three to a storage
    got = [t.detach().cpu() for st in opt.state.values() for t in st.values()]
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_the_automatic_packing_leaves_large_state_tensors_apart(monkeypatch):
    """A packed matrix is copied between the flat storage's layout and the TPU's tiled one at every
    step: the automatic packing after a capturable step moves state tensors of at most
    AUTO_PACK_MAX_BYTES (the 100M GPT's replay lost 89 -> 106 ms per step on the v5e with its
    matrices' moments packed too); on request any size packs."""
    from torchtpu import packed_state

    monkeypatch.setattr(packed_state, "AUTO_PACK_MAX_BYTES", 64 * 4)
    params = [torch.nn.Parameter(torch.randn(n, device="tpu")) for n in (64, 64, 65, 64, 200)]
    opt = torch.optim.AdamW(params, lr=0.1, capturable=True)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    small = {t.untyped_storage()._cdata for p in params[:2] + params[3:4] for t in opt.state[p].values()}
    assert len(small) == 1  # moments and step counts of the three 64-element parameters: one storage
    for p in (params[2], params[4]):
        own = [t.untyped_storage()._cdata for t in (opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])]
        assert len(set(own)) == 2 and not set(own) & small
    assert torch.tpu.pack_optimizer_state(opt) == 4  # on request, the large ones too


@pytest.mark.parametrize("compiled", [False, True])
def test_packed_parameters_train_as_unpacked_ones_and_replay_in_few_arguments(compiled):
    """torch.tpu.pack_parameters makes a module's parameters views of one flat storage (a captured
    step then takes them as one argument and returns them as one result); training, eager or
    compiled, and replayed, gives the unpacked model's parameters."""
    batches = _batches(4)
    (model, opt), (ref_model, ref_opt) = _model_and_optimizer(), _model_and_optimizer()
    n_params = len(list(model.parameters()))
    assert torch.tpu.pack_parameters(model) == n_params
    assert len({p.untyped_storage()._cdata for p in model.parameters()}) == 1
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, eps=1e-3, capturable=True)
    loss_fn = torch.compile(model.loss, backend="tpu") if compiled else model.loss
    ref_loss_fn = torch.compile(ref_model.loss, backend="tpu") if compiled else ref_model.loss
    x, y = (t.to("tpu") for t in batches[0])
    for f, o in ((loss_fn, opt), (ref_loss_fn, ref_opt)):
        f(x, y).backward()
        o.step()
        o.zero_grad(set_to_none=True)
    g = TPUGraph()
    with torch.tpu.graph(g):
        loss_fn(x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    # the parameters, the optimizer state, the batch and a few constants
    assert len([a for a in g._args if a[0] == "buf"]) <= 6
    for bx, by in batches[1:]:
        x.copy_(bx.to("tpu"))
        y.copy_(by.to("tpu"))
        g.replay()
        ref_loss_fn(x, y).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    for got, want in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(got.detach().cpu(), want.detach().cpu(), rtol=1e-4, atol=1e-5)
    assert len({p.untyped_storage()._cdata for p in model.parameters()}) == 1


def test_pack_parameters_can_leave_the_large_ones_alone():
    """On a TPU a packed matrix is copied into the tiled layout by each program that reads it (decode
    lost 4x on a v5e with every weight packed): ``max_bytes`` packs only the small parameters, and
    the module computes as before."""
    model, _ = _model_and_optimizer()
    model.eval()
    x, _ = (t.to("tpu") for t in _batches(1)[0])
    with torch.no_grad():
        want = model(x).cpu()
    limit = 4 * CFG.d_model * 4  # a vector of up to 4 * d_model float32 values
    small = [p for p in model.parameters() if p.numel() * p.element_size() <= limit]
    large = [p for p in model.parameters() if p.numel() * p.element_size() > limit]
    assert small and large
    assert torch.tpu.pack_parameters(model, max_bytes=limit) == len(small)
    assert len({p.untyped_storage()._cdata for p in small}) == 1
    assert all(p.untyped_storage().nbytes() == p.numel() * p.element_size() for p in large)
    with torch.no_grad():
        torch.testing.assert_close(model(x).cpu(), want, rtol=0, atol=0)


def test_a_capture_after_debug_mode_warm_up_has_its_index_flag(monkeypatch):
    """Debug mode checks indices on the host, so its warm-up steps never made the device's index
    flag; the capture's first embedding then made it by a host copy, which a capture refuses
    (run alone, test_a_replayed_training_step_matches_running_it[False-debug] failed so). The
    flag is made before the capture begins."""
    from torchtpu.engine import index_checks

    monkeypatch.setattr(index_checks, "_zeros", {})
    monkeypatch.setattr(index_checks, "_flags", {})
    with torch.tpu.eager_mode("debug"):
        losses, _, _ = _graph_losses(_batches(3))
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
