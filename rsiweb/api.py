"""The DRF router: each app registers its read-only resource viewsets here."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

router = DefaultRouter()
