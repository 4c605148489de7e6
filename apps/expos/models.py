"""Agent tokens and idempotency records of the Experiment OS."""

from __future__ import annotations

from django.db import models

from apps.core.models import BaseModel


class AgentToken(BaseModel):
    """A bearer token bound to (run, research node, role). Only its sha256 digest is stored.

    A digest, not a slow password hash: tokens are 256-bit random, so brute force is moot and
    every API call can verify in microseconds.
    """

    run = models.ForeignKey("research.Run", on_delete=models.PROTECT, related_name="tokens")
    node = models.ForeignKey("research.ResearchNode", on_delete=models.PROTECT, related_name="tokens")
    role = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)  # first characters, to tell tokens apart in logs
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)


class IdempotencyRecord(BaseModel):
    """The stored answer to a call made with an Idempotency-Key, replayed on retries."""

    node = models.ForeignKey("research.ResearchNode", on_delete=models.PROTECT, related_name="+")
    key = models.CharField(max_length=200)
    tool = models.CharField(max_length=100)
    request_sha256 = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    response = models.JSONField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "key"], name="idempotency_unique")]
