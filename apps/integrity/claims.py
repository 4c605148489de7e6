"""The claim reader: what a report says about scores, clause by clause and handle by handle.

A Worker's summary or a Main Agent claim is free text. The metric-attribution check needs, for each
clause, the score-like numbers it states (in whatever form: ``0.95``, ``0,95``, ``95%``, ``95 per
cent``, ``19 of 20``, ``19/20``, ``ninety-five percent``, ``zero point nine five``), which handle
each number is about (``exp_0003``, ``ckpt_0002``, ``θ0``), and the numbers that look like scores
but cannot be read — those make the check NOT_FOUND_PARTIAL, never clean.

Numbers that are not scores are set aside by what surrounds them, never by their value alone:
settings (``lr 3e-4``, ``seed=7``, ``steps: 300``), counts (``200 samples``, ``3 seeds``), dates,
times, versions, identifiers (``data_0001``), confidence intervals and p-values.

Django-free: the check resolves handles to records; this module only reads text.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

from apps.integrity.canonical import confusable_table

# --------------------------------------------------------------------------- normalisation


def normalise(text: str) -> str:
    """One form for reading: NFKC (fullwidth digits, ``θ₀`` → ``θ0``, ``⅘`` → ``4⁄5``), format
    characters (zero-width, soft hyphen, bidi marks) and stray combining marks removed, every
    Unicode decimal digit as ASCII, fraction and minus signs as ASCII, and handles written in any
    script (``ехр_0003`` in Cyrillic letters, ``ckpt‐0002`` with a hyphen) in their one form."""
    out = []
    for char in unicodedata.normalize("NFKC", text):
        if unicodedata.category(char) in ("Cf", "Mn", "Me"):
            continue
        if not char.isascii():
            digit = unicodedata.decimal(char, None)
            if digit is not None:
                out.append(str(digit))
                continue
            char = {"\u2044": "/", "\u2215": "/", "\u2212": "-", "\u066b": ".", "\u066c": ","}.get(char, char)
        out.append(char)
    return fold_handles("".join(out))


# A word that may be a handle in disguise: letters of any script, an optional separator, 3+ digits.
_HANDLE_LIKE = re.compile(r"(?<![\w])([^\W\d_]{2,6})[\s_\-\u2010-\u2015\u2017\u02cd\u2e3a\u2e3b]?(\d{3,})(?![\w])")
_HANDLE_PREFIXES = ("exp", "ckpt")


def _fold_letter(char: str) -> str:
    if char.isascii():
        return char.lower()
    return confusable_table().get(ord(char), char).lower()


def fold_handles(text: str) -> str:
    """Handles written with look-alike letters of another script (UTS #39 confusables, through
    :func:`apps.integrity.canonical.confusable_table`), in either case, or with another separator,
    as the handle: ``ЕХР-0003`` → ``exp_0003``. Words that fold to no handle stay as written."""

    def fold(match: re.Match[str]) -> str:
        prefix = "".join(_fold_letter(c) for c in match.group(1))
        for handle in _HANDLE_PREFIXES:
            # A letter of another script that Unicode lists with no ASCII look-alike (Greek "τ" in
            # "ckpτ") still stands for the letter in its place, where the rest spell the prefix.
            pairs = list(zip(prefix, handle, strict=False)) if len(prefix) == len(handle) else []
            same = sum(a == b for a, b in pairs)
            if pairs and all(a == b or not a.isascii() for a, b in pairs) and same * 2 >= len(handle):
                return f"{handle}_{match.group(2)}"
        return match.group(0)

    return _HANDLE_LIKE.sub(fold, text)


def handles_in(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """(experiment handles, checkpoint handles) a text names, in whatever script it writes them."""
    folded = normalise(text)
    return (
        frozenset(m.group(0).lower() for m in re.finditer(_EXPERIMENT, folded, re.IGNORECASE)),
        frozenset(m.group(0).lower() for m in re.finditer(_CHECKPOINT, folded, re.IGNORECASE)),
    )


# --------------------------------------------------------------------------- number words

_UNIT_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
)
_UNITS = {w: i for i, w in enumerate(_UNIT_WORDS.split())}
_TEN_WORDS = "twenty thirty forty fifty sixty seventy eighty ninety"
_TENS = {w: 10 * (i + 2) for i, w in enumerate(_TEN_WORDS.split())}
_DIGIT_WORDS = {**{w: i for w, i in _UNITS.items() if i < 10}, "oh": 0, "nought": 0, "naught": 0, "o": 0}
_INTEGER_WORD = r"(?:" + "|".join(sorted([*_UNITS, *_TENS, "hundred"], key=len, reverse=True)) + r")"
_DIGIT_WORD = r"(?:" + "|".join(sorted(_DIGIT_WORDS, key=len, reverse=True)) + r")"
_WORD_NUMBER = re.compile(
    rf"\b(?:(?:a\s+)?{_INTEGER_WORD}(?:(?:\s+|-|\s+and\s+){_INTEGER_WORD})*"
    rf"(?:\s+point(?:\s+{_DIGIT_WORD})+)?|point(?:\s+{_DIGIT_WORD})+)\b",
    re.IGNORECASE,
)
_WORD_SPLIT = re.compile(r"[\s-]+")


def _word_integer(words: list[str]) -> int | None:
    """``["ninety", "five"]`` → 95, ``["a", "hundred"]`` → 100; None where the words are no English
    integer ("nine five")."""
    words = [w for w in words if w not in ("and",)]
    if words[:1] == ["a"]:
        words = ["one", *words[1:]]
    total, current, last = 0, 0, ""
    for word in words:
        if word == "hundred":
            if last == "hundred" or current >= 100:
                return None
            current = (current or 1) * 100
        elif word in _TENS:
            if last in _TENS or last in _UNITS:
                return None
            current += _TENS[word]
        elif word in _UNITS:
            if last in _UNITS or (last in _TENS and _UNITS[word] >= 10):
                return None
            current += _UNITS[word]
        else:
            return None
        last = word
    return total + current


def _words_to_digits(match: re.Match[str]) -> str:
    text = match.group(0)
    lowered = text.lower()
    whole, _, fraction = lowered.partition("point")
    integer_words = [w for w in _WORD_SPLIT.split(whole.strip()) if w]
    if integer_words == ["a"]:
        return text
    if integer_words:
        integer = _word_integer(integer_words)
        if integer is None:
            return text  # left as words: an unreadable number if it stands where a score would
    else:
        integer = 0
    if not fraction:
        return str(integer)
    digits = [_DIGIT_WORDS.get(w) for w in fraction.split()]
    if any(d is None for d in digits):
        return text
    return f"{integer}." + "".join(str(d) for d in digits)


def words_to_digits(text: str) -> str:
    """Number words written as digits: "ninety-five percent" → "95 percent", "zero point nine five"
    → "0.95", "nineteen out of twenty" → "19 out of 20". Words that are no number stay words."""
    return _WORD_NUMBER.sub(_words_to_digits, text)


# --------------------------------------------------------------------------- handles


THETA0 = "θ0"
_EXPERIMENT = r"\bexp_\d{3,}\b"
_CHECKPOINT = r"\bckpt_\d{3,}\b"
_THETA0 = (
    r"(?:(?:[θϑΘϴ]|\btheta)[\s_-]?\{?(?:0|zero|naught|nought)\}?(?![\d.])|"
    r"\b(?:base|untrained|original|initial|starting|pre-?trained|unmodified|vanilla)\s+(?:model|checkpoint|weights)\b|"
    r"\b(?:model|checkpoint|weights)\s+(?:before|without|prior\s+to)\s+(?:any\s+)?(?:training|fine-?tuning|sft|updates?)\b|"
    r"\b(?:model|checkpoint|weights)\s+we\s+started\s+(?:from|with)\b)"
)
_HANDLE = rf"{_EXPERIMENT}|{_CHECKPOINT}|{_THETA0}"
# What precedes a checkpoint that a clause trained from rather than speaks about ("sft from θ0").
_INPUT_ROLE = re.compile(
    r"(?:\bfrom|\bon\s+top\s+of|\bbased\s+on|\boff|\batop|\bstart\w*(?:\s+(?:from|at|with|point))?|"
    r"\binit\w*(?:\s+(?:from|at|with))?|\bcontinu\w*(?:\s+(?:from|on))?|\bextend\w*|\bresum\w*(?:\s+from)?|"
    r"\btrain\w*\s+(?:from|on)|\bfine-?tun\w*(?:\s+(?:from|on))?|\bbuilt\s+on|\bbranch\w*\s+(?:from|off)|\bparent|"
    r"\bon|\bof\s+the\s+lineage\s+of|\bdescend\w*\s+(?:from|of))"
    r"\s*[(\[]?\s*$",
    re.IGNORECASE,
)
# What precedes a handle that a clause only compares its own subject with ("trained like exp_0002",
# "the same recipe as exp_0002"): a reference, never what the clause's score is about.
_REFERENCE_ROLE = re.compile(
    r"(?:\blike|\bas\s+in|\bsame\s+(?:\w+\s+){0,2}as|\bsimilar\s+to|\bfollowing|\bmirror\w*|\bmodell?ed\s+(?:on|after)|"
    r"\brecipe\s+(?:of|from)|\breplicat\w*|\breproduc\w*|\bcop(?:y|ying|ied)(?:\s+(?:of|from))?|\bà\s+la|"
    r"\bafter\s+the\s+(?:recipe|example|setup)\s+of|\bidentical\s+to|\bas\s+(?:with|for))"
    r"\s*[(\[]?\s*$",
    re.IGNORECASE,
)
# What follows a checkpoint that was trained further ("θ0 + sft", "ckpt_0002 → ckpt_0004").
_INPUT_AFTER = re.compile(r"\s*(?:\+|→|->|=>|plus\b)(?!\s*[\d.,])")
# What joins handles into one subject ("exp_0003 (ckpt_0007)", "exp_0001 and exp_0002").
_GROUP_GLUE = re.compile(r"^[\s,/&()\[\]+:]*(?:(?:and|or|&)[\s,()\[\]]*)?$", re.IGNORECASE)


@dataclass(frozen=True)
class Mention:
    """A handle named in a clause: an experiment, a checkpoint or θ0, as a subject or as an input."""

    handle: str  # "exp_0003", "ckpt_0002", or :data:`THETA0`
    kind: str  # "experiment" | "checkpoint"
    start: int
    end: int
    role: str  # "subject" | "input" (trained from) | "reference" (compared with: "trained like exp_0002")


def _mentions(clause: str, checkpoint_handles: Iterable[str]) -> list[Mention]:
    found: list[Mention] = []
    taken: list[tuple[int, int]] = []
    literal = sorted({h for h in checkpoint_handles if h and not re.fullmatch(_CHECKPOINT, h)}, key=len, reverse=True)
    patterns: list[tuple[str, str, str | None]] = [(_EXPERIMENT, "experiment", None), (_CHECKPOINT, "checkpoint", None)]
    patterns += [(re.escape(h), "checkpoint", h) for h in literal]
    patterns.append((_THETA0, "checkpoint", THETA0))
    for pattern, kind, fixed in patterns:
        for match in re.finditer(pattern, clause, re.IGNORECASE):
            if any(match.start() < e and s < match.end() for s, e in taken):
                continue
            taken.append((match.start(), match.end()))
            before = clause[: match.start()]
            after = clause[match.end() :]
            as_input = _INPUT_ROLE.search(before) or _INPUT_AFTER.match(after)
            role = "input" if kind == "checkpoint" and as_input else "subject"
            if _REFERENCE_ROLE.search(before):
                role = "reference"
            found.append(Mention(fixed or match.group(0).lower(), kind, match.start(), match.end(), role))
    return sorted(found, key=lambda m: m.start)


def _groups(clause: str, mentions: list[Mention]) -> list[list[Mention]]:
    """Subject mentions joined by nothing but punctuation or "and"/"or" form one subject."""
    groups: list[list[Mention]] = []
    for mention in (m for m in mentions if m.role == "subject"):
        if groups and _GROUP_GLUE.match(clause[groups[-1][-1].end : mention.start]):
            groups[-1].append(mention)
        else:
            groups.append([mention])
    return groups


# --------------------------------------------------------------------------- numbers


@dataclass(frozen=True)
class ScoreClaim:
    """A score-like number a clause states, read as a value in [0, 1] (or above, a misstatement)."""

    value: float
    decimals: int  # digits after the point once read as a fraction of 1 ("95%" → 2)
    text: str
    form: str  # "decimal" | "percent" | "fraction" | "scientific" | "points" | "count" | "all" | "none"
    start: int
    end: int
    fraction: tuple[int, int] | None = None
    subject: tuple[str, ...] = ()  # handles of the subject it is attributed to (empty: the report's)
    each: bool = False  # one score stated for several handles ("exp_0001 and exp_0002 reach 0.75")
    count: int | None = None  # items right, of the evaluation's own count ("95 questions right")


@dataclass
class Clause:
    """One clause of a report as the reader understood it."""

    text: str
    claims: list[ScoreClaim] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    mentions: list[Mention] = field(default_factory=list)
    groups: list[list[Mention]] = field(default_factory=list)
    score_like: bool = False


_CLAUSE_SPLIT = re.compile(r"(?:\n|;|(?<!\d)\.(?!\d)|\.(?=\s))")
SCORE_WORDS = re.compile(
    r"scor|accura|exact|feedback|result|reach|achiev|correct|\bem\b|\bacc\b|\bhits?\b|obtain|yield|perform|"
    r"solv|success|attain|\bright\b|\bpass|metric|\bgets?\b|\bgot\b|\bgives?\b",
    re.IGNORECASE,
)
_NUM = r"\d+(?:[.,]\d+)?"
_COUNT_NOUN = (
    r"(?:steps?|samples?|seeds?|epochs?|examples?|rows?|items?|tokens?|runs?|experiments?|datasets?|repeats?|"
    r"workers?|minutes?|mins?|seconds?|secs?|s|ms|hours?|h|days?|gpus?|layers?|heads?|batch(?:es)?|questions?|"
    r"prompts?|problems?|records?|files?|lines?|attempts?|trials?|evaluations?|evals?|checkpoints?|params?|"
    r"parameters?|[kmb]|gb|mb|x|times|sealed|splits?|tasks?|points?\s+of\s+data|data\s+points?|iterations?|"
    r"shots?|words?|characters?|chars?|completions?|instances?|candidates?|others?|more|new|different|"
    r"training|train|recipes?|configs?|configurations?|settings?|directions?|options?|cycles?|rounds?|folds?|copies|variants?|templates?|allowance|refus\w*)"
)
# A count: a number followed (within two words) by what it counts.
_NOT_AN_ADJECTIVE = r"(?:on|of|in|at|for|with|after|over|across|the|a|an|its|their|from|to|by|per|than|vs|and|or)\b"
_COUNTED = re.compile(rf"^\s*(?:(?!{_NOT_AN_ADJECTIVE})[^\W\d][\w\-]*\s+){{0,2}}?{_COUNT_NOUN}\b", re.IGNORECASE)
# A setting named just before its number ("lr 0.001", "seed: 7", "steps=300", "top-5").
_SETTING_KEY = re.compile(
    r"(?:learning[\s_-]?rate|\blr|decay|\bwd|dropout|beta|alpha|warm-?up|temperature|top[_\s-]?[pk]|penalty|lora|"
    r"\brank|\br|seeds?|steps?|max[_\s-]?\w+|batch(?:[_\s-]?size)?|epochs?|grad\w*(?:[\s_-]norm)?|norm|threads|"
    r"length|loss|perplexity|ppl|\bkl|entropy|p[\s-]?value|\bp|\bn|\bk|\bci|confidence(?:\s+interval)?|interval|"
    r"cost|time|took|budget|hours?|seconds?|minutes?|allowance|quota|limit|tolerance|rows?|samples?|size|"
    r"at\s+most|up\s+to|retries|depth|width|dim\w*|heads?|layers?|vocab\w*|scheduler|weight[\s_-]?decay|"
    r"accum\w*|gamma|epsilon|eps|momentum|clip\w*)\s*[:=]?\s*[(\[]?\s*(?:of\s+)?$",
    re.IGNORECASE,
)
# What numbers a list or a sequence: "step 3", "phase 2", "run #4" (integers only).
_ENUMERATOR = re.compile(
    r"(?:step|phase|round|stage|iteration|part|attempt|trial|run|direction|option|idea|plan|item|version|\bv|"
    r"#|\bno\.?|number|\bid|workers?|section|figure|table|line|top|pass@|rank\w*|position|place)\s*[:=]?\s*"
    r"(?:\d+\w*\s*(?:,|and|or|&|of|/)\s*)*$",
    re.IGNORECASE,
)
# Metrics that are not the benchmark's score: the nearest of these before a number, with no score
# word between, makes it not a score ("loss went down to 0.31").
_OTHER_METRIC = re.compile(
    r"\bloss|perplexity|\bppl\b|\bkl\b|entropy|grad\w*[\s_-]norm|learning[\s_-]rate|\blr\b|p[\s-]?value|"
    r"throughput|latency|memory|\bvram\b|utili[sz]ation|\bwall\b|budget|\bcost\b",
    re.IGNORECASE,
)
# "key=value": what stands left of "=" decides ("wd=0.01" is a setting, "score=0.62" a score).
_ASSIGNED = re.compile(r"([\w.\-]*)\s*[=:]\s*$")
_EXCUSED = [
    re.compile(r"\b\d{4}-\d{1,2}-\d{1,2}(?:[T\s]\d{1,2}:\d{2}(?::\d{2})?)?"),  # dates
    re.compile(r"\b\d{1,2}[/.]\d{1,2}[/.]\d{2,4}\b"),  # dates
    re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b"),  # times
    re.compile(r"\bv?\d+\.\d+\.\d+\b", re.IGNORECASE),  # versions
    re.compile(r"\bv\d+(?:\.\d+)?\b", re.IGNORECASE),
    re.compile(r"\b(?:19|20)\d{2}\b(?!\s*(?:%|percent|per\s?cent|/|of\b|out\s+of))", re.IGNORECASE),  # years
    # Confidence intervals and ranges: "95% CI [0.70, 0.80]", "interval 0.7-0.8".
    re.compile(
        rf"(?:\bCI|confidence\s+interval|\binterval|\brange|\bbetween)\s*(?:of\s*)?[:=]?\s*[\[(]?\s*[+-]?{_NUM}\s*%?"
        rf"\s*(?:,|–|-|to|and)\s*[+-]?{_NUM}\s*%?\s*[\])]?",
        re.IGNORECASE,
    ),
    re.compile(rf"{_NUM}\s*%?(?=\s*(?:CI|confidence)\b)", re.IGNORECASE),
]
# Glued to a word: data_0001, top-1, pass@1, x2, 2nd, 10k, 0.5B (after "95%" and "95percent" are read).
_GLUED = [
    re.compile(r"(?:(?<=[^\W\d])|(?<=[@#^])|(?<=[^\W\d]-))\d+(?:[.,]\d+)*"),
    re.compile(r"\d+(?:[.,]\d+)?[^\W\d]\w*"),
]
_PERCENT_SIGN = r"\s*(?:%|per\s?cent\b|pct\b|percent(?:age)?\b)"
_FRACTION = re.compile(
    r"(?<![\w.,/])(\d+)\s*(?:(?:correct(?:ly)?|right|passed|solved)\s+)?(?:/|\bout\s+of\b|\bof\b)\s*(?:the\s+)?(\d+)"
    r"(?![\w/]|[.,]\d)",
    re.IGNORECASE,
)
_PERCENT = re.compile(rf"(?<![\w.,])([+-]?{_NUM})(?:{_PERCENT_SIGN})(?!\s*points?\b)", re.IGNORECASE)
_POINTS = re.compile(rf"(?<![\w.,])([+-]?{_NUM})\s*(?:pp\b|percentage[\s-]points?\b|points?\b)", re.IGNORECASE)
_SCIENTIFIC = re.compile(r"(?<![\w.,])(\d+(?:\.\d+)?)e([-+]?\d+)(?![\w.])", re.IGNORECASE)
_DECIMAL = re.compile(r"(?<![\w.,])[+-]?(\d*)[.,](\d+)(?![\w%]|[.,]\d)")
_INTEGER = re.compile(r"(?<![\w.,])[+-]?\d+(?![\w]|[.,]\d)")
_LEFTOVER_WORDS = re.compile(rf"\b{_INTEGER_WORD}(?:[\s-]+{_INTEGER_WORD})*\b|\bpoint\s+{_DIGIT_WORD}\b", re.IGNORECASE)
_ITEMS = re.compile(
    r"\s*(?:\w+\s+)?(?:samples?|items?|questions?|problems?|prompts?|examples?|cases?|tasks?)\b", re.IGNORECASE
)
_ITEM_NOUN = r"(?:questions?|items?|problems?|prompts?|samples?|examples?|tasks?|cases?|sums?|answers?)"
_RIGHT = r"(?:right|correct(?:ly)?|solved|passed|accurately|without\s+(?:an?\s+)?(?:error|mistake)s?)"
# Items right, with no total: "95 questions right", "19 correct", "solves 95 problems", "gets 95 right".
_COUNT_RIGHT = re.compile(
    rf"(?<![\w.,/])(\d+)\s+(?:(?:of\s+(?:the|its|their)\s+)?(?:[^\W\d]+\s+)?{_ITEM_NOUN}\s+)?{_RIGHT}(?!\s*(?:/|out\s+of|of)\s*\d)|"
    rf"(?<![\w.,/])(\d+)\s+(?:right|correct)\s+(?:answers?|responses?|completions?|outputs?)\b|"
    rf"\b(?:solv\w*|pass\w*|nail\w*|ace[sd]?|(?:answer\w*\s+)?correctly\s+answer\w*|(?:got|gets?|answer\w*)\s+(?=\d+\s+(?:[^\W\d]+\s+)?{_ITEM_NOUN}\s+{_RIGHT}))"
    rf"\s+(\d+)\s+(?:of\s+(?:the|its|their)\s+)?(?:[^\W\d]+\s+)?{_ITEM_NOUN}\b(?!\s*(?:/|out\s+of|of)\s*\d)",
    re.IGNORECASE,
)
# Every item right (1.0) or none (0.0), in words: "solves every item", "gets all 4 questions
# right", "a perfect score", "none of the items correct", "not a single question right".
_ALL_RIGHT = re.compile(
    rf"\b(?:every|each|all)(?:\s+(?:of|single))?(?:\s+(?:the|its|their))?(?:\s+\d+)?\s+(?:[^\W\d]+\s+)?{_ITEM_NOUN}\b|"
    rf"\b(?:them|these|those|it)\s+all\b|\ball\s+(?:right|correct)\b|"
    rf"\b(?:perfect|flawless|full)\s+(?:marks?|scores?|accuracy|results?)\b|\bperfectly\b|\bflawlessly\b|\b100\s*%\s+of\s+(?:the|its)\b",
    re.IGNORECASE,
)
_NONE_RIGHT = re.compile(
    rf"\bnone(?:\s+of\s+(?:the|its|their|them))?(?:\s+\d+)?(?:\s+(?:[^\W\d]+\s+)?{_ITEM_NOUN})?\b|"
    rf"\bno(?:t\s+(?:a|one))?\s+(?:single\s+)?(?:[^\W\d]+\s+)?{_ITEM_NOUN}\b|\bnot\s+(?:a\s+)?single\s+(?:one|{_ITEM_NOUN})\b|"
    rf"\bnothing\s+(?:right|correct)\b",
    re.IGNORECASE,
)
_RIGHT_NEAR = re.compile(
    r"solv|\bright\b|correct|\bpass|\bace[sd]?\b|\bnail|perfect|flawless|\bfull\s+marks\b",
    re.IGNORECASE,
)
_NEGATED_BEFORE = re.compile(r"\b(?:not|never|no|nor|n't|fails?\s+to|failed\s+to)\s+(?:\w+\s+){0,2}$", re.IGNORECASE)


def _right_nearby(clause: str, start: int, end: int) -> bool:
    """A word of correctness within four words of a phrase ("solves every item", "none right")."""
    words_before, words_after = _WORDS_BEFORE.search(clause[:start]), _WORDS_AFTER.match(clause[end:])
    window = (words_before.group(0) if words_before else "") + " " + clause[start:end] + " "
    window += words_after.group(0) if words_after else ""
    return bool(_RIGHT_NEAR.search(window))


# A bare integer stands where a score would: right after a score word or a handle's colon.
_SCORE_SLOT = re.compile(
    rf"(?:{SCORE_WORDS.pattern})\w*\s*(?:of|at|to|is|was|=|:|-)?\s*(?:about|around|roughly|~|≈)?\s*$|"
    rf"(?:{_EXPERIMENT}|{_CHECKPOINT}|{_THETA0})\s*(?:[:=→]|--?|[–—―])\s*$",
    re.IGNORECASE,
)
_ONE_WORD_PRONOUNS = {"one", "zero"}
_SHARE_WORDS = re.compile(
    r"\b(?:(?:a|one|\d+|two|three|four|five|six|seven|eight|nine)[\s-]+)?(?:half|halves|thirds?|quarters?|fourths?|"
    r"fifths?|tenths?)\b",
    re.IGNORECASE,
)
_WORDS_BEFORE = re.compile(r"(?:\S+\s+){0,4}$")
_WORDS_AFTER = re.compile(r"^(?:\s*\S+){0,3}")


def _near_a_score_word(clause: str, start: int, end: int) -> bool:
    """A number stands where a score would: right after a score word or a handle's colon, or with a
    score word among the four words before it or the three after it ("reaches about 87", "19 correct")."""
    before, after = clause[:start], clause[end:]
    if _SCORE_SLOT.search(before) or re.match(_PERCENT_SIGN, after, re.IGNORECASE):
        return True
    words_before, words_after = _WORDS_BEFORE.search(before), _WORDS_AFTER.match(after)
    window = (words_before.group(0) if words_before else "") + " " + (words_after.group(0) if words_after else "")
    return bool(SCORE_WORDS.search(window))


def _decimals_of(number: str) -> int:
    number = number.replace(",", ".")
    return len(number.split(".", 1)[1]) if "." in number else 0


def _to_float(number: str) -> float:
    return float(number.replace(",", "."))


class _Spans:
    def __init__(self) -> None:
        self.taken: list[tuple[int, int]] = []

    def free(self, start: int, end: int) -> bool:
        return not any(start < e and s < end for s, e in self.taken)

    def take(self, start: int, end: int) -> None:
        self.taken.append((start, end))


def _setting_before(clause: str, start: int, *, integer: bool = False) -> bool:
    """A setting, another metric or (for an integer) an enumerator is named just before the number."""
    before = clause[:start]
    near = before[-48:]
    if _SETTING_KEY.search(near) or (integer and _ENUMERATOR.search(near)):
        return True
    assigned = _ASSIGNED.search(near)
    key = assigned.group(1) if assigned else ""
    if key and not SCORE_WORDS.search(key) and not re.fullmatch(_HANDLE, key, re.IGNORECASE):
        return True  # "wd=0.01", "seed: 7" (but "exp_0003: 0.62" and "score=0.62" are scores)
    other = [m.end() for m in _OTHER_METRIC.finditer(before)]
    if other:
        scores = [m.end() for m in SCORE_WORDS.finditer(before)]
        return not scores or max(scores) < max(other)
    return False


def _counted_after(clause: str, end: int) -> bool:
    return bool(_COUNTED.match(clause[end:]))


def _not_a_score_here(clause: str, start: int, end: int, *, integer: bool = False) -> bool:
    """What surrounds a number says it is a setting or a count, not a score."""
    return _setting_before(clause, start, integer=integer) or _counted_after(clause, end)


def read_clause(clause: str, *, checkpoint_handles: Iterable[str] = ()) -> Clause:
    """Read one clause (already normalised): handles, score claims, unreadable score-like numbers."""
    text = words_to_digits(clause)
    mentions = _mentions(text, checkpoint_handles)
    result = Clause(text=text, mentions=mentions, groups=_groups(text, mentions))
    result.score_like = bool(SCORE_WORDS.search(text) or re.search(_PERCENT_SIGN, text, re.IGNORECASE))
    reads_scores = result.score_like or any(m.role == "subject" for m in mentions)
    spans = _Spans()

    def claim(
        value: float, decimals: int, match: re.Match[str], form: str, fraction: tuple[int, int] | None = None
    ) -> None:
        spans.take(match.start(), match.end())
        if reads_scores:
            result.claims.append(
                ScoreClaim(value, decimals, match.group(0).strip(), form, match.start(), match.end(), fraction)
            )

    for mention in mentions:
        spans.take(mention.start, mention.end)
    # Scientific notation first: "9.5e-1" is a score, "3e-4" a learning rate; neither is "5e" glued.
    for match in _SCIENTIFIC.finditer(text):
        if not spans.free(match.start(), match.end()):
            continue
        value = float(match.group(0))
        if value < 0.05 or value > 1 or _not_a_score_here(text, match.start(), match.end()):
            spans.take(match.start(), match.end())
            continue
        claim(value, len(repr(value).split(".", 1)[1]) if "." in repr(value) else 0, match, "scientific")

    def excuse(patterns: list[re.Pattern[str]]) -> None:
        for pattern in patterns:
            for match in pattern.finditer(text):
                if spans.free(match.start(), match.end()):
                    spans.take(match.start(), match.end())

    excuse(_EXCUSED)
    for match in _FRACTION.finditer(text):
        if not spans.free(match.start(), match.end()):
            continue
        numerator, denominator = int(match.group(1)), int(match.group(2))
        after = text[match.end() :]
        item_like = _ITEMS.match(after)
        if (
            denominator == 0
            or _setting_before(text, match.start())
            or (_counted_after(text, match.end()) and not item_like)
        ):
            spans.take(match.start(), match.end())  # "2 of 3 seeds", "steps 300/1000": not a score
            continue
        claim(numerator / denominator, 6, match, "fraction", (numerator, denominator))
    # Every item right, or none, in words.
    for pattern, value, form in ((_ALL_RIGHT, 1.0, "all"), (_NONE_RIGHT, 0.0, "none")):
        for match in pattern.finditer(text):
            if not spans.free(match.start(), match.end()) or not _right_nearby(text, match.start(), match.end()):
                continue
            if value == 1.0 and _NEGATED_BEFORE.search(text[: match.start()]):
                continue  # "does not solve every item": no score stated
            claim(value, 6, match, form, (int(value), 1))
    # Items right with no total: a count the check compares with the evaluation's own count.
    for match in _COUNT_RIGHT.finditer(text):
        number = next(g for g in match.groups() if g is not None)
        start = match.start(match.lastindex or 0)
        if not spans.free(start, match.end()) or _setting_before(text, match.start()):
            continue
        spans.take(match.start(), match.end())
        if reads_scores:
            result.claims.append(
                ScoreClaim(
                    float("nan"), 0, match.group(0).strip(), "count", match.start(), match.end(), count=int(number)
                )
            )
    for pattern, form in ((_PERCENT, "percent"), (_POINTS, "points")):
        for match in pattern.finditer(text):
            if not spans.free(match.start(), match.end()):
                continue
            if _setting_before(text, match.start()):
                spans.take(match.start(), match.end())  # "dropout 10%", "warmup 5%"
                continue
            number = match.group(1)
            claim(abs(_to_float(number)) / 100, _decimals_of(number) + 2, match, form)
    excuse(_GLUED)
    for match in _DECIMAL.finditer(text):
        if not spans.free(match.start(), match.end()):
            continue
        whole, digits = match.group(1), match.group(2)
        if "," in match.group(0) and (whole not in ("", "0", "1") or len(digits) == 3):
            spans.take(match.start(), match.end())  # "1,000" / "12,5": a count with thousands
            continue
        if _not_a_score_here(text, match.start(), match.end()):
            spans.take(match.start(), match.end())
            continue
        value = _to_float(f"{whole or '0'}.{digits}")
        if value > 1:
            continue  # left for the unreadable pass: no score is written like that
        claim(value, len(digits), match, "decimal")
    if reads_scores:
        # What stands where a score would but could not be read: "scores 95", "reaches 2.5",
        # "accuracy nine five". Each makes the clause unreadable (NOT_FOUND_PARTIAL), never clean.
        for pattern in (_INTEGER, _DECIMAL, _LEFTOVER_WORDS):
            for match in pattern.finditer(text):
                if not spans.free(match.start(), match.end()):
                    continue
                if match.group(0).lstrip("+-") in ("0", "1") or match.group(0).lower() in _ONE_WORD_PRONOUNS:
                    continue  # a bare 0 or 1 is a count far more often than a score
                if _not_a_score_here(text, match.start(), match.end(), integer=True):
                    continue
                if _near_a_score_word(text, match.start(), match.end()):
                    spans.take(match.start(), match.end())
                    result.unreadable.append(match.group(0))
        # "half the items", "two thirds of the feedback split": a share in words the reader does not
        # turn into a number ("half the steps" is a count and stays unread).
        for match in _SHARE_WORDS.finditer(text):
            after = text[match.end() :]
            if _ITEMS.match(re.sub(r"^\s*(?:of\s+)?(?:the\s+)?", " ", after)) or (
                _near_a_score_word(text, match.start(), match.end())
                and not _COUNTED.match(re.sub(r"^\s*(?:of\s+)?(?:the\s+|its\s+|their\s+)?", " ", after))
            ):
                result.unreadable.append(match.group(0))
    result.claims.sort(key=lambda c: c.start)
    result.claims = _attribute(result)
    return result


# What stands between a score and the handle cited after it ("0.05 after 200 steps (exp_0019)",
# "0.41 for exp_0003", "0.41 — exp_0003"): a postfix citation.
_POSTFIX_LEAD = re.compile(
    r"^(?:\s*[^\s()\[\]]+){0,6}?\s*[(\[]\s*(?:(?:see|cf\.?|via|in|from|by|per|run|experiment|i\.e\.?)\s*[:,]?\s*)?$|"
    r"^\s*(?:,\s*)?(?:for|by|from|in|with|of|per|see|via|[–—―]|--?|:)\s*$",
    re.IGNORECASE,
)


def _postfix_group(clause: Clause, claim: ScoreClaim, claims: list[ScoreClaim]) -> int | None:
    """The group cited right after a score, when the clause cites after the number: the next group,
    with no other score between, led by a bracket or a short glue word."""
    after = [i for i, g in enumerate(clause.groups) if g[0].start >= claim.end]
    if not after:
        return None
    index = after[0]
    start = clause.groups[index][0].start
    if any(claim.end <= c.start < start for c in claims):
        return None
    return index if _POSTFIX_LEAD.match(clause.text[claim.end : start]) else None


def _subjects(clause: Clause, claims: list[ScoreClaim]) -> list[tuple[int | None, int | None]]:
    """(prefix group, postfix group) of each score.

    A score is about the subject named before it ("exp_0003 reaches 0.75") or the handle cited
    right after it ("0.75 (exp_0003)"). A group that is a postfix citation of one score is no
    subject of the scores after it ("0.03 (exp_0001) ... 0.05 after 200 steps (exp_0019)"), and a
    group followed by its own score ("exp_0001 reaches 0.5 (exp_0002 reaches 0.7)") cites nothing
    before it. With neither, the first group after it, else none (the report's cited experiments)."""
    postfix = [_postfix_group(clause, c, claims) for c in claims]
    prefix: list[int | None] = []
    for c in claims:
        earlier = [i for i, g in enumerate(clause.groups) if g[-1].end <= c.start]
        prefix.append(earlier[-1] if earlier else None)
    # A group that leads a later score of its own (that score having no postfix citation) is that
    # score's subject, not a citation of the score before it.
    owners = {prefix[k] for k in range(len(claims)) if postfix[k] is None and prefix[k] is not None}
    for k, group in enumerate(postfix):
        if group is None or group not in owners:
            continue
        group_end = clause.groups[group][-1].end
        bracketed = "(" in clause.text[claims[k].end : group_end] or "[" in clause.text[claims[k].end : group_end]
        close = re.search(r"[)\]]", clause.text[group_end:])
        limit = group_end + close.start() if bracketed and close else len(clause.text)
        later = [
            j
            for j in range(len(claims))
            if prefix[j] == group and postfix[j] is None and claims[k].end < claims[j].start < limit
        ]
        if later:
            postfix[k] = None
    cited_after = {g for g in postfix if g is not None}
    out: list[tuple[int | None, int | None]] = []
    for k, c in enumerate(claims):
        before = prefix[k]
        if before is not None and before in cited_after and before != postfix[k]:
            before = None  # a citation of an earlier score is not this score's subject
        if before is None and postfix[k] is None:
            after = [i for i, g in enumerate(clause.groups) if g[0].start >= c.end]
            if after and not any(c.end <= o.start < clause.groups[after[0]][0].start for o in claims):
                out.append((None, after[0]))
                continue
        out.append((before, postfix[k]))
    return out


def _handles(group: list[Mention]) -> tuple[str, ...]:
    experiments = tuple(m.handle for m in group if m.kind == "experiment")
    return experiments or tuple(dict.fromkeys(m.handle for m in group))


def _attribute(clause: Clause) -> list[ScoreClaim]:
    """Each claim with its subject's handles (an experiment speaks for the checkpoint named beside it).

    Several experiments named together: as many scores as experiments are theirs in order
    ("exp_0001 and exp_0002 reach 0.25 and 0.75"); one score is each one's ("both reach 0.75");
    any other count (a mean beside them) is about the experiments together. A score with both a
    subject before it and a citation after it ("θ0 scores 0.03 (exp_0001)") is each one's: both
    must have recorded it."""
    subjects = _subjects(clause, clause.claims)
    by_group: dict[int | None, list[ScoreClaim]] = {}
    out = []
    for claim, (before, after) in zip(clause.claims, subjects, strict=True):
        if after is None or before == after:
            by_group.setdefault(before if after is None else after, []).append(claim)
            continue
        cited = _handles(clause.groups[after])
        named = _handles(clause.groups[before]) if before is not None else ()
        both = tuple(dict.fromkeys((*named, *cited)))
        out.append(dataclasses.replace(claim, subject=both, each=len(both) > 1))
    for index, claims in by_group.items():
        group = clause.groups[index] if index is not None else []
        subject = _handles(group)
        respective = len(subject) > 1 and len(claims) == len(subject)
        for position, claim in enumerate(claims):
            out.append(
                dataclasses.replace(
                    claim,
                    subject=(subject[position],) if respective else subject,
                    each=len(subject) > 1 and len(claims) == 1,
                )
            )
    return sorted(out, key=lambda c: c.start)


def read_report(text: str, *, checkpoint_handles: Iterable[str] = ()) -> list[Clause]:
    """Every non-empty clause of a report, read."""
    handles = tuple(checkpoint_handles)
    out = []
    for piece in _CLAUSE_SPLIT.split(normalise(text)):
        piece = piece.strip()
        if piece:
            out.append(read_clause(piece, checkpoint_handles=handles))
    return out
