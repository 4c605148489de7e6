"""Shared model bases."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.db import models


class BaseModel(models.Model):
    """Every table carries creation and update times, one convention for all (STYLE.md 1)."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class UUIDModel(BaseModel):
    """A model whose outside id is a UUID; the integer PK stays internal (STYLE.md 2)."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)

    class Meta:
        abstract = True


def clean_new_row(instance: models.Model, *, held: Iterable[str] = ()) -> None:
    """``full_clean()`` of a row about to be INSERTed, less the checks the INSERT itself makes.

    For the hot create paths (a submission, its job). Field validation — types, lengths, choices,
    blank and null — still runs and raises ValidationError (400 at the API). Skipped are the
    checks the database enforces on the same statement, each of which Django would otherwise run
    as a query of its own (a CheckConstraint inside a savepoint, three statements): unique
    fields and every ``Meta.constraints`` entry. A violation is refused all the same, as an
    IntegrityError (409 ``conflict`` at the tool API).

    ``held`` names foreign keys whose target the caller holds — read, usually row-locked, in the
    same transaction and protected from deletion — so their existence query is skipped too; the
    foreign-key constraint still backs it at commit.
    """
    instance.full_clean(exclude=list(held), validate_unique=False, validate_constraints=False)
