"""A static reader of bash launch scripts: what a script would run, read without running anything.

Training launches are bash: flags collected in arrays, variables with defaults, arithmetic, `if` / `case` blocks
that pick values, helper files `source`d, the training command run through `srun ... bash -c "$cmd"`. `read_shell`
walks a script in order as bash would, with an environment that holds only what the caller gives (`--var`), and
returns every simple command it would run, expanded into words, plus its variables and arrays.

What it does as bash does (bash(1), "EXPANSION" and "SHELL GRAMMAR"): assignments (`export` / `declare` /
`local` ...), `VAR+=`, arrays `A=( ... )` / `A+=( ... )` / `A[i]=v` with `"${A[@]}"` / `${A[*]}` / `${#A[@]}`;
`${V:-d}` `${V-d}` `${V:=d}` `${V:?m}` `${V:+a}` `${#V}` `${V#p}` `${V%p}` `${V/p/r}` `${V^^}` `${V,,}`
`${V:o:l}` (nested); `$(( ))` and `(( ))` integer arithmetic; quoting, escapes and word splitting; `if` / `elif` /
`case` with `[ ]` / `[[ ]]` / `test` conditions; `&&` / `||` lists; functions (with `$1 ...` in their bodies);
`source` / `.` of a file next to the script; `eval`.

What it cannot know, it assumes and says so (`ShellReading.notes`): positional parameters `$1 ... $N`, `$@` are empty
(`$0` is the script's path); `$( ... )` is empty except `dirname` / `basename` / `echo` / `cd X && pwd`; a condition
that runs a program, or tests a file, is false; `for` / `while` bodies are read once (a `for` with its first item);
`exit` is ignored. The reader is bounded: `MAX_STEPS` commands, `MAX_DEPTH` nested sources / evals / calls, and
`MAX_WORD_CHARS` per expanded word.
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .shell_syntax import (
    ASSIGNMENT,
    FIELD,
    NAME,
    AndOr,
    Case,
    Function,
    Group,
    If,
    Lexer,
    Loop,
    Simple,
    Token,
    array_words,
    parse,
)

MAX_STEPS = 200_000  # simple commands and assignments executed
MAX_DEPTH = 32  # nested source / eval / function calls / substitutions
MAX_WORD_CHARS = 1 << 20
# characters of variable values built over the whole read: `A="$A ..."` repeated copies the value each time, so
# its cost is quadratic in the rounds; this bounds the copying (a real launch builds a few KiB)
MAX_BUILT_CHARS = 1 << 30
MAX_ARRAY_ITEMS = 100_000
MAX_LOOP_ROUNDS = 1_000
DECLARATIONS = ("export", "declare", "typeset", "local", "readonly")
# commands that change nothing a launch reads (their output, files and the working directory are not followed)
IGNORED = frozenset(
    ("set", "shopt", "pushd", "popd", ":", "trap", "ulimit", "umask", "wait", "sleep",
     "mkdir", "rm", "cp", "mv", "touch", "ln", "chmod", "hash", "alias", "unalias", "read", "true")
)  # fmt: skip


# a run of characters that are themselves inside double quotes
_DOUBLE_QUOTED_PLAIN = re.compile(r'[^"\\$`]*')


@dataclass(frozen=True)
class ShellCommand:
    """One simple command the script runs: its words after expansion, and the assignments before it."""

    words: tuple[str, ...]
    assignments: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ShellReading:
    """What `read_shell` found: the commands in the order they would run, the variables and arrays at the end,
    the environment given to the script, and the assumptions it had to make."""

    commands: tuple[ShellCommand, ...]
    variables: dict[str, str]
    arrays: dict[str, tuple[str, ...]]
    exported: frozenset[str]
    notes: tuple[str, ...]


# ---------------------------------------------------------------------------------------------------------------
# Expansion and execution
# ---------------------------------------------------------------------------------------------------------------


class _Exit(Exception):
    """`return` out of a function body."""


_ARITH_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: operator.mod,
    ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}  # fmt: skip
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.Eq: operator.eq, ast.NotEq: operator.ne}  # fmt: skip
_INT_LIMIT = 1 << 63


def _arith_node(node: ast.AST) -> int:
    """Bash integer arithmetic on a parsed expression: truncating division, 64-bit bounds."""
    if isinstance(node, ast.Expression):
        return _arith_node(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        value = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not, ast.Invert)):
        v = _arith_node(node.operand)
        value = {ast.USub: -v, ast.UAdd: v, ast.Not: int(not v), ast.Invert: ~v}[type(node.op)]
    elif isinstance(node, ast.BinOp):
        a, b = _arith_node(node.left), _arith_node(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv)):
            if b == 0:
                raise ValueError("division by 0")
            value = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        elif isinstance(node.op, ast.Pow):
            if b < 0 or b > 63:
                raise ValueError("exponent out of range")
            value = a**b
        elif type(node.op) in _ARITH_OPS:
            if isinstance(node.op, ast.Mod) and b == 0:
                raise ValueError("division by 0")
            if isinstance(node.op, (ast.LShift, ast.RShift)) and not 0 <= b < 64:
                raise ValueError("shift out of range")
            value = _ARITH_OPS[type(node.op)](a, b)
        else:
            raise ValueError("operator")
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        value = int(_COMPARE[type(node.ops[0])](_arith_node(node.left), _arith_node(node.comparators[0])))
    elif isinstance(node, ast.BoolOp):
        values = [_arith_node(v) for v in node.values]
        value = int(all(values) if isinstance(node.op, ast.And) else any(values))
    elif isinstance(node, ast.IfExp):
        value = _arith_node(node.body) if _arith_node(node.test) else _arith_node(node.orelse)
    else:
        raise ValueError("expression")
    if not -_INT_LIMIT <= value < _INT_LIMIT:
        raise ValueError("out of 64-bit range")
    return value


def _python_arith(expr: str) -> str:
    """Bash arithmetic syntax as a Python expression: && || ! and a ? b : c."""
    expr = expr.replace("&&", " and ").replace("||", " or ")
    expr = re.sub(r"!(?!=)", " not ", expr)
    m = re.fullmatch(r"(.+?)\?(.+):(.+)", expr)
    if m:
        expr = f"({m.group(2)}) if ({m.group(1)}) else ({m.group(3)})"
    return expr


class _Shell:
    def __init__(self, env: dict[str, str], script: Path | None):
        self.vars: dict[str, str] = dict(env)
        self.arrays: dict[str, list[str]] = {}
        self.exported: set[str] = set(env)
        self.functions: dict[str, list] = {}
        self.positional: list[str] = []
        self.script = script
        self.commands: list[ShellCommand] = []
        self.notes: dict[str, None] = {}
        self.steps = 0
        self.depth = 0
        self.cwd: str | None = None
        self.captures: list[list[str]] = []  # output of the $( ... ) being read
        self.unknown_run: list[bool] = []  # a $( ... ) ran a command that was not read
        self.unset_reads = 0  # reads of unset variables or of values made from them (unknown values)
        self.unknown: set[str] = set()  # variables assigned from unknown values
        self.built_chars = 0  # characters of values assigned so far (`MAX_BUILT_CHARS`)

    # ---- bookkeeping ----
    def note(self, text: str) -> None:
        if len(self.notes) < 200:
            self.notes[text] = None

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise ConfigError(FIELD, f"more than {MAX_STEPS} commands to read (a loop that never ends?)")

    def nested(self):
        shell = self

        class _Depth:
            def __enter__(self):
                shell.depth += 1
                if shell.depth > MAX_DEPTH:
                    raise ConfigError(FIELD, f"more than {MAX_DEPTH} nested source / eval / calls")

            def __exit__(self, *exc):
                shell.depth -= 1

        return _Depth()

    # ---- variables ----
    def get(self, name: str) -> str | None:
        if name in self.unknown:
            self.unset_reads += 1
        if name.isdigit():
            n = int(name)
            if n == 0:
                return str(self.script) if self.script else "script.sh"
            return self.positional[n - 1] if n <= len(self.positional) else None
        if name == "#":
            return str(len(self.positional))
        if name in ("@", "*"):
            return " ".join(self.positional)
        if name == "BASH_SOURCE":
            return str(self.script) if self.script else "script.sh"
        if name in ("RANDOM", "$", "!", "SLURM_JOB_ID", "PPID"):
            self.note(f"${name}: unknown, read as 0")
            return "0"
        if name == "?":
            return "0"
        if name in self.arrays:
            return self.arrays[name][0] if self.arrays[name] else ""
        return self.vars.get(name)

    def set(self, name: str, value: str, append: bool = False) -> None:
        if len(value) > MAX_WORD_CHARS:
            raise ConfigError(FIELD, f"${name} grows past {MAX_WORD_CHARS} characters")
        self.built_chars += len(value) + (len(self.vars.get(name, "")) if append else 0)
        if self.built_chars > MAX_BUILT_CHARS:
            raise ConfigError(
                FIELD,
                f"the script builds more than {MAX_BUILT_CHARS / 2**30:g} GiB of variable values "
                "(a string grown in a long loop?)",
            )
        if name in self.arrays and not append:
            self.arrays[name] = [value]
            return
        if name in self.arrays:
            self.arrays[name][0] = (self.arrays[name][0] if self.arrays[name] else "") + value
            return
        self.vars[name] = (self.vars.get(name, "") if append else "") + value

    def set_array(self, name: str, items: list[str], append: bool) -> None:
        current = self.arrays.get(name) or ([self.vars.pop(name)] if name in self.vars else [])
        size = (len(current) if append else 0) + len(items)
        if size > MAX_ARRAY_ITEMS:
            raise ConfigError(FIELD, f"array {name} grows past {MAX_ARRAY_ITEMS} items")
        self.vars.pop(name, None)
        if append:  # in place: `A+=(...)` in a loop stays linear
            current.extend(items)
            self.arrays[name] = current
        else:
            self.arrays[name] = list(items)

    # ---- expansion ----
    def expand(self, raw: str, split: bool = True) -> list[str]:
        """A raw word as bash expands it: one or more words (none for an unquoted empty expansion)."""
        words: list[str] = []
        current: list[str] = []
        have = False  # the word exists (quotes make an empty word)
        i, n = 0, len(raw)

        def emit_split(text: str) -> None:
            nonlocal have
            if not split:
                current.append(text)
                have = True
                return
            pieces = re.split(r"[ \t\n]+", text)
            for k, piece in enumerate(pieces):
                if k > 0 and (have or current):
                    words.append("".join(current))
                    current.clear()
                    have = False
                if piece:
                    current.append(piece)
                    have = True

        while i < n:
            c = raw[i]
            if c == "\\" and i + 1 < n:
                current.append(raw[i + 1])
                have = True
                i += 2
            elif c == "'":
                end = raw.index("'", i + 1)
                current.append(raw[i + 1 : end])
                have = True
                i = end + 1
            elif c == '"':
                i, parts = self._double(raw, i + 1)
                have = True
                for k, part in enumerate(parts):
                    if k > 0:  # "${A[@]}": a word per item
                        words.append("".join(current))
                        current.clear()
                    current.append(part)
            elif c == "$" or c == "`":
                i, value, items = self._dollar(raw, i)
                if items is not None and split:
                    for k, item in enumerate(items):
                        emit_split(item)
                        if k < len(items) - 1 and (have or current):
                            words.append("".join(current))
                            current.clear()
                            have = False
                else:
                    emit_split(value)
            else:
                j = i + 1  # a lone trailing backslash is itself (bash keeps it)
                while j < n and raw[j] not in "\\'\"$`":
                    j += 1
                current.append(raw[i:j])
                have = True
                i = j
        if have or current:
            words.append("".join(current))
        for w in words:
            if len(w) > MAX_WORD_CHARS:
                raise ConfigError(FIELD, f"a word grows past {MAX_WORD_CHARS} characters")
        return words

    def expand_one(self, raw: str) -> str:
        return " ".join(self.expand(raw, split=False))

    def _double(self, raw: str, i: int) -> tuple[int, list[str]]:
        """Inside double quotes from `i`: (index past the closing quote, the parts; more than one for "$@" or
        "${A[@]}"). Each part is built from pieces joined once, and a run of plain characters is one piece, so a long
        quoted string is read in linear time (appending character by character was quadratic: 400 KB took 3.7 s)."""
        parts: list[list[str]] = [[]]
        n = len(raw)
        while i < n:
            c = raw[i]
            if c == '"':
                return i + 1, ["".join(p) for p in parts]
            if c == "\\" and i + 1 < n and raw[i + 1] in '$`"\\\n':
                parts[-1].append(raw[i + 1] if raw[i + 1] != "\n" else "")
                i += 2
            elif c in "$`":
                i, value, items = self._dollar(raw, i)
                if items is not None:
                    if items:
                        parts[-1].append(items[0])
                        parts.extend([item] for item in items[1:])
                    elif len(parts) == 1 and not "".join(parts[0]):
                        parts = [[]]
                else:
                    parts[-1].append(value)
            else:
                j = max(i + 1, _DOUBLE_QUOTED_PLAIN.match(raw, i).end())  # a backslash that escapes nothing: itself
                parts[-1].append(raw[i:j])
                i = j
        return i, ["".join(p) for p in parts]

    def _dollar(self, raw: str, i: int) -> tuple[int, str, list[str] | None]:
        """A `$` or backtick expansion at `i`: (index past it, its value, the items of an array-at expansion)."""
        if raw[i] == "`":
            end = raw.index("`", i + 1)
            return end + 1, self._substitute(raw[i + 1 : end]), None
        if raw.startswith("$((", i):
            end = _matching(raw, i + 1, "(", ")")
            inner = raw[i + 3 : end - 2] if raw[end - 2 : end] == "))" else None
            if inner is not None:
                return end, self.arith(inner), None
        if raw.startswith("$(", i):
            end = _matching(raw, i + 1, "(", ")")
            return end, self._substitute(raw[i + 2 : end - 1]), None
        if raw.startswith("${", i):
            end = _matching(raw, i + 1, "{", "}")
            return end, *self._braced(raw[i + 2 : end - 1])
        if raw.startswith("$'", i):
            end = raw.index("'", i + 2)
            return end + 1, raw[i + 2 : end].encode().decode("unicode_escape", errors="replace"), None
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]|[@*#?$!-]").match(raw, i + 1)
        if not m:
            return i + 1, "$", None
        name = m.group(0)
        if name == "@":
            return m.end(), " ".join(self.positional), list(self.positional)
        value = self.get(name)
        if value is None:
            self.unset_read(name)
        return m.end(), value or "", None

    def unset_read(self, name: str) -> None:
        self.unset_reads += 1
        if not name.isdigit() and name not in "@*#":
            self.note(f"${name} is not set: read as empty")

    def _braced(self, body: str) -> tuple[str, list[str] | None]:
        """${...}: (value, items for [@] / $@)."""
        if body.startswith("#") and len(body) > 1:
            name = body[1:]
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]", name)
            if m:
                return str(len(self.arrays.get(m.group(1), []))), None
            return str(len(self.get(name) or "")), None
        if body.startswith("!"):
            self.note(f"${{{body}}}: indirect expansion not read, read as empty")
            return "", None
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?])(\[([^\]]*)\])?", body)
        if not m:
            raise ConfigError(FIELD, f"bad substitution ${{{body}}}")
        name, index, rest = m.group(1), m.group(3), body[m.end() :]
        items: list[str] | None = None
        if index in ("@", "*") or name == "@":
            items = list(self.arrays.get(name, [] if name not in self.vars else [self.vars[name]]))
            if name == "@":
                items = list(self.positional)
            sep = (self.vars.get("IFS", " ") or "")[:1] if index == "*" else " "
            value: str | None = sep.join(items) if items or name in self.arrays else None
            if index == "*":
                items = None
        elif index is not None:
            arr = self.arrays.get(name, [self.vars[name]] if name in self.vars else [])
            if name == "BASH_SOURCE":
                arr = [self.get(name) or ""]
            try:
                k = int(self.arith(index))
                value = arr[k] if -len(arr) <= k < len(arr) else None
            except (ValueError, ConfigError):
                value = None
        else:
            value = self.get(name)
        if not rest:
            if value is None:
                self.unset_read(name)
            return value or "", items
        return self._operator(name, value, rest), None

    def _operator(self, name: str, value: str | None, rest: str) -> str:
        m = re.match(r":?[-=?+]", rest)
        if m:
            op, word = m.group(0), rest[m.end() :]
            unset = value is None or (op.startswith(":") and value == "")
            if op.endswith("-"):
                return self.expand_one(word) if unset else value or ""
            if op.endswith("="):
                if unset:
                    self.set(name, self.expand_one(word))
                return self.get(name) or ""
            if op.endswith("+"):
                return "" if unset else self.expand_one(word)
            if unset:
                self.note(f"${{{name}{rest}}}: {name} is not set (bash would stop here); read as empty")
            return value or ""
        value = value or ""
        for op in ("##", "#", "%%", "%"):
            if rest.startswith(op):
                return _strip(value, self.expand_one(rest[len(op) :]), op)
        if rest.startswith("/"):
            every = rest.startswith("//")
            pattern, _, repl = rest[2 if every else 1 :].partition("/")
            regex = _glob_regex(self.expand_one(pattern))
            return re.sub(regex, self.expand_one(repl).replace("\\", "\\\\"), value, count=0 if every else 1)
        case = {"^^": str.upper, ",,": str.lower, "^": lambda v: v[:1].upper() + v[1:],
                ",": lambda v: v[:1].lower() + v[1:]}  # fmt: skip
        if rest in case:
            return case[rest](value)
        m = re.fullmatch(r":\s*([^:]*)(?::(.*))?", rest)
        if m:
            start = int(self.arith(m.group(1)) or 0)
            length = int(self.arith(m.group(2))) if m.group(2) is not None else None
            start = max(0, len(value) + start) if start < 0 else start
            return value[start:] if length is None else value[start : start + max(0, length)]
        self.note(f"${{{name}{rest}}}: not read, read as the value of ${name}")
        return value

    def arith(self, expr: str) -> str:
        text = self.expand_one(expr).strip()
        if len(text) > 10_000:
            raise ConfigError(FIELD, "an arithmetic expression longer than 10000 characters")

        def name_value(m: re.Match, depth: int = 0) -> str:
            value = self.get(m.group(0)) or "0"
            value = value.strip()
            if re.fullmatch(r"-?\d+", value):
                return value
            if depth < 8 and re.fullmatch(r"[A-Za-z0-9_+\-*/%() ]+", value):
                return "(" + NAME.sub(lambda mm: name_value(mm, depth + 1), value) + ")"
            return "0"

        try:
            resolved = NAME.sub(name_value, text)
            resolved = re.sub(r"\b0[xX]([0-9a-fA-F]+)\b", lambda m: str(int(m.group(1), 16)), resolved)
            resolved = re.sub(r"\b0+(\d)", r"\1", resolved)
            return str(_arith_node(ast.parse(_python_arith(resolved), mode="eval")))
        except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError) as exc:
            self.note(f"$(( {expr.strip()} )): {exc.__class__.__name__.lower()}, read as 0")
            return "0"

    def _substitute(self, command: str) -> str:
        """$( ... ) read in a subshell that runs only the shell's own commands and the pure ones launches use for
        paths and numbers (`echo`, `printf`, `dirname`, `basename`, `readlink -f`, `realpath`, `pwd`, `expr`);
        its output when nothing else ran, else unknown: read as empty."""
        joined = " ".join(command.split())
        saved = (dict(self.vars), {k: list(v) for k, v in self.arrays.items()}, self.cwd)
        self.captures.append([])
        self.unknown_run.append(False)
        try:
            with self.nested():
                self.run(parse(command))
        except (_Exit, _Break):
            pass
        except ConfigError:
            self.unknown_run[-1] = True
        finally:
            out = "".join(self.captures.pop())
            unknown = self.unknown_run.pop()
            self.vars, self.arrays, self.cwd = saved
        if unknown:
            self.note(f"$({joined[:60]}): not run, read as empty")
            self.unset_reads += 1
            return ""
        return out.rstrip("\n")

    def output(self, text: str) -> None:
        if self.captures:
            self.captures[-1].append(text)

    def pure(self, name: str, words: list[str]) -> bool:
        """The pure commands of `_substitute`: their output, when capturing; False for any other command."""
        args = [w for w in words[1:] if w != "--" and not w.startswith("-")]
        if name == "echo":
            flags = {"-n", "-e", "-ne", "-en", "-E"}
            rest = words[1:]
            newline = "-n" not in rest and "-ne" not in rest and "-en" not in rest
            self.output(" ".join(w for w in rest if w not in flags) + ("\n" if newline else ""))
        elif name == "printf":
            if len(words) > 3 and words[1] == "-v":
                self.set(words[2], _printf(words[3], words[4:]))
            elif len(words) > 1:
                self.output(_printf(words[1], words[2:]))
        elif name == "dirname" and len(args) == 1:
            self.output((posixpath.dirname(args[0].rstrip("/")) or ".") + "\n")
        elif name == "basename" and len(args) in (1, 2):
            base = posixpath.basename(args[0].rstrip("/"))
            self.output((base[: -len(args[1])] if len(args) == 2 and base.endswith(args[1]) else base) + "\n")
        elif name in ("readlink", "realpath") and len(args) == 1:
            self.output(args[0] + "\n")
        elif name == "pwd":
            if self.cwd is None:
                self.note("pwd: read as the script's folder")
            self.output((self.cwd or (str(self.script.parent) if self.script else ".")) + "\n")
        elif name == "cd":
            target = args[0] if args else ""
            base = self.cwd or (str(self.script.parent) if self.script else ".")
            self.cwd = target if target.startswith("/") else posixpath.normpath(posixpath.join(base, target))
        elif name == "expr" and len(words) > 1:
            self.output(self.arith(" ".join(words[1:])) + "\n")
        else:
            return False
        return True

    # ---- execution ----
    def run(self, nodes: list) -> int:
        status = 0
        for node in nodes:
            status = self.and_or(node)
        return status

    def and_or(self, node: AndOr) -> int:
        status = 0
        for op, pipeline in node.parts:
            if (op == "&&" and status != 0) or (op == "||" and status == 0):
                continue
            status = self.pipeline(pipeline)
        return status

    def pipeline(self, commands: list) -> int:
        status = 0
        for command in commands:
            status = self.command(command)
        return status

    def command(self, node) -> int:
        self.step()
        if isinstance(node, Simple):
            return self.simple(node)
        if isinstance(node, If):
            reads = self.unset_reads
            for cond, body in node.branches:
                if self.run(cond) == 0:
                    return self.run(body)
            if self.unset_reads > reads and (node.otherwise is None or _only_fails(node.otherwise)):
                self.note("if on unset variables: no branch matches, read the first")
                return self.run(node.branches[0][1])
            return self.run(node.otherwise) if node.otherwise is not None else 0
        if isinstance(node, Case):
            reads = self.unset_reads
            word = self.expand_one(node.word)
            unknown = self.unset_reads > reads
            for k, (patterns, body) in enumerate(node.items):
                if any(fnmatch.fnmatchcase(word, self.expand_one(p)) for p in patterns):
                    if unknown and patterns == ["*"] and _only_fails(body) and k > 0:
                        break
                    return self.run(body)
            if unknown and node.items and node.items[0][0] != ["*"]:
                self.note(f"case {node.word}: unset, read the first branch ({'|'.join(node.items[0][0])})")
                return self.run(node.items[0][1])
            return 0
        if isinstance(node, Loop):
            return self.loop(node)
        if isinstance(node, Function):
            self.functions[node.name] = node.body
            return 0
        if isinstance(node, Group):
            if not node.subshell:
                return self.run(node.body)
            saved = (dict(self.vars), {k: list(v) for k, v in self.arrays.items()})
            status = self.run(node.body)
            self.vars, self.arrays = saved
            return status
        raise ConfigError(FIELD, f"cannot read {type(node).__name__}")

    def loop(self, node: Loop) -> int:
        """for over its items (each), C-style for and while (their conditions, at most MAX_LOOP_ROUNDS rounds)."""
        status = 0
        try:
            if node.kind == "for" and node.var:
                items = list(self.positional) if node.items is None else [w for r in node.items for w in self.expand(r)]
                for item in items[:MAX_LOOP_ROUNDS]:
                    self.set(node.var, item)
                    status = self.run(node.body)
                return status
            if node.kind == "for":
                init, _, rest = node.condition[0].partition(";")
                cond, _, step = rest.partition(";")
                self.arith_command(init) if init.strip() else None
                rounds = 0
                while (not cond.strip() or int(self.arith(cond)) != 0) and rounds < MAX_LOOP_ROUNDS:
                    status = self.run(node.body)
                    self.arith_command(step) if step.strip() else None
                    rounds += 1
            else:
                rounds = 0
                while self.run(node.condition) == 0 and rounds < MAX_LOOP_ROUNDS:
                    status = self.run(node.body)
                    rounds += 1
            if rounds >= MAX_LOOP_ROUNDS:
                self.note(f"{node.kind} loop: stopped after {MAX_LOOP_ROUNDS} rounds")
        except _Break:
            pass
        return status

    def simple(self, node: Simple) -> int:
        toks = list(node.words)
        if toks[0].text == "((":
            return 0 if self.arith_command(toks[1].text) else 1
        assignments: list[tuple[str, str]] = []
        while toks and (toks[0].kind == "array" or ASSIGNMENT.match(toks[0].text)):
            tok = toks.pop(0)
            assignments.append(self.assign(tok, local=bool(toks)))
        if not toks:
            return 0
        words = [w for tok in toks for w in self.expand(tok.text)] if toks[0].kind == "word" else []
        if not words:
            return 0
        return self.builtin(words, toks, tuple(assignments))

    def assign(self, tok: Token, local: bool = False) -> tuple[str, str]:
        if tok.kind == "array":
            name, op = tok.name.rstrip("+="), tok.name
            items = [w for raw in array_words(tok.text) for w in self.expand(raw)]
            self.set_array(name, items, append=op.endswith("+="))
            return name, " ".join(items)
        m = ASSIGNMENT.match(tok.text)
        name, index, op = m.group(1), m.group(2), m.group(3)
        reads = self.unset_reads
        value = self.expand_one(tok.text[m.end() :])
        if not local:
            if self.unset_reads > reads:
                self.unknown.add(name)
            elif op == "=":
                self.unknown.discard(name)
        if local:  # VAR=value command: for that command only
            return name, value
        if index:
            arr = self.arrays.setdefault(name, [self.vars.pop(name)] if name in self.vars else [])
            k = int(self.arith(index[1:-1]))
            if not 0 <= k < MAX_ARRAY_ITEMS:
                raise ConfigError(FIELD, f"array index {name}[{k}] out of range")
            arr.extend([""] * (k + 1 - len(arr)))
            arr[k] = (arr[k] if op == "+=" else "") + value
            return name, value
        self.set(name, value, append=op == "+=")
        return name, value

    def arith_command(self, expr: str) -> int:
        m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*([-+*/%]?=)(?!=)\s*(.+)", expr)
        if m:
            name, op, rhs = m.groups()
            value = self.arith(rhs if op == "=" else f"{name} {op[0]} ({rhs})")
            self.set(name, value)
            return int(value)
        m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*(\+\+|--)\s*", expr)
        if m:
            self.set(m.group(1), self.arith(f"{m.group(1)} {m.group(2)[0]} 1"))
            return 1
        return int(self.arith(expr))

    def builtin(self, words: list[str], toks: list[Token], assignments: tuple) -> int:
        name = words[0]
        if name in DECLARATIONS:
            for tok in toks[1:]:
                if tok.kind == "array" or ASSIGNMENT.match(tok.text):
                    assigned, _ = self.assign(tok)
                    if name == "export":
                        self.exported.add(assigned)
                elif name == "export" and NAME.fullmatch(tok.text):
                    self.exported.add(tok.text)
            return 0
        if name == "unset":
            for w in words[1:]:
                self.vars.pop(w, None)
                self.arrays.pop(w, None)
            return 0
        if name in ("[", "[[", "test"):
            return self.test(words[1:-1] if name != "test" else words[1:])
        if name in ("source", ".") and len(words) > 1:
            return self.source(words[1])
        if name == "eval":
            with self.nested():
                return self.run(parse(" ".join(words[1:])))
        if name == "exit":
            if len(words) > 1 and words[1] not in ("0",):
                self.note(f"exit {words[1]}: ignored, read on")
            return 0
        if name == "return":
            raise _Exit()
        if name in ("break", "continue"):
            raise _Break()
        if name in self.functions:
            return self.call(name, words[1:])
        if name == "false":
            return 1
        if self.pure(name, words):
            return 0
        if name == "shift":
            self.positional = self.positional[int(words[1]) if len(words) > 1 and words[1].isdigit() else 1 :]
            return 0
        if name in IGNORED:
            return 0
        if self.captures:
            self.unknown_run[-1] = True
            return 0
        self.commands.append(ShellCommand(tuple(words), assignments))
        return 0

    def call(self, name: str, args: list[str]) -> int:
        saved = self.positional
        self.positional = args
        try:
            with self.nested():
                return self.run(self.functions[name])
        except _Exit:
            return 0
        finally:
            self.positional = saved

    def source(self, target: str) -> int:
        path = Path(target)
        if not path.is_absolute() and self.script is not None:
            path = self.script.parent / target
        if self.script is None or not path.is_file():
            self.note(f"source {target}: not found next to the script, not read")
            return 1
        from ..files import CONFIG_LIMIT_BYTES, read_text_bounded

        text = read_text_bounded(str(path), FIELD, CONFIG_LIMIT_BYTES)
        saved = self.script
        self.script = path
        try:
            with self.nested():
                return self.run(parse(text))
        finally:
            self.script = saved

    def test(self, args: list[str]) -> int:
        """[ ] / [[ ]] / test: 0 when true. File tests and unknown forms are false (noted)."""
        if not args:
            return 1
        for op in ("||", "-o"):
            if op in args:
                k = args.index(op)
                return 0 if self.test(args[:k]) == 0 or self.test(args[k + 1 :]) == 0 else 1
        for op in ("&&", "-a"):
            if op in args and len(args) > 2:
                k = args.index(op)
                return 0 if self.test(args[:k]) == 0 and self.test(args[k + 1 :]) == 0 else 1
        if args[0] == "!":
            return 1 - self.test(args[1:])
        if args[0] == "(" and args[-1] == ")":
            return self.test(args[1:-1])
        if len(args) == 1:
            return 0 if args[0] else 1
        if len(args) == 2 and args[0] in ("=", "==", "!="):
            return self.test(["", *args])
        if len(args) == 2 and args[1] in ("=", "==", "!="):
            return self.test([*args, ""])
        if len(args) == 2:
            op, arg = args
            if op == "-z":
                return 0 if arg == "" else 1
            if op == "-n":
                return 0 if arg else 1
            if op in ("-f", "-d", "-e", "-x", "-r", "-s", "-L", "-w"):
                self.note(f"[ {op} {arg} ]: files are not looked at, read as false")
                return 1
            if op == "-v":
                return 0 if arg in self.vars or arg in self.arrays else 1
        if len(args) == 3:
            a, op, b = args
            if op in ("=", "=="):
                return 0 if fnmatch.fnmatchcase(a, b) else 1
            if op == "!=":
                return 1 if fnmatch.fnmatchcase(a, b) else 0
            if op == "=~":
                try:
                    return 0 if re.search(b, a) else 1
                except re.error:
                    return 1
            ints = {"-eq": operator.eq, "-ne": operator.ne, "-gt": operator.gt, "-ge": operator.ge,
                    "-lt": operator.lt, "-le": operator.le}  # fmt: skip
            if op in ints:
                try:
                    return 0 if ints[op](int(a or 0), int(b or 0)) else 1
                except ValueError:
                    self.note(f"[ {a} {op} {b} ]: not integers, read as false")
                    return 1
            if op in ("<", ">"):
                return 0 if (a < b if op == "<" else a > b) else 1
        self.note(f"[ {' '.join(args)[:60]} ]: not read, read as false")
        return 1


class _Break(Exception):
    """break / continue out of a loop body."""


def _matching(raw: str, i: int, opener: str, closer: str) -> int:
    """Index past the closer balancing raw[i] (an opener), quotes respected (the lexer's own scan)."""
    return Lexer(raw).balanced(i + 1, closer)


def _only_fails(body: list) -> bool:
    """A branch that only reports and stops (echo / printf / exit): a usage error, not a choice of values."""
    for node in body:
        for _, pipeline in node.parts if isinstance(node, AndOr) else []:
            for command in pipeline:
                if not isinstance(command, Simple) or command.words[0].text not in ("echo", "printf", "exit"):
                    return False
    return True


def _printf(fmt: str, args: list[str]) -> str:
    """bash printf with %s / %d / %i / %% and the backslash escapes; the format repeats while arguments remain."""
    fmt = fmt.replace("\\n", "\n").replace("\\t", "\t")
    conversions = len(re.findall(r"%[-0-9.]*[sdi]", fmt))
    out, rest = [], list(args)
    while True:
        values = iter(rest[:conversions])

        def one(m: re.Match, values=values) -> str:
            if m.group(0) == "%%":
                return "%"
            value = next(values, "")
            if m.group(1) in "di":
                try:
                    return str(int(value or 0))
                except ValueError:
                    return "0"
            return value

        out.append(re.sub(r"%[-0-9.]*([sdi])|%%", one, fmt))
        rest = rest[conversions:]
        if not rest or conversions == 0:
            return "".join(out)


def _glob_regex(pattern: str) -> str:
    return fnmatch.translate(pattern).removeprefix("(?s:").removesuffix(")\\Z")


def _strip(value: str, pattern: str, op: str) -> str:
    """${V#p} ${V##p} ${V%p} ${V%%p}: remove the shortest / longest matching prefix / suffix."""
    lengths = range(len(value) + 1) if op in ("#", "%") else range(len(value), -1, -1)
    for k in lengths:
        part = value[:k] if op.startswith("#") else value[len(value) - k :]
        if fnmatch.fnmatchcase(part, pattern):
            return value[k:] if op.startswith("#") else value[: len(value) - k]
    return value


def read_shell(
    text: str, env: dict[str, str] | None = None, script: str | Path | None = None, args: list[str] | None = None
) -> ShellReading:
    """Read a bash script statically (nothing runs): the commands it would run, in order, with their words
    expanded; `env` is the environment it starts with (the user's `--var NAME=VALUE`), `script` its path (for
    `$0` and `source`), `args` its arguments (`$1 ...`, `$@`; none by default)."""
    shell = _Shell(dict(env or {}), Path(script) if script else None)
    shell.positional = list(args or [])
    try:
        nodes = parse(text)
        shell.run(nodes)
    except (_Exit, _Break):
        pass
    except RecursionError as exc:
        raise ConfigError(FIELD, "nested too deeply to read") from exc
    return ShellReading(
        commands=tuple(shell.commands),
        variables=dict(shell.vars),
        arrays={k: tuple(v) for k, v in shell.arrays.items()},
        exported=frozenset(shell.exported),
        notes=tuple(shell.notes),
    )
