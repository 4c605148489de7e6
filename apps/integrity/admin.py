from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpResponse, HttpResponseRedirect

from apps.core.admin import ReadOnlyAdmin, register
from apps.core.errors import ApplicationError
from apps.integrity import models as m
from apps.integrity.choices import Adjudication, Observation
from apps.integrity.services import finding_adjudicate


class AdjudicationForm(forms.ModelForm[m.IntegrityFinding]):
    """An admin's override of one finding: a new adjudication (and optionally observation) with a reason."""

    new_adjudication = forms.ChoiceField(choices=[("", "— keep —"), *Adjudication.choices], required=False)
    new_observation = forms.ChoiceField(choices=[("", "— keep —"), *Observation.choices], required=False)
    reason = forms.CharField(widget=forms.Textarea, required=False, help_text="Required; part of the audit record.")

    class Meta:
        model = m.IntegrityFinding
        fields: list[str] = []

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not (data.get("new_adjudication") or data.get("new_observation")):
            # Nothing else on a finding is editable; a bare "Save" must not read as a change.
            raise forms.ValidationError("Choose a new adjudication or observation; nothing else can be changed.")
        if not (data.get("reason") or "").strip():
            raise forms.ValidationError("An override needs a reason.")
        return data


class IntegrityFindingAdmin(admin.ModelAdmin[m.IntegrityFinding]):
    """Findings change only through ``finding_adjudicate`` (audited: FindingChange, event, status); never deleted."""

    form = AdjudicationForm
    list_display = ["experiment", "node", "subcategory", "observation", "adjudication", "decided_by", "updated_at"]
    list_filter = ["subcategory", "observation", "adjudication"]
    readonly_fields = [
        "experiment",
        "node",
        "subcategory",
        "observation",
        "adjudication",
        "decided_by",
        "rationale",
        "evidence",
    ]
    fields = [*readonly_fields, "new_adjudication", "new_observation", "reason"]

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def save_model(self, request: Any, obj: m.IntegrityFinding, form: Any, change: bool) -> None:
        data = form.cleaned_data
        try:
            finding_adjudicate(
                finding=obj,
                adjudication=data.get("new_adjudication") or obj.adjudication,
                actor=f"user:{request.user.get_username()}",
                rationale=data["reason"],
                observation=data.get("new_observation") or None,
            )
        except ApplicationError as exc:
            # The service refused (and changed nothing): say so, and neither log nor announce a change.
            request.adjudication_refused = True
            messages.error(request, exc.message)

    def log_change(self, request: Any, obj: Any, message: Any) -> Any:
        if getattr(request, "adjudication_refused", False):
            return None
        return super().log_change(request, obj, message)

    def response_change(self, request: Any, obj: m.IntegrityFinding) -> HttpResponse:
        if getattr(request, "adjudication_refused", False):
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)


admin.site.register(m.IntegrityFinding, IntegrityFindingAdmin)
# Overrides are granted through main_submit_review_override (audited); the admin only shows them.
register(m.ReviewOverride, m.FindingChange, m.BlockedAttempt, admin_class=ReadOnlyAdmin)
