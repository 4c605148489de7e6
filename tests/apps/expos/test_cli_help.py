"""``expos <tool> --help`` as an LLM reads it (issue 31 item 6): nested objects show their fields with
types, defaults and bounds, from the same schema the registry serves; the bounds the server enforces
on hyper-parameters are in that schema."""

from __future__ import annotations

import contextlib
import io

import pytest

from apps.expos.cli import tool_parser
from apps.expos.registry import load_all
from apps.ml.hparams import _BOUNDS, validate_train_config


def _help(tool: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        tool_parser(load_all()[tool].definition(), "expos").parse_args(["--help"])
    return " ".join(out.getvalue().split())  # argparse wraps lines; compare words


def test_nested_objects_list_their_fields_with_types_defaults_and_bounds():
    text = _help("worker_submit")
    assert "--train JSON: the object has these fields" in text
    assert "max_steps [integer, 1..5000, default 1000]" in text
    assert "datasets [array of string, 1-16 items] (required)" in text
    assert "learning_rate [number, > 0.0, <= 0.01, default 0.001]" in text  # nested two levels down
    assert 'recipe [one of sft|dpo, default "sft"]' in text
    # Scalars carry theirs on the flag itself; arrays of objects list their items' fields.
    assert "[integer, 1..200, default 50]" in _help("events_tail")
    assert "--points JSON: each item has these fields" in _help("experiment_log_metrics")


def test_every_hyperparameter_bound_the_server_enforces_is_in_the_schema():
    schema = load_all()["worker_submit"].input_schema["properties"]["train"]["properties"]["hyperparameters"]
    for name, field in schema["properties"].items():
        if name not in _BOUNDS:
            continue
        low, high, inclusive = _BOUNDS[name]
        assert field["maximum"] == high, name
        assert field["minimum" if inclusive else "exclusiveMinimum"] == low, name
        # Just past either bound, the server's own check refuses too: the schema states exactly its rule.
        step = 1 if field["type"] == "integer" else high * 1e-6
        over = {name: high + step}
        with pytest.raises(ValueError, match=name):
            validate_train_config(over)
