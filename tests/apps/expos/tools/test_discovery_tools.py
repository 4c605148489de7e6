"""The 22 discovery connectors as registry tools: open to every agent, workspace-bound downloads."""

from __future__ import annotations

import pytest

from apps.core.errors import ApplicationError
from apps.expos.connectors import TOOL_NAMES
from apps.expos.registry import Category, Role, load_all
from apps.expos.tools.discovery import connector_config
from apps.expos.workspaces import workspace_path
from tests.apps.expos.tools.conftest import call


def test_all_22_connectors_are_registered_for_every_agent_role():
    tools = load_all()
    for name in TOOL_NAMES:
        assert tools[name].category == Category.DISCOVERY
        assert tools[name].roles == Role.ALL_AGENTS
    assert len(TOOL_NAMES) == 22
    # The workspace is ExpOS's to fill: agents cannot name one.
    for name in ("hf_download_dataset", "hf_materialize_dataset"):
        schema = tools[name].input_schema
        assert "workspace" not in schema["properties"]
        assert "workspace" not in schema["required"]
        assert schema["additionalProperties"] is False


def test_default_config_serves_hf_tools_from_the_local_catalog(roots, settings):
    config = connector_config()
    assert config.hf_provider == "local"
    assert config.local_catalog_dir == str(roots["catalog"])
    assert config.workspace_root.endswith("workspaces")


def test_download_materialize_and_register_through_the_workspace(world):
    ctx = world.ctx(world.worker)
    found = call(ctx, "hf_search_datasets", {"query": "arith clean"})
    assert "arith-clean" in [d["id"] for d in found["datasets"]]

    downloaded = call(ctx, "hf_download_dataset", {"dataset": "arith-clean"})
    workspace = workspace_path(run=world.run, node=world.worker)
    assert (workspace / downloaded["path"] / "data.jsonl").is_file()
    materialized = call(
        ctx,
        "hf_materialize_dataset",
        {"dataset": "arith-clean", "prompt": "prompt", "completion": "completion", "output": "clean"},
    )
    assert (workspace / materialized["path"]).is_file()
    assert materialized["rows"] == 8

    added = call(ctx, "worker_add_data", {"path": materialized["path"], "name": "clean via hub"})
    # Materialized prompt/completion rows are byte-identical to the catalog file registered
    # earlier: the content-addressed datapool answers with that entry instead of a copy.
    assert added["entry"]["handle"] == world.clean
    assert added["created"] is False


def test_downloads_go_only_to_the_calling_workers_workspace(world):
    call(world.ctx(world.other), "hf_download_dataset", {"dataset": "arith-clean"})
    assert any(workspace_path(run=world.run, node=world.other).rglob("data.jsonl"))
    assert not any(workspace_path(run=world.run, node=world.worker).rglob("*"))
    for node in (world.main, world.reviewer):
        with pytest.raises(ApplicationError) as excinfo:
            call(world.ctx(node), "hf_download_dataset", {"dataset": "arith-clean"})
        assert excinfo.value.code == "no_workspace"
        assert excinfo.value.status_code == 403


def test_read_only_discovery_is_open_to_main_and_reviewers(world):
    for node in (world.main, world.reviewer):
        readme = call(world.ctx(node), "hf_dataset_readme", {"dataset": "arith-clean"})
        assert "arith-clean" in readme["readme"]


def test_unconfigured_connector_answers_a_clear_4xx(world):
    with pytest.raises(ApplicationError) as excinfo:
        call(world.ctx(world.main), "search_github_search_repositories", {"query": "trl sft"})
    assert excinfo.value.code == "not_configured"
    assert excinfo.value.status_code == 424
    assert "RSI_GITHUB" in excinfo.value.message


def test_connector_bad_request_is_400_and_an_unknown_dataset_404(world):
    with pytest.raises(ApplicationError) as excinfo:
        call(world.ctx(world.worker), "hf_inspect_dataset", {"dataset": "../catalog"})
    assert excinfo.value.code == "bad_request"
    assert excinfo.value.status_code == 400
    with pytest.raises(ApplicationError) as excinfo:
        call(world.ctx(world.worker), "hf_inspect_dataset", {"dataset": "no-such-dataset"})
    assert excinfo.value.code == "not_found"
    assert excinfo.value.status_code == 404
