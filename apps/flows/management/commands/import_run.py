"""Read a run bundle into this instance: ``manage.py import_run <path>`` (apps.flows.bundle).

All or nothing: a bundle that does not prove itself (unsigned, signed by an untrusted instance,
a record that differs from the signed manifest, a chain that does not end at the signed head,
unknown columns, sealed text, past the size limit), a run that exists here already, or any
conflicting row is refused with the reason, and nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError

from apps.core.errors import ApplicationError
from apps.flows.bundle import bundle_read, import_run_bundle, run_import_origin


class Command(BaseCommand):
    help = "Import a run bundle written by export_run; refuses an existing run or a broken chain."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("path", help="the bundle (.zip) written by export_run")
        parser.add_argument(
            "--trust",
            action="append",
            default=[],
            metavar="KEY",
            help="also accept bundles signed by this instance key (public key hex or its 16-digit fingerprint)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run = import_run_bundle(bundle_read(Path(options["path"])), trusted_keys=options["trust"])
        except ApplicationError as error:
            raise CommandError(error.message) from None
        except KeyError as error:
            raise CommandError(f"The bundle lacks {error}; nothing imported.") from None
        except IntegrityError as error:
            # A row the bundle shares with this instance (a UUID, a handle): the transaction rolled back.
            raise CommandError(f"The bundle conflicts with rows here; nothing imported ({error}).") from None
        origin = run_import_origin(run) or {}
        self.stdout.write(
            f"run {run.uuid} ({run.name!r}) imported from instance {origin.get('origin')}; "
            "its records match the signed manifest and its event chain verifies"
        )
