"""Overlap between training rows and a benchmark's sealed items: exact, n-gram and near-duplicate.

Three layers, each catching what the one before misses, as decontamination tools do:

- ``exact``    the sealed prompt appears, whole and contiguous, in the row after normalisation
               (case, Unicode form, punctuation, whitespace, spelled-out numbers). Catches verbatim
               copies, copies inside a different template, doubled spaces, "twelve" for "12".
- ``ngram``    the row shares at least one word n-gram (13 by default, as in GPT-3's and
               lm-eval's decontamination) with a sealed prompt longer than n: a partial copy.
- ``near_dup`` MinHash-LSH (datasketch) candidates over word shingles, confirmed by the exact
               Jaccard of the shingle sets (>= ``threshold``) and by the sealed item's numbers
               appearing in the row in order. Items with two or more numbers are also looked up
               by their numbers, and when all of them, the answer's included, recur in order a
               lower Jaccard (``numeric_threshold``) suffices: that finds reworded short word
               problems, which are too short for n-grams and too short for a high Jaccard.

Why the number rule: synthetic and templated benchmarks (GSM8K-style word problems, the minibench)
have many items that differ only in their numbers. Two such items are *different problems*, and
a training set full of them is the honest way to learn the task; their word shingles are still
~60% alike, which no Jaccard threshold separates from a lightly reworded copy of one sealed item.
A copy keeps the item's numbers; a new problem changes them.

The sealed side is indexed once in the constructor; ``scan`` is then linear in the rows. Pure
Python + datasketch, no Django: the datapool's decontamination job and the integrity checks share it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Literal

import xxhash
from datasketch import MinHash, MinHashLSH

MatchKind = Literal["exact", "ngram", "near_dup"]
_RANK: dict[str, int] = {"exact": 0, "ngram": 1, "near_dup": 2}

_TOKEN = re.compile(r"[^\W_]+")
_UNIT_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
)
_TEN_WORDS = "twenty thirty forty fifty sixty seventy eighty ninety"
_UNITS = {w: i for i, w in enumerate(_UNIT_WORDS.split(" "))}
_TENS = {w: 10 * i for i, w in enumerate(_TEN_WORDS.split(" "), start=2)}
_SCALES = {"hundred": 100, "thousand": 1000}
_NUMBER_WORDS = {**_UNITS, **_TENS, **_SCALES}


def _words_to_number(words: Sequence[str]) -> int:
    total = current = 0
    for word in words:
        if word == "hundred":
            current = max(current, 1) * 100
        elif word == "thousand":
            total += max(current, 1) * 1000
            current = 0
        else:
            current += _NUMBER_WORDS[word]
    return total + current


def normalize_tokens(text: str) -> list[str]:
    """Word tokens of ``text``: NFKC, case-folded, punctuation dropped, number words as digits.

    "Forty-two  apples?" and "42 apples" give the same tokens. The same function runs on both
    sides, so an odd merge (a pronoun "one" read as 1) cancels out.
    """
    raw = _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())
    out: list[str] = []
    i = 0
    while i < len(raw):
        if raw[i] in _NUMBER_WORDS and raw[i] not in _SCALES:
            j = i
            while j < len(raw) and raw[j] in _NUMBER_WORDS:
                j += 1
            out.append(str(_words_to_number(raw[i:j])))
            i = j
        else:
            out.append(raw[i])
            i += 1
    return out


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a row (values of dicts, items of lists), in order; keys are skipped."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _template_affixes(template: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The normalised words before and after ``{question}`` / ``{prompt}`` in a prompt template."""
    for slot in ("{question}", "{prompt}"):
        if slot in template:
            before, after = template.split(slot, 1)
            return tuple(normalize_tokens(before)), tuple(normalize_tokens(after))
    return None


# Items with at least this many numbers are also found through their numbers; rows with more than
# _MAX_ROW_NUMBERS numbers skip that path (the combinations grow fast; MinHash still applies).
_MIN_NUMBERS = 2
_MAX_ROW_NUMBERS = 12


def _hash32(data: bytes) -> int:
    # xxhash instead of datasketch's default sha1: a third of the scan time went to sha1.
    return xxhash.xxh32_intdigest(data)


def _in_order(needle: Sequence[str], haystack: Sequence[str]) -> bool:
    """``needle`` is a subsequence of ``haystack`` (same items, same order, gaps allowed)."""
    rest = iter(haystack)
    return all(item in rest for item in needle)


@dataclass(frozen=True)
class Match:
    """One training row overlapping one sealed item. ``span`` is the matching text, normalised."""

    row_index: int
    sample_id: str
    kind: MatchKind
    span: str
    score: float  # 1.0 for exact; share of the item's n-grams found; Jaccard for near_dup


@dataclass
class _Sealed:
    sample_id: str
    tokens: tuple[str, ...]
    ngram_count: int
    shingles: frozenset[str]
    numbers: tuple[str, ...]  # in order, repeats kept: 20 + 20 is not 20 + 70, 58 + 28 not 28 + 58
    numbers_with_answer: tuple[str, ...]


class ContaminationScanner:
    """Index sealed items once, then scan any number of training rows against them.

    ``sealed_items``: dicts with ``id`` and ``prompt`` (``answer`` optional; it joins the
    near-duplicate text). ``ngram``: n for the n-gram layer. ``threshold``: the Jaccard similarity
    of word shingles at which a row is a near duplicate; ``numeric_threshold`` the one for items
    whose numbers (two or more) all recur in the row in order. ``templates``: prompt templates (with a
    ``{question}`` slot) whose fixed words are stripped from row strings before near-duplicate
    comparison, so that the benchmark's own template does not dilute the similarity.
    """

    def __init__(
        self,
        sealed_items: Sequence[dict[str, Any]],
        *,
        ngram: int = 13,
        threshold: float = 0.75,
        shingle: int = 2,
        num_perm: int = 64,
        numeric_threshold: float = 0.5,
        templates: Sequence[str] = (),
        seed: int = 1,
    ) -> None:
        if ngram < 1:
            raise ValueError("ngram must be >= 1")
        if not 0 < threshold <= 1:
            raise ValueError("threshold must be in (0, 1]")
        if not 0 < numeric_threshold <= 1:
            raise ValueError("numeric_threshold must be in (0, 1]")
        self.ngram = ngram
        self.threshold = threshold
        self.numeric_threshold = numeric_threshold
        self.shingle = shingle
        self.num_perm = num_perm
        self._affixes = [a for a in (_template_affixes(t) for t in templates) if a is not None]
        # One set of permutations for every sketch; building them per MinHash costs 4x the hashing.
        self._proto = MinHash(num_perm=num_perm, seed=seed, hashfunc=_hash32)
        self._items: list[_Sealed] = []
        # exact layer: items shorter than n by length -> token tuple -> item indices; longer items
        # by their first n-gram (an anchor), verified token by token.
        self._short: dict[int, dict[tuple[str, ...], list[int]]] = {}
        self._anchor: dict[tuple[str, ...], list[int]] = {}
        # n-gram layer: every n-gram of every item longer than n -> item indices.
        self._grams: dict[tuple[str, ...], list[int]] = {}
        self._lsh = MinHashLSH(threshold=self._lsh_threshold(threshold), num_perm=num_perm)
        # near-duplicate candidates by their numbers: items with two or more, keyed by the tuple.
        self._by_numbers: dict[tuple[str, ...], list[int]] = {}

        for item in sealed_items:
            tokens = tuple(normalize_tokens(str(item.get("prompt", ""))))
            if not tokens:
                continue
            index = len(self._items)
            near_tokens = list(tokens) + normalize_tokens(str(item.get("answer", "")))
            shingles = self._shingles(near_tokens)
            record = _Sealed(
                sample_id=str(item["id"]),
                tokens=tokens,
                ngram_count=max(0, len(tokens) - ngram + 1),
                shingles=shingles,
                numbers=tuple(t for t in tokens if t.isdigit()),
                numbers_with_answer=tuple(t for t in near_tokens if t.isdigit()),
            )
            self._items.append(record)
            if len(tokens) < ngram:
                self._short.setdefault(len(tokens), {}).setdefault(tokens, []).append(index)
            else:
                self._anchor.setdefault(tokens[:ngram], []).append(index)
                for start in range(record.ngram_count):
                    bucket = self._grams.setdefault(tokens[start : start + ngram], [])
                    if not bucket or bucket[-1] != index:
                        bucket.append(index)
            self._lsh.insert(index, self._sketch(shingles), check_duplication=False)
            if len(record.numbers) >= _MIN_NUMBERS:
                self._by_numbers.setdefault(record.numbers, []).append(index)
        self._number_lengths = sorted({len(key) for key in self._by_numbers})

    @staticmethod
    def _lsh_threshold(threshold: float) -> float:
        # LSH recall falls off near its threshold; ask it for somewhat less similar candidates
        # and let the exact Jaccard decide.
        return max(0.1, threshold - 0.15)

    def __len__(self) -> int:
        return len(self._items)

    # ------------------------------------------------------------------ helpers

    def _shingles(self, tokens: Sequence[str]) -> frozenset[str]:
        k = self.shingle
        if len(tokens) <= k:
            return frozenset([" ".join(tokens)]) if tokens else frozenset()
        return frozenset(" ".join(tokens[i : i + k]) for i in range(len(tokens) - k + 1))

    def _sketch(self, shingles: Iterable[str]) -> MinHash:
        sketch = MinHash(
            num_perm=self.num_perm, permutations=self._proto.permutations, scheme=self._proto.scheme, hashfunc=_hash32
        )
        sketch.update_batch([s.encode("utf-8") for s in shingles])
        return sketch

    def _near_tokens(self, row: Any) -> list[str]:
        out: list[str] = []
        for text in _strings(row):
            tokens = normalize_tokens(text)
            for before, after in self._affixes:
                n_before, n_after = len(before), len(after)
                if (
                    len(tokens) >= n_before + n_after
                    and tuple(tokens[:n_before]) == before
                    and tuple(tokens[len(tokens) - n_after :]) == after
                ):
                    tokens = tokens[n_before : len(tokens) - n_after]
                    break
            out.extend(tokens)
        return out

    # ------------------------------------------------------------------ scanning

    def scan_row(self, row: Any, row_index: int = 0) -> list[Match]:
        """Matches of one row (a dict, list or string), at most one per sealed item: the strongest."""
        tokens: list[str] = []
        for text in _strings(row):
            tokens.extend(normalize_tokens(text))
        best: dict[int, Match] = {}
        gram_hits: dict[int, set[tuple[str, ...]]] = {}
        n = self.ngram
        count = len(tokens)
        for length, table in self._short.items():
            for start in range(count - length + 1):
                window = tuple(tokens[start : start + length])
                for index in table.get(window, ()):
                    if index not in best:
                        best[index] = Match(row_index, self._items[index].sample_id, "exact", " ".join(window), 1.0)
        for start in range(count - n + 1):
            window = tuple(tokens[start : start + n])
            for index in self._anchor.get(window, ()):
                item_tokens = self._items[index].tokens
                if index not in best and tuple(tokens[start : start + len(item_tokens)]) == item_tokens:
                    best[index] = Match(row_index, self._items[index].sample_id, "exact", " ".join(item_tokens), 1.0)
            for index in self._grams.get(window, ()):
                gram_hits.setdefault(index, set()).add(window)
        numbers = [t for t in tokens if t.isdigit()]
        for index, grams in gram_hits.items():
            item = self._items[index]
            if index not in best and _in_order(item.numbers, numbers):
                span = " ".join(next(iter(sorted(grams))))
                best[index] = Match(row_index, item.sample_id, "ngram", span, len(grams) / item.ngram_count)

        near_tokens = self._near_tokens(row)
        shingles = self._shingles(near_tokens)
        if shingles:
            candidates = set(self._lsh.query(self._sketch(shingles)))
            if len(numbers) <= _MAX_ROW_NUMBERS:
                for length in self._number_lengths:
                    for key in set(combinations(numbers, length)):
                        candidates.update(self._by_numbers.get(key, ()))
            for index in candidates:
                if index in best:
                    continue
                item = self._items[index]
                # An item whose numbers, its answer's included, all recur in order is held to the
                # lower bar: for word problems the numbers are what make a problem that problem.
                bar = self.threshold
                if len(item.numbers) >= _MIN_NUMBERS and _in_order(item.numbers_with_answer, numbers):
                    bar = min(bar, self.numeric_threshold)
                jaccard = len(item.shingles & shingles) / len(item.shingles | shingles)
                if jaccard >= bar and _in_order(item.numbers, numbers):
                    best[index] = Match(row_index, item.sample_id, "near_dup", " ".join(near_tokens), round(jaccard, 4))
        return sorted(best.values(), key=lambda m: (_RANK[m.kind], m.sample_id))

    def scan(self, rows: Iterable[Any]) -> list[Match]:
        """All matches of all rows, in row order."""
        matches: list[Match] = []
        for row_index, row in enumerate(rows):
            matches.extend(self.scan_row(row, row_index))
        return matches
