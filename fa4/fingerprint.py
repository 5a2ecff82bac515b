"""The source fingerprint of the kernels: which kernel code a measurement was taken with.

The kernels own it because it fingerprints them: the tuner records it with every measurement,
the launch-time lookup serves only rows of the running fingerprint, and the demo data says
which kernels it measured. Files are hashed by name and content, so a moved checkout keeps
its fingerprint and an edit of any kernel or common helper changes it.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parent


def kernel_source_files() -> list[Path]:
    """The files whose content defines our kernels' generated code."""
    return sorted([*ROOT.glob("sm90/*.py"), *ROOT.glob("common/*.py")])


def files_fingerprint(paths: Iterable[Path]) -> str:
    """16 hex digits of sha256 over (name, content) of each file, in sorted order."""
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode())
        try:
            h.update(p.read_bytes())
        except OSError:
            h.update(b"<missing>")
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """Fingerprint of the kernels of this process (read once: the files do not change under it)."""
    return files_fingerprint(kernel_source_files())
