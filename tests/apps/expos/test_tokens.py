"""Agent token services and the expos_token command (no server needed)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from rest_framework.exceptions import AuthenticationFailed

from apps.core.errors import ApplicationError
from apps.expos.auth import agent_token_issue, agent_token_resolve, token_digest
from apps.expos.models import AgentToken
from apps.research.choices import NodeKind, RunStatus
from apps.research.models import ResearchNode
from apps.research.services import node_create, run_set_status
from tests.factories import make_run


@pytest.fixture
def started(db):
    run = make_run()
    return run_set_status(run=run, status=RunStatus.RUNNING, actor="test")


def test_issue_stores_only_a_digest_and_resolves(started):
    main = ResearchNode.objects.get(run=started, kind=NodeKind.MAIN)
    plaintext, token = agent_token_issue(run=started, node=main, role="main")
    assert len(plaintext) >= 43
    assert token.digest == token_digest(plaintext)
    assert token.prefix == plaintext[:8]
    assert not AgentToken.objects.filter(digest=plaintext).exists()
    assert agent_token_resolve(plaintext).pk == token.pk


def test_issue_refuses_a_role_the_node_does_not_have_and_a_foreign_node(started):
    worker = node_create(run=started, kind=NodeKind.WORKER, task="t")
    with pytest.raises(ApplicationError) as refused:
        agent_token_issue(run=started, node=worker, role="main")
    assert refused.value.code == "role_mismatch"
    other_run = make_run(name="other")
    with pytest.raises(ApplicationError) as foreign:
        agent_token_issue(run=other_run, node=worker, role="worker")
    assert foreign.value.code == "foreign_node"


def test_tokens_of_a_finished_run_do_not_resolve_and_none_are_issued(started):
    main = ResearchNode.objects.get(run=started, kind=NodeKind.MAIN)
    plaintext, _ = agent_token_issue(run=started, node=main, role="main")
    finished = run_set_status(run=started, status=RunStatus.FINISHED, actor="test")
    with pytest.raises(AuthenticationFailed):
        agent_token_resolve(plaintext)
    with pytest.raises(ApplicationError):
        agent_token_issue(run=finished, node=main, role="main")


def test_expos_token_command_issues_and_revokes(started):
    out = StringIO()
    call_command("expos_token", "--run", str(started.uuid), "--node", "main", stdout=out)
    plaintext = out.getvalue().strip()
    token = agent_token_resolve(plaintext)
    assert token.expires_at is not None
    # "=" keeps a prefix that starts with "-" (token_urlsafe may) from reading as an option.
    call_command("expos_token", "--run", str(started.uuid), f"--revoke={plaintext[:8]}", stdout=StringIO())
    with pytest.raises(AuthenticationFailed):
        agent_token_resolve(plaintext)
