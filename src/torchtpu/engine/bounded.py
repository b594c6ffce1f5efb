"""A dict of compiled programs with a bound on its size.

Every program a process compiles stays in memory while a cache holds it, and each costs the
process memory mappings on the CPU plugin (XLA:CPU's JIT code, about 8 per program measured over
test_ops): some 8,000 programs exhaust Linux's default 65,530 mappings, after which XLA fails with
"Cannot allocate memory" or "Failed to materialize symbols". The bound applies to each of three
caches whose programs overlap (the op cache, the tier-1 text cache, the DeferAndFuse graph cache).
Eager code over ever-new shapes (generation without a static cache, a fuzz test) gets there. So
each program cache drops its oldest entries past ``TORCH_TPU_MAX_CACHED_PROGRAMS``; a program
needed again is compiled again, or loaded from the tier-2/3 caches.

Reads do not reorder entries (no writes on the hit path, which runs without the caches' locks):
eviction is first in, first out, a quarter of the bound at a time. Callers hold their own lock
around writes.
"""

from __future__ import annotations

from typing import Any

from ..runtime import env

MAX_PROGRAMS = int(env.read("TORCH_TPU_MAX_CACHED_PROGRAMS"))


class BoundedCache(dict):
    """A dict that, at ``MAX_PROGRAMS`` entries (0: no bound), drops its oldest to three quarters."""

    evictions = 0  # entries dropped, over all caches (compile_cache_stats)

    def __setitem__(self, key: Any, value: Any) -> None:
        bound = MAX_PROGRAMS
        if bound and len(self) >= bound and key not in self:
            # down to three quarters of the bound (a bound lowered at run time takes effect at once)
            for old in list(self)[: len(self) - bound + max(bound // 4, 1)]:
                del self[old]
                BoundedCache.evictions += 1
        super().__setitem__(key, value)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]
