import os

import pytest
import torch

from torchtpu.runtime import plugins

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# Test files about the CPU emulator itself, skipped on a real TPU (``make test-tpu``) with the reason.
_EMULATOR_ONLY_DIRS = {
    "runtime": "the PJRT runtime's own tests drive the CPU plugin directly (a TPU host has none, and a "
               "second client would contend for the chip)",
}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    kind = plugins.selected_kind()  # without loading it: loading libtpu holds the chip
    for item in items:
        parts = item.path.parts
        for name, reason in _EMULATOR_ONLY_DIRS.items():
            if "tests" in parts and name in parts[parts.index("tests") + 1:-1]:
                item.add_marker(pytest.mark.emulator_only(reason))
        marker = item.get_closest_marker("emulator_only")
        if marker is not None and kind != "cpu":
            item.add_marker(pytest.mark.skip(reason=f"CPU emulator only: {marker.args[0]}"))
