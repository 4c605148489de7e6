"""Registering a benchmark from local files: refusals before anything is written, the contract, the admin page."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.urls import reverse

from apps.benchmarks.adding import benchmark_add
from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import SealBroken, benchmark_load_sealed, benchmark_scorer
from apps.core.errors import ApplicationError

pytestmark = pytest.mark.django_db

DECODING = {"temperature": 0, "top_p": 1, "max_tokens": 64, "stop": [], "seed_policy": "greedy-single-seed"}


def gsm8k_rows(prefix: str, n: int) -> list[dict]:
    """GSM8K's own format (question, answer ending '#### N'), plus the id a sealed copy needs."""
    return [
        {"id": f"{prefix}-{i:03d}", "question": f"Ann has {i} apples and buys {i + 3} more. How many now?",
         "answer": f"{i} + {i + 3} = <<{i}+{i + 3}={2 * i + 3}>>{2 * i + 3}\n#### {2 * i + 3}"}
        for i in range(n)
    ]  # fmt: skip


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def add(tmp_path: Path, feedback: list[dict], final: list[dict], **overrides):
    kwargs = dict(
        name="gsm8k/local", feedback_file=write(tmp_path / "fb.jsonl", feedback),
        final_file=write(tmp_path / "final.jsonl", final), evaluator="gsm8k_numeric", decoding=DECODING,
        prompt_template="Question: {question}\nAnswer:", prompt_field="question", answer_fields=["answer"],
        posttrainbench_name="gsm8k",
    )  # fmt: skip
    kwargs.update(overrides)
    return benchmark_add(**kwargs)


def test_gsm8k_from_a_local_copy_is_sealed_with_its_contract(sealed_root, tmp_path):
    benchmark = add(tmp_path, gsm8k_rows("fb", 10), gsm8k_rows("fin", 12))
    assert benchmark.sample_ids["final"] == [f"fin-{i:03d}" for i in range(12)]
    contract = benchmark.contract
    assert contract["adapter"] == "builtin"
    assert contract["metric"] == "accuracy"
    assert contract["decoding"] == {**DECODING, "temperature": 0.0, "top_p": 1.0}
    assert contract["samples"] == {"id_field": "id", "counts": {"feedback": 10, "final": 12}}
    assert set(contract["code_sha256"]) == {"evaluator.py", "sandbox.py"}
    rows, info = benchmark_load_sealed(benchmark=benchmark, split="final")
    assert rows[0]["prompt"].startswith("Ann has 0 apples")
    assert rows[0]["record"]["answer"].endswith("#### 3")
    assert info["posttrainbench_name"] == "gsm8k"
    score = benchmark_scorer(benchmark=benchmark)
    assert score("0 + 3 = 3\nANSWER: 3", rows[0]["answer"])
    assert not score("ANSWER: -3", rows[0]["answer"])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda fb, fin: fb[3].pop("id"), "fb.jsonl line 4 has no id"),
        (lambda fb, fin: fb[3].update(id=""), "has no id"),
        (lambda fb, fin: fb[3].update(id=None), "has no id"),
        (lambda fb, fin: fb[4].update(id=fb[3]["id"]), "duplicate sample id 'fb-003'"),
        (lambda fb, fin: fin[0].update(id=fb[0]["id"]), "duplicate sample id 'fb-000' (feedback and final"),
        (lambda fb, fin: fin.pop(), "the final split has 9 samples; a benchmark split needs at least 10"),
        (lambda fb, fin: fb[0].pop("question"), "has no field 'question'"),
    ],
)
def test_bad_data_is_refused_and_nothing_is_written(sealed_root, tmp_path, mutate, message):
    feedback, final = gsm8k_rows("fb", 10), gsm8k_rows("fin", 10)
    mutate(feedback, final)
    with pytest.raises(ApplicationError, match=message.replace("(", r"\(")):
        add(tmp_path, feedback, final)
    assert not Benchmark.objects.exists()
    assert not sealed_root.exists() or not any(sealed_root.rglob("*.jsonl"))


def test_a_small_set_is_sealed_under_the_operators_stated_limit_with_a_warning(sealed_root, tmp_path):
    with pytest.raises(ApplicationError) as caught:
        add(tmp_path, gsm8k_rows("fb", 6), gsm8k_rows("fin", 4))
    assert "To evaluate a smaller set on purpose, state its limit (benchmark_add --min-split-samples N" in str(
        caught.value.message
    )
    with pytest.raises(ApplicationError, match="the final split has 4 samples; a benchmark split needs at least 5$"):
        add(tmp_path, gsm8k_rows("fb", 6), gsm8k_rows("fin", 4), split_minimum=5)
    with pytest.raises(ApplicationError, match="a whole number of at least 1"):
        add(tmp_path, gsm8k_rows("fb", 6), gsm8k_rows("fin", 4), split_minimum=0)
    assert not Benchmark.objects.exists()
    out = io.StringIO()
    call_command("benchmark_add", "gsm8k/small", "--feedback", str(write(tmp_path / "s-fb.jsonl", gsm8k_rows("fb", 6))),
                 "--final", str(write(tmp_path / "s-fin.jsonl", gsm8k_rows("fin", 4))), "--evaluator", "gsm8k_numeric",
                 "--decoding", json.dumps(DECODING), "--prompt-field", "question", "--min-split-samples", "4",
                 stdout=out)  # fmt: skip
    small = Benchmark.objects.get(name="gsm8k/small")
    warning = small.contract["samples"]["small_split"]
    assert warning == ("under the default minimum of 10 samples (feedback 6, final 4; the operator's limit 4): "
                       "one sample moves the score by 25 points")  # fmt: skip
    assert f"warning: a small benchmark, {warning}" in out.getvalue()
    rows, _ = benchmark_load_sealed(benchmark=small, split="final")  # the contract re-verifies with its warning
    assert len(rows) == 4
    assert "small_split" not in add(tmp_path, gsm8k_rows("fb", 10), gsm8k_rows("fin", 10)).contract["samples"]


def test_implicit_decoding_is_refused(sealed_root, tmp_path):
    with pytest.raises(ApplicationError, match="decoding must state temperature, seed_policy"):
        add(tmp_path, gsm8k_rows("fb", 10), gsm8k_rows("fin", 10),
            decoding={"top_p": 1, "max_tokens": 64, "stop": []})  # fmt: skip
    with pytest.raises(ApplicationError, match="temperature 0 is greedy"):
        add(
            tmp_path,
            gsm8k_rows("fb", 10),
            gsm8k_rows("fin", 10),
            decoding={**DECODING, "seed_policy": "per-sample-seeds"},
        )
    assert not Benchmark.objects.exists()


def test_a_changed_sandbox_or_contract_is_refused_before_the_evaluation_runs(sealed_root, tmp_path):
    benchmark = add(tmp_path, gsm8k_rows("fb", 10), gsm8k_rows("fin", 10))
    sandbox_copy = Path(benchmark.sealed_path) / "sandbox.py"
    sandbox_copy.chmod(0o644)
    sandbox_copy.write_text(sandbox_copy.read_text() + "\nCPU_SECONDS = 10 ** 6\n")
    with pytest.raises(SealBroken, match="task code sandbox.py changed"):
        benchmark_load_sealed(benchmark=benchmark, split="final")
    other = add(tmp_path, gsm8k_rows("fb2", 10), gsm8k_rows("fin2", 10), name="gsm8k/other")
    Benchmark.objects.filter(pk=other.pk).update(
        contract={**other.contract, "decoding": {**DECODING, "temperature": 0.8}}
    )
    other.refresh_from_db()
    with pytest.raises(SealBroken, match="contract in the database changed"):
        benchmark_scorer(benchmark=other)


def test_the_command_registers_and_reports_refusals(sealed_root, tmp_path, capsys):
    fb, fin = write(tmp_path / "fb.jsonl", gsm8k_rows("fb", 10)), write(tmp_path / "fin.jsonl", gsm8k_rows("fin", 10))
    common = ["--evaluator", "gsm8k_numeric", "--prompt-field", "question", "--decoding", json.dumps(DECODING)]
    call_command("benchmark_add", "gsm8k/cli", "--feedback", str(fb), "--final", str(fin), *common)
    assert "registered gsm8k/cli@1 (builtin, evaluator gsm8k_numeric" in capsys.readouterr().out
    short = write(tmp_path / "short.jsonl", gsm8k_rows("s", 3))
    with pytest.raises(CommandError, match="the final split has 3 samples"):
        call_command("benchmark_add", "gsm8k/cli2", "--feedback", str(fb), "--final", str(short), *common)
    with pytest.raises(CommandError, match="take JSON"):
        call_command("benchmark_add", "gsm8k/cli3", "--feedback", str(fb), "--final", str(fin),
                     "--evaluator", "gsm8k_numeric", "--decoding", "{temperature: 0}")  # fmt: skip


def _upload(name: str, rows: list[dict]) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, "".join(json.dumps(r) + "\n" for r in rows).encode(), "application/jsonl")


def test_the_admin_page_registers_from_uploaded_files_and_shows_refusals(sealed_root, admin_client):
    url = reverse("admin:benchmarks_benchmark_add_from_files")
    assert "Add from local files" in admin_client.get(reverse("admin:benchmarks_benchmark_changelist")).text
    form = {
        "name": "gsm8k/admin", "evaluator": "gsm8k_numeric", "decoding": json.dumps(DECODING),
        "prompt_template": "{question}", "id_field": "id", "prompt_field": "question", "answer_fields": "answer",
        "inspect_task_args": "{}",
    }  # fmt: skip
    bad = admin_client.post(url, {**form, "feedback": _upload("fb.jsonl", gsm8k_rows("a", 10)),
                                  "final": _upload("fin.jsonl", gsm8k_rows("a", 10))})  # fmt: skip
    assert bad.status_code == 200
    assert "duplicate sample id" in bad.text
    assert not Benchmark.objects.exists()
    good = admin_client.post(url, {**form, "feedback": _upload("fb.jsonl", gsm8k_rows("a", 10)),
                                   "final": _upload("fin.jsonl", gsm8k_rows("b", 10))})  # fmt: skip
    benchmark = Benchmark.objects.get(name="gsm8k/admin")
    assert good.status_code == 302
    assert good.url == reverse("admin:benchmarks_benchmark_change", args=[benchmark.pk])
    assert benchmark.sample_ids["final"][0] == "b-000"


def test_the_admin_page_is_for_admins_only(client, django_user_model):
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(reverse("admin:benchmarks_benchmark_add_from_files")).status_code == 403
