"""The search's `Progress` drawn as a bar on standard error (rich), while a plan runs. Only on a terminal: piped or
captured output (CI, `--json | jq`) stays as it was, and standard output keeps the one answer."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from ..search.progress import QUIET, Progress


class _RichBar:
    def __init__(self, file: TextIO, force_terminal: bool | None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=file, force_terminal=force_terminal)
        self._bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=True,
        )  # fmt: skip
        self._task = None

    def start(self, what: str, total: int) -> None:
        if self._task is None:
            self._bar.start()
            self._task = self._bar.add_task(what, total=total)
        else:
            self._bar.reset(self._task, total=total, description=what)

    def advance(self, units: int = 1) -> None:
        if self._task is not None:
            self._bar.advance(self._task, units)

    def finish(self) -> None:
        if self._task is not None:
            self._bar.stop()
            self._task = None


@contextmanager
def progress_bar(file: TextIO | None = None, force_terminal: bool | None = None) -> Iterator[Progress]:
    """A `Progress` that draws on `file` (standard error) when it is a terminal (or `force_terminal`), else
    `QUIET`; the bar is gone when the block ends, however it ends."""
    file = file if file is not None else sys.stderr
    if not (force_terminal or (force_terminal is None and file.isatty())):
        yield QUIET
        return
    bar = _RichBar(file, force_terminal)
    try:
        yield bar
    finally:
        bar.finish()
