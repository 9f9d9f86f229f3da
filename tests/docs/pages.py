"""The README and the docs pages as the tests read them: a section by its heading, the
code blocks in it, and the anchors a page has (as MkDocs makes them)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^(`{3,}|~{3,})")


def headings(text: str) -> list[tuple[int, int, str]]:
    """``(line index, level, title)`` of each Markdown heading, code blocks skipped."""
    found, fence = [], None
    for i, line in enumerate(text.splitlines()):
        mark = _FENCE.match(line)
        if mark:
            if fence is None:
                fence = mark.group(1)[0] * len(mark.group(1))
            elif line.startswith(fence):
                fence = None
            continue
        if fence is None and (m := _HEADING.match(line)):
            found.append((i, len(m.group(1)), m.group(2)))
    return found


def section(path: str, title: str) -> str:
    """The section of ``path`` (from the repository's root) under the heading ``title``,
    to the next heading of its level or above. A missing heading fails the test that
    asked: the text moved, and the test must follow it."""
    text = (ROOT / path).read_text(encoding="utf-8")
    lines = text.splitlines()
    marks = headings(text)
    for n, (i, level, name) in enumerate(marks):
        if name == title:
            end = next((j for j, lv, _ in marks[n + 1 :] if lv <= level), len(lines))
            return "\n".join(lines[i:end]) + "\n"
    raise AssertionError(f"{path} has no heading {title!r}")


def blocks(text: str, lang: str) -> list[str]:
    """The bodies of the ``lang`` fenced code blocks in ``text``, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, re.S | re.M)


def slug(title: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading."""
    title = re.sub(r"`([^`]*)`", r"\1", title)
    value = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def anchors(path: str | Path) -> set[str]:
    text = (ROOT / path).read_text(encoding="utf-8")
    return {slug(title) for _, _, title in headings(text)}
