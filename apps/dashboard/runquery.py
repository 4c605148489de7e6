"""The runs list's query by value: ``final > 0.5 and lr < 1e-3``, parsed here (never ``eval``).

Grammar (keywords are case-insensitive)::

    query      := or
    or         := and ("or" and)*
    and        := not ("and" not)*
    not        := "not" not | "(" or ")" | comparison
    comparison := NAME OP value
    OP         := < | <= | > | >= | = | == | !=
    value      := NUMBER | "quoted text" | 'quoted text' | WORD (true, false, none, or a bare word)

A NAME is a column of the runs table (``final``, ``gain``, ``hp.learning_rate``,
``policy.reviewers``, ...; ``RunTable.columns``) or an alias (``lr``). A run whose value is missing
or of another type than the one compared with does not match. Every mistake raises
:class:`QueryError` with the position it was found at, before any run is read.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_QUERY_LENGTH = 500

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.]))
    | (?P<string>"[^"]*"|'[^']*')
    | (?P<op><=|>=|==|!=|<|>|=)
    | (?P<paren>[()])
    | (?P<name>[A-Za-z_][\w.\-]*)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not"}
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
}
_WORDS: dict[str, Any] = {"true": True, "false": False, "none": None, "null": None}


class QueryError(ValueError):
    """A query that cannot be read; ``message`` says what and where."""

    def __init__(self, message: str, *, position: int | None = None) -> None:
        self.message = message if position is None else f"{message} (at character {position + 1})"
        self.position = position
        super().__init__(self.message)


@dataclass(frozen=True)
class _Token:
    kind: str  # number, string, op, paren, name, keyword, end
    text: str
    position: int


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    position = 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if match is None or match.lastgroup is None:
            at = len(text) - len(text[position:].lstrip())
            raise QueryError(f"unexpected {text[at]!r}", position=at)
        kind = match.lastgroup
        value = match.group(kind)
        start = match.start(kind)
        if kind == "name" and value.lower() in _KEYWORDS:
            kind, value = "keyword", value.lower()
        out.append(_Token(kind, value, start))
        position = match.end()
    out.append(_Token("end", "", len(text)))
    return out


@dataclass(frozen=True)
class Comparison:
    name: str  # the column, aliases resolved
    op: str
    value: Any

    def matches(self, row: Mapping[str, Any]) -> bool:
        found = row.get(self.name)
        equality = self.op in ("=", "==", "!=")
        if self.value is None or found is None:
            # Only ``= none`` and ``!= none`` say anything about a missing value.
            if self.value is None and equality:
                return (found is None) != (self.op == "!=")
            return False
        if equality:
            same = found == self.value if _kind(found) == _kind(self.value) else str(found) == str(self.value)
            return same != (self.op == "!=")
        if _kind(found) != _kind(self.value):
            return False
        return bool(_OPS[self.op](found, self.value))


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, int | float) else "text"


@dataclass(frozen=True)
class Node:
    kind: str  # and, or, not
    children: tuple[Any, ...]

    def matches(self, row: Mapping[str, Any]) -> bool:
        if self.kind == "not":
            return not self.children[0].matches(row)
        results = (child.matches(row) for child in self.children)
        return all(results) if self.kind == "and" else any(results)


Query = Comparison | Node


class _Parser:
    def __init__(self, text: str, *, known: Callable[[str], str | None]) -> None:
        self.tokens = _tokens(text)
        self.at = 0
        self.known = known

    def peek(self) -> _Token:
        return self.tokens[self.at]

    def take(self) -> _Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def parse(self) -> Query:
        query = self.or_()
        token = self.peek()
        if token.kind != "end":
            raise QueryError(f"expected 'and', 'or' or the end, found {token.text!r}", position=token.position)
        return query

    def or_(self) -> Query:
        parts = [self.and_()]
        while self.peek().kind == "keyword" and self.peek().text == "or":
            self.take()
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else Node("or", tuple(parts))

    def and_(self) -> Query:
        parts = [self.not_()]
        while self.peek().kind == "keyword" and self.peek().text == "and":
            self.take()
            parts.append(self.not_())
        return parts[0] if len(parts) == 1 else Node("and", tuple(parts))

    def not_(self) -> Query:
        token = self.peek()
        if token.kind == "keyword" and token.text == "not":
            self.take()
            return Node("not", (self.not_(),))
        if token.kind == "paren" and token.text == "(":
            self.take()
            inner = self.or_()
            closing = self.take()
            if closing.kind != "paren" or closing.text != ")":
                raise QueryError(f"expected ')', found {closing.text or 'the end'!r}", position=closing.position)
            return inner
        return self.comparison()

    def comparison(self) -> Comparison:
        name = self.take()
        if name.kind != "name":
            shown = name.text or "the end"
            raise QueryError(f"expected a column name, found {shown!r}", position=name.position)
        column = self.known(name.text)
        if column is None:
            raise QueryError(f"unknown column {name.text!r}", position=name.position)
        op = self.take()
        if op.kind != "op":
            shown = op.text or "the end"
            raise QueryError(f"expected a comparison (< <= > >= = !=) after {name.text!r}, found {shown!r}",
                             position=op.position)  # fmt: skip
        value = self.take()
        if value.kind == "number":
            number = float(value.text)
            parsed: Any = int(number) if re.fullmatch(r"[-+]?\d+", value.text) else number
        elif value.kind == "string":
            parsed = value.text[1:-1]
        elif value.kind == "name":
            parsed = _WORDS.get(value.text.lower(), value.text)
        else:
            shown = value.text or "the end"
            raise QueryError(f"expected a value after {name.text} {op.text}, found {shown!r}", position=value.position)
        if op.text in ("<", "<=", ">", ">=") and (parsed is None or isinstance(parsed, bool)):
            raise QueryError(f"{op.text} needs a number or text, not {value.text}", position=value.position)
        return Comparison(column, op.text, parsed)


def parse_query(
    text: str, *, columns: Iterable[str], aliases: Mapping[str, str] | None = None, prefixes: tuple[str, ...] = ()
) -> Query | None:
    """The query in ``text`` over ``columns`` (None for an empty query); raises QueryError.

    A name is known when it is a column, an alias, or starts with one of ``prefixes`` (a
    hyperparameter no listed run has yet is still a fair question: nothing matches).
    """
    text = text.strip()
    if not text:
        return None
    if len(text) > MAX_QUERY_LENGTH:
        raise QueryError(f"a query is at most {MAX_QUERY_LENGTH} characters")
    known = set(columns)
    aliases = aliases or {}

    def resolve(name: str) -> str | None:
        if name in aliases:
            return aliases[name]
        for candidate in (name, f"hp.{name}"):
            if candidate in known:
                return candidate
        return name if name.startswith(prefixes) else None

    return _Parser(text, known=resolve).parse()
