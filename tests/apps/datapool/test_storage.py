"""The artifact store: the same interface over a local folder and an fsspec URL (memory://)."""

from __future__ import annotations

import uuid

import pytest

from apps.core.errors import ApplicationError
from apps.datapool.storage import ArtifactStore, checkpoint_key, data_key


@pytest.fixture(params=["file", "memory"])
def store(request, tmp_path):
    root = str(tmp_path / "store") if request.param == "file" else f"memory://rsi-test/{uuid.uuid4().hex}"
    return ArtifactStore(root, cache_dir=tmp_path / "cache")


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(b"\x00weights")
    (src / "sub" / "tokenizer.json").write_text("{}")
    return src


def test_put_file_open_exists_local_path(store, tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text('{"prompt": "a", "completion": "b"}\n')
    key = data_key("ab" * 32)
    assert key == f"data/ab/{'ab' * 32}.jsonl"

    uri = store.put_file(src, key=key)

    assert uri == store.uri(key)
    assert store.exists(uri)
    with store.open(uri) as handle:
        assert handle.read() == src.read_bytes()
    local = store.local_path(uri)
    assert local.read_bytes() == src.read_bytes()
    assert (local == tmp_path / "store" / key) is store.is_local
    # Nothing is left under the temporary prefix.
    assert store.fs.find(f"{store.root}/.tmp") == []
    store.delete(uri)
    assert not store.exists(uri)


def test_put_dir_is_write_once_and_materialises(store, tree):
    key = checkpoint_key("cd" * 32)
    uri = store.put_dir(tree, key=key)
    (tree / "model.safetensors").write_bytes(b"changed")
    assert store.put_dir(tree, key=key) == uri  # kept as it was: keys are content-addressed
    local = store.local_path(uri)
    assert (local / "model.safetensors").read_bytes() == b"\x00weights"
    assert (local / "sub" / "tokenizer.json").read_text() == "{}"


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", ".tmp/x", "a b", "./a"])
def test_keys_cannot_leave_the_root(store, tmp_path, key):
    src = tmp_path / "f"
    src.write_text("x")
    with pytest.raises(ValueError, match="key"):
        store.put_file(src, key=key)


def test_uris_of_other_places_are_refused(store):
    for uri in ("file:///etc/passwd", "memory://elsewhere/x", store.uri("data/x") + "/../../../etc"):
        with pytest.raises(ApplicationError) as refused:
            store.open(uri)
        assert refused.value.code == "foreign_uri"
    with pytest.raises(ValueError, match="reading only"):
        store.open(store.uri("data/x"), "wb")


def test_missing_artifact_is_a_clear_error(store):
    with pytest.raises(ApplicationError) as missing:
        store.local_path(store.uri("data/none.jsonl"))
    assert missing.value.code == "artifact_missing"
