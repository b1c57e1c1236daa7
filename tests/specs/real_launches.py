"""The corpus of real public launches (tests/fixtures/launches/real/): each file's first line names its source
(`# source: https://github.com/OWNER/REPO/blob/COMMIT/PATH`); the rest is the file unchanged. `materialize` lays
them out as their repositories do, so that a launch finds the helpers it `source`s where it would."""

from __future__ import annotations

import re
from pathlib import Path

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "launches" / "real"
SOURCE = re.compile(r"# source: https://github\.com/([^/]+)/([^/]+)/blob/([0-9a-f]{40})/(\S+)")


def fixtures(group: str) -> list[Path]:
    return sorted(p for p in (REAL / group).rglob("*") if p.is_file() and p.name != "SOURCES.md")


def helpers(group: str) -> set[str]:
    """Files SOURCES.md marks as helpers another file sources or runs (not launches by themselves)."""
    text = (REAL / group / "SOURCES.md").read_text()
    return {m.group(1) for m in re.finditer(r"^- `([^`]+)`.*HELPER", text, re.M)}


def materialize(group: str, root: Path) -> dict[str, Path]:
    """Write every fixture of `group` at OWNER/REPO/PATH under `root`; fixture name -> its laid-out path."""
    out = {}
    for fixture in fixtures(group):
        first, _, rest = fixture.read_text().partition("\n")
        m = SOURCE.match(first)
        assert m, f"{fixture.name}: first line must be '# source: <github blob url>'"
        path = root / m.group(1) / m.group(2) / m.group(4)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rest)
        out[fixture.name] = path
    return out
