"""Issue or revoke an agent token, e.g. for an external harness (docs/expos-cli.md).

manage.py expos_token --run <run uuid> --node worker_0002          # prints the token once
manage.py expos_token --run <run uuid> --node main --days 3
manage.py expos_token --revoke <token prefix> --run <run uuid>
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from apps.expos.auth import agent_token_issue, agent_token_revoke
from apps.expos.models import AgentToken
from apps.research.models import ResearchNode, Run


class Command(BaseCommand):
    help = "Issue (or revoke) an agent token bound to a run's research node and its role."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--run", required=True, help="the run's uuid")
        parser.add_argument("--node", help="the node's handle: main, worker_0002, reviewer_0001")
        parser.add_argument("--days", type=float, default=7.0, help="lifetime; it also ends with the run")
        parser.add_argument("--revoke", metavar="PREFIX", help="revoke the run's token(s) with this prefix")

    def handle(self, *args: Any, **options: Any) -> None:
        run = Run.objects.filter(uuid=options["run"]).first()
        if run is None:
            raise CommandError(f"no run {options['run']}")
        if options["revoke"]:
            tokens = list(AgentToken.objects.filter(run=run, prefix=options["revoke"], revoked_at__isnull=True))
            if not tokens:
                raise CommandError(f"no live token with prefix {options['revoke']!r} in this run")
            for token in tokens:
                agent_token_revoke(token=token, actor="cli", reason="revoked with manage.py expos_token")
            self.stdout.write(f"revoked {len(tokens)} token(s)")
            return
        node = ResearchNode.objects.filter(run=run, handle=options["node"]).first()
        if node is None:
            raise CommandError(f"no node {options['node']!r} in run {run.uuid}")
        expires = timezone.now() + timedelta(days=options["days"])
        plaintext, _ = agent_token_issue(run=run, node=node, role=node.kind, expires_at=expires, actor="cli")
        self.stdout.write(plaintext)
