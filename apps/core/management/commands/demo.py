"""The README's main job: prepare the embedded default and serve the dashboard."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Migrate, create an admin login, and serve rsiweb on the embedded default."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-serve", action="store_true", help="prepare only, do not serve")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        password = self._admin_password()
        url = f"http://{options['host']}:{options['port']}/"
        self.stdout.write(f"rsiweb data folder: {settings.DATA_DIR}")
        self.stdout.write(f"dashboard: {url}   admin: {url}admin/   login: admin / {password}")
        if options["no_serve"]:
            return
        from daphne.cli import CommandLineInterface

        CommandLineInterface().run(["-b", options["host"], "-p", str(options["port"]), "rsiweb.asgi:application"])

    def _admin_password(self) -> str:
        """One admin per install; its password lives in the data folder, readable only by us."""
        path = settings.DATA_DIR / "admin_password"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(12))
            path.chmod(0o600)
        password = path.read_text().strip()
        user_model = get_user_model()
        user, _ = user_model.objects.get_or_create(username="admin", defaults={"is_staff": True, "is_superuser": True})
        if not user.check_password(password):
            user.set_password(password)
            user.save(update_fields=["password"])
        return password
