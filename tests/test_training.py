"""Whole models on tpu against the CPU, step by step."""

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import count_launches, float64_rtol
from torch import nn

from torchtpu.examples.gpt import GPT, GPTConfig, make_batch


def train_pair(model, make, steps, precision, lr=1e-3):
    cpu_model = model
    tpu_model = copy.deepcopy(model).to("tpu")
    o_cpu = torch.optim.AdamW(cpu_model.parameters(), lr=lr)
    o_tpu = torch.optim.AdamW(tpu_model.parameters(), lr=lr)
    losses = []
    with torch.tpu.precision(precision):
        for step in range(steps):
            x, y = make(step)
            lc = F.cross_entropy(cpu_model(x).reshape(-1, cpu_model_vocab(cpu_model)), y.reshape(-1))
            o_cpu.zero_grad()
            lc.backward()
            o_cpu.step()
            lt = F.cross_entropy(tpu_model(x.to("tpu")).reshape(-1, cpu_model_vocab(cpu_model)),
                                 y.to("tpu").reshape(-1))
            o_tpu.zero_grad()
            lt.backward()
            o_tpu.step()
            losses.append((lc.item(), lt.item()))
    return losses


def cpu_model_vocab(m):
    return m.cfg.vocab if hasattr(m, "cfg") else 10


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


def _mlp_data(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


@pytest.mark.parametrize("precision,rtol", [("highest", 1e-4), ("medium", 2e-2)])
def test_mlp_matches_cpu_step_by_step(precision, rtol):
    torch.manual_seed(0)
    losses = train_pair(MLP(), _mlp_data, 20, precision)
    for i, (lc, lt) in enumerate(losses):
        assert abs(lc - lt) <= rtol * abs(lc), (i, lc, lt)
    assert losses[-1][1] < losses[0][1]


@pytest.mark.parametrize("precision,rtol,cfg", [
    ("highest", 1e-4, GPTConfig()),  # the demo's model, exactly
    ("medium", 2e-2, GPTConfig(seq=32, d_model=64, layers=2)),
])
def test_gpt_matches_cpu_step_by_step(precision, rtol, cfg):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    batches = [make_batch(cfg, 4, g) for _ in range(20)]
    losses = train_pair(GPT(cfg), lambda s: batches[s], 20, precision, lr=3e-3)
    for i, (lc, lt) in enumerate(losses):
        assert abs(lc - lt) <= rtol * abs(lc), (i, lc, lt)
    assert losses[-1][1] < losses[0][1] * 0.8


def test_bfloat16_model_and_autocast():
    torch.manual_seed(0)
    m = MLP()
    x = torch.randn(8, 32)
    ref = m.to(torch.bfloat16)(x.to(torch.bfloat16)).float()
    out = m.to("tpu")(x.to("tpu", torch.bfloat16)).float().cpu()
    torch.testing.assert_close(out, ref, rtol=5e-2, atol=5e-2)
    m2 = MLP().to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = m2(torch.randn(4, 32, device="tpu"))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert m2.net[0].weight.grad.dtype == torch.float32


def test_tpu_amp_mirrors_cuda_amp():
    """``torch.tpu.amp`` as ``torch.cuda.amp`` (regression: it did not exist), and a bare
    ``torch.autocast("tpu")`` in bfloat16 (it was PyTorch's float16 default for new devices)."""
    import torch.tpu.amp as tpu_amp

    with torch.autocast("tpu"):
        assert (torch.ones(2, 2, device="tpu") @ torch.ones(2, 2, device="tpu")).dtype == torch.bfloat16
    with tpu_amp.autocast(dtype=torch.float16):
        assert (torch.ones(2, 2, device="tpu") @ torch.ones(2, 2, device="tpu")).dtype == torch.float16
    runs = []
    for scaler_of, autocast_of in ((lambda: torch.amp.GradScaler("tpu", init_scale=256.0),
                                    lambda: torch.autocast("tpu", dtype=torch.float16)),
                                   (lambda: tpu_amp.GradScaler(init_scale=256.0),
                                    lambda: tpu_amp.autocast(dtype=torch.float16))):
        torch.manual_seed(0)
        m = MLP().to("tpu")
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = scaler_of()
        for _ in range(3):
            with autocast_of():
                loss = m(torch.ones(4, 32, device="tpu")).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        runs.append([p.detach().cpu() for p in m.parameters()] + [torch.tensor(scaler.get_scale())])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    class Double(torch.autograd.Function):
        @staticmethod
        @tpu_amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            return x * 2

        @staticmethod
        @tpu_amp.custom_bwd
        def backward(ctx, g):
            return g * 2

    with tpu_amp.autocast():
        assert Double.apply(torch.ones(2, device="tpu", dtype=torch.bfloat16)).dtype == torch.float32


def _unscale_on(device, grads, found0, inv):
    g = [x.clone().to(device) for x in grads]
    found = torch.tensor([found0], device=device)
    torch._amp_foreach_non_finite_check_and_unscale_(g, found, torch.tensor([inv], device=device))
    return [x.cpu() for x in g], found.cpu()


@pytest.mark.parametrize("found0", [0.0, 1.0])
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_amp_unscale_matches_cpu(found0, mode):
    """GradScaler.unscale_'s kernel (regression: it was not implemented for tpu)."""
    lists = [[torch.randn(5), torch.randn(2, 3, dtype=torch.float64), torch.randn(4).to(torch.bfloat16)],
             [torch.tensor([1.0, float("inf"), 3.0]), torch.randn(3, 2, dtype=torch.float16)],
             [torch.tensor([float("nan")]), torch.randn(2)]]
    with torch.tpu.eager_mode(mode):
        for grads in lists:
            want_g, want_found = _unscale_on("cpu", grads, found0, 0.125)
            got_g, got_found = _unscale_on("tpu", grads, found0, 0.125)
            for w, g in zip(want_g, got_g):
                assert g.dtype == w.dtype
                torch.testing.assert_close(g, w, rtol=float64_rtol(w.dtype), atol=0, equal_nan=True)
            assert torch.equal(got_found, want_found)


@pytest.mark.parametrize("found", [0.0, 1.0, float("nan")])
@pytest.mark.parametrize("tracker", [0, 1, 2])
@pytest.mark.parametrize("scale", [65536.0, 3.0e38])
def test_amp_update_scale_matches_cpu(found, tracker, scale):
    """GradScaler.update's kernel: back off, count, grow (not past f32's range)."""
    out = []
    for device in ("cpu", "tpu"):
        s = torch.tensor([scale], device=device)
        t = torch.tensor([tracker], dtype=torch.int32, device=device)
        r = torch._amp_update_scale_(s, t, torch.tensor([found], device=device), 2.0, 0.5, 3)
        assert r is s
        out.append((s.cpu(), t.cpu()))
    assert torch.equal(out[1][0], out[0][0]) and torch.equal(out[1][1], out[0][1])


@pytest.mark.parametrize("call", [
    lambda d: torch._amp_foreach_non_finite_check_and_unscale_([torch.ones(3, device=d)],
                                                               torch.zeros(2, device=d), torch.ones(1, device=d)),
    lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
        [torch.ones(3, device=d)], torch.zeros(1, device=d), torch.ones(1, dtype=torch.float64, device=d)),
    lambda d: torch._amp_foreach_non_finite_check_and_unscale_([torch.ones(3, dtype=torch.int64, device=d)],
                                                               torch.zeros(1, device=d), torch.ones(1, device=d)),
    lambda d: torch._amp_update_scale_(torch.ones(2, device=d), torch.zeros(1, dtype=torch.int32, device=d),
                                       torch.zeros(1, device=d), 2.0, 0.5, 3),
    lambda d: torch._amp_update_scale_(torch.ones(1, device=d), torch.zeros(1, device=d),
                                       torch.zeros(1, device=d), 2.0, 0.5, 3),
])
def test_amp_kernel_errors_match_cpu(call):
    with pytest.raises(Exception) as want:
        call("cpu")
    with pytest.raises(type(want.value), match=str(want.value).replace("'", ".").replace('"', ".")):
        call("tpu")


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_grad_scaler_training_matches_cpu(mode):
    """torch.amp.GradScaler("tpu") end to end: an overflowing step is skipped and the scale backs
    off, then grows again after growth_interval good steps, as on CPU."""
    runs = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        model = MLP().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 16, growth_interval=2)
        x = torch.randn(8, 32).to(device)
        scales = []
        mode_ctx = torch.tpu.eager_mode(mode) if device == "tpu" else contextlib.nullcontext()
        with mode_ctx, torch.tpu.precision("highest"):
            for step in range(5):
                opt.zero_grad()
                loss = model(x).square().mean() * (1e38 if step == 1 else 1.0)  # step 1 overflows
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                scales.append(scaler.get_scale())
        runs[device] = (scales, [p.detach().cpu() for p in model.parameters()])
    assert runs["tpu"][0] == runs["cpu"][0] == [65536.0, 32768.0, 32768.0, 65536.0, 65536.0]
    for p_tpu, p_cpu in zip(runs["tpu"][1], runs["cpu"][1]):
        torch.testing.assert_close(p_tpu, p_cpu, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_replays_dropout(reentrant):
    """Regression: torch.utils.checkpoint restores the device RNG state only where
    ``torch.<device>._initialized`` is true; torch.tpu had no such flag, so the recomputed
    dropout drew a new mask and the gradients were those of another network."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 4)).to("tpu")
    x = torch.randn(5, 8, device="tpu", requires_grad=True)
    grads = []
    for use_checkpoint in (False, True):
        torch.manual_seed(1)
        x.grad = None
        y = checkpoint(model, x, use_reentrant=reentrant) if use_checkpoint else model(x)
        y.sum().backward()
        grads.append(x.grad.cpu())
    assert torch.equal(grads[1], grads[0])


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN, nn.LSTMCell, nn.GRUCell])
def test_recurrent_layers_match_cpu(cls, bias, mode):
    """Regression: nn.LSTM and nn.GRU failed on tpu. On an accelerator ATen hands each cell's
    element-wise part to _thnn_fused_lstm_cell / _thnn_fused_gru_cell (and their backwards),
    which PyTorch implements for CUDA only."""
    torch.manual_seed(0)
    cell = cls in (nn.LSTMCell, nn.GRUCell)
    model = cls(4, 8, bias=bias) if cell else cls(4, 8, num_layers=2, batch_first=True, bidirectional=True, bias=bias)
    x = torch.randn(3, 4) if cell else torch.randn(3, 5, 4)
    tpu_model = copy.deepcopy(model).to("tpu")
    want = model(x)
    want = want[0] if isinstance(want, tuple) else want
    want.square().sum().backward()
    with torch.tpu.eager_mode(mode), torch.tpu.precision("highest"):
        got = tpu_model(x.to("tpu"))
        got = got[0] if isinstance(got, tuple) else got
        got.square().sum().backward()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    for p_cpu, p_tpu in zip(model.parameters(), tpu_model.parameters()):
        torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-5)


def test_packed_lstm_matches_cpu():
    torch.manual_seed(0)
    model = nn.LSTM(4, 6, batch_first=True)
    x = torch.randn(3, 5, 4)
    lengths = torch.tensor([5, 3, 2])
    outs = []
    for device, m in (("cpu", model), ("tpu", copy.deepcopy(model).to("tpu"))):
        packed = nn.utils.rnn.pack_padded_sequence(x.to(device), lengths, batch_first=True)
        with torch.tpu.precision("highest"):
            out, (h, c) = m(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        outs.append((padded.detach().cpu(), h.detach().cpu(), c.detach().cpu()))
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


_FUSED_CASES = [
    (torch.optim.Adam, {"lr": 0.01}),
    (torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}),
    (torch.optim.Adam, {"lr": 0.01, "maximize": True, "betas": (0.3, 0.9)}),
    (torch.optim.AdamW, {"lr": 0.01}),
    (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.0, "amsgrad": True}),
    (torch.optim.SGD, {"lr": 0.1}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "maximize": True}),
    (torch.optim.Adagrad, {"lr": 0.1}),
    (torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.2, "weight_decay": 0.01, "maximize": True,
                           "initial_accumulator_value": 0.5}),
]


def _fused_run(device, cls, kw, dtype, tensor_lr):
    g = torch.Generator().manual_seed(0)
    shapes = [(5, 4), (5,), (3, 5)]
    params = [torch.randn(s, generator=g).to(device, dtype).requires_grad_() for s in shapes]
    lr = torch.tensor(kw["lr"]) if tensor_lr else kw["lr"]
    opt = cls(params, **dict(kw, lr=lr), fused=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(device, dtype)
        opt.step()
        sched.step()
    state = [t for p in params for t in opt.state[p].values() if t.dim() > 0]
    return [t.detach().cpu().float() for t in params + state]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls,kw,tensor_lr", [(c, k, t) for c, k in _FUSED_CASES for t in (False, True)
                                              if not t or k.get("momentum") or k.get("lr_decay")])
# (a tensor lr takes the same path in the other cases)
def test_fused_optimizers_match_cpu(cls, kw, dtype, tensor_lr):
    """Regression: Adam/AdamW/SGD/Adagrad(fused=True) raised NotImplementedError for
    aten::_fused_adam_ (_fused_adamw_, _fused_sgd_, _fused_adagrad_). Parameters and optimizer state after three steps of a
    learning-rate schedule, against CPU's fused kernels."""
    # PyTorch 2.13's CPU fused SGD skips the parameter update of bf16/f16 elements in whole
    # vectors (32 at a time); it is checked here against CPU's f32 step, which is the same
    # op math (CUDA's kernel's too) before rounding.
    ref_dtype = torch.float32 if cls is torch.optim.SGD else dtype
    want = _fused_run("cpu", cls, kw, ref_dtype, tensor_lr)
    got = _fused_run("tpu", cls, kw, dtype, tensor_lr)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, **tol)


@pytest.mark.parametrize("cls,kw", [c for c in _FUSED_CASES if c[1].get("momentum") or c[1].get("lr_decay")])
def test_fused_optimizers_with_a_scheduled_tensor_lr_in_defer_and_fuse(cls, kw):
    """Regression: DeferAndFuse recorded a CPU scalar input (the tensor lr) as a view of its
    memory, so steps recorded before a read used the lr the scheduler had set by then."""
    want = _fused_run("cpu", cls, kw, torch.float32, True)
    with torch.tpu.defer_and_fuse():
        got = _fused_run("tpu", cls, kw, torch.float32, True)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
@pytest.mark.parametrize("op", [torch._fused_adamw_, torch._fused_sgd_, torch._fused_adagrad_])
def test_fused_step_grad_scale_and_found_inf_match_cpu(op, found_inf):
    """GradScaler's path into a fused step: gradients unscaled in place, and a found inf
    leaves every tensor unchanged."""
    results = []
    for device in ("cpu", "tpu"):
        g = torch.Generator().manual_seed(1)
        params, grads, bufs = ([torch.randn(4, 3, generator=g).to(device)] for _ in range(3))
        scale = torch.tensor(8.0, device=device)
        found = torch.tensor(found_inf, device=device)
        if op is torch._fused_adamw_:
            avg_sq = [torch.rand(4, 3, generator=g).to(device)]
            steps = [torch.tensor(3.0, device=device)]
            op(params, grads, bufs, avg_sq, [], steps, lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8,
               amsgrad=False, maximize=False, grad_scale=scale, found_inf=found)
            tensors = params + grads + bufs + avg_sq
        elif op is torch._fused_adagrad_:
            steps = [torch.tensor(3.0, device=device)]
            bufs = [b.abs() for b in bufs]  # sums of squares
            op(params, grads, bufs, steps, lr=0.1, lr_decay=0.1, weight_decay=0.01, eps=1e-10, maximize=False,
               grad_scale=scale, found_inf=found)
            tensors = params + grads + bufs + steps
        else:
            op(params, grads, bufs, weight_decay=0.01, momentum=0.9, lr=0.1, dampening=0.0, nesterov=False,
               maximize=False, is_first_step=False, grad_scale=scale, found_inf=found)
            tensors = params + grads + bufs
        results.append([t.cpu() for t in tensors])
    for w, g in zip(*results):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)


def _adamw_steps(steps: int, fuse: bool, monkeypatch) -> tuple[list[torch.Tensor], int]:
    """Parameters after ``steps`` AdamW steps in Strict mode, and the launches of the last step."""
    from torchtpu import step_recording

    monkeypatch.setattr(step_recording, "_FUSE_OPTIMIZER", fuse)
    launches = count_launches(monkeypatch)
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g).to("tpu").requires_grad_() for s in [(6, 5), (5,), (3, 6)]]
    grads = [[torch.randn(p.shape, generator=g).to("tpu") for p in params] for _ in range(steps)]
    opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
    for k in range(steps):
        for p, grad in zip(params, grads[k]):
            p.grad = grad
        torch.tpu.synchronize()
        launches[0] = 0
        opt.step()
        torch.tpu.synchronize()
    return [p.detach().cpu() for p in params], launches[0]


def test_an_optimizer_step_in_strict_mode_is_one_program(monkeypatch):
    """AdamW's default (foreach) step is ~10 ops a step; over tpu parameters in Strict mode it is
    recorded and run as one program, with the values of the op-by-op step."""
    assert torch.tpu.get_eager_mode() == "strict"
    fused, launches = _adamw_steps(3, True, monkeypatch)
    op_by_op, launches_op_by_op = _adamw_steps(3, False, monkeypatch)
    assert launches == 1 and launches_op_by_op >= 8, (launches, launches_op_by_op)
    for a, b in zip(fused, op_by_op):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert torch.tpu.get_eager_mode() == "strict"


def test_an_optimizer_step_that_raises_leaves_strict_mode_at_the_next_step():
    class Failing(torch.optim.SGD):
        def step(self, closure=None):
            super().step()
            raise ValueError("the step failed")

    Failing.step = torch.optim.Optimizer.profile_hook_step(Failing.step)
    p = torch.ones(3).to("tpu").requires_grad_()
    p.grad = torch.ones(3).to("tpu")
    with pytest.raises(ValueError, match="the step failed"):
        Failing([p], lr=0.5).step()
    assert p.cpu().tolist() == [0.5, 0.5, 0.5]  # the step's ops ran (at the read)
    torch.optim.SGD([p], lr=0.5).step()  # its hook ends the failed step's recording first
    assert torch.tpu.get_eager_mode() == "strict"
    assert p.cpu().tolist() == [0.0, 0.0, 0.0]


def test_optimizer_step_recording_starts_only_over_dense_tpu_parameters_and_gradients():
    """step_recording._on_tpu, which decides at every step's pre-hook whether Strict mode records
    it: parameters without a gradient are skipped; any gradient or parameter off the tpu (a
    parameter's ``.data`` moved to the CPU keeps its tpu gradient) stops it."""
    from torchtpu import step_recording

    a, b = (torch.ones(3).to("tpu").requires_grad_() for _ in range(2))
    opt = torch.optim.AdamW([a, b])
    assert not step_recording._on_tpu(opt)  # no gradient at all
    b.grad = torch.ones(3).to("tpu")
    assert step_recording._on_tpu(opt)  # a's gradient None: skipped
    opt.add_param_group({"params": [c := torch.ones(3).requires_grad_()]})
    c.grad = torch.ones(3)
    assert not step_recording._on_tpu(opt)  # a CPU parameter in another group
    c.grad = None
    assert step_recording._on_tpu(opt)
    b.data = torch.ones(3)  # the parameter leaves the tpu; its gradient stays there
    assert b.grad.device.type == "tpu" and not step_recording._on_tpu(opt)
    b.data = torch.ones(3).to("tpu")
    assert step_recording._on_tpu(opt)
