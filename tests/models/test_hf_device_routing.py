"""What a Hugging Face user writes to put a model on `tpu` (docs/huggingface.md): device_map with
accelerate installed, and pipeline(device=...) with a device name (an integer means CUDA-like
devices from a fixed list in transformers, and falls back to the CPU)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def _tiny_llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, eos_token_id=63)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("device_map", ["auto", "tpu", 0, {"": "tpu"}, {"": torch.device("tpu", 0)}])
def test_from_pretrained_device_map_places_the_model_on_tpu(tmp_path, device_map):
    # regression (issue 43): without accelerate, device_map="auto" left the model on the CPU
    _tiny_llama().save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map=device_map)
    assert {p.device for p in model.parameters()} == {torch.device("tpu", 0)}
    ids = torch.tensor([[1, 2, 3]], device="tpu")
    assert model(ids).logits.device.type == "tpu"


@pytest.mark.parametrize("device", ["tpu", "tpu:0", torch.device("tpu", 0)])
def test_pipeline_with_a_device_name_runs_on_tpu(device):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(62)} | {"<unk>": 62, "<eos>": 63}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    model = _tiny_llama()
    want = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")(
        "w1 w2 w3", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, device=device)
    assert pipe.device.type == "tpu" and next(pipe.model.parameters()).device.type == "tpu"
    with torch.tpu.precision("highest"):
        got = pipe("w1 w2 w3", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert got == want
