"""Bad strings never silence the audit: tool arguments no record can hold are refused, with their path.

Lone surrogates, NUL characters, NaN/Infinity and nesting beyond 64 levels are generated per class
(STYLE 31c) in several positions of a real ``worker_submit`` body — a key, a nested value, a list
item, beside a final-split request — and sent to the live REST endpoint as raw bytes. Each must
answer 400 naming the JSONPath of the bad value, leave a sealed ``tool.called`` refusal in the
run's event chain, and store nothing (no experiment, job, blocked attempt or idempotent answer).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from apps.experiments.events import chain_key, chain_verify, event_append
from apps.experiments.models import Event, Experiment
from apps.expos.models import IdempotencyRecord
from apps.integrity.choices import Subcategory
from apps.integrity.models import BlockedAttempt
from apps.integrity.submission_refusals import Refusal, record_refusal, submission_spec_sha256
from apps.jobs.models import Job
from apps.research.models import ResearchNode

SLOT = "__BAD_VALUE__"
KEY_SLOT = "__BAD_KEY__"


@dataclass(frozen=True)
class Hostile:
    """One bad value as raw JSON text, how it reads in a path (for keys), its rule and code."""

    label: str
    raw: bytes  # the JSON token(s) put into the body in place of the slot
    rule: str
    code: str = "invalid_input"
    shown: str = ""  # a string's JSON-escaped form as a JSONPath key shows it

    @property
    def is_string(self) -> bool:
        return self.raw.startswith(b'"')


def hostile_strings() -> Iterator[Hostile]:
    for escape in (r"\ud800", r"\udfff", r"\udbff", r"\udc00\ud800"):  # high, low, last high, a reversed pair
        yield Hostile(f"surrogate {escape}", f'"{escape}"'.encode(), "lone_surrogate", shown=f'"{escape}"')
    yield Hostile("surrogate after text", rb'"1e-4\ud83d"', "lone_surrogate", shown=r'"1e-4\ud83d"')
    # An encoded surrogate (CESU-8) is not UTF-8; it decodes to lone surrogates, refused with the path.
    yield Hostile("CESU-8 bytes", b'"\xed\xa0\x80"', "lone_surrogate", shown=r'"\udced\udca0\udc80"')
    yield Hostile("NUL", rb'"a\u0000b"', "nul_character", shown=r'"a\u0000b"')
    yield Hostile("NUL alone", rb'"\u0000"', "nul_character", shown=r'"\u0000"')


def hostile_numbers() -> Iterator[Hostile]:
    for token in (b"NaN", b"Infinity", b"-Infinity"):
        yield Hostile(f"bare {token.decode()}", token, "non_finite_number", code="invalid_json")
    for token in (b"1e999", b"-1e400"):
        yield Hostile(f"overflow {token.decode()}", token, "non_finite_number")


def positions(clean: str) -> Iterator[tuple[str, dict[str, Any], str, bool]]:
    """(label, body with a slot, JSONPath of the slot, whether the slot is a key)."""
    train = {"recipe": "sft", "datasets": [clean], "max_steps": 20}
    yield "key", {"train": {**train, "hyperparameters": {KEY_SLOT: 1}}}, "$.train.hyperparameters[{shown}]", True
    yield (
        "nested value",
        {"train": {**train, "hyperparameters": {"learning_rate": SLOT}}},
        "$.train.hyperparameters.learning_rate",
        False,
    )
    yield "list item", {"train": {**train, "datasets": [clean, SLOT]}}, "$.train.datasets[1]", False
    # The final-split attempt wrapped in a bad value: refused at the door, and still on record.
    yield "beside the final split", {"train": train, "eval": {"split": "final", "note": SLOT}}, "$.eval.note", False
    yield "open eval field", {"eval": {"split": "feedback", "temperature": SLOT}}, "$.eval.temperature", False


def variants(clean: str) -> Iterator[tuple[str, bytes, str, Hostile]]:
    for where, body, path, is_key in positions(clean):
        for hostile in [*hostile_strings(), *hostile_numbers()]:
            if is_key and not hostile.is_string:
                continue
            text = json.dumps(body).encode()
            slot = f'"{KEY_SLOT}"' if is_key else f'"{SLOT}"'
            yield f"{hostile.label} as {where}", text.replace(slot.encode(), hostile.raw), path, hostile


@pytest.fixture
def send(live_call):
    def post(who: str, tool: str, data: bytes, **headers: str) -> requests.Response:
        return live_call(who, tool, data=data, **headers)

    return post


def _last_refusal(world: Any, tool: str) -> Event:
    return Event.objects.filter(run=world.run, type="tool.called", tool=tool).latest("pk")


def test_every_bad_value_variant_is_refused_with_its_path_and_recorded(send, live_world):
    generated = list(variants(live_world.clean))
    assert len(generated) >= 40
    failures = []
    for index, (label, data, path_template, hostile) in enumerate(generated):
        path = path_template.format(shown=hostile.shown)
        before = Event.objects.filter(run=live_world.run, type="tool.called", tool="worker_submit").count()
        response = send("worker", "worker_submit", data, **{"Idempotency-Key": f"bad-{index}"})
        try:
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == hostile.code
            assert error["detail"]["json_path"] == path
            assert error["detail"]["rule"] == hostile.rule
            assert error["message"].startswith(f"{path}: ")
            assert (
                Event.objects.filter(run=live_world.run, type="tool.called", tool="worker_submit").count() == before + 1
            )
            recorded = _last_refusal(live_world, "worker_submit").arguments
            assert recorded["status"] == 400
            assert recorded["error"] == hostile.code
            assert recorded["error_path"] == path
            assert recorded["idempotency_key"] == f"bad-{index}"
            if "final" in label:
                assert recorded["args"]["eval"]["split"] == "final"  # the attempt is readable in the record
        except (AssertionError, KeyError, ValueError) as exc:
            failures.append(f"{label}: {exc!r}"[:400])
    assert not failures, "\n".join(failures)
    # Nothing was stored but the final-split asks, each one a test-set access attempt on record;
    # every refusal sits sealed in an intact chain.
    assert not Experiment.objects.exists()
    assert not Job.objects.exists()
    attempts = BlockedAttempt.objects.filter(run=live_world.run)
    assert attempts.count() == sum("final" in label for label, *_ in generated)
    assert set(attempts.values_list("subcategory", flat=True)) == {Subcategory.TEST_SET_ACCESS}
    assert {a.request["code"] for a in attempts} == {"split_sealed"}
    assert all(a.request["spec"]["eval"]["split"] == "final" for a in attempts)
    assert Event.objects.filter(run=live_world.run, type="submission.refused").count() == attempts.count()
    assert not IdempotencyRecord.objects.exists()
    refusals = Event.objects.filter(run=live_world.run, tool="worker_submit", arguments__status=400)
    assert refusals.count() == len(generated)
    assert not refusals.filter(hash="").exists()
    assert chain_verify(chain_key(live_world.run)).ok


def _nest(levels: int, kind: str) -> tuple[Any, str]:
    """``levels`` nested containers (dicts, lists or alternating) and the path from the outermost to the innermost."""
    value: Any = 1
    steps = []
    for level in range(levels):
        as_list = kind == "list" or (kind == "mixed" and level % 2)
        value = [value] if as_list else {"a": value}
        steps.append("[0]" if as_list else ".a")
    return value, "".join(reversed(steps[1:]))  # steps[0] leads into the innermost container


@pytest.mark.parametrize("kind", ["dict", "list", "mixed"])
def test_nesting_of_64_levels_reaches_the_review_and_65_is_refused_with_its_path(send, live_world, kind):
    # The body is level 1 and "eval" level 2, so "deep" adds 62 levels for 64 and 63 for 65.
    deep, _ = _nest(62, kind)
    at_limit = send(
        "worker",
        "worker_submit",
        json.dumps({"kind": "eval_only", "eval": {"split": "feedback", "deep": deep}}).encode(),
    )

    # 64 levels pass the door: the submission review refuses the unknown eval field, and records it.
    assert at_limit.status_code == 403, at_limit.text
    assert at_limit.json()["error"]["code"] == "submission_refused"
    attempt = BlockedAttempt.objects.get(run=live_world.run)
    assert attempt.request["spec"]["eval"]["deep"] == json.loads(json.dumps(deep))

    deeper, to_innermost = _nest(63, kind)
    beyond = send(
        "worker",
        "worker_submit",
        json.dumps({"kind": "eval_only", "eval": {"split": "feedback", "deep": deeper}}).encode(),
    )

    assert beyond.status_code == 400, beyond.text
    error = beyond.json()["error"]
    assert error["detail"]["rule"] == "too_deep"
    # The path names the container at level 65: the innermost one of "deep".
    innermost = "$.eval.deep" + to_innermost
    assert error["detail"]["json_path"] == innermost
    assert "deeper than 64 levels" in error["message"]
    recorded = _last_refusal(live_world, "worker_submit").arguments
    assert recorded["status"] == 400
    assert recorded["error_path"] == innermost
    assert BlockedAttempt.objects.filter(run=live_world.run).count() == 1  # only the 64-level attempt
    assert not Experiment.objects.exists()
    assert chain_verify(chain_key(live_world.run)).ok


def sealed_asks_refused_for_something_else(clean: str) -> Iterator[tuple[str, bytes, int]]:
    """Final-split requests that fail before the review for another reason: (label, body, status)."""
    train = {"recipe": "sft", "datasets": [clean], "max_steps": 20}
    for split in ("final", "FINAL", "final\u200b", "test"):
        ask = {"split": split}
        yield (
            f"{split!r} with an unknown top-level field",
            json.dumps({"train": train, "eval": ask, "x": 1}).encode(),
            400,
        )
        yield (
            f"{split!r} with a fractional step count",
            json.dumps({"train": {**train, "max_steps": 2.5}, "eval": ask}).encode(),
            400,
        )
        yield (
            f"{split!r} with a lone surrogate in the claim",
            json.dumps({"eval": ask, "kind": "eval_only"}).replace('"kind"', '"claim": "\\ud800", "kind"').encode(),
            400,
        )


def test_a_final_split_ask_refused_for_another_reason_is_still_a_blocked_attempt(send, live_world):
    failures = []
    cases = list(sealed_asks_refused_for_something_else(live_world.clean))
    for label, data, expected in cases:
        before = BlockedAttempt.objects.filter(run=live_world.run).count()
        response = send("worker", "worker_submit", data)
        try:
            assert response.status_code == expected, response.text
            attempt = BlockedAttempt.objects.filter(run=live_world.run).latest("pk")
            assert BlockedAttempt.objects.filter(run=live_world.run).count() == before + 1
            assert attempt.subcategory == Subcategory.TEST_SET_ACCESS
            assert attempt.request["code"] == "split_sealed"
            assert attempt.node == live_world.worker
        except (AssertionError, BlockedAttempt.DoesNotExist) as exc:
            failures.append(f"{label}: {exc!r}"[:300])
    assert not failures, "\n".join(failures)
    # A feedback ask refused for the same reasons is no test-set access attempt.
    count = BlockedAttempt.objects.filter(run=live_world.run).count()
    response = send("worker", "worker_submit", json.dumps({"eval": {"split": "feedback"}, "x": 1}).encode())
    assert response.status_code == 400
    assert BlockedAttempt.objects.filter(run=live_world.run).count() == count
    assert not Experiment.objects.exists()
    assert chain_verify(chain_key(live_world.run)).ok


def test_other_tools_refuse_bad_values_the_same_way(send, live_world):
    nodes = ResearchNode.objects.filter(run=live_world.run).count()
    for raw, path in (
        (rb'{"task": "explore \ud800 lr"}', "$.task"),
        (rb'{"task": "ok", "predecessors": ["worker_0001", "\u0000"]}', "$.predecessors[1]"),
    ):
        response = send("main", "state_add_new_worker", raw)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["detail"]["json_path"] == path
        assert _last_refusal(live_world, "state_add_new_worker").arguments["error_path"] == path
    assert ResearchNode.objects.filter(run=live_world.run).count() == nodes


def hostile_records() -> Iterator[tuple[str, Any]]:
    """Values that reach a recorder some other way than the REST door (a direct service call)."""
    yield "surrogate value", {"eval": {"split": "final"}, "claim": "best \ud800"}
    yield "surrogate key", {"eval": {"split": "final", "\udfff": 1}}
    yield "NUL and NaN", {"eval": {"split": "final"}, "train": {"lr": float("nan"), "name": "a\x00b"}}
    deep: Any = "bottom"
    for _ in range(300):
        deep = [deep]
    yield "300 levels", {"eval": {"split": "final", "deep": deep}}


def test_the_refusal_recorders_write_whatever_the_request_held(world):
    """The submission review's recorder and the event log escape what they cannot store, never crash."""
    for label, spec in hostile_records():
        attempts = record_refusal(
            run=world.run,
            node=world.worker,
            spec=spec,
            spec_sha256=submission_spec_sha256(spec),
            refusals=[Refusal("split_sealed", Subcategory.TEST_SET_ACCESS, "the final split is sealed")],
        )
        attempt = BlockedAttempt.objects.get(pk=attempts[0].pk)
        assert attempt.request["spec"]["eval"]["split"] == "final", label
        assert Event.objects.filter(run=world.run, type="submission.refused").latest("pk").result_ref == (
            f"blocked_attempt:{attempt.pk}"
        )
        event = event_append(run=world.run, type="probe", actor="test", role="worker", arguments=spec)
        assert Event.objects.get(pk=event.pk).arguments["eval"]["split"] == "final", label
    escaped = BlockedAttempt.objects.filter(run=world.run).order_by("pk")
    assert escaped[0].request["spec"]["claim"] == "best \\ud800"
    assert "\\udfff" in escaped[1].request["spec"]["eval"]
    assert escaped[2].request["spec"]["train"] == {"lr": "nan", "name": "a\\u0000b"}
    assert chain_verify(chain_key(world.run)).ok
