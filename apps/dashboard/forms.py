"""Input of the dashboard's few writes. Validation only; the services do the work."""

from __future__ import annotations

import math
from typing import Any

from django import forms

from apps.alerts.choices import AlertChannel, AlertTrigger
from apps.alerts.services import TRIGGER_LABELS
from apps.benchmarks.models import Benchmark
from apps.dashboard.services import GUIDANCE_MAX_CHARS, RUN_ACTIONS
from apps.experiments.models import Checkpoint
from apps.integrity.choices import Adjudication, Observation
from apps.ml.hparams import LR_SCHEDULERS
from apps.research.agent_config import DEFAULT_PROFILE, DEFAULT_SEARCH_POLICY, SEARCH_POLICIES, llm_profiles
from apps.research.notes import NOTE_MAX_CHARS


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
WORKERS_MAX = 64
STEPS_MAX = 5000  # apps.ml.hparams' bound of max_steps
BATCH_MAX = 256
LEARNING_RATE_MAX = 1e-2
HEURISTIC_FIELDS = ("max_workers", "screen_steps", "train_steps", "learning_rate", "lr_scheduler_type", "batch_size")
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
    # The heuristic policy's settings (``policy.heuristic`` of the run; run_launch's defaults).
    # Blank keeps the default, so the short form still starts a run; bounds are apps.ml.hparams'.
    max_workers = forms.IntegerField(min_value=1, max_value=WORKERS_MAX, required=False, label="Workers",
                                     help_text="Workers the heuristic spawns in all (default 4)")  # fmt: skip
    screen_steps = forms.IntegerField(min_value=1, max_value=STEPS_MAX, required=False, label="Screening steps",
                                      help_text="training steps of a screening experiment (default 60)")  # fmt: skip
    train_steps = forms.IntegerField(min_value=1, max_value=STEPS_MAX, required=False, label="Training steps",
                                     help_text="training steps of a full experiment (default 200)")  # fmt: skip
    learning_rate = forms.FloatField(min_value=0.0, max_value=LEARNING_RATE_MAX, required=False, label="Learning rate",
                                     help_text="above 0, at most 0.01 (default 0.002)")  # fmt: skip
    batch_size = forms.IntegerField(min_value=1, max_value=BATCH_MAX, required=False, label="Batch size",
                                    help_text="default 64")  # fmt: skip
    lr_scheduler_type = forms.ChoiceField(choices=[("", "default (cosine)"), *((n, n) for n in LR_SCHEDULERS)],
                                          required=False, label="Learning-rate schedule",
                                          help_text="of every training the heuristic submits")  # fmt: skip

    def clean_learning_rate(self) -> float | None:
        value: float | None = self.cleaned_data.get("learning_rate")
        if value is not None and (value <= 0 or not math.isfinite(value)):
            raise forms.ValidationError("The learning rate must be above 0 (e.g. 0.002).")
        return value

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
            # Only what the person set: a blank field keeps run_launch's default.
            **{key: data[key] for key in HEURISTIC_FIELDS if data.get(key) not in (None, "")},
        }

    @classmethod
    def initial_from_run(cls, run: Any) -> tuple[dict[str, Any], list[str]]:
        """Every setting of ``run`` as this form's initial values ("clone this run"), and notes.

        The notes name what the form cannot carry over (an external harness run's agents, an
        LLM profile not configured here, a suite's extra heuristic switches), so a clone never
        silently differs from its original.
        """
        policy = run.policy or {}
        heuristic = dict(policy.get("heuristic") or {})
        notes = []
        profile = policy.get("llm_profile") or DEFAULT_PROFILE
        if run.agent_mode == "llm":
            choice = f"{LLM_PREFIX}{profile}"
            if choice not in dict(policy_choices()):
                notes.append(f"The LLM profile {profile!r} of the original is not configured here: choose a policy.")
        else:
            choice = HEURISTIC
            if run.agent_mode != HEURISTIC:
                notes.append(f"The original's agents were {run.agent_mode} (outside harnesses); the clone uses ours.")
        extra = sorted(set(heuristic) - set(HEURISTIC_FIELDS))
        if extra:
            notes.append(f"Not carried over (the form has no field for it): heuristic {', '.join(extra)}.")
        initial = {
            "name": f"{run.name} (re-run)"[:200],
            "benchmark": run.benchmark_id,
            "base_checkpoint": run.base_checkpoint.handle,
            "policy": choice,
            "wall_seconds": run.budget_wall_seconds,
            "accelerator_seconds": run.budget_accelerator_seconds,
            "llm_tokens": run.budget_llm_tokens,
            "parallel": run.max_parallel_workers,
            "no_reviewer": policy.get("reviewers") is False,
            "serial_workers": bool(policy.get("serial_workers")),
            "gate": bool(policy.get("training_gate")),
            "seed": policy.get("seed", 0),
            "search_policy": run.search_policy or DEFAULT_SEARCH_POLICY,
            **{key: heuristic[key] for key in HEURISTIC_FIELDS if key in heuristic},
        }
        return initial, notes


class AblationLaunchForm(forms.Form):
    """The paper's ablation of one run, one click from the comparison page (a Dojo suite)."""

    run = forms.UUIDField()
    seeds = forms.IntegerField(min_value=1, max_value=20, initial=5, help_text="seeds 0 .. N-1, one run per arm each")
    max_concurrent = forms.IntegerField(min_value=1, max_value=8, initial=1, label="Runs at once")
    with_uct = forms.BooleanField(required=False, label="also the full system under the uct search policy")


class AlertRuleForm(forms.Form):
    """A person's alert: where (Slack or Discord webhook, or e-mail), on what, for one run or all."""

    channel = forms.ChoiceField(choices=AlertChannel.choices)
    target = forms.CharField(max_length=500, strip=True, label="Webhook URL or e-mail address")
    triggers = forms.MultipleChoiceField(choices=[(t, TRIGGER_LABELS[t]) for t in AlertTrigger],
                                         widget=forms.CheckboxSelectMultiple, label="Tell me when")  # fmt: skip
    run = forms.UUIDField(required=False, help_text="blank: every run you can see")


class NoteForm(forms.Form):
    """A new version of the note on a run or on one of its experiments (markdown)."""

    text = forms.CharField(max_length=NOTE_MAX_CHARS, strip=True, widget=forms.Textarea(attrs={"rows": 5}))
    experiment = forms.CharField(max_length=64, required=False, widget=forms.HiddenInput)
