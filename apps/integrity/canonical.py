"""One canonical form for every contamination comparison: what a reader sees, not how it is encoded.

Two texts that look the same to a reader (and, after tokenisation, teach a model nearly the same
thing) must compare equal, so an adversary cannot hide a sealed item behind an encoding trick. In
order, for each string:

1. Unicode NFKD: compatibility forms (fullwidth, mathematical alphanumerics, ligatures,
   superscripts, circled digits, exotic spaces) become their plain letters, accents come apart.
   (Look-alikes, step 3, are folded once before it too: it would turn some into other letters.)
2. Invisible characters go: format characters (category Cf: zero-width space/joiners, soft hyphen,
   bidi marks, word joiner, BOM, tag characters), the other default-ignorable code points (Hangul
   fillers, combining grapheme joiner) and nonspacing marks (Mn: accents, variation selectors,
   stacked "zalgo" marks).
3. Confusables fold to Latin: each non-ASCII character that Unicode's confusables data (UTS #39,
   as shipped by the pinned ``confusable-homoglyphs`` package) lists as a look-alike of one ASCII
   letter or digit becomes that character: Cyrillic "а", "е", "о", "р", "с", "і" and Greek "ο",
   "ρ", "α" read as Latin. The table is built once from the package data, never by hand.
4. Every Unicode decimal digit (``unicodedata.decimal``: Arabic-Indic, Devanagari, ...) becomes
   its ASCII digit; then case folding.
4b. Separators inside a number go (:func:`join_digit_runs`, step 0, on the raw text): between two
   digits of any script, a run of characters that are not ASCII and that Unicode classes as a
   space separator (Zs: thin, narrow no-break, figure, ideographic spaces...), a format character
   (Cf), a modifier letter or symbol (Lm, Sk: tatweel, modifier primes), a mark (Mn, Me), other
   punctuation (Po: middle dot, hyphenation point, bullet, Arabic thousands separator) or other
   symbol (So: braille blank), mixed with ASCII spaces or not, is removed: "4\u20095" and "4 · 5"
   read as 45. Kept: ASCII characters alone (an ASCII space between numbers is a separate number,
   except single digits below), line and paragraph separators, dashes (Pd: "5–9" is a range),
   maths and currency symbols, brackets, and characters whose compatibility form is ASCII
   punctuation (a fullwidth comma is a comma); a decimal separator by its Unicode name is a point.
   Single digits separated by single ASCII spaces ("5 9", "1 2 3") are one number, as a digit-by-
   digit spelling is: a number of one digit next to another by one space is, in running text, a
   number spelled out, while honest separate numbers have a word, a comma or a line between them
   (``group_spaces=False`` keeps them apart, for a caller that tries both readings).
5. Tokens: runs of letters, and numbers with their separators. Numbers are normalised: thousands
   separators ("1,234", "1_234", "1 234") dropped, leading zeros dropped, a zero fraction dropped
   ("12.0" is "12", "12.50" is "12.5"), but a clock's minutes keep theirs ("3:05" is not "3:5",
   though "03:05" is "3:05"); digits glued to letters come apart ("12apples"); a token
   of digits mixed with the look-alike letters o/l/i ("l2", "1O5") is read as a number.
6. Number words become digits: "forty-two", "one hundred and five", "two thousand three hundred",
   mixed with digits ("fifty 9", "fifty-9", "5 hundred and 9", "2 thousand"): a round tens word
   takes a following single digit, a number below 1000 takes a following scale word;
   and digit words glued together ("sixzero", as a zero-width joiner between "six" and "zero"
   leaves them) read digit by digit.

The result is a list of tokens (punctuation and whitespace are gone, so whitespace is folded by
construction). The same function runs on the sealed side and on the training-row side: any odd
reading (a pronoun "one" read as 1) happens on both and cancels out.
"""

from __future__ import annotations

import json
import re
import unicodedata
from functools import cache
from importlib import resources

__all__ = ["canonical_number", "canonical_text", "canonical_tokens", "confusable_table", "is_number"]

# Default-ignorable code points that are not Cf or Mn (DerivedCoreProperties.txt): Hangul fillers.
_IGNORABLE_EXTRA = frozenset({0x115F, 0x1160, 0x3164, 0xFFA0})


def _ascii_lookalikes(data: dict[str, list[dict[str, str]]], char: str) -> set[str]:
    found: set[str] = set()
    for entry in data.get(char, ()):
        glyph = unicodedata.normalize("NFKC", entry["c"])
        if len(glyph) == 1 and glyph.isascii() and glyph.isalnum():
            found.add(glyph)
    return found


@cache
def confusable_table() -> dict[int, str]:
    """Non-ASCII code point -> the ASCII letter or digit Unicode lists it as confusable with.

    A character's own look-alike wins, then its lower case's, then its upper case's ("к" has none,
    "К" has "K"). UTS #39 gives everything that looks like a capital I the prototype "l" (I, l
    and 1 share it), so an upper-case letter listed with "l" reads as "i". Letters win over digits
    where both are listed ("º").
    """
    source = resources.files("confusable_homoglyphs").joinpath("confusables.json")
    data: dict[str, list[dict[str, str]]] = json.loads(source.read_text(encoding="utf-8"))
    table: dict[int, str] = {}
    for char in data:
        if len(char) != 1 or char.isascii():
            continue
        digit = unicodedata.decimal(char, None)
        if digit is not None:
            table[ord(char)] = str(digit)  # a digit is its value: Bengali "৪" is 4, though it looks like 8
            continue
        plain = unicodedata.normalize("NFKC", char)
        if len(plain) == 1 and plain.isascii() and plain.isalnum():
            table[ord(char)] = plain.lower()  # "𝟏" is "1" (though it looks like "l" too)
            continue
        for form in (char, char.lower(), char.upper()):
            options = _ascii_lookalikes(data, form) if len(form) == 1 else set()
            if options:
                glyph = sorted(options, key=lambda c: (c.isdigit(), c))[0]
                table[ord(char)] = "i" if glyph == "l" and char.isupper() else glyph.lower()
                break
    return table


class _Fold(dict[int, str | None]):
    """``str.translate`` table for non-ASCII characters, filled lazily per code point."""

    def __missing__(self, code: int) -> str | None:
        char = chr(code)
        category = unicodedata.category(char)
        value: str | None
        if category in ("Cf", "Mn", "Me") or code in _IGNORABLE_EXTRA:
            value = None
        elif (digit := unicodedata.decimal(char, unicodedata.digit(char, None))) is not None:
            value = str(digit)
        elif category == "Zs":
            value = " "
        elif char in _LINE_BREAKS:
            value = "\n"
        else:
            value = confusable_table().get(code, char)
        self[code] = value
        return value


_FOLD = _Fold()

# Categories of a non-ASCII character that, between two digits, is a separator or an invisible
# mark rather than content (see the module docstring, step 4b).
_SEPARATOR_CATEGORIES = frozenset({"Zs", "Cf", "Lm", "Sk", "Mn", "Me", "Po", "So", "Cc", "Co", "Cn"})
_LINE_BREAKS = frozenset("\x85\u2028\u2029")


def _is_digit(char: str) -> bool:
    return char.isdigit() if char.isascii() else unicodedata.digit(char, None) is not None


@cache
def _separator_kind(char: str) -> str:
    """ "sep" (drop between digits), "point" (a decimal separator), "space" (ASCII) or "" (content)."""
    if char == " ":
        return "space"
    if char.isascii() or char in _LINE_BREAKS:
        return ""
    if "DECIMAL SEPARATOR" in unicodedata.name(char, ""):
        return "point"
    if unicodedata.category(char) not in _SEPARATOR_CATEGORIES:
        return ""
    plain = unicodedata.normalize("NFKC", char)
    if plain.isascii() and plain.strip():
        return ""  # a compatibility form of ASCII punctuation ("，" is ","): the tokenizer reads it
    return "sep"


def join_digit_runs(text: str) -> str:
    """Remove separators between two digits (step 4b of the module docstring); ASCII text is unchanged."""
    if text.isascii():
        return text
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        out.append(char)
        i += 1
        if not _is_digit(char):
            continue
        j, kinds = i, set()
        while j < n and (kind := _separator_kind(text[j])):
            kinds.add(kind)
            j += 1
        if j > i and j < n and _is_digit(text[j]) and kinds - {"space"}:
            if "point" in kinds:
                if kinds == {"point"} and j == i + 1:
                    out.append(".")
                else:
                    continue
            i = j
    return "".join(out)


# Single digits separated by single spaces: "5 9" is 59 (step 4b).
_SPELLED_DIGITS = re.compile(r"(?<![\w/-])(?<!\d[.,:])\d(?: \d)+(?![\w/-]|[.,:]\d)")

# Numbers with separators first: "1,234,567", "1_234", "1 234" (a space-grouped number only when
# every group after the first has exactly three digits), then plain digits; optional fraction.
_NUMBER_GROUPED_SPACE = r"\d{1,3}(?:[,_]\d{3})+(?!\d)|\d{1,3}(?: \d{3})+(?![\d,_])|\d+(?:_\d+)+"
_NUMBER_GROUPED = r"\d{1,3}(?:[,_]\d{3})+(?!\d)|\d+(?:_\d+)+"
_FRACTION = r"(?:\.\d+)?"
# Two digits after a colon are minutes (or seconds) and keep their zero: "3:05" is not "3:5".
_CLOCK = r"(?<=\d:)\d\d(?!\d|[.,_]\d)"
_TOKEN_SPACES = re.compile(rf"(?P<clock>{_CLOCK})|(?:{_NUMBER_GROUPED_SPACE}|\d+){_FRACTION}|[^\W\d_]+|\d+")
_TOKEN_NO_SPACES = re.compile(rf"(?P<clock>{_CLOCK})|(?:{_NUMBER_GROUPED}|\d+){_FRACTION}|[^\W\d_]+|\d+")
# A run of digits and the digit look-alikes o, l, i, with at least one of each: "l2", "1O5", "2o".
_LOOKALIKE_NUMBER = re.compile(r"(?<![^\W_])(?=[oli]*\d)(?=\d*[oli])[\doli]+(?![^\W_])")
_LOOKALIKE_DIGITS = str.maketrans("oli", "011")

_UNIT_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
)
_TEN_WORDS = "twenty thirty forty fifty sixty seventy eighty ninety"
_UNITS = {w: i for i, w in enumerate(_UNIT_WORDS.split(" "))}
_TENS = {w: 10 * i for i, w in enumerate(_TEN_WORDS.split(" "), start=2)}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_SMALL = {**_UNITS, **_TENS}
_NUMBER_WORDS = {**_SMALL, **_SCALES}
# Digit words glued into one word, as an invisible character between them leaves them: "sixzero" is 60.
_GLUED_DIGITS = re.compile("(?:" + "|".join(_UNIT_WORDS.split(" ")[:10]) + "){2,}")
_DIGIT_WORDS = {w: str(i) for i, w in enumerate(_UNIT_WORDS.split(" ")[:10])}
_DIGIT_WORD = re.compile("|".join(_UNIT_WORDS.split(" ")[:10]))


def canonical_number(token: str) -> str:
    """ "1,234" -> "1234", "007" -> "7", "12.0" -> "12", "12.50" -> "12.5" (digits and separators only)."""
    whole, _, fraction = token.replace(",", "").replace("_", "").replace(" ", "").partition(".")
    whole = whole.lstrip("0") or "0"
    fraction = fraction.rstrip("0")
    return f"{whole}.{fraction}" if fraction else whole


def is_number(token: str) -> bool:
    """A canonical number token ("12", "12.5")."""
    return token[:1].isdigit()


def _fold_text(text: str) -> str:
    text = join_digit_runs(text)
    if text.isascii():
        return text.lower()
    # Look-alikes first: compatibility decomposition would turn some into other letters (the
    # lunate sigma "ϲ", which looks like "c", decomposes to the final sigma "ς").
    folded = text.translate(confusable_table())
    folded = unicodedata.normalize("NFKD", folded).translate(_FOLD).casefold()
    if not folded.isascii():
        # Case folding can produce characters the first pass did not see ("ẞ" -> "ss" is ASCII,
        # but a capital's lower case may be a listed look-alike).
        folded = folded.translate(_FOLD)
    return folded


def _small_integer(token: str) -> int | None:
    """A digit token below 1000 ("9", "250"), which number words around it may extend."""
    return int(token) if token.isdigit() and len(token) <= 3 else None


def _number_words(raw: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    n = len(raw)
    while i < n:
        leading = _small_integer(raw[i])
        if leading is not None and not (i + 1 < n and raw[i + 1] in _SCALES):
            leading = None  # a digit token starts a number only before a scale word: "5 hundred"
        if raw[i] not in _NUMBER_WORDS and leading is None:
            word = raw[i]
            if len(word) >= 6 and _GLUED_DIGITS.fullmatch(word):
                word = canonical_number("".join(_DIGIT_WORDS[d] for d in _DIGIT_WORD.findall(word)))
            out.append(word)
            i += 1
            continue
        if raw[i] == "zero":
            out.append("0")
            i += 1
            continue
        total = current = 0
        j = i
        while j < n:
            word = raw[j]
            digit = _small_integer(word)
            if word in _SMALL and word != "zero":
                value, last = _SMALL[word], current % 100
                # "forty two" is one number; "five six", "twenty thirty", "ten three" are two.
                if last and not (last >= 20 and last % 10 == 0 and value < 10):
                    break
                current += value
            elif digit is not None and j == i:
                current = digit  # "5 hundred", "250 thousand"
            elif digit is not None and current == 0 and total and raw[j - 1] in _SCALES:
                current = digit  # "1 thousand 5 hundred"
            elif digit is not None and 0 < digit < 10 and current % 100 >= 20 and current % 10 == 0:
                current += digit  # "fifty 9", "fifty-9": a round tens word takes one digit
            elif digit is not None and 0 < digit < 100 and current and current % 100 == 0 and raw[j - 1] == "and":
                current += digit  # "five hundred and 9"
            elif word == "hundred":
                if current % 1000 >= 100:
                    break
                current = (current or 1) * 100
            elif word in _SCALES:
                total += (current or 1) * _SCALES[word]
                current = 0
            elif not (
                word == "and"
                and raw[j - 1] in _SCALES
                and j + 1 < n
                and (raw[j + 1] in _SMALL or (_small_integer(raw[j + 1]) or 0) in range(1, 100))
            ):
                break  # "one hundred and five" keeps its "and"; other words end the number
            j += 1
        out.append(str(total + current))
        i = j
    return out


def canonical_tokens(text: str, *, group_spaces: bool = True) -> list[str]:
    """The canonical tokens of ``text`` (see the module docstring).

    ``group_spaces=False`` reads "67 112" as two numbers rather than 67112; a caller that must not
    miss either reading (the salient-content layer) tries both.
    """
    folded = _fold_text(text)
    if "o" in folded or "l" in folded or "i" in folded:
        folded = _LOOKALIKE_NUMBER.sub(lambda m: m.group(0).translate(_LOOKALIKE_DIGITS), folded)
    if group_spaces:
        folded = _SPELLED_DIGITS.sub(lambda m: m.group(0).replace(" ", ""), folded)
    pattern = _TOKEN_SPACES if group_spaces else _TOKEN_NO_SPACES
    raw = [
        t if not t[0].isdigit() or m.lastgroup == "clock" else canonical_number(t)
        for m in pattern.finditer(folded)
        for t in (m.group(0),)
    ]
    return _number_words(raw)


def canonical_text(text: str) -> str:
    """The canonical tokens joined by single spaces."""
    return " ".join(canonical_tokens(text))
