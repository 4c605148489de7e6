"""Dashboard pages, mounted at the site root (rsiweb/urls.py)."""

from __future__ import annotations

from django.urls import path

from apps.dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.run_list_view, name="run-list"),
    path("runs/new/", views.run_start_view, name="run-start"),
    path("runs/compare/", views.run_compare_view, name="run-compare"),
    path("runs/export.<str:fmt>", views.runs_export_view, name="runs-export"),
    path("curves/", views.curves_view, name="curves"),
    path("runs/<uuid:run_uuid>/experiments/", views.run_experiments_view, name="run-experiments"),
    path("runs/<uuid:run_uuid>/artifacts/", views.run_artifacts_view, name="run-artifacts"),
    path("checkpoints/<uuid:checkpoint_uuid>/files/<path:name>", views.checkpoint_file_view, name="checkpoint-file"),
    path("runs/ablation/", views.run_ablation_page_view, name="run-ablation"),
    path("runs/ablation/launch/", views.run_ablation_launch_view, name="run-ablation-launch"),
    path("runs/<uuid:run_uuid>/labels/", views.run_label_view, name="run-label"),
    path("runs/<uuid:run_uuid>/", views.run_detail_view, name="run-detail"),
    path("runs/<uuid:run_uuid>/snapshot.json", views.run_snapshot_view, name="run-snapshot"),
    path("runs/<uuid:run_uuid>/export.zip", views.run_export_view, name="run-export"),
    path("runs/<uuid:run_uuid>/charts.json", views.run_charts_view, name="run-charts"),
    path("runs/<uuid:run_uuid>/nodes/<uuid:node_uuid>.json", views.node_detail_view, name="node-detail"),
    path("runs/<uuid:run_uuid>/nodes/<uuid:node_uuid>/", views.node_page_view, name="node"),
    path("runs/<uuid:run_uuid>/guidance/", views.guidance_post_view, name="guidance-post"),
    path("runs/<uuid:run_uuid>/control/", views.run_control_view, name="run-control"),
    path("runs/<uuid:run_uuid>/notes/", views.note_post_view, name="note-post"),
    path("runs/<uuid:run_uuid>/experiments/<str:experiment>/", views.experiment_detail_view, name="experiment"),
    path("runs/<uuid:run_uuid>/reports/<uuid:report_uuid>/", views.report_detail_view, name="report"),
    path("runs/<uuid:run_uuid>/integrity/", views.integrity_report_view, name="integrity"),
    path(
        "runs/<uuid:run_uuid>/integrity/findings/<int:finding_id>/adjudicate/",
        views.finding_adjudicate_view,
        name="finding-adjudicate",
    ),
    path("review-queue/", views.review_queue_view, name="review-queue"),
    path("jobs/<uuid:job_uuid>/", views.job_detail_view, name="job"),
    path("jobs/<uuid:job_uuid>/snapshot.json", views.job_snapshot_view, name="job-snapshot"),
    path("jobs/<uuid:job_uuid>/hardware.json", views.job_hardware_view, name="job-hardware"),
    path("minibench/build.json", views.minibench_build_view, name="minibench-build"),
    path("datapool/", views.datapool_view, name="datapool"),
    path("suites/", views.suite_list_view, name="suite-list"),
    path("suites/<uuid:suite_uuid>/", views.suite_detail_view, name="suite-detail"),
    path("datapool/<str:handle>/", views.data_entry_view, name="data-entry"),
    path("datapool/<str:handle>/download/", views.data_entry_download_view, name="data-entry-download"),
    path("alerts/", views.alert_list_view, name="alerts"),
    path("alerts/<uuid:rule_uuid>/delete/", views.alert_delete_view, name="alert-delete"),
]
