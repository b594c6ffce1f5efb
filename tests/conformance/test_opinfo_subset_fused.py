"""The conformance fast subset again, in DeferAndFuse mode (results must match the CPU there too)."""

import pytest
import torch

pytest.importorskip("expecttest")  # torch.testing._internal needs it (a dev dependency)

from test_opinfo_subset import DTYPE_OVERRIDES, DTYPES, KINDS, SUBSET

from torchtpu.conformance import check_op, opinfo_by_key

# Data-dependent ops sync on their own; every other subset op is recorded and fused.
FUSED = [name for name in SUBSET if name not in ("nonzero", "masked_select")]


@pytest.mark.parametrize("name", FUSED)
def test_opinfo_subset_defer_and_fuse(name):
    with torch.tpu.defer_and_fuse():
        results = check_op(opinfo_by_key()[name], DTYPE_OVERRIDES.get(name, DTYPES), KINDS, limit=2)
    bad = [f"{r.dtype} {r.kind}: {r.status}: {r.detail}" for r in results if r.status not in ("pass", "untested")]
    assert not bad, "\n".join(bad)
    assert any(r.status == "pass" for r in results)
