"""Opt-in CPU fallback: run an op on CPU copies and copy results back."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map


def run_on_cpu(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    originals: list[tuple[torch.Tensor, torch.Tensor]] = []
    device = None

    def to_cpu(x: Any) -> Any:
        nonlocal device
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            device = x.device
            c = x.cpu()
            originals.append((x, c))
            return c
        if isinstance(x, torch.device) and x.type == "tpu":
            device = x
            return torch.device("cpu")
        return x

    cpu_args = tree_map(to_cpu, args)
    cpu_kwargs = tree_map(to_cpu, kwargs)
    out = op(*cpu_args, **cpu_kwargs)
    # Arguments the op wrote to: copy back into the tpu tensors.
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            for orig, c in originals:
                if c is (cpu_args[i] if i < len(cpu_args) else cpu_kwargs.get(a.name)):
                    orig.copy_(c)
    mapping = {id(c): o for o, c in originals}
    target = device or torch.device("tpu")

    def back(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) in mapping:
                return mapping[id(x)]
            return x.to(target)
        return x

    return tree_map(back, out)
