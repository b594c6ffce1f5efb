"""8- and 16-bit integers against CPU, over their whole value range.

The OpInfo sweep checks int32, int64 and bool only, and a TPU has no 8- or 16-bit integer
arithmetic of its own (its compiler widens them): on the v5e a uint8 gcd loop gave wrong values
where the same loop in int16, int32 and int64 was right. Each op here is one small program per
dtype, so the whole file is cheap on a TPU, and says which narrow-integer ops differ there.
"""

from __future__ import annotations

import operator

import pytest
import torch

DTYPES = [torch.uint8, torch.int8, torch.int16]


def _operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Every value of an 8-bit type against a shuffled copy (int16: its extremes and a spread)."""
    info = torch.iinfo(dtype)
    if dtype == torch.int16:
        a = torch.cat([torch.arange(-300, 300), torch.tensor([info.min, info.min + 1, info.max, info.max - 1, -1, 0, 1]),
                       torch.randint(info.min, info.max, (400,), generator=torch.Generator().manual_seed(0))])
    else:
        a = torch.arange(info.min, info.max + 1)
    b = a[torch.randperm(len(a), generator=torch.Generator().manual_seed(1))]
    return a.to(dtype), b.to(dtype)


_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "and": operator.and_, "or": operator.or_, "xor": operator.xor,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "eq": operator.eq, "lt": operator.lt, "ge": operator.ge,
    "gcd": torch.gcd,
}
_UNARY = {
    "neg": operator.neg, "abs": torch.abs, "not": operator.invert, "sign": torch.sign,
    "square": lambda x: x * x, "to_float": lambda x: x.float(), "to_int32": lambda x: x.int(),
    "to_other_narrow": lambda x: x.to(torch.int8 if x.dtype == torch.uint8 else torch.uint8),
    "clamp": lambda x: x.clamp(-5, 100), "sum": lambda x: x.sum(dtype=x.dtype), "sum_default": torch.sum,
    "cumsum": lambda x: x.cumsum(0, dtype=x.dtype), "amax": lambda x: x.amax(), "argmax": lambda x: x.argmax(),
    "sort": lambda x: x.sort(stable=True).values, "argsort": lambda x: x.argsort(stable=True),
    "flip": lambda x: x.flip(0), "where": lambda x: torch.where(x > 3, x, x - 1),
    "gather": lambda x: x[torch.arange(len(x) - 1, -1, -3)],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(_BINARY))
def test_binary_ops_match_cpu(name, dtype):
    a, b = _operands(dtype)
    fn = _BINARY[name]
    if name == "gcd" and dtype.is_signed:  # CPU's Euclid wraps |min| (gcd(127, -128) = -1): left out
        keep = (a != torch.iinfo(dtype).min) & (b != torch.iinfo(dtype).min)
        a, b = a[keep], b[keep]
    torch.testing.assert_close(fn(a.to("tpu"), b.to("tpu")).cpu(), fn(a, b), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(_UNARY))
def test_unary_ops_match_cpu(name, dtype):
    a, _ = _operands(dtype)
    fn = _UNARY[name]
    torch.testing.assert_close(fn(a.to("tpu")).cpu(), fn(a), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_shifts_match_cpu(dtype):
    a, _ = _operands(dtype)
    bits = 8 * dtype.itemsize
    for s in range(bits):
        k = torch.full_like(a, s)
        torch.testing.assert_close((a.to("tpu") >> k.to("tpu")).cpu(), a >> k, rtol=0, atol=0, msg=f">> {s}")
        torch.testing.assert_close((a.to("tpu") << k.to("tpu")).cpu(), a << k, rtol=0, atol=0, msg=f"<< {s}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_division_matches_cpu(dtype):
    a, b = _operands(dtype)
    b = torch.where(b == 0, torch.ones_like(b), b)
    if dtype.is_signed:  # CPU's int8 -128 // -1 overflows (a SIGFPE risk on x86): left out
        keep = ~((a == torch.iinfo(dtype).min) & (b == -1))
        a, b = a[keep], b[keep]
    for fn in (torch.floor_divide, torch.remainder, torch.fmod, lambda x, y: torch.div(x, y, rounding_mode="trunc")):
        torch.testing.assert_close(fn(a.to("tpu"), b.to("tpu")).cpu(), fn(a, b), rtol=0, atol=0)
