"""What configures our agents, read from the environment and the prompt files; Django-free.

Both layers need this: ``run_start`` records the prompt versions on the run and ``start_run``
checks the LLM configuration before a run is created (apps/), while the step runner and the LLM
policy use the same configuration and prompts (workers/agents/). It lives here, below both, so
that workers import it downward and apps never import workers. Nothing here touches the
database or Django settings, so the LLM client and its tests can import it without Django.

- the loop timing (``loop_config``): how often steps and supervisor ticks run, leases, limits;
- one role's model endpoint (``llm_config``): ``RSI_LLM_<X>_<ROLE>`` wins over ``RSI_LLM_<X>``
  (DESIGN.md "Configuration"), so the Main Agent can run on a stronger model than the Workers;
  named endpoint profiles (``llm_profiles``) read ``RSI_LLM_PROFILE_<NAME>_<X>`` the same way, so
  a person picks an endpoint by name when starting a run and never sees its key;
- the versioned role prompts (``prompts/<role>.md``) and their hashes (``prompt_hashes``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from rsiweb import env

ROLES = ("main", "worker", "reviewer")
# The Main Agent's search policies (workers/agents/policies/search.py implements them; the names live
# here, below both layers, so a run validates the name it records): greedy is the original behaviour.
SEARCH_POLICIES = ("greedy", "uct")
DEFAULT_SEARCH_POLICY = "greedy"
PROMPTS = Path(__file__).resolve().parent / "prompts"


# --- the loop timing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoopConfig:
    """Timing of the loops, from the environment (tests shorten it)."""

    poll_seconds: float  # a short pause before looking again (a step that made no progress)
    wait_seconds: float  # a Worker waiting for its jobs re-checks after this long at the latest
    lease_seconds: float  # a step running longer than this is presumed hung and re-run
    lost_after_seconds: float  # a scheduled step nobody claimed for this long is re-sent
    supervise_seconds: float  # the run supervisor's tick
    max_steps: int  # a loop that reaches it ends: no agent runs forever
    max_failures: int  # consecutive failed attempts of one step before the loop fails
    final_grace_seconds: float  # how long a stopping run waits for summaries and post-checks
    quiet_seconds: float  # a running run with nothing active for this long is stopped
    # ... but while an outside harness holds an active node, only once its tokens were silent this long
    silent_seconds: float
    heartbeat_seconds: float  # a running step's process beats this often
    stale_seconds: float  # a running step whose beat is older than this is presumed dead and re-run


def loop_config() -> LoopConfig:
    return LoopConfig(
        poll_seconds=env.number("RSI_AGENT_POLL_SECONDS", 3.0),
        wait_seconds=env.number("RSI_AGENT_WAIT_SECONDS", 60.0),
        lease_seconds=env.number("RSI_AGENT_STEP_LEASE_SECONDS", 600.0),
        lost_after_seconds=env.number("RSI_AGENT_LOST_AFTER_SECONDS", 60.0),
        supervise_seconds=env.number("RSI_RUN_SUPERVISE_SECONDS", 5.0),
        max_steps=int(env.number("RSI_AGENT_MAX_STEPS", 5000)),
        max_failures=int(env.number("RSI_AGENT_MAX_FAILURES", 5)),
        final_grace_seconds=env.number("RSI_FINAL_GRACE_SECONDS", 180.0),
        quiet_seconds=env.number("RSI_RUN_QUIET_SECONDS", 120.0),
        silent_seconds=env.number("RSI_RUN_SILENT_SECONDS", 1800.0),
        heartbeat_seconds=env.number("RSI_AGENT_HEARTBEAT_SECONDS", 5.0),
        stale_seconds=env.number("RSI_AGENT_STALE_SECONDS", 40.0),
    )


# --- one role's model endpoint -----------------------------------------------------------------------


class LLMNotConfigured(RuntimeError):
    """No base URL or model is configured for this role."""


@dataclass(frozen=True)
class LLMConfig:
    """One role's endpoint, model and limits. Prices are USD per million tokens (0 = not tracked)."""

    base_url: str
    model: str
    api_key: str
    timeout: float = 120.0
    max_retries: int = 5
    backoff: float = 1.0
    context_tokens: int = 32_000
    max_output_tokens: int = 2048
    price_prompt: float = 0.0
    price_completion: float = 0.0

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.price_prompt + completion_tokens * self.price_completion) / 1_000_000


# The profile of the unprefixed RSI_LLM_* variables; a run that names no profile uses it.
DEFAULT_PROFILE = "default"
_PROFILE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def _prefix(profile: str) -> str:
    return "RSI_LLM" if profile == DEFAULT_PROFILE else f"RSI_LLM_PROFILE_{profile.upper()}"


def llm_profiles() -> list[str]:
    """The names of the configured LLM endpoint profiles, for a person choosing one.

    ``default`` (``RSI_LLM_BASE_URL`` and ``RSI_LLM_MODEL`` set) first, then the names listed in
    ``RSI_LLM_PROFILES`` (comma-separated; profile ``fast`` reads ``RSI_LLM_PROFILE_FAST_BASE_URL``,
    ``..._MODEL``, ``..._API_KEY``, ...). A listed name whose endpoint is incomplete is left out.
    """
    names = [DEFAULT_PROFILE, *(n.strip().lower() for n in env.text("RSI_LLM_PROFILES").split(",") if n.strip())]
    found = []
    for name in dict.fromkeys(names):
        if not _PROFILE_NAME.match(name):
            continue
        prefix = _prefix(name)
        if env.text(f"{prefix}_BASE_URL") and env.text(f"{prefix}_MODEL"):
            found.append(name)
    return found


def llm_config(role: str, profile: str = DEFAULT_PROFILE) -> LLMConfig:
    """The configuration for ``role`` in ``profile``: ``<prefix>_<X>_<ROLE>`` wins over ``<prefix>_<X>``.

    The prefix is ``RSI_LLM`` for the default profile and ``RSI_LLM_PROFILE_<NAME>`` otherwise.
    """
    suffix = role.upper()
    profile = profile or DEFAULT_PROFILE
    if not _PROFILE_NAME.match(profile):
        raise LLMNotConfigured(f"{profile!r} is not a profile name (lower-case letters, digits, _).")
    prefix = _prefix(profile)

    def value(name: str, default: str = "") -> str:
        return env.text(f"{prefix}_{name}_{suffix}", env.text(f"{prefix}_{name}", default))

    base_url, model = value("BASE_URL"), value("MODEL")
    if not base_url or not model:
        raise LLMNotConfigured(
            f"No LLM for the {role} role in profile {profile!r}: set {prefix}_BASE_URL and {prefix}_MODEL "
            f"(or {prefix}_BASE_URL_{suffix} / {prefix}_MODEL_{suffix}), or run with the heuristic policy."
        )
    return LLMConfig(
        base_url=base_url,
        model=model,
        # Local servers (vLLM) accept any key; the SDK insists on one.
        api_key=value("API_KEY") or "not-needed",
        timeout=float(value("TIMEOUT", "120")),
        max_retries=int(value("MAX_RETRIES", "5")),
        backoff=float(value("BACKOFF", "1.0")),
        context_tokens=int(value("CONTEXT_TOKENS", "32000")),
        max_output_tokens=int(value("MAX_OUTPUT_TOKENS", "2048")),
        price_prompt=float(value("PRICE_PROMPT", "0")),
        price_completion=float(value("PRICE_COMPLETION", "0")),
    )


# --- the role prompts --------------------------------------------------------------------------------


def prompt_text(role: str) -> str:
    """The template of ``role``'s prompt (its first line is ``prompt-version: N``)."""
    return (PROMPTS / f"{role}.md").read_text(encoding="utf-8")


def prompt_hashes() -> dict[str, dict[str, str]]:
    """The version line and sha256 of each role prompt, as stored on a run (Run.prompt_hashes)."""
    hashes = {}
    for role in ROLES:
        text = prompt_text(role)
        version = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                        if line.lower().startswith("prompt-version:")), "?")  # fmt: skip
        hashes[role] = {"version": version, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
    return hashes
