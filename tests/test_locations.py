"""Program locations: every emitted op carries the PyTorch op (and in a compiled graph the module)
it lowers, which XLA keeps as its HLO instructions' op_name, so a TPU profile or an optimized HLO
dump names the source of each fusion, copy and kernel call (lowering/builder.py, Builder.located)."""

import re

import pytest
import torch

from torchtpu.engine import compile_cache
from torchtpu.lowering.builder import Builder


def _locations(text: str) -> list[str]:
    return re.findall(r'loc\("((?:[^"\\]|\\.)*)"\)', text)


def test_ops_emitted_inside_located_carry_the_name_and_the_name_is_restored_after():
    b = Builder()
    x = b.arg((4,), torch.float32)
    plain = b.add(x, x)
    with b.located("blocks.0.attn/aten.add.Tensor"):
        inner = b.mul(plain, x)
        with b.located('odd "name" \\ here\n'):
            b.neg(inner)
        after_nested = b.add(inner, x)
    text = b.module([after_nested])
    lines = text.splitlines()
    assert not _locations(next(ln for ln in lines if plain.name + " =" in ln))
    assert _locations(next(ln for ln in lines if inner.name + " =" in ln)) == ["blocks.0.attn/aten.add.Tensor"]
    assert _locations(next(ln for ln in lines if after_nested.name + " =" in ln)) == [
        "blocks.0.attn/aten.add.Tensor"]
    assert 'odd \\"name\\" \\\\ here' in text  # escaped; the newline dropped


def _captured_texts(fn) -> list[str]:
    texts: list[str] = []
    real = compile_cache.compile

    def keep(text, **kw):
        texts.append(text if isinstance(text, str) else bytes(text).decode())
        return real(text, **kw)

    compile_cache.compile = keep
    try:
        fn()
        torch.tpu.synchronize()
    finally:
        compile_cache.compile = real
    return texts


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.body(x))


def test_a_compiled_graphs_ops_are_located_at_their_modules_forward_and_backward():
    torch.manual_seed(0)
    net = _Net().to("tpu")
    step = torch.compile(net, backend="tpu")
    x = torch.randn(4, 8, device="tpu", requires_grad=True)

    def run():
        step(x).sum().backward()

    locations = {name for text in _captured_texts(run) for name in _locations(text)}
    # forward: addmm under each Linear; backward: mm (the weights' and inputs' gradients) under the same
    assert "body.0/aten.addmm.default" in locations and "head/aten.addmm.default" in locations
    assert "head/aten.mm.default" in locations
    assert any(name.startswith("body.1/aten.gelu") for name in locations)


def test_eager_ops_are_located_at_their_aten_op():
    from torchtpu.engine import executor

    a = torch.randn(3, 5, device="tpu")
    executor.cache_clear()  # (another test of this process may have compiled the same op)

    def run():
        torch.atan2(a, a + 1.5).cpu()

    assert "aten.atan2.default" in {n for t in _captured_texts(run) for n in _locations(t)}


def test_xla_keeps_a_location_as_the_hlo_instructions_op_name():
    """Compiled by XLA (JAX's CPU client: the same StableHLO-to-HLO translation a TPU's compile
    runs), the location is the optimized instruction's op_name metadata."""
    jax = pytest.importorskip("jax", reason="JAX is an optional dependency (the dev extra installs it)")
    from jax._src import compiler, xla_bridge
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir

    b = Builder()
    x = b.arg((16,), torch.float32)
    with b.located("blocks.3.mlp/aten.tanh.default"):
        y = b.unary("tanh", x)
    text = b.module([y])
    backend = xla_bridge.get_backend("cpu")
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        exe = compiler.backend_compile_and_load(backend, module, xc.DeviceList((jax.devices("cpu")[0],)),
                                                compiler.get_compile_options(1, 1, backend=backend), [])
    hlo = exe.hlo_modules()[0].to_string()
    assert 'op_name="blocks.3.mlp/aten.tanh.default"' in hlo
