"""A generated block inside a hand-written document, between two marker comments (docs/memory.md's cache-memory
table, the README's table of caching nodes): the generators replace only what lies between them."""
from __future__ import annotations

from pathlib import Path


def block(begin: str, end: str, body: str) -> str:
    """``body`` between its markers, each on a line of its own."""
    return f"{begin}\n{body}\n{end}"


def replaced(text: str, begin: str, end: str, body: str) -> str:
    """``text`` with everything from ``begin`` to ``end`` (markers included) replaced by the markers around ``body``."""
    start, stop = text.index(begin), text.index(end) + len(end)
    return text[:start] + block(begin, end, body) + text[stop:]


def update(doc: Path, begin: str, end: str, body: str, check: bool) -> bool:
    """Write ``body`` between the markers of ``doc``, or with ``check`` only compare. True if ``doc`` was current."""
    text = doc.read_text(encoding="utf-8")
    updated = replaced(text, begin, end, body)
    if not check and updated != text:
        doc.write_text(updated, encoding="utf-8")
    return updated == text
