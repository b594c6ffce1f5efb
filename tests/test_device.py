"""The tpu device, its module, tensors, storage semantics and serialization."""

import copy
import gc
import io
import os
import subprocess
import sys

import pytest
import torch
from helpers import needs_devices, on_tpu, run_python


@pytest.mark.fresh_process
def test_autoload_without_import_torchtpu():
    r = run_python("""
        import sys, torch
        m = torch.nn.Linear(8, 4).to('tpu')
        out = m(torch.randn(2, 8, device='tpu'))
        print(out.device, tuple(out.cpu().shape), 'torchtpu' in sys.modules)
    """)
    assert r.returncode == 0, r.stderr
    assert "tpu:0 (2, 4) True" in r.stdout


@pytest.mark.fresh_process
def test_autoload_can_be_disabled():
    r = run_python("import torch; print(torch._C._get_privateuse1_backend_name())",
                   {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "privateuseone"


def test_device_module_mirrors_cuda():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    assert ("TPU" if on_tpu() else "emulated on XLA CPU") in torch.tpu.get_device_name()
    assert torch.get_device_module("tpu") is torch.tpu
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    with torch.tpu.device(0):
        assert torch.tpu.current_device() == 0
    torch.tpu.synchronize()
    torch.accelerator.synchronize()


def test_plain_tensor_type_and_mismatch_error():
    t = torch.ones(3, device="tpu")
    assert type(t) is torch.Tensor and t.is_tpu and t.device == torch.device("tpu:0")
    with pytest.raises(RuntimeError, match="same device"):
        t + torch.ones(3)
    # 0-d CPU tensors are scalars, as on CUDA
    assert (t + torch.tensor(2.0)).cpu().tolist() == [3.0, 3.0, 3.0]


def test_factories_item_tolist_numpy_print():
    t = torch.arange(6, device="tpu").reshape(2, 3)
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert t.sum().item() == 15
    assert t.cpu().numpy().sum() == 15
    assert "device='tpu:0'" in repr(t)
    assert torch.zeros(2, 2, device="tpu").cpu().abs().sum() == 0
    assert torch.full((2,), 7.5, device="tpu").cpu().tolist() == [7.5, 7.5]
    assert torch.empty(0, device="tpu").cpu().numel() == 0


def test_views_and_inplace_on_views():
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    t[:, 0] += 1
    x[:, 0] += 1
    t.view(-1)[5] = 100.0
    x.view(-1)[5] = 100.0
    t.t()[1].mul_(2)
    x.t()[1].mul_(2)
    torch.testing.assert_close(t.cpu(), x)
    v = t[1:, ::2]
    t.zero_()
    assert v.cpu().abs().sum() == 0  # an older view sees a later write to its base


def test_strided_and_overlapping_reads():
    x = torch.arange(24.0).reshape(2, 3, 4)
    t = x.to("tpu")
    for f in (lambda a: a.permute(2, 0, 1), lambda a: a[:, ::2, 1::2], lambda a: a.diagonal(0, 1, 2),
              lambda a: a.expand(3, 2, 3, 4), lambda a: a.reshape(-1).unfold(0, 5, 2),
              lambda a: a.transpose(0, 2)[1:3]):
        torch.testing.assert_close((f(t) * 1).cpu(), f(x) * 1)


def test_column_splits_are_read_without_padding_their_storage():
    # regression: reading q, k, v of a fused [.., 3 * d] projection padded the whole storage
    # (a copy of it) whenever the split's column offset pushed the read window past its end
    from torchtpu.lowering.builder import Builder
    from torchtpu.lowering.views import ViewSpec, read_view

    b = Builder()
    flat = b.arg((4 * 6 * 12,), torch.float32)
    k = read_view(b, flat, ViewSpec(torch.float32, (4, 6, 4), (72, 12, 1), 4))
    # k split into 2 heads of 2 and transposed to [batch, head, seq, 2]
    k_heads = read_view(b, flat, ViewSpec(torch.float32, (4, 2, 6, 2), (72, 2, 12, 1), 4))
    assert "stablehlo.pad" not in b.module([k, k_heads])
    x = torch.randn(4, 6, 12)
    t = x.to("tpu")
    for part, ref in zip(t.split(4, dim=-1), x.split(4, dim=-1)):
        torch.testing.assert_close((part.transpose(1, 2) * 1).cpu(), ref.transpose(1, 2) * 1)
        torch.testing.assert_close((part.view(4, 6, 2, 2).transpose(1, 2) * 1).cpu(),
                                   ref.view(4, 6, 2, 2).transpose(1, 2) * 1)
    torch.testing.assert_close((t.reshape(4, 72)[:, 1::2] * 1).cpu(), x.reshape(4, 72)[:, 1::2] * 1)
    # rows that cross the aligned row boundary (column 5 + 4 elements > 6) keep the unaligned window
    flat = torch.arange(30.0)
    view = flat.to("tpu").as_strided((3, 4), (6, 1), 5)
    torch.testing.assert_close((view * 1).cpu(), flat.as_strided((3, 4), (6, 1), 5) * 1)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_buffers_keep_the_dims_of_the_result_that_made_them(mode):
    # XLA's CPU backend writes a result flattened to 1-D several times slower (a bias add 3x,
    # a head transpose 6x): a storage's buffer keeps its producer's dims, in memory order
    from torchtpu import storage as st

    def dims(t):
        torch.tpu.synchronize()
        return st.storage_buffer(t.untyped_storage()).shape

    x, bias = torch.randn(8, 6), torch.randn(6)
    with torch.tpu.eager_mode(mode):
        t = x.to("tpu")
        assert dims(t) == (8, 6)  # an upload
        y = t + bias.to("tpu")
        assert dims(y) == (8, 6)
        heads = (t.view(2, 4, 3, 2).transpose(1, 2) * 2).contiguous()
        assert dims(heads) == (2, 3, 4, 2)
        permuted = t.t() * 2  # keeps the input's (column-major) strides
        assert permuted.stride() == (1, 6) and dims(permuted) == (8, 6)
        z = torch.zeros(3, 4, device="tpu")
        assert dims(z) == (3, 4)  # a whole-storage write into an uninitialized storage
        z[1] = 5
        y.add_(1)  # in-place writes keep the shape, so the old buffer can be donated
        assert dims(z) == (3, 4) and dims(y) == (8, 6)
        torch.testing.assert_close(y.cpu(), x + bias + 1)
        torch.testing.assert_close(heads.cpu(), (x.view(2, 4, 3, 2).transpose(1, 2) * 2).contiguous())
        torch.testing.assert_close(permuted.cpu(), x.t() * 2)
        torch.testing.assert_close(z.cpu(), torch.zeros(3, 4).index_fill_(0, torch.tensor([1]), 5))
        # a buffer of another shape than the tensor that reads it is read as the flat storage
        torch.testing.assert_close((heads.view(-1)[5:17] * 1).cpu(),
                                   (x.view(2, 4, 3, 2).transpose(1, 2) * 2).reshape(-1)[5:17])


def test_out_variant_and_resize():
    a, b = torch.randn(4), torch.randn(4)
    out = torch.empty(4, device="tpu")
    torch.add(a.to("tpu"), b.to("tpu"), out=out)
    torch.testing.assert_close(out.cpu(), a + b)
    out2 = torch.empty(0, device="tpu")
    torch.mul(a.to("tpu"), 2, out=out2)
    torch.testing.assert_close(out2.cpu(), a * 2)


def test_data_and_copy_across_devices():
    p = torch.nn.Parameter(torch.randn(3, device="tpu"))
    d = p.data
    d.add_(1)
    assert torch.equal(p.detach().cpu(), d.cpu())
    p.data = torch.zeros(3, device="tpu")
    assert p.detach().cpu().abs().sum() == 0
    host = torch.empty(3, dtype=torch.float64)
    host.copy_(torch.ones(3, device="tpu"))
    assert host.tolist() == [1.0, 1.0, 1.0]
    t = torch.empty(2, 3, device="tpu", dtype=torch.bfloat16)
    t.copy_(torch.ones(3))  # broadcast + dtype conversion
    assert t.float().cpu().sum() == 6


def test_dtypes_round_trip():
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8,
                  torch.float64):
        x = (torch.randn(5) * 10).to(dtype)
        assert torch.equal(x.to("tpu").cpu(), x)


def test_save_load_and_deepcopy():
    m = torch.nn.Linear(4, 3).to("tpu")
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    for weights_only in (True, False):
        buf.seek(0)
        sd = torch.load(buf, weights_only=weights_only)
        assert sd["weight"].device.type == "tpu"
        torch.testing.assert_close(sd["weight"].cpu(), m.weight.detach().cpu())
    buf.seek(0)
    sd = torch.load(buf, map_location="cpu")
    assert sd["weight"].device.type == "cpu"
    c = copy.deepcopy(m)
    torch.testing.assert_close(c.weight.detach().cpu(), m.weight.detach().cpu())
    t = torch.randn(5, device="tpu")
    t2 = copy.deepcopy(t)
    t2.add_(1)
    torch.testing.assert_close(t2.cpu(), t.cpu() + 1)
    s = torch.UntypedStorage(16, device="tpu")
    assert s.nbytes() == 16 and s.device.type == "tpu"


def test_generator_reproducible_and_rng_state():
    torch.manual_seed(123)
    a = torch.randn(100, device="tpu").cpu()
    torch.manual_seed(123)
    b = torch.randn(100, device="tpu").cpu()
    assert torch.equal(a, b)
    assert abs(a.mean().item()) < 0.5 and 0.5 < a.std().item() < 1.5
    g = torch.Generator("tpu").manual_seed(7)
    u1 = torch.rand(10, device="tpu", generator=g).cpu()
    g.manual_seed(7)
    u2 = torch.rand(10, device="tpu", generator=g).cpu()
    assert torch.equal(u1, u2) and 0 <= u1.min() and u1.max() < 1
    state = torch.tpu.get_rng_state()
    c = torch.rand(5, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(5, device="tpu").cpu(), c)


def test_pin_memory_and_memory_stats():
    p = torch.randn(4).pin_memory()
    assert p.is_pinned()
    before = torch.tpu.memory_allocated()
    t = torch.empty(1024, device="tpu")
    assert torch.tpu.memory_allocated() >= before + 4096
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    del t
    assert torch.tpu.memory_allocated() == before


@pytest.mark.fresh_process
def test_every_accelerator_call_works_after_device_use():
    """Every public torch.accelerator function, called after tpu work, returns or raises a Python
    exception (run in a child: a crash fails this test, not the suite). Regression:
    empty_host_cache() killed the process (no host allocator was registered for tpu),
    get_memory_info() and get_device_capability() raised."""
    r = run_python("""
        import inspect, torch
        x = (torch.ones(4, device="tpu") * 2).cpu()
        p = torch.randn(256).pin_memory()
        assert p.is_pinned()
        skip = {"set_stream", "set_device_index", "set_device_idx", "device_index"}  # need arguments
        for name in sorted(dir(torch.accelerator)):
            fn = getattr(torch.accelerator, name)
            if (name.startswith("_") or not inspect.isfunction(fn) or name in skip
                    or not fn.__module__.startswith("torch.accelerator")):
                continue
            try:
                fn()
                print("ok", name)
            except Exception as e:  # a clear Python exception is allowed, a crash is not
                print("raised", name, type(e).__name__, e)
        torch.accelerator.set_device_index(0)
        torch.accelerator.set_stream(torch.accelerator.current_stream())
        with torch.accelerator.device_index(0):
            pass
        free, total = torch.accelerator.get_memory_info()
        assert (free, total) == torch.tpu.mem_get_info() and 0 < free <= total
        dtypes = torch.accelerator.get_device_capability()["supported_dtypes"]
        assert torch.float32 in dtypes and torch.bfloat16 in dtypes and torch.qint8 not in dtypes
        print("alive")
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ok empty_host_cache" in r.stdout and "ok get_memory_info" in r.stdout, r.stdout
    assert "raised" not in r.stdout, r.stdout
    assert r.stdout.split()[-1] == "alive"


@needs_devices(2)
@pytest.mark.fresh_process
def test_second_device():
    r = run_python("""
        import torch
        a = torch.arange(4.0).to('tpu:1')
        b = (a * 2).to('tpu:1')
        print(a.device, b.device, b.cpu().tolist(), torch.tpu.device_count())
        torch.accelerator.set_device_index(1)
        print(torch.tpu.current_device(), torch.empty(1, device='tpu').device)
    """, {"TORCH_TPU_NUM_DEVICES": "2"})
    assert r.returncode == 0, r.stderr
    assert "tpu:1 tpu:1 [0.0, 2.0, 4.0, 6.0] 2" in r.stdout
    assert "1 tpu:1" in r.stdout


def test_module_to_tpu_keeps_parameter_identity():
    """As with CUDA, .to("tpu") moves parameters in place: tied weights stay tied and an
    optimizer built before the move still owns the moved parameters."""
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head)
    weight = emb.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("tpu")
    assert emb.weight is weight and head.weight is weight
    assert weight.device.type == "tpu" and weight.is_leaf
    before = weight.detach().cpu()
    model(torch.tensor([[1, 2]], device="tpu")).sum().backward()
    opt.step()
    assert not torch.equal(weight.detach().cpu(), before)
    model.to("cpu")
    assert emb.weight is weight and weight.device.type == "cpu" and weight.grad.device.type == "cpu"


def test_reading_a_view_cuts_it_on_the_host():
    """A strided view of a small storage is read without compiling a device program per shape."""
    base = torch.arange(120.0).reshape(10, 12)
    x = base.to("tpu")
    before = torch.tpu.compile_cache_stats()["misses"]
    for view, ref in ((x[2:5, 1:9:3], base[2:5, 1:9:3]), (x.t()[3], base.t()[3]), (x[:, 4], base[:, 4])):
        assert torch.equal(view.cpu(), ref)
    assert torch.tpu.compile_cache_stats()["misses"] == before


@pytest.mark.fresh_process
def test_synchronize_waits_for_launches_whose_outputs_were_all_dropped():
    """Regression: synchronize() waited only for launches with an output still alive, so the
    timing loop ``f(x)`` (result discarded) then ``synchronize()`` returned while the device
    was still computing. (The portable Jacobi svd of 256x256: about a second, asynchronous.)"""
    code = """
import torch
from torchtpu import storage as st
import time
x = torch.randn(256, 256).to("tpu")
torch.tpu.synchronize()
s = torch.linalg.svdvals(x)  # ~1 s
ready = st.storage_buffer(s.untyped_storage()).ready_event()
del s  # every output of the launch is dropped
torch.tpu.synchronize()
# The event is set by a callback once the buffer is ready: moments after synchronize(), but
# the test suite runs a worker per core, so allow a scheduling delay (the svd itself is ~1 s).
deadline = time.monotonic() + 0.3
while not ready.is_ready() and time.monotonic() < deadline:
    time.sleep(0.001)
print(ready.is_ready())
"""
    r = run_python(code, env={"TORCH_TPU_CPU_KERNELS": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


@pytest.mark.fresh_process
def test_synchronize_waits_for_a_launch_whose_last_output_was_dropped():
    """Regression: synchronize() waited on each launch's last output only, so keeping just the
    singular values of an svd (U and Vh dropped) returned before the decomposition had run.
    (The portable Jacobi svd: tens of milliseconds on the CPU-emulated device, and launched
    asynchronously.)"""
    code = """
import torch
from torchtpu import storage as st
x = torch.randn(128, 128).to("tpu")
torch.tpu.synchronize()
s = torch.linalg.svdvals(x)  # _linalg_svd's U and Vh outputs are dropped at once
torch.tpu.synchronize()
print(st.storage_buffer(s.untyped_storage()).ready_event().is_ready())
"""
    r = run_python(code, env={"TORCH_TPU_CPU_KERNELS": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def test_empty_cache_drops_the_output_held_for_synchronize():
    """synchronize() holds each device's latest launch output; empty_cache() must not leave it
    counted once the user has dropped every tensor."""
    x = torch.randn(64, 64).to("tpu")
    torch.tpu.empty_cache()
    before = torch.tpu.device_memory_in_use()[0]
    y = x * 2
    del y
    torch.tpu.empty_cache()
    assert torch.tpu.device_memory_in_use()[0] == before


def test_memory_reserved_counts_what_the_device_holds_beyond_tensors():
    """Regression: memory_reserved() was memory_allocated() (tensor storages) always. It counts
    every device buffer the process holds, as CUDA's counts its allocator's cached blocks."""
    import numpy as np

    from torchtpu import _device_state

    if torch.tpu.device_count() != 1 or _device_state.client().memory_stats(0) is not None:
        pytest.skip("the process's own buffers count per device only on a single-device plugin without a report")
    before_reserved, before_allocated = torch.tpu.memory_reserved(), torch.tpu.memory_allocated()
    held = _device_state.client().buffer_from_host(np.zeros(1 << 16, np.float32), 0)  # no tensor owns it
    assert torch.tpu.memory_allocated() == before_allocated
    assert torch.tpu.memory_reserved() >= before_reserved + (1 << 18)
    assert torch.tpu.max_memory_reserved() >= torch.tpu.memory_reserved()
    del held
    assert torch.tpu.memory_reserved() < before_reserved + (1 << 18)


def test_memory_info_mirrors_cuda():
    """torch.cuda's memory queries that training scripts call (regression: missing on tpu)."""
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    assert torch.tpu.get_device_properties(0).total_memory == total
    t = torch.empty(1024, device="tpu")
    assert torch.tpu.memory_reserved() >= torch.tpu.memory_allocated() >= 4096
    assert torch.tpu.max_memory_reserved() >= torch.tpu.memory_reserved()
    stats = torch.tpu.memory_stats()
    assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"]
    torch.tpu.reset_max_memory_allocated()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()
    assert "tpu storages, current" in torch.tpu.memory_summary()
    del t
    assert torch.tpu.is_bf16_supported()
    torch.tpu.init()
    assert torch.tpu.OutOfMemoryError is torch.OutOfMemoryError


def test_memory_stats_name_the_largest_program_scratch():
    """A program's intermediates are its scratch (PJRT's compiled memory stats), not buffers:
    memory_stats reports the largest one compiled."""
    from torchtpu.engine import compile_cache

    x = torch.randn(512, 512, device="tpu")
    (x @ x).exp().sum().item()
    exe = compile_cache.compile("""module @m { func.func public @main(%a: tensor<512x512xf32>) -> tensor<f32> {
      %0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>
      %1 = stablehlo.exponential %0 : tensor<512x512xf32>
      %z = stablehlo.constant dense<0.0> : tensor<f32>
      %2 = stablehlo.reduce(%1 init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<512x512xf32>, tensor<f32>) -> tensor<f32>
      return %2 : tensor<f32> } }""")
    stats = exe.compiled_memory_stats()
    # (a v5e pads the 4-byte scalar result to 512 bytes)
    assert stats is not None and stats["argument"] == 512 * 512 * 4 and 4 <= stats["output"] <= 4096
    # the emulator keeps the product in scratch; the v5e fused it away (temp 0, sixteenth session)
    assert isinstance(stats["temp"], int) and (on_tpu() or stats["temp"] >= 512 * 512 * 4)
    assert torch.tpu.memory_stats()["temp_bytes.largest_program"] >= stats["temp"]


def test_a_device_failure_is_a_torch_accelerator_error():
    """Regression (cuda parity): torch.tpu had no AcceleratorError, and a device's failure running
    work surfaced as a plain PjrtError. It is torch.AcceleratorError (what CUDA raises for a failed
    kernel), still a RuntimeError; a refused request is not one."""
    from torchtpu.runtime.errors import PjrtError, make_error

    assert torch.tpu.AcceleratorError is torch.AcceleratorError
    for code in (10, 13, 14, 15):  # ABORTED, INTERNAL, UNAVAILABLE, DATA_LOSS
        e = make_error(code, "the device stopped")
        assert isinstance(e, torch.AcceleratorError) and isinstance(e, PjrtError) and isinstance(e, RuntimeError)
        assert e.code == code and "tpu device error: the device stopped" in str(e)
    assert not isinstance(make_error(3, "bad program"), torch.AcceleratorError)  # INVALID_ARGUMENT
    assert isinstance(make_error(8, "no memory"), torch.OutOfMemoryError)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_timing_events_measure_device_work(mode):
    """torch.tpu.Event(enable_timing=True) as torch.cuda.Event: record() marks the work launched
    so far, elapsed_time() is the time between the marks' completions (the device's work, not
    the host's dispatch). Regression: torch.tpu.Event did not exist."""
    x = torch.randn(1024, 1024).to("tpu") / 32
    torch.tpu.synchronize()
    with torch.tpu.eager_mode(mode):
        start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
        start.record()
        y = x
        for _ in range(8):  # tens of milliseconds of dependent products
            y = y @ x
        end.record()
        assert not end.query()  # launched, not run yet: record() does not wait
        assert start.elapsed_time(end) > 0
        assert end.query()
        assert y.isfinite().all().item()


def test_events_without_work_and_their_errors():
    a, b = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    assert a.query()  # never recorded: nothing to wait for, as on CUDA
    torch.tpu.synchronize()
    a.record()
    b.record()
    assert a.query() and b.query()
    assert 0 <= a.elapsed_time(b) < 1000
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        torch.tpu.Event().elapsed_time(b)
    with pytest.raises(RuntimeError, match="must be recorded"):
        torch.tpu.Event(enable_timing=True).elapsed_time(b)
    s = torch.tpu.current_stream()
    e = s.record_event()
    e.synchronize()
    assert s.query()


def test_device_generic_events_wait_and_time():
    """torch.Event(device="tpu"), PyTorch's device-generic event, goes through the C++ device
    guard. Regression: its record() marked nothing, query() was always true, synchronize() did
    not wait and elapsed_time() raised "Backend doesn't support elapsedTime"."""
    # work that outlasts its launches: on a TPU, 6-pass products of 4096 (~30 ms in all)
    n, passes = (4096, "highest") if on_tpu() else (1024, "medium")
    x = torch.randn(n, n).to("tpu") / n**0.5
    with torch.tpu.precision(passes):
        y = x @ x
        torch.tpu.synchronize()  # compiled now: the launches below only queue work
        start, end = torch.Event(device="tpu", enable_timing=True), torch.Event(device="tpu", enable_timing=True)
        start.record()
        for _ in range(8):
            y = y @ x
        end.record()
    assert not end.query()
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) > 0
    plain = torch.Event(device="tpu")
    plain.record()
    plain.synchronize()
    assert plain.query() and y.isfinite().all().item()


_DATA_PARALLEL = """
    import copy
    import torch
    from torch import nn
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(6, 8)
    ref = copy.deepcopy(m)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    dp = nn.DataParallel(copy.deepcopy(m).to("tpu"))
    opt = torch.optim.SGD(dp.parameters(), lr=0.1)
    # a thread's precision block: replicas run on DataParallel's threads, which it reaches as
    # PyTorch carries autocast there
    with torch.tpu.precision("highest"):
        for _ in range(2):
            for model, o, inp in ((ref, ref_opt, x), (dp, opt, x.to("tpu"))):
                o.zero_grad()
                out = model(inp)
                out.pow(2).sum().backward()
                o.step()
    assert out.device == torch.device("tpu:0"), out.device
    diff = max((p.detach().cpu() - q.detach()).abs().max().item()
               for p, q in zip(dp.module.parameters(), ref.parameters()))
    print("devices", dp.device_ids, "diff", diff)
    assert diff < 1e-5, diff
"""


@pytest.mark.parametrize("devices", ["1", pytest.param("2", marks=needs_devices(2))])
@pytest.mark.fresh_process
def test_data_parallel_trains_like_one_cpu_model(devices):
    """Regression: nn.DataParallel(model) failed even on one tpu device (torch._C._scatter exists
    only in CUDA builds). On one and on two emulated devices it trains as the CPU model does,
    at the precision of the caller's torch.tpu.precision block (regression: the replica threads
    ran at the default)."""
    r = run_python(_DATA_PARALLEL, {"TORCH_TPU_NUM_DEVICES": devices})
    assert r.returncode == 0, r.stderr
    assert f"devices {list(range(int(devices)))}" in r.stdout


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_out_of_device_memory_raises_torch_out_of_memory_error(mode):
    """Regression: a failed device allocation raised the runtime's PjrtError, which a CUDA user's
    ``except torch.OutOfMemoryError`` (batch-size finders) does not catch. It is now a subclass of
    both; the device stays usable."""
    from torchtpu import _C
    from torchtpu.runtime import PjrtError

    torch.tpu.init()
    _C._set_memory_limit(0, -1)  # past the allocator's own limit (the test below), to the plugin's
    x = None
    try:
        with torch.tpu.eager_mode(mode), pytest.raises(torch.OutOfMemoryError, match="tpu out of memory") as info:
            # 256 TiB: beyond a 47-bit address space, so refused even where memory is overcommitted;
            # kept alive (DeferAndFuse never materializes a dead result)
            x = torch.ones(2**46, device="tpu")
            torch.tpu.synchronize()
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)
    assert isinstance(info.value, PjrtError) and info.value.code_name == "RESOURCE_EXHAUSTED"
    # DeferAndFuse's x, and the traceback's frames, hold the 256 TiB output until they go
    del info, x
    gc.collect()
    assert torch.tpu.memory_allocated() < 1 << 30
    assert torch.ones(3, device="tpu").sum().item() == 3.0


def test_device_memory_has_a_size_and_a_per_process_fraction():
    """Regression: the emulated device had no memory size (torch.empty(2**40) "succeeded", 30 GB
    passed beyond the host's memory). Now each device has one (the emulator: 16 GiB of HBM like a
    v5e; a TPU: the chip's), and live tensors beyond it, or beyond set_per_process_memory_fraction,
    raise torch.OutOfMemoryError at the allocation, as CUDA's allocator does."""
    total = torch.tpu.mem_get_info()[1]
    if not on_tpu():
        assert total == 16 << 30
    with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory. Tried to allocate 4.00 TiB"):
        torch.empty(2**40, device="tpu")
    used = torch.tpu.memory_allocated()
    try:
        torch.tpu.set_per_process_memory_fraction((used + (64 << 20)) / total)
        assert torch.tpu.get_per_process_memory_fraction() < 1.0
        a = torch.empty(8 << 20, device="tpu")  # 32 MiB: fits
        with pytest.raises(torch.OutOfMemoryError, match="is held by live tpu tensors"):
            torch.empty(16 << 20, device="tpu")  # 64 MiB more: does not
        del a
        b = torch.empty(8 << 20, device="tpu")  # freed memory counts again
        del b
        with pytest.raises(ValueError):
            torch.tpu.set_per_process_memory_fraction(1.5)
        with pytest.raises(TypeError):
            torch.tpu.set_per_process_memory_fraction(1)
    finally:
        torch.tpu.set_per_process_memory_fraction(1.0)
    assert torch.tpu.get_per_process_memory_fraction() == 1.0
    if not on_tpu():
        t = torch.empty(1 << 20, device="tpu")
        assert torch.tpu.mem_get_info() == (total - torch.tpu.memory_allocated(), total)
        del t


def test_cuda_parity_table_is_current():
    import pathlib

    from torchtpu import cuda_parity

    doc = (pathlib.Path(__file__).parents[1] / "docs" / "cuda_parity.md").read_text()
    assert doc == cuda_parity.markdown(), "regenerate: python -m torchtpu.cuda_parity > docs/cuda_parity.md"
    assert not set(cuda_parity.NOT_APPLICABLE) - set(cuda_parity.cuda_callables())  # no stale reasons


def test_torch_cuda_names_training_scripts_call():
    t = torch.empty(1024, device="tpu")
    assert torch.tpu.memory_cached() == torch.tpu.memory_reserved()
    assert torch.tpu.max_memory_cached() == torch.tpu.max_memory_reserved()
    torch.tpu.reset_max_memory_cached()
    nested = torch.tpu.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == torch.tpu.memory_allocated()
    torch.tpu.reset_accumulated_memory_stats()
    assert torch.tpu.memory_stats()["allocation.all.allocated"] == 0
    assert torch.tpu.device_memory_used() > 0
    assert torch.tpu.is_tf32_supported()
    major, minor = torch.tpu.get_device_capability()
    assert (major, minor) == ((5, 0) if "v5" in torch.tpu.get_device_name() else (0, 0))
    s = torch.tpu.current_stream()
    with torch.tpu.StreamContext(s) as inside:
        assert inside is s
    del t
    torch.tpu.reset_peak_host_memory_stats()
    torch.tpu.reset_accumulated_host_memory_stats()
    before = torch.tpu.host_memory_stats()
    p = torch.empty(1000).pin_memory()
    during = torch.tpu.host_memory_stats()
    assert during["allocated_bytes.current"] == before["allocated_bytes.current"] + 4000
    assert during["allocations.allocated"] == before["allocations.allocated"] + 1
    del p
    after = torch.tpu.host_memory_stats_as_nested_dict()
    assert after["allocated_bytes"]["current"] == before["allocated_bytes.current"]
    assert after["allocated_bytes"]["peak"] >= 4000


@pytest.mark.fresh_process
def test_python_m_torchtpu_reports_and_checks():
    """``python -m torchtpu --check``: the device, plugin, PJRT API, cache tiers, mode and precision,
    then a self-test against the CPU; the TORCH_TPU_* variables set are listed."""
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", "torchtpu", "--check"], capture_output=True, text=True,
                       timeout=300, check=False, env={**os.environ, "TORCH_TPU_CHECK_NAN": "0"})
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    for key in ("plugin", "PJRT C API", "platform", "tpu:0", "eager mode", "float32 matmul precision",
                "compile cache, tier 2", "compile cache, tier 3", "TORCH_TPU_CHECK_NAN=0", "self-test:"):
        assert key in r.stdout, (key, r.stdout)
    assert r.stdout.count("  pass  ") == 5 and "FAIL" not in r.stdout, r.stdout


def test_sync_debug_mode_reports_host_waits():
    """torch.tpu.set_sync_debug_mode as torch.cuda's: "warn" warns and "error" raises at each
    operation that makes the host wait for the device (reads, .item(), nonzero's size read);
    launching ops does not."""
    import warnings

    x = torch.arange(6.0, device="tpu")
    assert torch.tpu.get_sync_debug_mode() == 0
    try:
        torch.tpu.set_sync_debug_mode("warn")
        assert torch.tpu.get_sync_debug_mode() == 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = x * 2 + 1
        assert not caught
        with pytest.warns(UserWarning, match="called a synchronizing TPU operation"):
            assert y.sum().item() == 36.0
        with pytest.warns(UserWarning, match="synchronizing"):
            (x > 2).nonzero()
        torch.tpu.set_sync_debug_mode(2)
        with pytest.raises(RuntimeError, match="synchronizing TPU operation"):
            x.cpu()
        with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
            torch.tpu.set_sync_debug_mode("loud")
    finally:
        torch.tpu.set_sync_debug_mode("default")
    assert torch.equal(x.cpu(), torch.arange(6.0))


def test_memory_snapshot_lists_the_buffers_held():
    """torch.tpu.memory_snapshot: torch.cuda's segment layout, one segment per device buffer this
    process holds, with its shape and dtype; a freed tensor's buffer leaves it."""
    big = torch.ones(256, 1024, device="tpu") * 3  # 1 MiB, materialized
    big.cpu()
    snap = torch.tpu.memory_snapshot()
    mine = [s for s in snap if s["shape"] == [256, 1024] and s["dtype"] == "float32"]
    assert mine and mine[0]["total_size"] == 256 * 1024 * 4 and mine[0]["device"] == 0
    assert mine[0]["blocks"][0]["state"] == "active_allocated"
    assert [s["total_size"] for s in snap] == sorted((s["total_size"] for s in snap), reverse=True)
    count = len(mine)
    del big
    import gc

    gc.collect()
    torch.tpu.synchronize()
    assert len([s for s in torch.tpu.memory_snapshot() if s["shape"] == [256, 1024]]) < count


def test_can_device_access_peer():
    assert torch.tpu.can_device_access_peer(0, 0)
    assert torch.tpu.can_device_access_peer("tpu:0", torch.device("tpu", 0))
    with pytest.raises(RuntimeError, match="Invalid peer id"):
        torch.tpu.can_device_access_peer(0, torch.tpu.device_count())
