"""Admin helpers: append-only models are shown read-only; protected ones cannot be deleted."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models


class ReadOnlyAdmin(admin.ModelAdmin[models.Model]):
    """For append-only tables: the database refuses changes, so the admin offers none."""

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class NoDeleteAdmin(admin.ModelAdmin[models.Model]):
    """For records that are never deleted (experiments, checkpoints, datapool entries...)."""

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


def register(*models_: type[models.Model], admin_class: type[admin.ModelAdmin[Any]] = admin.ModelAdmin) -> None:
    for model in models_:
        fields = [f.name for f in model._meta.fields if not f.is_relation or f.many_to_one][:8]
        attrs: dict[str, Any] = {"list_display": fields}
        if any(f.name == "created_at" for f in model._meta.fields):
            attrs["list_filter"] = ["created_at"]
        admin.site.register(model, type(f"{model.__name__}Admin", (admin_class,), attrs))
