"""Progress bars for long commands, on a terminal only.

    with Progress("re-indexing", total=len(runs), stream=self.stderr) as bar:
        for run in runs:
            ...
            bar.advance()

On a terminal (``stream.isatty()``) it redraws one line, at most every ``every``
seconds and at the end: ``re-indexing [########..........] 412/1000  41%``; without a
total, a count. Anywhere else (a pipe, a file, cron, CI) it writes nothing at all, so
a command's output stays what it was. No dependency, no thread; ``stream`` may be a
command's ``self.stderr``.
"""

from __future__ import annotations

import sys
import time
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from django.core.management.base import OutputWrapper


class Progress:
    """A one-line progress bar on ``stream`` (default ``sys.stderr``) when it is a
    terminal; silent otherwise (``live`` says which)."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        stream: IO[str] | OutputWrapper | None = None,
        width: int = 30,
        every: float = 0.1,
    ) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        from django.core.management.base import OutputWrapper

        # A command's self.stderr ends every write with a newline unless told not to.
        self._write = (
            (lambda text: self.stream.write(text, ending=""))
            if isinstance(self.stream, OutputWrapper)
            else self.stream.write
        )
        #: drawing at all? (a terminal)
        self.live = bool(self.stream.isatty())
        self.width = width
        self.every = every
        self.done = 0
        self._drawn = 0.0
        self._closed = False

    def __enter__(self) -> Progress:
        self._draw(force=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, n: int = 1) -> None:
        """``n`` more done."""
        self.done += n
        self._draw()

    def close(self) -> None:
        """Draw the final state and end the line (once)."""
        if self._closed:
            return
        self._closed = True
        if self.live:
            self._draw(force=True)
            self._write("\n")
            self.stream.flush()

    def line(self) -> str:
        """The bar as it would be drawn now."""
        if not self.total:
            return f"{self.label} {self.done}"
        share = min(self.done / self.total, 1.0)
        filled = int(share * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        return f"{self.label} [{bar}] {self.done}/{self.total} {share:4.0%}"

    def _draw(self, *, force: bool = False) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if not force and now - self._drawn < self.every:
            return
        self._drawn = now
        # \r back to the line's start; \x1b[K clears what a longer line left behind
        self._write("\r" + self.line() + "\x1b[K")
        self.stream.flush()
