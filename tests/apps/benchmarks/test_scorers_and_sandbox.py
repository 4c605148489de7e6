"""Scorers on planted outputs, and the sandbox that code tasks' scorers run model-written code in."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from apps.benchmarks import sandbox
from apps.benchmarks.endpoint import RequestRefused, check_request
from apps.ml import evaluators

GSM8K_ANSWER = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72 clips.\n#### 72"


@pytest.mark.parametrize(
    ("output", "correct"),
    [
        ("48 + 24 = 72\nANSWER: 72", True),
        ("ANSWER: 72.00", True),  # the same rational
        ("She sold 72 clips in all.", True),  # no mark: the last number
        ("ANSWER: 72 (not 48)", True),  # first number after the last mark
        ("ANSWER: -72", False),  # signed: -72 is not 72
        ("ANSWER: 7.2", False),
        ("ANSWER: 720", False),
        ("72 clips? No: ANSWER: 71", False),  # the last mark decides, not an earlier number
        ("ANSWER: seventy-two", False),
        ("", False),
    ],
)
def test_gsm8k_numeric_on_planted_outputs(output, correct):
    assert evaluators.gsm8k_numeric(output, GSM8K_ANSWER) is correct


def test_gsm8k_numeric_keeps_the_sign_and_thousands_of_the_gold():
    assert evaluators.gsm8k_numeric("ANSWER: -5", "#### -5")
    assert not evaluators.gsm8k_numeric("ANSWER: 5", "#### -5")
    assert evaluators.gsm8k_numeric("The total is 1,250.", "#### 1250")
    assert evaluators.gsm8k_numeric("#### 1250", "so 1,250 in all #### 1,250")


HUMANEVAL = {
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n',
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}


def test_code_tests_passes_a_correct_completion_and_fails_wrong_ones():
    answer = json.dumps(HUMANEVAL)
    assert evaluators.code_tests("    return a + b\n", answer)
    assert not evaluators.code_tests("    return a - b\n", answer)
    assert not evaluators.code_tests("    return a +\n", answer)  # syntax error
    assert not evaluators.code_tests("    while True:\n        pass\n", answer)  # CPU limit
    assert not evaluators.code_tests("    return a + b\n", json.dumps({**HUMANEVAL, "entry_point": "add; 1"}))


def _control(program: str) -> subprocess.CompletedProcess[str]:
    """The same program outside the sandbox: shows the planted access would succeed there."""
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30, check=False)


def test_the_sandbox_refuses_network_that_the_host_has():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')\n"
    try:
        assert _control(program).stdout.strip() == "connected"
        result = sandbox.run_python(program)
    finally:
        listener.close()
    assert not result.exited_zero
    assert "connected" not in result.stdout
    assert "ConnectionRefusedError" in result.stderr or "Network is unreachable" in result.stderr
    # No interface but a loopback that is down: not even a DNS lookup leaves.
    result = sandbox.run_python("import socket\nsocket.getaddrinfo('example.org', 443)\n")
    assert not result.exited_zero
    assert "gaierror" in result.stderr


def test_model_written_code_cannot_read_the_sealed_folder(tmp_path, settings):
    sealed = tmp_path / "sealed" / "gsm8k" / "1"
    sealed.mkdir(parents=True)
    (sealed / "final.jsonl").write_text('{"id": "x", "answer": "secret-42"}\n')
    settings.SEALED_ROOT = str(tmp_path / "sealed")
    # A completion that "solves" the task by reading the gold answer off the sealed file.
    completion = f"    return open({str(sealed / 'final.jsonl')!r}).read()\n"
    answer = json.dumps(
        {"prompt": "def leak():\n", "test": "def check(c):\n    assert 'secret-42' in c()\n", "entry_point": "leak"}
    )
    program = f"def leak():\n{completion}\nassert 'secret-42' in leak()\n"
    assert _control(program).returncode == 0  # outside the sandbox the leak works
    assert not evaluators.code_tests(completion, answer)
    result = sandbox.run_python(program)
    assert "FileNotFoundError" in result.stderr
    # Nor the project checkout or the process environment (no DATABASE_URL, no tokens).
    result = sandbox.run_python("import os, sys\nprint(sorted(os.listdir('/')))\nprint(dict(os.environ))\n")
    assert result.exited_zero
    assert "work" not in result.stdout
    assert "DATABASE_URL" not in result.stdout


def test_the_sandbox_limits_memory_and_wall_time():
    result = sandbox.run_python("x = bytearray(2 * 1024 ** 3)\n")
    assert not result.exited_zero
    assert "MemoryError" in result.stderr
    result = sandbox.run_python("import time\ntime.sleep(30)\n", wall_seconds=2)
    assert result.timed_out
    assert not result.exited_zero


@pytest.mark.parametrize(
    ("output", "correct"),
    [
        ('{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}', True),
        ('{"arguments": {"unit": "celsius", "city": "Paris"}, "name": "get_weather"}', True),
        ('{"name": "get_weather", "arguments": {"city": "paris", "unit": "celsius"}}', False),
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}', False),
        ('get_weather(city="Paris", unit="celsius")', False),
    ],
)
def test_json_call_on_planted_bfcl_calls(output, correct):
    gold = json.dumps({"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}})
    assert evaluators.json_call(output, gold) is correct


DECODING = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 16, "stop": ["\n\n"], "seed_policy": "greedy-single-seed"}


def test_the_endpoint_refuses_requests_outside_the_contract():
    ok = {"model": "m", "temperature": 0, "top_p": 1, "max_tokens": 8, "messages": []}
    assert check_request(ok, model="m", decoding=DECODING) == (8, ["\n\n"])
    for bad, why in [
        ({**ok, "model": "other"}, "serves m"),
        ({k: v for k, v in ok.items() if k != "temperature"}, "temperature must be 0.0"),  # unset: no fallback
        ({**ok, "temperature": 0.7}, "temperature must be 0.0"),
        ({**ok, "top_p": 0.9}, "top_p must be 1.0"),
        ({**ok, "max_tokens": 17}, "exceeds the contract's 16"),
    ]:
        with pytest.raises(RequestRefused, match=why):
            check_request(bad, model="m", decoding=DECODING)
