"""Harness runs honour the run's settings, hand out new nodes' tokens, and say what the run returns.

Real stack: ``manage.py start_run --harness`` creates the run, the harness's Main Agent and Workers
call the REST tools of the live server with the tokens they were given.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import requests
from django.core.management import CommandError, call_command

from apps.experiments.models import Event, Experiment
from apps.experiments.services import experiment_set_integrity
from apps.expos.models import AgentToken, IdempotencyRecord
from apps.flows.runs import run_final_eval_start
from apps.flows.supervisor import harness_reviews_request
from apps.research.agent_loops import agent_loops_sync
from apps.research.choices import RunStatus
from apps.research.models import AgentLoop, Decision, ResearchNode, Run, TranscriptTurn
from apps.research.selectors import run_held_nodes_last_seen
from apps.research.services import run_set_status
from tests.support.mcp_client import command_sections


def _call(base: str, token: str, tool: str, args: dict[str, Any] | None = None, **headers: str) -> requests.Response:
    return requests.post(
        f"{base}/api/v1/tools/{tool}",
        json=args or {},
        headers={"Authorization": f"Bearer {token}", **headers},
        timeout=60,
    )


def _start(world: Any, *flags: str) -> tuple[Run, dict[str, str]]:
    out = io.StringIO()
    call_command("start_run", "--harness", "--benchmark", str(world.run.benchmark.uuid), *flags, stdout=out)
    sections = command_sections(out.getvalue())
    run = Run.objects.get(uuid=sections["head"].split()[1])
    tokens = {}
    for line in sections["head"].splitlines():
        if line.startswith("token for "):
            tokens[line.split()[2]] = line.rsplit(": ", 1)[1]
    return run, tokens


@pytest.mark.parametrize(
    "flags",
    [("--policy", "llm"), ("--max-workers", "3"), ("--train-steps", "50"), ("--llm-tokens", "10"), ("--gate",)],
)
def test_start_run_refuses_a_flag_a_harness_run_cannot_honour(world, flags):
    before = Run.objects.count()
    with pytest.raises(CommandError) as excinfo:
        call_command("start_run", "--harness", "--benchmark", str(world.run.benchmark.uuid), *flags)
    assert flags[0] in str(excinfo.value)
    assert Run.objects.count() == before


def test_a_parallel_harness_run_hands_new_workers_tokens_once_and_runs_two_workers(live_server, world, settings):
    settings.RSI_TOKEN_CACHE_SECONDS = 0
    run, tokens = _start(world, "--harness-main", "--parallel", "2", "--seed", "7", "--no-reviewer", "--gate")
    assert run.max_parallel_workers == 2
    assert (run.policy["seed"], run.policy["reviewers"], run.policy["training_gate"]) == (7, False, True)
    base, main = live_server.url, tokens["main"]

    settings_answer = _call(base, main, "run_result_policy").json()["settings"]
    assert settings_answer == {"parallel_workers": 2, "seed": 7, "training_gate": True, "reviewers": False}

    created = _call(base, main, "state_add_new_worker", {"task": "second branch"}, **{"Idempotency-Key": "w2"})
    assert created.status_code == 201, created.text
    second = created.json()
    token = second.pop("token")
    # Shown once: the replay, the stored idempotent answer and the transcript never hold it.
    replay = _call(base, main, "state_add_new_worker", {"task": "second branch"}, **{"Idempotency-Key": "w2"})
    assert replay.status_code == 200
    assert "token" not in replay.json()
    assert replay.json()["replayed"] is True  # the body says so, not only a header
    assert "replayed" not in second
    assert replay.json()["handle"] == second["handle"]
    assert token not in str(IdempotencyRecord.objects.get(key="w2").response)
    assert not any(token in str(t.calls) + str(t.tool_messages) for t in TranscriptTurn.objects.filter(run=run))
    assert not Event.objects.filter(run=run, arguments__icontains=token).exists()

    # Both Workers act at once, each as itself, with its own token.
    first_token = tokens[next(h for h in tokens if h.startswith("worker_"))]
    for worker_token, handle in ((first_token, "worker_0001"), (token, second["handle"])):
        me = _call(base, worker_token, "state_get_current_worker")
        assert me.status_code == 200, me.text
        assert me.json()["worker"]["handle"] == handle
    assert ResearchNode.objects.filter(run=run, kind="worker", status="active").count() == 2

    third = _call(base, main, "state_add_new_worker", {"task": "third branch"})
    assert third.status_code == 409
    assert third.json()["error"]["code"] == "worker_limit"
    reviewer = _call(base, main, "state_add_new_reviewer", {"question": "sound?", "scope": ["worker_0001"]})
    assert reviewer.status_code == 409
    assert reviewer.json()["error"]["code"] == "reviewers_disabled"


def test_by_default_our_reviewer_loop_plays_a_reviewer_the_harness_main_requests(live_server, world):
    run, tokens = _start(world, "--harness-main")
    created = _call(live_server.url, tokens["main"], "state_add_new_reviewer",
                    {"question": "is it sound?", "scope": ["worker_0001"]})  # fmt: skip
    assert created.status_code == 201, created.text
    assert "token" not in created.json()  # no second harness needed: nobody outside plays it
    reviewer = ResearchNode.objects.get(run=run, handle=created.json()["reviewer"]["handle"])
    assert AgentLoop.objects.get(node=reviewer).policy == "heuristic"
    assert reviewer.handle not in run_held_nodes_last_seen(run)
    assert not AgentToken.objects.filter(node=reviewer).exists()
    # The Main sees its own node and ETag, and the Reviewer beside its Worker.
    me = _call(live_server.url, tokens["main"], "state_get_current_main")
    assert me.status_code == 200, me.text
    assert me.headers["ETag"] == me.json()["main"]["etag"]
    assert [r["handle"] for r in me.json()["reviewers"]] == [reviewer.handle]
    assert [w["handle"] for w in me.json()["workers"]] == ["worker_0001"]


def test_with_harness_reviewers_the_harness_plays_them_with_the_token_in_the_answer(live_server, world):
    run, tokens = _start(world, "--harness-main", "--harness-reviewers")
    created = _call(live_server.url, tokens["main"], "state_add_new_reviewer",
                    {"question": "is it sound?", "scope": ["worker_0001"]})  # fmt: skip
    assert created.status_code == 201, created.text
    token = created.json()["token"]
    reviewer = ResearchNode.objects.get(run=run, handle=created.json()["reviewer"]["handle"])
    assert not AgentLoop.objects.filter(node=reviewer).exists()
    assert reviewer.handle in run_held_nodes_last_seen(run)
    me = _call(live_server.url, token, "state_get_current_reviewer")
    assert me.status_code == 200, me.text
    body = me.json()
    assert (body["reviewer"]["handle"], body["scope"], body["reports"]) == (reviewer.handle, ["worker_0001"], 0)
    assert me.headers["ETag"] == body["reviewer"]["etag"]
    # The harness's Reviewer is on record turn by turn like its Main and Workers.
    assert [t.calls for t in TranscriptTurn.objects.filter(node=reviewer)]


@pytest.mark.parametrize(
    ("flags", "says"),
    [(("--harness-reviewers",), "needs --harness-main"),
     (("--harness-main", "--harness-reviewers", "--no-reviewer"), "contradict")],
)  # fmt: skip
def test_start_run_refuses_harness_reviewers_it_cannot_honour(world, flags, says):
    before = Run.objects.count()
    with pytest.raises(CommandError) as excinfo:
        call_command("start_run", "--harness", "--benchmark", str(world.run.benchmark.uuid), *flags)
    assert says in str(excinfo.value)
    assert Run.objects.count() == before


def _accept(experiment: Experiment, score: float) -> None:
    Experiment.objects.filter(pk=experiment.pk).update(feedback_score=score)
    experiment_set_integrity(experiment=experiment, status="accepted", actor="test", reason="checks passed")


def test_the_main_nominates_an_accepted_checkpoint_and_reads_the_run_after_stop_loop(api, world, settings):
    settings.RSI_TOKEN_CACHE_SECONDS = 0
    exp1, exp2, exp3 = world.exp["own1"], world.exp["own2"], world.exp["other"]
    main = world.tokens["main"]
    policy = _call(api.base, main, "run_result_policy").json()
    assert "best feedback score" in policy["rule"]
    assert policy["nomination"] is None

    args = {"experiment": exp2.handle, "rationale": "best on feedback", "evidence": [exp2.handle]}
    refused = _call(api.base, main, "main_nominate_result", args)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "not_accepted"
    assert not Decision.objects.filter(run=world.run, kind="nominate").exists()

    _accept(exp1, 11 / 30)
    _accept(exp3, 0.5)  # the rule alone would return exp3
    uncited = _call(api.base, main, "main_nominate_result",
                    {"experiment": exp1.handle, "rationale": "steadier", "evidence": [exp3.handle]})  # fmt: skip
    assert uncited.json()["error"]["code"] == "evidence_required"
    nominated = _call(api.base, main, "main_nominate_result",
                      {"experiment": exp1.handle, "rationale": "steadier across seeds",
                       "evidence": [exp1.handle, exp3.handle]})  # fmt: skip
    assert nominated.status_code == 201, nominated.text
    decision = Decision.objects.get(run=world.run, kind="nominate")
    assert decision.rationale == "steadier across seeds"
    assert str(decision.uuid) == nominated.json()["decision"]
    assert _call(api.base, main, "run_result_policy").json()["nomination"]["experiment"] == exp1.handle

    stopped = _call(api.base, main, "stop_loop", {"reason": "done"})
    assert stopped.status_code == 200, stopped.text
    late = _call(api.base, main, "main_nominate_result",
                 {"experiment": exp3.handle, "rationale": "changed my mind", "evidence": [exp3.handle]})  # fmt: skip
    assert late.json()["error"]["code"] == "nomination_closed"

    # After stop_loop: the status and whether the final evaluation finished, never a score.
    run = run_final_eval_start(run=Run.objects.get(pk=world.run.pk))
    started = Event.objects.get(run=run, type="run.final_eval_started").arguments
    assert started["best"] == exp1.handle
    assert started["chosen_by"]["by"] == "nomination"
    for who in ("main", "own"):
        answer = _call(api.base, world.tokens[who], "run_result_policy")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["run_status"] == "final_eval"
        assert body["final_evaluation"]["started"] is True
        assert body["final_evaluation"]["finished"] is False
        assert "score" not in str(body["final_evaluation"])

    run_set_status(run=Run.objects.get(pk=run.pk), status=RunStatus.FINISHED, actor="test")
    ended = _call(api.base, main, "run_result_policy")
    assert ended.status_code == 401
    assert "the run has finished (the final evaluation is done)" in ended.text


def test_a_nomination_no_longer_accepted_gives_way_to_the_rule(api, world):
    exp1, exp3 = world.exp["own1"], world.exp["other"]
    _accept(exp1, 11 / 30)
    _accept(exp3, 0.5)
    answer = _call(api.base, world.tokens["main"], "main_nominate_result",
                   {"experiment": exp1.handle, "rationale": "r", "evidence": [exp1.handle]})  # fmt: skip
    assert answer.status_code == 201, answer.text
    experiment_set_integrity(experiment=exp1, status="flagged", actor="test", reason="a late finding")
    _call(api.base, world.tokens["main"], "stop_loop", {"reason": "done"})
    run_final_eval_start(run=Run.objects.get(pk=world.run.pk))
    started = Event.objects.get(run=world.run, type="run.final_eval_started").arguments
    assert started["best"] == exp3.handle
    assert started["chosen_by"] == {
        "by": "rule",
        "nomination_set_aside": exp1.handle,
        "why": f"{exp1.handle} is no longer accepted (its integrity status changed after the nomination)",
    }


@pytest.mark.parametrize(("flags", "reviewed"), [((), True), (("--harness-main",), False), (("--no-reviewer",), False)])
def test_a_worker_only_harness_run_gets_our_review_of_each_finalized_worker(live_server, world, flags, reviewed):
    run, tokens = _start(world, *flags)
    done = _call(
        live_server.url, tokens["worker_0001"], "worker_finalize", {"summary": "nothing worked", "experiments": []}
    )
    assert done.status_code == 200, done.text
    added = harness_reviews_request(Run.objects.get(pk=run.pk))
    if not reviewed:  # the harness's Main asks for reviews itself, or the run has none
        assert added == []
        return
    (reviewer,) = added
    assert reviewer.kind == "reviewer"
    assert "worker_0001" in reviewer.task
    # The same tick gives it our Reviewer loop; the harness holds nothing more.
    assert [(loop.node_id, loop.policy) for loop in agent_loops_sync(run=Run.objects.get(pk=run.pk))] == [
        (reviewer.pk, "heuristic")
    ]
    assert harness_reviews_request(Run.objects.get(pk=run.pk)) == []  # once per Worker
