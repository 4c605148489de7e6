"""The agent configurations a suite compares: which policy drives a cell's run, with which switches.

    heuristic        the heuristic policy (workers/agents/policies/heuristic.py) as every run uses it
    heuristic-weak   the same policy, deliberately weakened by two switches read from the run's
                     policy (``heuristic.rank_data: false``: catalog datasets are taken in search
                     order, unranked, and none is set aside as off-task or malformed;
                     ``heuristic.fixed_recipe: true``: one SFT recipe for every training, no
                     learning-rate sweep, no longer continuation, no DPO)
    heuristic-uct    the heuristic policy under the ``uct`` search policy (issue 32): the full system
                     with another allocation over the research DAG, an arm of its own in the ablation
    heuristic-serial-workers, heuristic-no-reviewer
                     the paper's ablation arms: the heuristic policy with one Worker at a time, or
                     with no Reviewers (run switches ``serial_workers`` and ``reviewer``); a suite
                     of ``ABLATION_AGENTS`` over several seeds is the paper's ablation
                     (``ablation_suite_create`` in apps/dojo/suites.py)
    llm              the LLM policy on an endpoint profile (agent_config ``llm_profiles``); refused
                     when no endpoint is configured, which is always the case offline

A model trained by ``agent_sft`` is evaluated as an agent by serving it on an LLM host (vLLM with
a tool-call parser) and naming that endpoint's profile for the ``llm`` configuration. It cannot
be evaluated offline: the tiny minibench model cannot call tools.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apps.core.errors import ApplicationError
from apps.research.agent_config import DEFAULT_PROFILE, ROLES, LLMNotConfigured, llm_config
from apps.research.choices import AgentMode

OFFLINE_SFT_NOTE = (
    "A model trained by agent_sft cannot be evaluated as an agent offline: the tiny minibench model "
    "cannot call tools. Serve it on an LLM host (vLLM with a tool-call parser), configure that endpoint "
    "as an LLM profile, and use the llm configuration."
)


@dataclass(frozen=True)
class AgentConfig:
    name: str
    policy: str  # AgentMode
    description: str
    # Keys merged into the run's policy["heuristic"] (the heuristic policy reads them).
    heuristic: dict[str, Any] = field(default_factory=dict)
    # run_launch's ablation switches (reviewer, serial_workers); they win over the suite's budget.
    run: dict[str, bool] = field(default_factory=dict)
    # The Main Agent's search policy (agent_config.SEARCH_POLICIES; issue 32).
    search_policy: str = "greedy"


AGENTS: dict[str, AgentConfig] = {
    "heuristic": AgentConfig("heuristic", AgentMode.HEURISTIC, "The heuristic policy as runs use it."),
    "heuristic-weak": AgentConfig(
        "heuristic-weak",
        AgentMode.HEURISTIC,
        "The heuristic policy without data ranking and with one fixed SFT recipe.",
        heuristic={"rank_data": False, "fixed_recipe": True},
    ),
    "heuristic-serial-workers": AgentConfig(
        "heuristic-serial-workers",
        AgentMode.HEURISTIC,
        "The paper's ablation: the heuristic policy with one Worker at a time (--serial-workers).",
        run={"serial_workers": True},
    ),
    "heuristic-no-reviewer": AgentConfig(
        "heuristic-no-reviewer",
        AgentMode.HEURISTIC,
        "The paper's ablation: the heuristic policy with no Reviewers (--no-reviewer).",
        run={"reviewer": False},
    ),
    "heuristic-uct": AgentConfig(
        "heuristic-uct",
        AgentMode.HEURISTIC,
        "The heuristic policy under the uct search policy (upper confidence bound, stagnant lines left).",
        search_policy="uct",
    ),
    "llm": AgentConfig("llm", AgentMode.LLM, "The LLM policy on an endpoint profile (an LLM host)."),
}
# The paper's ablation (full vs serial Workers vs no Reviewer), as a suite's agent configurations.
ABLATION_AGENTS = ("heuristic", "heuristic-serial-workers", "heuristic-no-reviewer")
# The full system under another search policy than greedy: an extra ablation arm (issue 32).
FULL_UNDER = {"uct": "heuristic-uct"}


def agent_resolve(name: str, *, llm_profile: str = DEFAULT_PROFILE) -> AgentConfig:
    """The named configuration, checked usable now; a 400 naming what to do otherwise."""
    config = AGENTS.get(name)
    if config is None:
        raise ApplicationError(
            "unknown_agent", f"Unknown agent configuration {name!r}; known: {', '.join(sorted(AGENTS))}."
        )
    if config.policy == AgentMode.LLM:
        try:
            for role in ROLES:
                llm_config(role, llm_profile)
        except LLMNotConfigured as exc:
            raise ApplicationError(
                "llm_not_configured",
                f"The llm agent configuration needs an LLM endpoint, and none is configured: {exc} " + OFFLINE_SFT_NOTE,
            ) from None
    return config
