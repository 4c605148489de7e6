"""Admin helpers: the Django admin is a viewer for the records, not a way around the services.

Every record whose changes must be audited (scores, integrity status, the event log, checkpoints,
data entries, decisions, job transitions...) is registered with :class:`ReadOnlyAdmin`: its change
view shows the values, and adding, changing or deleting is refused (403 on a POST). The one edit
the admin offers, an integrity adjudication, goes through its service (``apps/integrity/admin.py``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models


class ReadOnlyAdmin(admin.ModelAdmin[models.Model]):
    """For records that change only through services, or never: the admin shows them and offers no edit.

    The database refuses the edits too where the record is append-only or a value is frozen
    (``apps.core.db``); this keeps the admin from offering a form that would bypass the audit.
    """

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


def register(*models_: type[models.Model], admin_class: type[admin.ModelAdmin[Any]] = admin.ModelAdmin) -> None:
    for model in models_:
        fields = [f.name for f in model._meta.fields if not f.is_relation or f.many_to_one][:8]
        attrs: dict[str, Any] = {"list_display": fields}
        if any(f.name == "created_at" for f in model._meta.fields):
            attrs["list_filter"] = ["created_at"]
        admin.site.register(model, type(f"{model.__name__}Admin", (admin_class,), attrs))
