"""A report page: one self-contained HTML file (its data, styles and script inline; no server, no network, no
CDN), so it opens from file://, from a folder on object storage served as static files, or from a CI
artifact."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def render_page(data: dict[str, Any]) -> str:
    """The page's HTML for `data` (`evaluators.view.data`'s run, sweep or comparison)."""
    template = (HERE / "page.html").read_text(encoding="utf-8")
    # JSON inside <script>: no "</script>" or "<!--" may appear, so every "<" is written as its escape
    embedded = json.dumps(data, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")
    parts = {
        "__CSS__": (HERE / "report.css").read_text(encoding="utf-8"),
        "__JS__": (HERE / "report.js").read_text(encoding="utf-8"),
        "__TITLE__": html.escape(str(data.get("title", "rayeval report"))),
        "__DATA__": embedded,
    }
    # one pass: what is put in (the data may hold any text) is never searched for markers again
    return re.sub("__(CSS|JS|TITLE|DATA)__", lambda found: parts[found.group(0)], template)


def write_page(folder: Path, data: dict[str, Any]) -> Path:
    """Write `folder`/index.html for `data`; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "index.html"
    target.write_text(render_page(data), encoding="utf-8")
    return target
