"""Whole-number floats reach handlers as integers; other floats for integers are 400 with their path.

JSON Schema counts 5.0 as an integer, so without the coercion it passed validation and crashed
the handler that sliced or stored it. Every integer parameter of every tool in the registry is
tried, at any depth (worker_submit's hyperparameters too).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest

from apps.experiments.models import Event
from apps.expos.registry import load_all
from apps.expos.schemas import _wants_integer, integer_coercion, integers_coerced
from apps.expos.views import InvalidInput, validate_input
from tests.apps.expos.test_validation import _sample


def _integer_paths(schema: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if not isinstance(schema, dict):
        return []
    found = [prefix] if _wants_integer(schema) else []
    for name, sub in schema.get("properties", {}).items():
        found += _integer_paths(sub, (*prefix, name))
    if isinstance(schema.get("items"), dict):
        found += _integer_paths(schema["items"], (*prefix, 0))
    return found


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


def _with(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, list):
        return [_with(item, rest, new) if i == head else item for i, item in enumerate(value)]
    return {**value, head: _with(value[head], rest, new)}


def _cases() -> list[tuple[str, tuple[Any, ...]]]:
    cases = []
    for name, tool in sorted(load_all().items()):
        sample = _sample(tool.input_schema)
        if jsonschema.Draft202012Validator(tool.input_schema).is_valid(sample):
            # Present in the sample: of alternatives (worker_add_data's path / catalog / content), the first that fits.
            cases += [(name, path) for path in _integer_paths(tool.input_schema) if _has(sample, path)]
    return cases


def _has(value: Any, path: tuple[Any, ...]) -> bool:
    try:
        _at(value, path)
    except (KeyError, IndexError, TypeError):
        return False
    return True


CASES = _cases()


def test_the_registry_has_integer_parameters_to_try():
    assert len({name for name, _ in CASES}) > 25
    assert ("worker_submit", ("train", "hyperparameters", "batch_size")) in CASES


@pytest.mark.parametrize(
    ("name", "path"), CASES, ids=lambda case: "/".join(map(str, case)) if isinstance(case, tuple) else case
)
def test_whole_floats_become_integers_and_fractions_are_refused_with_their_path(name, path):
    tool = load_all()[name]
    sample = _sample(tool.input_schema)
    value = _at(sample, path)
    coerced = validate_input(tool, _with(sample, path, float(value)))
    assert type(_at(coerced, path)) is int
    assert _at(coerced, path) == value
    with pytest.raises(InvalidInput) as refused:
        validate_input(tool, _with(sample, path, value + 0.5))
    assert refused.value.detail["path"] == "/" + "/".join(map(str, path))


@pytest.mark.parametrize(
    ("name", "path"), CASES, ids=lambda case: "/".join(map(str, case)) if isinstance(case, tuple) else case
)
def test_the_planned_coercion_gives_what_the_general_walk_gives(name, path):
    # validate_input's quick path coerces by a plan of the schema's integer places, in place;
    # the general walk (integers_coerced) is the reference, on the same whole float.
    tool = load_all()[name]
    sample = _sample(tool.input_schema)
    floated = _with(sample, path, float(_at(sample, path)))
    expected = integers_coerced(tool.input_schema, copy.deepcopy(floated))
    changed: list[int] = []
    sent = copy.deepcopy(floated)
    planned = integer_coercion(tool.input_schema)(sent, changed)
    assert planned == expected
    assert type(_at(sent, path)) is float  # the caller's arguments are left as sent (refusals record them)
    assert type(_at(planned, path)) is int
    assert changed  # so validate_input checks the coerced value's range
    unchanged: list[int] = []
    assert integer_coercion(tool.input_schema)(copy.deepcopy(sample), unchanged) == sample


@pytest.mark.parametrize("whole", [1e300, -1e19, 2.0**63])
def test_a_whole_float_beyond_bigint_is_refused_with_its_path_on_the_quick_path(whole):
    tool = load_all()["worker_submit"]
    path = ("train", "hyperparameters", "batch_size")
    with pytest.raises(InvalidInput) as refused:
        validate_input(tool, _with(_sample(tool.input_schema), path, whole), strings_screened=True)
    assert refused.value.detail["rule"] == "integer_range"
    assert refused.value.detail["path"] == "/train/hyperparameters/batch_size"


def test_a_handler_gets_the_integer_end_to_end(api, world):
    answer = api.call("main", "events_tail", {"limit": 2.0})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["events"]) == 2
    recorded = Event.objects.filter(run=world.run, tool="events_tail").order_by("-id").first()
    assert type(recorded.arguments["args"]["limit"]) is int
    refused = api.call("main", "events_tail", {"limit": 2.5})
    assert refused.status_code == 400
    assert refused.json()["error"]["detail"]["path"] == "/limit"
