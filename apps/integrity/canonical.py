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
5. Tokens: runs of letters, and numbers with their separators. Numbers are normalised: thousands
   separators ("1,234", "1_234", "1 234") dropped, leading zeros dropped, a zero fraction dropped
   ("12.0" is "12", "12.50" is "12.5"); digits glued to letters come apart ("12apples"); a token
   of digits mixed with the look-alike letters o/l/i ("l2", "1O5") is read as a number.
6. Number words become digits: "forty-two", "one hundred and five", "two thousand three hundred".

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
        elif (digit := unicodedata.decimal(char, None)) is not None:
            value = str(digit)
        elif category == "Zs" or char in "\u2028\u2029\x85":
            value = " "
        else:
            value = confusable_table().get(code, char)
        self[code] = value
        return value


_FOLD = _Fold()

# Numbers with separators first: "1,234,567", "1_234", "1 234" (a space-grouped number only when
# every group after the first has exactly three digits), then plain digits; optional fraction.
_NUMBER_GROUPED_SPACE = r"\d{1,3}(?:[,_]\d{3})+(?!\d)|\d{1,3}(?: \d{3})+(?![\d,_])|\d+(?:_\d+)+"
_NUMBER_GROUPED = r"\d{1,3}(?:[,_]\d{3})+(?!\d)|\d+(?:_\d+)+"
_FRACTION = r"(?:\.\d+)?"
_TOKEN_SPACES = re.compile(rf"(?:{_NUMBER_GROUPED_SPACE}|\d+){_FRACTION}|[^\W\d_]+|\d+")
_TOKEN_NO_SPACES = re.compile(rf"(?:{_NUMBER_GROUPED}|\d+){_FRACTION}|[^\W\d_]+|\d+")
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


def _number_words(raw: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    n = len(raw)
    while i < n:
        if raw[i] not in _NUMBER_WORDS:
            out.append(raw[i])
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
            if word in _SMALL and word != "zero":
                value, last = _SMALL[word], current % 100
                # "forty two" is one number; "five six", "twenty thirty", "ten three" are two.
                if last and not (last >= 20 and last % 10 == 0 and value < 10):
                    break
                current += value
            elif word == "hundred":
                if current % 1000 >= 100:
                    break
                current = (current or 1) * 100
            elif word in _SCALES:
                total += (current or 1) * _SCALES[word]
                current = 0
            elif not (word == "and" and raw[j - 1] in _SCALES and j + 1 < n and raw[j + 1] in _SMALL):
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
    pattern = _TOKEN_SPACES if group_spaces else _TOKEN_NO_SPACES
    raw = [canonical_number(t) if t[0].isdigit() else t for t in pattern.findall(folded)]
    return _number_words(raw)


def canonical_text(text: str) -> str:
    """The canonical tokens joined by single spaces."""
    return " ".join(canonical_tokens(text))
