"""``/view``'s ``preview`` and ``channel``: an output image re-encoded as ComfyUI's ``/view``
re-encodes it, for the thumbnails and mask editors of ComfyUI's frontend.

* ``preview=webp;90`` / ``preview=jpeg;80``: the image in that format and quality
  (any other format, or a ``channel`` with alpha, gives WebP; JPEG or ``rgb`` drop alpha);
* ``channel=rgb``: a PNG without its alpha; ``channel=a``: a PNG of the alpha alone
  (opaque when the image has none); ``rgba`` or none: the file as it is.

Re-encoding needs Pillow (the ``comfyui-ui`` extra); without it, and for files Pillow
cannot read or that are over ``MAX_PIXELS``, the file is served as it is.
"""

from __future__ import annotations

import io
from typing import Any

MAX_PIXELS = 64 * 1024 * 1024
"""Larger images are not decoded (a small file may claim a huge canvas)."""


def reencode(data: bytes, preview: str | None, channel: str | None) -> tuple[bytes, str] | None:
    """The converted image and its type, or None to serve the file as it is."""
    if not preview and channel in (None, "", "rgba"):
        return None
    try:
        from PIL import Image
    except ImportError:
        return None
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > MAX_PIXELS:
                return None
            img.load()
            if preview:
                return _preview(img, preview, channel or "")
            return _channel(img, channel or "")
    except (OSError, ValueError, Image.DecompressionBombError):
        return None


def _preview(img: Any, preview: str, channel: str) -> tuple[bytes, str]:
    parts = preview.split(";")
    fmt = parts[0] if parts[0] in ("webp", "jpeg") and "a" not in channel else "webp"
    quality = int(parts[-1]) if parts[-1].isdigit() else 90
    if fmt == "jpeg" or channel == "rgb":
        img = img.convert("RGB")
    out = io.BytesIO()
    img.save(out, format=fmt, quality=min(quality, 100))
    return out.getvalue(), f"image/{fmt}"


def _channel(img: Any, channel: str) -> tuple[bytes, str] | None:
    from PIL import Image

    if channel == "rgb":
        picked = img.convert("RGB")
    elif channel == "a":
        alpha = img.getchannel("A") if img.mode == "RGBA" else Image.new("L", img.size, 255)
        picked = Image.new("RGBA", img.size)
        picked.putalpha(alpha)
    else:
        return None
    out = io.BytesIO()
    picked.save(out, format="PNG")
    return out.getvalue(), "image/png"
