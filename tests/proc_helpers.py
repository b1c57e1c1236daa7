"""Which processes are still alive: a killed job must not leave ranks behind (Linux /proc)."""

from pathlib import Path


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes whose arguments contain `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        line = " ".join(a.decode(errors="replace") for a in args if a)
        if text in line and state != "Z":
            found.append(line)
    return found
