"""Real Hugging Face architectures on `tpu` against CPU.

Each test builds a small randomly initialised configuration (no download), runs the
same forward pass on CPU and on `tpu`, compares the logits, then runs backward from
the model's own loss and compares the gradient of every parameter.  Matmuls run at
`highest` so the comparison measures lowering correctness, not bf16 rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB = 96
HIDDEN = 32
HEADS = 4
LAYERS = 2
FFN = 64


def _decoder_only(config_cls, model_cls, **extra):
    cfg = config_cls(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
                     num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     num_key_value_heads=2, max_position_embeddings=64, **extra)
    return model_cls(cfg)


def _token_batch(batch: int = 2, seq: int = 12, vocab: int = VOCAB) -> dict:
    ids = torch.randint(3, vocab, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, :3] = 0  # left padding on one row exercises the attention mask
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


def build_llama():
    m = _decoder_only(transformers.LlamaConfig, transformers.LlamaForCausalLM)
    return m, _token_batch()


def build_qwen2():
    m = _decoder_only(transformers.Qwen2Config, transformers.Qwen2ForCausalLM)
    return m, _token_batch()


def build_qwen3():
    m = _decoder_only(transformers.Qwen3Config, transformers.Qwen3ForCausalLM, head_dim=8)
    return m, _token_batch()


def build_mistral():
    m = _decoder_only(transformers.MistralConfig, transformers.MistralForCausalLM, sliding_window=8)
    return m, _token_batch()


def build_gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                  n_positions=64)
    return transformers.GPT2LMHeadModel(cfg), _token_batch()


def build_gpt_neox():
    cfg = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                     num_attention_heads=HEADS, intermediate_size=FFN,
                                     max_position_embeddings=64)
    return transformers.GPTNeoXForCausalLM(cfg), _token_batch()


def _encoder_kwargs() -> dict:
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                intermediate_size=FFN, max_position_embeddings=64)


def _masked_lm_batch() -> dict:
    batch = _token_batch()
    labels = torch.full_like(batch["labels"], -100)
    labels[:, 4:8] = batch["labels"][:, 4:8]
    batch["labels"] = labels
    batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    return batch


def build_bert():
    return transformers.BertForMaskedLM(transformers.BertConfig(**_encoder_kwargs())), _masked_lm_batch()


def build_roberta():
    cfg = transformers.RobertaConfig(**_encoder_kwargs(), pad_token_id=1, type_vocab_size=1)
    batch = _masked_lm_batch()
    del batch["token_type_ids"]
    return transformers.RobertaForMaskedLM(cfg), batch


def _seq2seq_batch() -> dict:
    batch = _token_batch()
    batch["labels"] = torch.randint(3, VOCAB, (2, 7))
    return batch


def build_t5():
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=FFN, num_layers=LAYERS,
                                num_decoder_layers=LAYERS, num_heads=HEADS, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg), _seq2seq_batch()


def build_bart():
    cfg = transformers.BartConfig(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS,
                                  decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                                  decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                                  max_position_embeddings=64)
    return transformers.BartForConditionalGeneration(cfg), _seq2seq_batch()


def build_vit():
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=HIDDEN,
                                 num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                 intermediate_size=FFN, num_labels=5)
    batch = {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([1, 4])}
    return transformers.ViTForImageClassification(cfg), batch


def build_clip():
    text = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, max_position_embeddings=64)
    vision = dict(image_size=32, patch_size=8, hidden_size=HIDDEN, intermediate_size=FFN,
                  num_hidden_layers=LAYERS, num_attention_heads=HEADS)
    cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    batch = _token_batch()
    del batch["labels"]
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    batch["pixel_values"] = torch.randn(2, 3, 32, 32)
    batch["return_loss"] = True
    return transformers.CLIPModel(cfg), batch


def build_whisper():
    cfg = transformers.WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=HIDDEN, encoder_layers=LAYERS,
                                     decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                                     decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                                     max_source_positions=20, max_target_positions=32,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    batch = {"input_features": torch.randn(2, 16, 40), "labels": torch.randint(3, VOCAB, (2, 6))}
    return transformers.WhisperForConditionalGeneration(cfg), batch


def build_wav2vec2():
    cfg = transformers.Wav2Vec2Config(vocab_size=24, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, intermediate_size=FFN,
                                      conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                                      num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                                      do_stable_layer_norm=True, feat_extract_norm="layer",
                                      ctc_loss_reduction="mean", pad_token_id=0,
                                      mask_time_prob=0.0, layerdrop=0.0)
    batch = {"input_values": torch.randn(2, 800), "labels": torch.randint(1, 24, (2, 5))}
    return transformers.Wav2Vec2ForCTC(cfg), batch


BUILDERS = {
    "llama": build_llama, "qwen2": build_qwen2, "qwen3": build_qwen3, "mistral": build_mistral,
    "gpt2": build_gpt2, "gpt_neox": build_gpt_neox, "bert": build_bert, "roberta": build_roberta,
    "t5": build_t5, "bart": build_bart, "vit": build_vit, "clip": build_clip, "whisper": build_whisper,
    "wav2vec2": build_wav2vec2,
}


def _to(batch: dict, device: str) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _logits(out) -> torch.Tensor:
    if getattr(out, "logits", None) is not None:
        return out.logits
    return out.logits_per_image  # CLIP


def _disable_dropout(model: torch.nn.Module) -> None:
    """Zero every dropout, module or functional (float attributes such as ``attention_dropout``)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for attr, value in vars(module).items():
            if "drop" in attr and isinstance(value, float):
                setattr(module, attr, 0.0)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_forward_and_backward_match_cpu(name: str):
    torch.manual_seed(0)
    cpu_model, batch = BUILDERS[name]()
    cpu_model.train()  # dropout is zeroed below, so train() keeps results deterministic
    _disable_dropout(cpu_model)
    tpu_model = copy.deepcopy(cpu_model).to("tpu")

    with torch.tpu.precision("highest"):
        cpu_out = cpu_model(**batch)
        tpu_out = tpu_model(**_to(batch, "tpu"))
        torch.testing.assert_close(_logits(tpu_out).cpu(), _logits(cpu_out), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(tpu_out.loss.cpu(), cpu_out.loss, rtol=1e-4, atol=1e-5)
        cpu_out.loss.backward()
        tpu_out.loss.backward()

    cpu_params = dict(cpu_model.named_parameters())
    checked = 0
    for pname, p in tpu_model.named_parameters():
        ref = cpu_params[pname].grad
        if ref is None:
            assert p.grad is None, pname
            continue
        assert p.grad is not None and p.grad.device.type == "tpu", pname
        torch.testing.assert_close(p.grad.cpu(), ref, rtol=1e-3, atol=1e-4, msg=lambda m, n=pname: f"{n}: {m}")
        checked += 1
    assert checked > 10


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_greedy_generate_matches_cpu(name: str):
    torch.manual_seed(0)
    cpu_model, batch = BUILDERS[name]()
    cpu_model.eval()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    prompt = batch["input_ids"][:1, :5]
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.tpu.precision("highest"):
        expected = cpu_model.generate(prompt, **kwargs)
        got = tpu_model.generate(prompt.to("tpu"), **kwargs)
    assert got.device.type == "tpu"
    assert torch.equal(got.cpu(), expected)
