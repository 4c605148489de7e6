"""Bundles and chains prove themselves (issue 33, items 7 and 10).

A bundle carries a manifest of every record's hash and the chain's head, signed with the
exporting instance's Ed25519 key; import refuses every tampering a red team tried (a score
raised, a finding cleaned, blocked attempts dropped, a tail cut, a chain re-hashed, an unsigned
base model, unknown columns, sealed items planted in a text field, an archive past the size
limit), each drawn by a seeded generator. Live, a run chain's head is anchored outside the
database, and a cut tail or a re-hashed chain fails ``chain_verify``.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import random
import zipfile
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.db import connection

from apps.core.errors import ApplicationError
from apps.core.hashing import canonical_json
from apps.experiments.anchors import anchors_of, sign
from apps.experiments.events import chain_key, chain_verify, content_hash, event_append, link_hash
from apps.experiments.models import Event, EventChain, Experiment
from apps.flows.agent_reports import claim_revise
from apps.flows.bundle import (
    BUNDLE_JSON,
    bundle_archive,
    bundle_manifest,
    bundle_read,
    bundle_sealed_text,
    bundle_sign,
    bundle_verify,
    export_run_bundle,
    import_run_bundle,
)
from apps.integrity.models import IntegrityFinding
from apps.integrity.services import integrity_check_reports
from apps.research.models import Run
from tests.apps.dashboard.world import make_people
from tests.support.bundles import sealed_finished_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def exported(db, settings, tmp_path):
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    world, sealed = sealed_finished_world(tmp_path, people=make_people())
    return world, sealed, export_run_bundle(world.run)


def refused(bundle: dict[str, Any], **kwargs: Any) -> str:
    runs = Run.objects.count()
    with pytest.raises(ApplicationError) as caught:
        import_run_bundle(bundle, **kwargs)
    assert Run.objects.count() == runs  # nothing half-written
    return caught.value.code


def test_an_untouched_bundle_proves_itself(exported):
    world, _, bundle = exported
    manifest = bundle_verify(bundle)
    assert manifest["chain"]["head_seq"] == len(bundle["tables"]["experiments.event"])
    assert set(manifest["records"]) == set(bundle["tables"])
    # Its texts carry none of the benchmark's sealed items: the scan does not flag honest work.
    assert bundle_sealed_text(bundle, world.run.benchmark) == []
    # In the same database it stops only at the run that exists here.
    assert refused(bundle) == "run_exists"


# --------------------------------------------------------------------------- records (item 7)


def _rows(bundle: dict[str, Any], label: str) -> list[dict[str, Any]]:
    return bundle["tables"][label]


def raise_a_score(bundle: dict[str, Any], rng: random.Random) -> None:
    row = rng.choice([r for r in _rows(bundle, "experiments.evaluation") if r["score"] is not None])
    row["score"] = round(min(1.0, float(row["score"]) + rng.uniform(0.05, 0.95)), 4)


def clean_a_finding(bundle: dict[str, Any], rng: random.Random) -> None:
    findings = _rows(bundle, "integrity.integrityfinding")
    if rng.random() < 0.5:
        findings.remove(rng.choice(findings))
    else:
        row = rng.choice(findings)
        row["evidence"] = {"summary": "nothing found"}


def drop_blocked_attempts(bundle: dict[str, Any], rng: random.Random) -> None:
    rows = _rows(bundle, "integrity.blockedattempt")
    del rows[rng.randrange(len(rows)) :]


def flip_samples(bundle: dict[str, Any], rng: random.Random) -> None:
    for row in rng.sample(_rows(bundle, "experiments.evaluationsample"), 1):
        row["correct"] = not row["correct"]


def edit_a_text(bundle: dict[str, Any], rng: random.Random) -> None:
    row = rng.choice(_rows(bundle, "research.researchnode"))
    field = rng.choice(["summary", "task"])
    row[field] = (row[field] or "") + rng.choice([" (best of all runs)", " 0.95 on final", "."])


def add_a_record(bundle: dict[str, Any], rng: random.Random) -> None:
    rows = _rows(bundle, rng.choice(["experiments.evaluation", "integrity.findingchange", "research.llmusage"]))
    if not rows:
        rows = _rows(bundle, "experiments.evaluation")
    extra = copy.deepcopy(rng.choice(rows))
    extra["id"] = max(r["id"] for r in rows) + rng.randint(1, 50)
    if "uuid" in extra:
        extra["uuid"] = f"00000000-0000-4000-8000-{rng.randrange(10**12):012d}"
    rows.append(extra)


def edit_the_scores_block(bundle: dict[str, Any], rng: random.Random) -> None:
    bundle["scores"]["raw"]["score"] = round(rng.uniform(0.5, 1.0), 3)


TAMPERINGS = [
    raise_a_score,
    clean_a_finding,
    drop_blocked_attempts,
    flip_samples,
    edit_a_text,
    add_a_record,
    edit_the_scores_block,
]


@pytest.mark.parametrize("tamper", TAMPERINGS, ids=lambda f: f.__name__)
def test_a_bundle_whose_records_differ_is_refused(exported, tamper):
    _, _, bundle = exported
    assert _rows(bundle, "integrity.blockedattempt")
    assert _rows(bundle, "integrity.integrityfinding")
    for seed in range(3):
        tampered = copy.deepcopy(bundle)
        tamper(tampered, random.Random(f"bundle:{tamper.__name__}:{seed}"))
        assert tampered != bundle
        assert refused(tampered) == "bundle_records_differ"


def other_key_sign(bundle: dict[str, Any]) -> None:
    """Re-sign as another instance would (its own key in the manifest)."""
    key = Ed25519PrivateKey.generate()
    manifest = bundle_manifest(bundle)
    manifest["signer"] = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    bundle["manifest"] = manifest
    bundle["signature"] = key.sign(canonical_json(manifest).encode("utf-8")).hex()


def test_a_tampered_bundle_signed_anew_is_refused_unless_its_key_is_trusted(exported):
    _, _, bundle = exported
    for seed, tamper in enumerate(TAMPERINGS):
        tampered = copy.deepcopy(bundle)
        tamper(tampered, random.Random(f"resign:{seed}"))
        other_key_sign(tampered)
        assert refused(tampered) == "bundle_untrusted"
    # A manifest edited to fit, the signature kept: the signature no longer holds.
    tampered = copy.deepcopy(bundle)
    raise_a_score(tampered, random.Random("edit-manifest"))
    tampered["manifest"] = bundle_manifest(tampered) | {"signer": bundle["manifest"]["signer"]}
    assert refused(tampered) == "bundle_signature"
    unsigned = copy.deepcopy(bundle)
    del unsigned["signature"]
    assert refused(unsigned) == "bundle_unsigned"
    # Signed by a key the operator trusts (import_run --trust), an honest bundle gets past the proof.
    honest = copy.deepcopy(bundle)
    other_key_sign(honest)
    assert refused(honest, trusted_keys=[honest["manifest"]["signer"]]) == "run_exists"


# --------------------------------------------------------------------------- the chain in bundles (item 10)


def cut_tail(bundle: dict[str, Any], rng: random.Random) -> None:
    events = sorted(_rows(bundle, "experiments.event"), key=lambda r: r["seq"])
    keep = len(events) - rng.randint(1, min(20, len(events) - 1))
    bundle["tables"]["experiments.event"] = events[:keep]
    chain = _rows(bundle, "experiments.eventchain")[0]
    chain["head_seq"], chain["head_hash"] = keep, events[keep - 1]["hash"]


def rehash(bundle: dict[str, Any], rng: random.Random) -> None:
    """Every link recomputed (plain sha256, no key) after one event's arguments were changed."""
    events = sorted(_rows(bundle, "experiments.event"), key=lambda r: r["seq"])
    target = rng.choice(events)
    target["arguments"] = {**(target["arguments"] or {}), "score": rng.random()}
    prev = "0" * 64
    for row in events:
        content = {
            "run": bundle["run"], "created_at": row["created_at"], "type": row["type"], "actor": row["actor"],
            "role": row["role"], "tool": row["tool"], "arguments": row["arguments"], "result_ref": row["result_ref"],
        }  # fmt: skip
        row["content_sha256"] = content_hash(content)
        row["prev_hash"], row["hash"] = prev, link_hash(prev, row["seq"], row["content_sha256"])
        prev = row["hash"]
    chain = _rows(bundle, "experiments.eventchain")[0]
    chain["head_hash"] = prev


@pytest.mark.parametrize("tamper", [cut_tail, rehash], ids=lambda f: f.__name__)
def test_a_cut_or_rehashed_chain_in_a_bundle_is_refused(exported, tamper):
    _, _, bundle = exported
    for seed in range(3):
        tampered = copy.deepcopy(bundle)
        tamper(tampered, random.Random(f"chain:{tamper.__name__}:{seed}"))
        assert refused(tampered) == "bundle_records_differ"
        # Even with the manifest's records made to fit and signed anew by an attacker's own key,
        # or listed with the old signature, the head is not the signed one.
        fitted = copy.deepcopy(tampered)
        fitted["manifest"] = {**bundle["manifest"], "records": bundle_manifest(fitted)["records"]}
        assert refused(fitted) == "bundle_signature"
        other_key_sign(fitted)
        assert refused(fitted) == "bundle_untrusted"


# --------------------------------------------------------------------------- what an import may register


def test_unknown_columns_and_tables_are_refused(exported):
    rng, bundle = random.Random("columns"), exported[2]
    for _ in range(4):
        tampered = copy.deepcopy(bundle)
        label = rng.choice(sorted(tampered["tables"]))
        row = rng.choice(tampered["tables"][label])
        row[rng.choice(["is_admin", "owner_id", "weights_uri", "x"])] = rng.choice([True, 1, "s3://elsewhere"])
        bundle_sign(tampered)  # even signed by the exporting instance itself
        assert refused(tampered) == "bundle_unknown_column"
    tampered = copy.deepcopy(bundle)
    tampered["tables"]["auth.user"] = [{"id": 1, "username": "root", "is_superuser": True}]
    bundle_sign(tampered)
    assert refused(tampered) == "bundle_unknown_column"


def test_a_base_model_the_exporter_did_not_sign_is_refused(exported):
    world, _, bundle = exported
    reference = world.run.benchmark.reference_checkpoint
    rng = random.Random("bases")
    template = copy.deepcopy(bundle["tables"]["experiments.checkpoint"][0])
    planted = {
        **template,
        "id": max(r["id"] for r in bundle["tables"]["experiments.checkpoint"]) + 1,
        "uuid": f"00000000-0000-4000-8000-{rng.randrange(10**12):012d}",
        "handle": f"base/{rng.randrange(10**6)}",
        "uri": reference.uri,
        "manifest": reference.manifest,
        "manifest_sha256": reference.manifest_sha256,
        "parent_id": None,
        "run_id": None,
        "is_base": True,
        "is_reference": False,
    }
    # Added after the export signed its list of bases (the records re-signed, the bases not).
    tampered = copy.deepcopy(bundle)
    tampered["tables"]["experiments.checkpoint"].append(planted)
    manifest = bundle_manifest(tampered)
    manifest["bases"] = bundle["manifest"]["bases"]
    tampered["manifest"] = manifest
    tampered["signature"] = sign(canonical_json(manifest).encode("utf-8"))
    assert refused(tampered) == "bundle_base_unsigned"
    # Signed as a base by the exporter, it is still the reference's weights under a base's name.
    bundle_sign(tampered)
    assert refused(tampered) == "bundle_base_is_reference"


# --------------------------------------------------------------------------- sealed text (item 7)


def test_sealed_items_planted_in_any_text_field_are_refused(exported):
    world, sealed, bundle = exported
    rng, tried = random.Random("plant"), 0
    places = [
        ("research.researchnode", "summary"),
        ("research.researchnode", "task"),
        ("research.decision", "rationale"),
        ("integrity.integrityfinding", "evidence"),
        ("research.optimizerclaim", "text"),
    ]
    for label, field in places:
        rows = bundle["tables"].get(label) or []
        if not rows:
            continue
        tried += 1
        tampered = copy.deepcopy(bundle)
        row = rng.choice(tampered["tables"][label])
        items = rng.sample(sealed, rng.randint(1, 5))
        text = "\n".join(f"{rng.choice(['Note', 'Seen', 'Q'])}: {i['prompt']} {i['answer']}" for i in items)
        row[field] = {"summary": text, "codes": []} if field == "evidence" else text
        bundle_sign(tampered)  # a dishonest exporter signs what it plants
        assert refused(tampered) == "bundle_sealed_text"
        planted = {sample for _, sample in bundle_sealed_text(tampered, world.run.benchmark)}
        assert planted >= {i["id"] for i in items}
    assert tried >= 3


# --------------------------------------------------------------------------- archives


def test_an_archive_past_the_decompression_limit_is_refused_unread(exported, settings, tmp_path):
    _, _, bundle = exported
    path = tmp_path / "bundle.zip"
    path.write_bytes(bundle_archive(bundle))
    assert bundle_read(path)["run"] == bundle["run"]
    inflated = len(zipfile.ZipFile(path).read(BUNDLE_JSON))
    settings.RSI_BUNDLE_MAX_BYTES = inflated - 1
    with pytest.raises(ApplicationError) as caught:
        bundle_read(path)
    assert caught.value.code == "bundle_too_large"
    # A bomb: a small zip that inflates far past the limit.
    settings.RSI_BUNDLE_MAX_BYTES = 1_000_000
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(BUNDLE_JSON, '{"format": "rsiweb.run-bundle", "pad": "' + "0" * 20_000_000 + '"}')
    (tmp_path / "bomb.zip").write_bytes(bomb.getvalue())
    assert len(bomb.getvalue()) < 100_000
    with pytest.raises(ApplicationError) as caught:
        bundle_read(tmp_path / "bomb.zip")
    assert caught.value.code == "bundle_too_large"
    bare = tmp_path / "run.json"
    bare.write_text(json.dumps(bundle), encoding="utf-8")
    settings.RSI_BUNDLE_MAX_BYTES = bare.stat().st_size - 1
    with pytest.raises(ApplicationError) as caught:
        bundle_read(bare)
    assert caught.value.code == "bundle_too_large"


# --------------------------------------------------------------------------- live chains (item 10)


def _superuser_sql(sql: str, params: list[Any]) -> None:
    """As the database superuser: triggers (the append-only guards) off for this statement."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(sql, params)
        cursor.execute("SET LOCAL session_replication_role = origin")


@pytest.fixture
def anchored_run(exported, django_capture_on_commit_callbacks):
    world, _, _ = exported
    run = world.run
    for k in range(30):
        event_append(run=run, type="test.note", actor="t", role="system", arguments={"k": k})
    with django_capture_on_commit_callbacks(execute=True):
        assert chain_verify(chain_key(run)).ok
    anchors = anchors_of(chain_key(run))
    assert anchors
    assert anchors[-1]["seq"] == EventChain.objects.get(key=chain_key(run)).head_seq
    return run


@pytest.mark.parametrize("seed", range(3))
def test_a_cut_tail_fails_live_verification(anchored_run, seed):
    key = chain_key(anchored_run)
    chain = EventChain.objects.get(key=key)
    cut = random.Random(f"live-cut:{seed}").randint(1, 20)
    keep = chain.head_seq - cut
    last = Event.objects.get(chain=chain, seq=keep)
    _superuser_sql("DELETE FROM experiments_event WHERE chain_id = %s AND seq > %s", [chain.pk, keep])
    _superuser_sql(
        "UPDATE experiments_eventchain SET head_seq = %s, head_hash = %s WHERE id = %s", [keep, last.hash, chain.pk]
    )
    report = chain_verify(key)
    assert not report.ok
    assert "tail was cut" in report.reason


@pytest.mark.parametrize("seed", range(3))
def test_a_rehashed_chain_fails_live_verification(anchored_run, seed):
    key = chain_key(anchored_run)
    chain = EventChain.objects.get(key=key)
    rng = random.Random(f"live-rehash:{seed}")
    events = list(Event.objects.filter(chain=chain).order_by("seq"))
    target = rng.choice(events)
    prev = "0" * 64
    for event in events:
        if event.pk == target.pk:
            event.arguments = {**(event.arguments or {}), "edited": rng.random()}
            content = {
                "run": key, "created_at": event.created_at.isoformat(), "type": event.type, "actor": event.actor,
                "role": event.role, "tool": event.tool, "arguments": event.arguments, "result_ref": event.result_ref,
            }  # fmt: skip
            event.content_sha256 = content_hash(content)
        event.prev_hash, event.hash = prev, link_hash(prev, event.seq, event.content_sha256)
        prev = event.hash
        _superuser_sql(
            "UPDATE experiments_event SET arguments = %s::jsonb, content_sha256 = %s, prev_hash = %s, hash = %s "
            "WHERE id = %s",
            [json.dumps(event.arguments), event.content_sha256, event.prev_hash, event.hash, event.pk],
        )
    _superuser_sql("UPDATE experiments_eventchain SET head_hash = %s WHERE id = %s", [prev, chain.pk])
    report = chain_verify(key)
    assert not report.ok
    assert "anchored" in report.reason


def test_a_forged_anchor_fails_live_verification(anchored_run, settings):
    key = chain_key(anchored_run)
    chain = EventChain.objects.get(key=key)
    path = settings.DATA_DIR / "chain-anchors" / f"{key}.jsonl"
    forged = {"seq": chain.head_seq, "hash": chain.head_hash, "signature": hashlib.sha512(b"x").hexdigest()}
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(forged) + "\n")
    report = chain_verify(key)
    assert not report.ok
    assert "not signed by this instance" in report.reason


def test_a_reports_finding_on_its_authors_node_travels_in_the_bundle(db, settings, tmp_path):
    """A false claim is a finding on its author's node (no experiment): the bundle carries it, signed."""
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    world, _ = sealed_finished_world(tmp_path, people=make_people())
    cited = Experiment.objects.filter(run=world.run).order_by("pk").first()
    assert cited is not None
    claim_revise(run=world.run, key="best", text=f"{cited.handle} reaches 0.987 on feedback.", evidence=[cited.handle])
    integrity_check_reports(run=world.run)
    on_node = IntegrityFinding.objects.filter(node__run=world.run, experiment__isnull=True)
    assert on_node.exists()

    bundle = export_run_bundle(world.run)
    rows = {row["id"]: row for row in _rows(bundle, "integrity.integrityfinding")}
    assert {f.pk for f in on_node} <= set(rows)
    assert all(rows[f.pk]["node_id"] == f.node_id and rows[f.pk]["experiment_id"] is None for f in on_node)
    bundle_verify(bundle)  # the manifest signs it like every other record
