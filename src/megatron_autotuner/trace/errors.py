"""Errors of the trace package."""

from __future__ import annotations

from os import PathLike

from ..errors import AutotunerError


class TraceError(AutotunerError, ValueError):
    """A trace file that cannot be read: names the file and what is wrong, on one line."""

    def __init__(self, path: str | PathLike[str], problem: str):
        self.path = str(path)
        self.problem = " ".join(str(problem).split())
        super().__init__(f"{self.path}: {self.problem}")
