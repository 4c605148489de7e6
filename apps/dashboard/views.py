"""Dashboard pages: server-rendered, with live parts fed by the websocket (apps.dashboard.consumers).

Views are thin: a role check, a selector for the reads, a form and one service for the writes.
Writes answer JSON to the pages' scripts (``Accept: application/json``) and redirect back
otherwise, so every form also works without JavaScript.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from apps.benchmarks.build_progress import build_progress_read
from apps.core.errors import ApplicationError, NotFound
from apps.dashboard import selectors, workbench
from apps.dashboard.charts import hardware_figure, run_charts
from apps.dashboard.comparison import COMPARE_MAX_RUNS, is_uuid, run_ablation_view, run_comparison, runs_by_uuid
from apps.dashboard.filters import RunFilter
from apps.dashboard.forms import (
    AblationLaunchForm,
    AdjudicationForm,
    AlertRuleForm,
    GuidanceForm,
    NoteForm,
    RunControlForm,
    RunLabelForm,
    RunStartForm,
)
from apps.dashboard.permissions import (
    ADMIN,
    OPERATOR,
    VIEWER,
    can_adjudicate,
    can_steer,
    can_view_run,
    role_required,
    user_role,
)
from apps.dashboard.services import (
    alert_rule_create_for_person,
    alert_rule_delete_for_person,
    finding_adjudicate_for_person,
    guidance_post,
    note_add_for_person,
    run_control,
    run_label_for_person,
    run_start_for_person,
)
from apps.datapool.selectors import data_entry_get, data_entry_list
from apps.dojo.agents import ABLATION_AGENTS
from apps.dojo.models import AgentSuite
from apps.dojo.suite_stats import suite_stats
from apps.dojo.suites import ablation_suite_create, suite_launch
from apps.experiments.models import Checkpoint
from apps.flows.bundle import bundle_archive, export_run_bundle
from apps.flows.reports import report_payload
from apps.jobs.selectors import job_attempts, job_hardware
from apps.research.choices import RUN_TERMINAL_STATES
from apps.research.models import Run
from apps.research.notes import note_versions
from apps.research.selectors import run_ablation, run_job_health
from apps.reviews.services import LIST_FIELDS


def _run_or_404(request: HttpRequest, run_uuid: Any) -> Run:
    run = selectors.run_get(run_uuid)
    if run is None:
        raise Http404("No such run.")
    if not can_view_run(request.user, run):
        raise PermissionDenied("You may not watch this run.")
    return run


def _wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def _refused(request: HttpRequest, error: ApplicationError, back: str) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse({"code": error.code, "message": error.message}, status=error.status_code)
    messages.error(request, error.message)
    return redirect(back)


def _invalid(request: HttpRequest, form: Any, back: str) -> HttpResponse:
    text = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items())
    if _wants_json(request):
        return JsonResponse({"code": "invalid", "message": text, "fields": form.errors}, status=400)
    messages.error(request, text)
    return redirect(back)


def _page(request: HttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    role = user_role(request.user)
    return render(
        request,
        template,
        {**context, "role": role, "can_steer": can_steer(request.user), "can_adjudicate": can_adjudicate(request.user)},
    )


# --- runs --------------------------------------------------------------------------------------

RUN_LIST_LIMIT = 200


def _run_table(request: HttpRequest) -> tuple[RunFilter, workbench.RunTable]:
    """The runs list's filters, query, sort and columns read from the GET parameters.

    Raises ApplicationError (400) for any parameter it cannot read, before anything is shown.
    """
    filters = RunFilter(request.GET or None, queryset=selectors.run_list())
    if filters.is_bound and not filters.is_valid():
        text = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in filters.errors.items())
        raise ApplicationError("invalid_filter", text)
    selected = request.GET.getlist("runs")
    if request.GET.get("selection") and not selected:
        raise ApplicationError("no_selection", "Tick at least one run first.")
    runs = filters.qs
    if selected:
        valid = [uuid for uuid in selected if is_uuid(uuid)]
        if len(valid) != len(selected):
            raise ApplicationError("invalid_selection", "runs: every selected run is named by its uuid.")
        runs = runs.filter(uuid__in=valid)
    table = workbench.run_table(
        list(runs[:RUN_LIST_LIMIT]),
        query=request.GET.get("query", ""),
        sort=request.GET.get("sort", ""),
        columns=request.GET.getlist("col"),
    )
    return filters, table


@require_GET
@role_required(VIEWER)
def run_list_view(request: HttpRequest) -> HttpResponse:
    """The runs table: filters (django-filter), a query by value, sortable and choosable columns."""
    error, status = "", 200
    try:
        filters, table = _run_table(request)
    except ApplicationError as refused:
        filters = RunFilter(request.GET or None, queryset=selectors.run_list())
        error, status, table = refused.message, refused.status_code, workbench.RunTable.empty()
    in_flight = selectors.runs_accelerator_in_flight(table.runs)
    flags = selectors.runs_flag_reasons(table.runs)
    rows = [
        {"run": run, "values": values, "ablation": run_ablation(run), "flags": flags[run.pk],
         "bars": selectors.run_budget_bars(run, in_flight=in_flight.get(run.pk, 0.0)),
         "cells": [workbench.cell(column.key, values) for column in table.columns]}
        for run, values in zip(table.runs, table.rows, strict=True)
    ]  # fmt: skip
    headers = []
    for column in table.columns:
        params = request.GET.copy()
        params["sort"] = table.sort_link(column.key)
        arrow = ("▼" if table.descending else "▲") if table.sort == column.key else ""
        headers.append({"column": column, "url": f"?{params.urlencode()}", "arrow": arrow})
    response = _page(
        request,
        "dashboard/run_list.html",
        {
            "rows": rows, "filters": filters, "filtered": bool(request.GET), "compare_max": COMPARE_MAX_RUNS,
            "table": table, "headers": headers, "error": error, "query_help": workbench.QUERY_HELP,
            "export_query": request.GET.urlencode(),
        },
    )  # fmt: skip
    response.status_code = status
    return response


@require_GET
@role_required(VIEWER)
def runs_export_view(request: HttpRequest, fmt: str) -> HttpResponse:
    """runs × parameters × metrics as CSV or Parquet: the runs list's filters, query and order, or
    only the runs ticked (``runs=<uuid>`` repeated)."""
    if fmt not in ("csv", "parquet"):
        raise Http404("Exports are .csv or .parquet.")
    try:
        _filters, table = _run_table(request)
    except ApplicationError as error:
        return JsonResponse({"code": error.code, "message": error.message}, status=error.status_code)
    if fmt == "csv":
        response = HttpResponse(workbench.rows_csv(table.rows), content_type="text/csv; charset=utf-8")
    else:
        response = HttpResponse(workbench.rows_parquet(table.rows), content_type="application/vnd.apache.parquet")
    response["Content-Disposition"] = f'attachment; filename="runs.{fmt}"'
    return response


@require_GET
@role_required(VIEWER)
def run_compare_view(request: HttpRequest) -> HttpResponse:
    """Runs side by side: ``?runs=<uuid>&runs=<uuid>...`` (the runs list's checkboxes)."""
    runs = runs_by_uuid(request.GET.getlist("runs")[:COMPARE_MAX_RUNS])
    if len(runs) < 2:
        messages.error(request, "Select two or more runs to compare.")
        return redirect("dashboard:run-list")
    comparison = run_comparison(runs)
    flags = selectors.runs_flag_reasons(runs)
    for column in comparison["columns"]:
        column["flags"] = flags[column["run"].pk]
    ablation_form = AblationLaunchForm(initial={"run": runs[0].uuid, "seeds": 5, "max_concurrent": 1})
    return _page(
        request,
        "dashboard/run_compare.html",
        {**comparison, "runs": runs, "show_all": request.GET.get("config") == "all", "ablation_form": ablation_form},
    )


@require_GET
@role_required(VIEWER)
def run_ablation_page_view(request: HttpRequest) -> HttpResponse:
    """The paper's ablation: full vs --serial-workers vs --no-reviewer at equal budget, over seeds.

    Takes the runs list's filters (benchmark, status, tag, ...), so one click keeps the selection.
    """
    filters = RunFilter(request.GET or None, queryset=selectors.run_list())
    groups = run_ablation_view(filters.qs[:RUN_LIST_LIMIT])
    return _page(request, "dashboard/run_ablation.html", {"groups": groups, "query": request.GET.urlencode()})


@require_POST
@role_required(OPERATOR)
def run_ablation_launch_view(request: HttpRequest) -> HttpResponse:
    """One click from the comparison page: the paper's ablation of a run, as an agent suite.

    Full, --serial-workers and --no-reviewer at the run's benchmark, θ0 and budget, seeds 0..N-1
    (apps.dojo.suites.ablation_suite_create); the suite page follows it, the ablation page groups it.
    """
    form = AblationLaunchForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(f"{k}: {' '.join(str(e) for e in v)}" for k, v in form.errors.items()))
        return redirect("dashboard:run-list")
    run = Run.objects.filter(uuid=form.cleaned_data["run"]).select_related("benchmark", "base_checkpoint").first()
    if run is None:
        messages.error(request, "No such run.")
        return redirect("dashboard:run-list")
    back = reverse("dashboard:run-detail", kwargs={"run_uuid": run.uuid})
    actor = f"user:{request.user.get_username()}"
    try:
        suite = ablation_suite_create(run=run, seeds=list(range(form.cleaned_data["seeds"])),
                                      max_concurrent=form.cleaned_data["max_concurrent"], created_by=request.user,
                                      actor=actor,
                                      search_policies=("uct",) if form.cleaned_data["with_uct"] else ())  # fmt: skip
        suite = suite_launch(suite=suite, actor=actor)
    except ApplicationError as error:
        messages.error(request, error.message)
        return redirect(back)
    messages.success(request, f"Ablation suite {suite.name!r} started: {len(suite.agents)} arms x "
                              f"{form.cleaned_data['seeds']} seeds.")  # fmt: skip
    return redirect("dashboard:suite-detail", suite_uuid=suite.uuid)


@require_POST
@role_required(OPERATOR)
def run_label_view(request: HttpRequest, run_uuid: Any) -> HttpResponse:
    """Rename, tag or star a run (operators); answers the run's new labels."""
    run = _run_or_404(request, run_uuid)
    back = request.POST.get("next") or reverse("dashboard:run-list")
    if not back.startswith("/") or back.startswith("//"):
        back = reverse("dashboard:run-list")
    form = RunLabelForm(request.POST)
    if not form.is_valid():
        return _invalid(request, form, back)
    try:
        labelled = run_label_for_person(run=run, user=request.user, **form.labels())
    except ApplicationError as error:
        return _refused(request, error, back)
    if _wants_json(request):
        return JsonResponse({"name": labelled.name, "tags": labelled.tags, "starred": labelled.starred})
    messages.success(request, f"Run {labelled.name!r} updated.")
    return redirect(back)


@role_required(OPERATOR)
def run_start_view(request: HttpRequest) -> HttpResponse:
    """Start a run from the browser (operators): the form, then the service start_run calls.

    ``?clone=<run uuid>`` ("re-run with changes") fills the form with every setting of that run;
    nothing is created until the person submits it.
    """
    clone, status = None, 200
    notes: list[str] = []
    if request.method == "GET" and "clone" in request.GET:
        try:
            clone = selectors.run_get(request.GET["clone"])
        except ValidationError:  # not a uuid
            clone = None
        if clone is None or not can_view_run(request.user, clone):
            messages.error(request, f"No run {request.GET['clone'][:64]!r} to clone: the form starts blank.")
            clone, status = None, 404
    if clone is not None:
        initial, notes = RunStartForm.initial_from_run(clone)
        form = RunStartForm(initial=initial)
    else:
        form = RunStartForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            run = run_start_for_person(user=request.user, **form.launch_arguments())
        except ApplicationError as error:
            form.add_error(None, error.message)
        else:
            messages.success(request, f"Run {run.name!r} started.")
            return redirect("dashboard:run-detail", run_uuid=run.uuid)
    # An invalid form answers 200 with its messages, as Django's forms do: a 4xx page would be
    # a console error in the browser for what is only a typo.
    page = _page(request, "dashboard/run_start.html", {"form": form, "clone": clone, "clone_notes": notes})
    page.status_code = status
    return page


@require_GET
@role_required(VIEWER)
def run_detail_view(request: HttpRequest, run_uuid: Any) -> HttpResponse:
    run = _run_or_404(request, run_uuid)
    return _page(
        request,
        "dashboard/run_detail.html",
        {
            "run": run,
            "page_config": {"run": str(run.uuid), "urls": _run_urls(run)},
            "bars": selectors.run_budget_bars(run),
            "flags": selectors.runs_flag_reasons([run])[run.pk],
            "stop_request": selectors.run_stop_request(run),
            "notes": list(note_versions(run=run)),
            "note_form": NoteForm(),
            "references": selectors.run_reference_scores(run),
            "job_health": run_job_health(run=run),
            "guidance_form": GuidanceForm(),
            "terminal": run.status in RUN_TERMINAL_STATES,
            "reports": selectors.run_reports(run),
            "control_help": RUN_CONTROL_HELP,
            **selectors.run_result(run),
        },
    )


# What each control does to the work in flight (apps.research.services run_pause / run_stop own it).
RUN_CONTROL_HELP = {
    "pause": "no new agent step or submission; jobs already running go on to the end and their results "
    "are recorded; the wall clock keeps counting.",
    "resume": "agents take their next steps again.",
    "stop": "no new work: queued trainings are cancelled at once; jobs already running and the evaluations "
    "of finished trainings finish, then the final evaluation runs and the run ends finished (stopped early) "
    "with its checkpoint.",
}

# A placeholder the page's script swaps for a record's id (URL converters need a valid value).
_ZERO = "00000000-0000-0000-0000-000000000000"


def _run_urls(run: Run) -> dict[str, str]:
    """The URLs the run page's script needs, reversed here so templates and routes stay in one place."""
    return {
        "ws": f"/ws/runs/{run.uuid}/",
        "snapshot": reverse("dashboard:run-snapshot", args=[run.uuid]),
        "charts": reverse("dashboard:run-charts", args=[run.uuid]),
        "node": reverse("dashboard:node-detail", args=[run.uuid, _ZERO]),
        "experiment": reverse("dashboard:experiment", args=[run.uuid, "__id__"]),
        "report": reverse("dashboard:report", args=[run.uuid, _ZERO]),
        "job": reverse("dashboard:job", args=[_ZERO]),
    }


@require_GET
@role_required(OPERATOR)
def run_export_view(request: HttpRequest, run_uuid: Any) -> HttpResponse:
    """The run bundle as a download (operators and admins): apps.flows.bundle, as ``export_run`` writes it."""
    run = _run_or_404(request, run_uuid)
    try:
        archive = bundle_archive(export_run_bundle(run))
    except ApplicationError as error:
        return _refused(request, error, reverse("dashboard:run-detail", args=[run.uuid]))
    response = HttpResponse(archive, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="run-{run.uuid}.zip"'
    return response


@require_GET
@role_required(VIEWER)
def run_snapshot_view(request: HttpRequest, run_uuid: Any) -> JsonResponse:
    """The websocket's snapshot over HTTP: for scripts, tests and anyone comparing states."""
    run = _run_or_404(request, run_uuid)
    return JsonResponse(selectors.run_snapshot(run=run))


@require_GET
@role_required(VIEWER)
def run_charts_view(request: HttpRequest, run_uuid: Any) -> JsonResponse:
    run = _run_or_404(request, run_uuid)
    return JsonResponse(run_charts(run))


@require_GET
@role_required(VIEWER)
def node_detail_view(request: HttpRequest, run_uuid: Any, node_uuid: Any) -> JsonResponse:
    run = _run_or_404(request, run_uuid)
    detail = selectors.node_detail(run=run, node_uuid=node_uuid)
    if detail is None:
        raise Http404("No such node in this run.")
    return JsonResponse(detail)


@require_GET
@role_required(OPERATOR)
def node_page_view(request: HttpRequest, run_uuid: Any, node_uuid: Any) -> HttpResponse:
    """A node's conversation, turn by turn (operators: a transcript may hold sealed prompts)."""
    run = _run_or_404(request, run_uuid)
    node = selectors.node_get(run=run, node_uuid=node_uuid)
    if node is None:
        raise Http404("No such node in this run.")
    turns = selectors.node_conversation(run=run, node=node)
    return _page(request, "dashboard/node_detail.html", {"run": run, "node": node, "turns": turns})


@require_POST
@role_required(OPERATOR)
def guidance_post_view(request: HttpRequest, run_uuid: Any) -> HttpResponse:
    run = _run_or_404(request, run_uuid)
    back = reverse("dashboard:run-detail", args=[run.uuid])
    form = GuidanceForm(request.POST)
    if not form.is_valid():
        return _invalid(request, form, back)
    try:
        guidance = guidance_post(run=run, author=request.user, text=form.cleaned_data["text"])
    except ApplicationError as error:
        return _refused(request, error, back)
    if _wants_json(request):
        return JsonResponse(selectors.guidance_live(guidance), status=201)
    messages.success(request, "Guidance posted; the Main Agent reads it at its next planning step.")
    return redirect(back)


@require_POST
@role_required(OPERATOR)
def run_control_view(request: HttpRequest, run_uuid: Any) -> HttpResponse:
    run = _run_or_404(request, run_uuid)
    back = reverse("dashboard:run-detail", args=[run.uuid])
    form = RunControlForm(request.POST)
    if not form.is_valid():
        return _invalid(request, form, back)
    try:
        changed = run_control(
            run=run, action=form.cleaned_data["action"], user=request.user, reason=form.cleaned_data["reason"]
        )
    except ApplicationError as error:
        return _refused(request, error, back)
    if _wants_json(request):
        return JsonResponse(selectors.run_live(changed))
    messages.success(request, f"Run is now {changed.status}.")
    return redirect(back)


# --- inside a run: experiments table, curves, artifacts -----------------------------------------


@require_GET
@role_required(VIEWER)
def run_experiments_view(request: HttpRequest, run_uuid: Any) -> HttpResponse:
    """A run's experiments as a table of recipe and hyperparameters, sortable, with parallel coordinates."""
    run = _run_or_404(request, run_uuid)
    rows = workbench.run_experiment_rows(run)
    columns = workbench.experiment_columns(rows)
    sort = request.GET.get("sort", "").strip()
    status = 200
    error = ""
    if sort:
        key = sort.lstrip("-")
        if key not in columns:
            error, status = f"sort: no column {key!r} in this run's experiments.", 400
        else:
            rows = workbench.sort_rows(rows, key, descending=sort.startswith("-"))
    headers = [
        {"key": key, "url": f"?sort={'-' if sort != '-' + key else ''}{key}",
         "arrow": ("▼" if sort.startswith("-") else "▲") if sort.lstrip("-") == key else ""}
        for key in columns
    ]  # fmt: skip
    table = [{"row": row, "cells": [workbench.cell(key, row) for key in columns]} for row in rows]
    response = _page(
        request,
        "dashboard/run_experiments.html",
        {"run": run, "headers": headers, "table": table, "error": error,
         "parcoords": workbench.parallel_coordinates(rows)},
    )  # fmt: skip
    response.status_code = status
    return response


@require_GET
@role_required(VIEWER)
def curves_view(request: HttpRequest) -> HttpResponse:
    """Training curves overlaid: ``?runs=<uuid>`` (every trained experiment of each run) and/or
    ``?exp=<experiment uuid>``; the page picks the metric, the step or time axis and smoothing."""
    run_ids, experiment_ids = request.GET.getlist("runs"), request.GET.getlist("exp")
    bad = [value for value in run_ids + experiment_ids if not is_uuid(value)]
    if bad or not (run_ids or experiment_ids):
        message = f"Not a run or experiment id: {bad[0]!r}." if bad else "Choose runs or experiments to overlay."
        messages.error(request, message)
        return redirect("dashboard:run-list")
    runs = [run for run in Run.objects.filter(uuid__in=run_ids) if can_view_run(request.user, run)]
    experiments = [
        e for e in workbench.curve_experiments(runs=runs, experiment_uuids=experiment_ids)
        if can_view_run(request.user, e.run)
    ]  # fmt: skip
    series = workbench.curve_series(experiments)
    return _page(request, "dashboard/curves.html", {"series": series, "runs": runs})


@require_GET
@role_required(VIEWER)
def run_artifacts_view(request: HttpRequest, run_uuid: Any) -> HttpResponse:
    """The run's checkpoints (their files) and datapool entries, with downloads; never sealed data."""
    run = _run_or_404(request, run_uuid)
    return _page(request, "dashboard/run_artifacts.html", {"run": run, **workbench.run_artifacts(run)})


def _download(path: Any, filename: str) -> HttpResponse:
    # Streamed (a checkpoint's weights can be large); the views' decorators are typed for HttpResponse.
    return cast(HttpResponse, FileResponse(path.open("rb"), as_attachment=True, filename=filename))


@require_GET
@role_required(VIEWER)
def checkpoint_file_view(request: HttpRequest, checkpoint_uuid: Any, name: str) -> HttpResponse:
    """One file of a checkpoint's manifest, from the artifact store. The sealed reference never."""
    checkpoint = Checkpoint.objects.filter(uuid=checkpoint_uuid, is_reference=False).select_related("run").first()
    if checkpoint is None or name not in checkpoint.manifest:
        raise Http404("No such checkpoint file.")
    if checkpoint.run is not None and not can_view_run(request.user, checkpoint.run):
        raise PermissionDenied("You may not watch this run.")
    try:
        path = workbench.artifact_file(checkpoint.uri, name)
    except ApplicationError as error:
        raise Http404(error.message) from None
    return _download(path, f"{checkpoint.handle}-{name.replace('/', '_')}")


@require_GET
@role_required(VIEWER)
def data_entry_download_view(request: HttpRequest, handle: str) -> HttpResponse:
    """A datapool entry's JSONL file (what the datapool page previews), from the artifact store."""
    try:
        entry = data_entry_get(handle)
    except NotFound:
        raise Http404("No such datapool entry.") from None
    try:
        path = workbench.artifact_file(entry.uri)
    except ApplicationError as error:
        raise Http404(error.message) from None
    return _download(path, f"{entry.handle}.jsonl")


# --- experiments, reports, integrity -----------------------------------------------------------


@require_GET
@role_required(VIEWER)
def experiment_detail_view(request: HttpRequest, run_uuid: Any, experiment: str) -> HttpResponse:
    run = _run_or_404(request, run_uuid)
    found = selectors.experiment_get(run=run, handle_or_uuid=experiment)
    if found is None:
        raise Http404("No such experiment in this run.")
    return _page(
        request,
        "dashboard/experiment_detail.html",
        {
            "run": run,
            **selectors.experiment_detail(found),
            "adjudication_form": AdjudicationForm(),
            "notes": list(note_versions(run=run, experiment=found)),
            "note_form": NoteForm(initial={"experiment": found.handle}),
        },  # fmt: skip
    )


@require_GET
@role_required(VIEWER)
def report_detail_view(request: HttpRequest, run_uuid: Any, report_uuid: Any) -> HttpResponse:
    run = _run_or_404(request, run_uuid)
    report = selectors.report_get(run=run, report_uuid=report_uuid)
    if report is None:
        raise Http404("No such report in this run.")
    # People see the whole report (DESIGN.md: the redacted view is the Main Agent's).
    payload = report_payload(report, redacted=False)

    experiments = {e.handle: e for e in report.experiments.all()}
    sections = [(name, payload[name]) for name in LIST_FIELDS]
    return _page(
        request,
        "dashboard/report_detail.html",
        {"run": run, "report": report, "payload": payload, "experiments": experiments, "sections": sections},
    )


@require_GET
@role_required(VIEWER)
def integrity_report_view(request: HttpRequest, run_uuid: Any) -> HttpResponse:
    run = _run_or_404(request, run_uuid)
    return _page(
        request,
        "dashboard/integrity_report.html",
        {"run": run, **selectors.integrity_matrix(run=run), "adjudication_form": AdjudicationForm()},
    )


@require_GET
@role_required(VIEWER)
def review_queue_view(request: HttpRequest) -> HttpResponse:
    """Findings no Reviewer can adjudicate (a submission's in a run without Reviewers, a report's
    finding on an author no Reviewer's scope holds); admins decide them here."""
    queued = [(selectors.finding_run(f), f) for f in selectors.review_queue()]
    rows = [(run, f) for run, f in queued if can_view_run(request.user, run)]
    return _page(request, "dashboard/review_queue.html", {"rows": rows, "adjudication_form": AdjudicationForm()})


@require_POST
@role_required(ADMIN)
def finding_adjudicate_view(request: HttpRequest, run_uuid: Any, finding_id: int) -> HttpResponse:
    run = _run_or_404(request, run_uuid)
    finding = selectors.finding_get(run=run, finding_id=finding_id)
    if finding is None:
        raise Http404("No such finding in this run.")
    back = request.POST.get("next") or reverse("dashboard:integrity", args=[run.uuid])
    if not back.startswith("/") or back.startswith("//"):
        back = reverse("dashboard:integrity", args=[run.uuid])
    form = AdjudicationForm(request.POST)
    if not form.is_valid():
        return _invalid(request, form, back)
    try:
        finding_adjudicate_for_person(
            finding=finding,
            adjudication=form.cleaned_data["adjudication"],
            user=request.user,
            rationale=form.cleaned_data["rationale"],
            observation=form.cleaned_data["observation"] or None,
        )
    except ApplicationError as error:
        return _refused(request, error, back)
    if _wants_json(request):
        return JsonResponse({"ok": True})
    subject = finding.experiment.handle if finding.experiment is not None else getattr(finding.node, "handle", "")
    messages.success(request, f"{subject} · {finding.subcategory}: adjudication recorded.")
    return redirect(back)


# --- jobs and the datapool ---------------------------------------------------------------------


def _job_or_404(request: HttpRequest, job_uuid: Any) -> Any:
    job = selectors.job_get_by_uuid(job_uuid)
    if job is None:
        raise Http404("No such job.")
    if job.run_id is not None and not can_view_run(request.user, job.run):
        raise PermissionDenied("You may not watch this run.")
    return job


@require_GET
@role_required(VIEWER)
def job_snapshot_view(request: HttpRequest, job_uuid: Any) -> JsonResponse:
    """The job websocket's snapshot over HTTP."""
    return JsonResponse(selectors.job_snapshot(job=_job_or_404(request, job_uuid)))


@require_GET
@role_required(VIEWER)
def job_hardware_view(request: HttpRequest, job_uuid: Any) -> JsonResponse:
    """The job page's hardware chart and summary, fetched again when a ``job.progress`` event on
    the job's websocket brings a new sample (as the run page's charts are: static/dashboard/run.js)."""
    job = _job_or_404(request, job_uuid)
    return JsonResponse(
        {"figure": hardware_figure(job), "summary": job_hardware(job=job, with_samples=False)["summary"]}
    )


@require_GET
@role_required(VIEWER)
def job_detail_view(request: HttpRequest, job_uuid: Any) -> HttpResponse:
    job = _job_or_404(request, job_uuid)

    return _page(
        request,
        "dashboard/job_detail.html",
        {
            "job": job,
            "snapshot": selectors.job_snapshot(job=job),
            "attempts": job_attempts(job=job),
            "hardware": job_hardware(job=job, with_samples=False)["summary"],
            "hardware_figure": hardware_figure(job),
            "page_config": {
                "ws": f"/ws/jobs/{job.uuid}/",
                "hardware": reverse("dashboard:job-hardware", args=[job.uuid]),
                "experiment": job.experiment.handle if job.experiment_id else None,
            },
        },
    )


@require_GET
def minibench_build_view(request: HttpRequest) -> JsonResponse:
    """The minibench build's progress for the bar on every page, the sign-in page included: it holds
    nothing private (stage, fraction, time left), and a new user watches it before signing in."""
    progress = build_progress_read()
    fields = ("state", "stage", "fraction", "detail", "eta_seconds", "profile", "updated_at")
    return JsonResponse({key: progress.get(key) for key in fields} if progress else {"state": None})


@require_GET
@role_required(VIEWER)
def datapool_view(request: HttpRequest) -> HttpResponse:
    search = request.GET.get("q", "").strip()
    entries = data_entry_list(search=search or None).select_related("registered_by")
    return _page(request, "dashboard/datapool.html", {"entries": selectors.datapool_rows(entries), "q": search})


@require_GET
@role_required(VIEWER)
def data_entry_view(request: HttpRequest, handle: str) -> HttpResponse:
    try:
        entry = data_entry_get(handle)
    except NotFound:
        raise Http404("No such datapool entry.") from None
    return _page(request, "dashboard/data_entry.html", selectors.data_entry_detail(entry))


# --- agent-evaluation suites ---------------------------------------------------------------------

SUITE_LIST_LIMIT = 200


@require_GET
@role_required(VIEWER)
def suite_list_view(request: HttpRequest) -> HttpResponse:
    suites = AgentSuite.objects.order_by("-created_at", "-pk").prefetch_related("cells")[:SUITE_LIST_LIMIT]
    return _page(request, "dashboard/suite_list.html", {"suites": suites})


@require_GET
@role_required(VIEWER)
def suite_detail_view(request: HttpRequest, suite_uuid: Any) -> HttpResponse:
    suite = AgentSuite.objects.filter(uuid=suite_uuid).first()
    if suite is None:
        raise Http404("No such suite.")
    ablation = set(ABLATION_AGENTS) <= set(suite.agents)
    return _page(request, "dashboard/suite_detail.html", {"suite": suite, "stats": suite_stats(suite),
                                                          "ablation": ablation})  # fmt: skip


# --- alerts ------------------------------------------------------------------------------------


@role_required(VIEWER)
def alert_list_view(request: HttpRequest) -> HttpResponse:
    """A person's alerts: their rules with recent deliveries, and the form for a new one.

    ``?run=<uuid>`` fills the form for that run (the run page's link). A bad post answers 400 with
    the form's messages and stores nothing.
    """
    status = 200
    if request.method == "POST":
        form = AlertRuleForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            run = selectors.run_get(data["run"]) if data["run"] else None
            if data["run"] and (run is None or not can_view_run(request.user, run)):
                form.add_error("run", "No such run that you may watch.")
            else:
                try:
                    alert_rule_create_for_person(user=request.user, channel=data["channel"], target=data["target"],
                                                 triggers=data["triggers"], run=run)  # fmt: skip
                except ApplicationError as error:
                    form.add_error("target" if error.code == "invalid_target" else None, error.message)
                else:
                    messages.success(request, "Alert saved.")
                    return redirect("dashboard:alerts")
        status = 400
    else:
        form = AlertRuleForm(initial={"run": request.GET.get("run", "")})
    page = _page(request, "dashboard/alerts.html", {"form": form, "rules": selectors.alert_rules(request.user)})
    page.status_code = status
    return page


@require_POST
@role_required(VIEWER)
def alert_delete_view(request: HttpRequest, rule_uuid: Any) -> HttpResponse:
    rule = selectors.alert_rule_get(rule_uuid)
    if rule is None:
        raise Http404("No such alert.")
    try:
        alert_rule_delete_for_person(user=request.user, rule=rule)
    except ApplicationError as error:
        return _refused(request, error, reverse("dashboard:alerts"))
    messages.success(request, "Alert removed.")
    return redirect("dashboard:alerts")


# --- notes -------------------------------------------------------------------------------------


@require_POST
@role_required(OPERATOR)
def note_post_view(request: HttpRequest, run_uuid: Any) -> HttpResponse:
    """Save a new version of the note on the run, or on ``experiment`` (a handle) of it."""
    run = _run_or_404(request, run_uuid)
    form = NoteForm(request.POST)
    handle = request.POST.get("experiment", "")
    back = (reverse("dashboard:experiment", args=[run.uuid, handle]) if handle and len(handle) <= 64
            else reverse("dashboard:run-detail", args=[run.uuid])) + "#notes"  # fmt: skip
    if not form.is_valid():
        return _invalid(request, form, back)
    experiment = None
    if form.cleaned_data["experiment"]:
        experiment = selectors.experiment_get(run=run, handle_or_uuid=form.cleaned_data["experiment"])
        if experiment is None:
            raise Http404("No such experiment in this run.")
    try:
        note = note_add_for_person(run=run, user=request.user, text=form.cleaned_data["text"], experiment=experiment)
    except ApplicationError as error:
        return _refused(request, error, back)
    if _wants_json(request):
        return JsonResponse({"version": note.version, "uuid": str(note.uuid)}, status=201)
    messages.success(request, f"Note saved (version {note.version}).")
    return redirect(back)
