"""Fine-tune a Llama with Hugging Face's `Trainer` on the tpu device.

    python examples/finetune_llama_trainer.py                       # a small random-init Llama, offline
    python examples/finetune_llama_trainer.py --model Qwen/Qwen2.5-0.5B  # a hub checkpoint, where online
    python examples/finetune_llama_trainer.py --tiny --steps 4

Nothing here names the device: `Trainer` (through accelerate) picks `tpu` as it picks `cuda`.
The data is a synthetic language (each sequence counts up from a random start, modulo the
vocabulary), so the loss falls quickly; `--bf16` trains under bf16 autocast.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from torch.utils.data import Dataset


class CountingSequences(Dataset):
    """Token sequences start, start + 1, ... (mod vocab): learnable from the previous token."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.starts = torch.randint(0, vocab, (n,), generator=g)
        self.seq, self.vocab = seq, vocab

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict:
        ids = (self.starts[i] + torch.arange(self.seq)) % self.vocab
        return {"input_ids": ids, "labels": ids.clone()}


def main(argv: list[str] | None = None) -> dict:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a hub name or path (default: a random-init Llama)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--tiny", action="store_true", help="a 2-layer d=32 model, sequences of 16 (a smoke test)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model)
        vocab = model.config.vocab_size
    else:
        hidden, layers, vocab = (32, 2, 128) if args.tiny else (512, 8, 8192)
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                             num_hidden_layers=layers, num_attention_heads=max(hidden // 64, 4),
                             num_key_value_heads=max(hidden // 64, 4), max_position_embeddings=512)
        model = LlamaForCausalLM(config)
    seq = 16 if args.tiny else args.seq
    data = CountingSequences(args.steps * args.batch, seq, vocab)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch,
                                     learning_rate=1e-3, warmup_steps=0, logging_steps=1, save_strategy="no",
                                     report_to=[], bf16=args.bf16, dataloader_pin_memory=True, seed=0)
        trainer = Trainer(model=model, args=training, train_dataset=data)
        result = trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    device = next(model.parameters()).device
    rate = result.metrics["train_steps_per_second"]
    print(f"Trainer on {device}: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"{rate:.2f} steps/s (first step's compiles included)")
    return {"device": str(device), "losses": losses, "steps_per_s": rate}


if __name__ == "__main__":
    main()
