"""The headers that keep what users upload or jobs produce from acting as a page of corral.

Results, previews and model files come from handlers and agents, not from
corral: a job may well produce ``text/html`` or an SVG with a script in it.
Served from the dashboard's origin as is, such a file would run as the
dashboard, with its session. So every such file is sent with:

* ``X-Content-Type-Options: nosniff``: the browser takes the declared type,
  never guesses ``text/html`` from the bytes;
* ``Content-Security-Policy: default-src 'none'; sandbox``: opened anyway, it
  runs no script, loads nothing, and has an origin of its own;
* ``Content-Disposition: attachment`` unless it is a raster image the
  dashboard shows as a preview (``INLINE_TYPES``; never SVG, which is a document).

The dashboard's own page gets a strict policy of its own (``DASHBOARD_HEADERS``).
"""

from __future__ import annotations

from urllib.parse import quote

INLINE_TYPES = frozenset(
    {"image/png", "image/jpeg", "image/gif", "image/webp", "image/avif", "image/bmp"}
)
"""Raster images: a browser shows them and runs nothing in them."""

FILE_CSP = "default-src 'none'; sandbox"

DASHBOARD_CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",  # app.js only: no inline script, no eval
        "style-src 'self'",
        "img-src 'self' blob: data:",  # previews arrive as blob: URLs; the icon is data:
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ]
)
DASHBOARD_HEADERS = {
    "Content-Security-Policy": DASHBOARD_CSP,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


def file_headers(name: str, content_type: str) -> dict[str, str]:
    """Headers for sending the file ``name`` of ``content_type`` (see the module docstring)."""
    media = content_type.partition(";")[0].strip().lower()
    disposition = "inline" if media in INLINE_TYPES else "attachment"
    return {
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": FILE_CSP,
        "Content-Disposition": f"{disposition}; {_filename(name)}",
    }


def _filename(name: str) -> str:
    """The ``filename`` parameter: plain when it is, else RFC 6266's encoded form."""
    base = name.rsplit("/", 1)[-1] or "file"
    quoted = quote(base, safe="")
    if quoted == base:
        return f'filename="{base}"'
    return f"filename*=utf-8''{quoted}"
