"""The artifact store: one interface over a local folder or any fsspec URL.

``settings.ARTIFACT_ROOT`` is either a path (``/srv/rsiweb/artifacts``) or a URL
(``s3://bucket/prefix``, ``gs://…``, ``memory://store``); switching is configuration, because
everything goes through fsspec's filesystem API and never through ``open()`` on a path.

Keys are relative POSIX paths under the root. Writes land under a temporary key first and are
then moved into place, so a reader never sees half a file: on a local disk the move is a rename
(atomic); on object stores a copy then delete, where the final object appears whole or not at all.
Data is content-addressed (``data/<sha[:2]>/<sha>.jsonl``), so writing a key twice writes the same
bytes; directory keys (checkpoints) are write-once for the same reason.

Sealed benchmark data never goes here: agents' tools can read the artifact store.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

import fsspec
from django.conf import settings

from apps.core.errors import ApplicationError

_KEY = re.compile(r"^[A-Za-z0-9._\-/]+$")
_TMP = ".tmp"


def data_key(sha256: str) -> str:
    """Where a datapool file with this content lives."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return f"data/{sha256[:2]}/{sha256}.jsonl"


def checkpoint_key(manifest_sha256: str) -> str:
    """Where a checkpoint directory with this manifest lives."""
    if not re.fullmatch(r"[0-9a-f]{64}", manifest_sha256):
        raise ValueError(f"not a sha256 hex digest: {manifest_sha256!r}")
    return f"checkpoints/{manifest_sha256[:2]}/{manifest_sha256}"


class ArtifactStore:
    """Files and directories under one root, addressed by URI (what the database stores)."""

    def __init__(self, root: str, *, cache_dir: Path) -> None:
        self.root_url = root
        self.fs, path = fsspec.core.url_to_fs(root)
        self.root = path.rstrip("/") or "/"
        self.cache_dir = cache_dir
        # ``file:///a/b`` for local roots, ``memory:///store``, ``s3://bucket/prefix``.
        self._uri_prefix = self.fs.unstrip_protocol(self.root).rstrip("/") + "/"

    @property
    def is_local(self) -> bool:
        return "file" in _protocols(self.fs)

    # --------------------------------------------------------------------- addressing

    def _check_key(self, key: str) -> str:
        parts = key.split("/")
        if not key or not _KEY.match(key) or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"invalid artifact key {key!r}")
        if parts[0] == _TMP:
            raise ValueError(f"artifact keys may not start with {_TMP}/")
        return key

    def _path(self, key: str) -> str:
        return f"{self.root.rstrip('/')}/{self._check_key(key)}"

    def uri(self, key: str) -> str:
        return self._uri_prefix + self._check_key(key)

    def key(self, uri: str) -> str:
        """The key of a URI of this store; a URI elsewhere is refused, never followed."""
        if not uri.startswith(self._uri_prefix):
            raise ApplicationError("foreign_uri", f"{uri} is not in the artifact store {self.root_url}.")
        try:
            return self._check_key(uri[len(self._uri_prefix) :].rstrip("/"))
        except ValueError as exc:
            raise ApplicationError("foreign_uri", str(exc)) from None

    # --------------------------------------------------------------------- writing

    def _tmp_path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{_TMP}/{uuid.uuid4().hex}-{name}"

    def put_file(self, src: Path, *, key: str) -> str:
        """Copy a local file to ``key`` (replacing what is there) and return its URI."""
        dest = self._path(key)
        tmp = self._tmp_path(Path(key).name)
        self.fs.makedirs(tmp.rsplit("/", 1)[0], exist_ok=True)
        try:
            self.fs.put_file(str(src), tmp)
            self.fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
            self.fs.mv(tmp, dest)
        finally:
            if self.fs.exists(tmp):
                self.fs.rm(tmp)
        return self.uri(key)

    def put_dir(self, src: Path, *, key: str) -> str:
        """Copy a local directory tree to ``key`` and return its URI.

        Directory keys are write-once: if ``key`` exists it is kept as it is, because callers use
        content-addressed keys (a checkpoint's manifest digest) and replacing a tree is not atomic.
        """
        dest = self._path(key)
        if self.fs.exists(dest):
            return self.uri(key)
        tmp = self._tmp_path(Path(key).name)
        try:
            files = sorted(p for p in Path(src).rglob("*") if p.is_file())
            if not files:
                raise ApplicationError("empty_directory", f"{src} has no files to store.")
            for path in files:
                target = f"{tmp}/{path.relative_to(src).as_posix()}"
                self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                self.fs.put_file(str(path), target)
            self.fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
            if self.is_local:
                try:
                    self.fs.mv(tmp, dest, recursive=True)
                except OSError:
                    # A concurrent writer moved the same content-addressed tree into place first.
                    if not self.fs.exists(dest):
                        raise
            else:
                # An object store has no directory to rename (fsspec's mv of a prefix fails on
                # S3): each object is copied into place on the server. Nobody reads the tree
                # half-copied, because its URI reaches the database only once this returns.
                for path in files:
                    relative = path.relative_to(src).as_posix()
                    self.fs.copy(f"{tmp}/{relative}", f"{dest}/{relative}")
        finally:
            if self.fs.exists(tmp):
                self.fs.rm(tmp, recursive=True)
        return self.uri(key)

    def delete(self, uri: str) -> None:
        path = self._path(self.key(uri))
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    # --------------------------------------------------------------------- reading

    def exists(self, uri: str) -> bool:
        return bool(self.fs.exists(self._path(self.key(uri))))

    def open(self, uri: str, mode: str = "rb", **kwargs: Any) -> IO[Any]:
        """Open a stored file for reading (writes go through put_file, never through open)."""
        if mode not in ("rb", "r"):
            raise ValueError("the artifact store opens files for reading only")
        if mode == "r":
            kwargs.setdefault("encoding", "utf-8")
        return self.fs.open(self._path(self.key(uri)), mode, **kwargs)  # type: ignore[no-any-return]

    def local_path(self, uri: str) -> Path:
        """A local path with the artifact's content: the file itself on a local root, else a cached copy.

        The cache is keyed by artifact key; keys are content-addressed, so a cached copy never
        goes stale. Materialising goes through a temporary name and a rename, so two workers
        fetching the same artifact never see each other's half-written copy.
        """
        key = self.key(uri)
        path = self._path(key)
        if self.is_local:
            if not self.fs.exists(path):
                raise ApplicationError("artifact_missing", f"{uri} does not exist.", status=404)
            return Path(path)
        target = self.cache_dir / key
        if target.exists():
            return target
        if not self.fs.exists(path):
            raise ApplicationError("artifact_missing", f"{uri} does not exist.", status=404)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.partial"
        try:
            if self.fs.isdir(path):
                tmp.mkdir()
                for remote in self.fs.find(path):
                    relative = remote[len(path.rstrip("/")) + 1 :]
                    (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
                    self.fs.get_file(remote, str(tmp / relative))
            else:
                self.fs.get_file(path, str(tmp))
            try:
                os.rename(tmp, target)
            except OSError:
                # Another process materialised it first (a non-empty directory cannot be
                # replaced); theirs has the same content.
                if not target.exists():
                    raise
        finally:
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            elif tmp.exists():
                tmp.unlink()
        return target


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


@lru_cache(maxsize=8)
def _store(root: str, cache_dir: str) -> ArtifactStore:
    return ArtifactStore(root, cache_dir=Path(cache_dir))


def artifact_store() -> ArtifactStore:
    """The configured store (``settings.ARTIFACT_ROOT``), read at call time so tests can switch it."""
    cache_dir = getattr(settings, "ARTIFACT_CACHE_DIR", None) or str(Path(settings.DATA_DIR) / "artifact-cache")
    return _store(str(settings.ARTIFACT_ROOT), str(cache_dir))
