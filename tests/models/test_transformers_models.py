"""Real Hugging Face architectures on `tpu` against CPU (tiny random configs, no download).

Each model trains two SGD steps on CPU and on `tpu`; logits, loss, every parameter
gradient and the final eval output must match (see torchtpu.conformance.models).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from torchtpu.conformance import model_zoo
from torchtpu.conformance.models import check_generate, check_model


@pytest.mark.parametrize("name", sorted(model_zoo.HF_MODELS))
def test_train_steps_match_cpu(name: str):
    check_model(name)


@pytest.mark.parametrize("name", model_zoo.GENERATE_MODELS)
def test_greedy_generate_matches_cpu(name: str):
    check_generate(name)
