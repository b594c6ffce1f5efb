"""OpInfo conformance: PyTorch's own op database run on ``tpu`` against CPU.

``python -m torchtpu.conformance`` sweeps every OpInfo entry and writes
``docs/op_coverage.md`` and ``docs/op_coverage.json``; :mod:`.core` holds the
per-op checks (also used by the fast pytest subset), :mod:`.skips` the one
skip list.
"""

from __future__ import annotations

from .core import DEFAULT_DTYPES, HEADLINE_DTYPES, OpResult, check_op, op_key, opinfo_by_key

__all__ = ["DEFAULT_DTYPES", "HEADLINE_DTYPES", "OpResult", "check_op", "op_key", "opinfo_by_key"]
