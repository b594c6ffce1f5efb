"""Strict (asynchronous) and Debug (TORCH_TPU_LAUNCH_BLOCKING) modes, and crash safety."""


import pytest
import torch
from helpers import run_python


def test_strict_mode_is_asynchronous_and_debug_is_not():
    from torchtpu.engine import executor

    a = torch.randn(512, 512, device="tpu")
    torch.tpu.synchronize()
    assert not executor._latest
    out = a @ a  # Strict: the launch is held for synchronize(), not waited for
    assert len(executor._latest) >= 1
    torch.tpu.synchronize()
    assert not executor._latest
    with torch.tpu.launch_blocking():
        out = out @ a  # Debug: waited for before returning, nothing held
        assert not executor._latest
    assert out.sum().item() == pytest.approx(out.cpu().sum().item(), rel=1e-4)


@pytest.mark.parametrize("var", ["TORCH_TPU_LAUNCH_BLOCKING", "TPU_LAUNCH_BLOCKING"])
@pytest.mark.fresh_process
def test_debug_mode_raises_index_error_like_cpu(var):
    r = run_python("""
        import torch
        w = torch.randn(10, 4, device='tpu')
        for fn in (lambda: torch.nn.functional.embedding(torch.tensor([3, 12], device='tpu'), w),
                   lambda: w.index_select(0, torch.tensor([0, 10], device='tpu')),
                   lambda: w[torch.tensor([11], device='tpu')]):
            try:
                fn()
                print('no error')
            except IndexError as e:
                print('IndexError')
        from torchtpu._config import config
        print('blocking', config.launch_blocking)
    """, {var: "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("IndexError") == 3, r.stdout
    assert "blocking True" in r.stdout


# (op on x = arange(12.).reshape(3, 4), out-of-range index): CPU raises; so must every tpu mode
_OUT_OF_RANGE = {
    "gather": lambda x, t: torch.gather(x, 1, t([[5]])),
    "gather_negative": lambda x, t: torch.gather(x, 1, t([[-1]])),
    "gather_first_of_two": lambda x, t: torch.gather(x, 1, t([[1], [5], [9]])),  # names 5, as the CPU
    "scatter_": lambda x, t: x.clone().scatter_(0, t([[7]]), 1.0),
    "scatter_add": lambda x, t: x.scatter_add(0, t([[3]]), torch.ones_like(x[:1, :1])),
    "scatter_reduce": lambda x, t: x.scatter_reduce(0, t([[7]]), torch.ones_like(x[:1, :1]), "sum"),
    "index_select": lambda x, t: x.index_select(0, t([0, 3])),
    "index_select_negative": lambda x, t: x.index_select(0, t([-1])),
    "embedding": lambda x, t: torch.nn.functional.embedding(t([1, 9]), x),
    "index": lambda x, t: x[t([3])],
    "index_negative": lambda x, t: x[:, t([-5])],
    "index_put_": lambda x, t: x.clone().index_put_((t([3]),), torch.ones_like(x[0, 0])),
    "index_add": lambda x, t: x.index_add(0, t([3]), torch.ones_like(x[:1])),
    "index_copy": lambda x, t: x.index_copy(1, t([4]), torch.ones_like(x[:, :1])),
    "index_fill": lambda x, t: x.index_fill(0, t([-4]), 2.0),
    "take": lambda x, t: torch.take(x, t([12])),
    "nll_loss": lambda x, t: torch.nn.functional.cross_entropy(x, t([0, 4, 1])),
    "embedding_bag": lambda x, t: torch.nn.functional.embedding_bag(t([[0, 5]]), x),
}
# the same ops with indices the CPU accepts (negative ones where they count from the end)
_IN_RANGE = [
    lambda x, t: torch.gather(x, 1, t([[3]])),
    lambda x, t: x[t([-3])],
    lambda x, t: x.index_fill(0, t([-3]), 2.0),
    lambda x, t: torch.take(x, t([-12])),
    lambda x, t: torch.nn.functional.cross_entropy(x, t([0, -100, 1])),
    lambda x, t: torch.nn.functional.embedding(t([0, 2]), x),
]


def _cpu_error(fn):
    try:
        fn(torch.arange(12.0).reshape(3, 4), torch.tensor)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e).splitlines()[0]
    raise AssertionError("CPU accepts this index")


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
@pytest.mark.parametrize("case", list(_OUT_OF_RANGE))
def test_out_of_range_index_raises_the_cpu_error_at_the_next_synchronization(mode, case):
    """XLA clamps such an index: the op's device-side check reports it, as CUDA's asserts do."""
    fn = _OUT_OF_RANGE[case]
    error, message = _cpu_error(fn)
    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    with torch.tpu.eager_mode(mode):
        fn(x, lambda v: torch.tensor(v).to("tpu"))  # does not wait for the device
        with pytest.raises(error) as info:
            torch.tpu.synchronize()
        assert str(info.value).startswith(message), (str(info.value), message)
        assert "detected on the device" in str(info.value)
        torch.tpu.synchronize()  # reported once
        assert x.sum().item() == 66.0


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_out_of_range_index_surfaces_at_a_read_and_valid_indices_do_not(mode):
    x = torch.arange(12.0).reshape(3, 4).to("tpu")

    def t(v):
        return torch.tensor(v).to("tpu")

    with torch.tpu.eager_mode(mode):
        for fn in _IN_RANGE:
            fn(x, t)
        assert torch.tpu.synchronize() is None
        y = x.index_select(0, t([2, 7])) * 2
        with pytest.raises(IndexError, match="index out of range in self"):
            y.sum().item()
        assert (x * 2).sum().item() == 132.0


def test_index_check_is_one_program_for_every_size(monkeypatch):
    """The check's bounds and message code are runtime values: indexing tensors of 12 sizes
    compiles one check (it compiled one per size: 100 of a 100-size eager loop's programs), and
    each size still reports its own bound."""
    from torchtpu.engine import compile_cache

    texts = []
    real = compile_cache.compile
    monkeypatch.setattr(compile_cache, "compile", lambda text, **kw: (texts.append(text), real(text, **kw))[1])
    idx = torch.tensor([0, 1, -2, 3] * 7 + [2]).to("tpu")  # an index length no other test uses
    for n in range(4, 16):
        x = torch.arange(float(n)).to("tpu")
        assert x[idx].tolist()[:4] == [0.0, 1.0, n - 2.0, 3.0]
    # (none when an earlier test of this process compiled that check already)
    assert len([t for t in texts if "stablehlo.minimum" in t]) <= 1
    for n in (5, 9):
        x = torch.arange(float(n)).to("tpu")
        x[torch.tensor([1, n]).to("tpu")]
        with pytest.raises(IndexError, match=f"index {n} is out of bounds for dimension 0 with size {n}"):
            torch.tpu.synchronize()


def test_index_checks_can_be_switched_off(monkeypatch):
    from torchtpu._config import config

    monkeypatch.setattr(config, "index_checks", False)
    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    out = x.index_select(0, torch.tensor([7]).to("tpu"))  # XLA clamps: documented, opted into
    torch.tpu.synchronize()
    assert out.shape == (1, 4)


@pytest.mark.parametrize("case", ["gather", "gather_negative", "gather_first_of_two", "scatter_", "index_copy", "take",
                                  "nll_loss", "embedding_bag"])
def test_debug_mode_raises_the_cpu_error_at_the_op(case):
    fn = _OUT_OF_RANGE[case]
    error, message = _cpu_error(fn)
    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    with torch.tpu.launch_blocking(), pytest.raises(error) as info:
        fn(x, lambda v: torch.tensor(v).to("tpu"))
    assert str(info.value) == message


def test_launch_blocking_context_manager():
    with torch.tpu.launch_blocking(), pytest.raises(IndexError):
        torch.randn(5, 2, device="tpu").index_select(0, torch.tensor([7], device="tpu"))


def test_debug_mode_raises_on_integer_division_by_zero_like_cpu():
    x = torch.tensor([1, 2], device="tpu")
    zero = torch.zeros_like(x)
    with torch.tpu.launch_blocking():
        for fn in (lambda: x // 0, lambda: torch.remainder(x, zero), lambda: torch.fmod(x, 0),
                   lambda: torch.div(x, zero, rounding_mode="trunc"), lambda: x.clone().floor_divide_(zero)):
            with pytest.raises(RuntimeError, match="ZeroDivisionError"):
                fn()
        # float division and a non-zero divisor are fine
        assert torch.div(x, zero).cpu().isinf().all()
        assert (x // 2).cpu().tolist() == [0, 1]


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "compile"])
def test_integer_division_by_zero_raises_like_cpu_in_every_mode(mode):
    """Regression: outside Debug mode an integer quotient or remainder by zero returned XLA's junk
    silently. The divisor is now checked on the device and CPU's error raised at the next read."""
    x = torch.tensor([1, 2, 3], device="tpu")
    zero_in_middle = torch.tensor([1, 0, 2], device="tpu")
    ops = [lambda a, c: a // c, lambda a, c: torch.remainder(a, c), lambda a, c: torch.fmod(a, c),
           lambda a, c: torch.div(a, c, rounding_mode="trunc"), lambda a, c: a.clone().floor_divide_(c)]
    for op in ops:
        fn = torch.compile(op, backend="tpu") if mode == "compile" else op
        with torch.tpu.eager_mode("strict" if mode == "compile" else mode):
            with pytest.raises(RuntimeError, match="ZeroDivisionError"):
                fn(x, zero_in_middle).cpu()
            divisor = torch.tensor([2, -1, 2], device="tpu")
            assert torch.equal(fn(x, divisor).cpu(), op(x.cpu(), divisor.cpu()))  # nonzero divisors: as CPU
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        x // 0  # a divisor known on the host raises at once
    assert torch.div(x, torch.zeros_like(x)).cpu().isinf().all()  # true division is not checked


@pytest.mark.fresh_process
def test_exception_in_backward_does_not_crash():
    r = run_python("""
        import torch
        class Boom(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2
            @staticmethod
            def backward(ctx, g):
                raise ValueError('boom in backward')
        x = torch.randn(3, device='tpu', requires_grad=True)
        try:
            Boom.apply(x).sum().backward()
        except ValueError as e:
            print('caught', e)
        # a kernel error inside backward: shape mismatch in a tpu op
        y = torch.randn(3, device='tpu', requires_grad=True)
        class Bad(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x + 1
            @staticmethod
            def backward(ctx, g):
                return g @ torch.randn(5, 5, device='tpu')
        try:
            Bad.apply(y).sum().backward()
        except RuntimeError as e:
            print('caught runtime')
        print('alive')
    """)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "caught boom in backward" in r.stdout and "caught runtime" in r.stdout and "alive" in r.stdout


@pytest.mark.fresh_process
def test_nan_check_option():
    r = run_python("""
        import torch
        x = torch.tensor([-1.0], device='tpu')
        try:
            torch.log(x)
            print('no error')
        except RuntimeError as e:
            print('nan detected' if 'NaN' in str(e) else str(e))
    """, {"TORCH_TPU_CHECK_NAN": "1"})
    assert "nan detected" in r.stdout, r.stdout + r.stderr


def test_precision_bands():
    torch.manual_seed(0)
    a = torch.randn(64, 4096, dtype=torch.float64)
    b = torch.randn(4096, 64, dtype=torch.float64)
    exact = a @ b
    errs = {}
    for p in ("medium", "high", "highest"):
        with torch.tpu.precision(p):
            out = (a.float().to("tpu") @ b.float().to("tpu")).cpu().double()
        errs[p] = ((out - exact).norm() / exact.norm()).item()
    assert 1e-3 < errs["medium"] < 5e-3, errs
    # three bf16 passes leave out lo*lo, about 2**-16 = 1.5e-5 of a product: measured 4.4e-6 on the
    # emulator, 1.29e-5 with a TPU v5e's own 3-pass mode (docs/tpu.md)
    assert errs["high"] < 2e-5, errs
    assert errs["highest"] < 1e-6, errs


def test_native_precision_lookup_follows_global_and_overrides():
    # csrc/precision_tls.cpp answers the default natively: it must see every other setting
    import threading

    from torchtpu.engine import precision

    assert precision.current() == "medium"
    seen = []
    try:
        torch.set_float32_matmul_precision("high")
        assert precision.current() == "high"
        with torch.tpu.precision("highest"):
            assert precision.current() == "highest"
            with torch.tpu.precision("medium"):
                assert precision.current() == "medium"
            t = threading.Thread(target=lambda: seen.append(precision.current()))
            t.start()
            t.join()
        assert precision.current() == "high"
    finally:
        torch.set_float32_matmul_precision("highest")
        precision.set_global("medium")
    assert seen == ["high"]  # another thread: the global level, not this thread's override
    assert precision.current() == "medium"


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_backward_on_autograd_threads_keeps_the_precision_override(mode):
    """Regression: called from a Python thread other than the main one, backward() runs on an
    autograd thread, which did not see a torch.tpu.precision override (thread-local): the backward
    products ran at 'medium' silently. The override now travels with PyTorch's thread-local state."""
    import threading

    torch.manual_seed(0)
    a = torch.randn(64, 512)
    b = torch.randn(512, 64)

    def grad_of_a(results: dict, key: str, precision: str | None) -> None:
        x = a.to("tpu").requires_grad_()
        w = b.to("tpu")
        with torch.tpu.eager_mode(mode):
            if precision is None:
                (x @ w).pow(2).sum().backward()
            else:
                with torch.tpu.precision(precision):
                    (x @ w).pow(2).sum().backward()
        results[key] = x.grad.cpu()

    results: dict = {}
    grad_of_a(results, "main_highest", "highest")
    grad_of_a(results, "main_medium", None)
    worker = threading.Thread(target=lambda: (grad_of_a(results, "thread_highest", "highest"),
                                              grad_of_a(results, "thread_medium", None)))
    worker.start()
    worker.join()
    assert not torch.equal(results["main_highest"], results["main_medium"])  # the test can tell them apart
    assert torch.equal(results["thread_highest"], results["main_highest"])
    assert torch.equal(results["thread_medium"], results["main_medium"])


def test_set_float32_matmul_precision_selects_passes():
    from torchtpu.engine import precision

    saved = precision.get_global()
    try:
        torch.set_float32_matmul_precision("highest")
        assert precision.get_global() == "highest"
    finally:
        torch.set_float32_matmul_precision("highest")
        precision.set_global(saved)


def test_index_checks_under_vmap():
    """Batched (vmap) indexing ops match CPU and still report an out-of-range index as the CPU does
    (the check op is dispatched from inside the kernel, below the batching rule)."""
    x = torch.arange(24.0).reshape(2, 3, 4)
    idx = torch.tensor([[0, 2], [1, 3]])

    def pick(xx, ii):
        return torch.gather(xx, 1, ii.unsqueeze(0).expand(3, -1))

    assert torch.equal(torch.vmap(pick)(x.to("tpu"), idx.to("tpu")).cpu(), torch.vmap(pick)(x, idx))
    weight = torch.randn(5, 3)

    def embed(w, i):
        return torch.nn.functional.embedding(i, w)

    batched = torch.vmap(embed, in_dims=(None, 0))
    assert torch.equal(batched(weight.to("tpu"), idx.to("tpu")).cpu(), batched(weight, idx))
    bad = torch.tensor([[0, 2], [1, 7]])
    with pytest.raises(IndexError) as cpu_error:
        batched(weight, bad)
    with pytest.raises(IndexError) as tpu_error:
        batched(weight.to("tpu"), bad.to("tpu")).cpu()
    assert str(tpu_error.value).startswith(str(cpu_error.value))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug"])
def test_kernel_front_passes_arguments_as_python_does(mode):
    """The native kernel front (csrc/kernel_front.cpp) turns IValues into what a Python kernel got:
    dtypes, layouts and memory formats as torch objects, keyword-only arguments by name, optional
    and list arguments, several returns, a kernel's Python error as that error."""
    x_cpu = torch.randn(3, 4)
    ctx = torch.tpu.launch_blocking() if mode == "debug" else torch.tpu.eager_mode(mode)
    with ctx:
        x = x_cpu.to("tpu")
        for _ in range(2):  # DeferAndFuse records natively from the second call
            got = [
                torch.sum(x, dim=1, dtype=torch.float64),
                torch.zeros(2, 3, dtype=torch.int32, layout=torch.strided, device="tpu"),
                torch.empty_like(x, memory_format=torch.contiguous_format).fill_(2.0),
                torch.add(x, x, alpha=3),
                torch.clamp(x, min=None, max=0.5),
                torch.cat([x, x], dim=-1),
                *torch.sort(x, dim=0, descending=True),
                torch.full((2,), 7, dtype=torch.int16, device="tpu"),
            ]
            want = [
                torch.sum(x_cpu, dim=1, dtype=torch.float64),
                torch.zeros(2, 3, dtype=torch.int32),
                torch.full_like(x_cpu, 2.0),
                torch.add(x_cpu, x_cpu, alpha=3),
                torch.clamp(x_cpu, max=0.5),
                torch.cat([x_cpu, x_cpu], dim=-1),
                *torch.sort(x_cpu, dim=0, descending=True),
                torch.full((2,), 7, dtype=torch.int16),
            ]
            for g, w in zip(got, want):
                assert g.device.type == "tpu"
                torch.testing.assert_close(g.cpu(), w)
        with pytest.raises(RuntimeError, match="same number of dimensions|dimension"):
            torch.cat([x, x.reshape(-1)]).cpu()


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_python_numbers_reach_the_kernels_exactly(mode):
    """`x + 1.5` passes 1.5 as a wrapped-number tensor; the native kernel front hands the lowering
    the Python number itself (csrc/kernel_front.cpp: wrapped_number), of each kind, unrounded."""
    torch.manual_seed(0)
    x = torch.randn(6)
    n = torch.arange(6)
    m = torch.tensor([True, False, True, False, True, False])
    c = torch.randn(6, dtype=torch.complex64)
    cases = [
        lambda x, n, m, c: x + 1.5,
        lambda x, n, m, c: x * -0.0,  # the sign of zero survives
        lambda x, n, m, c: n + 2**40,  # an int64 beyond float precision
        lambda x, n, m, c: n * -3,
        lambda x, n, m, c: m & True,
        lambda x, n, m, c: x * False,
        lambda x, n, m, c: c * (2 - 1j),  # exact products: one rounding per part, as on the CPU
        lambda x, n, m, c: x.add(n, alpha=3),  # a Scalar argument that is not a wrapped number
    ]
    with torch.tpu.eager_mode(mode):
        args = [t.to("tpu") for t in (x, n, m, c)]
        got = [f(*args).cpu() for f in cases]
    for f, g in zip(cases, got):
        expected = f(x, n, m, c)
        assert g.dtype == expected.dtype
        torch.testing.assert_close(g, expected, rtol=0, atol=0)
    assert torch.equal(torch.signbit(got[1]), torch.signbit(x * -0.0))


@pytest.mark.fresh_process
def test_every_pytorch_precision_knob_selects_the_passes():
    """torch.backends.fp32_precision (which Hugging Face's test setup sets to "ieee") and
    torch.backends.tpu.fp32_precision select the tpu precision as set_float32_matmul_precision
    does; the TPU default, which is not PyTorch's, is said once; torch.tpu.get_precision() shows it."""
    r = run_python("""
        import warnings, torch
        a = torch.randn(64, 64)
        ref = a.double() @ a.double()
        def err():
            return ((a.to("tpu") @ a.to("tpu")).cpu().double() - ref).abs().max().item()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert torch.tpu.get_precision() == "medium"
            medium = err()
            err()
        said = [str(w.message) for w in caught if "not PyTorch's 'highest'" in str(w.message)]
        assert len(said) == 1, said
        torch.backends.fp32_precision = "ieee"
        assert torch.tpu.get_precision() == "highest" and torch.backends.tpu.fp32_precision == "ieee"
        assert err() < medium / 100
        torch.backends.tpu.fp32_precision = "tf32"
        assert torch.tpu.get_precision() == "high"
        torch.backends.tpu.fp32_precision = "bf16"
        assert torch.tpu.get_precision() == "medium" and err() == medium
        try:
            torch.backends.tpu.fp32_precision = "fp8"
        except ValueError:
            print("ok")
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "ok"


@pytest.mark.fresh_process
def test_fp32_precision_set_before_the_backend_loads_is_honoured():
    r = run_python("""
        import torch
        torch.backends.fp32_precision = "ieee"
        import torchtpu
        torchtpu.install()
        print(torch.tpu.get_precision())
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "highest"


def _refuse_the_next_compile(monkeypatch, message: str) -> list:
    """Make the next XLA compile fail with ``message`` (a plugin's refusal); returns the list
    the refused program's text lands in."""
    from torchtpu.engine import compile_cache
    from torchtpu.runtime import PjrtError

    real = compile_cache.compile
    refused: list = []

    def refuse_once(text, **kw):
        if not refused:
            refused.append(text)
            raise PjrtError(2, message)
        return real(text, **kw)

    monkeypatch.setattr(compile_cache, "compile", refuse_once)
    return refused


def test_a_failed_graph_with_an_index_check_does_not_break_the_next_read(monkeypatch):
    """Regression (DeferAndFuse): when a graph holding an index-bounds check failed to compile,
    the next read of any tensor raised AttributeError ("'Pending' object has no attribute
    'to_host'"): the check's flag, never computed, was read. Its graph's failure was raised
    already; the check is dropped and the next op runs."""
    from torchtpu.engine import compile_cache

    x = torch.randn(9, 4, 3).to("tpu")
    idx = torch.tensor([0, 8, 2]).to("tpu")
    refused = _refuse_the_next_compile(monkeypatch, "-:3:11: error: simulated refusal")
    with torch.tpu.eager_mode("defer_and_fuse"):
        with pytest.raises(compile_cache.CompileError):
            (x.index_select(0, idx) * 5 - 1).cpu()
        assert refused
        torch.testing.assert_close((torch.tensor(3).to("tpu") + 1).cpu(), torch.tensor(4))
        torch.testing.assert_close(x.index_select(0, idx).cpu(), x.cpu().index_select(0, idx.cpu()))


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_a_refused_compile_names_the_op_and_the_engine_goes_on(mode, monkeypatch):
    """A program XLA refuses reaches the user as a RuntimeError (compile_cache.CompileError) naming
    what it computes, with the plugin's diagnostic as its cause, not as raw MLIR text; the next op
    runs. Regression (DeferAndFuse): reading a tensor of the failed graph again raised
    AttributeError ("'Pending' object has no attribute 'size'"), and using it as an input raised
    AssertionError."""
    from torchtpu.engine import compile_cache
    from torchtpu.runtime import PjrtError

    x = torch.randn(3, 1, 7, 5, 2).to("tpu")  # a shape no other test uses: its add is compiled here
    _refuse_the_next_compile(monkeypatch, "-:3:11: error: 'stablehlo.add' op simulated refusal\n-:3:11: note: see op")
    z = None
    with torch.tpu.eager_mode(mode), pytest.raises(RuntimeError) as info:
        z = x + x
        z.cpu()
    assert isinstance(info.value, compile_cache.CompileError) and isinstance(info.value.__cause__, PjrtError)
    if z is not None:  # DeferAndFuse: the recorded tensor stays; reading it again says why it has no value
        with pytest.raises(RuntimeError, match="never computed.*could not compile"):
            z.cpu()
        # nor can an op take it as an input (regression: AssertionError "stale pending storage")
        with torch.tpu.eager_mode(mode), pytest.raises(RuntimeError, match="never computed.*could not compile"):
            (z * 2).cpu()
        with torch.tpu.eager_mode(mode):
            torch.testing.assert_close((x * 3 + 1).cpu(), x.cpu() * 3 + 1)
    what = "aten::add.Tensor(float32[3, 1, 7, 5, 2]" if mode != "defer_and_fuse" else "a fused DeferAndFuse graph"
    assert what in str(info.value) and "simulated refusal" in str(info.value), str(info.value)
    assert "note: see op" not in str(info.value)
    y = torch.ones(2, device="tpu") * 2
    assert y.cpu().tolist() == [2.0, 2.0]


@pytest.mark.fresh_process
def test_programs_read_only_their_storage_when_buffers_are_longer():
    """TORCH_TPU_PAD_UPLOADS=1 uploads every tensor into a buffer longer than its storage, with NaN
    (or the integer maximum) after it, as eager shape buckets would (docs/eager_shapes.md): results,
    reads, views and in-place updates see only the storage. The whole default suite passed so too
    (2,149 of 2,153; the 4 others are about buffer layouts and program variants). An in-place
    write keeps such a buffer (it made an exact one, and the next call a new program variant)."""
    r = run_python("""
        import torch
        from torchtpu import storage as st
        x = torch.arange(12.0).reshape(3, 4)
        t = x.to("tpu")
        assert st.storage_buffer(t.untyped_storage()).size == 16 and t.untyped_storage().nbytes() == 48
        assert torch.equal((t * 2).cpu(), x * 2) and t.sum().item() == 66.0 and t.amax().item() == 11.0
        assert torch.equal(t.t().cpu(), x.t()) and t.view(-1)[5].item() == 5.0 and not t.isnan().any().item()
        i = torch.tensor([2, 0, 1]).to("tpu")
        assert torch.equal(t[i].cpu(), x[torch.tensor([2, 0, 1])]) and i.max().item() == 2
        assert torch.equal(torch.sort(t.view(-1), descending=True).values.cpu(), x.view(-1).sort(descending=True).values)
        old = st.storage_buffer(t.untyped_storage())
        t.add_(1)
        assert torch.equal(t.cpu(), x + 1)
        # the write keeps the longer buffer (zeros after the storage), donating the old one
        assert st.storage_buffer(t.untyped_storage()).size == 16 and old.is_deleted
        print("ok")
    """, env={"TORCH_TPU_PAD_UPLOADS": "1"})
    assert r.returncode == 0 and r.stdout.split()[-1] == "ok", r.stderr[-2000:]
