import os

import pytest
import torch

from torchtpu.runtime import plugins

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    kind = plugins.selected_kind()  # without loading it: loading libtpu holds the chip
    for item in items:
        marker = item.get_closest_marker("emulator_only")
        if marker is not None and kind != "cpu":
            item.add_marker(pytest.mark.skip(reason=f"CPU emulator only: {marker.args[0]}"))
    if kind != "cpu":
        # One process at a time may hold a TPU chip: the tests whose child processes use the device
        # run first, while this process has not opened it (the sort is stable).
        items.sort(key=lambda item: item.get_closest_marker("fresh_process") is None)


@pytest.fixture(autouse=True)
def _fresh_process_tests_leave_the_chip_to_their_children(request):
    yield
    if request.node.get_closest_marker("fresh_process") and plugins.selected_kind() != "cpu":
        from torchtpu import _device_state

        assert not _device_state.is_initialized(), (
            "a fresh_process test opened the device in the test process: the later ones' children "
            "could not open the chip")


@pytest.fixture
def module_texts(monkeypatch):
    """The StableHLO text of every program compiled while the test runs."""
    from torchtpu.engine import compile_cache

    texts = []
    real = compile_cache.compile

    def spy(text, **kwargs):
        texts.append(text if isinstance(text, str) else text.decode())
        return real(text, **kwargs)

    monkeypatch.setattr(compile_cache, "compile", spy)
    return texts
