"""Property-based testing of the OpenAPI document with schemathesis (its CLI, as a subprocess).

With the Main Agent's token every operation of the API — each tool and each read endpoint — gets
boundary-value ("coverage") and random ("fuzzing") requests, valid and invalid; with a Worker's
and a Reviewer's token the tools get random requests again, so the handlers those roles may call
run too. No answer may be a server error, use an undocumented status, or violate its documented
schema (tool outputs are closed schemas, so this means something). The Main Agent's run also has
a stateful phase (sequences of calls along the links schemathesis infers).

``RSI_SCHEMATHESIS_FULL=<examples>`` (bench/schemathesis_full.py) runs every check and every phase
with that many examples per operation, and writes schemathesis' summary to ``RSI_SCHEMATHESIS_REPORT``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

ST = shutil.which("st", path=str(Path(sys.executable).parent))
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
RUNS = {
    "main": ["--phases", "coverage,fuzzing,stateful", "--max-examples", "4"],
    "own": ["--phases", "fuzzing", "--max-examples", "8", "--include-path-regex", "^/api/v1/tools/"],
    "rin": ["--phases", "fuzzing", "--max-examples", "8", "--include-path-regex", "^/api/v1/tools/"],
}
CONFIG = Path(__file__).with_name("schemathesis.toml")  # statuses a valid request may get from the world's state
FULL = int(os.environ.get("RSI_SCHEMATHESIS_FULL", "0"))  # examples per operation; 0 = the CI counts


def _options(who: str) -> list[str]:
    if not FULL:
        return ["--checks", CHECKS, *RUNS[who]]
    scope = RUNS[who][RUNS[who].index("--include-path-regex") :] if "--include-path-regex" in RUNS[who] else []
    return ["--checks", "all", "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", str(FULL), *scope]


@pytest.mark.slow  # about six minutes on two cores: deselect with -m "not slow" while iterating
@pytest.mark.skipif(ST is None, reason="schemathesis is in the dev extra")
@pytest.mark.parametrize("who", sorted(RUNS))
def test_openapi_fuzzing_finds_no_server_errors_or_schema_violations(api, world, settings, tmp_path, who):
    settings.RSI_TOKEN_RATE = ""  # the fuzzer's volume is not what the rate limit is for
    # Fetched here, with a generous timeout: schemathesis' own load gives up after 10 s on a busy machine.
    auth = {"Authorization": f"Bearer {world.tokens[who]}"}
    schema = requests.get(f"{api.base}/api/v1/schema/", params={"format": "json"}, headers=auth, timeout=300)
    schema.raise_for_status()
    (tmp_path / "openapi.json").write_bytes(schema.content)
    command = [
        ST,
        "--config-file",
        str(CONFIG),
        "run",
        str(tmp_path / "openapi.json"),
        "--url",
        api.base,
        "--header",
        f"Authorization: Bearer {world.tokens[who]}",
        *_options(who),
        "--mode",
        "all",
        "--seed",
        "20261129",
        # NUL characters are refused up front (test_api_surface); without them the fuzzer reaches the handlers.
        "--generation-allow-x00",
        "false",
        "--generation-database",
        "none",
        # One worker in full mode: with two, CPython 3.11's gh-106905 (a race in the recursion
        # accounting hypothesis hits) shows up as a runtime error after thousands of cases.
        "--workers",
        "1" if FULL else "2",
        "--request-timeout",
        "30",
        "--no-color",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=86_400 if FULL else 900, cwd=tmp_path)
    report = os.environ.get("RSI_SCHEMATHESIS_REPORT")
    if report:
        with Path(report).open("a") as out:
            out.write(f"=== {who} (rc {result.returncode})\n{result.stdout if FULL else result.stdout[-6000:]}\n")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-2000:]
    assert "passed" in result.stdout
