"""A harness run's transcript: the server records the tool-call side of every call it answers (issue 17)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from apps.expos.harness import harness_run_start
from apps.research.transcripts import node_turns
from tests.factories import BenchmarkFactory, CheckpointFactory

pytestmark = pytest.mark.django_db


def test_each_call_of_a_harness_becomes_a_tool_call_turn_refusals_included():
    harness = harness_run_start(benchmark=BenchmarkFactory(), base_checkpoint=CheckpointFactory(is_base=True),
                                name="harness transcript", task="Improve arithmetic.", wall_seconds=3600,
                                accelerator_seconds=3600, reserved_final_seconds=60)  # fmt: skip
    seat = harness.seats[0]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {seat.token}")
    assert client.post("/api/v1/tools/public_check_quota", "{}", content_type="application/json").status_code == 200
    refused = client.post("/api/v1/tools/main_guidance_read", "{}", content_type="application/json")
    assert refused.status_code == 403
    turns = node_turns(seat.node)
    assert [t["source"] for t in turns] == ["harness", "harness"]
    calls = [t["response"]["tool_calls"][0]["function"]["name"] for t in turns]
    assert calls == ["public_check_quota", "main_guidance_read"]
    answer = turns[1]["tool_messages"][0]
    assert answer["tool_call_id"] == turns[1]["response"]["tool_calls"][0]["id"]
    assert json.loads(answer["content"])["error"]["code"] == "forbidden_role"
    recorded = json.loads(turns[0]["tool_messages"][0]["content"])
    live = client.post("/api/v1/tools/public_check_quota", "{}", content_type="application/json").json()
    assert set(recorded) == set(live)
    assert len(node_turns(seat.node)) == 3


def test_the_harness_main_agents_calls_and_idempotent_replays_are_turns():
    harness = harness_run_start(benchmark=BenchmarkFactory(), base_checkpoint=CheckpointFactory(is_base=True),
                                name="harness main transcript", task="Improve arithmetic.", wall_seconds=3600,
                                accelerator_seconds=3600, reserved_final_seconds=60, plays_main=True)  # fmt: skip
    main = next(seat for seat in harness.seats if seat.node.kind == "main")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {main.token}")
    body = json.dumps({"task": "a second branch"})
    for _ in range(2):
        answer = client.post("/api/v1/tools/state_add_new_worker", body, content_type="application/json",
                             HTTP_IDEMPOTENCY_KEY="w2")  # fmt: skip
        assert answer.status_code in (200, 201), answer.content
    assert client.post("/api/v1/tools/state_get_current_main", "{}", content_type="application/json").status_code == 200
    turns = node_turns(main.node)
    assert [t["calls"][0]["name"] for t in turns] == ["state_add_new_worker"] * 2 + ["state_get_current_main"]
    assert [t["calls"][0].get("replayed", False) for t in turns] == [False, True, False]
    replayed = json.loads(turns[1]["tool_messages"][0]["content"])
    assert replayed["replayed"] is True
    assert replayed["handle"] == json.loads(turns[0]["tool_messages"][0]["content"])["handle"]
    # The shown-once token is in neither turn.
    assert "token" not in replayed
    assert "token" not in json.loads(turns[0]["tool_messages"][0]["content"])
