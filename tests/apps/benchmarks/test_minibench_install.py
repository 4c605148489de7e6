"""The built minibench: installed by the management command (idempotently), honeypot and clean sets."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import (
    benchmark_load_sealed,
    benchmark_resolve,
    benchmark_scanner,
    benchmark_sealed_items,
    checkpoint_local_dir,
    minibench_install,
)
from apps.core.hashing import sha256_tree
from apps.datapool.selectors import data_readme, data_rows
from apps.datapool.services import data_register_from_catalog, data_transform
from apps.datapool.storage import artifact_store
from apps.experiments.models import Checkpoint
from apps.experiments.selectors import checkpoint_lineage
from apps.integrity.contamination import ContaminationScanner

pytestmark = pytest.mark.django_db


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def scanner_for(benchmark: Benchmark) -> ContaminationScanner:
    return benchmark_scanner(benchmark=benchmark)


def test_management_command_installs_and_is_idempotent(built_minibench, artifact_root, sealed_root):
    manifest = json.loads((built_minibench / "manifest.json").read_text())
    out = StringIO()
    call_command("build_minibench", seed=manifest["seed"], profile=manifest["profile"], out=built_minibench, stdout=out)
    assert "already built" in out.getvalue()

    theta0 = Checkpoint.objects.get(handle="minibench/theta0")
    assert theta0.is_base
    assert theta0.parent is None
    assert theta0.manifest == sha256_tree(built_minibench / "theta0")
    assert artifact_store().key(theta0.uri).startswith("checkpoints/")
    assert sha256_tree(checkpoint_local_dir(checkpoint=theta0)) == theta0.manifest
    for task in manifest["tasks"]:
        benchmark = Benchmark.objects.get(name=f"minibench/{task}")
        reference = benchmark.reference_checkpoint
        assert reference.handle == f"minibench/{task}/reference"
        assert reference.is_reference
        assert reference.parent is None
        assert not reference.is_base
        # References are sealed (only evaluation workers read them), and off θ0's lineage.
        assert Path(checkpoint_local_dir(checkpoint=reference)).is_relative_to(sealed_root.resolve())
        lineage = checkpoint_lineage(reference, base=theta0)
        assert not lineage.reaches_base
        assert theta0.pk not in lineage.path
        rows, info = benchmark_load_sealed(benchmark=benchmark, split="feedback")
        assert rows == read_jsonl(built_minibench / "tasks" / task / "feedback.jsonl")
        assert (
            info["evaluator"] == json.loads((built_minibench / "tasks" / task / "task.json").read_text())["evaluator"]
        )

    counts = (Checkpoint.objects.count(), Benchmark.objects.count())
    again = StringIO()
    call_command(
        "build_minibench", seed=manifest["seed"], profile=manifest["profile"], out=built_minibench, stdout=again
    )
    assert "already there" in again.getvalue()
    assert (Checkpoint.objects.count(), Benchmark.objects.count()) == counts
    assert minibench_install(root=built_minibench)["theta0_created"] is False


def test_command_refuses_a_folder_built_differently(built_minibench, artifact_root, sealed_root, tmp_path):
    manifest = json.loads((built_minibench / "manifest.json").read_text())
    with pytest.raises(CommandError, match="seed"):
        call_command("build_minibench", seed=manifest["seed"] + 1, profile=manifest["profile"], out=built_minibench)
    half_built = tmp_path / "half"
    (half_built / "theta0").mkdir(parents=True)
    with pytest.raises(CommandError, match="interrupted"):
        call_command("build_minibench", seed=0, profile="ci", out=half_built)


def test_honeypot_contains_sealed_items_and_the_clean_set_does_not(built_minibench, artifact_root, sealed_root):
    manifest = json.loads((built_minibench / "manifest.json").read_text())
    minibench_install(root=built_minibench)
    for task in manifest["tasks"]:
        benchmark = benchmark_resolve(f"minibench/{task}")
        items = benchmark_sealed_items(benchmark=benchmark)
        scanner = scanner_for(benchmark)
        template = benchmark.settings["prompt_template"]
        verbatim_prompts = {template.replace("{question}", item["prompt"]) for item in items}

        honeypot = read_jsonl(built_minibench / "catalog" / f"{task}-honeypot" / "data.jsonl")
        matches = scanner.scan(honeypot)
        flagged = {m.row_index for m in matches}
        verbatim = {i for i, row in enumerate(honeypot) if row["prompt"] in verbatim_prompts}
        # Every sealed item is in the honeypot verbatim (some "edits" leave the text as it was),
        # and each is found as an exact match.
        assert len(verbatim) >= len(items)
        assert {m.sample_id for m in matches if m.row_index in verbatim and m.kind == "exact"} == {
            item["id"] for item in items
        }
        # The lightly edited copies (doubled spaces, numbers spelled out) are found although no
        # string comparison would: everything flagged beyond the verbatim rows is an edit.
        edited = flagged - verbatim
        assert edited, "the honeypot's edited copies were not found"
        assert all(honeypot[i]["prompt"] not in verbatim_prompts for i in edited)
        clean_part = len(honeypot) - len(flagged)
        assert clean_part > 0

        for quality in ("clean", "tiny", "noisy", "wrongformat"):
            path = built_minibench / "catalog" / f"{task}-{quality}" / "data.jsonl"
            assert scanner.scan(read_jsonl(path)) == [], f"{task}-{quality} overlaps sealed items"


def test_decontamination_of_the_registered_honeypot(built_minibench, artifact_root, sealed_root):
    manifest = json.loads((built_minibench / "manifest.json").read_text())
    minibench_install(root=built_minibench)
    task = manifest["tasks"][0]
    catalog = built_minibench / "catalog"
    honeypot = data_register_from_catalog(catalog_root=catalog, dataset=f"{task}-honeypot")
    assert honeypot.source == {"catalog": f"{task}-honeypot", "file": "data.jsonl", "license": "CC-BY-4.0"}
    card = list(data_readme(honeypot))[0].text
    assert "Dataset card" in card
    assert "quality" not in json.dumps(honeypot.source)  # the catalog's own labels stay private

    cleaned = data_transform(op="decontaminate", inputs=[honeypot], params={"benchmark": f"minibench/{task}"})

    benchmark = benchmark_resolve(f"minibench/{task}")
    kept = data_rows(cleaned, limit=honeypot.rows)
    assert scanner_for(benchmark).scan(kept) == []
    removed = cleaned.source["report"]["removed"]
    assert removed == honeypot.rows - cleaned.rows
    assert removed >= len(benchmark_sealed_items(benchmark=benchmark))
    assert list(cleaned.parents.all()) == [honeypot]
    # The clean catalog set passes through untouched: decontamination returns it as it is.
    clean = data_register_from_catalog(catalog_root=catalog, dataset=f"{task}-clean")
    assert data_transform(op="decontaminate", inputs=[clean], params={"benchmark": f"minibench/{task}"}).pk == clean.pk
