"""Checkpoint handles are global: two runs registering at once must not pick the same one."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from apps.experiments.models import Checkpoint
from apps.experiments.services import checkpoint_register
from tests.factories import make_run


@pytest.mark.django_db(transaction=True)
def test_two_runs_registering_at_once_get_distinct_checkpoint_handles():
    first_run, second_run = make_run(name="handles a"), make_run(name="handles b")
    registered, release = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                results["first"] = checkpoint_register(uri="mem://a", manifest={"model.safetensors": "a" * 64},
                                                       run=first_run)  # fmt: skip
                registered.set()
                release.wait(30)  # the second run registers while this one is not yet committed
        finally:
            connection.close()

    def second() -> None:
        try:
            results["second"] = checkpoint_register(uri="mem://b", manifest={"model.safetensors": "b" * 64},
                                                    run=second_run)  # fmt: skip
        except Exception as error:  # noqa: BLE001 - the failure is what the assertion reports
            results["second"] = error
        finally:
            connection.close()

    holder = threading.Thread(target=first)
    holder.start()
    assert registered.wait(30)
    other = threading.Thread(target=second)
    other.start()
    time.sleep(1.0)  # the second registration is now numbering its handle
    release.set()
    holder.join(30)
    other.join(30)
    assert isinstance(results["second"], Checkpoint), results["second"]
    handles = {results["first"].handle, results["second"].handle}  # type: ignore[union-attr]
    assert len(handles) == 2
    assert set(Checkpoint.objects.filter(run__in=[first_run, second_run]).values_list("handle", flat=True)) == handles
