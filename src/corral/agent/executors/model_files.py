"""Put a model from the agent's cache where an HTTP backend looks for its checkpoints.

AUTOMATIC1111 reads ``models/Stable-diffusion``, ComfyUI ``models/checkpoints``.
The agent's cache keeps files by sha256; ``install`` makes a symbolic link in
the backend's folder named after the registry name (``org/sdxl`` becomes
``org--sdxl.safetensors``), so the backend lists it under that name. A link,
not a copy: it takes no disk space, and when the cache evicts the file the
link dangles until the model is needed (and linked) again. An existing link
to another file (an older version of the model) is replaced atomically.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from corral.core import ExecutorError

SUFFIX = ".safetensors"
_UNSAFE = re.compile(r"[^A-Za-z0-9._+@-]+")


def file_stem(name: str) -> str:
    """The file name (without suffix) a registry name gets in a backend's model folder."""
    return _UNSAFE.sub("--", name).strip(".") or "model"


def install(models_dir: Path, name: str, path: Path) -> str:
    """Link ``path`` into ``models_dir`` as ``<stem>.safetensors``; returns the file name."""
    target = models_dir / (file_stem(name) + SUFFIX)
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() and os.readlink(target) == str(path):
            return target.name
        if target.exists() and not target.is_symlink():
            return target.name  # the backend has its own file by that name: leave it be
        tmp = target.with_name(f".{target.name}.link")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(path)
        os.replace(tmp, target)
    except OSError as exc:
        raise ExecutorError(
            f"could not link model {name} into {models_dir}: {exc}", retryable=False
        ) from exc
    return target.name
