"""Bash syntax for `specs.shell`: words (raw, quotes kept), operators and array literals (`Lexer`), and the
command structure launch scripts use (`parse`): lists, `&&` / `||`, pipelines, if / case / for / while, functions,
groups and `(( ))` arithmetic (bash(1), "SHELL GRAMMAR")."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

FIELD = "launch"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?=)")


# ---------------------------------------------------------------------------------------------------------------
# Lexing: words (raw, quotes kept), operators, array literals
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    kind: str  # "word", "op", "array"
    text: str
    name: str = ""  # array: NAME and "=" / "+="


def _command_start(out: list[Token]) -> bool:
    """The next token starts a command (so `((` opens arithmetic, not two subshells)."""
    return not out or out[-1].kind == "op" or out[-1].text in ("for", "if", "elif", "while", "until", "then", "do",
                                                               "else", "!", "{")  # fmt: skip


class Lexer:
    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.heredocs: list[tuple[str, bool]] = []

    def error(self, what: str) -> ConfigError:
        line = self.s.count("\n", 0, self.i) + 1
        return ConfigError(FIELD, f"line {line}: {what}")

    def tokens(self) -> list[Token]:
        out: list[Token] = []
        s = self.s
        in_test = False  # inside [[ ... ]]
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r":
                self.i += 1
            elif c == "\\" and s.startswith("\\\n", self.i):
                self.i += 2
            elif c == "\n":
                self.i += 1
                self._skip_heredocs()
                out.append(Token("op", "\n"))
            elif c == "#":
                end = s.find("\n", self.i)
                self.i = len(s) if end < 0 else end
            elif s.startswith("((", self.i) and not in_test and _command_start(out):
                end = self.balanced(self.i + 1, ")")
                out.append(Token("arith", s[self.i + 2 : end - 2]))
                self.i = end
            elif c in ";&|()<>" and not in_test:
                if c in "<>" and out and out[-1].kind == "word" and out[-1].text.isdigit() and s[self.i - 1].isdigit():
                    out.pop()  # the descriptor of 2> / 1>>
                out.append(self._operator())
            elif c in ";&|()<>":  # inside [[ ]]: && || < > ( ) are words of the test
                j = self.i + 1
                while j < len(s) and s[j] in "&|<>=" and s[self.i] in "&|<>":
                    j += 1
                out.append(Token("word", s[self.i : j]))
                self.i = j
            else:
                out.append(self._word())
                in_test = (in_test or out[-1].text == "[[") and out[-1].text != "]]"
            if out and out[-1].kind == "op" and out[-1].text == "\n":
                in_test = False
        out.append(Token("op", "\n"))
        return [t for t in out if t.text != "<redirect>"]

    def _operator(self) -> Token:
        s = self.s
        for op in (";;&", ";;", ";&", "&&", "||", "|&", "&>>", "&>"):
            if s.startswith(op, self.i):
                self.i += len(op)
                if op.startswith("&>"):
                    return self._redirect()
                return Token("op", {";;&": ";;", ";&": ";;", "|&": "|"}.get(op, op))
        c = s[self.i]
        if c in "<>":
            return self._redirect()
        self.i += 1
        return Token("op", c)

    def _redirect(self) -> Token:
        """Skip a redirection and its target (here-documents: their body after the line ends)."""
        s = self.s
        start = self.i
        while self.i < len(s) and s[self.i] in "<>&|":
            self.i += 1
        op = s[start : self.i]
        if s.startswith("(", self.i) and op in ("<", ">"):  # process substitution <( ... )
            self.balanced(self.i + 1, ")")
            return Token("op", "<redirect>")
        while self.i < len(s) and s[self.i] in " \t":
            self.i += 1
        if op in (">&", "<&"):  # duplicate a descriptor: >&2, 2>&1, >&-
            fd_start = self.i
            while self.i < len(s) and (s[self.i].isdigit() or s[self.i] == "-"):
                self.i += 1
            if self.i > fd_start:
                return Token("op", "<redirect>")
        if self.i < len(s) and s[self.i] not in "\n;&|":
            target = self._word().text
            if op in ("<<", "<<-"):
                self.heredocs.append((target.strip("'\""), op == "<<-"))
        return Token("op", "<redirect>")

    def _skip_heredocs(self) -> None:
        for delim, strip_tabs in self.heredocs:
            while self.i < len(self.s):
                end = self.s.find("\n", self.i)
                line = self.s[self.i : len(self.s) if end < 0 else end]
                self.i = len(self.s) if end < 0 else end + 1
                if (line.lstrip("\t") if strip_tabs else line) == delim:
                    break
        self.heredocs = []

    def _word(self) -> Token:
        s = self.s
        start = self.i
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r\n;&|<>":
                break
            if c in "()":
                if self.i == start:
                    break
                m = ASSIGNMENT.fullmatch(s[start : self.i])
                if c == "(" and m and not m.group(2):
                    content_start = self.i + 1
                    self.i = self.balanced(content_start, ")")
                    return Token("array", s[content_start : self.i - 1], name=f"{m.group(1)}{m.group(3)}")
                if c == "(" and s[start : self.i] in ("$", "<", ">"):
                    self.i = self.balanced(self.i + 1, ")")
                    continue
                break
            if c == "\\":
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    raise self.error("a ' quote is never closed")
                self.i = end + 1
            elif c == '"':
                self.i = self._double_quoted(self.i + 1)
            elif c == "`":
                end = s.find("`", self.i + 1)
                if end < 0:
                    raise self.error("a ` quote is never closed")
                self.i = end + 1
            elif c == "$" and s.startswith("$(", self.i):
                self.i = self.balanced(self.i + 2, ")")
            elif c == "$" and s.startswith("${", self.i):
                self.i = self.balanced(self.i + 2, "}")
            else:
                self.i += 1
        return Token("word", s[start : self.i])

    def _double_quoted(self, i: int) -> int:
        s = self.s
        while i < len(s):
            c = s[i]
            if c == "\\":
                i += 2
            elif c == '"':
                return i + 1
            elif s.startswith("$(", i):
                i = self.balanced(i + 2, ")")
            elif s.startswith("${", i):
                i = self.balanced(i + 2, "}")
            elif c == "`":
                end = s.find("`", i + 1)
                i = len(s) if end < 0 else end + 1
            else:
                i += 1
        raise self.error('a " quote is never closed')

    def balanced(self, i: int, close: str) -> int:
        """Index just past the `close` that balances an opening before `i` (quotes and nesting respected)."""
        s = self.s
        opener = "(" if close == ")" else "{"
        depth = 1
        while i < len(s):
            c = s[i]
            if c == "\\":
                i += 2
                continue
            if c == "'" and close == ")":
                end = s.find("'", i + 1)
                i = len(s) if end < 0 else end + 1
                continue
            if c == '"':
                i = self._double_quoted(i + 1)
                continue
            if c == "#" and close == ")" and (i == 0 or s[i - 1] in " \t\n("):
                end = s.find("\n", i)
                i = len(s) if end < 0 else end
                continue
            if c == opener:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise self.error(f"a '{opener}' is never closed")


# ---------------------------------------------------------------------------------------------------------------
# Parsing: lists, pipelines, if / case / for / while, functions, groups
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Simple:
    words: list[Token]


@dataclass
class If:
    branches: list[tuple[list, list]]
    otherwise: list | None


@dataclass
class Case:
    word: str
    items: list[tuple[list[str], list]]


@dataclass
class Loop:
    kind: str  # "for" / "while"
    var: str
    items: list[str] | None
    condition: list
    body: list


@dataclass
class Function:
    name: str
    body: list


@dataclass
class Group:
    body: list
    subshell: bool


@dataclass
class AndOr:
    parts: list  # [(op, pipeline)], op "" for the first, else "&&" / "||"


_RESERVED_END = {"then", "elif", "else", "fi", "do", "done", "esac", "}", ";;"}


class Parser:
    def __init__(self, tokens: list[Token], lexer: Lexer):
        self.t = tokens
        self.i = 0
        self.lexer = lexer

    def peek(self) -> Token:
        return self.t[self.i] if self.i < len(self.t) else Token("op", "\n")

    def is_word(self, text: str) -> bool:
        tok = self.peek()
        return tok.kind == "word" and tok.text == text

    def skip_newlines(self) -> None:
        while self.i < len(self.t) and self.t[self.i].kind == "op" and self.t[self.i].text in ("\n", ";", "&"):
            self.i += 1

    def expect(self, text: str) -> None:
        self.skip_newlines()
        tok = self.peek()
        if tok.text != text:
            raise ConfigError(FIELD, f"expected '{text}', found {tok.text!r} (an unfinished if / case / loop?)")
        self.i += 1

    def parse_list(self, stops: set[str]) -> list:
        nodes: list = []
        while True:
            self.skip_newlines()
            tok = self.peek()
            if self.i >= len(self.t) or (tok.kind in ("word", "op") and tok.text in stops):
                return nodes
            if tok.kind == "op" and tok.text == ")" and ")" not in stops:
                raise ConfigError(FIELD, "an unmatched ')'")
            nodes.append(self.and_or())

    def and_or(self) -> AndOr:
        parts = [("", self.pipeline())]
        while self.peek().kind == "op" and self.peek().text in ("&&", "||"):
            op = self.peek().text
            self.i += 1
            while self.peek().kind == "op" and self.peek().text == "\n":
                self.i += 1
            parts.append((op, self.pipeline()))
        return AndOr(parts)

    def pipeline(self) -> list:
        if self.is_word("!") or self.is_word("time"):
            self.i += 1
        cmds = [self.command()]
        while self.peek().kind == "op" and self.peek().text == "|":
            self.i += 1
            while self.peek().kind == "op" and self.peek().text == "\n":
                self.i += 1
            cmds.append(self.command())
        return cmds

    def command(self):
        tok = self.peek()
        if tok.kind == "word":
            keywords = {"if": self.parse_if, "case": self.parse_case, "for": self.parse_for,
                        "while": self.parse_while, "until": self.parse_while, "function": self.parse_function,
                        "{": self.parse_brace}  # fmt: skip
            keyword = keywords.get(tok.text)
            if keyword:
                return keyword()
            nxt = self.t[self.i + 1] if self.i + 1 < len(self.t) else None
            if NAME.fullmatch(tok.text) and nxt is not None and nxt.text == "(":
                after = self.t[self.i + 2] if self.i + 2 < len(self.t) else None
                if after is not None and after.text == ")":
                    self.i += 3
                    return Function(tok.text, self._function_body())
        if tok.kind == "arith":
            self.i += 1
            return Simple([Token("word", "(("), Token("word", tok.text)])
        if tok.kind == "op" and tok.text == "(":
            self.i += 1
            body = self.parse_list({")"})
            self.expect(")")
            return Group(body, subshell=True)
        words: list[Token] = []
        while True:
            tok = self.peek()
            if tok.kind == "op":
                break
            if tok.kind == "word" and tok.text in _RESERVED_END and not words:
                break
            words.append(tok)
            self.i += 1
        if not words:
            raise ConfigError(FIELD, f"unexpected {tok.text!r}")
        return Simple(words)

    def _function_body(self) -> list:
        self.skip_newlines()
        node = self.command()
        return node.body if isinstance(node, Group) else [node]

    def parse_function(self):
        self.i += 1
        name = self.peek().text
        self.i += 1
        if self.peek().text == "(":
            self.i += 2
        return Function(name, self._function_body())

    def parse_brace(self):
        self.i += 1
        body = self.parse_list({"}"})
        self.expect("}")
        return Group(body, subshell=False)

    def parse_if(self):
        self.i += 1
        branches = []
        cond = self.parse_list({"then"})
        self.expect("then")
        body = self.parse_list({"elif", "else", "fi"})
        branches.append((cond, body))
        otherwise = None
        while True:
            self.skip_newlines()
            tok = self.peek().text
            self.i += 1
            if tok == "elif":
                cond = self.parse_list({"then"})
                self.expect("then")
                branches.append((cond, self.parse_list({"elif", "else", "fi"})))
            elif tok == "else":
                otherwise = self.parse_list({"fi"})
                self.expect("fi")
                return If(branches, otherwise)
            elif tok == "fi":
                return If(branches, otherwise)
            else:
                raise ConfigError(FIELD, f"an 'if' without 'fi' (found {tok!r})")

    def parse_case(self):
        self.i += 1
        word = self.peek().text
        self.i += 1
        self.expect("in")
        items = []
        while True:
            self.skip_newlines()
            if self.is_word("esac"):
                self.i += 1
                return Case(word, items)
            if self.peek().text == "(":
                self.i += 1
            patterns = []
            while self.peek().text != ")":
                tok = self.peek()
                if self.i >= len(self.t):
                    raise ConfigError(FIELD, "a 'case' without 'esac'")
                if tok.text != "|":
                    patterns.append(tok.text)
                self.i += 1
            self.i += 1
            body = self.parse_list({";;", "esac"})
            if self.peek().text == ";;":
                self.i += 1
            items.append((patterns, body))

    def parse_for(self):
        self.i += 1
        if self.peek().kind == "arith":  # for (( init; condition; step ))
            header = self.peek().text
            self.i += 1
            self.expect("do")
            body = self.parse_list({"done"})
            self.expect("done")
            return Loop("for", "", None, [header], body)
        var = self.peek().text
        self.i += 1
        items = None
        self.skip_newlines()
        if self.is_word("in"):
            self.i += 1
            items = []
            while self.peek().kind == "word" and self.peek().text != "do":
                items.append(self.peek().text)
                self.i += 1
        self.expect("do")
        body = self.parse_list({"done"})
        self.expect("done")
        return Loop("for", var, items, [], body)

    def parse_while(self):
        self.i += 1
        cond = self.parse_list({"do"})
        self.expect("do")
        body = self.parse_list({"done"})
        self.expect("done")
        return Loop("while", "", None, cond, body)


def parse(text: str) -> list:
    lexer = Lexer(text)
    parser = Parser(lexer.tokens(), lexer)
    nodes = parser.parse_list(set())
    if parser.i < len(parser.t):
        raise ConfigError(FIELD, f"unexpected {parser.peek().text!r}")
    return nodes


def array_words(content: str) -> list[str]:
    """The raw words of an array literal's content (comments and newlines dropped)."""
    tokens = Lexer(content).tokens()
    return [t.text for t in tokens if t.kind == "word"]
