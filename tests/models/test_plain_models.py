"""Plain-PyTorch model families on `tpu` against CPU: a ResNet-style CNN, a U-Net-style
encoder-decoder and a DLRM-style recommender (see torchtpu.conformance.model_zoo).
Two SGD steps: output, loss, every gradient, batch-norm running statistics and the
final eval output must match CPU."""

from __future__ import annotations

import pytest

from torchtpu.conformance import model_zoo
from torchtpu.conformance.models import check_model


@pytest.mark.parametrize("name", sorted(model_zoo.PLAIN_MODELS))
def test_train_steps_match_cpu(name: str):
    check_model(name)
