"""compose.yaml: every service restarts on its own and says whether it is healthy.

No container engine runs here, so the file is checked as data (docs/deployment.md, "Restarts
and health checks").
"""

from __future__ import annotations

import re

import pytest
import yaml
from django.urls import resolve

from tests.support.procs import ROOT

SERVICES = yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))["services"]
# A one-shot service (migrate) retries until it succeeds; everything else comes back after any exit.
ONE_SHOT = {"migrate"}


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_restart_policy_and_a_health_check(name):
    service = SERVICES[name]
    assert service.get("restart") == ("on-failure" if name in ONE_SHOT else "unless-stopped")
    check = service.get("healthcheck") or {}
    assert not check.get("disable")
    test = check.get("test")
    assert isinstance(test, list)
    assert test[0] in ("CMD", "CMD-SHELL")
    assert len(test) > 1


@pytest.mark.parametrize("name", sorted(n for n in SERVICES if n.startswith("worker-")))
def test_a_worker_health_check_pings_its_own_node(name):
    command, check = SERVICES[name]["command"], " ".join(SERVICES[name]["healthcheck"]["test"])
    node = re.search(r"-n (\w+)@%h", command).group(1)
    assert f"inspect ping -d {node}@$$HOSTNAME" in check


def test_the_web_health_check_asks_an_existing_endpoint():
    check = " ".join(SERVICES["web"]["healthcheck"]["test"])
    path = re.search(r"http://127\.0\.0\.1:8000(/\S*?)'", check).group(1)
    assert resolve(path).url_name == "healthz"


def test_the_broker_keeps_its_queue_across_a_restart():
    assert "--appendonly yes" in SERVICES["redis"]["command"]
    assert any(volume.endswith(":/data") for volume in SERVICES["redis"]["volumes"])
