"""Agent tokens: bearer credentials bound to (run, research node, role), and their DRF plumbing.

A token is 256 random bits shown once; the database keeps its sha256 digest and a short prefix
for logs. Lookups hash the presented token and find the row by the unique digest, so checking a
token costs one indexed query and no slow password hash (the token is not guessable anyway).
A token stops authenticating when revoked, when past ``expires_at``, or when its run has ended
(finished, failed, stopped): agents of a closed run can no longer act. Each web process keeps a
resolved token for ``RSI_TOKEN_CACHE_SECONDS`` (default 5) so most calls skip the look-up: a
revocation, or the end of its run, takes effect in the revoking process at once and in the others
within that many seconds; expiry is checked on every call.

Agent tokens authenticate the REST API only. They never create a Django session, so they cannot
open the UI or the admin; and people (sessions) cannot call agent tools (apps.expos.views).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import marshal
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from django.conf import settings
from django.core.cache import cache
from django.db import models, transaction
from django.db.models.base import ModelState
from django.http import HttpRequest
from django.utils import timezone
from rest_framework import HTTP_HEADER_ENCODING, authentication, exceptions, permissions, throttling
from rest_framework.request import Request

from apps.core.errors import ApplicationError
from apps.core.people import is_human_viewer
from apps.core.transient import DB_TRANSIENT_ERRORS, REDIS_TRANSIENT_ERRORS, ServiceUnavailable
from apps.experiments.events import event_append
from apps.expos.models import AgentToken
from apps.expos.registry import Role
from apps.research.choices import RUN_TERMINAL_STATES, NodeKind, RunStatus
from apps.research.models import ResearchNode, Run

logger = logging.getLogger(__name__)

TOKEN_PREFIX_LENGTH = 8
# last_used_at is informational; writing it on every call would put an UPDATE on every request.
LAST_USED_RESOLUTION = timedelta(seconds=60)

# The role a token may carry for each kind of research node: a token acts as its node.
_ROLE_FOR_KIND = {NodeKind.MAIN: Role.MAIN, NodeKind.WORKER: Role.WORKER, NodeKind.REVIEWER: Role.REVIEWER}


# How a 401 names the end of a token's run.
_ENDED: dict[str, str] = {
    RunStatus.FINISHED: "finished (the final evaluation is done)",
    RunStatus.FAILED: "failed",
    RunStatus.STOPPED: "been stopped by a person",
}


def token_digest(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def agent_token_issue(
    *, run: Run, node: ResearchNode, role: str, expires_at: datetime | None = None, actor: str = "system"
) -> tuple[str, AgentToken]:
    """Mint a token for ``node`` acting as ``role``; returns (plaintext, row). The plaintext is not stored."""
    if node.run_id != run.pk:
        raise ApplicationError("foreign_node", f"{node.handle} does not belong to run {run.uuid}.")
    if _ROLE_FOR_KIND.get(node.kind) != role:
        raise ApplicationError(
            "role_mismatch", f"A {node.kind} node acts as {_ROLE_FOR_KIND.get(node.kind)}, not {role}."
        )
    if run.status in RUN_TERMINAL_STATES:
        raise ApplicationError("run_finished", f"Run {run.uuid} is {run.status}; it takes no new agents.", status=409)
    plaintext = secrets.token_urlsafe(32)
    with transaction.atomic():
        token = AgentToken(
            run=run,
            node=node,
            role=role,
            digest=token_digest(plaintext),
            prefix=plaintext[:TOKEN_PREFIX_LENGTH],
            expires_at=expires_at,
        )
        token.full_clean()
        token.save()
        event_append(
            run=run,
            type="token.issued",
            actor=actor,
            role="system",
            arguments={"node": node.handle, "role": role, "prefix": token.prefix, "expires_at": expires_at},
            result_ref=f"node:{node.uuid}",
        )
    return plaintext, token


def agent_token_revoke(*, token: AgentToken, actor: str = "system", reason: str = "") -> AgentToken:
    """Revoke a token at once. Idempotent: revoking a revoked token changes nothing."""
    with transaction.atomic():
        locked = AgentToken.objects.select_for_update().get(pk=token.pk)
        if locked.revoked_at is not None:
            return locked
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at", "updated_at"])
        # This process stops at once; the others within RSI_TOKEN_CACHE_SECONDS. Dropped again
        # after the commit: a call in between may have cached the row as it was before.
        _RESOLVED.pop(locked.digest, None)
        transaction.on_commit(lambda: _RESOLVED.pop(locked.digest, None))
        event_append(
            run=locked.run,
            type="token.revoked",
            actor=actor,
            role="system",
            arguments={"prefix": locked.prefix, "reason": reason},
            result_ref=f"node:{locked.node.uuid}",
        )
    return locked


def agent_token_resolve(plaintext: str) -> AgentToken:
    """The live token for ``plaintext``, with its run and node loaded; AuthenticationFailed otherwise."""
    # Not the run's benchmark: its sample-id lists can be long, and few tools read it. The digest
    # is unique: a slice, not .first(), which would add an ORDER BY (compiled on every call).
    found = AgentToken.objects.select_related("run", "node").filter(digest=token_digest(plaintext))[:1]
    token = found[0] if found else None
    if token is None:
        raise exceptions.AuthenticationFailed("Unknown agent token.")
    now = timezone.now()
    if token.revoked_at is not None:
        raise exceptions.AuthenticationFailed(f"Agent token {token.prefix}… was revoked.")
    if token.expires_at is not None and token.expires_at <= now:
        raise exceptions.AuthenticationFailed(f"Agent token {token.prefix}… expired at {token.expires_at.isoformat()}.")
    if token.run.status in RUN_TERMINAL_STATES:
        raise exceptions.AuthenticationFailed(
            f"Agent token {token.prefix}… expired with its run: the run has {_ENDED[token.run.status]}, so its agents "
            "no longer act (its result is for the run's people)."
        )
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        # Conditional update: concurrent calls of one token write it once, and never a full save.
        AgentToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


# digest -> (monotonic time it was resolved, the token with its run and node). Entries are only
# ever replaced whole, so threads of one process share it without a lock.
_RESOLVED: dict[str, tuple[float, AgentToken]] = {}
_RESOLVED_MAX = 10_000
_M = TypeVar("_M", bound=models.Model)


def _json_copy(value: Any) -> Any:
    """A copy of a JSON value (what a JSONField holds): new dicts and lists, shared immutables.

    Through marshal, which writes and reads exactly JSON's types in C (a run's policy is a few
    dozen objects, copied on every call); anything else falls back to ``copy.deepcopy``.
    """
    try:
        return marshal.loads(marshal.dumps(value))  # noqa: S302 - bytes written on this line
    except ValueError:
        return copy.deepcopy(value)


def _row_copy(instance: _M, memo: dict[int, Any]) -> _M:
    """A copy of a model instance that shares nothing mutable with it: its own ``_state``, copies of
    its JSON values and of the related instances it has loaded (one copy per instance, as
    ``deepcopy``'s memo does), at a fraction of ``deepcopy``'s cost (it walked every field's value
    and the model state on every request: an eighth of an append's time in a profile). Built
    field by field rather than by ``copy.copy`` (``Model.__getstate__``'s pickling path), whose
    cost was still a twelfth of an append's CPU."""
    if id(instance) in memo:
        return cast(_M, memo[id(instance)])
    cls = type(instance)
    clone = cls.__new__(cls)
    memo[id(instance)] = clone
    values = instance.__dict__.copy()
    old_state = values["_state"]
    state = values["_state"] = ModelState()
    state.db, state.adding = old_state.db, old_state.adding
    for name, value in values.items():
        if isinstance(value, dict | list):
            values[name] = _json_copy(value)
    clone.__dict__.update(values)
    # The related instances loaded with it (select_related): ``fields_cache`` exists only once set.
    state.fields_cache = {
        name: None if related is None else _row_copy(related, memo)
        for name, related in old_state.__dict__.get("fields_cache", {}).items()
    }
    return clone


def agent_token_authenticate(plaintext: str) -> AgentToken:
    """``agent_token_resolve`` behind a per-process cache of ``RSI_TOKEN_CACHE_SECONDS``.

    A hit costs no query. Its price is a bounded lag: a token revoked in another process, or whose
    run ended, still authenticates here until its entry is that old (this process drops it at
    once on revocation). Expiry needs no look-up and is checked on every hit. Each caller gets
    its own copy of the token, run and node, so no request sees another's changes to them.
    """
    ttl = float(getattr(settings, "RSI_TOKEN_CACHE_SECONDS", 0) or 0)
    if ttl <= 0:
        return agent_token_resolve(plaintext)
    digest = token_digest(plaintext)
    now = time.monotonic()
    entry = _RESOLVED.get(digest)
    if entry is None or now - entry[0] >= ttl:
        token = agent_token_resolve(plaintext)
        if len(_RESOLVED) >= _RESOLVED_MAX:
            _RESOLVED.clear()  # a crude bound: refilling costs one look-up per live token
        _RESOLVED[digest] = (now, token)
        return _row_copy(token, {})
    token = entry[1]
    if token.expires_at is not None and token.expires_at <= timezone.now():
        _RESOLVED.pop(digest, None)
        raise exceptions.AuthenticationFailed(f"Agent token {token.prefix}… expired at {token.expires_at.isoformat()}.")
    return _row_copy(token, {})


@dataclass(frozen=True)
class AgentPrincipal:
    """``request.user`` for an agent: authenticated, never staff, never a Django user."""

    token: AgentToken

    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False
    is_active = True
    pk = None

    @property
    def role(self) -> str:
        return self.token.role

    def get_username(self) -> str:
        return f"agent:{self.token.node.handle}"

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return False

    def __str__(self) -> str:
        return self.get_username()


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>``. Answers 401 with ``WWW-Authenticate: Bearer`` when absent."""

    keyword = "Bearer"

    def authenticate(self, request: Request | HttpRequest) -> tuple[AgentPrincipal, AgentToken] | None:
        # From META, as DRF's get_authorization_header reads it, without building request.headers.
        value = request.META.get("HTTP_AUTHORIZATION", b"")
        header = (value.encode(HTTP_HEADER_ENCODING) if isinstance(value, str) else value).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Send the header as 'Authorization: Bearer <token>'.")
        try:
            plaintext = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("An agent token is ASCII.") from None
        token = agent_token_authenticate(plaintext)
        return AgentPrincipal(token), token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="expos"'


def agent_token_of(request: Request | HttpRequest) -> AgentToken | None:
    """The token a request authenticated with (DRF's Request, or the Django request of an agent's
    call, which carries ``auth`` as DRF's Request sets it: apps.expos.views.ToolCallView)."""
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, AgentToken) else None


class IsAgentOrViewer(permissions.BasePermission):
    """Read endpoints: any live agent token (scoped by the visibility selectors) or a viewer+ person."""

    message = "Sign in as a viewer, operator or admin, or send an agent token."

    def has_permission(self, request: Request, view: Any) -> bool:
        if agent_token_of(request) is not None:
            return True
        return is_human_viewer(request.user)


class _LimiterOutage:
    """Per process: since when the rate limiter's store (Redis) has been unreachable, and the runs
    whose event log says so. A lock, because requests run on several threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.since: float | None = None  # time.monotonic() of the first failure
        self.started_at: datetime | None = None
        self.runs: dict[int, Run] = {}  # runs told of this outage (their restored event is owed)


_OUTAGE = _LimiterOutage()


# GCRA (the generic cell rate algorithm) in one script, so taking permits is one Redis round trip
# and concurrent callers of one token cannot both read the same count: the key holds the
# "theoretical arrival time" (ms, Redis's clock) of the next call; a call is let through while
# that lies at most ``burst = duration - interval`` ahead of now, which admits a burst of the full
# rate. A call may take up to ARGV[3] permits at once (a lease, below) and hand back ARGV[4] it
# took earlier and did not use. Returns {permits taken, ms to wait when none}.
_GCRA = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local wanted = tonumber(ARGV[3])
local unused = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]) or now) - unused * interval
if tat < now then tat = now end
local room = math.floor((burst + interval - (tat - now)) / interval + 1e-9)
local taken = math.min(wanted, room)
if taken < 1 then
    if unused > 0 then
        redis.call('SET', KEYS[1], string.format('%.3f', tat), 'PX', math.ceil(tat - now) + 1)
    end
    return {0, math.ceil(tat - now - burst)}
end
tat = tat + taken * interval
redis.call('SET', KEYS[1], string.format('%.3f', tat), 'PX', math.ceil(tat - now))
return {taken, 0}
"""

# A web process takes its tokens' permits in leases, so most calls skip the round trip: a lease
# starts at one permit, doubles while the token's calls use each lease up within its lifetime
# (``RSI_TOKEN_RATE_LEASE_SECONDS``), halves when one expires unused, and never exceeds what the
# rate allows in that lifetime (nor MAX_LEASE). Permits are counted in Redis when leased, so every
# process still draws on the one shared limit; a permit not used in time is handed back with the
# process's next lease for the token. A token can therefore run at most one lease ahead of its
# rate, and only within a lease's lifetime. A rate of a few calls a minute always leases one permit.
MAX_LEASE = 64
_MAX_LEASED_TOKENS = 10_000


@dataclass
class _Lease:
    permits: int = 0  # taken from Redis, not used yet
    expires: float = 0.0  # time.monotonic() after which they are not used
    size: int = 1  # permits the next lease asks for


class _Leases:
    """Per process: each token's current lease. A lock, because requests run on several threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[str, _Lease] = {}

    def use(self, key: str) -> bool:
        """Spend a leased permit of ``key`` if one is left and fresh."""
        with self.lock:
            lease = self.by_key.get(key)
            if lease is None or lease.permits == 0 or time.monotonic() >= lease.expires:
                return False
            lease.permits -= 1
            return True

    def next_lease(self, key: str, largest: int) -> tuple[int, int]:
        """(permits to ask for, unused permits to hand back), sizing the lease by how the last one went."""
        with self.lock:
            lease = self.by_key.get(key)
            if lease is None:
                if len(self.by_key) >= _MAX_LEASED_TOKENS:
                    self.by_key.clear()  # their unused permits stay counted: stricter, never looser
                lease = self.by_key[key] = _Lease()
            unused, lease.permits = lease.permits, 0
            if unused:
                lease.size = max(1, lease.size // 2)
            elif time.monotonic() < lease.expires:
                lease.size *= 2  # used up before it expired
            lease.size = max(1, min(lease.size, largest, MAX_LEASE))
            return lease.size, unused

    def add(self, key: str, permits: int, seconds: float) -> None:
        """Keep ``permits`` (the one this call spends already taken off) until ``seconds`` from now."""
        with self.lock:
            lease = self.by_key.setdefault(key, _Lease())
            lease.permits += permits
            lease.expires = time.monotonic() + seconds


_LEASES = _Leases()


class AgentTokenRateThrottle(throttling.SimpleRateThrottle):
    """Per-token rate limit, keyed by the token's digest; the rate is ``RSI_TOKEN_RATE`` ("600/min").

    People are not throttled here: the limit exists to keep a runaway agent loop from flooding the
    database. With Redis as the cache (REDIS_URL set, so all web processes share the counts) a
    check spends a permit this process leased (``_Leases``) or is one script call (``_GCRA``);
    any other cache gets DRF's sliding window.

    When Redis is unreachable the limit *degrades open*: requests pass uncounted for at most
    ``RSI_RATE_LIMIT_FAIL_OPEN_SECONDS`` (60), recorded as a ``rate_limit.degraded`` event on each
    affected run (and ``rate_limit.restored`` when Redis answers again). A brief Redis restart
    then costs no agent call; a long outage answers 503 ``rate_limiter_unavailable`` instead of
    leaving agents unlimited for good.
    """

    scope = "agent_token"

    def get_rate(self) -> str | None:
        return getattr(settings, "RSI_TOKEN_RATE", "600/min") or None

    def allow_request(self, request: Request | HttpRequest, view: Any) -> bool:
        # Read the rate per request (not once at import) so a changed setting applies at once.
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        try:
            allowed = self._allow(request, view)
        except REDIS_TRANSIENT_ERRORS as exc:
            return _degrade_open(agent_token_of(request), exc)
        if _OUTAGE.since is not None:  # a read without the lock: the common case costs nothing
            _outage_over()
        return allowed

    def _allow(self, request: Request | HttpRequest, view: Any) -> bool:
        # Django's Redis cache keeps its redis-py client behind ``_cache.get_client``.
        get_client = getattr(getattr(cache, "_cache", None), "get_client", None)
        if self.rate is None or get_client is None:
            # DRF's sliding window reads the request only through get_cache_key (ours, below).
            return super().allow_request(cast(Request, request), view)
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self._wait_ms = self._redis_wait_ms(get_client(write=True), self.key)
        return self._wait_ms == 0

    def _redis_wait_ms(self, client: Any, key: str) -> int:
        """0 when the call is within the rate, else how long to wait (ms): a leased permit, or one round trip."""
        if _LEASES.use(key):
            return 0
        assert self.num_requests is not None
        assert self.duration is not None
        lifetime = float(getattr(settings, "RSI_TOKEN_RATE_LEASE_SECONDS", 1.0))
        largest = int(self.num_requests * lifetime / self.duration)  # 0 (no leases) when lifetime is 0
        wanted, unused = _LEASES.next_lease(key, largest)
        interval = self.duration * 1000 / self.num_requests
        script = _gcra_script(client)
        args = [interval, self.duration * 1000 - interval, wanted, unused]
        taken, wait_ms = script(keys=[cache.make_key(key)], args=args, client=client)
        if taken < 1:
            return max(1, int(wait_ms))
        _LEASES.add(key, int(taken) - 1, lifetime)
        return 0

    def wait(self) -> float | None:
        if hasattr(self, "_wait_ms"):
            return self._wait_ms / 1000
        return super().wait()

    def get_cache_key(self, request: Request | HttpRequest, view: Any) -> str | None:
        token = agent_token_of(request)
        if token is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": token.digest}


def _degrade_open(token: AgentToken | None, exc: Exception) -> bool:
    """Let the request through while the outage is young; 503 once it is older than the limit."""
    limit = float(getattr(settings, "RSI_RATE_LIMIT_FAIL_OPEN_SECONDS", 60))
    now = time.monotonic()
    with _OUTAGE.lock:
        if _OUTAGE.since is None:
            _OUTAGE.since, _OUTAGE.started_at = now, timezone.now()
            logger.warning("rate limiter: Redis unreachable (%s); open for at most %.0fs", exc, limit)
        since, started_at = _OUTAGE.since, _OUTAGE.started_at
        untold = token is not None and token.run_id not in _OUTAGE.runs
        if untold and token is not None:
            _OUTAGE.runs[token.run_id] = token.run
    if untold and token is not None:
        arguments = {"error": f"{type(exc).__name__}: {exc}"[:500], "since": started_at,
                     "fail_open_seconds": limit}  # fmt: skip
        if not _record_limiter_event(token.run, "rate_limit.degraded", arguments):
            with _OUTAGE.lock:
                _OUTAGE.runs.pop(token.run_id, None)  # told next time, when the database answers
    if now - since >= limit:  # 0: never open
        raise ServiceUnavailable(
            "rate_limiter_unavailable",
            f"The rate limiter's store (Redis) has been unreachable for {now - since:.0f}s, longer than the "
            f"{limit:.0f}s it may run open; retry shortly.",
        )
    return True


def _outage_over() -> None:
    with _OUTAGE.lock:
        if _OUTAGE.since is None:
            return
        seconds = time.monotonic() - _OUTAGE.since
        runs = list(_OUTAGE.runs.values())
        _OUTAGE.since, _OUTAGE.started_at, _OUTAGE.runs = None, None, {}
    logger.warning("rate limiter: Redis answers again after %.0fs", seconds)
    for run in runs:
        _record_limiter_event(run, "rate_limit.restored", {"outage_seconds": round(seconds, 1)})


def _record_limiter_event(run: Run, type: str, arguments: dict[str, Any]) -> bool:
    """Record a limiter event on the run's log; False when the database is away too."""
    try:
        event_append(run=run, type=type, actor="rate_limiter", role="system", arguments=arguments)
    except DB_TRANSIENT_ERRORS:
        logger.warning("rate limiter: %s for run %s not recorded (database unavailable)", type, run.uuid)
        return False
    return True


_SCRIPTS: dict[int, Any] = {}


def _gcra_script(client: Any) -> Any:
    """The registered script (EVALSHA, loaded on first use) per Redis client."""
    script = _SCRIPTS.get(id(client))
    if script is None:
        script = _SCRIPTS[id(client)] = client.register_script(_GCRA)
    return script
