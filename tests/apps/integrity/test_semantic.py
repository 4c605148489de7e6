"""The semantic contamination layers (apps/integrity/semantic.py) on minibench data.

Arithmetic comes from the built ``ci`` minibench (its sealed splits and its whole honest catalog);
multiple choice and JSON calls, which the ``ci`` build does not install, from the same generators
(``build_task_data``, seed 0). Disguised copies are generated apart (contamination_variants.py);
the LLM judge is a loopback server speaking the OpenAI chat protocol (tests/fakes/openai_chat.py).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from apps.benchmarks.minibench.catalog import build_task_data
from apps.benchmarks.minibench.task_specs import TASKS
from apps.integrity.contamination import row_strings
from apps.integrity.semantic import (
    EMBEDDING_WEIGHTS_SHA256,
    JUDGE_SYSTEM,
    JudgeError,
    SemanticIndex,
    embedding_model_dir,
    judge_config,
    judge_scan,
)
from tests.apps.integrity.contamination_variants import GENERATORS, TEMPLATE, choice_parts
from tests.fakes.openai_chat import FakeChatServer, Reply


@pytest.fixture(scope="session")
def minibench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.minibench import ci_minibench  # noqa: PLC0415 - heavy (torch), fixture only

    return ci_minibench(tmp_path_factory)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tasks(minibench: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Per task: sealed items, honest rows (every catalog set but the honeypot) and a semantic index."""
    cache = tmp_path_factory.mktemp("embeddings")
    out: dict[str, dict[str, Any]] = {}
    sealed = _jsonl(minibench / "tasks/arithmetic/feedback.jsonl") + _jsonl(minibench / "tasks/arithmetic/final.jsonl")
    honest = [
        row
        for folder in sorted((minibench / "catalog").iterdir())
        if folder.name.startswith("arithmetic") and not folder.name.endswith("honeypot")
        for row in _jsonl(folder / "data.jsonl")
    ]
    out["arithmetic"] = {"sealed": sealed, "honest": honest}
    for name in ("multiple_choice", "json_call"):
        data = build_task_data(TASKS[name], seed=0, profile="ci")
        out[name] = {
            "sealed": data.feedback + data.final,
            "honest": [row for ds in data.datasets if ds.quality != "honeypot" for row in ds.rows],
        }
    for info in out.values():
        info["index"] = SemanticIndex(info["sealed"], templates=[TEMPLATE], cache_dir=cache)
    return out


def test_the_packaged_weights_are_the_published_all_minilm_l6_v2():
    model_dir = embedding_model_dir()
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_hidden_layers"]) == ("bert", 384, 6)
    assert json.loads((model_dir / "1_Pooling/config.json").read_text())["pooling_mode_mean_tokens"] is True
    import hashlib  # noqa: PLC0415

    assert hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest() == EMBEDDING_WEIGHTS_SHA256


def test_the_model_loads_without_asking_any_hub():
    # A child process whose hub endpoint is a closed loopback port and which is not told to be
    # offline: loading and encoding must not need it (local folder, local_files_only).
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(Path(env.get("TMPDIR", "/tmp")) / "no-hf-home"))
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    code = (
        "from apps.integrity.semantic import Embedder\n"
        "v = Embedder.get().encode(['what is 12 plus 30'])\n"
        "print(v.shape)\n"
    )
    done = subprocess.run(  # noqa: S603 - our interpreter, our code
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("(1, 384)")


def test_embeddings_are_unit_length_and_rank_a_paraphrase_above_an_unrelated_sentence(tasks):
    index = tasks["arithmetic"]["index"]
    vectors = index.embedder.encode(
        ["what is the weather in paris today", "tell me the forecast for paris today", "add 12 and 30"]
    )
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3


def test_sealed_embeddings_are_cached_per_sealed_data_hash(tasks, tmp_path):
    sealed = tasks["arithmetic"]["sealed"][:20]
    first = SemanticIndex(sealed, templates=[TEMPLATE], cache_dir=tmp_path)
    vectors = first.vectors()
    assert (tmp_path / f"{first.key}.npy").is_file()
    again = SemanticIndex(sealed, templates=[TEMPLATE], cache_dir=tmp_path, embedder=None)
    assert again.key == first.key
    assert np.array_equal(again.vectors(), vectors)
    changed = SemanticIndex([{**sealed[0], "answer": "999"}, *sealed[1:]], templates=[TEMPLATE], cache_dir=tmp_path)
    assert changed.key != first.key  # another sealed set never reuses these embeddings


@pytest.mark.parametrize("task", ["arithmetic", "multiple_choice", "json_call"])
def test_disguised_copies_are_found_by_the_embedding_layer(tasks, task):
    info = tasks[task]
    rng = random.Random(f"semantic-{task}")
    items = rng.sample(info["sealed"], 40)
    rows, owners = [], []
    for item in items:
        for generate in GENERATORS[task]:
            for _ in range(2):
                rows.append(generate(item, rng))
                owners.append(item["id"])
    matches = info["index"].scan(rows)
    found = {(m.row_index, m.sample_id) for m in matches}
    missed = [rows[i]["prompt"] for i, owner in enumerate(owners) if (i, owner) not in found]
    assert not missed, f"{len(missed)} of {len(rows)} disguised copies missed, e.g. {missed[:3]}"
    assert all(m.kind == "embedding" for m in matches)


@pytest.mark.parametrize("task", ["arithmetic", "multiple_choice", "json_call"])
def test_the_honest_catalog_is_not_flagged(tasks, task):
    # Every honest row: other numbers, option sets or calls, in the catalog's sentence forms (the
    # minibench v2 catalog shares neither a sealed item's key content nor its template family).
    info = tasks[task]
    matches = info["index"].scan(info["honest"])
    assert len(info["honest"]) > 5000
    assert matches == [], [info["honest"][m.row_index] for m in matches[:3]]


def test_a_row_with_the_items_numbers_but_another_answer_is_not_a_copy(tasks):
    index = tasks["arithmetic"]["index"]
    item = tasks["arithmetic"]["sealed"][0]
    row = GENERATORS["arithmetic"][0](item, random.Random(1))
    wrong = {**row, "completion": f" {int(item['answer']) + 1}"}
    assert [m.sample_id for m in index.scan([row])] == [item["id"]]
    assert index.scan([wrong]) == []


def test_rows_already_matched_elsewhere_are_skipped(tasks):
    index = tasks["multiple_choice"]["index"]
    item = tasks["multiple_choice"]["sealed"][3]
    rows = [GENERATORS["multiple_choice"][0](item, random.Random(s)) for s in range(3)]
    assert {m.row_index for m in index.scan(rows)} == {0, 1, 2}
    assert {m.row_index for m in index.scan(rows, skip={0, 2})} == {1}


# --------------------------------------------------------------------------------- the judge


def _options_first(item: dict[str, Any]) -> dict[str, str]:
    # The question after its options: the word order the embedding layer's content rule asks for
    # is gone, so only the judge (or a salient rule) can tell.
    word, options = choice_parts(item)
    return {"prompt": TEMPLATE.format(question=f"{options} Which one of these says {word}?"), "completion": " x"}


def _sent(row: dict[str, str]) -> str:
    return "\n".join(row_strings(row))  # how a row reaches the judge: the trained text, in training order


class Judge:
    """A scripted remote judge: "same" for a planted training row paired with the item it was made
    from, "different" for every other pair."""

    def __init__(self, planted: dict[str, str]) -> None:
        self.planted = planted  # training row (as sent) -> the sealed question it disguises

    def __call__(self, body: dict[str, Any]) -> Reply:
        pairs = json.loads(body["messages"][-1]["content"])["pairs"]
        verdicts = [
            {"pair": p["pair"], "same": self.planted.get(p["training_row"]) == p["test_item"]["question"]}
            for p in pairs
        ]
        return Reply(content=json.dumps({"verdicts": verdicts}))


def test_the_judge_finds_rephrasings_the_embedding_rule_misses_and_sees_only_unmatched_rows(tasks, monkeypatch):
    info = tasks["multiple_choice"]
    index = info["index"]
    items = info["sealed"][:5]
    planted = [_options_first(item) for item in items]
    matched_elsewhere = GENERATORS["multiple_choice"][0](info["sealed"][7], random.Random(0))
    honest = info["honest"][:5]
    rows = [*planted, matched_elsewhere, *honest]
    assert index.scan(planted) == []  # the embedding layer alone misses them
    sent_as = {_sent(r): i["prompt"] for r, i in zip(planted, items, strict=True)}
    with FakeChatServer(Judge(sent_as)) as fake:
        monkeypatch.setenv("RSI_LLM_BASE_URL_JUDGE", fake.base_url)
        monkeypatch.setenv("RSI_LLM_MODEL_JUDGE", "judge-model")
        config = judge_config()
        assert config is not None
        matches, info_out = judge_scan(index, rows, config, skip={5})
    assert {(m.row_index, m.sample_id) for m in matches} == {(i, item["id"]) for i, item in enumerate(items)}
    assert all(m.kind == "llm_judge" for m in matches)
    assert info_out["pairs_judged"] >= 5
    sent = [p for body in fake.requests for p in json.loads(body["messages"][-1]["content"])["pairs"]]
    assert all(p["training_row"] != _sent(matched_elsewhere) for p in sent)
    for body in fake.requests:
        assert body["messages"][0] == {"role": "system", "content": JUDGE_SYSTEM}
        assert body["response_format"] == {"type": "json_object"}
        assert body["temperature"] == 0


@pytest.mark.parametrize(
    "answer",
    [
        "yes, these are the same",
        json.dumps({"verdicts": [{"pair": 1, "same": "yes"}]}),
        json.dumps({"verdicts": []}),
        json.dumps({"result": "same"}),
    ],
)
def test_a_judge_answer_out_of_format_is_a_failure_never_a_no(tasks, monkeypatch, answer):
    index = tasks["multiple_choice"]["index"]
    rows = [_options_first(tasks["multiple_choice"]["sealed"][0])]
    with FakeChatServer(lambda body: Reply(content=answer)) as fake:
        monkeypatch.setenv("RSI_LLM_BASE_URL_JUDGE", fake.base_url)
        monkeypatch.setenv("RSI_LLM_MODEL_JUDGE", "judge-model")
        config = judge_config()
        assert config is not None
        with pytest.raises(JudgeError):
            judge_scan(index, rows, config)


def test_the_judge_is_configured_only_by_its_own_variables(monkeypatch):
    monkeypatch.delenv("RSI_LLM_BASE_URL_JUDGE", raising=False)
    monkeypatch.delenv("RSI_LLM_MODEL_JUDGE", raising=False)
    monkeypatch.setenv("RSI_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("RSI_LLM_MODEL", "agents-model")
    assert judge_config() is None  # the agents' endpoint never sees sealed items


def test_the_cosine_threshold_is_the_policys(tasks):
    from apps.integrity.overlap import embedding_threshold  # noqa: PLC0415 - the policy reader

    index = tasks["multiple_choice"]["index"]
    rng = random.Random(9)
    rows = [GENERATORS["multiple_choice"][0](item, rng) for item in tasks["multiple_choice"]["sealed"][:10]]
    scores = [m.score for m in index.scan(rows, threshold=embedding_threshold({}))]
    assert len(scores) == 10
    strict = embedding_threshold({"contamination_embedding_threshold": max(scores)})
    assert len(index.scan(rows, threshold=strict)) < 10
    assert embedding_threshold({"contamination_embedding_threshold": "high"}) == embedding_threshold({})
    assert embedding_threshold({"contamination_embedding_threshold": 0}) == embedding_threshold({})
