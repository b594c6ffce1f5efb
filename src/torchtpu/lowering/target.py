"""The compiler the lowered programs go to.

A few lowerings shape their output around XLA's CPU backend (the CPU-emulated
``tpu``): its emitters are fast for some equivalent forms of an op and slow for
others, where a TPU compiler would not care.
"""

from __future__ import annotations

import torch

from ..runtime import env, host_cpu

# Lowering for another platform than the plugin's: the programs a TPU would be sent, built
# (and run, where the plugin can) on the CPU emulator, for tests and inspection.
LOWER_FOR_ENV = "TORCH_TPU_LOWER_FOR"
_KIND: list[str] = []


def _kind() -> str:
    if not _KIND:
        from .. import _device_state

        _KIND.append(env.read(LOWER_FOR_ENV) or _device_state.plugin_kind())
    return _KIND[0]


def xla_cpu() -> bool:
    """Whether programs run on XLA's CPU backend."""
    return _kind() == "cpu"


def tpu() -> bool:
    """Whether programs run on a real TPU (libtpu)."""
    return _kind() == "tpu"


def native_dot_precision() -> bool:
    """Whether the compiler makes an f32 matrix product's bf16 passes itself.

    A TPU's matrix unit does, from the dot's or convolution's ``precision_config``
    (DEFAULT 1 pass, HIGH 3, HIGHEST 6), faster than passes written into the program,
    which its compiler may also merge back (a bf16 round trip is free to drop under
    excess precision). XLA's CPU backend ignores ``precision_config`` and multiplies in
    f32, so for the emulator the lowering writes the passes out (``matmul.py``).
    """
    return tpu()


def elementwise_integer_products() -> bool:
    """Whether integer matrix products and convolutions must be written as multiplies and
    sums: a TPU's compiler rewrites 64-bit integers into 32-bit pairs for elementwise ops and
    reductions, but not for ``dot_general`` or ``convolution`` (it refuses to compile them),
    and its matrix unit has no exact wide-integer path."""
    return tpu()


BF16_DOTS_ENV = "TORCH_TPU_BF16_DOTS"
_BF16_DOTS: list[bool] = []
# Host CPU flags (/proc/cpuinfo) of instructions that multiply bf16 pairs natively.
_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def bf16_dots() -> bool:
    """Whether matrix products take their bf16-rounded operands as bf16, or widened to f32.

    Both compute the same numbers: a product of two bf16 values is exact in f32, and
    both accumulate in f32. On a TPU the matrix unit takes bf16. XLA:CPU hands a bf16
    dot to YNNPACK, whose kernels on a CPU without bf16 multiply instructions (x86
    without AVX512_BF16 or AMX, arm64 without BF16) widen every pair of values in the
    inner loop: there an f32 dot of the already rounded values runs 1.2-1.9x faster
    (512x128x384 products and their weight gradients, measured on an AVX2 EPYC).
    ``TORCH_TPU_BF16_DOTS=1`` or ``0`` overrides the choice.
    """
    if not _BF16_DOTS:
        forced = env.read(BF16_DOTS_ENV)
        _BF16_DOTS.append(forced if forced is not None else not xla_cpu() or _host_multiplies_bf16())
    return _BF16_DOTS[0]


def _host_multiplies_bf16() -> bool:
    flags = host_cpu.cpu_flags()
    if not flags:
        return True  # unknown: keep the TPU's operand type
    return any(flag in flags for flag in _NATIVE_BF16_FLAGS)


_ACCURATE: list[bool] = []


def accurate_transcendentals() -> bool:
    """Whether elementwise functions (exp, log, tanh, logistic...) ask the compiler for their
    accurate forms (``result_accuracy`` HIGHEST). A TPU's compiler otherwise emits fast
    approximations; XLA's CPU backend is accurate anyway. TORCH_TPU_ACCURATE_TRANSCENDENTALS
    overrides (to measure what the accurate forms cost on a TPU, or to give them up there)."""
    if not _ACCURATE:
        chosen = env.read("TORCH_TPU_ACCURATE_TRANSCENDENTALS")
        _ACCURATE.append(tpu() if chosen is None else bool(chosen))
    return _ACCURATE[0]


def wide_float_power() -> bool:
    """Whether an f32 ``power`` is computed in f32 pairs and rounded once (a TPU's f32 power is
    not accurate, takes no result accuracy, and its f64 one compiles slowly:
    ``accurate_math.power``); XLA's CPU backend calls an accurate ``powf``."""
    return tpu()


def narrow_indices() -> bool:
    """Whether gathers and scatters take their row indices as int32: a TPU's compiler emulates
    64-bit integers as 32-bit pairs (PyTorch's indices are int64; JAX feeds int32), while a
    tensor's dimension there is far below 2^31. XLA:CPU has native 64-bit integers."""
    return tpu()


def gathers_float16_through_products() -> bool:
    """Whether the compiler may gather float16 rows through a one-hot matrix product, whose one
    bf16 pass rounds them (a v5e's did: an ``embedding`` of float16 rows came back bf16-rounded).
    Such gathers then move the rows' bits as int16 (``Builder.op1``)."""
    return tpu()


def narrows_work_used_as_bf16() -> bool:
    """Whether the compiler computes f32 work in bf16 where its every use is a conversion to bf16
    (XLA's BFloat16Propagation, in a TPU's pipeline): a bf16 ``mv`` rounded each product before
    summing. Results that must keep their f32 work are rounded in integers
    (``Builder.rounded_to_bf16``)."""
    return tpu()


# A TPU computes float64 as pairs of float32 (XLA's emulation): about 2^-45 relative per
# operation measured on a v5e (docs/tpu.md), float32's exponent range, and an overflow that can
# come out NaN instead of inf (the pair's correction term is inf - inf).
_EMULATED_FLOAT64_UNIT_ROUNDOFF = 2.0 ** -45


def emulated_float64() -> bool:
    """Whether float64 is XLA's pair-of-float32 emulation (a TPU) rather than IEEE float64."""
    return tpu()


def unit_roundoff(dtype: torch.dtype) -> float:
    """The relative rounding error of one operation in ``dtype`` as the programs compute it:
    what an iteration converging to working precision can reach."""
    if dtype == torch.float64 and emulated_float64():
        return _EMULATED_FLOAT64_UNIT_ROUNDOFF
    return torch.finfo(dtype).eps / 2
