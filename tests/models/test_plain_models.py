"""Plain-PyTorch model families on `tpu` against CPU: a ResNet-style CNN, a U-Net-style
encoder-decoder and a DLRM-style recommender.  Forward output, loss, every parameter
gradient and (for batch norm) the running statistics must match CPU."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn


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


def _resnet_case():
    x = torch.randn(4, 3, 16, 16)
    y = torch.tensor([1, 3, 0, 9])
    return ResNet(), (x,), lambda out: F.cross_entropy(out, y.to(out.device))


def _unet_case():
    x = torch.randn(2, 3, 16, 16)
    mask = (torch.rand(2, 1, 16, 16) > 0.5).float()
    return UNet(), (x,), lambda out: F.binary_cross_entropy_with_logits(out, mask.to(out.device))


def _dlrm_case():
    batch = 6
    dense = torch.randn(batch, 5)
    indices, offsets = [], []
    for n in (50, 30, 20):
        lengths = torch.randint(1, 4, (batch,))
        indices.append(torch.randint(0, n, (int(lengths.sum()),)))
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]]))
    clicks = torch.randint(0, 2, (batch,)).float()
    return DLRM(), (dense, indices, offsets), lambda out: F.binary_cross_entropy_with_logits(out, clicks.to(out.device))


def _to(value, device: str):
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value.to(device)


@pytest.mark.parametrize("case", [_resnet_case, _unet_case, _dlrm_case], ids=["resnet", "unet", "dlrm"])
def test_train_step_matches_cpu(case):
    torch.manual_seed(0)
    cpu_model, inputs, loss_fn = case()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.05, momentum=0.9)
    tpu_opt = torch.optim.SGD(tpu_model.parameters(), lr=0.05, momentum=0.9)
    with torch.tpu.precision("highest"):
        for _ in range(2):
            cpu_out = cpu_model(*inputs)
            tpu_out = tpu_model(*_to(inputs, "tpu"))
            torch.testing.assert_close(tpu_out.cpu(), cpu_out, rtol=1e-4, atol=1e-4)
            cpu_loss, tpu_loss = loss_fn(cpu_out), loss_fn(tpu_out)
            torch.testing.assert_close(tpu_loss.cpu(), cpu_loss, rtol=1e-4, atol=1e-5)
            cpu_loss.backward()
            tpu_loss.backward()
            for (name, p), ref in zip(tpu_model.named_parameters(), cpu_model.parameters()):
                torch.testing.assert_close(p.grad.cpu(), ref.grad, rtol=1e-3, atol=1e-4,
                                           msg=lambda m, n=name: f"{n}: {m}")
            cpu_opt.step()
            tpu_opt.step()
            cpu_opt.zero_grad()
            tpu_opt.zero_grad()
    for (name, buf), ref in zip(tpu_model.named_buffers(), cpu_model.buffers()):
        torch.testing.assert_close(buf.cpu(), ref, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    tpu_model.eval()
    cpu_model.eval()
    with torch.tpu.precision("highest"), torch.no_grad():
        torch.testing.assert_close(tpu_model(*_to(inputs, "tpu")).cpu(), cpu_model(*inputs), rtol=1e-4, atol=1e-4)
