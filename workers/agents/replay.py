"""Replays: a recorded LLM conversation played again through a policy (issue 17, point 5).

:func:`replay_node` steps a policy (the LLM policy, or a changed one) through a node's recorded
turns. The model is reached over the OpenAI protocol at ``llm_base_url`` (a loopback server that
answers with :func:`recorded_replies`, the recorded assistant messages, in order); every tool call
is answered with the recorded REST answer of that call, so nothing is executed again. The replay
yields the same kind of turn sequence as the original — request messages, response, tool calls,
tool answers — and the two are compared with tool-call ids left out (a model server numbers them
its own way). When a changed prompt or policy sends another request, calls another tool or
answers differently, the report names the first differing turn and what differed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from apps.core.hashing import canonical_json
from apps.research.agent_config import llm_config, loop_config, prompt_text
from apps.research.agent_loops import node_role
from apps.research.models import ResearchNode
from apps.research.selectors import run_llm_profile
from apps.research.transcripts import node_turns
from workers.agents.client import ToolResult
from workers.agents.llm import ChatLLM
from workers.agents.loop import _briefing
from workers.agents.policies import Outcome
from workers.agents.policies.llm import LLMPolicy
from workers.agents.policies.transcript import LLMTurn


class Diverged(Exception):
    """The replayed policy called another tool (or other arguments) than the recording holds."""


def recorded_replies(node: ResearchNode) -> list[dict[str, Any]]:
    """The node's recorded assistant messages (LLM turns), in order: what the model server replays."""
    return [t["response"] for t in node_turns(node, limit=100_000) if t["source"] == "llm"]


def normalized(turn: dict[str, Any]) -> dict[str, Any]:
    """A turn as compared: its messages, response and tool calls, with tool-call ids numbered by position."""
    ids: dict[str, str] = {}

    def fix(message: dict[str, Any]) -> dict[str, Any]:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [{**c, "id": ids.setdefault(str(c.get("id")), f"#{len(ids)}")}
                                     for c in message["tool_calls"]]  # fmt: skip
        if "tool_call_id" in message:
            message["tool_call_id"] = ids.setdefault(str(message["tool_call_id"]), f"#{len(ids)}")
        if message.get("role") == "assistant" and not message.get("content"):
            message["content"] = ""
        if message.get("role") == "tool":
            # An answer replayed from the records has the same values; its keys may come in another
            # order (the database keeps JSON objects sorted), so JSON answers compare as values.
            with contextlib.suppress(ValueError):  # a cut answer is compared as the text it is
                message["content"] = canonical_json(json.loads(message.get("content") or ""))
        return message

    return {
        "segment": turn["segment"],
        "summary": turn["summary"],
        "messages": [fix(m) for m in turn["messages"]],
        "response": fix(turn["response"]),
        "tool_messages": [fix(m) for m in turn["tool_messages"]],
    }


@dataclass
class ReplayReport:
    node: str
    original: list[dict[str, Any]]
    replayed: list[dict[str, Any]]
    first_divergence: int | None = None  # the turn number (1-based) where the two first differ
    detail: str = ""

    @property
    def matches(self) -> bool:
        return self.first_divergence is None


@dataclass
class ReplayView:
    """The StepView of one replayed step: the model over HTTP, the tools from the recording."""

    role: str
    handle: str
    step: int
    briefing: dict[str, Any]
    state: dict[str, Any]
    inbox: list[dict[str, Any]]
    poll_seconds: float
    wait_seconds: float
    tokens_left: int
    prompt_template: str
    context_tokens: int
    _tools: list[dict[str, Any]]
    _calls: list[dict[str, Any]]
    _llm: ChatLLM
    turns: list[dict[str, Any]] = field(default_factory=list)

    def definitions(self) -> list[dict[str, Any]]:
        return self._tools

    def tool_names(self) -> set[str]:
        return {t["function"]["name"] for t in self._tools}

    def call(self, name: str, args: dict[str, Any] | None = None, *, if_match: str | None = None) -> ToolResult:
        args = args or {}
        if not self._calls:
            raise Diverged(f"called {name} where the recording made no more calls")
        recorded = self._calls.pop(0)
        if recorded["name"] != name or recorded["arguments"] != args:
            made = json.dumps(args, sort_keys=True)[:300]
            wanted = json.dumps(recorded["arguments"], sort_keys=True)[:300]
            raise Diverged(f"called {name}({made}) where the recording called {recorded['name']}({wanted})")
        return ToolResult.from_json(recorded["result"])

    def llm(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, segment: int = 0, summary: str = ""
    ) -> LLMTurn:
        turn = self._llm.complete(messages, tools)
        self.turns.append({"messages": [dict(m) for m in messages], "response": turn.assistant_message(),
                           "segment": segment, "summary": summary})  # fmt: skip
        return turn


def _first_difference(original: dict[str, Any], replayed: dict[str, Any]) -> str:
    for key in ("segment", "summary"):
        if original[key] != replayed[key]:
            return f"{key}: recorded {original[key]!r}, replayed {replayed[key]!r}"
    for number, (a, b) in enumerate(zip(original["messages"], replayed["messages"], strict=False), start=1):
        if a != b:
            return f"request message {number} ({a.get('role')}): recorded {json.dumps(a)[:300]}, replayed " \
                   f"{json.dumps(b)[:300]}"  # fmt: skip
    if len(original["messages"]) != len(replayed["messages"]):
        return f"the request has {len(replayed['messages'])} messages, the recording {len(original['messages'])}"
    if original["response"] != replayed["response"]:
        return f"response: recorded {json.dumps(original['response'])[:300]}, replayed " \
               f"{json.dumps(replayed['response'])[:300]}"  # fmt: skip
    for number, (a, b) in enumerate(zip(original["tool_messages"], replayed["tool_messages"], strict=False), 1):
        if a != b:
            return f"tool answer {number}: recorded {json.dumps(a)[:300]}, replayed {json.dumps(b)[:300]}"
    return "the tool answers differ in number"


def replay_node(
    node: ResearchNode, *, llm_base_url: str, policy: Any = None, prompt_template: str | None = None
) -> ReplayReport:
    """Replay ``node``'s recorded LLM conversation through ``policy`` (the LLM policy by default)."""
    run = node.run
    role = node_role(node)
    recorded = [t for t in node_turns(node, limit=100_000) if t["source"] == "llm"]
    original = [normalized({**t, "messages": t["request"]["messages"]}) for t in recorded]
    report = ReplayReport(node=node.handle, original=original, replayed=[])
    config = dataclasses.replace(llm_config(role, run_llm_profile(run)), base_url=llm_base_url, max_retries=0,
                                 api_key="replay")  # fmt: skip
    client = ChatLLM(config)
    loops = loop_config()
    policy = policy if policy is not None else LLMPolicy(role=role)
    state: dict[str, Any] = {}
    for number, turn in enumerate(recorded, start=1):
        view = ReplayView(
            role=role, handle=node.handle, step=turn["step"], briefing=_briefing(run, node), state=state,
            inbox=list(turn["inbox"]), poll_seconds=loops.poll_seconds, wait_seconds=loops.wait_seconds,
            tokens_left=10**12, prompt_template=prompt_template if prompt_template is not None else prompt_text(role),
            context_tokens=config.context_tokens, _tools=turn["request"]["tools"] or [], _calls=list(turn["calls"]),
            _llm=client,
        )  # fmt: skip
        try:
            outcome: Outcome = policy.step(view)
        except Diverged as exc:
            report.first_divergence, report.detail = number, f"turn {number}: {exc}"
            return report
        if not view.turns:
            report.first_divergence, report.detail = number, f"turn {number}: the policy made no model call"
            return report
        after = list((outcome.state or {}).get("messages") or [])
        made = view.turns[-1]
        made["tool_messages"] = [m for m in after[len(made["messages"]) + 1 :] if m.get("role") == "tool"]
        replayed = normalized(made)
        report.replayed.append(replayed)
        if replayed != original[number - 1]:
            report.first_divergence = number
            report.detail = f"turn {number}: {_first_difference(original[number - 1], replayed)}"
            return report
        state = dict(outcome.state or {})
    return report
