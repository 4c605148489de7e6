"""Every bound the server enforces on a tool's arguments is in the schema the registry serves (issue 31, item 6).

The registry's JSON Schema is checked before a handler runs, so its own bounds hold by
construction; the bounds that live only in server code are the training hyperparameters'
(apps.ml.hparams: ranges, choices, and two rules across fields). The walk below finds every place
a served input schema takes one of those fields and compares it with what the validator enforces.
The rules across fields JSON Schema cannot express are stated in the field's description, and a
request the schema accepts but the rule refuses is refused by the real handler, with the message
the description promises.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from apps.core.errors import ApplicationError
from apps.experiments.models import Experiment
from apps.expos.registry import load_all
from apps.integrity.submission_parts import AGENT_HYPERPARAMETERS
from apps.ml.hparams import _BOUNDS, _CHOICES
from tests.apps.expos.tools.conftest import call, train_spec


def _properties(schema: Any, path: str = "") -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(path, name, schema) of every named property anywhere in ``schema``."""
    if isinstance(schema, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if isinstance(sub, dict):
                yield f"{path}/{name}", name, sub
            yield from _properties(sub, f"{path}/{name}")
        for key in ("items", "additionalProperties", "not"):
            yield from _properties(schema.get(key), f"{path}/{key}")
        for key in ("oneOf", "anyOf", "allOf"):
            for i, branch in enumerate(schema.get(key) or []):
                yield from _properties(branch, f"{path}/{key}/{i}")
    elif isinstance(schema, list):
        for item in schema:
            yield from _properties(item, path)


def _training_fields() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Tool -> the places its input schema takes a training field (a key the validator bounds).

    A training field sits in an object that takes the training's datasets or is the
    hyperparameters object; other tools' fields of the same name (a page size, a seed of another
    kind) are not the validator's."""
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, registered in load_all().items():
        for path, field, schema in _properties(registered.input_schema):
            parent = path.rsplit("/", 1)[0]
            if field in (*_BOUNDS, *_CHOICES) and (parent.endswith("/hyperparameters") or parent.endswith("/train")):
                found.setdefault(name, []).append((path, schema))
    return found


def test_every_enforced_training_bound_is_in_the_served_schema():
    places = _training_fields()
    assert "worker_submit" in places
    for tool, fields in places.items():
        for path, schema in fields:
            field = path.rsplit("/", 1)[1]
            if field in _CHOICES:
                assert schema.get("enum") == list(_CHOICES[field]), (tool, path, schema)
                continue
            low, high, inclusive = _BOUNDS[field]
            assert schema.get("maximum") == high, (tool, path, schema)
            if inclusive:
                assert schema.get("minimum") == low, (tool, path, schema)
            else:
                assert schema.get("exclusiveMinimum") == low, (tool, path, schema)
            assert schema.get("type") in ("integer", "number"), (tool, path, schema)
    # Every field an agent may set is offered with its bound: none is enforced out of sight.
    offered = {path.rsplit("/", 1)[1] for path, _ in places["worker_submit"]}
    settable = {*AGENT_HYPERPARAMETERS, "recipe", "adapter", "chat_template", "eos_handling", "max_steps"}
    assert settable & (set(_BOUNDS) | set(_CHOICES)) <= offered


def _submit_schema_field(field: str) -> dict[str, Any]:
    return next(s for path, s in _training_fields()["worker_submit"] if path.endswith(f"/{field}"))


# (the arguments, a word of the rule the description states, what the server's refusal names)
CROSS_FIELD = [
    ({"max_steps": 20, "hyperparameters": {"warmup_steps": 20}}, "warmup_steps", "max_steps"),
    ({"max_steps": 20, "hyperparameters": {"warmup_steps": 400}}, "warmup_steps", "max_steps"),
    ({"recipe": "dpo", "eos_handling": "none"}, "eos_handling", "sft"),
]


@pytest.mark.parametrize(("train", "field", "named"), CROSS_FIELD)
def test_a_rule_across_fields_is_stated_and_the_server_keeps_it(world, train, field, named):
    description = _submit_schema_field(field).get("description", "")
    assert named in description, description  # the rule, where a client reads the field
    arguments = train_spec(world.clean, **train)
    # The served schema accepts the request (each value is within its own bound) ...
    jsonschema.validate(arguments, load_all()["worker_submit"].input_schema)
    # ... and the handler refuses it with a 400 that names both sides of the rule; nothing is created.
    with pytest.raises(ApplicationError) as caught:
        call(world.ctx(world.worker), "worker_submit", arguments)
    assert caught.value.status_code == 400
    assert field in caught.value.message
    assert named in caught.value.message
    assert not Experiment.objects.exists()
