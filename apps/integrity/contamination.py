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

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Literal

import xxhash
from datasketch import MinHash, MinHashLSH

from apps.integrity.canonical import canonical_tokens, is_number
from apps.ml.row_format import training_texts

MatchKind = Literal["exact", "ngram", "near_dup", "salient"]
LAYERS: tuple[MatchKind, ...] = ("exact", "ngram", "near_dup", "salient")
_RANK: dict[str, int] = {kind: rank for rank, kind in enumerate(LAYERS)}


def normalize_tokens(text: str) -> list[str]:
    """Word tokens of ``text`` in the canonical form (``apps.integrity.canonical``).

    "Forty-two  apples?" and "42 apples" give the same tokens, and so do homoglyph, zero-width and
    number-format variants. The same function runs on both sides, so an odd merge (a pronoun "one"
    read as 1) cancels out.
    """
    return canonical_tokens(text)


def row_strings(value: Any) -> Iterator[str]:
    """The row's texts as the trainer reads them: by field name, in training order
    (:func:`apps.ml.row_format.training_texts`: SFT prompt then completion, DPO prompt with chosen
    and prompt with rejected, chat messages in order), then the fields it does not read. A row
    written ``{"completion": .., "prompt": ..}`` is scanned prompt first, as it is trained."""
    yield from training_texts(value)


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


# ---------------------------------------------------------------------------- salient content
#
# A sealed item's *key content* is what makes it that item whatever the sentence around it: for a
# numeric exact-match item the prompt's numbers in order and the answer; for multiple choice the
# question's entity, the option set and the answer option; for a function call the function name
# and its argument values. It is derived from the item's prompt and answer and the benchmark's
# evaluator kind, never from how a generator phrased it, so a GSM8K-style item works the same way.

EvaluatorKind = Literal["numeric", "multiple_choice", "json_call"]

# Option labels "A) x", "A. x", "(A) x", "A: x" at a word start.
_OPTION_LABEL = re.compile(r"(?:(?<=\s)|^)\(?([A-J])[).:]\s+")
_ANSWER_LETTER = re.compile(r"\s*\(?([A-J])\b")
# Words a question stem uses whatever it asks; the entity is what is left (plus the benchmark's own
# template words, found by how often they recur across its sealed items).
_STOPWORD_TEXT = (
    "a an the of to in on at for from by with and or is are was be it its this that these those which what "
    "who whom whose how does do did one 1 option options choice choices answer answers following pick choose "
    "select correct best right word letter named called as not no"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_TEMPLATE_SHARE = 0.1  # a stem word in at least this share of the sealed stems (and >= 3) is template
_NUMBER_GAPS = 2  # extra numbers a row may interleave among an item's numbers
_ANSWER_REACH = 3  # within how many numbers after the last operand the answer must come
_MIN_SALIENT_NUMBERS = 2
_SPACED_DIGITS = re.compile(r"\d \d{3}(?!\d)")
# A note's label at a line start, letters glued to its number and a colon, dot or bracket after:
# "Q17: ..", "Ex3. ..", "(No12) ..". It counts notes; it is no operand of the note it labels.
_NOTE_LABEL = re.compile(r"^(\s*(?:[-*\u2022]\s*)?\(?[^\W\d_]{1,8})\d{1,4}(?=[:.)]\s)", re.MULTILINE)
_JSON = json.JSONDecoder()


@dataclass
class _Key:
    """One sealed item's key content, in canonical tokens."""

    kind: EvaluatorKind
    index: int
    numbers: tuple[str, ...] = ()  # numeric: the prompt's numbers, in order
    answer: tuple[str, ...] = ()  # numeric: (answer,); multiple choice: the answer option's tokens
    content: frozenset[str] = frozenset()  # numeric items with one number: the prompt's content words
    options: tuple[tuple[str, ...], ...] = ()  # multiple choice
    answer_count: int = 1  # multiple choice: how often the answer option occurs in the sealed prompt
    stem: tuple[str, ...] = ()  # multiple choice: canonical stem tokens (entity derived later)
    entity: frozenset[str] = frozenset()
    name: tuple[str, ...] = ()  # json_call
    values: tuple[tuple[str, ...], ...] = ()  # json_call: argument values, answer order
    prompt_order: tuple[int, ...] = ()  # json_call: the values' order of appearance in the prompt
    pairs: tuple[tuple[str, ...], ...] = ()  # json_call: "argument value" token runs
    reach: int = 0  # json_call: how many tokens the values may spread over in a row
    span: str = ""


def evaluator_kind(evaluator: str | None, prompt: str, answer: str) -> EvaluatorKind | None:
    """Which salient rule fits an item: from the benchmark's evaluator, else from the item's shape."""
    if evaluator == "multiple_choice":
        return "multiple_choice"
    if evaluator == "json_call":
        return "json_call"
    if evaluator not in (None, "", "exact_match"):
        return None
    if _parse_call(answer) is not None:
        return "json_call" if not evaluator else None
    if not evaluator and _ANSWER_LETTER.fullmatch(answer.strip()) and len(_parse_options(prompt)[1]) >= 2:
        return "multiple_choice"
    return "numeric" if _answer_number(answer) is not None else None


def _parse_call(text: str) -> tuple[str, dict[str, Any]] | None:
    try:
        call = json.loads(text)
    except (ValueError, TypeError):
        return None
    return _as_call(call)


def _as_call(call: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", {})
    return (call["name"], arguments) if isinstance(arguments, dict) else None


def _answer_number(answer: str) -> str | None:
    """The number an exact-match answer states: the whole answer, the one after "####", or the last."""
    text = answer.rsplit("####", 1)[1] if "####" in answer else answer
    numbers = [t for t in canonical_tokens(text) if is_number(t)]
    return numbers[-1] if numbers else None


def _parse_options(prompt: str) -> tuple[str, list[tuple[str, str]]]:
    """(stem, [(letter, text), ...]) for a prompt listing options "A) .. B) ..", letters in order from A."""
    labels = [m for m in _OPTION_LABEL.finditer(prompt)]
    chain: list[re.Match[str]] = []
    for label in labels:
        expected = chr(ord("A") + len(chain))
        if label.group(1) == expected:
            chain.append(label)
        elif label.group(1) == "A":
            chain = [label]
    if len(chain) < 2:
        return prompt, []
    options = []
    for k, label in enumerate(chain):
        end = chain[k + 1].start() if k + 1 < len(chain) else len(prompt)
        options.append((label.group(1), prompt[label.end() : end].strip()))
    return prompt[: chain[0].start()], options


def _find_run(needle: Sequence[str], haystack: Sequence[str], start: int = 0) -> int:
    """Index of the first contiguous occurrence of ``needle`` in ``haystack`` at or after ``start``, or -1."""
    n = len(needle)
    first = needle[0]
    for i in range(start, len(haystack) - n + 1):
        if haystack[i] == first and tuple(haystack[i : i + n]) == tuple(needle):
            return i
    return -1


def _count_runs(needle: Sequence[str], haystack: Sequence[str]) -> int:
    count, at = 0, _find_run(needle, haystack)
    while at >= 0:
        count += 1
        at = _find_run(needle, haystack, at + len(needle))
    return count


def _value_tokens(value: Any) -> tuple[str, ...]:
    if isinstance(value, bool):
        return ("true",) if value else ("false",)
    if isinstance(value, str):
        return tuple(canonical_tokens(value))
    if isinstance(value, int | float):
        return tuple(canonical_tokens(repr(value)))
    return tuple(canonical_tokens(json.dumps(value, ensure_ascii=False)))


def salient_key(item: dict[str, Any], index: int, evaluator: str | None = None) -> _Key | None:
    """The key content of one sealed item, or None where its kind has no salient rule."""
    prompt, answer = str(item.get("prompt", "")), str(item.get("answer", ""))
    kind = evaluator_kind(item.get("evaluator") or evaluator, prompt, answer)
    if kind == "numeric":
        number = _answer_number(answer)
        tokens = canonical_tokens(prompt)
        numbers = tuple(t for t in tokens if is_number(t))
        if number is None or not numbers:
            return None
        content = frozenset(t for t in tokens if not is_number(t) and t not in _STOPWORDS)
        first = next(k for k, t in enumerate(tokens) if is_number(t))
        own = len(tokens) - first + 1  # from the first operand to the answer, as the sealed item writes it
        return _Key(kind, index, numbers=numbers, answer=(number,), content=content, span=" ".join(numbers),
                    reach=2 * own + 4)  # fmt: skip
    if kind == "multiple_choice":
        stem, options = _parse_options(prompt)
        if len(options) < 2:
            return None
        texts = {letter: tuple(canonical_tokens(text)) for letter, text in options}
        letter = _ANSWER_LETTER.match(answer)
        chosen = texts.get(letter.group(1)) if letter else None
        if chosen is None:
            wanted = tuple(canonical_tokens(answer))
            chosen = wanted if wanted in texts.values() else None
        if not chosen or not all(texts.values()):
            return None
        prompt_tokens = canonical_tokens(prompt)
        stem_tokens = tuple(canonical_tokens(stem))
        span = " ".join(stem_tokens) + " | " + " / ".join(" ".join(t) for t in texts.values())
        return _Key(
            kind,
            index,
            reach=2 * len(prompt_tokens) + 4,
            options=tuple(texts.values()),
            answer=chosen,
            answer_count=max(1, _count_runs(chosen, prompt_tokens)),
            stem=stem_tokens,
            span=span,
        )
    if kind == "json_call":
        call = _parse_call(answer)
        if call is None:
            return None
        name, arguments = call
        pairs: list[tuple[str, ...]] = []
        values: list[tuple[str, ...]] = []
        for key, value in arguments.items():
            value_tokens = _value_tokens(value)
            if value_tokens:
                values.append(value_tokens)
                pairs.append(tuple(canonical_tokens(str(key))) + value_tokens)
        name_tokens = tuple(canonical_tokens(name))
        if not values or not name_tokens:
            return None
        prompt_tokens = canonical_tokens(prompt)
        found = [_find_run(v, prompt_tokens) for v in values]
        order = sorted(range(len(values)), key=lambda k: (found[k] < 0, found[k], k))
        compact = sum(len(v) for v in values) + len(values) - 1
        spread = compact
        if all(at >= 0 for at in found):
            spread = max(at + len(v) for at, v in zip(found, values, strict=True)) - min(found)
        return _Key(
            kind,
            index,
            name=name_tokens,
            values=tuple(values),
            prompt_order=tuple(order),
            pairs=tuple(pairs),
            # As close together as in the sealed prompt (or in a positional call), a few words of slack.
            reach=max(spread, compact) + 3,
            # Evidence is prompt text only, never the answer: the values the prompt states.
            span=" | ".join(" ".join(v) for v, at in zip(values, found, strict=True) if at >= 0),
        )
    return None


def _json_calls(line: str) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """The function calls written as JSON objects in ``line``, and the line with them blanked out."""
    calls: list[tuple[str, dict[str, Any]]] = []
    rest: list[str] = []
    at = line.find("{")
    done = 0
    while at >= 0:
        try:
            value, end = _JSON.raw_decode(line, at)
        except ValueError:
            at = line.find("{", at + 1)
            continue
        call = _as_call(value)
        if call is not None:
            calls.append(call)
            rest.append(line[done:at])
            done = end
        at = line.find("{", end)
    rest.append(line[done:])
    return calls, " \n ".join(rest)


def _values_in_order(values: Sequence[tuple[str, ...]], tokens: Sequence[str], limit: int) -> bool:
    """Each value's tokens occur contiguously in ``tokens``, in this order, within ``limit`` tokens."""
    start = 0
    while True:
        first = _find_run(values[0], tokens, start)
        if first < 0:
            return False
        at = first + len(values[0])
        for value in values[1:]:
            found = _find_run(value, tokens, at)
            if found < 0:
                return False
            at = found + len(value)
        if at - first <= limit:
            return True
        start = first + 1


def _within_window(needles: Sequence[Sequence[str]], tokens: Sequence[str], limit: int) -> bool:
    """Every needle occurs as a contiguous run inside one window of ``limit`` tokens (any order):
    an item's parts together in one item's span, not scattered over a document."""
    starts = sorted({at for needle in needles for at in _run_positions(needle, tokens)})
    for start in starts:
        window = tokens[start : start + limit]
        if all(_find_run(needle, window) >= 0 for needle in needles):
            return True
    return False


def _run_positions(needle: Sequence[str], tokens: Sequence[str]) -> list[int]:
    found, at = [], _find_run(needle, tokens)
    while at >= 0:
        found.append(at)
        at = _find_run(needle, tokens, at + 1)
    return found


def _numbers_run(key: _Key, numbers: Sequence[str], i: int) -> tuple[int, ...] | None:
    """Positions of the key's numbers from ``numbers[i]`` on (at most ``_NUMBER_GAPS`` other
    numbers among them, the row's strings read as one), when the answer follows them closely."""
    used = [i]
    at = i + 1
    gaps = 0
    for wanted in key.numbers[1:]:
        while at < len(numbers) and numbers[at] != wanted and gaps <= _NUMBER_GAPS:
            at += 1
            gaps += 1
        if gaps > _NUMBER_GAPS or at >= len(numbers):
            return None
        used.append(at)
        at += 1
    # After them, not before: "76 crayons, 36 given away, 40 left" is another problem than 36 + 40.
    if key.answer[0] in numbers[at : at + _ANSWER_REACH]:
        return (*used, numbers.index(key.answer[0], at))
    return None


class ContaminationScanner:
    """Index sealed items once, then scan any number of training rows against them.

    ``sealed_items``: dicts with ``id`` and ``prompt`` (``answer`` optional; it joins the
    near-duplicate text and the salient key; ``evaluator`` optional, else the constructor's).
    ``ngram``: n for the n-gram layer. ``threshold``: the Jaccard similarity of word shingles at
    which a row is a near duplicate; ``numeric_threshold`` the one for items whose numbers (two or
    more) all recur in the row in order. ``templates``: prompt templates (with a ``{question}``
    slot) whose fixed words are stripped from row strings before near-duplicate comparison, so that
    the benchmark's own template does not dilute the similarity. ``layers``: which of ``LAYERS`` run
    (all by default). ``evaluator``: the benchmark's evaluator name ("exact_match",
    "multiple_choice", "json_call"), which picks the salient-content rule; without one it is
    inferred from each item's shape.
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
        layers: Sequence[str] = LAYERS,
        evaluator: str | None = None,
    ) -> None:
        if ngram < 1:
            raise ValueError("ngram must be >= 1")
        if not 0 < threshold <= 1:
            raise ValueError("threshold must be in (0, 1]")
        if not 0 < numeric_threshold <= 1:
            raise ValueError("numeric_threshold must be in (0, 1]")
        unknown = [layer for layer in layers if layer not in LAYERS]
        if unknown or not layers:
            raise ValueError(f"layers must be a non-empty subset of {LAYERS}, got {list(layers)}")
        self.layers: tuple[MatchKind, ...] = tuple(layer for layer in LAYERS if layer in layers)
        self.ngram = ngram
        self.threshold = threshold
        self.numeric_threshold = numeric_threshold
        self.shingle = shingle
        self.num_perm = num_perm
        self.evaluator = evaluator
        self._affixes = [a for a in (_template_affixes(t) for t in templates) if a is not None]
        # One set of permutations for every sketch; building them per MinHash costs 4x the hashing.
        self._proto = MinHash(num_perm=num_perm, seed=seed, hashfunc=_hash32)
        self._items: list[_Sealed] = []
        self._answers: dict[str, tuple[str, ...]] = {}  # sample id -> answer tokens (apps.integrity.screen)
        # exact layer: items shorter than n by length -> token tuple -> item indices; longer items
        # by their first n-gram (an anchor), verified token by token.
        self._short: dict[int, dict[tuple[str, ...], list[int]]] = {}
        self._short_lengths: dict[str, set[int]] = {}  # first token -> lengths of short items starting so
        self._anchor: dict[tuple[str, ...], list[int]] = {}
        # n-gram layer: every n-gram of every item longer than n -> item indices.
        self._grams: dict[tuple[str, ...], list[int]] = {}
        self._lsh = MinHashLSH(threshold=self._lsh_threshold(threshold), num_perm=num_perm)
        # near-duplicate candidates by their numbers: items with two or more, keyed by the tuple.
        self._by_numbers: dict[tuple[str, ...], list[int]] = {}
        # salient layer: keys, and their indexes (numeric by their first two numbers or by the
        # number and the answer; multiple choice and calls by two of their tokens that a row must
        # carry: the answer option's and the rarest other option's, or a call's two rarest values').
        self._keys: list[_Key] = []
        self._numeric_pairs: dict[tuple[str, str], list[int]] = {}
        self._numeric_single: dict[tuple[str, str], list[int]] = {}
        self._by_token: dict[str, dict[str, list[int]]] = {}
        exact, ngram_on, near = "exact" in self.layers, "ngram" in self.layers, "near_dup" in self.layers

        for item in sealed_items:
            tokens = tuple(normalize_tokens(str(item.get("prompt", ""))))
            if not tokens:
                continue
            index = len(self._items)
            near_tokens = list(tokens) + normalize_tokens(str(item.get("answer", "")))
            shingles = self._shingles(near_tokens) if near else frozenset()
            record = _Sealed(
                sample_id=str(item["id"]),
                tokens=tokens,
                ngram_count=max(0, len(tokens) - ngram + 1),
                shingles=shingles,
                numbers=tuple(t for t in tokens if is_number(t)),
                numbers_with_answer=tuple(t for t in near_tokens if is_number(t)),
            )
            self._items.append(record)
            self._answers[record.sample_id] = tuple(normalize_tokens(str(item.get("answer", ""))))
            if len(tokens) < ngram:
                if exact:
                    self._short.setdefault(len(tokens), {}).setdefault(tokens, []).append(index)
                    self._short_lengths.setdefault(tokens[0], set()).add(len(tokens))
            else:
                if exact:
                    self._anchor.setdefault(tokens[:ngram], []).append(index)
                if ngram_on:
                    for start in range(record.ngram_count):
                        bucket = self._grams.setdefault(tokens[start : start + ngram], [])
                        if not bucket or bucket[-1] != index:
                            bucket.append(index)
            if near:
                self._lsh.insert(index, self._sketch(shingles), check_duplication=False)
                if len(record.numbers) >= _MIN_NUMBERS:
                    self._by_numbers.setdefault(record.numbers, []).append(index)
            if "salient" in self.layers:
                key = salient_key(item, index, evaluator)
                if key is not None:
                    self._keys.append(key)
        self._number_lengths = sorted({len(key) for key in self._by_numbers})
        self._index_salient()

    def _index_salient(self) -> None:
        stems = [key for key in self._keys if key.kind == "multiple_choice"]
        stem_df: dict[str, int] = {}
        for key in stems:
            for token in set(key.stem):
                stem_df[token] = stem_df.get(token, 0) + 1
        template_at = max(3.0, _TEMPLATE_SHARE * len(stems))
        token_df: dict[str, int] = {}
        for key in self._keys:
            if key.kind == "multiple_choice":
                key.entity = frozenset(
                    t for t in key.stem if t not in _STOPWORDS and not is_number(t) and stem_df[t] < template_at
                )
            for value in key.options + key.values:
                for token in set(value):
                    token_df[token] = token_df.get(token, 0) + 1
        for position, key in enumerate(self._keys):
            if key.kind == "numeric":
                if len(key.numbers) >= _MIN_SALIENT_NUMBERS:
                    self._numeric_pairs.setdefault((key.numbers[0], key.numbers[1]), []).append(position)
                else:
                    self._numeric_single.setdefault((key.numbers[0], key.answer[0]), []).append(position)
            else:
                if key.kind == "multiple_choice":
                    first = min(key.answer, key=lambda t: (token_df[t], t))
                    rest = {t for option in key.options if option != key.answer for t in option} - {first}
                else:
                    tokens = sorted({t for value in key.values for t in value}, key=lambda t: (token_df[t], t))
                    first, rest = tokens[0], set(tokens[1:])
                second = min(rest, key=lambda t: (token_df[t], t)) if rest else ""
                self._by_token.setdefault(first, {}).setdefault(second, []).append(position)

    @staticmethod
    def _lsh_threshold(threshold: float) -> float:
        # LSH recall falls off near its threshold; ask it for somewhat less similar candidates
        # and let the exact Jaccard decide.
        return max(0.1, threshold - 0.15)

    def __len__(self) -> int:
        return len(self._items)

    def answer_tokens(self, sample_id: str) -> tuple[str, ...]:
        """The canonical tokens of a sealed item's answer (empty when it has none or is unknown)."""
        return self._answers.get(sample_id, ())

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

    def _near_tokens(self, per_string: Sequence[list[str]]) -> list[str]:
        out: list[str] = []
        for tokens in per_string:
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

    # ------------------------------------------------------------------ salient layer

    def _salient(self, texts: Sequence[str], per_string: Sequence[list[str]], tokens: Sequence[str]) -> set[int]:
        """Positions in ``self._keys`` whose key content the row carries."""
        found: set[int] = set()
        if self._numeric_pairs or self._numeric_single:
            # Lines: a line break inside a text ends a note of a list; the boundary between two
            # texts (prompt and completion, chat turns) does not.
            lines = [
                (line_no, _NOTE_LABEL.sub(r"\1", line))
                for text in texts
                for line_no, line in enumerate(text.split("\n"))
            ]
            readings = [True]
            if any(_SPACED_DIGITS.search(text) for text in texts):
                readings.append(False)  # "67 112" may be one number or two: try both readings
            for group_spaces in readings:
                numbers: list[str] = []
                where: list[tuple[int, int]] = []  # (token position, line) of each number
                position = 0
                line_id = 0
                for k, (line_no, line) in enumerate(lines):
                    line_id += 1 if k and line_no else 0
                    for token in canonical_tokens(line, group_spaces=group_spaces):
                        if is_number(token):
                            numbers.append(token)
                            where.append((position, line_id))
                        position += 1
                found |= self._salient_numeric(numbers, tokens, where)
        if self._by_token:
            row_set = set(tokens)
            row_set.add("")
            candidates: set[int] = set()
            for token in row_set:
                seconds = self._by_token.get(token)
                if seconds is None:
                    continue
                if len(seconds) <= len(row_set):
                    for second, positions in seconds.items():
                        if second in row_set:
                            candidates.update(positions)
                else:
                    for second in row_set:
                        candidates.update(seconds.get(second, ()))
            for position in candidates:
                key = self._keys[position]
                if key.kind == "multiple_choice":
                    if self._choice_match(key, tokens, row_set):
                        found.add(position)
                elif self._call_match(key, texts, per_string, row_set):
                    found.add(position)
        return found

    def _salient_numeric(
        self, numbers: Sequence[str], tokens: Sequence[str], where: Sequence[tuple[int, int]]
    ) -> set[int]:
        runs: dict[int, set[tuple[int, ...]]] = {}
        count = len(numbers)
        row_set: set[str] | None = None
        single: set[int] = set()
        for i in range(count):
            for j in range(i + 1, min(count, i + 2 + _NUMBER_GAPS)):
                for position in self._numeric_pairs.get((numbers[i], numbers[j]), ()):
                    key = self._keys[position]
                    run = _numbers_run(key, numbers, i)
                    # Within one item's span: operands to answer no wider than the sealed item's
                    # own span, or twice that and four tokens with the operands on one line (a line
                    # break between them is where one note of a list ends and the next begins).
                    width = where[run[-1]][0] - where[run[0]][0] if run is not None else 0
                    if run is not None and (
                        width < (key.reach - 4) // 2 or (where[run[0]][1] == where[run[-2]][1] and width < key.reach)
                    ):
                        runs.setdefault(position, set()).add(run)
            if self._numeric_single:
                for j in (i - 1, i + 1):
                    if 0 <= j < count:
                        for position in self._numeric_single.get((numbers[i], numbers[j]), ()):
                            key = self._keys[position]
                            row_set = row_set if row_set is not None else set(tokens)
                            # One number and an answer are too little alone: most of the prompt's
                            # content words must be there too.
                            if len(key.content & row_set) * 2 >= len(key.content):
                                single.add(position)
        # A row that states an item's numbers twice ("20 and 62 more ... 20 + 62 = 82") also holds
        # the swapped item's numbers across the two ("62, 20 ... 82"); an item all of whose runs
        # lie on other items' runs is that echo, not a copy.
        found = set(single)
        for position, own in runs.items():
            others = {p for q, theirs in runs.items() if q != position for run in theirs for p in run}
            if not all(set(run) <= others for run in own):
                found.add(position)
        return found

    @staticmethod
    def _choice_match(key: _Key, tokens: Sequence[str], row_set: set[str]) -> bool:
        # Every option, the entity, and the answer option stated as often as the sealed prompt
        # states it (once as an option, once more where the question names it): a row with the
        # same options asking for another of them is not this item.
        if not key.entity <= row_set:
            return False
        for option in key.options:
            if not set(option) <= row_set or _find_run(option, tokens) < 0:
                return False
        # ... and together, within one item's span (twice the sealed prompt and four tokens):
        # practice notes that name these options across several items are not this item.
        needles = [*key.options, *((t,) for t in key.entity)]
        for start in sorted({at for needle in needles for at in _run_positions(needle, tokens)}):
            window = tokens[start : start + key.reach]
            if all(_find_run(n, window) >= 0 for n in needles) and _count_runs(key.answer, window) >= key.answer_count:
                return True
        return False

    @staticmethod
    def _call_match(key: _Key, texts: Sequence[str], per_string: Sequence[list[str]], row_set: set[str]) -> bool:
        if not set(key.name) <= row_set or not all(set(v) <= row_set for v in key.values):
            return False
        limit = key.reach
        orders = [key.values, tuple(key.values[k] for k in key.prompt_order)]
        for tokens in per_string:
            # "city Bangkok ... day tonight" next to each other, not in two calls of a list.
            if _within_window(key.pairs, tokens, sum(len(p) for p in key.pairs) + len(key.pairs)):
                return True
        # The values alone, in order and close: within one line (a line break ends one note of a list).
        # A call written as JSON is read as a call: each argument value whole ("yaw ym no" is not
        # the value "no"), and its text does not join the words around it.
        for text in texts:
            for line in text.split("\n"):
                calls, free = _json_calls(line) if "{" in line else ([], line)
                for name, arguments in calls:
                    stated = {tuple(canonical_tokens(str(k))) + _value_tokens(v) for k, v in arguments.items()}
                    if tuple(canonical_tokens(name)) == key.name and all(p in stated for p in key.pairs):
                        return True
                for part in free.split("\n"):
                    tokens = canonical_tokens(part)
                    if any(_values_in_order(order, tokens, limit) for order in orders):
                        return True
        return False

    # ------------------------------------------------------------------ scanning

    def scan_row(self, row: Any, row_index: int = 0) -> list[Match]:
        """Matches of one row (a dict, list or string), at most one per sealed item: the strongest."""
        texts = list(row_strings(row))
        per_string = [normalize_tokens(text) for text in texts]
        tokens: list[str] = [t for string_tokens in per_string for t in string_tokens]
        best: dict[int, Match] = {}
        gram_hits: dict[int, set[tuple[str, ...]]] = {}
        n = self.ngram
        count = len(tokens)
        short_lengths = self._short_lengths
        for start in range(count):
            lengths = short_lengths.get(tokens[start])
            if lengths is None:
                continue
            for length in lengths:
                if start + length > count:
                    continue
                window = tuple(tokens[start : start + length])
                for index in self._short[length].get(window, ()):
                    if index not in best:
                        best[index] = Match(row_index, self._items[index].sample_id, "exact", " ".join(window), 1.0)
        if self._anchor or self._grams:
            for start in range(count - n + 1):
                window = tuple(tokens[start : start + n])
                for index in self._anchor.get(window, ()):
                    item_tokens = self._items[index].tokens
                    if index not in best and tuple(tokens[start : start + len(item_tokens)]) == item_tokens:
                        best[index] = Match(
                            row_index, self._items[index].sample_id, "exact", " ".join(item_tokens), 1.0
                        )
                for index in self._grams.get(window, ()):
                    gram_hits.setdefault(index, set()).add(window)
        numbers = [t for t in tokens if is_number(t)]
        for index, grams in gram_hits.items():
            item = self._items[index]
            if index not in best and _in_order(item.numbers, numbers):
                span = " ".join(next(iter(sorted(grams))))
                best[index] = Match(row_index, item.sample_id, "ngram", span, len(grams) / item.ngram_count)

        if "near_dup" in self.layers:
            near_tokens = self._near_tokens(per_string)
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
                        best[index] = Match(
                            row_index, item.sample_id, "near_dup", " ".join(near_tokens), round(jaccard, 4)
                        )
        if self._keys:
            for position in self._salient(texts, per_string, tokens):
                found = self._keys[position]
                if found.index not in best:
                    best[found.index] = Match(row_index, self._items[found.index].sample_id, "salient", found.span, 1.0)
        return sorted(best.values(), key=lambda m: (_RANK[m.kind], m.sample_id))

    def scan(self, rows: Iterable[Any]) -> list[Match]:
        """All matches of all rows, in row order."""
        matches: list[Match] = []
        for row_index, row in enumerate(rows):
            matches.extend(self.scan_row(row, row_index))
        return matches
