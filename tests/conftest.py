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
