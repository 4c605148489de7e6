"""The sealed-item screen: what an agent reads of catalog or outside data passes it first.

One screen for every read, so that no path shows what another withholds (issue 33, item 13: a
discovery sample showed the honeypot's sealed rows that ``worker_inspect_data`` withheld). It
runs the contamination scanner of every registered benchmark (``sealed_scanner``: exact, n-gram,
near-duplicate, salient), the one the submission review uses, so a disguise caught in training
data is caught here too. Its users: ``worker_inspect_data`` (rows and readme), every discovery
connector's answer (dataset samples, cards, READMEs, web pages, search results, papers, GitHub
files; ``apps.expos.screening``) and the Main Agent's view of Reviewer reports
(``apps.reviews.selectors``, with the run's model outputs as extra items).

Units:

- an object in a list (a sample row, a search result, a paper) is screened as a training row,
  with its fields in the order given *and* with prompt fields before answer fields (the order the
  trainer reads them, so ``completion`` written before ``prompt`` changes nothing); a match drops
  the whole object;
- a free text (a card, a page, a README, a report's summary) is screened in overlapping windows
  of lines; a matching window is narrowed to the fewest lines that still match, those lines are
  replaced by a marker, and the window is screened again until nothing in it matches.

What a caller is told (:meth:`Withheld.public`): where and why, never which sealed item matched
nor how many sealed items a source holds.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from apps.benchmarks.minibench.task_specs import number_words
from apps.benchmarks.models import Benchmark
from apps.integrity.canonical import canonical_tokens, is_number
from apps.integrity.contamination import ContaminationScanner, Match
from apps.integrity.overlap import sealed_scanner

WITHHELD = "[withheld: matches a sealed evaluation item]"
REASON = "matches a sealed evaluation item: text that does is never shown to an agent, and this withholding is recorded"
# Field names whose values the trainer reads as the prompt (first) or as the answer (last).
PROMPT_FIELDS = ("system", "instruction", "context", "question", "prompt", "input", "messages", "conversations", "text")
ANSWER_FIELDS = ("completion", "chosen", "rejected", "answer", "response", "output", "target", "label", "solution")
# Free text is cut into lines, a long line into pieces of at most _SEGMENT_CHARS; windows of
# _WINDOW_CHARS start every half window, so any item up to half a window long lies whole in one.
_SEGMENT_CHARS = 300
_WINDOW_CHARS = 2400
# Inside an object that did not match as a whole, only strings this long are screened again alone
# (a long document in one field, where a short item is a small share of the object's words).
_LONG_STRING = _WINDOW_CHARS // 2
_LINES = re.compile(r"[^\n]+")
_BLANK = re.compile(r"\n[^\S\n]*\n")
# A sentence: up to an end mark (and closing quotes or brackets) followed by a space, or the line's end.
_SENTENCE = re.compile(r"[^\n]*?(?:[.!?][\"'\u201d\u2019)\]]*(?=\s)|$)")
# A segment of at most this many canonical tokens may be an answer written before its question.
_SHORT_TOKENS = 3
# How many segments of the same paragraph on each side of the fewest that match are looked at
# for the matched item's answer.
_SPREAD = 3


@dataclass(frozen=True)
class Withheld:
    """One withheld part of an answer: its JSON path, the lines for a text, the sealed ids (never shown)."""

    at: str
    lines: tuple[int, int] | None
    sample_ids: tuple[str, ...]

    def public(self) -> dict[str, Any]:
        """What the reader is told: where and why, not which item nor how many."""
        shown: dict[str, Any] = {"at": self.at or "/", "reason": REASON}
        if self.lines is not None:
            shown["lines"] = f"{self.lines[0]}-{self.lines[1]}"
        return shown


def training_order(row: Any) -> Any:
    """``row`` with prompt fields first and answer fields last, as a trainer renders it; ``row`` if unchanged."""
    if not isinstance(row, dict):
        return row

    def rank(key: Any) -> int:
        name = str(key).lower()
        return 0 if name in PROMPT_FIELDS else 2 if name in ANSWER_FIELDS else 1

    keys = sorted(row, key=rank)
    return row if keys == list(row) else {key: row[key] for key in keys}


class SealedScreen:
    """Scanners (one per benchmark, plus any extra items) applied to rows, texts and whole answers."""

    def __init__(self, scanners: Sequence[ContaminationScanner], *, marker: str = WITHHELD) -> None:
        self.scanners = list(scanners)
        self.marker = marker

    # ------------------------------------------------------------------ rows

    def _scan(self, row: Any) -> list[Match]:
        return [match for scanner in self.scanners for match in scanner.scan_row(row)]

    def row_matches(self, row: Any) -> list[Match]:
        """The sealed items ``row`` matches, read as given and in training order."""
        found = self._scan(row)
        ordered = training_order(row)
        if ordered is not row:
            found += self._scan(ordered)
        return found

    def rows(self, rows: Iterable[Any]) -> dict[int, list[Match]]:
        """Index -> matches, for the rows that match a sealed item."""
        out = {}
        for index, row in enumerate(rows):
            found = self.row_matches(row)
            if found:
                out[index] = found
        return out

    # ------------------------------------------------------------------ free text

    def text(self, text: str) -> tuple[str, list[tuple[tuple[int, int], tuple[str, ...]]]]:
        """``text`` with every part matching a sealed item replaced by the marker, and each part's
        line range (1-based) with the sample ids it matched."""
        segments = _segments(text)
        if not segments or not self.scanners:
            return text, []
        withheld = [False] * len(segments)
        parts: list[tuple[int, int, tuple[str, ...]]] = []
        for first, last in _blocks(text, segments):
            for lo, hi in _windows(segments[first : last + 1]):
                self._clear_window(text, segments, withheld, first + lo, first + hi, parts)
        if not parts:
            return text, []
        out: list[str] = []
        cursor, i = 0, 0
        while i < len(segments):
            start, end = segments[i]
            out.append(text[cursor:start])
            if withheld[i]:
                # One marker for a run of withheld lines, the line breaks inside it included.
                while i + 1 < len(segments) and withheld[i + 1]:
                    i += 1
                out.append(self.marker)
                end = segments[i][1]
            else:
                out.append(text[start:end])
            cursor = end
            i += 1
        out.append(text[cursor:])
        hits = []
        for lo, hi, ids in sorted(parts):
            first = text.count("\n", 0, segments[lo][0]) + 1
            last = text.count("\n", 0, segments[hi][0]) + 1
            hits.append(((first, last), ids))
        return "".join(out), hits

    def _clear_window(
        self,
        text: str,
        segments: list[tuple[int, int]],
        withheld: list[bool],
        lo: int,
        hi: int,
        parts: list[tuple[int, int, tuple[str, ...]]],
    ) -> None:
        answer_like: dict[int, bool] = {}

        def is_answer_like(i: int) -> bool:
            if i not in answer_like:
                answer_like[i] = _answer_like(text[segments[i][0] : segments[i][1]])
            return answer_like[i]

        def matches(a: int, b: int) -> list[Match]:
            kept = [i for i in range(a, b + 1) if not withheld[i]]
            found = self._scan("\n".join(text[segments[i][0] : segments[i][1]] for i in kept)) if kept else []
            if found:
                return found
            # An answer written before its question ("81\nUser: ... 33 ... 48"): the lines an answer
            # may stand on read last, where a trainer's rendering puts the answer.
            moved = [i for i in kept if not is_answer_like(i)] + [i for i in kept if is_answer_like(i)]
            if moved == kept:
                return []
            return self._scan("\n".join(text[segments[i][0] : segments[i][1]] for i in moved))

        # Each round withholds at least one more line of the window, so it ends within its length.
        for _ in range(hi - lo + 1):
            found = matches(lo, hi)
            if not found:
                return
            a, b = lo, hi
            while a < b and matches(a + 1, b):
                a += 1
            while b > a and matches(a, b - 1):
                b -= 1
            ids = tuple(sorted({m.sample_id for m in matches(a, b) or found}))
            answers = [scanner.answer_tokens(i) for scanner in self.scanners for i in ids]
            a, b = _paragraph_spread(text, segments, a, b, answers)
            for i in range(a, b + 1):
                withheld[i] = True
            parts.append((a, b, ids))

    # ------------------------------------------------------------------ whole answers

    def value(self, value: Any) -> tuple[Any, list[Withheld]]:
        """A JSON answer with every matching object dropped and every matching text part replaced."""
        withheld: list[Withheld] = []

        def walk(item: Any, path: str, inside: bool) -> Any:
            if isinstance(item, str):
                if inside and len(item) < _LONG_STRING:
                    return item  # already screened as part of the object around it
                screened, hits = self.text(item)
                withheld.extend(Withheld(path, lines, ids) for lines, ids in hits)
                return screened
            if isinstance(item, dict):
                return {key: walk(sub, f"{path}/{_pointer(key)}", inside) for key, sub in item.items()}
            if isinstance(item, list):
                kept = []
                for index, sub in enumerate(item):
                    where = f"{path}/{index}"
                    if isinstance(sub, dict | list) and not inside:
                        found = self.row_matches(sub)
                        if found:
                            withheld.append(Withheld(where, None, tuple(sorted({m.sample_id for m in found}))))
                            continue
                        kept.append(walk(sub, where, True))
                    else:
                        kept.append(walk(sub, where, inside))
                return kept
            return item

        return walk(value, "", False), withheld


def _pointer(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _segments(text: str) -> list[tuple[int, int]]:
    """Character spans of the sentences of the non-blank lines of ``text``; a long one is cut at a
    clause or a space."""
    spans = []
    for line in _LINES.finditer(text):
        start, end = line.span()
        for piece_start, piece_end in _sentences(text, start, end):
            while piece_end - piece_start > _SEGMENT_CHARS:
                cut = _cut(text, piece_start, piece_start + _SEGMENT_CHARS)
                spans.append((piece_start, cut))
                piece_start = cut
            spans.append((piece_start, piece_end))
    return spans


def _sentences(text: str, start: int, end: int) -> list[tuple[int, int]]:
    pieces = []
    for piece in _SENTENCE.finditer(text, start, end):
        if piece.group().strip():
            pieces.append((piece.start() + len(piece.group()) - len(piece.group().lstrip()), piece.end()))
    return pieces


def _paragraph_spread(
    text: str, segments: list[tuple[int, int]], a: int, b: int, answers: list[tuple[str, ...]]
) -> tuple[int, int]:
    """[a, b] widened to the farthest of the next (previous) few segments of the same paragraph
    that holds a matched item's answer: the fewest lines that match may leave it on the next line
    ("Answer:\n 83"), or, answer first, on the line before."""
    answers = [answer for answer in answers if answer]
    if not answers:
        return a, b

    def joined(i: int, j: int) -> bool:  # no blank line between segments i < j
        return not _BLANK.search(text, segments[i][1], segments[j][0])

    def holds_answer(i: int) -> bool:
        tokens = canonical_tokens(text[segments[i][0] : segments[i][1]])
        return any(_contains(tokens, answer) for answer in answers)

    new_b = b
    for j in range(b + 1, min(len(segments), b + 1 + _SPREAD)):
        if not joined(j - 1, j):
            break
        if holds_answer(j):
            new_b = j
    new_a = a
    for j in range(a - 1, max(-1, a - 1 - _SPREAD), -1):
        if not joined(j, j + 1):
            break
        if holds_answer(j):
            new_a = j
    return new_a, new_b


def _contains(tokens: list[str], needle: tuple[str, ...]) -> bool:
    n = len(needle)
    return any(tuple(tokens[i : i + n]) == needle for i in range(len(tokens) - n + 1))


def _cut(text: str, start: int, limit: int) -> int:
    piece = text[start:limit]
    for separator in (". ", "? ", "! ", "; ", ", ", " "):
        at = piece.rfind(separator)
        if at > len(piece) // 2:
            return start + at + len(separator)
    return limit


def _answer_like(piece: str) -> bool:
    """A line an answer may stand on alone: "83", "Answer: 83", "B"."""
    tokens = canonical_tokens(piece)
    return len(tokens) <= _SHORT_TOKENS and (len(tokens) == 1 or any(map(is_number, tokens)))


def _blocks(text: str, segments: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Segment ranges screened apart: paragraphs (no blank line inside), a paragraph of answer
    lines joined to the paragraphs on both sides ("Question: ...\n\nAnswer: 83", or the answer first).

    An item is one span of text: numbers of three paragraphs (17 in one problem, 45 in the next, the
    sum in a third) make no item, and a window across paragraphs of honest problems would read so.
    """
    paragraphs: list[list[int]] = []
    for i in range(len(segments)):
        if i and not _BLANK.search(text, segments[i - 1][1], segments[i][0]):
            paragraphs[-1][1] = i
        else:
            paragraphs.append([i, i])
    blocks: list[tuple[int, int]] = []
    carry: int | None = None  # first segment of a paragraph of answer lines before this one
    for lo, hi in paragraphs:
        if all(_answer_like(text[segments[i][0] : segments[i][1]]) for i in range(lo, hi + 1)):
            if blocks and carry is None:
                blocks[-1] = (blocks[-1][0], hi)
            carry = lo if carry is None else carry
            continue
        blocks.append((lo if carry is None else carry, hi))
        carry = None
    if carry is not None and (not blocks or blocks[-1][1] < carry):
        blocks.append((carry, len(segments) - 1))
    return blocks


def _windows(segments: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Index ranges of the segments overlapping [k·W/2, k·W/2 + W) from the first segment on."""
    starts = [s for s, _ in segments]
    ends = [e for _, e in segments]
    origin, last_end = starts[0], ends[-1]
    out = []
    position = origin
    while True:
        lo = bisect.bisect_right(ends, position)
        hi = bisect.bisect_left(starts, position + _WINDOW_CHARS) - 1
        if lo <= hi:
            out.append((lo, hi))
        if position + _WINDOW_CHARS >= last_end:
            return out
        position += _WINDOW_CHARS // 2


# ---------------------------------------------------------------------------- sealed sample ids


class SampleIdFinder:
    """Sealed sample ids written in any disguise: other separators or none ("arith_final_0003",
    "arithfinal3"), case, look-alike letters, other digit scripts, leading zeros, number words,
    invisible characters between the letters, inside prose ("arith-final-0003's output").

    Every id and the text are read as their runs of letters and digits in the canonical form of
    the contamination scanner (``canonical_tokens``), glued; an id is found where its glued form
    begins at a run and the runs that follow spell it out.
    """

    _RUN = re.compile(r"[^\W_]+")
    _MAX_RUNS = 24

    def __init__(self, sample_ids: Iterable[str]) -> None:
        self.keys = {key for i in sample_ids for key in self._forms(str(i)) if key}
        self.prefixes = {key[:n] for key in self.keys for n in range(len(key) + 1)}

    @staticmethod
    def _glued(text: str) -> str:
        return "".join(canonical_tokens(text))

    @classmethod
    def _forms(cls, sample_id: str) -> set[str]:
        """The id glued, and glued with its numbers as words: a number word spelt with a character
        between its letters ("t h r e e") is letters, not a number, to the canonical form."""
        glued = _digits(cls._glued(sample_id), partial=False)
        forms = {glued}
        for words in (_number_letters, _number_letters_and):
            forms.add(_DIGIT_RUN.sub(_spelt(words), glued))
        return forms

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of ``text`` that spell a sealed sample id, merged."""
        if not self.keys:
            return []
        runs = [(m.start(), m.end(), self._glued(m.group())) for m in self._RUN.finditer(text)]
        found: list[tuple[int, int]] = []
        for i in range(len(runs)):
            glued = ""
            for j in range(i, min(len(runs), i + self._MAX_RUNS)):
                glued += runs[j][2]
                if _digits(glued, partial=False) in self.keys:
                    found.append((runs[i][0], runs[j][1]))
                if _digits(glued, partial=True) not in self.prefixes:
                    break
        merged: list[tuple[int, int]] = []
        for start, end in sorted(found):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged

    def redact(self, text: str, marker: str) -> str:
        out, cursor = [], 0
        for start, end in self.spans(text):
            out.append(text[cursor:start])
            out.append(marker)
            cursor = end
        out.append(text[cursor:])
        return "".join(out)


_DIGIT_RUN = re.compile(r"\d+")


def _digits(glued: str, *, partial: bool) -> str:
    """Leading zeros dropped from every digit run ("0" stays), also where invisible characters or
    separators cut the run into single digits. ``partial``: ``glued`` may go on, so a trailing run
    of zeros may still be the leading zeros of a number and reads as nothing yet."""

    def number(match: re.Match[str]) -> str:
        digits = match.group().lstrip("0")
        if digits:
            return digits
        return "" if partial and match.end() == len(glued) else "0"

    return _DIGIT_RUN.sub(number, glued)


def _spelt(words: Callable[[int], str]) -> Callable[[re.Match[str]], str]:
    return lambda match: words(int(match.group()))


def _number_letters(n: int) -> str:
    return re.sub(r"[^a-z]", "", number_words(n)) if n < 1000 else str(n)


def _number_letters_and(n: int) -> str:  # "one hundred and five"
    return _number_letters(n).replace("hundred", "hundredand", 1) if n % 100 and n < 1000 else _number_letters(n)


def benchmark_screen(benchmarks: Iterable[Benchmark] | None = None, *, marker: str = WITHHELD) -> SealedScreen:
    """The screen over every registered benchmark's sealed items (both splits), or those given.

    Every benchmark, not only the run's: catalog and outside data are shared, and another task's
    sealed items are sealed all the same. Raises ``SealBroken`` when a benchmark's sealed data fails
    its hashes: nothing is known to be safe to show then (the callers fail closed).
    """
    chosen = Benchmark.objects.order_by("pk") if benchmarks is None else benchmarks
    return SealedScreen([sealed_scanner(benchmark=b) for b in chosen], marker=marker)


def items_scanner(items: Sequence[dict[str, Any]], *, min_tokens: int) -> ContaminationScanner | None:
    """A verbatim-copy scanner (exact and n-gram layers) over extra texts, such as model outputs.

    Texts shorter than ``min_tokens`` canonical tokens are left out: a bare "42" or "B" is in every
    report and teaches nothing; a longer output quoted in any disguise is found.
    """
    kept = [item for item in items if len(canonical_tokens(str(item.get("prompt", "")))) >= min_tokens]
    if not kept:
        return None
    return ContaminationScanner(kept, layers=("exact", "ngram"), ngram=8)
