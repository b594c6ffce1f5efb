import os

import pytest
import torch

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
