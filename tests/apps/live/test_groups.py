"""Group names come from one place and are valid for every channel layer."""

from __future__ import annotations

import uuid

import pytest
from channels.layers import BaseChannelLayer

from apps.live.groups import job_group, run_group


def test_group_names_are_prefixed_canonical_uuids_valid_for_channel_layers():
    key = uuid.uuid4()

    names = [run_group(key), run_group(str(key).upper()), job_group(key)]

    assert names[:2] == [f"run-{key}", f"run-{key}"]
    assert names[2] == f"job-{key}"
    for name in names:
        assert name.isascii()
        assert len(name) < BaseChannelLayer.MAX_NAME_LENGTH
        assert BaseChannelLayer().require_valid_group_name(name)


def test_group_names_refuse_what_is_not_a_uuid():
    with pytest.raises(ValueError, match="badly formed"):
        run_group("run-1; drop")
