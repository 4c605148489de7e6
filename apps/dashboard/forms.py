"""Input of the dashboard's few writes. Validation only; the services do the work."""

from __future__ import annotations

from django import forms

from apps.dashboard.services import GUIDANCE_MAX_CHARS, RUN_ACTIONS
from apps.integrity.choices import Adjudication, Observation


class GuidanceForm(forms.Form):
    text = forms.CharField(
        max_length=GUIDANCE_MAX_CHARS,
        strip=True,
        widget=forms.Textarea(
            attrs={"rows": 3, "placeholder": "e.g. Try a DPO branch on the cleaned arithmetic data before more SFT."}
        ),
    )


class RunControlForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, a) for a in RUN_ACTIONS])
    reason = forms.CharField(max_length=500, required=False, strip=True)


class AdjudicationForm(forms.Form):
    adjudication = forms.ChoiceField(choices=Adjudication.choices)
    # Blank keeps the recorded observation; a value records what the admin observed themselves.
    observation = forms.ChoiceField(choices=[("", "keep observation"), *Observation.choices], required=False)
    # Required: the reason is what the audit trail keeps next to the decision.
    rationale = forms.CharField(min_length=10, max_length=4000, strip=True, widget=forms.Textarea(attrs={"rows": 2}))
