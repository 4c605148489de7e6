"""Shared model bases."""

from __future__ import annotations

import uuid

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
