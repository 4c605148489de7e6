"""Export recorded transcripts as a TRL conversational dataset in the datapool (RSI-Dojo).

It lives in apps.expos because the tools column comes from the tool registry, which the domain
apps (apps.dojo among them) may not import; the work is apps.dojo.export.trajectory_export.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.errors import ApplicationError
from apps.dojo.export import TRL_DEFAULT_MAX_LENGTH, finished_runs, trajectory_export
from apps.expos.api.dojo import runs_by_uuid, tool_definitions
from apps.ml.chat_render import ChatTemplateError, load_chat_tokenizer


def _table(report: dict[str, Any]) -> list[str]:
    applied = set(report.get("filters_applied", []))
    lines = [f"{'filter':<40} {'removed':>8}  applied", f"{'-' * 40} {'-' * 8}  -------"]
    for name, removed in report["removed_by"].items():
        lines.append(f"{name:<40} {removed:>8}  {'yes' if name in applied else 'no'}")
    kept = report["kept"]
    lines.append(
        f"trajectories {report['trajectories']}; kept with behaviour filters only {kept['behaviour_only']}, "
        f"outcome only {kept['outcome_only']}, both {kept['both']}"
    )
    return lines


class Command(BaseCommand):
    help = (
        "Export the transcripts of runs (Main Agent, Workers and Reviewers; a Reviewer's sealed-adjacent evidence "
        "withheld as [sealed]) as one datapool entry of format chat: "
        "one TRL prompt-completion row per trained assistant message, with the tool registry's schemas of the "
        "tools called, metadata and (with --tokenizer) each row's token count. Prints how many trajectories "
        "each filter removed and the entry's handle."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--run", action="append", default=[], metavar="UUID",
                           help="a run to export (repeat, or separate uuids by commas)")  # fmt: skip
        which.add_argument("--all-finished", action="store_true", help="every finished run")
        parser.add_argument("--filters", default="all",
                            help="comma-separated detectors (name or name@version) or all, none, behaviour, "
                                 "outcome (default: all)")  # fmt: skip
        parser.add_argument("--name", default="trajectories", help="the datapool entry's name")
        parser.add_argument("--tokenizer", metavar="DIR",
                            help="a tokenizer folder (tokenizer.json and a chat template, as save_pretrained "
                                 "writes them): each row states its token count under it (docs/export.md)")  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        if options["all_finished"]:
            runs = finished_runs()
            if not runs:
                raise CommandError("there is no finished run to export yet")
        else:
            values = [v.strip() for item in options["run"] for v in item.split(",") if v.strip()]
            bad = [v for v in values if not _is_uuid(v)]
            if bad or not values:
                raise CommandError(f"--run takes run uuids; not a uuid: {', '.join(bad) or '(empty)'}")
            try:
                runs = runs_by_uuid(values)
            except ApplicationError as exc:
                raise CommandError(exc.message) from exc
        tokenizer = None
        if options["tokenizer"]:
            try:
                tokenizer = load_chat_tokenizer(options["tokenizer"])
            except ChatTemplateError as exc:
                raise CommandError(f"--tokenizer: {exc}") from exc
        try:
            result = trajectory_export(
                runs=runs, name=options["name"], filters=options["filters"], tool_definitions=tool_definitions,
                tokenizer=tokenizer, actor="manage.py export_trajectories",
            )  # fmt: skip
        except ApplicationError as exc:
            if "report" in exc.detail:
                self.stdout.write("\n".join(_table(exc.detail["report"])))
            raise CommandError(exc.message) from exc
        report = result.report
        self.stdout.write("\n".join(_table(report)))
        entry = result.entry
        self.stdout.write(
            f"exported {report['examples']} rows (one per trained assistant message) from "
            f"{len(report['exported_runs'])} run(s) ({report['turns']} turns, {report['reviewer_turns']} of them "
            f"Reviewers'; sealed values withheld from Reviewer messages: {report['reviewer_values_withheld']})"
        )
        tokens = report["tokens"]
        if tokens is not None:
            over = tokens[f"rows_over_{TRL_DEFAULT_MAX_LENGTH}"]
            self.stdout.write(
                f"tokens under {tokens['name']}: longest row {tokens['max']}, {tokens['total']} in all, {over} row(s) "
                f"over TRL's default max_length {TRL_DEFAULT_MAX_LENGTH}"
            )
        self.stdout.write(self.style.SUCCESS(f"registered {entry.handle} ({entry.uuid}) sha256 {entry.sha256}"))


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
