"""Keep Dynamo out of the process group's Python.

c10d calls a Python backend's methods from C++ (DDP's reducer broadcasts and all-reduces from its
hooks; ``Work.wait`` comes from C++ too). Under ``torch.compile`` Dynamo's frame hook is live then,
and it tried to compile those frames as user code, stopping at the process group's members
(``UnsafeScriptObjectError``). A NCCL or Gloo group is C++ and has no frames; ours runs them
eagerly, as if it were.
"""

from __future__ import annotations

import inspect
from typing import TypeVar

import torch

C = TypeVar("C", bound=type)


def untraced(cls: C) -> C:
    """``cls`` with each of its own methods run outside Dynamo (``torch.compiler.disable``)."""
    for name, member in list(vars(cls).items()):
        if name.startswith("__") or not inspect.isfunction(member):
            continue  # (dunders, classmethods, properties: not called by c10d under a compiled frame)
        setattr(cls, name, torch.compiler.disable(member, recursive=True))
    return cls
