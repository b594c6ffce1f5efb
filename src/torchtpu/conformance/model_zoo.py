"""Small model definitions for the model checks: Hugging Face architectures at
tiny random configurations (no download) and plain-PyTorch CNN / recommender
families.  Each builder returns ``(model, inputs, loss_fn)``: the model on CPU,
its CPU inputs (positional args and keyword args), and a function from the
model's output to a scalar loss."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 96
HIDDEN = 32
HEADS = 4
LAYERS = 2
FFN = 64

Case = tuple[nn.Module, tuple[tuple, dict], Callable[[Any], torch.Tensor]]


def _own_loss(out: Any) -> torch.Tensor:
    return out.loss


def _token_batch(batch: int = 2, seq: int = 12) -> dict:
    ids = torch.randint(3, VOCAB, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, :3] = 0  # left padding on one row exercises the attention mask
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


def _masked_lm_batch(token_types: bool = True) -> dict:
    batch = _token_batch()
    labels = torch.full_like(batch["labels"], -100)
    labels[:, 4:8] = batch["labels"][:, 4:8]
    batch["labels"] = labels
    if token_types:
        batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    return batch


def _seq2seq_batch() -> dict:
    batch = _token_batch()
    batch["labels"] = torch.randint(3, VOCAB, (2, 7))
    return batch


def _hf(model: nn.Module, batch: dict) -> Case:
    return model, ((), batch), _own_loss


# -- Hugging Face architectures ------------------------------------------------------
def _causal_lm(config_name: str, model_name: str, **extra: Any) -> Callable[[], Case]:
    def build() -> Case:
        import transformers

        cfg = getattr(transformers, config_name)(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=64, **extra)
        return _hf(getattr(transformers, model_name)(cfg), _token_batch())

    return build


def _gpt2() -> Case:
    import transformers

    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=64,
                                  bos_token_id=1, eos_token_id=2)
    return _hf(transformers.GPT2LMHeadModel(cfg), _token_batch())


def _gpt_neox() -> Case:
    import transformers

    cfg = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                     num_attention_heads=HEADS, intermediate_size=FFN, max_position_embeddings=64)
    return _hf(transformers.GPTNeoXForCausalLM(cfg), _token_batch())


def _encoder_kwargs() -> dict:
    return {"vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                "intermediate_size": FFN, "max_position_embeddings": 64}


def _bert() -> Case:
    import transformers

    return _hf(transformers.BertForMaskedLM(transformers.BertConfig(**_encoder_kwargs())), _masked_lm_batch())


def _roberta() -> Case:
    import transformers

    cfg = transformers.RobertaConfig(**_encoder_kwargs(), pad_token_id=1, type_vocab_size=1)
    return _hf(transformers.RobertaForMaskedLM(cfg), _masked_lm_batch(token_types=False))


def _t5() -> Case:
    import transformers

    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=8, d_ff=FFN, num_layers=LAYERS,
                                num_decoder_layers=LAYERS, num_heads=HEADS, decoder_start_token_id=0)
    return _hf(transformers.T5ForConditionalGeneration(cfg), _seq2seq_batch())


def _bart() -> Case:
    import transformers

    cfg = transformers.BartConfig(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                  encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                                  encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_position_embeddings=64)
    return _hf(transformers.BartForConditionalGeneration(cfg), _seq2seq_batch())


def _vit() -> Case:
    import transformers

    cfg = transformers.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=HIDDEN,
                                 num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
                                 num_labels=5)
    batch = {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([1, 4])}
    return _hf(transformers.ViTForImageClassification(cfg), batch)


def _clip() -> Case:
    import transformers

    text = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
                "num_attention_heads": HEADS, "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2}
    vision = {"image_size": 32, "patch_size": 8, "hidden_size": HIDDEN, "intermediate_size": FFN,
                  "num_hidden_layers": LAYERS, "num_attention_heads": HEADS}
    cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    batch = _token_batch()
    del batch["labels"]
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    batch["pixel_values"] = torch.randn(2, 3, 32, 32)
    batch["return_loss"] = True
    return _hf(transformers.CLIPModel(cfg), batch)


def _whisper() -> Case:
    import transformers

    cfg = transformers.WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=HIDDEN, encoder_layers=LAYERS,
                                     decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                                     decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                                     max_source_positions=20, max_target_positions=32, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    batch = {"input_features": torch.randn(2, 16, 40), "labels": torch.randint(3, VOCAB, (2, 6))}
    return _hf(transformers.WhisperForConditionalGeneration(cfg), batch)


def _wav2vec2() -> Case:
    import transformers

    cfg = transformers.Wav2Vec2Config(vocab_size=24, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, intermediate_size=FFN, conv_dim=(16, 16, 16),
                                      conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
                                      num_conv_pos_embedding_groups=4, do_stable_layer_norm=True,
                                      feat_extract_norm="layer", ctc_loss_reduction="mean", pad_token_id=0,
                                      mask_time_prob=0.0, layerdrop=0.0)  # both are random in training
    batch = {"input_values": torch.randn(2, 800), "labels": torch.randint(1, 24, (2, 5))}
    return _hf(transformers.Wav2Vec2ForCTC(cfg), batch)


HF_MODELS: dict[str, Callable[[], Case]] = {
    "llama": _causal_lm("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": _causal_lm("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": _causal_lm("Qwen3Config", "Qwen3ForCausalLM", head_dim=8),
    "mistral": _causal_lm("MistralConfig", "MistralForCausalLM", sliding_window=8),
    "gpt2": _gpt2, "gpt_neox": _gpt_neox, "bert": _bert, "roberta": _roberta, "t5": _t5, "bart": _bart,
    "vit": _vit, "clip": _clip, "whisper": _whisper, "wav2vec2": _wav2vec2,
}
GENERATE_MODELS = ("llama", "gpt2")


# -- plain PyTorch families ----------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2), BasicBlock(16, 32, 2))
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(4, cout), nn.SiLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down1 = _double_conv(3, 8)
        self.down2 = _double_conv(8, 16)
        self.bottom = _double_conv(16, 32)
        self.up2 = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.dec2 = _double_conv(32, 16)
        self.dec1 = _double_conv(16 + 8, 8)
        self.out = nn.Conv2d(8, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        b = self.bottom(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], dim=1))
        u1 = F.interpolate(u2, scale_factor=2, mode="bilinear", align_corners=False)
        return self.out(self.dec1(torch.cat([u1, d1], dim=1)))


class DLRM(nn.Module):
    """Embedding-bag tables for sparse features, an MLP for dense ones, pairwise dot interactions."""

    def __init__(self, table_sizes: tuple[int, ...] = (50, 30, 20), dim: int = 8, dense: int = 5) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum") for n in table_sizes)
        self.bottom = nn.Sequential(nn.Linear(dense, 16), nn.ReLU(), nn.Linear(16, dim), nn.ReLU())
        features = len(table_sizes) + 1
        self.register_buffer("pairs", torch.triu_indices(features, features, offset=1), persistent=False)
        self.top = nn.Sequential(nn.Linear(dim + features * (features - 1) // 2, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense: torch.Tensor, indices: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        embedded = [table(i, o) for table, i, o in zip(self.tables, indices, offsets)]
        feats = torch.stack([x, *embedded], dim=1)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        flat = inter[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, flat], dim=1)).squeeze(1)


def _resnet() -> Case:
    y = torch.tensor([1, 3, 0, 9])
    return ResNet(), ((torch.randn(4, 3, 16, 16),), {}), lambda out: F.cross_entropy(out, y.to(out.device))


def _unet() -> Case:
    mask = (torch.rand(2, 1, 16, 16) > 0.5).float()
    return (UNet(), ((torch.randn(2, 3, 16, 16),), {}),
            lambda out: F.binary_cross_entropy_with_logits(out, mask.to(out.device)))


def _dlrm() -> Case:
    batch = 6
    indices, offsets = [], []
    for n in (50, 30, 20):
        lengths = torch.randint(1, 4, (batch,))
        indices.append(torch.randint(0, n, (int(lengths.sum()),)))
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]]))
    clicks = torch.randint(0, 2, (batch,)).float()
    return (DLRM(), ((torch.randn(batch, 5), indices, offsets), {}),
            lambda out: F.binary_cross_entropy_with_logits(out, clicks.to(out.device)))


PLAIN_MODELS: dict[str, Callable[[], Case]] = {"resnet": _resnet, "unet": _unet, "dlrm": _dlrm}
