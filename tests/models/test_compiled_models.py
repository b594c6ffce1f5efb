"""Real models through ``torch.compile(backend="tpu")``: two training steps and an eval
forward match CPU eager (see torchtpu.conformance.models.check_model)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from torchtpu.conformance.models import check_model


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_compiled_training_matches_cpu(name: str):
    # GPT-2 and Llama graphs hold tensor constants (get_attr nodes)
    check_model(name, compile_kwargs={})


def test_compiled_dynamic_t5_matches_cpu():
    # symbolic shapes: the shape-propagation pass must see get_attr constants as meta tensors
    check_model("t5", compile_kwargs={"dynamic": True})
