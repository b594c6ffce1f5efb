"""Stage installed packages, with what they require, as one tarball for a TPU host without an index.

    .venv/bin/python tools/tpu_suite/pack_packages.py transformers accelerate --out .tpu/hf.tgz
    # on the TPU host, after .tpu/on_tpu.sh:  tar xzf .tpu/hf.tgz -C /tmp/torchtpu-site

``../shared/tpu/pack.sh`` brings torch and torchtpu's built files only; the conformance report's
model checks and the Hugging Face tests need ``transformers`` too, and the Accelerate example
``accelerate``. Packages the host already has (torch, numpy, JAX's) and byte-code caches are left out. Run it with the interpreter whose
site-packages hold the packages (the project's ``.venv``).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import sys
import tarfile
from pathlib import Path

# on the TPU host already, or brought by pack.sh: never packed
HOST_HAS = {"torch", "numpy", "jax", "jaxlib", "libtpu", "ml-dtypes", "setuptools", "pip"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def closure(roots: list[str]) -> list[md.Distribution]:
    """The installed distributions ``roots`` need, without extras and without ``HOST_HAS``."""
    seen: dict[str, md.Distribution] = {}
    todo = [r.lower().replace("_", "-") for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or name in HOST_HAS:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional or platform-specific requirement not installed here
        seen[name] = dist
        for req in dist.requires or []:
            marker = req.split(";", 1)[1] if ";" in req else ""
            if "extra ==" in marker:
                continue
            todo.append(_name(req))
    return list(seen.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("packages", nargs="+")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    dists = closure(a.packages)
    n = 0
    with tarfile.open(a.out, "w:gz") as tar:
        for dist in dists:
            base = Path(dist.locate_file(""))
            for f in dist.files or []:
                path = base / f
                if "__pycache__" in f.parts or not path.is_file() or ".." in f.parts:
                    continue
                tar.add(path, arcname=str(f))
                n += 1
    names = ", ".join(sorted(f"{d.metadata['Name']} {d.version}" for d in dists))
    print(f"{a.out}: {n} files of {len(dists)} distributions ({names}); {Path(a.out).stat().st_size >> 20} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
