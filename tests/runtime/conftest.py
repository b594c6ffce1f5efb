"""Shared fixtures: one CPU plugin and one 2-device client for the session."""

from __future__ import annotations

import numpy as np
import pytest

from torchtpu.runtime import Client, Executable, load_plugin, resolve_plugin_path

ADD_F32 = """module @m {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>) {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"""


@pytest.fixture(scope="session")
def plugin():
    return load_plugin(resolve_plugin_path("cpu"))


@pytest.fixture(scope="session")
def client(plugin):
    return Client(plugin, {"cpu_device_count": 2})


@pytest.fixture(scope="session")
def add_exe(client) -> Executable:
    return client.compile(ADD_F32)


@pytest.fixture(scope="session")
def add_source() -> str:
    return ADD_F32


def _run(client: Client, exe: Executable, *arrays: np.ndarray, device: int = 0) -> list[np.ndarray]:
    """Put, execute, wait, fetch."""
    bufs = [client.buffer_from_host(a, device) for a in arrays]
    outs, event = exe.execute(bufs, device)
    event.wait()
    return [o.to_host() for o in outs]


@pytest.fixture(scope="session")
def run():
    """run(client, exe, *arrays, device=0) -> list of host results."""
    return _run
