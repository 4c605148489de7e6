"""The DRF router: each app registers its read-only resource viewsets here."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

from apps.expos.api.people import AlertRuleViewSet
from apps.expos.api.views import register as register_expos

router = DefaultRouter()
# runs, nodes, experiments (+lineage), checkpoints, datapool, evaluations (+samples), reports, events
register_expos(router)
router.register("alerts", AlertRuleViewSet, basename="alert")  # a person's own alert rules
