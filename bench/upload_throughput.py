"""A 50 MB JSONL of agent-made data uploaded (issue 31): throughput end to end, and the scan's share.

    REDIS_URL=redis://127.0.0.1:6379/3 timeout 1200 .venv/bin/python bench/upload_throughput.py [--mb 50]

One web server (``manage.py serve``: uvicorn on rsiweb.asgi, as deployed) on a fresh database
``rsiweb_bench_upload``, a benchmark of 200 sealed arithmetic items (100 feedback, 100 final), a
running run (``upload_max_rows`` raised to 1,000,000 for the file) and one Worker token. Two files
of honest rows (fresh 3-digit sums, sealed-free, ~250 bytes a row) of ``--mb`` MB each, so neither
run meets a cache the other filled:

1. over HTTP, as a client does it: ``POST /api/v1/tools/worker_add_data/upload`` with the file as
   a streamed body (``requests`` reading the open file), client wall time to the 201; then the
   same call again with its Idempotency-Key (a replay: the body is still streamed and hashed) and
   once without one (identical bytes: staged, validated and scanned again, then the existing entry);
2. in this process, the same registration (``data_register_upload`` on the file with the run's
   contamination review as ``scan``) with each phase timed: the digest check, staging and JSONL
   validation, reading the rows back, the contamination review (all five layers), and storing.

The scan's share is the review's time over the in-process total. The load average before and
after is printed: the machine is shared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _setup import django_on_bench_db  # noqa: E402
from api_vs_mlflow import free_port, stop  # noqa: E402
from mcp_overhead import start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DB = "rsiweb_bench_upload"
BASE = Path(os.environ.get("BENCH_DIR", "/tmp/bench-upload"))
TEMPLATE = "Question: {question}\nAnswer:"
NOUNS = ["marbles", "trees", "pages", "books", "blocks", "coins", "stamps", "shells"]


def sealed_items(seed: int, n: int, prefix: str) -> list[dict[str, str]]:
    rng = random.Random(seed)
    items = []
    for i in range(n):
        a, b, thing = rng.randint(10, 99), rng.randint(10, 99), rng.choice(NOUNS)
        question = f"Item {prefix}{i}: someone has {a} {thing} and gets {b} more {thing}. How many {thing}?"
        items.append({"id": f"{prefix}{i}", "prompt": question, "answer": str(a + b)})
    return items


def write_honest(path: Path, *, seed: int, megabytes: float) -> int:
    """Honest rows (3-digit sums, another sentence form) until the file holds ``megabytes`` MB."""
    rng = random.Random(seed)
    target, size, rows = int(megabytes * 1_000_000), 0, 0
    with path.open("w", encoding="utf-8") as handle:
        while size < target:
            a, b = rng.randint(100, 999), rng.randint(100, 999)
            thing = rng.choice(["pebbles", "tickets", "buttons", "beads"])
            question = (
                f"A club counts {a} {thing} in the first box and {b} {thing} in the second box of its "
                f"storeroom on day {rng.randint(1, 9999)}. How many {thing} are there altogether?"
            )
            line = json.dumps({"prompt": TEMPLATE.format(question=question), "completion": f" {a + b}"}) + "\n"
            handle.write(line)
            size += len(line.encode("utf-8"))
            rows += 1
    return rows


def build_world() -> tuple[Any, Any, str]:
    from apps.benchmarks.services import benchmark_register
    from apps.expos.auth import agent_token_issue
    from apps.research.choices import NodeKind, RunStatus
    from apps.research.services import node_create, run_set_status
    from tests.factories import make_run

    task = BASE / "task"
    task.mkdir(parents=True, exist_ok=True)
    spec = {"name": "arithmetic", "evaluator": "exact_match", "description": "addition",
            "prompt_template": TEMPLATE, "decoding": {"max_new_tokens": 8, "do_sample": False}, "stop": ["\n"],
            "use_chat_template": False}  # fmt: skip
    (task / "task.json").write_text(json.dumps(spec), encoding="utf-8")
    for split, seed, prefix in (("feedback", 1, "f"), ("final", 2, "x")):
        rows = sealed_items(seed, 100, prefix)
        (task / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    benchmark = benchmark_register(name="bench/upload-arith", task_dir=task)
    run = make_run(name="upload-bench", benchmark=benchmark)
    run.policy = {**run.policy, "upload_max_rows": 1_000_000}
    run.save(update_fields=["policy"])
    run = run_set_status(run=run, status=RunStatus.RUNNING, actor="bench")
    worker = node_create(run=run, kind=NodeKind.WORKER, task="upload")
    return run, worker, agent_token_issue(run=run, node=worker, role=NodeKind.WORKER)[0]


def http_upload(base: str, token: str, path: Path, *, key: str | None) -> tuple[float, int, dict[str, Any]]:
    data = path.read_bytes()  # for the digest only: the body below is the open file, streamed
    query = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "size_bytes": len(data),
        "generator": "bench",
        "name": path.stem,
    }
    del data
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"}
    if key:
        headers["Idempotency-Key"] = key
    with path.open("rb") as body:
        started = time.perf_counter()
        response = requests.post(f"{base}/api/v1/tools/worker_add_data/upload?{urlencode(query)}", data=body,
                                 headers=headers, timeout=1800)  # fmt: skip
        elapsed = time.perf_counter() - started
    return elapsed, response.status_code, response.json()


def in_process(run: Any, worker: Any, path: Path) -> dict[str, float]:
    """data_register_upload on the file, each phase timed (wrapping the module's own functions)."""
    from apps.datapool import services
    from apps.integrity.upload_review import upload_review

    phases: dict[str, float] = {}

    def timed(name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - started

        return wrapper

    from apps.integrity.contamination import ContaminationScanner
    from apps.integrity.semantic import SemanticIndex

    originals = {
        name: getattr(services, name) for name in ("_measure", "_stage_fd", "_staged_rows", "_register_staged")
    }
    for name, label in (("_measure", "digest check"), ("_stage_fd", "stage + validate JSONL"),
                        ("_staged_rows", "read rows back"), ("_register_staged", "store + record")):  # fmt: skip
        setattr(services, name, timed(label, originals[name]))
    # Inside the review: the lexical layers (exact, ngram, near_dup, salient) and the embedding layer.
    lexical, semantic = ContaminationScanner.scan, SemanticIndex.scan
    ContaminationScanner.scan = timed("  of which lexical layers", lexical)  # type: ignore[method-assign]
    SemanticIndex.scan = timed("  of which embedding layer", semantic)  # type: ignore[method-assign]
    policy = type(run).objects.get(pk=run.pk).policy
    scan = timed("contamination review", lambda rows, sha: upload_review(
        run=run, node=worker, rows=rows, sha256=sha, policy=policy, request={"bench": True}))  # fmt: skip
    data = path.read_bytes()
    sha, size = hashlib.sha256(data).hexdigest(), len(data)
    del data
    try:
        started = time.perf_counter()
        services.data_register_upload(content=path, sha256=sha, size=size, name=path.stem, generator="bench",
                                      run=run, node=worker, max_rows=1_000_000, scan=scan)  # fmt: skip
        phases["total"] = time.perf_counter() - started
    finally:
        for name, function in originals.items():
            setattr(services, name, function)
        ContaminationScanner.scan, SemanticIndex.scan = lexical, semantic  # type: ignore[method-assign]
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0)
    args = parser.parse_args()
    os.environ.update(RSI_ARTIFACT_ROOT=str(BASE / "artifacts"), RSI_SEALED_ROOT=str(BASE / "sealed"),
                      RSI_WORKSPACE_ROOT=str(BASE / "workspaces"), RSI_DATA_DIR=str(BASE / "data"))  # fmt: skip
    url = django_on_bench_db(DB)
    run, worker, token = build_world()
    files = Path(tempfile.mkdtemp(prefix="bench-upload-files-"))
    over_http, here = files / "http.jsonl", files / "inprocess.jsonl"
    rows_http = write_honest(over_http, seed=101, megabytes=args.mb)
    rows_here = write_honest(here, seed=202, megabytes=args.mb)
    warm_http, warm_here = files / "warm-http.jsonl", files / "warm-inprocess.jsonl"
    write_honest(warm_http, seed=303, megabytes=0.05)
    write_honest(warm_here, seed=404, megabytes=0.05)
    port = free_port()
    server = start_server(port, url, Path("/tmp/bench-upload-rsiweb.log"))
    base = f"http://127.0.0.1:{port}"
    try:
        load_before = os.getloadavg()
        # A first upload loads the embedding model and embeds the sealed items once per process.
        warm = http_upload(base, token, warm_http, key=None)
        first = http_upload(base, token, over_http, key="bench-upload-1")
        replay = http_upload(base, token, over_http, key="bench-upload-1")
        again = http_upload(base, token, over_http, key=None)
        load_mid = os.getloadavg()
    finally:
        stop(server)
    warm_phases = in_process(run, worker, warm_here)
    phases = in_process(run, worker, here)
    load_after = os.getloadavg()
    mb = over_http.stat().st_size / 1_000_000
    mb_here = here.stat().st_size / 1_000_000
    print(f"file: {mb:.1f} MB, {rows_http:,} rows over HTTP; {mb_here:.1f} MB, {rows_here:,} rows in process")
    print(f"load average (1/5/15 min): before {load_before}, after HTTP {load_mid}, after all {load_after}")
    print(f"warm-up (50 kB, model load and sealed embeddings): HTTP {warm[0]:.2f} s, in process "
          f"{warm_phases['total']:.2f} s")  # fmt: skip
    for label, (elapsed, status, body) in (("first upload", first), ("replay (same Idempotency-Key)", replay),
                                           ("identical bytes, no key", again)):  # fmt: skip
        created = body.get("created") if isinstance(body, dict) else None
        print(f"HTTP {label:<32} {status} {elapsed:7.2f} s  {mb / elapsed:6.1f} MB/s  created={created} "
              f"replayed={body.get('replayed') if isinstance(body, dict) else None}")  # fmt: skip
    total = phases.pop("total")
    print(f"in process: total {total:.2f} s ({mb_here / total:.1f} MB/s)")
    for name in ("digest check", "stage + validate JSONL", "read rows back", "contamination review",
                 "  of which lexical layers", "  of which embedding layer", "store + record"):  # fmt: skip
        seconds = phases.get(name, 0.0)
        print(f"  {name:<28} {seconds:7.2f} s  {100 * seconds / total:5.1f} %")
    for path in (over_http, here, warm_http, warm_here):
        path.unlink()
    files.rmdir()


if __name__ == "__main__":
    main()
