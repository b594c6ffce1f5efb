"""An optimizer step over tpu parameters runs as one program in Strict mode, too.

A ``torch.optim`` step is a dozen or more small ops over every parameter (AdamW's default
``foreach`` path: ~10 foreach ops and the step counts), each its own launch in Strict mode. A
global step pre-hook records the step's ops instead, as DeferAndFuse does, and the post-hook runs
them as one program (cached: every step has the same ops). Nothing waits for the device: Strict is
asynchronous either way, and the parameters hold their new values for whatever runs next.

The step is recorded only when every parameter with a gradient is a tpu tensor and the mode is
Strict (DeferAndFuse records it anyway; Debug stays synchronous, op by op), and never inside a
``torch.compile`` trace. ``TORCH_TPU_FUSE_OPTIMIZER_STEPS=0`` turns it off. A step that raises
leaves the recording on until the next step's pre-hook: the ops in between are deferred (run at
reads, as in DeferAndFuse), with the same results. The eager mode is process-wide, and so is the
record of which step is recording.
"""

from __future__ import annotations

from typing import Any

import torch

from ._config import config
from .engine import deferred
from .runtime import env

_FUSE = True  # TORCH_TPU_FUSE_OPTIMIZER_STEPS, read by install()
_recording: torch.optim.Optimizer | None = None  # the optimizer whose step is being recorded


def _on_tpu(optimizer: torch.optim.Optimizer) -> bool:
    seen = False
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.device.type != "tpu" or p.grad.device.type != "tpu" or p.grad.is_sparse:
                return False
            seen = True
    return seen


# Runs what a step recorded (launched, not waited for), as an op: the profiler gives a program's
# device time to the op that launched it (Kineto pushes correlation ids for ops, not for
# record_function scopes such as the step's own).
_lib = torch.library.Library("torchtpu", "FRAGMENT")
_lib.define("optimizer_step() -> ()")
_lib.impl("optimizer_step", lambda: deferred.flush(), "CompositeExplicitAutograd")


def _end_recording() -> None:
    global _recording
    _recording = None
    torch.ops.torchtpu.optimizer_step()
    config.defer_and_fuse = False


def _pre_hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    global _recording
    if torch.compiler.is_compiling():
        return
    if _recording is not None:  # an earlier step raised before its post-hook
        _end_recording()
    if config.defer_and_fuse or config.launch_blocking or not _FUSE or not _on_tpu(optimizer):
        return
    config.defer_and_fuse = True  # (nothing is pending in Strict mode: no flush needed first)
    _recording = optimizer


def _post_hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if torch.compiler.is_compiling():
        return
    if _recording is optimizer:
        _end_recording()


def install() -> None:
    global _FUSE
    _FUSE = bool(env.read("TORCH_TPU_FUSE_OPTIMIZER_STEPS"))
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_pre_hook)
    register_optimizer_step_post_hook(_post_hook)
