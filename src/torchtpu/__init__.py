"""torchtpu: a PyTorch-native ``tpu`` device.

Tensors on ``tpu`` are plain ``torch.Tensor`` objects on PyTorch's PrivateUse1
dispatch key; every ATen op is lowered to StableHLO and run by XLA through a
PJRT plugin (the OpenXLA CPU plugin by default, emulating TPU numerics).

``import torch`` loads the backend through the ``torch.backends`` entry point;
``import torchtpu`` is never needed in user code. This module stays free of
heavy imports so that ``torchtpu.runtime`` (which knows nothing of PyTorch)
can be imported on its own.
"""

__version__ = "0.1.0"


def _autoload() -> None:
    """Entry point called by ``import torch`` (``torch.backends`` group)."""
    from ._backend import install

    install()


def install() -> None:
    """Register the ``tpu`` device (idempotent); for TORCH_DEVICE_BACKEND_AUTOLOAD=0."""
    from ._backend import install as _install

    _install()
