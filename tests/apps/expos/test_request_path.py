"""One agent append costs a fixed, small number of round trips (issue 14, point 11).

A single ``experiment_log_metrics`` point is what an agent sends most often. It is measured here
through the real request path (token, throttle, handler, event log, commit) on the real
PostgreSQL and Redis: SQL statements with Django's CaptureQueriesContext, Redis commands with
MONITOR on this test's Redis database, bracketed by two ECHO markers.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid

import psycopg
import pytest
import redis
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from rest_framework.views import APIView

from apps.experiments.events import chain_key, chain_verify
from apps.experiments.models import Event, MetricPoint
from apps.experiments.services import experiment_create
from apps.expos.auth import agent_token_authenticate, agent_token_issue, agent_token_revoke
from apps.expos.models import AgentToken
from apps.expos.registry import REGISTRY, load_all
from apps.expos.views import ToolCallView
from apps.research.choices import NodeKind, RunStatus
from apps.research.models import Run
from apps.research.services import node_create, run_set_status
from tests.factories import make_run
from tests.support.procs import child_env, run_python

pytestmark = pytest.mark.django_db(transaction=True)


class RedisCommands:
    """The commands Redis executed on one database between two markers (MONITOR sees them all)."""

    def __init__(self) -> None:
        self.client = redis.Redis.from_url(settings.REDIS_URL)
        self.db = self.client.connection_pool.connection_kwargs.get("db", 0)
        self.marker = uuid.uuid4().hex
        self.seen: list[str] = []
        self._ready = threading.Event()

    def __enter__(self) -> RedisCommands:
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)
        self.client.echo(f"{self.marker}-start")
        return self

    def _watch(self) -> None:
        with self.client.monitor() as monitor:
            self._ready.set()
            recording = False
            for command in monitor.listen():
                # Commands a script runs show as client "lua": they are no round trips of ours.
                if command["db"] != self.db or command.get("client_type") == "lua":
                    continue
                text = command["command"]
                if text == f"ECHO {self.marker}-start":
                    recording = True
                elif text == f"ECHO {self.marker}-end":
                    return
                elif recording:
                    self.seen.append(text)

    def __exit__(self, *exc: object) -> None:
        self.client.echo(f"{self.marker}-end")
        self._thread.join(10)
        assert not self._thread.is_alive(), "MONITOR never saw the end marker"


class BindingWatch:
    """A Django execute wrapper: per statement, its first word and whether PostgreSQL binds its
    parameters (a server-bound cursor, which psycopg prepares once used often enough)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    def __call__(self, execute, sql, params, many, context):
        raw = context["cursor"].cursor
        self.seen.append((sql.split()[0], not isinstance(raw, psycopg.ClientCursor)))
        return execute(sql, params, many, context)


@pytest.fixture
def appender():
    run = make_run(name="request path")
    run = run_set_status(run=run, status=RunStatus.RUNNING, actor="test")
    node = node_create(run=run, kind=NodeKind.WORKER, task="logs metrics")
    experiment = experiment_create(
        run=run, owner=node, kind="eval_only", input_checkpoint=run.base_checkpoint,
        action={"evaluate": "feedback"}, status="succeeded",
    )  # fmt: skip
    plaintext, token = agent_token_issue(run=run, node=node, role=NodeKind.WORKER)
    cache.clear()
    return run, experiment, plaintext, token


def _append(client: Client, plaintext: str, handle: str, step: int):
    return client.post(
        "/api/v1/tools/experiment_log_metrics",
        {"experiment": handle, "points": [{"key": "loss", "step": step, "value": 0.5}]},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {plaintext}",
    )


def test_a_single_append_is_one_statement_and_one_redis_call(appender, settings):
    settings.RSI_TOKEN_RATE_LEASE_SECONDS = 30  # leases outlive the gaps between calls, however loaded the machine
    run, experiment, plaintext, _ = appender
    client = Client()
    assert _append(client, plaintext, experiment.handle, 0).status_code == 200  # resolves and caches the token
    binding = BindingWatch()
    with RedisCommands() as commands, CaptureQueriesContext(connection) as queries, connection.execute_wrapper(binding):
        response = _append(client, plaintext, experiment.handle, 1)
    assert response.status_code == 200, response.content
    assert response.json() == {"experiment": experiment.handle, "logged": 1, "unchanged": 0}
    sql = [q["sql"] for q in queries]
    # Was 7 statements in 3 transactions: the token look-up, BEGIN, the ownership SELECT, the
    # INSERT, the event append, COMMIT, and the after-commit seal re-check. Then BEGIN, one
    # statement, COMMIT. Now that one statement is its own transaction: it finds the experiment by
    # run, handle, owner and uuid, inserts the point, appends the call's event and checks that
    # no point conflicts; one round trip, where a bare INSERT's transaction takes three.
    assert len(sql) == 1, sql
    assert "INSERT INTO experiments_metricpoint" in sql[0], sql
    assert "owner_id" in sql[0], sql
    assert "rsiweb_event_append" in sql[0], sql
    assert "rsiweb_refuse_unless" in sql[0], sql
    # Its parameters are bound by PostgreSQL, and the connection prepared it on first use.
    assert binding.seen == [("WITH", True)], binding.seen
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%rsiweb_event_append%"])
        assert cursor.fetchone()[0] == 1
    # Was GET and SET of DRF's throttle history: now one script call, which leased two permits
    # (the first call's lease of one was used up within its lifetime).
    assert len(commands.seen) == 1, commands.seen
    assert commands.seen[0].startswith("EVALSHA"), commands.seen
    assert _lease_args(commands.seen[0]) == (2, 0), commands.seen
    # The next call spends the second permit of that lease: no round trip to Redis at all.
    with RedisCommands() as commands:
        assert _append(client, plaintext, experiment.handle, 2).status_code == 200
    assert commands.seen == [], commands.seen
    # The event was sealed as it was inserted, and the chain holds.
    event = Event.objects.filter(run=run, type="tool.called").order_by("-id").first()
    assert event.hash
    assert event.seq is not None
    assert chain_verify(chain_key(run)).ok
    assert MetricPoint.objects.filter(experiment=experiment).count() == 3


def test_appending_to_an_experiment_of_another_worker_is_refused(appender):
    run, experiment, _, _ = appender
    owner = experiment.owner
    # A successor sees its predecessor's experiments (403: not yours); a stranger does not (404).
    successor = node_create(run=run, kind=NodeKind.WORKER, task="continues", upstream=[owner])
    stranger = node_create(run=run, kind=NodeKind.WORKER, task="another")
    successor_token, _ = agent_token_issue(run=run, node=successor, role=NodeKind.WORKER)
    stranger_token, _ = agent_token_issue(run=run, node=stranger, role=NodeKind.WORKER)
    response = _append(Client(), successor_token, experiment.handle, 0)
    assert response.status_code == 403, response.content
    assert response.json()["error"]["code"] == "not_your_experiment"
    assert _append(Client(), stranger_token, experiment.handle, 0).status_code == 404
    assert _append(Client(), successor_token, "exp_9999", 0).status_code == 404
    assert not MetricPoint.objects.filter(experiment=experiment).exists()


REVOKE = """
from apps.expos.auth import agent_token_revoke
from apps.expos.models import AgentToken
agent_token_revoke(token=AgentToken.objects.get(pk={pk}), reason="test")
"""


def test_a_revoked_token_stops_within_the_cache_lag(appender, settings):
    settings.RSI_TOKEN_CACHE_SECONDS = 2
    run, experiment, plaintext, token = appender
    client = Client()
    assert _append(client, plaintext, experiment.handle, 0).status_code == 200
    # Revoked by another process: this one's cached entry may serve until it is 2 s old.
    revoked_at = time.monotonic()
    run_python(REVOKE.format(pk=token.pk))
    assert AgentToken.objects.get(pk=token.pk).revoked_at is not None
    time.sleep(max(0.0, revoked_at + settings.RSI_TOKEN_CACHE_SECONDS - time.monotonic()))
    response = _append(client, plaintext, experiment.handle, 1)
    assert response.status_code == 401, response.content


def test_a_token_revoked_in_this_process_stops_at_once(appender, settings):
    settings.RSI_TOKEN_CACHE_SECONDS = 3600
    run, experiment, plaintext, token = appender
    client = Client()
    assert _append(client, plaintext, experiment.handle, 0).status_code == 200
    agent_token_revoke(token=token, reason="test")
    assert _append(client, plaintext, experiment.handle, 1).status_code == 401


def test_each_cache_hit_is_a_copy_that_shares_nothing_mutable(appender, settings):
    settings.RSI_TOKEN_CACHE_SECONDS = 3600
    run, _, plaintext, _ = appender
    first = agent_token_authenticate(plaintext)
    second = agent_token_authenticate(plaintext)  # a hit: no query
    assert first.pk == second.pk
    assert first is not second
    assert first.run is not second.run
    assert first.node is not second.node
    first.run.policy["changed by a request"] = True
    first.run.tags.append("mine")
    first.node.task = "rewritten"
    third = agent_token_authenticate(plaintext)
    assert "changed by a request" not in third.run.policy
    assert "mine" not in third.run.tags
    assert third.node.task == "logs metrics"
    assert third.run.policy == Run.objects.get(pk=run.pk).policy


def test_the_rate_limit_refuses_past_the_rate_with_retry_after(appender, settings):
    settings.RSI_TOKEN_RATE = "3/min"
    run, experiment, plaintext, _ = appender
    client = Client()
    codes = [_append(client, plaintext, experiment.handle, step).status_code for step in range(4)]
    assert codes == [200, 200, 200, 429]
    refused = _append(client, plaintext, experiment.handle, 9)
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60


def _lease_args(evalsha: str) -> tuple[int, int]:
    """(permits asked for, unused permits handed back) of a MONITOR line of the rate-limit script."""
    # EVALSHA <sha> 1 <key> <interval> <burst> <wanted> <unused>, each argument quoted
    words = evalsha.replace('"', "").split()
    return int(words[-2]), int(words[-1])


def _calls_until_refused(client: Client, plaintext: str, handle: str, first_step: int, most: int) -> int:
    for n in range(most):
        response = _append(client, plaintext, handle, first_step + n)
        if response.status_code == 429:
            return n
        assert response.status_code == 200, response.content
    raise AssertionError(f"{most} calls and no 429")


def test_a_busy_token_leases_its_permits_and_still_gets_exactly_its_rate(appender, settings):
    # 120 a minute, leases live 5 s: a lease holds at most 10 permits (5 s of the rate).
    settings.RSI_TOKEN_RATE = "120/min"
    settings.RSI_TOKEN_RATE_LEASE_SECONDS = 5
    run, experiment, plaintext, _ = appender
    started = time.monotonic()
    with RedisCommands() as commands:
        admitted = _calls_until_refused(Client(), plaintext, experiment.handle, 0, most=400)
    refill = (time.monotonic() - started) * 2  # 2 permits a second come back meanwhile
    # The burst of the whole rate, and what refilled while the calls ran: no more, no less.
    assert 120 <= admitted <= 120 + refill + 1, (admitted, refill)
    scripts = [c for c in commands.seen if c.startswith("EVALSHA")]
    assert len(scripts) == len(commands.seen), commands.seen
    asked = [_lease_args(c)[0] for c in scripts]
    # Leases grow while they are used up in time (1, 2, 4, 8), never beyond 10 permits.
    assert asked[:4] == [1, 2, 4, 8], asked
    assert max(asked) == 10, asked
    assert len(scripts) <= admitted // 5, (len(scripts), admitted)


LEASED_CALLS = """
from django.conf import settings
from django.test import Client
settings.ALLOWED_HOSTS = ["*"]
client = Client(HTTP_AUTHORIZATION="Bearer {token}")
codes = [client.post("/api/v1/tools/experiment_log_metrics",
                     {{"experiment": "{handle}", "points": [{{"key": "other", "step": i, "value": 1.0}}]}},
                     content_type="application/json").status_code for i in range({calls})]
assert codes == [200] * {calls}, codes
"""


def test_processes_lease_from_one_shared_limit(appender, settings):
    settings.RSI_TOKEN_RATE = "120/min"
    settings.RSI_TOKEN_RATE_LEASE_SECONDS = 5
    run, experiment, plaintext, _ = appender
    started = time.monotonic()
    # Another web process spends 50 of the token's 120 (and keeps what its last lease has left).
    env = {"RSI_TOKEN_RATE": "120/min", "RSI_TOKEN_RATE_LEASE_SECONDS": "5"}
    run_python(LEASED_CALLS.format(token=plaintext, handle=experiment.handle, calls=50), env=child_env(**env))
    admitted = _calls_until_refused(Client(), plaintext, experiment.handle, 0, most=400)
    refill = (time.monotonic() - started) * 2
    # At most the other process's unused lease (< 10 permits) is lost to this one; nothing is doubled.
    assert 120 - 10 < 50 + admitted <= 120 + refill + 1, (admitted, refill)


def test_permits_a_lease_did_not_use_are_handed_back(appender, settings):
    settings.RSI_TOKEN_RATE = "150/min"
    settings.RSI_TOKEN_RATE_LEASE_SECONDS = 2  # leases of at most 5 permits
    run, experiment, plaintext, _ = appender
    client = Client()
    with RedisCommands() as commands:
        for step in range(9):  # leases of 1, 2, 4 and then 5: 12 permits taken, 9 used
            assert _append(client, plaintext, experiment.handle, step).status_code == 200
    assert [_lease_args(c) for c in commands.seen] == [(1, 0), (2, 0), (4, 0), (5, 0)], commands.seen
    time.sleep(2.2)  # the lease expires with 3 permits unused
    with RedisCommands() as commands:
        assert _append(client, plaintext, experiment.handle, 9).status_code == 200
    # They go back with the next request, and the lease shrinks.
    assert [_lease_args(c) for c in commands.seen] == [(2, 3)], commands.seen


def test_a_refused_append_leaves_only_its_refusal(appender):
    """The event is written by the INSERT's statement; when its answer refuses the call, both roll back."""
    run, experiment, plaintext, _ = appender
    client = Client()
    assert _append(client, plaintext, experiment.handle, 0).status_code == 200  # remembers the experiment
    before = list(Event.objects.filter(run=run, type="tool.called").values_list("arguments", flat=True))
    with CaptureQueriesContext(connection) as queries:
        conflict = client.post(
            "/api/v1/tools/experiment_log_metrics",
            {"experiment": experiment.handle, "points": [{"key": "loss", "step": 0, "value": 0.25}]},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {plaintext}",
        )
        same = _append(client, plaintext, experiment.handle, 0)  # the identical point again: a no-op
    assert conflict.status_code == 409, conflict.content
    assert conflict.json()["error"]["code"] == "metric_conflict"
    # The statement that is its own transaction refused itself; the transactional path then wrote
    # the success event with the refused points and rolled both back, and said which points conflict.
    sql = [q["sql"] for q in queries]
    assert "rsiweb_refuse_unless" in sql[0], sql
    assert sql[1] == "BEGIN", sql
    assert [q for q in sql[2:] if "rsiweb_event_append" in q and "experiments_metricpoint" in q], sql
    assert conflict.json()["error"]["detail"]["points"] == ["loss@0"]
    assert same.status_code == 200
    assert same.json() == {"experiment": experiment.handle, "logged": 0, "unchanged": 1}
    calls = Event.objects.filter(run=run, type="tool.called").order_by("id")
    after = list(calls.values_list("arguments", "result_ref"))
    added = after[len(before) :]
    assert [args["status"] for args, _ in added] == [409, 200], added
    assert added[0][0]["error"] == "metric_conflict"
    assert added[1][1] == f"experiment:{experiment.uuid}"
    assert list(MetricPoint.objects.filter(experiment=experiment).values_list("step", "value")) == [(0, 0.5)]
    assert chain_verify(chain_key(run)).ok


class _ThroughDrf(ToolCallView):
    """The same view answering agents through DRF's own dispatch (Request, Response, handlers)."""

    dispatch = APIView.dispatch  # type: ignore[assignment]


_AGENT_VIEW = ToolCallView.as_view()
_DRF_VIEW = _ThroughDrf.as_view()
# Headers a response carries whichever path made it (Date and the like are the server's).
_COMPARED = ("Content-Type", "Allow", "WWW-Authenticate", "Retry-After", "ETag", "Idempotent-Replayed", "Vary")


def _both_ways(name: str, body: bytes, **headers: str) -> list[tuple[int, bytes, dict[str, str | None]]]:
    answers = []
    for view in (_AGENT_VIEW, _DRF_VIEW):
        request = RequestFactory().post(f"/api/v1/tools/{name}", body, content_type="application/json", **headers)
        response = view(request, name=name)
        if hasattr(response, "render"):
            response.render()
        answers.append((response.status_code, response.content, {h: response.get(h) for h in _COMPARED}))
    return answers


def test_an_agent_s_call_answers_as_drf_s_dispatch_would(appender, settings):
    """Agents' POSTs skip DRF's Request and Response (apps.expos.views.ToolCallView.dispatch);
    every answer, refusals included, is the one DRF's own dispatch gives for the same request."""
    settings.RSI_TOKEN_RATE = ""
    run, experiment, plaintext, _ = appender
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {plaintext}"}
    read = json.dumps({"experiment": experiment.handle, "key": "loss"}).encode()
    cases = {
        "a read": ("experiment_metrics_read", read, bearer),
        "an unknown tool": ("no_such_tool", b"{}", bearer),
        "another role's tool": ("main_guidance_read", b"{}", bearer),
        "invalid JSON": ("experiment_metrics_read", b"{nope", bearer),
        "invalid arguments": ("experiment_metrics_read", b'{"experiment": 5, "key": "loss"}', bearer),
        "a non-ASCII value": ("experiment_metrics_read", '{"experiment": "é\u2028", "key": "loss"}'.encode(), bearer),
        "an unknown token": ("experiment_metrics_read", read, {"HTTP_AUTHORIZATION": "Bearer not-a-token"}),
        "a malformed header": ("experiment_metrics_read", read, {"HTTP_AUTHORIZATION": "Bearer a b"}),
        "no credentials": ("experiment_metrics_read", read, {}),
    }
    for case, (name, body, headers) in cases.items():
        ours, drf = _both_ways(name, body, **headers)
        assert ours == drf, case
    ours, _ = _both_ways(*cases["a read"][:2], **bearer)
    assert ours[0] == 200, ours
    assert ours[2]["Content-Type"] == "application/json", ours
    assert ours[2]["Allow"] == "POST, OPTIONS", ours
    # A refusal of the rate limit: the same code and message, each with its own wait.
    settings.RSI_TOKEN_RATE = "1/min"
    cache.clear()
    first, refused_drf = _both_ways(*cases["a read"][:2], **bearer)
    refused_ours, _ = _both_ways(*cases["a read"][:2], **bearer)
    assert first[0] == 200
    assert refused_drf[0] == refused_ours[0] == 429
    assert json.loads(refused_drf[1])["error"]["code"] == json.loads(refused_ours[1])["error"]["code"] == "throttled"
    assert refused_ours[2]["Retry-After"]
    assert refused_drf[2]["Retry-After"]


def test_one_statement_counts_new_and_identical_points(appender):
    run, experiment, plaintext, _ = appender
    client = Client()
    assert _append(client, plaintext, experiment.handle, 0).status_code == 200
    points = [{"key": "loss", "step": 0, "value": 0.5}, {"key": "loss", "step": 1, "value": 0.25},
              {"key": "acc", "step": 0, "value": 0.75}]  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        response = _post_points(client, plaintext, experiment.handle, points)
    assert response.status_code == 200, response.content
    assert response.json() == {"experiment": experiment.handle, "logged": 2, "unchanged": 1}
    assert len(queries) == 1, [q["sql"] for q in queries]
    logged = set(MetricPoint.objects.filter(experiment=experiment).values_list("key", "step", "value"))
    assert logged == {("loss", 0, 0.5), ("loss", 1, 0.25), ("acc", 0, 0.75)}
    assert chain_verify(chain_key(run)).ok


@pytest.mark.parametrize("theirs", [0.5, 0.9], ids=["same-value", "other-value"])
def test_a_point_another_call_commits_during_the_statement_is_settled_in_a_transaction(appender, theirs):
    """A point a concurrent transaction inserts and commits after the statement began is neither
    inserted (ON CONFLICT waits for it, then skips) nor visible to the statement's check: the
    statement refuses itself, and the transactional path answers as if the calls had come in turn."""
    run, experiment, plaintext, _ = appender
    client = Client()
    assert _append(client, plaintext, experiment.handle, 0).status_code == 200  # remembers the experiment
    other = psycopg.connect(_dsn())
    try:
        other.execute(
            "INSERT INTO experiments_metricpoint (experiment_id, key, step, value, created_at) "
            "VALUES (%s, 'loss', 7, %s, now())",
            [experiment.pk, theirs],
        )  # uncommitted: the append's insert of step 7 waits for it
        answers = []
        points = [{"key": "loss", "step": 7, "value": 0.5}, {"key": "loss", "step": 8, "value": 0.5}]

        def append() -> None:
            try:
                answers.append(_post_points(Client(), plaintext, experiment.handle, points))
            finally:
                connection.close()  # this thread's

        call = threading.Thread(target=append)
        call.start()
        # The one statement (its text's start: pg_stat_activity keeps 1 kB) has begun and waits for step 7.
        _wait_for_lock_wait("AND owner_id = $3 AND uuid = $4")
        other.commit()
        call.join(30)
    finally:
        other.close()
    assert answers, "the append never answered"
    answer = answers[0]
    logged = dict(MetricPoint.objects.filter(experiment=experiment).values_list("step", "value"))
    if theirs == 0.5:
        assert answer.status_code == 200, answer.content
        assert answer.json() == {"experiment": experiment.handle, "logged": 1, "unchanged": 1}
        assert logged == {0: 0.5, 7: 0.5, 8: 0.5}
    else:
        assert answer.status_code == 409, answer.content
        assert answer.json()["error"]["code"] == "metric_conflict"
        assert logged == {0: 0.5, 7: 0.9}  # nothing of the refused call, step 8 included
    statuses = [
        a["status"] for a in Event.objects.filter(run=run, type="tool.called").values_list("arguments", flat=True)
    ]
    assert statuses == [200, answer.status_code], statuses  # one event per call, the refused statement's gone
    assert chain_verify(chain_key(run)).ok


def _post_points(client: Client, plaintext: str, handle: str, points: list[dict]):
    return client.post(
        "/api/v1/tools/experiment_log_metrics",
        {"experiment": handle, "points": points},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {plaintext}",
    )


def _dsn() -> str:
    db = settings.DATABASES["default"]
    return f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER']} dbname={db['NAME']}"


def _wait_for_lock_wait(marker: str) -> None:
    with psycopg.connect(_dsn(), autocommit=True) as watcher:
        for _ in range(300):
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                [f"%{marker}%"],
            ).fetchone()[0]
            if waiting:
                return
            time.sleep(0.05)
    raise AssertionError(f"no statement with {marker} came to wait for the other transaction's row")


def test_an_invalid_answer_of_the_one_statement_is_a_500_over_a_committed_change(appender, monkeypatch):
    """A server bug, as an output schema violation is on the transactional path; there it rolls
    back, here the statement has committed: the 500 says the change was made, and the call's
    event is there beside the points."""
    run, experiment, plaintext, _ = appender
    client = Client()
    assert _append(client, plaintext, experiment.handle, 0).status_code == 200
    tool = load_all()["experiment_log_metrics"]
    assert tool.at_once is not None

    def broken(ctx, args):  # the real statement, then an answer its schema refuses
        answer = tool.at_once(ctx, args)
        return None if answer is None else {**answer, "logged": "one"}

    monkeypatch.setitem(REGISTRY, tool.name, dataclasses.replace(tool, at_once=broken))
    response = _append(client, plaintext, experiment.handle, 1)
    assert response.status_code == 500, response.content
    assert response.json()["error"]["code"] == "internal_error"
    assert "made its change" in response.json()["error"]["message"]
    assert set(MetricPoint.objects.filter(experiment=experiment).values_list("step", flat=True)) == {0, 1}
    assert Event.objects.filter(run=run, type="tool.called", arguments__status=200).count() == 2
    assert chain_verify(chain_key(run)).ok
