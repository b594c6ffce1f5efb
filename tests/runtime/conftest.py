"""Shared fixtures: the selected plugin and one client for the session.

On the CPU emulator the runtime tests get a client of their own with two devices. On any other
plugin (a TPU) only one client may hold the chip, so they share torchtpu's process client and
its devices; tests that need a second device ask for ``other_device`` and are skipped where the
host has one chip.
"""

from __future__ import annotations

import numpy as np
import pytest

from torchtpu.runtime import Client, Executable, load_plugin, plugins, resolve_plugin_path

ON_CPU_PLUGIN = plugins.selected_kind() == "cpu"

ADD_F32 = """module @m {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>) {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"""


@pytest.fixture(scope="session")
def client() -> Client:
    if ON_CPU_PLUGIN:
        return Client(load_plugin(resolve_plugin_path("cpu")), {"cpu_device_count": 2})
    from torchtpu import _device_state

    return _device_state.client()


@pytest.fixture(scope="session")
def plugin(client):
    return client.plugin


@pytest.fixture
def other_device(client) -> int:
    """The index of a device other than 0."""
    if len(client.devices) < 2:
        pytest.skip(f"needs a second device; this {client.platform_name} host has one")
    return len(client.devices) - 1


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

