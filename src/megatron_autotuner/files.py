"""Reading the files a user names and checking where outputs go, with one-line errors.

Every user-given input file (model config, hardware yaml, calibration, layouts, case file, launch file,
classification rules, result records, traces, memory snapshots) is opened through `open_input`, which
refuses directories and devices, never blocks on a FIFO without a writer, and reads at most
`limit_bytes + 1` bytes (so `/dev/zero` or `<(yes)` cannot fill memory). `read_text_bounded` also
turns bytes that are not UTF-8 into one line naming the file and the offset.

Every command that writes files checks its output directory with `check_output_dir` before any long
work (a search, a sweep) and creates it with `ensure_output_dir`; `check_output_file` does the same for a
single output file, and `refuse_overwriting_inputs` stops an output that is one of the inputs.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from os import PathLike
from pathlib import Path
from typing import IO, Any

from .errors import AutotunerError, ConfigError

MIB = 1 << 20
CONFIG_LIMIT_BYTES = 4 * MIB
"""A config, hardware, launch, layouts, case or rules file: a few KiB in practice."""
DATA_LIMIT_BYTES = 64 * MIB
"""A calibration file or a JSON-lines record file written by a sweep."""
SNAPSHOT_LIMIT_BYTES = 4 << 30
"""A CUDA allocator snapshot pickle (can be hundreds of MiB compressed)."""

ErrorFactory = Callable[[str], AutotunerError]


def _size_text(n: int) -> str:
    return f"{n / MIB:g} MiB" if n >= MIB else f"{n} bytes"


def os_problem(exc: OSError) -> str:
    """What an `OSError` means for a file the user named, without the path (the caller names it)."""
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "is a directory, not a file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return str(exc.strerror or exc)


def _default_error(path: str | PathLike[str], field: str) -> ErrorFactory:
    return lambda problem: ConfigError(field, f"cannot read {path}: {problem}")


def open_input(
    path: str | PathLike[str], field: str = "path", *, error: ErrorFactory | None = None
) -> tuple[IO[bytes], int | None]:
    """Open a user's input file for binary reading: (file, size in bytes or None for a pipe).

    Refuses a directory, a device or a socket; a FIFO is opened without waiting for a writer (no writer:
    it reads as empty). Problems raise `error(problem)` (default: `ConfigError(field, "cannot read PATH: ...")`).
    """
    err = error or _default_error(path, field)
    if str(path) == "":
        raise err("the path is empty")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as exc:
        raise err(os_problem(exc) if isinstance(exc, OSError) else str(exc)) from None
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            raise err("is a directory, not a file")
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            kind = "a character device" if stat.S_ISCHR(mode) else "a device or socket"
            raise err(f"is {kind}, not a regular file")
        if stat.S_ISFIFO(mode) and hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # a writer that is there is waited for; none: end of file at once
        f = os.fdopen(fd, "rb")
    except OSError as exc:
        os.close(fd)
        raise err(os_problem(exc)) from None
    except BaseException:
        os.close(fd)
        raise
    return f, (st.st_size if stat.S_ISREG(st.st_mode) else None)


def read_bytes_bounded(
    path: str | PathLike[str],
    field: str = "path",
    limit_bytes: int = CONFIG_LIMIT_BYTES,
    *,
    error: ErrorFactory | None = None,
) -> bytes:
    """The bytes of a user's file, at most `limit_bytes` (a longer file is refused; at most limit+1 bytes are
    read, so /dev/zero-like inputs stop). One-line errors through `error` as in `open_input`."""
    err = error or _default_error(path, field)
    too_big = f"is larger than {_size_text(limit_bytes)}, the limit for this input (is it the file you meant?)"
    f, size = open_input(path, field, error=err)
    with f:
        if size is not None and size > limit_bytes:
            raise err(too_big)
        try:
            data = f.read(limit_bytes + 1)
        except OSError as exc:
            raise err(os_problem(exc)) from None
    if len(data) > limit_bytes:
        raise err(too_big)
    return data


def decode_utf8(data: bytes, error: ErrorFactory) -> str:
    """`data` as UTF-8 text (a leading BOM dropped), or `error("is not UTF-8 text (...)")`."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex()
        raise error(f"is not UTF-8 text ({exc.reason}: byte 0x{bad} at offset {exc.start})") from None


def read_text_bounded(
    path: str | PathLike[str],
    field: str = "path",
    limit_bytes: int = CONFIG_LIMIT_BYTES,
    *,
    error: ErrorFactory | None = None,
) -> str:
    """The UTF-8 text of a user's file (see `read_bytes_bounded`); bytes that are not UTF-8 are a one-line error."""
    err = error or _default_error(path, field)
    return decode_utf8(read_bytes_bounded(path, field, limit_bytes, error=err), err)


def read_json_bounded(
    path: str | PathLike[str],
    field: str = "path",
    limit_bytes: int = CONFIG_LIMIT_BYTES,
    *,
    error: ErrorFactory | None = None,
) -> Any:
    """The JSON document of a user's file; invalid JSON is `ConfigError(field, "PATH is not valid JSON (...)")`."""

    return parse_json_text(read_text_bounded(path, field, limit_bytes, error=error), path, field)


def parse_json_text(text: str, path: str | PathLike[str], field: str = "path") -> Any:
    """The JSON document in `text` (read from `path`); invalid JSON, nesting past the recursion limit or a number
    Python cannot hold is `ConfigError(field, "PATH is not valid JSON (...)")`."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"
        raise ConfigError(field, f"{path} is not valid JSON ({where}: {exc.msg})") from None
    except RecursionError:
        raise ConfigError(field, f"{path} is not valid JSON (nested too deeply)") from None
    except ValueError as exc:
        raise ConfigError(field, f"{path} is not valid JSON ({unreadable_value(exc)})") from None


def unreadable_value(exc: ValueError) -> str:
    """One line for the ValueError a JSON or yaml parser lets through for a value Python cannot hold: an integer
    past Python's 4,300-digit limit (int_max_str_digits), a date such as 2024-13-45 in yaml."""
    return "a value Python cannot read: " + " ".join(str(exc).split(";")[0].split())


# a user's yaml: nesting, alias references and the size its aliases unfold to (an 811-byte alias bomb unfolds to
# gigabytes when walked)
MAX_YAML_DEPTH = 64
MAX_YAML_ALIASES = 1000
MAX_YAML_NODES = 1_000_000


class YamlLimitError(ValueError):
    """A yaml document past one of the limits above; its text says which, as a predicate ("is nested deeper ...")."""


def _unfolded_nodes(node: Any, memo: dict[int, int]) -> int:
    """Nodes of a composed yaml node with every alias unfolded, capped just past MAX_YAML_NODES (shared nodes are
    counted once per reference, each computed once)."""
    import yaml

    if id(node) in memo:
        return memo[id(node)]
    count = 1
    if isinstance(node, yaml.SequenceNode):
        count += sum(_unfolded_nodes(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        count += sum(_unfolded_nodes(k, memo) + _unfolded_nodes(v, memo) for k, v in node.value)
    memo[id(node)] = min(count, MAX_YAML_NODES + 1)
    return memo[id(node)]


def load_yaml_bounded(text: str) -> Any:
    """`yaml.safe_load` of `text` that refuses, as `YamlLimitError`, documents nested deeper than MAX_YAML_DEPTH,
    referring to anchors more than MAX_YAML_ALIASES times or unfolding to more than MAX_YAML_NODES values (invalid
    yaml is `yaml.YAMLError`, as from safe_load)."""
    import yaml

    class Loader(yaml.SafeLoader):
        depth = aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_YAML_ALIASES:
                    raise YamlLimitError(f"has more than {MAX_YAML_ALIASES} alias references (the limit)")
            self.depth += 1
            if self.depth > MAX_YAML_DEPTH:
                raise YamlLimitError(f"is nested deeper than {MAX_YAML_DEPTH} levels (the limit)")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            unfolded = _unfolded_nodes(node, {})
        except RecursionError:
            unfolded = MAX_YAML_NODES + 1
        if unfolded > MAX_YAML_NODES:
            raise YamlLimitError(f"unfolds its aliases to more than {MAX_YAML_NODES} values (the limit)")
        try:
            return loader.construct_document(node)
        except ValueError as exc:  # invalid yaml, as the callers expect, not a bare ValueError
            raise yaml.constructor.ConstructorError(None, None, unreadable_value(exc)) from None
    finally:
        loader.dispose()


def read_yaml_bounded(
    path: str | PathLike[str],
    field: str = "path",
    limit_bytes: int = CONFIG_LIMIT_BYTES,
    *,
    error: ErrorFactory | None = None,
) -> Any:
    """The yaml document of a user's file (`yaml.safe_load`); invalid yaml is `ConfigError(field, "PATH is not
    valid yaml: ...")` on one line."""
    import yaml

    text = read_text_bounded(path, field, limit_bytes, error=error)
    try:
        return load_yaml_bounded(text)
    except YamlLimitError as exc:
        raise ConfigError(field, f"{path} {exc}") from None
    except yaml.YAMLError as exc:
        first = " ".join(str(exc).splitlines()[0].split()) if str(exc) else type(exc).__name__
        raise ConfigError(field, f"{path} is not valid yaml: {first}") from None
    except RecursionError:
        raise ConfigError(field, f"{path} is not valid yaml (nested too deeply)") from None


def read_stdin_bounded(field: str, limit_bytes: int = CONFIG_LIMIT_BYTES) -> str:
    """Standard input as text, at most `limit_bytes` characters (more is a one-line error)."""
    import sys

    try:
        text = sys.stdin.read(limit_bytes + 1)
    except UnicodeDecodeError as exc:
        raise ConfigError(field, f"standard input is not UTF-8 text ({exc.reason} at offset {exc.start})") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(field, f"cannot read standard input: {exc}") from None
    if len(text) > limit_bytes:
        raise ConfigError(field, f"standard input is larger than {_size_text(limit_bytes)}, the limit for this input")
    return text


# ---- outputs ---------------------------------------------------------------------------------------------------


def _nearest_existing(path: Path) -> Path:
    p = path
    while not os.path.lexists(p):
        parent = p.parent
        if parent == p:
            break
        p = parent
    return p


def check_output_dir(path: str | PathLike[str], field: str = "output_dir") -> Path:
    """Refuse an output directory that cannot be created or written, without creating anything: an empty
    path, an existing file or device, a path below a file, a folder (or nearest existing parent) that is not
    writable. Returns the path. Call before long work; create it with `ensure_output_dir` when writing."""
    if str(path).strip() == "":
        raise ConfigError(field, "is empty (give a directory path)")
    p = Path(path).expanduser()
    if os.path.lexists(p):
        if not p.is_dir():
            raise ConfigError(field, f"{path} exists and is not a directory")
        target = p
    else:
        target = _nearest_existing(p.absolute().parent)
        if not target.is_dir():
            raise ConfigError(field, f"cannot create {path}: {target} is not a directory")
    problem = None
    if not os.access(target, os.W_OK | os.X_OK):
        problem = "permission denied"
    else:  # root passes os.access everywhere: try a file (read-only file systems, /proc, /sys)
        try:
            fd, probe = tempfile.mkstemp(prefix=".mat-write-check-", dir=target)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            problem = str(exc.strerror or exc)
    if problem is not None:
        what = "is not writable" if target == p else f"cannot be created ({target} is not writable)"
        raise ConfigError(field, f"{path} {what}: {problem}")
    return p


def write_text_atomic(path: str | PathLike[str], text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same folder, flushed and renamed over it: a reader
    (or a later run) sees the old complete file or the new one, never a part. A failure (a full disk, no permission)
    removes the temporary file and is a one-line `ConfigError` naming the path; the old file stays."""
    p = Path(path)
    tmp = None
    try:
        # os.open with 0o666, as Path.write_text creates a file: the umask decides its mode (mkstemp would make it 0600)
        name = p.with_name(f".{p.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        tmp = name
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        tmp = None
    except OSError as exc:
        raise ConfigError("output", f"cannot write {p}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return p


def ensure_output_dir(path: str | PathLike[str], field: str = "output_dir") -> Path:
    """Create the output directory (and its parents) and check that a file can be written in it; a one-line
    `ConfigError` otherwise (a file in the way, no permission, a read-only file system, an empty path)."""
    p = check_output_dir(path, field)
    try:
        p.mkdir(parents=True, exist_ok=True)
        check_output_dir(p, field)
    except OSError as exc:
        raise ConfigError(field, f"cannot write to {path}: {exc.strerror or exc}") from None
    return p


def check_output_file(path: str | PathLike[str], field: str = "output") -> Path:
    """Refuse an output file path that is empty, a directory, or whose folder cannot be created or written."""
    if str(path).strip() == "":
        raise ConfigError(field, "is empty (give a file path)")
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(field, f"{path} is a directory; give a file path")
    if os.path.lexists(p) and not p.is_file():
        raise ConfigError(field, f"{path} exists and is not a regular file")
    check_output_dir(p.absolute().parent, field)
    return p


def _same_file(a: Path, b: Path) -> bool:
    """Whether `a` and `b` name one file (by inode where both exist, else by resolved path); False for a path no
    file can have (a NUL byte): the reader of that input refuses it in one line."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        pass
    try:
        return a.resolve() == b.resolve()
    except (OSError, ValueError):
        return False


def refuse_overwriting_inputs(
    output: str | PathLike[str], inputs: Iterable[str | PathLike[str]], field: str = "output"
) -> None:
    """A one-line `ConfigError` when `output` is (or resolves to) one of `inputs`: it would be overwritten."""
    out = Path(output).expanduser()
    for item in inputs:
        if _same_file(out, Path(item).expanduser()):
            raise ConfigError(field, f"{output} is also an input ({item}); write the output to another file")
