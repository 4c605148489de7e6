"""The canonicaliser: each transformation on its own, then generated variants of real sealed prompts.

The variants are made here, with this file's own look-alike letters, invisible characters and
number spellings (not the canonicaliser's tables), and must all give the original's tokens.
"""

from __future__ import annotations

import random
import unicodedata

import pytest

from apps.integrity.canonical import canonical_number, canonical_text, canonical_tokens, confusable_table
from apps.integrity.contamination import normalize_tokens
from tests.apps.benchmarks.minibench_fixture import FEEDBACK, FINAL

# --------------------------------------------------------------------------- one transformation each


def test_nfkc_compatibility_forms_read_as_plain_letters_and_digits():
    assert canonical_tokens("Ｔｏｍ ｈａｓ １２ ａｐｐｌｅｓ") == ["tom", "has", "12", "apples"]  # fullwidth
    assert canonical_tokens("𝐓𝐨𝐦 𝐡𝐚𝐬 𝟏𝟐 𝒂𝒑𝒑𝒍𝒆𝒔") == ["tom", "has", "12", "apples"]  # mathematical
    assert canonical_tokens("ﬁle ① and ²") == ["file", "1", "and", "2"]  # ligature, circled, superscript digits
    assert canonical_tokens("ﬁle ① ²") == ["file", "12"]  # single digits one space apart: one number


@pytest.mark.parametrize(
    "mark",
    ["\u200b", "\u200c", "\u200d", "\u2060", "\u00ad", "\ufeff", "\u200e", "\u200f", "\u202e", "\u2066", "\u180e"],
)
def test_format_characters_vanish_inside_words_and_numbers(mark):
    assert unicodedata.category(mark) == "Cf"
    assert canonical_tokens(f"ap{mark}ples and 4{mark}6") == ["apples", "and", "46"]


def test_combining_marks_and_fillers_vanish():
    assert canonical_tokens("T\u0303o\u0308m\u034f has cafe\u0301 \u3164 items\ufe0f") == [
        "tom",
        "has",
        "cafe",
        "items",
    ]


@pytest.mark.parametrize(
    ("disguised", "plain"),
    [
        ("Тоm", "tom"),  # Cyrillic Te, o
        ("аррlеs", "apples"),  # Cyrillic a, er, ie
        ("ѕhеllѕ", "shells"),  # Cyrillic dze
        ("Іvan", "ivan"),  # Cyrillic capital I (UTS #39's prototype for it is "l")
        ("ΚΑΤΕ", "kate"),  # Greek capitals
        ("ροѕt", "post"),  # Greek rho, omicron
        ("ϲup", "cup"),  # Greek lunate sigma, which NFKD alone would turn into a final sigma
        ("һοԝ", "how"),  # Cyrillic shha, Greek omicron, Cyrillic we
    ],
)
def test_confusables_fold_to_latin(disguised, plain):
    assert not disguised.isascii()
    assert canonical_tokens(disguised) == [plain]


def test_the_confusables_table_comes_from_unicode_data_and_keeps_ascii_alone():
    table = confusable_table()
    assert len(table) > 1000  # the package's UTS #39 data, not a hand list
    assert all(code > 127 and len(glyph) == 1 and glyph.isascii() for code, glyph in table.items())
    assert table[ord("а")] == "a"
    assert table[ord("ο")] == "o"
    # A word in another script stays one word (its look-alike letters folded, the others kept).
    assert canonical_tokens("Москва") == ["mockba"]


@pytest.mark.parametrize(
    ("digits", "value"),
    [("٤٢", "42"), ("۴۲", "42"), ("४२", "42"), ("৪২", "42"), ("๔๒", "42"), ("４２", "42"), ("𝟺𝟸", "42")],
)
def test_every_unicode_decimal_digit_reads_as_ascii(digits, value):
    assert all(unicodedata.decimal(c) in (4, 2) for c in digits)
    assert canonical_tokens(f"total {digits}") == ["total", value]


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ("forty-two", "42"),
        ("Forty Two", "42"),
        ("one hundred and five", "105"),
        ("one hundred five", "105"),
        ("two thousand three hundred and forty-five", "2345"),
        ("a hundred", "100"),
        ("seventeen", "17"),
        ("zero", "0"),
    ],
)
def test_number_words_become_digits(written, value):
    assert canonical_tokens(f"has {written} apples") == [
        "has",
        *(["a"] if written.startswith("a ") else []),
        value,
        "apples",
    ]


def test_number_words_that_are_separate_numbers_stay_separate():
    assert canonical_tokens("five six") == ["5", "6"]
    assert canonical_tokens("twenty thirty") == ["20", "30"]
    assert canonical_tokens("one hundred and five apples and five pears") == ["105", "apples", "and", "5", "pears"]


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ("1,234", "1234"),
        ("1 234", "1234"),
        ("1_234", "1234"),
        ("1,234,567", "1234567"),
        ("007", "7"),
        ("12.0", "12"),
        ("12.50", "12.5"),
        ("012.500", "12.5"),
        ("0.0", "0"),
    ],
)
def test_number_formats_fold(written, value):
    assert canonical_tokens(f"is {written} now") == ["is", value, "now"]
    assert canonical_number(written) == value


def test_separators_that_are_not_thousands_keep_numbers_apart():
    assert canonical_tokens("12,5 and 12, 34 and 1,2345") == ["12", "5", "and", "12", "34", "and", "1", "2345"]
    assert canonical_tokens("ends with 12.") == ["ends", "with", "12"]
    # The other reading of "67 112", for callers that must consider both.
    assert canonical_tokens("67 112") == ["67112"]
    assert canonical_tokens("67 112", group_spaces=False) == ["67", "112"]


def test_digits_glued_to_words_and_digit_lookalike_letters():
    assert canonical_tokens("12apples 3pm") == ["12", "apples", "3", "pm"]
    assert canonical_tokens("l2 and 1O5 and 2o") == ["12", "and", "105", "and", "20"]
    assert canonical_tokens("oil lol") == ["oil", "lol"]  # no digit, no change


def test_case_and_whitespace_fold():
    assert canonical_text("  What\tIS\n\n THIS\u00a0\u2003thing?! ") == "what is this thing"
    assert canonical_tokens("STRASSE Straße") == ["strasse", "strasse"]


def test_normalize_tokens_is_the_canonical_form():
    text = "Tоm hаs fоrty-twо\u200b аpples, ١٢ more."
    assert normalize_tokens(text) == canonical_tokens(text) == ["tom", "has", "42", "apples", "12", "more"]


# --------------------------------------------------------------------------- generated variants

# This file's own attack material (kept apart from the canonicaliser's tables).
LOOKALIKE = {"a": "аα", "c": "сϲ", "e": "е", "i": "іι", "o": "оοσ", "p": "рρ", "s": "ѕ", "x": "х", "y": "у",
             "T": "ТΤ", "A": "АΑ", "H": "НΗ", "M": "МΜ", "B": "ВΒ", "E": "ЕΕ", "O": "ОΟ"}  # fmt: skip
HIDDEN = ["\u200b", "\u200c", "\u200d", "\u2060", "\u00ad", "\ufeff", "\u200e", "\u200f", "\u061c", "\u2063"]
DIGITS = ["٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "𝟘𝟙𝟚𝟛𝟜𝟝𝟞𝟟𝟠𝟡", "߀߁߂߃߄߅߆߇߈߉"]
ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def words(n: int, rng: random.Random) -> str:
    if n < 10:
        return ONES[n]
    if n < 20:
        return TEENS[n - 10]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else rng.choice(["-", " ", "-"]) + ONES[n % 10])
    rest = n % 100
    head = ONES[n // 100] + " hundred"
    return head if not rest else head + rng.choice([" and ", " "]) + words(rest, rng)


def homoglyph_variant(text: str, rng: random.Random) -> str:
    out = []
    for word in text.split(" "):
        spots = [k for k, c in enumerate(word) if c in LOOKALIKE]
        chars = list(word)
        for k in rng.sample(spots, min(len(spots), rng.randint(1, 3))):
            chars[k] = rng.choice(LOOKALIKE[chars[k]])
        out.append("".join(chars))
    return " ".join(out)


def hidden_variant(text: str, rng: random.Random) -> str:
    out = []
    for k, word in enumerate(text.split(" ")):
        if k % 3 == 0 and len(word) > 1:
            cut = rng.randrange(1, len(word))
            word = word[:cut] + rng.choice(HIDDEN) + word[cut:]
        out.append(word)
    return " ".join(out)


def number_variant(text: str, rng: random.Random) -> str:
    def one(token: str) -> str:
        core = token.rstrip(".?,")
        if not core.isdigit():
            return token
        n = int(core)
        form = rng.randrange(5)
        if form == 0:
            new = words(n, rng)
        elif form == 1:
            new = "0" + core
        elif form == 2:
            new = core + ".0"
        else:
            digits = rng.choice(DIGITS)
            new = "".join(digits[int(d)] for d in core)
        return new + token[len(core) :]

    return " ".join(one(t) for t in text.split(" "))


PROMPTS = [item["prompt"] for item in FEEDBACK + FINAL] + [
    "Which option is plum? A) cat B) plum C) red D) saw",
    "What is the weather in Oslo for Tuesday?",
    "Convert 345 EUR to JPY.",
]


@pytest.mark.parametrize("variant", [homoglyph_variant, hidden_variant, number_variant])
@pytest.mark.parametrize("seed", range(4))
def test_generated_variants_have_the_original_canonical_form(variant, seed):
    rng = random.Random(f"canonical:{variant.__name__}:{seed}")
    for prompt in PROMPTS:
        disguised = variant(prompt, rng)
        if variant is not number_variant or any(c.isdigit() for c in prompt):
            assert disguised != prompt
        assert canonical_tokens(disguised) == canonical_tokens(prompt), disguised


def test_stacked_variants_too():
    rng = random.Random("canonical:stacked")
    for prompt in PROMPTS:
        disguised = hidden_variant(homoglyph_variant(number_variant(prompt, rng), rng), rng).upper()
        assert canonical_tokens(disguised) == canonical_tokens(prompt), disguised


def test_different_content_stays_different():
    assert canonical_tokens("Tom has 12 apples") != canonical_tokens("Tom has 21 apples")
    # Single digits one space apart are one number (issue 33); a comma, a word or a line keeps them apart.
    for apart in ("Tom has 1, 2 apples", "Tom has 1 and 2 apples", "Tom has 1\n2 apples", "Tom has 1 – 2 apples"):
        assert canonical_tokens("Tom has 12 apples") != canonical_tokens(apart), apart
    assert canonical_tokens("12.5") != canonical_tokens("125")
    assert canonical_tokens("forty two") != canonical_tokens("four two")


def test_clock_minutes_keep_their_zero():
    assert canonical_tokens("at 9:05.") == ["at", "9", "05"]
    assert canonical_tokens("at ٠٩:٠٥") == canonical_tokens("at 09:05") == ["at", "9", "05"]
    assert canonical_tokens("03:5") != canonical_tokens("3:05")
    assert canonical_tokens("3:50") != canonical_tokens("3:05")


def test_digit_words_glued_by_an_invisible_character_read_digit_by_digit():
    assert canonical_tokens("six\u200bzero tickets and two\ufefftwo more") == ["60", "tickets", "and", "22", "more"]
    assert canonical_tokens("someone and none") == ["someone", "and", "none"]
