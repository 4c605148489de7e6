"""The gates a reviewer would run, before the suites (`./dev test`) or alone (`./dev check`).

    .venv/bin/python tests/gates.py [GATE ...]          all gates, or the named ones, in order
    .venv/bin/python tests/gates.py --prune-baseline    drop mypy baseline entries that are fixed
    .venv/bin/python tests/gates.py --write-baseline    rewrite the baseline from today's errors

Each gate prints one line, its name and result; the first failure prints the tool's output and
stops with exit status 1. Cheap gates come first, so a lint slip fails in a second, not after
mypy. Configuration lives in pyproject.toml (ruff, mypy, import-linter); docs/gates.md says
what each gate enforces and why.

The mypy baseline (tests/mypy-baseline.txt) lists the errors that strict mode finds in today's
code, one `path: [code] message` line each (no line numbers, so unrelated edits do not churn
it). The gate fails on an error that is not in the baseline, and on a baseline entry that no
longer occurs: the baseline only shrinks, and a fix must take its entry out (--prune-baseline
does that and never adds). --write-baseline is for code moves, where errors change path; the
reviewer of that diff checks that it adds nothing but renamed paths.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BASELINE = ROOT / "tests" / "mypy-baseline.txt"
LINTED = ["apps", "workers", "rsiweb", "tests", "bench", "manage.py"]
BASELINE_HEADER = """\
# mypy errors that strict mode finds in today's code; this list may only shrink.
# One `path: [code] message` per error, sorted; tests/gates.py and docs/gates.md say how.
# Prune after a fix:        .venv/bin/python tests/gates.py --prune-baseline
# Rewrite after a move:     .venv/bin/python tests/gates.py --write-baseline
"""


class GateFailed(Exception):
    """A gate found a problem; the message is the report to print."""


def _run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)


def _tool(cmd: list[str], hint: str, env: dict[str, str] | None = None) -> str:
    done = _run(cmd, env)
    if done.returncode != 0:
        raise GateFailed(f"{done.stdout}{done.stderr}\n$ {' '.join(cmd)}\n{hint}")
    return ""


def gate_ruff() -> str:
    return _tool(
        [str(BIN / "ruff"), "check", *LINTED],
        "Fix the lines above (`ruff check --fix <your files>` fixes the [*] ones). An import inside "
        "a function needs a real cycle and a waiver: `# noqa: PLC0415 - <why>`.",
    )


def gate_format() -> str:
    return _tool(
        [str(BIN / "ruff"), "format", "--check", *LINTED],
        "Run `ruff format <the files above>`.",
    )


def gate_imports() -> str:
    return _tool(
        [str(BIN / "lint-imports"), "--no-cache"],
        "An import breaks the layering (pyproject.toml [tool.importlinter], docs/gates.md): move "
        "the code down to where both sides can import it, never the contract.",
    )


def gate_cycles() -> str:
    """No module of apps/ imports itself back through others (bench/structure.py, on grimp's graph).

    import-linter's contracts order packages; a cycle between modules of one app (or of two apps
    an ignored edge links) slips through them, so the module graph is checked here as well.
    In-function imports count: hiding an import in a function does not break a cycle.
    """
    done = _run([sys.executable, str(ROOT / "bench" / "structure.py"), "--json"])
    if done.returncode != 0:
        raise GateFailed(f"bench/structure.py did not finish:\n{done.stdout}{done.stderr}")
    cycles = json.loads(done.stdout)["cycles"]
    if cycles:
        lines = [f"{len(cycles)} module cycle(s) in apps/ (each a group of modules importing each other):"]
        lines += [f"  {' <-> '.join(group)}" for group in cycles]
        lines.append("Move the shared code down (or the caller up, e.g. into apps.flows); never hide it in a function.")
        raise GateFailed("\n".join(lines))
    return "0 module cycles"


def gate_migrations() -> str:
    # The embedded default (SQLite in a throw-away folder): models against migrations needs no
    # running PostgreSQL, so `./dev check` works on a laptop with no services.
    with tempfile.TemporaryDirectory(prefix="rsiweb-gate-") as data_dir:
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"}}
        env |= {"RSI_DATA_DIR": data_dir, "DJANGO_SETTINGS_MODULE": "rsiweb.settings.base"}
        _tool(
            [sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
            "A model changed without its migration: `.venv/bin/python manage.py makemigrations`.",
            env,
        )
    return ""


def mypy_errors() -> Counter[str]:
    """Today's mypy errors as baseline keys, counted (one file may repeat an error)."""
    done = _run([sys.executable, "-m", "mypy", "--output", "json"])
    errors: Counter[str] = Counter()
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue
        error = json.loads(line)
        if error["severity"] != "error":
            continue
        # Line numbers inside messages ("defined on line 12") move with every edit above them.
        message = re.sub(r"\bline \d+", "line N", " ".join(error["message"].split()))
        errors[f"{error['file']}: [{error['code']}] {message}"] += 1
    if done.returncode not in (0, 1) or (done.returncode == 1 and not errors):
        raise GateFailed(f"mypy did not finish:\n{done.stdout}{done.stderr}")
    return errors


def read_baseline() -> Counter[str]:
    if not BASELINE.exists():
        return Counter()
    lines = BASELINE.read_text().splitlines()
    return Counter(line for line in lines if line.strip() and not line.startswith("#"))


def write_baseline(errors: Counter[str]) -> None:
    BASELINE.write_text(BASELINE_HEADER + "".join(f"{key}\n" for key in sorted(errors.elements())))


def gate_mypy() -> str:
    errors, baseline = mypy_errors(), read_baseline()
    new, fixed = errors - baseline, baseline - errors
    report = []
    if new:
        report.append(f"{sum(new.values())} mypy error(s) not in the baseline; fix them (the baseline only shrinks):")
        report += [f"  {key}" for key in sorted(new.elements())]
        report.append("with line numbers: .venv/bin/mypy")
    if fixed:
        report.append(f"{sum(fixed.values())} baseline entr(ies) no longer occur; take them out of {BASELINE.name}:")
        report += [f"  {key}" for key in sorted(fixed.elements())]
        report.append("run: .venv/bin/python tests/gates.py --prune-baseline")
    if report:
        raise GateFailed("\n".join(report))
    return f"{sum(baseline.values())} baselined errors left"


GATES: dict[str, tuple[str, Callable[[], str]]] = {
    "ruff": ("ruff check", gate_ruff),
    "format": ("ruff format --check", gate_format),
    "imports": ("import-linter contracts", gate_imports),
    "cycles": ("module cycles (grimp)", gate_cycles),
    "migrations": ("makemigrations --check", gate_migrations),
    "mypy": ("mypy (strict, baseline)", gate_mypy),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gates", nargs="*", metavar="GATE", help=f"one of {', '.join(GATES)} (default: all)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--prune-baseline", action="store_true", help="remove fixed entries; adds nothing")
    group.add_argument("--write-baseline", action="store_true", help="rewrite the baseline (after code moves)")
    args = parser.parse_args()
    if unknown := [key for key in args.gates if key not in GATES]:
        parser.error(f"unknown gate(s) {', '.join(unknown)}; the gates are {', '.join(GATES)}")
    if args.prune_baseline or args.write_baseline:
        errors, baseline = mypy_errors(), read_baseline()
        kept = errors if args.write_baseline else baseline & errors
        write_baseline(kept)
        print(f"{BASELINE.relative_to(ROOT)}: {sum(baseline.values())} -> {sum(kept.values())} entries")
        return 0
    started = time.monotonic()
    for key in args.gates or GATES:
        name, gate = GATES[key]
        t0 = time.monotonic()
        try:
            note = gate()
        except GateFailed as failure:
            print(f"{failure}\n", flush=True)
            print(f"gate {name}: FAILED ({time.monotonic() - t0:.1f} s)")
            print(f"stopped at gate '{key}'; `./dev check {key}` reruns it alone.")
            return 1
        note = f", {note}" if note else ""
        print(f"gate {name}: ok{note} ({time.monotonic() - t0:.1f} s)", flush=True)
    print(f"all gates passed in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
