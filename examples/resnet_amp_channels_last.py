"""ResNet training on synthetic images: DataLoader workers with pinned memory, channels-last, bf16 autocast.

    python examples/resnet_amp_channels_last.py                 # a ResNet-18-shaped net (half width), 32x32 images
    python examples/resnet_amp_channels_last.py --tiny --steps 4

The code is what one writes for a GPU, with "tpu" as the device. The images are random but each
class has its own mean colour, so the loss falls within a few dozen steps.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """Random images whose mean colour depends on the class."""

    def __init__(self, n: int, size: int, classes: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.colours = torch.randn(classes, 3, 1, 1, generator=g)
        self.size = size

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        label = self.labels[i]
        return torch.randn(3, self.size, self.size, generator=g) + self.colours[label], label


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...], blocks: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            for b in range(blocks):
                layers.append(BasicBlock(cin, w, 2 if b == 0 and i > 0 else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)).mean((2, 3)))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="tpu")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tiny", action="store_true", help="a small net on 16x16 images (a smoke test)")
    args = p.parse_args(argv)
    size, widths, blocks = (16, (8, 16), 1) if args.tiny else (32, (32, 64, 128, 256), 2)
    classes = 10
    torch.manual_seed(0)
    data = SyntheticImages(args.steps * args.batch, size, classes)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers, pin_memory=True,
                        drop_last=True)
    model = ResNet(widths, blocks, classes).to(args.device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    losses, start, first_step_s = [], time.perf_counter(), None
    for step, (images, labels) in enumerate(loader):
        images = images.to(args.device, non_blocking=True).to(memory_format=torch.channels_last)
        labels = labels.to(args.device, non_blocking=True)
        with torch.autocast(args.device, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step == 0:
            first_step_s = time.perf_counter() - start
            start = time.perf_counter()
    steps_per_s = (len(losses) - 1) / (time.perf_counter() - start) if len(losses) > 1 else float("nan")
    print(f"resnet on {args.device}: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"first step {first_step_s:.1f} s, then {steps_per_s:.2f} steps/s ({steps_per_s * args.batch:.0f} images/s)")
    return {"losses": losses, "steps_per_s": steps_per_s}


if __name__ == "__main__":
    main()
