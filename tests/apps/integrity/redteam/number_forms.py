"""Generated number disguises (issue 33, class 2), written from Unicode's data as an adversary reads it.

Nothing here imports the canonicaliser. Each class rewrites a number so that a reader still sees it
(or reads it aloud) as the same number, drawing from ``random.Random``:

- ``separator``  a run of one to three invisible or spacing characters inside the number, drawn
                 from every code point Unicode classes as a space separator (Zs), format character
                 (Cf) or modifier letter (Lm), plus the dots and blanks people put between digits
                 (middle dot, hyphenation point, katakana middle dot, braille blank);
- ``script``     each digit from a decimal digit script of its own (all of Unicode's Nd digits);
- ``words``      spoken forms mixed with digits: "fifty 9", "fifty-9", "5 9" (digit by digit),
                 "1 hundred and 5";
- ``mixed``      the three composed: a script's digits with separators, or words with such digits.
"""

from __future__ import annotations

import random
import sys
import unicodedata
from collections.abc import Callable
from functools import cache

CLASSES = ("separator", "script", "words", "mixed")
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_PUNCTUATION_BETWEEN_DIGITS = (
    "\u00b7\u2027\u30fb\u2800\u2022"  # middle dot, hyphenation point, ・, braille blank, bullet
)


@cache
def separators() -> tuple[str, ...]:
    """Every Zs, Cf and Lm code point that no compatibility form turns into ASCII content, and the dots."""
    found = []
    for code in range(0x80, sys.maxunicode + 1):
        char = chr(code)
        if unicodedata.category(char) not in ("Zs", "Cf", "Lm"):
            continue
        plain = unicodedata.normalize("NFKC", char)
        if plain.isascii() and plain.strip():
            continue  # "ʰ" is an h to a reader: not a disguise of a number
        found.append(char)
    return tuple(found) + tuple(_PUNCTUATION_BETWEEN_DIGITS)


@cache
def digit_scripts() -> tuple[str, ...]:
    """The ten digits of every decimal digit script, zero to nine, as one string each (ASCII left out)."""
    scripts = []
    for code in range(0x80, sys.maxunicode + 1):
        char = chr(code)
        if unicodedata.category(char) == "Nd" and unicodedata.decimal(char) == 0:
            run = "".join(chr(code + k) for k in range(10))
            if all(unicodedata.decimal(c, None) == k for k, c in enumerate(run)):
                scripts.append(run)
    return tuple(scripts)


def separated(number: int, rng: random.Random, digits: str = "0123456789") -> str:
    text = "".join(digits[int(d)] for d in str(number))
    if len(text) < 2:
        return text
    at = rng.randrange(1, len(text))
    run = "".join(rng.choice(separators()) for _ in range(rng.randint(1, 3)))
    return text[:at] + run + text[at:]


def in_script(number: int, rng: random.Random) -> str:
    return "".join(rng.choice(digit_scripts())[int(d)] for d in str(number))


def in_words(number: int, rng: random.Random, digit: Callable[[int], str] = str) -> str:
    """A spoken form mixing words and digits; ``digit`` writes each digit that stays a digit."""
    if number >= 100:
        hundreds, rest = divmod(number, 100)
        head = f"{digit(hundreds)} hundred"
        return head if not rest else f"{head} and {in_words(rest, rng, digit)}"
    tens, ones = divmod(number, 10)
    forms = [" ".join(digit(int(d)) for d in str(number))] if number >= 10 else [digit(number)]
    if tens >= 2 and ones:
        forms += [f"{_TENS[tens]} {digit(ones)}", f"{_TENS[tens]}-{digit(ones)}"]
    return rng.choice(forms)


def mixed(number: int, rng: random.Random) -> str:
    script = rng.choice(digit_scripts())
    if rng.random() < 0.5:
        return separated(number, rng, script)
    return in_words(number, rng, lambda d: script[d])


FORMS: dict[str, Callable[[int, random.Random], str]] = {
    "separator": separated,
    "script": in_script,
    "words": in_words,
    "mixed": mixed,
}


def disguise(number: int, cls: str, rng: random.Random) -> str:
    return FORMS[cls](number, rng)
