"""The one HTTP client through which every agent of ours acts: the ExpOS REST API, nothing else.

Built from the registry's definitions endpoint (GET /api/v1/tools/definitions), which is generated
from the same declarations as the endpoints, so the client's idea of the tools is the server's.
Agent logic gets answers as plain JSON (:class:`ToolResult`) and errors as data, never as
exceptions: a refused call is evidence the agent must act on, not a crash. Only an unreachable
server raises (:class:`ApiUnavailable`), after retries, so the step can be retried later.

Transient answers (a connection error, 429, 502-504: the database or Redis behind the server is
briefly away, or the server restarts) are retried with exponential back-off and jitter, for a
number of attempts or, in an agent step, until a deadline inside the step's lease (``deadline``).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

logger = logging.getLogger(__name__)

# Status codes worth a retry: the server or a proxy is briefly unable to answer.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
TOOLS_PATH = "/api/v1/tools"
# The longest single pause between two attempts, and the longest Retry-After honoured.
MAX_BACKOFF_SECONDS = 15.0
MAX_RETRY_AFTER_SECONDS = 30.0
# Jitter spreads the retries of agents that failed together (one outage), so they do not return
# together; not a secret, but the system source keeps the linter's rule about `random` simple.
_JITTER = secrets.SystemRandom()


_DEFINITIONS: dict[tuple[str, str], list[dict[str, Any]]] = {}


class ApiUnavailable(RuntimeError):
    """The REST API could not be reached (or kept answering 5xx/429) after retries."""


class TokenRejected(RuntimeError):
    """401: the agent token is unknown, revoked or expired (its run may have ended)."""


class ServerFault(RuntimeError):
    """A 5xx the server answered after retries (a server bug, not a refusal); see policies.heuristic."""

    def __init__(self, result: ToolResult) -> None:
        super().__init__(f"{result.name}: HTTP {result.status} {result.error_code}: {result.error_message}"[:600])
        self.result = result


@dataclass(frozen=True)
class ToolResult:
    """One tool call's answer: ``data`` is the tool's JSON result, or the ``{"error": ...}`` body."""

    name: str
    status: int
    data: dict[str, Any]
    replayed: bool = False

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def error_code(self) -> str:
        error = self.data.get("error") if isinstance(self.data, dict) else None
        return str(error.get("code", "")) if isinstance(error, dict) else ""

    @property
    def error_message(self) -> str:
        error = self.data.get("error") if isinstance(self.data, dict) else None
        return str(error.get("message", "")) if isinstance(error, dict) else ""

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "data": self.data, "replayed": self.replayed}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ToolResult:
        return cls(name=value["name"], status=int(value["status"]), data=value["data"],
                   replayed=bool(value.get("replayed")))  # fmt: skip


@dataclass
class ExposClient:
    """Calls ExpOS tools as one research node (its bearer token).

    Retries transport errors, 429 and 502-504 with exponential backoff and jitter (honouring
    Retry-After): ``retries`` more attempts, or, with a ``deadline`` (a ``time.monotonic()``
    value), as many as fit before it. The same Idempotency-Key goes with every retry, so a create
    that reached the server once is answered from its stored result, never performed twice.
    """

    base_url: str
    token: str
    role: str = ""
    timeout: float = 60.0
    retries: int = 4
    backoff: float = 0.5
    deadline: float | None = None
    _http: httpx.Client | None = field(default=None, repr=False)
    _definitions: list[dict[str, Any]] | None = field(default=None, repr=False)

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(
                base_url=self.base_url.rstrip("/"),
                timeout=self.timeout,
                headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
            )
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def _request(
        self, method: str, path: str, *, body: Any = None, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                if body is None:
                    response = self._client().request(method, path, headers=headers)
                else:
                    response = self._client().request(
                        method, path, content=json.dumps(body).encode(), headers={
                            "Content-Type": "application/json", **(headers or {})},
                    )  # fmt: skip
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == 401:
                    raise TokenRejected(response.text[:500])
                if response.status_code not in RETRY_STATUSES:
                    return response
                last = f"HTTP {response.status_code} {_error_code(response)}".rstrip()
                retry_after = _retry_after(response)
            pause = self._pause(attempt, retry_after)
            if pause is None:
                break
            logger.info("%s %s: %s; attempt %d again in %.1fs", method, path, last, attempt + 2, pause)
            time.sleep(pause)
            attempt += 1
        raise ApiUnavailable(f"{method} {path}: {last} after {attempt + 1} attempts")

    def _pause(self, attempt: int, retry_after: float | None) -> float | None:
        """How long to wait before the next attempt; None when none is left (count or deadline)."""
        if self.deadline is None and attempt >= self.retries:
            return None
        ceiling = min(self.backoff * 2.0**attempt, MAX_BACKOFF_SECONDS)
        # "Equal jitter": at least half the exponential step, so retries still spread out in time.
        pause = ceiling / 2 + _JITTER.uniform(0.0, ceiling / 2)
        if retry_after is not None:
            pause = max(pause, min(retry_after, MAX_RETRY_AFTER_SECONDS))
        if self.deadline is not None and time.monotonic() + pause >= self.deadline:
            return None
        return pause

    # --- the registry ------------------------------------------------------------------------------

    def definitions(self) -> list[dict[str, Any]]:
        """The OpenAI-style function definitions of this token's role.

        Fetched once per process and role (``role`` names the cache entry; the server answers with
        the token's own role): the registry changes only with a deploy, which restarts the workers.
        """
        if self._definitions is None:
            cached = _DEFINITIONS.get((self.base_url, self.role)) if self.role else None
            if cached is None:
                response = self._request("GET", f"{TOOLS_PATH}/definitions")
                if response.status_code != 200:
                    raise ApiUnavailable(f"tool definitions: HTTP {response.status_code}: {response.text[:300]}")
                body = response.json()
                cached = list(body["tools"])
                _DEFINITIONS[(self.base_url, str(body.get("role", self.role)))] = cached
            self._definitions = cached
        return self._definitions

    def tool_names(self) -> set[str]:
        return {d["function"]["name"] for d in self.definitions()}

    # --- calls ------------------------------------------------------------------------------------

    def call(self, name: str, args: dict[str, Any] | None = None, *, idempotency_key: str | None = None,
             if_match: str | None = None) -> ToolResult:  # fmt: skip
        """POST /api/v1/tools/<name>. A tool this role does not have is answered locally, as the server would."""
        if name not in self.tool_names():
            return ToolResult(name=name, status=404, data={"error": {
                "code": "unknown_tool", "message": f"There is no tool {name!r} for this role."}})  # fmt: skip
        headers: dict[str, str] = {}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        if if_match:
            headers["If-Match"] = if_match
        response = self._request("POST", f"{TOOLS_PATH}/{name}", body=args or {}, headers=headers)
        try:
            data = response.json()
        except ValueError:
            data = {"error": {"code": "invalid_response", "message": response.text[:500]}}
        if not isinstance(data, dict):
            data = {"value": data}
        return ToolResult(
            name=name,
            status=response.status_code,
            data=data,
            replayed=response.headers.get("Idempotent-Replayed") == "true",
        )


def _error_code(response: httpx.Response) -> str:
    """The machine-readable code of an error body (``database_unavailable``, ...), or ""."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return ""
    return str(error.get("code", "")) if isinstance(error, dict) else ""


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
