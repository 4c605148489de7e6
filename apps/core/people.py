"""Who counts as a person, and in which group: the checks every interface for people shares.

People sign in as Django users in the ``viewer``, ``operator`` or ``admin`` group (operator and
admin include viewing; a superuser is every one). An agent's ``request.user`` is never a Django
user (``apps.expos.auth.AgentPrincipal``), so it is never a person, whatever it claims.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser

HUMAN_GROUPS = ("viewer", "operator", "admin")


def is_person(user: Any) -> bool:
    """A signed-in Django user (not an agent principal, not anonymous)."""
    return isinstance(user, AbstractBaseUser) and bool(user.is_authenticated)


def is_human_viewer(user: Any) -> bool:
    """A person with at least the viewer group (operator and admin include viewing)."""
    return is_person(user) and (user.is_superuser or user.groups.filter(name__in=HUMAN_GROUPS).exists())


def is_human_admin(user: Any) -> bool:
    """A person in the admin group (or a superuser)."""
    return is_person(user) and (user.is_superuser or user.groups.filter(name="admin").exists())


def is_human_operator(user: Any) -> bool:
    """A person in the operator or admin group (or a superuser): who may start and steer work."""
    return is_person(user) and (user.is_superuser or user.groups.filter(name__in=("operator", "admin")).exists())
