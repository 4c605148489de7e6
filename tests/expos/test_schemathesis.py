"""Property-based testing of the whole OpenAPI document with schemathesis (its CLI, as a subprocess).

For three tokens (Main, a Worker, a Reviewer), every operation — each tool and each read endpoint —
gets generated valid and invalid requests. No answer may be a server error, use an undocumented
status, or violate its documented schema (tool outputs are closed schemas, so this means something).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ST = shutil.which("st", path=str(Path(sys.executable).parent))
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


@pytest.mark.skipif(ST is None, reason="schemathesis is in the dev extra")
@pytest.mark.parametrize("who", ["main", "own", "rin"])
def test_openapi_fuzzing_finds_no_server_errors_or_schema_violations(api, world, settings, tmp_path, who):
    settings.RSI_TOKEN_RATE = ""  # the fuzzer's volume is not what the rate limit is for
    command = [
        ST, "run", f"{api.base}/api/v1/schema/",
        "--header", f"Authorization: Bearer {world.tokens[who]}",
        "--checks", CHECKS,
        "--phases", "examples,coverage,fuzzing",
        "--mode", "all",
        "--max-examples", "6",
        "--seed", "20261129",
        "--generation-database", "none",
        "--workers", "2",
        "--request-timeout", "30",
        "--no-color",
        "--report", "junit",
        "--report-dir", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-2000:]
