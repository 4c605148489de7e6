"""Integrity endpoints for people: the run report (viewer+) and the admin's audited adjudication.

    GET  /api/v1/integrity/runs/<uuid>/report
    GET  /api/v1/integrity/experiments/<uuid>/findings
    POST /api/v1/integrity/experiments/<uuid>/findings/<subcategory>/adjudicate   (admin)

Session users only: agents read integrity through their own tools (Reviewers adjudicate with
theirs), and the report is not an agent's to read.
"""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.errors import NotFound
from apps.core.people import is_human_admin, is_human_viewer
from apps.experiments.models import Experiment
from apps.integrity.choices import Adjudication, Observation, Subcategory
from apps.integrity.models import IntegrityFinding
from apps.integrity.report import integrity_report
from apps.integrity.selectors import SUBCATEGORY_ORDER, finding_history, findings_for
from apps.integrity.services import finding_adjudicate
from apps.research.models import Run


class IsViewer(BasePermission):
    message = "Sign in as a viewer, operator or admin."

    def has_permission(self, request: Request, view: Any) -> bool:
        return is_human_viewer(request.user)


class IsAdmin(BasePermission):
    message = "Adjudicating a finding needs the admin group."

    def has_permission(self, request: Request, view: Any) -> bool:
        return is_human_admin(request.user)


def _by_uuid(model: Any, value: str, what: str) -> Any:
    try:
        key = uuid.UUID(value)
    except ValueError:
        raise NotFound(f"{what}_not_found", f"No {what} {value}.") from None
    found = model.objects.filter(uuid=key).first()
    if found is None:
        raise NotFound(f"{what}_not_found", f"No {what} {value}.")
    return found


class RunIntegrityReportView(APIView):
    """The run's 12-subcategory matrix per submission, hacking rate, blocked attempts and selection."""

    authentication_classes = [SessionAuthentication]
    permission_classes = [IsViewer]

    @extend_schema(responses={200: dict}, operation_id="integrity_run_report")
    def get(self, request: Request, run_uuid: str) -> Response:
        return Response(integrity_report(_by_uuid(Run, run_uuid, "run")))


def finding_payload(finding: IntegrityFinding) -> dict[str, Any]:
    return {
        "subcategory": finding.subcategory,
        "observation": finding.observation,
        "adjudication": finding.adjudication,
        "decided_by": finding.decided_by,
        "rationale": finding.rationale,
        "evidence": finding.evidence,
        "history": finding_history(finding),
    }


class ExperimentFindingsView(APIView):
    """One experiment's findings with their evidence and history (people see everything)."""

    authentication_classes = [SessionAuthentication]
    permission_classes = [IsViewer]

    @extend_schema(responses={200: dict}, operation_id="integrity_experiment_findings")
    def get(self, request: Request, experiment_uuid: str) -> Response:
        experiment = _by_uuid(Experiment, experiment_uuid, "experiment")
        found = findings_for(experiment)
        return Response(
            {
                "experiment": experiment.handle,
                "integrity_status": experiment.integrity_status,
                "findings": [finding_payload(found[s]) for s in SUBCATEGORY_ORDER if s in found],
                "history": [
                    {
                        "from": c.from_status,
                        "to": c.to_status,
                        "actor": c.actor,
                        "reason": c.reason,
                        "at": c.created_at.isoformat(),
                    }
                    for c in experiment.integrity_changes.order_by("created_at", "pk")
                ],
            }
        )


class AdjudicateInput(serializers.Serializer):
    adjudication = serializers.ChoiceField(choices=[*Adjudication.values, ""])
    rationale = serializers.CharField(max_length=4000)
    observation = serializers.ChoiceField(choices=Observation.values, required=False)


class FindingAdjudicateView(APIView):
    """An admin's override of one finding, with the audited reason (``rationale``)."""

    authentication_classes = [SessionAuthentication]
    permission_classes = [IsAdmin]

    @extend_schema(request=AdjudicateInput, responses={200: dict}, operation_id="integrity_finding_adjudicate")
    def post(self, request: Request, experiment_uuid: str, subcategory: str) -> Response:
        experiment = _by_uuid(Experiment, experiment_uuid, "experiment")
        if subcategory not in Subcategory.values:
            raise NotFound("subcategory_not_found", f"{subcategory!r} is not one of {Subcategory.values}.")
        finding = IntegrityFinding.objects.filter(experiment=experiment, subcategory=subcategory).first()
        if finding is None:
            raise NotFound("finding_not_found", f"{experiment.handle} has no {subcategory} finding yet.")
        data = AdjudicateInput(data=request.data)
        data.is_valid(raise_exception=True)
        finding = finding_adjudicate(
            finding=finding,
            adjudication=data.validated_data["adjudication"],
            actor=f"user:{request.user.get_username()}",
            rationale=data.validated_data["rationale"],
            observation=data.validated_data.get("observation"),
        )
        return Response(finding_payload(finding))
