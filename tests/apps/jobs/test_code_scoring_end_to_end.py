"""Code scoring end to end: a checkpoint that answers every code task with ``sys.exit(0)``.

Issue 34: such a checkpoint scored 1.0 through the real pipeline, because the sandbox's exit
status was the verdict. Here a real evaluation job on a real worker evaluates it on a sealed
HumanEval-format benchmark, and must score 0; a checkpoint that answers with a correct fenced
body, through the same job, scores 1 (so the zero is the verifier's doing, not a broken path).

The checkpoints are tiny Llamas whose weights are set by hand to emit a fixed text after any
prompt (their tokenizer holds each piece of the text as one token; a one-hot embedding of the
last token picks the next piece). Nothing is trained or downloaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from apps.benchmarks import sandbox
from apps.benchmarks.services import benchmark_register
from apps.core.hashing import sha256_tree
from apps.datapool.storage import artifact_store, checkpoint_key
from apps.experiments.models import Checkpoint, Evaluation, EvaluationSample
from apps.experiments.services import checkpoint_register, experiment_create, manifest_digest
from apps.flows.pipeline import experiment_start
from apps.jobs.choices import JobStatus
from apps.jobs.models import Job
from apps.ml import evaluators
from apps.research.choices import NodeKind
from apps.research.services import node_create
from tests.apps.jobs.conftest import wait_for
from tests.factories import make_run

EXIT_ZERO = ["\n    import sys", "\n    sys.exit(0)\n"]
FENCED_CORRECT = ["Here you go:\n```python\n", "    return list(reversed(items))\n", "```\n"]


def fixed_text_checkpoint(out: Path, pieces: list[str]) -> Path:
    """A causal LM that greedily emits ``"".join(pieces)`` and then EOS, whatever the prompt."""
    tok = Tokenizer(models.WordLevel(vocab={"<unk>": 0, "<pad>": 1, "<eos>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.Fuse()
    tok.add_tokens([AddedToken(piece, normalized=False) for piece in pieces])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    n = len(pieces)
    assert n <= 6  # one state per piece, plus the prompt's, in 8 dimensions (RoPE wants an even size)
    config = LlamaConfig(
        vocab_size=3 + n, hidden_size=8, intermediate_size=4, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, max_position_embeddings=4096, eos_token_id=2, pad_token_id=1, bos_token_id=None,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # Attention and MLP add nothing; the residual stream is the last token's embedding.
        for parameter in model.parameters():
            parameter.zero_()
        model.model.norm.weight.fill_(1.0)
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed[0:3, 0] = 1.0  # state 0: any prompt token -> the first piece
        for k in range(n):
            embed[3 + k, k + 1] = 1.0  # state k+1: piece k was last ...
            head[3 + k, k] = 10.0  # ... and state k emits piece k
        head[2, n] = 10.0  # after the last piece: EOS
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def reverse_task(i: int) -> dict[str, str]:
    """HumanEval's fields for one sealed row: every row's correct body is the same line."""
    name = f"reversed_{i}"
    prompt = f'def {name}(items: list) -> list:\n    """items in reverse order (task {i})."""\n'
    test = (
        f"def check(candidate):\n    assert candidate([{i}, 1, 2]) == [2, 1, {i}]\n"
        f"    assert candidate([]) == []\n    assert candidate(['a', {i}]) == [{i}, 'a']\n"
    )
    answer = json.dumps({"prompt": prompt, "test": test, "entry_point": name})
    return {"id": f"rev-{i}", "prompt": prompt, "answer": answer}


def write_task(root: Path) -> Path:
    root.mkdir(parents=True)
    task = {
        "name": "reverse", "evaluator": "code_tests", "prompt_template": "{question}",
        "decoding": {"max_new_tokens": 16, "do_sample": False}, "stop": [], "use_chat_template": False,
    }  # fmt: skip
    (root / "task.json").write_text(json.dumps(task), encoding="utf-8")
    for split, ids in (("feedback", range(3)), ("final", range(3, 5))):
        rows = "".join(json.dumps(reverse_task(i)) + "\n" for i in ids)
        (root / f"{split}.jsonl").write_text(rows, encoding="utf-8")
    return root


def register(folder: Path, handle: str) -> Checkpoint:
    manifest = sha256_tree(folder)
    uri = artifact_store().put_dir(folder, key=checkpoint_key(manifest_digest(manifest)))
    return checkpoint_register(handle=f"{handle}/{os.urandom(4).hex()}", uri=uri, manifest=manifest, is_base=True)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_that_emits_sys_exit_scores_zero_through_the_evaluation_job(celery_worker, tmp_path):
    benchmark = benchmark_register(name="code/reverse", task_dir=write_task(tmp_path / "task"))
    assert "never an exit status" in benchmark.contract["extraction"]
    checkpoints = {
        "exit": register(fixed_text_checkpoint(tmp_path / "exit", EXIT_ZERO), "exit-zero"),
        "correct": register(fixed_text_checkpoint(tmp_path / "correct", FENCED_CORRECT), "fenced-correct"),
    }
    worker = celery_worker()
    evaluations: dict[str, Evaluation] = {}
    for label, checkpoint in checkpoints.items():
        run = make_run(base_checkpoint=checkpoint, benchmark=benchmark)
        owner = node_create(run=run, kind=NodeKind.WORKER, task="evaluate θ0 on code")
        experiment = experiment_create(
            run=run, owner=owner, kind="eval_only", input_checkpoint=checkpoint, action={"evaluate": "feedback"}
        )
        job = experiment_start(experiment=experiment)
        done = wait_for(
            lambda job=job: (j := Job.objects.get(pk=job.pk)).status in (JobStatus.SUCCEEDED, JobStatus.FAILED) and j,
            timeout=240, what=f"the evaluation of the {label} checkpoint", logs=worker.log,
        )  # fmt: skip
        assert done.status == JobStatus.SUCCEEDED, done.error
        evaluations[label] = Evaluation.objects.get(job=done)

    answers = {row["id"]: row["answer"] for row in map(reverse_task, range(3))}
    exit_samples = list(EvaluationSample.objects.filter(evaluation=evaluations["exit"]))
    assert sorted(s.sample_id for s in exit_samples) == sorted(answers)
    for sample in exit_samples:
        # The checkpoint's own output, recorded as generated, and scored as failing ...
        assert sample.output == "".join(EXIT_ZERO)
        assert sample.correct is False
        # ... where the exit-status rule this replaces passes it (the attack is real).
        spec = json.loads(answers[sample.sample_id])
        program = evaluators.code_program(spec["prompt"], sample.output, spec["entry_point"])
        old_rule = sandbox.run_python(f"{program}\n\n{spec['test']}\n\ncheck({spec['entry_point']})\n")
        assert old_rule.exited_zero
    assert (evaluations["exit"].correct, evaluations["exit"].score) == (0, 0.0)

    correct_samples = list(EvaluationSample.objects.filter(evaluation=evaluations["correct"]))
    assert [s.output for s in correct_samples] == ["".join(FENCED_CORRECT)] * 3
    assert all(s.correct for s in correct_samples)
    assert (evaluations["correct"].correct, evaluations["correct"].score) == (3, 1.0)
