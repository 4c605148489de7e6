"""The `expos` console script end to end: a real subprocess against the live server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from apps.research.models import Candidate, OptimizerClaim, ResearchNode

EXPOS = shutil.which("expos", path=str(Path(sys.executable).parent)) or "expos"


def expos(api, who: str | None, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RSI_TOKEN", "RSI_URL")}
    env["RSI_URL"] = api.base
    if who is not None:
        env["RSI_TOKEN"] = api.world.tokens[who]
    return subprocess.run([EXPOS, *args], env=env, input=stdin, capture_output=True, text=True, timeout=60)


def test_cli_lists_and_calls_tools_with_flags_and_json(api, world):
    listed = expos(api, "own", "tools")
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    assert "worker_finalize" in names
    assert "stop_loop" not in names  # a description may name it (run_result_policy); the tool is the Main's

    quota = expos(api, "own", "public_check_quota")
    assert quota.returncode == 0, quota.stderr
    assert json.loads(quota.stdout)["feedback_evals"]["used"] == 3

    tail = expos(api, "own", "events_tail", "--limit", "5", "--types", "tool.called", "--types", "job.succeeded")
    assert tail.returncode == 0, tail.stderr
    events = json.loads(tail.stdout)["events"]
    assert events
    assert all(e["type"] == "tool.called" for e in events)

    first = expos(api, "own", "worker_propose_candidate", "--title", "shorter prompts", "--idempotency-key", "c-1")
    second = expos(api, "own", "worker_propose_candidate", "--title", "shorter prompts", "--idempotency-key", "c-1")
    assert first.returncode == second.returncode == 0
    assert json.loads(first.stdout)["uuid"] == json.loads(second.stdout)["uuid"]
    assert Candidate.objects.filter(run=world.run, title="shorter prompts").count() == 1

    update = expos(
        api,
        "main",
        "main_optimizer_update",
        "--json",
        "-",
        stdin=json.dumps({"claims": [{"key": "data.size", "text": "more data helps"}]}),
    )
    assert update.returncode == 0, update.stderr
    assert OptimizerClaim.objects.get(run=world.run, key="data.size").revision == 1

    reviewer = expos(api, "main", "state_add_new_reviewer", "--question", "audit", "--scope", '["worker_0001"]')
    assert reviewer.returncode == 0, reviewer.stderr
    assert json.loads(reviewer.stdout)["scope"] == ["worker_0001"]
    assert ResearchNode.objects.filter(run=world.run, kind="reviewer", task="audit").exists()

    helped = expos(api, "own", "worker_finalize", "--help")
    assert helped.returncode == 0
    assert "--summary" in helped.stdout
    assert "--if-match" in helped.stdout


def test_cli_exits_non_zero_with_the_servers_message(api, world):
    missing = expos(api, "main", "state_inspect_worker", "--worker", "worker_9999")
    assert missing.returncode == 1
    assert "worker_9999" in missing.stderr.strip().splitlines()[-1]
    assert json.loads(missing.stderr.rsplit("expos:", 1)[0])["error"]["code"] == "unknown_worker"

    stale = expos(api, "own", "worker_finalize", "--summary", "s", "--experiments", "exp_0001", "--if-match", '"old"')
    assert stale.returncode == 1
    assert "HTTP 412" in stale.stderr

    invalid = expos(api, "own", "events_tail", "--limit", "0")
    assert invalid.returncode == 1
    assert "/limit" in invalid.stderr

    not_mine = expos(api, "own", "stop_loop", "--reason", "x")
    assert not_mine.returncode == 2
    assert "unknown tool" in not_mine.stderr

    no_token = expos(api, None, "tools")
    assert no_token.returncode == 2
    assert "RSI_TOKEN" in no_token.stderr
