"""Who may do what on the dashboard: the people's roles of DESIGN.md, in one place.

viewer < operator < admin. Pages need a viewer; steering a run (guidance, pause, resume, stop)
needs an operator; adjudicating integrity findings needs an admin. Superusers are admins.
Roles are Django groups named "viewer", "operator" and "admin" (apps/expos migration 0002).

Only Django users with a session reach these checks: an agent's bearer token never creates a
session (apps.expos.auth), so an agent is an anonymous visitor to every page and websocket.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"

_RANK = {VIEWER: 1, OPERATOR: 2, ADMIN: 3}


def user_role(user: Any) -> str | None:
    """The highest role a user holds, or None for anonymous users and people without a role."""
    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", False):
        return None
    # Agent principals (apps.expos.auth.AgentPrincipal) have no pk and no groups: never a role.
    if getattr(user, "pk", None) is None:
        return None
    if user.is_superuser:
        return ADMIN
    # One query; cached on the user object so a page that asks several times pays once.
    cached = getattr(user, "_dashboard_role", "unset")
    if cached != "unset":
        return cached
    names = set(user.groups.filter(name__in=_RANK).values_list("name", flat=True))
    role = max(names, key=_RANK.__getitem__) if names else None
    user._dashboard_role = role
    return role


def has_role(user: Any, needed: str) -> bool:
    role = user_role(user)
    return role is not None and _RANK[role] >= _RANK[needed]


def can_view(user: Any) -> bool:
    return has_role(user, VIEWER)


def can_steer(user: Any) -> bool:
    """Post guidance, pause, resume, stop: operators and admins."""
    return has_role(user, OPERATOR)


def can_adjudicate(user: Any) -> bool:
    """Adjudicate integrity findings: admins only."""
    return has_role(user, ADMIN)


def can_view_run(user: Any, run: Any) -> bool:
    """May this person watch this run (its pages and its websocket)?

    Every viewer sees every run today; the run is an argument so that a per-run rule (teams,
    private runs) lands here and nowhere else.
    """
    return run is not None and can_view(user)


def role_required(needed: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """View decorator: anonymous visitors go to the login page; people below ``needed`` get 403."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not has_role(request.user, needed):
                raise PermissionDenied(f"This needs the {needed} role.")
            return view(request, *args, **kwargs)

        return wrapped

    return decorate
