"""How far a long search has come: the phases of `search.plan` and `rlhf.search_step` report their work here.

The search itself stays pure: it calls a `Progress` (by default `QUIET`, which does nothing). The CLI passes a bar
on standard error (`cli.progress_bar`), so that a plan of a 671B MoE on thousands of GPUs with tens of thousands of
packed sequences, which takes tens of seconds on a laptop, says what it is doing."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def start(self, what: str, total: int) -> None:
        """A new phase of `total` units of work named `what` (the previous one, if any, is over)."""

    def advance(self, units: int = 1) -> None:
        """`units` more of the current phase are done."""

    def finish(self) -> None:
        """The work is over: remove the bar."""


class _Quiet:
    def start(self, what: str, total: int) -> None:
        pass

    def advance(self, units: int = 1) -> None:
        pass

    def finish(self) -> None:
        pass


QUIET: Progress = _Quiet()
