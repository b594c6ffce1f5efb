"""torch.compile(..., mode="reduce-overhead"): inference graphs replayed from TPU graphs
(compile/replayed.py), against the same function compiled plainly and run on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

from torchtpu.compile import replayed

HIGHEST = "highest"  # float32-accurate products: the replayed program and the compiled one round alike


def _decoder(device: str, seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).to(device), torch.zeros(6, 8, device=device)


def _step(model: torch.nn.Module, cache: torch.Tensor):
    def step(x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = model(x)
        cache.index_copy_(0, pos, y)  # written in place: read in place by the replay
        return y + cache.sum(0, keepdim=True) * 0.1, pos + 1, cache.sum()

    return step


def _generate(step, x: torch.Tensor, pos: torch.Tensor, n: int) -> list[torch.Tensor]:
    outs = []
    with torch.no_grad():
        for _ in range(n):
            x, pos, total = step(x, pos)
            outs.append(torch.stack([x.flatten(), total.expand(8)]))  # (earlier results must keep their values)
    return outs


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug"])
def test_a_replayed_decoding_loop_computes_what_cpu_does(mode):
    x0 = torch.randn(1, 8)
    model_cpu, cache_cpu = _decoder("cpu")
    want = _generate(_step(model_cpu, cache_cpu), x0, torch.zeros(1, dtype=torch.long), 5)
    before = dict(replayed.stats)
    torch.set_float32_matmul_precision(HIGHEST)
    try:
        with torch.tpu.eager_mode(mode):
            model, cache = _decoder("tpu")
            step = torch.compile(_step(model, cache), backend="tpu", mode="reduce-overhead")
            got = _generate(step, x0.to("tpu"), torch.zeros(1, dtype=torch.long, device="tpu"), 5)
    finally:
        torch.set_float32_matmul_precision("medium")
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.cpu(), cache_cpu, rtol=1e-5, atol=1e-5)
    assert replayed.stats["captures"] == before["captures"] + 1  # at the second call
    assert replayed.stats["replays"] == before["replays"] + 4


def test_a_new_model_and_cache_are_read_not_the_captured_ones():
    """A capture reads its tensors' storages in place: a call on other storages (a new model and KV cache
    of the same shapes, which Dynamo's guards let reuse the graph) runs as compiled and captures again."""
    x0 = torch.randn(1, 8)
    torch.set_float32_matmul_precision(HIGHEST)
    try:
        results = []
        for seed in (0, 1):
            model, cache = _decoder("tpu", seed)
            step = torch.compile(_step(model, cache), backend="tpu", mode="reduce-overhead")
            results.append(_generate(step, x0.to("tpu"), torch.zeros(1, dtype=torch.long, device="tpu"), 4))
            model_cpu, cache_cpu = _decoder("cpu", seed)
            want = _generate(_step(model_cpu, cache_cpu), x0, torch.zeros(1, dtype=torch.long), 4)
            for g, w in zip(results[-1], want):
                torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_float32_matmul_precision("medium")


def test_new_storages_at_every_call_end_in_compiled_calls_with_a_warning():
    model, _ = _decoder("tpu")
    x = torch.randn(1, 8, device="tpu")

    def f(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        cache.add_(model(x))  # a tensor it writes, new at every call: captured again each time
        return cache.sum()

    g = torch.compile(f, backend="tpu", mode="reduce-overhead")
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2 * replayed.MAX_CAPTURES + 4):
            cache = torch.ones(1, 8, device="tpu")
            want = (torch.ones(1, 8) + model(x).cpu()).sum()
            torch.testing.assert_close(g(x, cache).cpu(), want, rtol=1e-2, atol=1e-2)
            torch.testing.assert_close(cache.cpu(), torch.ones(1, 8) + model(x).cpu(), rtol=1e-2, atol=1e-2)
    assert any("reduce-overhead" in str(w.message) and "captures made" in str(w.message) for w in caught)


def test_training_graphs_and_default_backend_routing():
    """With autograd on, graphs run as compiled; torch.compile's default backend with
    mode="reduce-overhead" (Inductor's CUDA graphs) replays tpu inference graphs."""
    model, _ = _decoder("tpu")
    x = torch.randn(2, 8, device="tpu")
    before = dict(replayed.stats)
    g = torch.compile(lambda x: model(x).sum(), backend="tpu", mode="reduce-overhead")
    for _ in range(3):
        g(x).backward()
    assert replayed.stats["replays"] == before["replays"]
    h = torch.compile(lambda x: model(x) * 2, mode="reduce-overhead")
    with torch.no_grad():
        outs = [h(x) for _ in range(3)]
    assert replayed.stats["replays"] == before["replays"] + 2  # the first call runs as compiled
    for o in outs:
        torch.testing.assert_close(o.cpu(), model(x).detach().cpu() * 2)


def test_outputs_that_are_or_view_an_argument():
    """An argument returned, or a view of it, is the call's own argument (or its view), not a copy."""
    def f(x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        cache.add_(x)
        return cache, cache[1], x, x.t() * 2

    cache, cache_cpu = torch.zeros(3, 3, device="tpu"), torch.zeros(3, 3)
    g = torch.compile(f, backend="tpu", mode="reduce-overhead")
    before = replayed.stats["replays"]
    with torch.no_grad():
        for k in range(4):
            x_cpu = torch.arange(9.0).reshape(3, 3) + k
            got = g(x_cpu.to("tpu"), cache)
            want = f(x_cpu, cache_cpu)
            for a, b in zip(got, want):
                torch.testing.assert_close(a.cpu(), b)
            assert got[0] is cache
    assert replayed.stats["replays"] == before + 3  # (calls 2-4: the first runs as compiled)
    cache.add_(1)  # the returned view is a view of the argument, as in eager
    torch.testing.assert_close(got[1].cpu(), cache_cpu[1] + 1)


def test_the_inputs_a_graph_writes_are_found_in_positional_and_keyword_arguments():
    from torchtpu.compile.replayed import _mutated_inputs

    g = torch.fx.Graph()
    a, b, c = g.placeholder("a"), g.placeholder("b"), g.placeholder("c")
    g.output((g.call_function(torch.ops.aten.copy_.default, (a, c)),
              g.call_function(torch.ops.aten.add.out, (c, c), {"out": b}),
              g.call_function(torch.ops.aten.add.Tensor, (c, c))))
    assert _mutated_inputs(torch.fx.GraphModule(torch.nn.Module(), g)) == {0, 1}


def test_the_native_storage_checks_tell_a_tensors_own_storage_and_offset():
    """A replay's checks run natively (_C._same_storages for the tensors read in place,
    _C._weak_buffers for the buffers a TPUGraph reads): each says no where Python's loops did."""
    import gc
    import weakref

    from torchtpu import _C, runtime
    from torchtpu.engine import deferred

    base = torch.arange(8.0, device="tpu")
    other = torch.arange(8.0, device="tpu")
    view = base[2:]
    checks = [(0, weakref.ref(base.untyped_storage()), 0), (1, weakref.ref(base.untyped_storage()), 2)]
    assert _C._same_storages([base, view], checks)
    assert _C._same_storages((base.view(2, 4), view), checks)  # another tensor object on the storage
    assert not _C._same_storages([other, view], checks)  # another storage
    assert not _C._same_storages([base, base[1:]], checks)  # another offset
    assert not _C._same_storages([base, 2.0], checks)  # not a tensor
    assert not _C._same_storages([base], checks)  # too few arguments
    gone = torch.ones(2, device="tpu")
    dead = [(0, weakref.ref(gone.untyped_storage()), 0)]
    del gone
    gc.collect()
    assert not _C._same_storages([base], dead)  # (a storage freed since the capture)

    refs = [weakref.ref(base.untyped_storage()), weakref.ref(other.untyped_storage())]
    buffers = _C._weak_buffers(refs, runtime.Buffer)
    assert buffers == [getattr(base.untyped_storage(), deferred._ATTR), getattr(other.untyped_storage(), deferred._ATTR)]
    assert _C._weak_buffers([*refs, dead[0][1]], runtime.Buffer) is None  # freed
    assert _C._weak_buffers([weakref.ref(torch.UntypedStorage(4))], runtime.Buffer) is None  # no buffer
    assert _C._weak_buffers(refs, object) is None  # a buffer of another type (a DeferAndFuse Pending)
