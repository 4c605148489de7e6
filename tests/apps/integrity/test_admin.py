"""The admin's override in the Django admin goes through the audited service, never a plain save."""

from __future__ import annotations

from django.contrib.auth.models import User

from apps.experiments.choices import IntegrityStatus
from apps.integrity.choices import Adjudication, Subcategory
from apps.integrity.models import FindingChange
from apps.integrity.services import integrity_run_checks
from apps.research.services import worker_finalize
from tests.apps.integrity.conftest import finding


def test_an_admin_override_in_the_admin_is_audited(world, client):
    experiment = world.train([world.data["clean"]], correct=2)
    worker_finalize(
        node=world.worker,
        summary=f"{experiment.handle} reaches 0.9.",
        experiments=[experiment.handle],
        actor=world.worker.handle,
    )
    integrity_run_checks(experiment=experiment)
    target = finding(experiment, Subcategory.METRIC_ATTRIBUTION)
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    url = f"/admin/integrity/integrityfinding/{target.pk}/change/"

    refused = client.post(url, {"new_adjudication": Adjudication.ALLOWED, "new_observation": "", "reason": ""})
    assert refused.status_code == 200  # the form comes back with its error; nothing changed
    target.refresh_from_db()
    assert target.adjudication == ""

    client.post(url, {"new_adjudication": Adjudication.ALLOWED, "new_observation": "", "reason": "projected, labelled"})

    target.refresh_from_db()
    assert (target.adjudication, target.decided_by) == (Adjudication.ALLOWED, "user:root")
    assert FindingChange.objects.filter(finding=target, actor="user:root").exists()
    experiment.refresh_from_db()
    assert experiment.integrity_status == IntegrityStatus.ACCEPTED
