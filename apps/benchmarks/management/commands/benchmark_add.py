"""Register a sealed benchmark from local data files, without code (apps/benchmarks/adding.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.benchmarks.adding import benchmark_add
from apps.core.errors import ApplicationError


class Command(BaseCommand):
    help = (
        "Seal local feedback/final JSONL files as a benchmark, scored by a built-in evaluator, optionally "
        "run through an Inspect task. Example (GSM8K from a local copy): benchmark_add gsm8k/main "
        "--feedback gsm8k-feedback.jsonl --final gsm8k-final.jsonl --evaluator gsm8k_numeric "
        "--id-field id --prompt-field question --answer-field answer --inspect-task inspect_evals/gsm8k "
        '--inspect-task-args \'{"fewshot": 0}\' --decoding \'{"temperature": 0, "top_p": 1, "max_tokens": 512, '
        '"stop": [], "seed_policy": "greedy-single-seed"}\''
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", help="benchmark name, e.g. gsm8k/main")
        parser.add_argument("--feedback", type=Path, required=True, help="JSONL: the split Workers get aggregates of")
        parser.add_argument("--final", type=Path, required=True, help="JSONL: the untouched split the run reports")
        parser.add_argument("--evaluator", required=True, help="built-in evaluator (apps/ml/evaluators.py)")
        parser.add_argument("--decoding", required=True, help="JSON: temperature, top_p, max_tokens, stop, seed_policy")
        parser.add_argument("--prompt-template", default="{question}")
        parser.add_argument("--use-chat-template", action="store_true")
        parser.add_argument("--min-split-samples", type=int, default=None,
                            help="evaluate a small set: the fewest samples a split may have (default: "
                                 "settings.BENCHMARK_MIN_SPLIT_SAMPLES, 10); under 10 the contract warns")  # fmt: skip
        parser.add_argument("--id-field", default="id")
        parser.add_argument("--prompt-field", default="prompt")
        parser.add_argument(
            "--answer-field", default="answer", help="a field, or several joined by commas (JSON answer)"
        )
        parser.add_argument(
            "--inspect-task", default=None, help="inspect_evals/<task>, or 'file' with --inspect-task-file"
        )
        parser.add_argument("--inspect-task-args", default="{}", help="JSON: arguments of the Inspect task function")
        parser.add_argument("--inspect-task-file", type=Path, default=None)
        parser.add_argument("--inspect-task-function", default="task")
        parser.add_argument("--description", default="")
        parser.add_argument(
            "--posttrainbench-name", default=None, help="its PostTrainBench name (gsm8k, humaneval, bfcl...)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            decoding = json.loads(options["decoding"])
            task_args = json.loads(options["inspect_task_args"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--decoding and --inspect-task-args take JSON: {exc}") from None
        try:
            benchmark = benchmark_add(
                name=options["name"],
                feedback_file=options["feedback"],
                final_file=options["final"],
                evaluator=options["evaluator"],
                decoding=decoding,
                prompt_template=options["prompt_template"],
                use_chat_template=options["use_chat_template"],
                split_minimum=options["min_split_samples"],
                id_field=options["id_field"],
                prompt_field=options["prompt_field"],
                answer_fields=[f.strip() for f in options["answer_field"].split(",") if f.strip()],
                inspect_task=options["inspect_task"],
                inspect_task_args=task_args,
                inspect_task_file=options["inspect_task_file"],
                inspect_task_function=options["inspect_task_function"],
                description=options["description"],
                posttrainbench_name=options["posttrainbench_name"],
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from None
        counts = {split: len(ids) for split, ids in benchmark.sample_ids.items()}
        self.stdout.write(
            f"registered {benchmark.name}@{benchmark.version} ({benchmark.contract['adapter']}, "
            f"evaluator {benchmark.evaluator}, samples {counts}, contract {benchmark.contract_sha256[:12]}…)"
        )
        small = benchmark.contract["samples"].get("small_split")
        if small:
            self.stdout.write(self.style.WARNING(f"warning: a small benchmark, {small}"))
