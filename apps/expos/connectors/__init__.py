"""External discovery connectors: the 22 tools of DESIGN.md "External discovery", as plug-ins.

``build_connectors(config)`` always returns all 22 tools by name, configured or not, so the
registry declares the same tool set everywhere; a tool whose connector is off answers
``ConnectorError("not_configured", ...)`` naming the variables that turn it on.
"""

from __future__ import annotations

from .arxiv import ArxivConnector
from .base import Connector, ConnectorConfig, ConnectorError, ToolSpec
from .dblp import DblpConnector
from .github import GitHubConnector
from .hf import DatasetsContract, HubConnector
from .local_catalog import LocalCatalogConnector
from .scholar import GoogleScholarConnector
from .web import WebParseConnector, WebSearchConnector

__all__ = [
    "TOOL_NAMES",
    "Connector",
    "ConnectorConfig",
    "ConnectorError",
    "ToolSpec",
    "build_connectors",
    "connectors_for",
]

# The paper's names, in the paper's order (its Table 6); tests hold build_connectors to exactly these.
TOOL_NAMES = (
    "hf_search_datasets",
    "hf_inspect_dataset",
    "hf_dataset_configs",
    "hf_dataset_splits",
    "hf_dataset_readme",
    "hf_dataset_sample",
    "hf_download_dataset",
    "hf_materialize_dataset",
    "search_web_google_search",
    "search_web_web_parse",
    "search_github_search_repositories",
    "search_github_search_code",
    "search_github_search_issues",
    "search_github_search_pull_requests",
    "search_github_search_users",
    "search_github_get_repository_readme",
    "search_scholar_arxiv_search_by_content",
    "search_scholar_arxiv_search_by_author",
    "search_scholar_google_scholar_search",
    "search_scholar_search_dblp_papers",
    "search_scholar_search_dblp_authors",
    "search_scholar_search_dblp_venues",
)


def connectors_for(config: ConnectorConfig) -> list[Connector]:
    """One instance per plug-in; the hf_* contract goes to whichever provider the config chose."""
    hf: DatasetsContract = LocalCatalogConnector(config) if config.hf_provider == "local" else HubConnector(config)
    return [
        hf,
        WebSearchConnector(config),
        WebParseConnector(config),
        GitHubConnector(config),
        ArxivConnector(config),
        GoogleScholarConnector(config),
        DblpConnector(config),
    ]


def build_connectors(config: ConnectorConfig) -> dict[str, ToolSpec]:
    tools: dict[str, ToolSpec] = {}
    for connector in connectors_for(config):
        for name, spec in connector.tools.items():
            if name in tools:
                raise RuntimeError(f"two connectors declare {name}")
            tools[name] = spec
    return {name: tools[name] for name in TOOL_NAMES}
