"""Input of the dashboard's few writes. Validation only; the services do the work."""

from __future__ import annotations

from typing import Any

from django import forms

from apps.benchmarks.models import Benchmark
from apps.dashboard.services import GUIDANCE_MAX_CHARS, RUN_ACTIONS
from apps.experiments.models import Checkpoint
from apps.integrity.choices import Adjudication, Observation
from apps.research.agent_config import DEFAULT_PROFILE, DEFAULT_SEARCH_POLICY, SEARCH_POLICIES, llm_profiles


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


class RunLabelForm(forms.Form):
    """Rename, tag or star a run; a field left out of the post is left as it is."""

    name = forms.CharField(max_length=200, required=False, strip=True)
    tags = forms.CharField(max_length=1000, required=False, help_text="comma-separated")
    starred = forms.ChoiceField(choices=[("", "keep"), ("1", "star"), ("0", "unstar")], required=False)

    def labels(self) -> dict[str, Any]:
        """The keyword arguments of ``run_label``: only what the post carried."""
        data, out = self.cleaned_data, {}
        if "name" in self.data:
            out["name"] = data["name"]
        if "tags" in self.data:
            out["tags"] = [t for t in data["tags"].split(",") if t.strip()]
        if data.get("starred") in ("0", "1"):
            out["starred"] = data["starred"] == "1"
        return out


SEED_MAX = 2**31 - 1
PARALLEL_MAX = 16
HEURISTIC = "heuristic"
LLM_PREFIX = "llm:"


def policy_choices() -> list[tuple[str, str]]:
    """The heuristic policy, then one LLM choice per configured endpoint profile, by name only."""
    return [(HEURISTIC, "heuristic (no LLM)")] + [
        (f"{LLM_PREFIX}{name}", f"LLM: {name} profile") for name in llm_profiles()
    ]


SEARCH_POLICY_LABELS = {"greedy": "greedy: expand the best line",
                        "uct": "uct: upper confidence bound; stagnant lines are left"}  # fmt: skip


class RunStartForm(forms.Form):
    """An operator's new run. Limits match the model and ``run_launch``; messages say what to change."""

    name = forms.CharField(max_length=200, required=False, strip=True, help_text="blank: benchmark and policy")
    benchmark = forms.ModelChoiceField(queryset=Benchmark.objects.order_by("name", "-version"), empty_label=None)
    base_checkpoint = forms.ModelChoiceField(
        queryset=Checkpoint.objects.filter(is_base=True).order_by("handle"),
        empty_label=None,
        label="Base model (θ0)",
        to_field_name="handle",
    )
    policy = forms.ChoiceField(choices=policy_choices)
    wall_seconds = forms.IntegerField(min_value=60, max_value=30 * 86400, initial=3600, label="Wall clock (s)")
    accelerator_seconds = forms.IntegerField(min_value=60, max_value=10**8, initial=3600, label="GPU-seconds")
    llm_tokens = forms.IntegerField(
        min_value=0, max_value=10**11, initial=0, label="LLM tokens", help_text="0 for the heuristic policy"
    )
    parallel = forms.IntegerField(min_value=1, max_value=PARALLEL_MAX, initial=2, label="Max parallel Workers")
    no_reviewer = forms.BooleanField(required=False, label="--no-reviewer (ablation: no Reviewers)")
    serial_workers = forms.BooleanField(required=False, label="--serial-workers (ablation: one Worker at a time)")
    gate = forms.BooleanField(required=False, label="Hold training for the Main Agent's approval")
    seed = forms.IntegerField(min_value=0, max_value=SEED_MAX, initial=0)
    search_policy = forms.ChoiceField(
        choices=[(name, SEARCH_POLICY_LABELS.get(name, name)) for name in SEARCH_POLICIES],
        initial=DEFAULT_SEARCH_POLICY,
        required=False,
        label="Search policy",
        help_text="how the Main Agent picks the node to expand and spends the Worker cap",
    )  # fmt: skip

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        policy = data.get("policy") or ""
        if policy.startswith(LLM_PREFIX) and not data.get("llm_tokens"):
            self.add_error("llm_tokens", "An LLM run needs a token budget above 0 (e.g. 2000000).")
        if data.get("serial_workers") and (data.get("parallel") or 1) > 1:
            self.add_error("parallel", "--serial-workers runs one Worker at a time: set max parallel Workers to 1.")
        return data

    def launch_arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``run_launch`` for this form's cleaned data."""
        data = self.cleaned_data
        policy = data["policy"]
        is_llm = policy.startswith(LLM_PREFIX)
        return {
            "name": data["name"],
            "benchmark": data["benchmark"],
            "base_checkpoint": data["base_checkpoint"],
            "policy": "llm" if is_llm else HEURISTIC,
            "llm_profile": policy[len(LLM_PREFIX) :] if is_llm else DEFAULT_PROFILE,
            "wall_seconds": data["wall_seconds"],
            "accelerator_seconds": data["accelerator_seconds"],
            "llm_tokens": data["llm_tokens"],
            "parallel": data["parallel"],
            "reviewer": not data["no_reviewer"],
            "serial_workers": data["serial_workers"],
            "gate": data["gate"],
            "seed": data["seed"],
            "search_policy": data["search_policy"] or DEFAULT_SEARCH_POLICY,
        }


class AblationLaunchForm(forms.Form):
    """The paper's ablation of one run, one click from the comparison page (a Dojo suite)."""

    run = forms.UUIDField()
    seeds = forms.IntegerField(min_value=1, max_value=20, initial=5, help_text="seeds 0 .. N-1, one run per arm each")
    max_concurrent = forms.IntegerField(min_value=1, max_value=8, initial=1, label="Runs at once")
    with_uct = forms.BooleanField(required=False, label="also the full system under the uct search policy")
