"""The host CPU's feature flags, as the kernel reports them (no PyTorch here)."""

from __future__ import annotations

_FLAGS: list[tuple[str, ...] | None] = []


def cpu_flags() -> tuple[str, ...] | None:
    """The flags of /proc/cpuinfo's first "flags" (x86) or "Features" (arm64) line, in its
    order; empty where no such line exists, None where the file cannot be read. Read once."""
    if not _FLAGS:
        flags: tuple[str, ...] | None = ()
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                for line in f:
                    name, _, value = line.partition(":")
                    if name.strip().lower() in ("flags", "features"):
                        flags = tuple(value.split())
                        break
        except OSError:
            flags = None
        _FLAGS.append(flags)
    return _FLAGS[0]
