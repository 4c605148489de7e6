"""Training reads its rows strictly: a value no record can hold stops the job with its line, before any step."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.ml.training import _read_jsonl

GOOD = '{"prompt": "Question: 2 + 2?\\nAnswer:", "completion": " 4"}'


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ('{"prompt": "x", "completion": NaN}', "NaN"),
        ('{"prompt": "x", "completion": Infinity}', "Infinity"),
        ('{"prompt": "x", "completion": 1e999}', "finite"),
        ('{"prompt": "x\\ud800", "completion": "y"}', "surrogate"),
        ('{"prompt": "x\\u0000", "completion": "y"}', "NUL"),
        ('{"prompt": ' + "[" * 70 + "1" + "]" * 70 + ', "completion": "y"}', "64"),
        ('{"prompt": "x", "completion": ', "not valid JSON"),
    ],
)
def test_a_bad_row_names_its_file_and_line(tmp_path: Path, bad: str, words: str) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join([GOOD, GOOD, bad, GOOD]) + "\n", encoding="utf-8")

    with pytest.raises(ValueError, match=r"^train\.jsonl:3: ") as caught:
        _read_jsonl([path])
    assert words.lower() in str(caught.value).lower()


def test_clean_rows_are_read_in_order(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(GOOD + "\n\n" + GOOD.replace("4", "5") + "\n", encoding="utf-8")

    rows = _read_jsonl([path])

    assert [row["completion"] for row in rows] == [" 4", " 5"]
