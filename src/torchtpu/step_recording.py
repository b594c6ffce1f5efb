"""Strict mode runs a training step's compiled graphs and optimizer step as one or two programs.

In Strict mode each op, and each ``torch.compile`` graph, is its own launch. A training step is
then many: a ``torch.optim`` step is a dozen or more small ops over every parameter (AdamW's
default ``foreach`` path: ~10 foreach ops and the step counts), and a compiled model's step is its
forward graph, autograd's gradient seed, its backward graph and the optimizer's ops. So Strict
mode records a step's ops, as DeferAndFuse does, and runs them as one program (cached: every step
has the same ops). Recording

- starts at a ``torch.optim`` step's pre-hook (every parameter with a gradient a tpu tensor), or
  at a compiled forward or backward graph that can be recorded as one op (engine/graph_node.py);
- ends at the end of the optimizer step (its post-hook), at any read or synchronization (a flush
  that is not a cut), or at a change of eager mode. Ops in between (a loss scaled, gradients
  clipped) are recorded too. A recording begun at a compiled graph ends by default where the
  optimizer step begins (``TORCH_TPU_FUSE_COMPILED_STEPS=backward``), and the step is recorded as a
  program of its own: two launches per training step. That end is a cut (as DeferAndFuse's chunk
  cuts): on a first step the forward-backward program compiles in the background while the
  optimizer step is recorded, and the optimizer step's program, cut again at its end, compiles
  beside it; the step's end then launches both in order (a first step pays the longer compile,
  not both). Through the optimizer step (``=optimizer``)
  a step is one launch, but a model's first step (which creates the optimizer's state) and later
  steps are two variants of the whole step's program, and both compile: measured on the emulator
  for a 12-layer GPT, 13 s to reach speed instead of 10 s, where the two-program step compiles
  its large program once.

Nothing waits for the device: Strict is asynchronous either way, and the parameters hold their
new values for whatever runs next. What differs from op-by-op launches is where a failure to
compile the fused program surfaces (at the step's end, not at the op) and that
``torch.tpu.get_eager_mode()`` still says "strict" meanwhile. Debug mode stays synchronous, op by
op, and DeferAndFuse records anyway. Nothing starts inside a ``torch.compile`` trace.
``TORCH_TPU_FUSE_OPTIMIZER_STEPS=0`` and ``TORCH_TPU_FUSE_COMPILED_STEPS=off`` turn either start
off. A step that raises leaves the recording on until the next read, synchronization or step:
the ops in between are deferred (run at reads, as in DeferAndFuse), with the same results. The
eager mode is process-wide, and so is the recording.
"""

from __future__ import annotations

from typing import Any

import torch

from ._config import config
from .engine import deferred, graph_node
from .runtime import env

_FUSE_OPTIMIZER = True  # TORCH_TPU_FUSE_OPTIMIZER_STEPS, read by install()
_FUSE_COMPILED = "backward"  # TORCH_TPU_FUSE_COMPILED_STEPS, read by install()
_recording = False  # Strict mode is recording a step
_optimizer: torch.optim.Optimizer | None = None  # the optimizer whose post-hook ends it


_IS_TPU: dict[torch.device, bool] = {}  # device -> whether it is a tpu (reading .type costs more)


def _is_tpu(device: torch.device) -> bool:
    is_tpu = _IS_TPU.get(device)
    if is_tpu is None:
        is_tpu = _IS_TPU[device] = device.type == "tpu"
    return is_tpu


def _on_tpu(optimizer: torch.optim.Optimizer) -> bool:
    """Whether every parameter with a gradient is a tpu tensor with a dense tpu gradient (and
    one has a gradient). Runs at every optimizer step, over every parameter."""
    seen = False
    known = _IS_TPU
    for group in optimizer.param_groups:
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            if not (known.get(p.device) or _is_tpu(p.device)) or not (known.get(g.device) or _is_tpu(g.device)) \
                    or g.is_sparse:
                return False
            seen = True
    return seen


# Runs what a step recorded (launched, not waited for), as an op: the profiler gives a program's
# device time to the op that launched it (Kineto pushes correlation ids for ops, not for
# record_function scopes such as the step's own).
_lib = torch.library.Library("torchtpu", "FRAGMENT")
_lib.define("optimizer_step() -> ()")


def _run_step() -> None:
    # A cut first: where the graph before it (a compiled step's forward and backward, cut at the
    # optimizer's pre-hook) still compiles, this one compiles beside it instead of after it
    # (deferred.flush waits for the graphs in flight before it emits its own). Then the flush
    # launches both, in order, and ends the recording.
    deferred.flush(cut=True)
    deferred.flush()


_lib.impl("optimizer_step", _run_step, "CompositeExplicitAutograd")
# The same for what a compiled step recorded up to its optimizer step: a cut where the optimizer
# step goes on recording (see _pre_hook), else a flush.
_lib.define("compiled_step(bool cut=False) -> ()")
_lib.impl("compiled_step", lambda cut=False: deferred.flush(cut=cut), "CompositeExplicitAutograd")


def recording() -> bool:
    """Whether Strict mode is recording a step now (``torch.tpu.get_eager_mode()`` says "strict")."""
    return _recording


def _begin() -> None:
    global _recording
    config.defer_and_fuse = True  # (nothing is pending in Strict mode: no flush needed first)
    _recording = True


def _ended() -> None:
    """Every flush that is not a cut (a read, a synchronization, a mode change, the step's end)
    ends the recording (deferred.flush calls this first): Strict mode goes on op by op."""
    global _recording, _optimizer
    if _recording:
        _recording = False
        _optimizer = None
        config.defer_and_fuse = False


def _can_begin() -> bool:
    return not (config.defer_and_fuse or config.launch_blocking or torch.compiler.is_compiling())


def _may_begin_at(graph: str) -> bool:
    return graph != "inference" and _FUSE_COMPILED != "off" and _can_begin()


def _begin_at(graph: str) -> bool:
    """Before a compiled ``graph`` recordable as one op: begin recording a training step there."""
    if not _may_begin_at(graph):
        return False
    _begin()
    return True


def _pre_hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    global _optimizer
    if torch.compiler.is_compiling():
        return
    if _recording and _optimizer is not None:  # an earlier step raised before its post-hook
        torch.ops.torchtpu.optimizer_step()
    if _recording:  # begun at a compiled graph
        if _FUSE_COMPILED == "optimizer":  # this step ends it
            _optimizer = optimizer
            return
        if _FUSE_OPTIMIZER and _on_tpu(optimizer):
            # Forward through backward: one program, cut here, so that a first step compiles it in
            # the background while the optimizer step is recorded and compiled beside it (on a TPU
            # v5e compiles run side by side: docs/tpu.md); a cached one launches at once. The
            # recording goes on into the optimizer step, whose end flushes both, in order.
            torch.ops.torchtpu.compiled_step(True)
            _optimizer = optimizer
            return
        torch.ops.torchtpu.compiled_step()  # forward through backward: one program (ends it)
    if not _FUSE_OPTIMIZER or not _can_begin() or not _on_tpu(optimizer):
        return
    _begin()
    _optimizer = optimizer


def _post_hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if torch.compiler.is_compiling():
        return
    if _recording and _optimizer is optimizer:
        torch.ops.torchtpu.optimizer_step()  # runs the step (deferred.flush ends the recording)


def install() -> None:
    global _FUSE_OPTIMIZER, _FUSE_COMPILED
    _FUSE_OPTIMIZER = bool(env.read("TORCH_TPU_FUSE_OPTIMIZER_STEPS"))
    _FUSE_COMPILED = env.read("TORCH_TPU_FUSE_COMPILED_STEPS")
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_pre_hook)
    register_optimizer_step_post_hook(_post_hook)
    deferred.on_materialize = _ended
    graph_node.may_begin_at = _may_begin_at
    graph_node.begin_at = _begin_at
