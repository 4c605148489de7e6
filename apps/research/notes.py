"""People's notes on a run and on its experiments: markdown, versioned, append-only.

A note is never edited in place: ``note_add`` writes the subject's next version under the run's
row lock, so a version number is taken once (the unique constraints are the backstop). Reads give
the newest version of each subject and its history; the run bundle carries every version
(apps.flows.bundle). Rendering to HTML is the page's (apps.dashboard.templatetags: raw HTML off).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.db import transaction
from django.db.models import Max

from apps.core.errors import ApplicationError
from apps.experiments.models import Experiment
from apps.research.models import Note, Run

NOTE_MAX_CHARS = 20_000


def note_add(
    *,
    run: Run,
    author: Any,
    text: str,
    experiment: Experiment | None = None,
    if_version_in: Collection[int] | None = None,
) -> Note:
    """Save a new version of the note on ``run`` (or on ``experiment`` of it); returns that version.

    ``if_version_in`` (an If-Match: the versions the writer read, 0 for no note yet) refuses the
    write with 412 ``precondition_failed`` when the newest version is not among them, checked under
    the lock that numbers the versions, so a lost update cannot slip between the check and the write.
    """
    text = text.strip()
    if not text:
        raise ApplicationError("note_empty", "A note needs some text.")
    if len(text) > NOTE_MAX_CHARS:
        raise ApplicationError("note_too_long", f"Keep a note under {NOTE_MAX_CHARS} characters.")
    if experiment is not None and experiment.run_id != run.pk:
        raise ApplicationError("not_in_run", f"{experiment.handle} is not an experiment of this run.")
    with transaction.atomic():
        # The run row lock serialises version numbers of every note of the run.
        Run.objects.select_for_update().only("pk").get(pk=run.pk)
        current = note_versions(run=run, experiment=experiment).aggregate(last=Max("version"))["last"] or 0
        if if_version_in is not None and current not in if_version_in:
            subject = experiment.handle if experiment is not None else "the run"
            raise ApplicationError(
                "precondition_failed",
                f"The note on {subject} changed since you read it (now version {current}); "
                "read it again and send its ETag in If-Match.",
                status=412,
                current_version=current,
            )
        note = Note(run=run, experiment=experiment, version=current + 1, author=author, text=text)
        note.full_clean()
        note.save()
    return note


def note_versions(*, run: Run, experiment: Experiment | None = None) -> Any:
    """Every version of the subject's note, newest first."""
    notes = Note.objects.filter(run=run, experiment=experiment).select_related("author")
    return notes.order_by("-version")


def notes_export(run: Run) -> list[dict[str, Any]]:
    """Every version of every note of the run, oldest first, as the bundle carries them."""
    notes = Note.objects.filter(run=run).select_related("author", "experiment").order_by("created_at", "pk")
    return [
        {"subject": note.experiment.handle if note.experiment is not None else "run", "version": note.version,
         "author": note.author.get_username(), "created_at": note.created_at.isoformat(), "text": note.text}
        for note in notes
    ]  # fmt: skip
