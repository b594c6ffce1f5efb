"""Housekeeping of a local compile-cache directory (tiers 2 and 3): a size bound with
least-recently-used eviction, and a per-program lock so that processes of one machine compile a
program once between them.

Recency is the entry's mtime: a hit sets it to now (one ``utime`` per program per process), so
eviction removes the entries no process has loaded for longest. The directory is scanned at the
first write of a process and again after each eighth of the bound has been written by it, which
keeps the scan (about 30 ms per 25,000 entries) rare; concurrent evictions are harmless (a missing
file is skipped, a reader that loses an entry recompiles).

The lock is ``flock`` on a file per program, removed by its holder: the ``filelock`` package keeps
its lock files (safe for a few well-known names, but here there is one per program, tens of
thousands), so it is not used.

Knows nothing of PyTorch or PJRT: paths, sizes and file locks only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import time
from collections.abc import Iterator

# Eviction goes down to this fraction of the bound, so that it does not run at every write.
_LOW_WATER = 0.8
# A program's compile may wait this long for another process compiling the same program, then
# compiles itself (a wedged holder must not stall this process forever).
LOCK_WAIT_S = 600.0
_POLL_S = 0.05


class SizeBound:
    """Keeps the ``pattern``-named files of ``path`` within ``max_bytes`` (0: no bound)."""

    def __init__(self, path: str, pattern: re.Pattern[str], max_bytes: int) -> None:
        self.path = path
        self.pattern = pattern
        self.max_bytes = max_bytes
        self._written = None  # bytes this process wrote since its last scan (None: never scanned)

    def note_write(self, nbytes: int) -> int:
        """Account for an entry of ``nbytes`` just written; evict if due. Returns files removed."""
        if self.max_bytes <= 0:
            return 0
        if self._written is not None:
            self._written += nbytes
            if self._written < self.max_bytes / 8:
                return 0
        self._written = 0
        return evict(self.path, self.pattern, self.max_bytes)


def entries(path: str, pattern: re.Pattern[str]) -> list[tuple[float, int, str]]:
    """(mtime, size, name) of the entries of a directory, oldest first."""
    found = []
    try:
        with os.scandir(path) as it:
            for e in it:
                if pattern.match(e.name):
                    try:
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    found.append((st.st_mtime, st.st_size, e.name))
    except FileNotFoundError:
        return []
    found.sort()
    return found


def evict(path: str, pattern: re.Pattern[str], max_bytes: int) -> int:
    """If the entries exceed ``max_bytes``, delete the least recently used down to 80% of it."""
    listed = entries(path, pattern)
    total = sum(size for _, size, _ in listed)
    if total <= max_bytes:
        return 0
    target = max_bytes * _LOW_WATER
    removed = 0
    for _, size, name in listed:
        if total <= target:
            break
        try:
            os.unlink(os.path.join(path, name))
            removed += 1
        except FileNotFoundError:
            pass  # another process evicted it
        total -= size
    return removed


def mark_used(file: str) -> None:
    """Record a hit: the entry's mtime becomes now (its place in the eviction order)."""
    try:
        os.utime(file)
    except OSError:
        pass  # evicted meanwhile, or a read-only directory: recency is only a hint


@contextlib.contextmanager
def program_lock(path: str, key: str, wait_s: float = LOCK_WAIT_S) -> Iterator[bool]:
    """Hold ``path/.<key>.lock`` while compiling ``key``; yields whether another process held it
    first (then the entry is likely there now: look again before compiling). Without a lock (none
    could be made, or its holder outlasted ``wait_s``) it yields False: compile anyway."""
    lock_path = os.path.join(path, f".{key}.lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield False
        return
    held = waited = False
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    break
                waited = True
                time.sleep(_POLL_S)
        yield held and waited
    finally:
        if held:
            # unlinked while held: a process that opened it before waits on this inode and then
            # finds the entry; one that opens after makes a new file (at worst one more compile)
            with contextlib.suppress(OSError):
                os.unlink(lock_path)
        os.close(fd)
