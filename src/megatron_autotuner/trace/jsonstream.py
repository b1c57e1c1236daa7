"""Streaming reader of Chrome / Kineto trace JSON (`.json` or gzip-compressed).

The file is decoded in chunks of `chunk_chars` characters; each element of the `traceEvents`
array is decoded on its own with the C scanner of the standard `json` module and handed to the
caller, so memory holds one chunk plus whatever the caller keeps, never the whole document.
Top-level keys other than `traceEvents` (Kineto writes `distributedInfo`, `deviceProperties`,
`baseTimeNanoseconds`, ... before the array) are collected in `metadata`. The Chrome "JSON array
format" (a bare array of events) is accepted too.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from os import PathLike
from typing import Any

from ..files import open_input, unreadable_value
from .errors import TraceError

_WS = re.compile(r"[ \t\n\r]*")
_GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_CHUNK_CHARS = 1 << 22  # 4 Mi characters per read
_LOW_WATER_CHARS = 1 << 20  # refill when less than this is left to decode
_MAX_VALUE_CHARS = 1 << 26  # a single event larger than 64 Mi characters is taken as broken JSON


def is_gzip_file(path: str | PathLike[str]) -> bool:
    """True when the file starts with the gzip magic bytes (whatever its suffix)."""
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


class TraceReader:
    """Incremental reader of one trace file. Use as a context manager.

    `header()` reads the top-level keys that come before `traceEvents`; `events()` yields each
    event dict; after `events()` is exhausted, `metadata` holds every top-level key but
    `traceEvents` (those after the array too).
    """

    def __init__(self, path: str | PathLike[str], chunk_chars: int = DEFAULT_CHUNK_CHARS):
        self.path = str(path)
        self.metadata: dict[str, Any] = {}
        self._chunk_chars = chunk_chars
        self._scan = json.JSONDecoder().scan_once
        self._buf = ""
        self._pos = 0
        self._dropped = 0  # characters dropped from the front of the buffer so far
        self._eof = False
        self._state = "start"  # start -> header -> events -> done
        self._bare_array = False
        # no size bound (traces run to GiBs, read in chunks); a directory, a device or a FIFO without a
        # writer is refused or reads as empty instead of blocking
        raw, _ = open_input(self.path, "trace", error=lambda problem: TraceError(self.path, f"cannot open: {problem}"))
        self._raw = raw
        try:
            gz = raw.peek(2)[:2] == _GZIP_MAGIC  # type: ignore[attr-defined]  # a BufferedReader: no seek (pipes)
        except OSError as exc:
            raw.close()
            raise TraceError(self.path, f"cannot read: {exc}") from None
        stream: Any = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        self._compressed = gz
        self._text = io.TextIOWrapper(stream, encoding="utf-8-sig", errors="strict")

    @property
    def bare_array(self) -> bool:
        """True for the Chrome "JSON array format" (no top-level object, hence no metadata)."""
        return self._bare_array

    # context manager -------------------------------------------------------------------------
    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken stream must not hide the real error
            self._text.close()
        self._raw.close()

    # low level -------------------------------------------------------------------------------
    def _error(self, problem: str) -> TraceError:
        return TraceError(self.path, problem)

    def _fill(self) -> bool:
        """Append one chunk to the buffer (dropping what was consumed); False at end of file."""
        if self._eof:
            return False
        try:
            chunk = self._text.read(self._chunk_chars)
        except EOFError:
            raise self._error("truncated gzip stream (compressed file ended before its end marker)") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise self._error(f"corrupt gzip data ({exc})") from None
        except UnicodeDecodeError as exc:
            raise self._error(f"not UTF-8 text ({exc.reason} at byte {exc.start} of a chunk)") from None
        except OSError as exc:
            raise self._error(f"read failed ({exc})") from None
        if not chunk:
            self._eof = True
            return False
        self._dropped += self._pos
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        return True

    def _offset(self) -> int:
        return self._dropped + self._pos

    def _peek(self) -> str:
        """Skip whitespace; return the next character ('' at end of file)."""
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def _expect(self, chars: str, where: str) -> str:
        c = self._peek()
        if c == "" or c not in chars:
            found = "end of file" if c == "" else repr(c)
            if c == "" and self._state != "start":
                raise self._error(f"truncated JSON: file ends {where} (expected {' or '.join(map(repr, chars))})")
            raise self._error(
                f"not valid trace JSON: expected {' or '.join(map(repr, chars))} {where}, "
                f"found {found} at character {self._offset()}"
            )
        self._pos += 1
        return c

    def _value(self, where: str) -> Any:
        """Decode one complete JSON value at the current position."""
        self._peek()
        while True:
            buf, pos = self._buf, self._pos
            try:
                obj, end = self._scan(buf, pos)
            except StopIteration:
                if self._eof and pos >= len(buf):
                    raise self._error(f"truncated JSON: file ends {where}") from None
                if not self._eof and len(buf) - pos < _MAX_VALUE_CHARS and self._fill():
                    continue
                raise self._error(f"not valid JSON: expected a value {where} at character {self._offset()}") from None
            except json.JSONDecodeError as exc:
                if not self._eof and len(buf) - pos < _MAX_VALUE_CHARS and self._fill():
                    continue
                if self._eof and (exc.pos >= len(buf) - 1 or exc.msg.startswith("Unterminated string")):
                    raise self._error(f"truncated JSON: file ends {where} ({exc.msg})") from None
                raise self._error(f"not valid JSON {where}: {exc.msg} at character {self._dropped + exc.pos}") from None
            except RecursionError:
                raise self._error(f"not valid JSON {where}: nested too deeply at character {self._offset()}") from None
            except ValueError as exc:
                raise self._error(f"not valid JSON {where}: {unreadable_value(exc)}") from None
            if end >= len(buf) and not self._eof and self._fill():
                continue  # a number at the very end of the buffer may continue in the next chunk
            self._pos = end
            return obj

    # structure -------------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        """Read top-level keys up to the `traceEvents` array; return `metadata` so far."""
        if self._state != "start":
            return self.metadata
        first = self._peek()
        if first == "":
            raise self._error("empty file")
        if first == "[":
            self._pos += 1
            self._bare_array = True
            self._state = "events"
            return self.metadata
        if first != "{":
            kind = "gzip-compressed " if self._compressed else ""
            raise self._error(f"not a {kind}JSON trace: expected '{{' or '[' at the start, found {first!r}")
        self._pos += 1
        self._state = "header"
        if self._read_members(stop_at_events=True):
            self._state = "events"
        else:
            self._state = "done"
            raise self._no_events_error()
        return self.metadata

    def _no_events_error(self) -> TraceError:
        keys = ", ".join(sorted(self.metadata)[:8]) or "none"
        return self._error(f"not a Kineto/Chrome trace: no 'traceEvents' array (top-level keys: {keys})")

    def _read_members(self, stop_at_events: bool) -> bool:
        """Read `"key": value` members; True when positioned inside the traceEvents array."""
        c = self._peek()
        if c == "}":
            self._pos += 1
            return False
        while True:
            key = self._value("at a top-level key")
            if not isinstance(key, str):
                raise self._error(f"not valid JSON: top-level key is not a string at character {self._offset()}")
            self._expect(":", f"after top-level key {key!r}")
            if key == "traceEvents" and stop_at_events:
                if self._peek() != "[":
                    raise self._error("not a Kineto/Chrome trace: 'traceEvents' is not an array")
                self._pos += 1
                return True
            self.metadata[key] = self._value(f"in the value of top-level key {key!r}")
            if self._expect(",}", "after a top-level value") == "}":
                return False

    def events(self) -> Iterator[dict[str, Any]]:
        """Yield each event of `traceEvents` (dicts); fills `metadata` with trailing keys."""
        self.header()
        if self._state != "events":
            return
        scan = self._scan
        ws = _WS.match
        index = 0
        # empty array?
        if self._peek() == "]":
            self._pos += 1
        else:
            while True:
                if len(self._buf) - self._pos < _LOW_WATER_CHARS and not self._eof:
                    self._fill()
                buf, pos = self._buf, self._pos
                try:
                    obj, end = scan(buf, pos)
                except (StopIteration, ValueError, RecursionError):  # ValueError: JSONDecodeError and its like
                    obj = self._value(f"in traceEvents[{index}]")  # slow path: refills or raises
                    buf, end = self._buf, self._pos
                else:
                    if end >= len(buf) and not self._eof:
                        obj = self._value(f"in traceEvents[{index}]")
                        buf, end = self._buf, self._pos
                if type(obj) is not dict:
                    kind = type(obj).__name__
                    raise self._error(f"not a Chrome trace: traceEvents[{index}] is a {kind}, not an object")
                pos = ws(buf, end).end()
                if pos < len(buf) and buf[pos] == ",":
                    self._pos = ws(buf, pos + 1).end()
                    index += 1
                    yield obj
                    continue
                self._pos = pos
                sep = self._expect(",]", f"after traceEvents[{index}]")
                index += 1
                yield obj
                if sep == "]":
                    break
                self._peek()
        if self._bare_array:
            self._state = "done"
        else:
            if self._expect(",}", "after the traceEvents array") == ",":
                self._read_members(stop_at_events=False)
            self._state = "done"
        if self._peek() != "":
            raise self._error(f"not valid JSON: extra data after the top-level value at character {self._offset()}")
