from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView

from apps.core.views import healthz
from rsiweb.api import router

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("healthz", healthz, name="healthz"),
    path("api/v1/integrity/", include("apps.integrity.urls")),
    path("api/v1/suites/", include("apps.dojo.urls")),
    path("api/v1/", include("apps.expos.urls")),
    path("api/v1/", include(router.urls)),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/docs/", SpectacularRedocView.as_view(url_name="schema"), name="api-docs"),
    # The dashboard's pages, last: its root path must not shadow the routes above.
    path("", include("apps.dashboard.urls")),
]

# JSON 404/500 under /api/ (agents parse errors); the usual pages elsewhere.
handler404 = "apps.expos.views.not_found"
handler500 = "apps.expos.views.server_error"
