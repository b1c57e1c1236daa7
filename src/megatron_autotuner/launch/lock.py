"""A lock on an output folder: one live sweep writes into a folder at a time.

`.mat.lock` holds the owner's `pid:start_ticks`, host and command. A second `mat` finds a live owner and stops
with one line; a lock whose owner has ended (killed, crashed) is taken over. The file is made with O_EXCL, so
two sweeps starting together cannot both win.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
from pathlib import Path

from ..errors import AutotunerError
from .process import is_alive, process_identity

LOCK_FILE = ".mat.lock"


class OutputLock:
    """`with OutputLock(out_dir, "validate"):` — held while jobs write into `out_dir`."""

    def __init__(self, out_dir: str | Path, command: str) -> None:
        self.path = Path(out_dir) / LOCK_FILE
        self.command = command
        self.identity = process_identity(os.getpid())
        self.held = False

    def owner(self) -> dict | None:
        """The lock's record, or None when there is none (an unreadable one counts as abandoned)."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "owner": self.identity,
            "host": socket.gethostname(),
            "command": self.command,
            "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self.owner()
                if owner and owner.get("owner") == self.identity:
                    self.held = True
                    return
                if owner and self._owner_live(owner):
                    raise AutotunerError(
                        f"output_dir: {self.path.parent} is in use by a running mat {owner.get('command', '')} "
                        f"(pid {str(owner.get('owner')).split(':')[0]} on {owner.get('host')}, since "
                        f"{owner.get('since')}); wait for it, stop it, or choose another --output-dir"
                    ) from None
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()  # its owner has ended: take it over
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            self.held = True
            return
        raise AutotunerError(f"output_dir: could not lock {self.path.parent} (another mat keeps taking it)")

    @staticmethod
    def _owner_live(owner: dict) -> bool:
        if owner.get("host") != socket.gethostname():
            return True  # a shared folder used from another node: its process cannot be checked from here
        return is_alive(str(owner.get("owner", "")))

    def release(self) -> None:
        if self.held:
            owner = self.owner()
            if owner is not None and owner.get("owner") == self.identity:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            self.held = False

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
