"""Benchmarks in the admin: read-only records, plus one page that registers a benchmark from files.

A benchmark is never edited here (its hashes are its identity); the "Add from local files" page
calls the same service as ``manage.py benchmark_add`` (apps/benchmarks/adding.py), which refuses
data without ids, duplicate ids, a split below the minimum or implicit decoding with a message
shown on the form, and writes nothing in that case.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from apps.benchmarks import models as m
from apps.benchmarks.adding import benchmark_add, min_split_samples
from apps.core.admin import ReadOnlyAdmin
from apps.core.errors import ApplicationError
from apps.ml import evaluators

DECODING_EXAMPLE = '{"temperature": 0, "top_p": 1, "max_tokens": 512, "stop": [], "seed_policy": "greedy-single-seed"}'


def _json_object(value: str, *, label: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value or "{}")
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(f"{label} is not JSON: {exc.msg}") from None
    if not isinstance(parsed, dict):
        raise forms.ValidationError(f"{label} must be a JSON object")
    return parsed


class BenchmarkAddForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="e.g. gsm8k/main")
    evaluator = forms.ChoiceField(choices=[(n, n) for n in evaluators.CONTRACTS])
    feedback = forms.FileField(help_text="JSONL, one sample a line (the split Workers get aggregates of)")
    final = forms.FileField(help_text="JSONL (the untouched split the run reports)")
    decoding = forms.CharField(initial=DECODING_EXAMPLE, widget=forms.Textarea(attrs={"rows": 2}))
    prompt_template = forms.CharField(initial="{question}", widget=forms.Textarea(attrs={"rows": 2}))
    use_chat_template = forms.BooleanField(required=False)
    id_field = forms.CharField(initial="id")
    prompt_field = forms.CharField(initial="prompt")
    answer_fields = forms.CharField(initial="answer", help_text="one field, or several joined by commas")
    inspect_task = forms.CharField(required=False, help_text="inspect_evals/<task>; empty: the built-in adapter")
    inspect_task_args = forms.CharField(required=False, initial="{}")
    posttrainbench_name = forms.CharField(required=False, help_text="gsm8k, humaneval, bfcl... (suite weight)")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    def clean_decoding(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data["decoding"], label="decoding")

    def clean_inspect_task_args(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data["inspect_task_args"], label="inspect task args")


@admin.register(m.Benchmark)
class BenchmarkAdmin(ReadOnlyAdmin):
    list_display = ["name", "version", "evaluator", "task", "contract_sha256", "created_at"]
    list_filter = ["created_at"]
    change_list_template = "admin/benchmarks/benchmark/change_list.html"

    def get_urls(self) -> list[URLPattern]:
        add = path(
            "add-from-files/",
            self.admin_site.admin_view(self.add_from_files),
            name="benchmarks_benchmark_add_from_files",
        )
        return [add, *super().get_urls()]

    def add_from_files(self, request: HttpRequest) -> HttpResponse:
        if not request.user.is_superuser:
            raise PermissionDenied("only an admin registers benchmarks")
        form = BenchmarkAddForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            with tempfile.TemporaryDirectory(prefix="rsiweb-admin-benchmark-") as tmp:
                files = {}
                for split in ("feedback", "final"):
                    files[split] = Path(tmp) / f"{split}.jsonl"
                    files[split].write_bytes(b"".join(data[split].chunks()))
                try:
                    benchmark = benchmark_add(
                        name=data["name"], feedback_file=files["feedback"], final_file=files["final"],
                        evaluator=data["evaluator"], decoding=data["decoding"], prompt_template=data["prompt_template"],
                        use_chat_template=data["use_chat_template"], id_field=data["id_field"],
                        prompt_field=data["prompt_field"],
                        answer_fields=[f.strip() for f in data["answer_fields"].split(",") if f.strip()],
                        inspect_task=data["inspect_task"] or None, inspect_task_args=data["inspect_task_args"],
                        posttrainbench_name=data["posttrainbench_name"] or None, description=data["description"],
                    )  # fmt: skip
                except ApplicationError as exc:
                    form.add_error(None, exc.message)
                else:
                    messages.success(request, f"Registered {benchmark.name}@{benchmark.version}.")
                    return HttpResponseRedirect(reverse("admin:benchmarks_benchmark_change", args=[benchmark.pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": "Add a benchmark from local files",
            "form": form,
            "opts": self.model._meta,
            "min_split_samples": min_split_samples(),
        }
        return TemplateResponse(request, "admin/benchmarks/benchmark/add_from_files.html", context)
