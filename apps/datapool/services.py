"""State changes of the datapool: register data, append provenance, record usage, derive data.

Every way in (a Worker's workspace file, the local catalog, a data job, an agent's upload) ends in
the same steps: read the bytes once into a private staging copy (so what is validated is exactly
what is stored), validate it as JSONL of the declared format, copy it into the content-addressed
artifact store, then insert the row, its first readme line and an event in one transaction. If
the transaction fails, the copied artifact is removed again; identical bytes registered twice
return the first entry (with a readme line saying who brought them again).

Error codes (``ApplicationError.code``) are part of the tool contract: invalid_path,
absolute_path, path_escape, symlink_in_path, not_found, not_a_file, unreadable, file_too_large,
empty_file, blank_line, malformed_jsonl (also NaN/Infinity), bad_value (a lone surrogate, NUL or
nesting beyond 64 levels, with the line and JSONPath), not_an_object, unknown_format, missing_columns,
bad_column_type, invalid_name, bad_params, empty_result; an agent's upload also size_mismatch,
sha256_mismatch, too_many_rows, invalid_generator.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, IntegrityError, transaction

from apps.benchmarks.services import benchmark_resolve, benchmark_scanner
from apps.core.errors import ApplicationError, Conflict
from apps.core.handles import lock_global_handles, next_handle
from apps.core.jsonsafe import first_bad_value
from apps.core.jsonsafe import loads as jsonsafe_loads
from apps.datapool import transforms
from apps.datapool.models import DataEntry, DataFormat, DataReadmeEntry, DataUsage, SourceKind
from apps.datapool.storage import artifact_store, data_key
from apps.experiments.events import event_append

if TYPE_CHECKING:
    from apps.experiments.models import Experiment
    from apps.jobs.models import Job
    from apps.research.models import ResearchNode, Run

MAX_DATA_BYTES = 1 << 30
MAX_README_CHARS = 20_000
FORMAT_COLUMNS = transforms.FORMAT_COLUMNS
TRANSFORM_OPS = ("filter", "deduplicate", "mix", "convert", "decontaminate")
CATALOG_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"  # also the tools' schema pattern
_CATALOG_NAME = re.compile(CATALOG_NAME_PATTERN)
SHA256_PATTERN = r"^[0-9a-f]{64}$"  # an upload's declared digest; also the tools' schema pattern
_COPY_CHUNK = 1 << 20


# --------------------------------------------------------------------------- reading a file safely


def _relative_parts(path: str) -> list[str]:
    """The components of a workspace-relative path, refusing anything that could leave it."""
    if not isinstance(path, str) or not path.strip() or "\x00" in path:
        raise ApplicationError("invalid_path", "Give the data file as a non-empty path relative to your workspace.")
    if path.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:[\\/]", path):
        raise ApplicationError(
            "absolute_path", f"{path!r} is absolute; give a path relative to your workspace, e.g. data/train.jsonl."
        )
    raw = path.split("/")
    if ".." in raw:
        raise ApplicationError("path_escape", f"{path!r} contains '..'; paths must stay inside your workspace.")
    parts = [p for p in raw if p not in ("", ".")]
    if not parts:
        raise ApplicationError("invalid_path", f"{path!r} names the workspace itself, not a file.")
    return parts


def _open_confined(root: Path, parts: list[str], *, shown: str) -> int:
    """Open ``root/parts…`` for reading without following any symlink; return the descriptor.

    Each component is opened relative to its parent's descriptor with O_NOFOLLOW, so a symlink
    (or a swap to one between the check and the open) anywhere on the path fails instead of
    leading outside ``root``. The final file is opened non-blocking, so a FIFO cannot hang us.
    """
    try:
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        raise ApplicationError("not_found", "The workspace does not exist.", status=404) from None
    try:
        for depth, part in enumerate(parts):
            prefix = "/".join(parts[: depth + 1])
            try:
                info = os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise ApplicationError(
                    "not_found", f"{prefix!r} does not exist in your workspace.", status=404
                ) from None
            except OSError as exc:
                if exc.errno != errno.ENAMETOOLONG:
                    raise
                # No file system holds a name that long, so no such file exists.
                raise ApplicationError(
                    "not_found", f"{prefix[:80]!r}... does not exist in your workspace: a name is too long.", status=404
                ) from None
            except PermissionError:
                raise ApplicationError("unreadable", f"{prefix!r} cannot be read (permission denied).") from None
            if stat.S_ISLNK(info.st_mode):
                raise ApplicationError(
                    "symlink_in_path", f"{prefix!r} is a symbolic link; copy the data into your workspace instead."
                )
            last = depth == len(parts) - 1
            if not last and not stat.S_ISDIR(info.st_mode):
                raise ApplicationError("not_found", f"{prefix!r} is not a directory, so {shown!r} does not exist.")
            if last and not stat.S_ISREG(info.st_mode):
                raise ApplicationError("not_a_file", f"{shown!r} is not a regular file.")
            flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            flags |= os.O_NONBLOCK if last else os.O_DIRECTORY
            try:
                next_fd = os.open(part, flags, dir_fd=dir_fd)
            except PermissionError:
                raise ApplicationError("unreadable", f"{prefix!r} cannot be read (permission denied).") from None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EMLINK):
                    raise ApplicationError("symlink_in_path", f"{prefix!r} became a symbolic link.") from None
                raise ApplicationError("unreadable", f"{prefix!r} cannot be opened: {exc.strerror}.") from None
            os.close(dir_fd)
            dir_fd = next_fd
        if not stat.S_ISREG(os.fstat(dir_fd).st_mode):
            raise ApplicationError("not_a_file", f"{shown!r} is not a regular file.")
        fd, dir_fd = dir_fd, -1
        return fd
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)


@dataclass
class _Staged:
    """A private copy of the bytes being registered, with everything learned from reading them."""

    path: Path
    sha256: str
    size: int
    rows: int
    format: str
    schema: dict[str, str]

    def discard(self) -> None:
        shutil.rmtree(self.path.parent, ignore_errors=True)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _parse_row(text: str, *, shown: str, lineno: int) -> Any:
    """One JSONL line parsed strictly: a value a record can hold, or an error naming line and path.

    Lone surrogates, NUL characters, NaN/Infinity and nesting beyond 64 levels are refused like
    unparseable text (apps.core.jsonsafe): the rows are hashed, scanned and shown to agents, and a
    single such value would make every later read of the entry fail.
    """
    try:
        value = jsonsafe_loads(text)
    except json.JSONDecodeError as exc:
        raise ApplicationError(
            "malformed_jsonl", f"{shown} line {lineno} is not valid JSON: {exc.msg} at column {exc.colno}.", line=lineno
        ) from None
    except RecursionError:
        raise ApplicationError("malformed_jsonl", f"{shown} line {lineno} is nested too deeply.", line=lineno) from None
    bad = first_bad_value(value)
    if bad is not None:
        raise ApplicationError(
            "malformed_jsonl" if bad.rule == "non_finite_number" else "bad_value",
            f"{shown} line {lineno}: {bad.message}",
            line=lineno,
            path=bad.path,
            rule=bad.rule,
        )
    return value


CHAT_ROLES = ("system", "user", "assistant", "tool")


def _check_chat_row(value: dict[str, Any], *, shown: str, lineno: int) -> None:
    """One row of a ``chat`` entry: TRL's conversational prompt-completion form with tools.

    ``prompt``: messages, objects with a role and text content, assistant ``tool_calls`` ({id,
    type: function, function: {name, arguments: JSON text}}) and the ``tool_call_id`` of every
    tool message; ``completion``: the one assistant message learned; ``tools``: the JSON text of
    the tool definitions (as TRL reads it: one Arrow type whatever the schemas); ``metadata``: an
    object.
    """

    def bad(what: str) -> ApplicationError:
        return ApplicationError("bad_chat_row", f"{shown} line {lineno}: {what}", line=lineno)

    prompt, completion = value.get("prompt"), value.get("completion")
    if not isinstance(prompt, list) or not prompt:
        raise bad("prompt must be a non-empty list of messages")
    if not isinstance(completion, list) or len(completion) != 1:
        raise bad("completion must be a list of one message, the assistant message learned")
    for j, message in enumerate([*prompt, *completion]):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise bad(f"message {j} needs a role, one of {', '.join(CHAT_ROLES)}")
        if not isinstance(message.get("content"), str):
            raise bad(f"message {j} content must be text")
        calls = message.get("tool_calls")
        if calls is not None:
            if message["role"] != "assistant" or not isinstance(calls, list):
                raise bad(f"message {j}: only an assistant message has tool_calls, as a list")
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if (
                    not isinstance(function, dict)
                    or not isinstance(call.get("id"), str)
                    or not all(isinstance(function.get(k), str) for k in ("name", "arguments"))
                ):
                    raise bad(f"message {j}: a tool call is {{id, type, function: {{name, arguments (JSON text)}}}}")
        if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise bad(f"message {j}: a tool message names the call it answers (tool_call_id)")
    if completion[0]["role"] != "assistant":
        raise bad("the completion is an assistant message")
    tools = value.get("tools")
    try:
        parsed = json.loads(tools) if isinstance(tools, str) else None
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, list):
        raise bad("tools must be the JSON text of a list of tool definitions")
    if not isinstance(value.get("metadata", {}), dict):
        raise bad("metadata must be an object")


def _inspect_jsonl(path: Path, *, format: str | None, shown: str) -> tuple[int, str, dict[str, str]]:
    """Validate a JSONL file row by row; return (rows, format, schema). Names the first bad line."""
    if format is not None and format not in FORMAT_COLUMNS and format != DataFormat.CHAT:
        raise ApplicationError("unknown_format", f"format must be one of {sorted(FORMAT_COLUMNS)}, got {format!r}.")
    rows = 0
    types: dict[str, set[str]] = {}
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            line = raw.rstrip(b"\n").rstrip(b"\r")
            if not line.strip():
                raise ApplicationError(
                    "blank_line", f"{shown} line {lineno} is blank; JSONL has one JSON object per line."
                )
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ApplicationError(
                    "malformed_jsonl",
                    f"{shown} line {lineno} is not UTF-8 (byte {exc.start + 1} of the line).",
                    line=lineno,
                ) from None
            value = _parse_row(text, shown=shown, lineno=lineno)
            if not isinstance(value, dict):
                raise ApplicationError(
                    "not_an_object", f"{shown} line {lineno} is a JSON {_json_type(value)}, not an object."
                )
            if format is None:
                format = next((f for f in ("dpo", "sft") if all(c in value for c in FORMAT_COLUMNS[f])), None)
                if format is None:
                    raise ApplicationError(
                        "unknown_format",
                        f"{shown} line {lineno} has columns {sorted(value)}; expected sft (prompt, completion) "
                        "or dpo (prompt, chosen, rejected).",
                    )
            if format == DataFormat.CHAT:
                _check_chat_row(value, shown=shown, lineno=lineno)
                for key, item in value.items():
                    types.setdefault(key, set()).add(_json_type(item))
                rows += 1
                continue
            required = FORMAT_COLUMNS[format]
            missing = [c for c in required if c not in value]
            if missing:
                raise ApplicationError(
                    "missing_columns",
                    f"{shown} line {lineno} lacks {', '.join(missing)}; format {format} needs {', '.join(required)}.",
                )
            wrong = [c for c in required if not isinstance(value[c], str)]
            if wrong:
                raise ApplicationError(
                    "bad_column_type", f"{shown} line {lineno}: {', '.join(wrong)} must be text (a JSON string)."
                )
            for key, item in value.items():
                types.setdefault(key, set()).add(_json_type(item))
            rows += 1
    if rows == 0 or format is None:
        raise ApplicationError("empty_file", f"{shown} has no rows.")
    schema = {key: "|".join(sorted(kinds)) for key, kinds in sorted(types.items())}
    return rows, format, schema


def _stage_fd(fd: int, *, shown: str, format: str | None) -> _Staged:
    """Copy an open file into a private staging file, hashing it; then validate the copy.

    A regular file's size is checked before a byte is copied (a 2 GB sparse file used to be
    refused only after 1 GiB had been staged); the running count below still bounds anything
    whose size is not known up front or that grows while it is read.
    """
    try:
        declared = os.fstat(fd)
    except OSError:
        declared = None
    if declared is not None and stat.S_ISREG(declared.st_mode) and declared.st_size > MAX_DATA_BYTES:
        os.close(fd)
        raise ApplicationError(
            "file_too_large",
            f"{shown} is {declared.st_size} bytes, larger than {MAX_DATA_BYTES // (1 << 20)} MiB; split it.",
            size=declared.st_size,
        )
    staging = Path(tempfile.mkdtemp(prefix="rsi-data-"))
    target = staging / "data.jsonl"
    digest = hashlib.sha256()
    size = 0
    try:
        source = os.fdopen(fd, "rb")
        fd = -1  # the file object owns the descriptor now
        with source, target.open("wb") as sink:
            while True:
                try:
                    chunk = source.read(_COPY_CHUNK)
                except OSError as exc:
                    raise ApplicationError("unreadable", f"{shown} cannot be read: {exc.strerror}.") from None
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_DATA_BYTES:
                    raise ApplicationError(
                        "file_too_large", f"{shown} is larger than {MAX_DATA_BYTES // (1 << 20)} MiB; split it."
                    )
                digest.update(chunk)
                sink.write(chunk)
        if size == 0:
            raise ApplicationError("empty_file", f"{shown} is empty (0 bytes).")
        rows, fmt, schema = _inspect_jsonl(target, format=format, shown=shown)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return _Staged(path=target, sha256=digest.hexdigest(), size=size, rows=rows, format=fmt, schema=schema)


def _stage_rows(rows: list[dict[str, Any]], *, shown: str, format: str | None) -> _Staged:
    """Write rows as canonical JSONL (one compact object per line) and stage the file."""
    text = "".join(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows)
    return _stage_bytes(text.encode("utf-8"), shown=shown, format=format)


def _stage_bytes(data: bytes, *, shown: str, format: str | None) -> _Staged:
    """Stage bytes held in memory (an export's rows, an agent's upload) like any file."""
    staging = Path(tempfile.mkdtemp(prefix="rsi-data-"))
    path = staging / "rows.jsonl"
    try:
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        return _stage_fd(fd, shown=shown, format=format)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _staged_rows(staged: _Staged) -> list[dict[str, Any]]:
    """The staged rows read back: exactly what would be stored (validated already)."""
    with staged.path.open("r", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


# --------------------------------------------------------------------------- registering


def _actor(node: ResearchNode | None) -> tuple[str, str]:
    return (node.handle, node.kind) if node is not None else ("system", "system")


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ApplicationError("invalid_name", "Give the data a name of 1-200 characters.")
    return name.strip()


def _scope(run: Run | None, node: ResearchNode | None) -> Run | None:
    if node is not None and run is not None and node.run_id != run.pk:
        raise ApplicationError("foreign_node", f"{node.handle} does not belong to run {run.uuid}.")
    return run if run is not None else (node.run if node is not None else None)


def _reregistered(entry: DataEntry, *, actor: str, role: str, run: Run | None, what: str) -> DataEntry:
    """Identical bytes arrived again: keep the one entry, and let its readme say who and how."""
    with transaction.atomic():
        DataReadmeEntry.objects.create(entry=entry, author=actor, text=f"Registered again (identical bytes): {what}")
        event_append(
            run=run,
            type="data.reregistered",
            actor=actor,
            role=role,
            arguments={"handle": entry.handle, "sha256": entry.sha256, "source": what},
            result_ref=f"data:{entry.uuid}",
        )
    return entry


def _register_staged(
    staged: _Staged,
    *,
    name: str,
    source_kind: str,
    source: dict[str, Any],
    what: str,
    readme: str,
    run: Run | None,
    node: ResearchNode | None,
    teacher: str = "",
    parents: list[DataEntry] | None = None,
    event_type: str = "data.registered",
) -> DataEntry:
    """Store a staged file and record it; on any failure the stored copy is removed again."""
    actor, role = _actor(node)
    existing = DataEntry.objects.filter(sha256=staged.sha256).first()
    if existing is not None:
        return _reregistered(existing, actor=actor, role=role, run=run, what=what)

    store = artifact_store()
    uri = store.uri(data_key(staged.sha256))
    copied = was_there = False
    try:
        with transaction.atomic():
            # The lock is held from the check through the copy to the commit, so a failing
            # registration that removes its copy can never remove a concurrent one's file.
            lock_global_handles("data")
            existing = DataEntry.objects.filter(sha256=staged.sha256).first()
            if existing is None:
                was_there = store.exists(uri)
                store.put_file(staged.path, key=data_key(staged.sha256))
                copied = True
                entry = DataEntry(
                    handle=next_handle(DataEntry.objects.all(), "data"),
                    name=name,
                    uri=uri,
                    sha256=staged.sha256,
                    rows=staged.rows,
                    size_bytes=staged.size,
                    format=staged.format,
                    schema=staged.schema,
                    source_kind=source_kind,
                    source=source,
                    teacher=teacher,
                    run=run,
                    registered_by=node,
                )
                entry.full_clean()
                entry.save(force_insert=True)
                if parents:
                    entry.parents.add(*parents)
                DataReadmeEntry.objects.create(entry=entry, author=actor, text=readme)
                event_append(
                    run=run,
                    type=event_type,
                    actor=actor,
                    role=role,
                    arguments={
                        "handle": entry.handle,
                        "name": name,
                        "sha256": entry.sha256,
                        "rows": entry.rows,
                        "format": entry.format,
                        "source_kind": source_kind,
                        "source": source,
                        "parents": [p.handle for p in parents or []],
                    },
                    result_ref=f"data:{entry.uuid}",
                )
    except BaseException:
        if copied and not was_there:
            _remove_unreferenced(uri)
        raise
    if existing is not None:
        # A concurrent registration of the same bytes committed first: it wins.
        return _reregistered(existing, actor=actor, role=role, run=run, what=what)
    return entry


def _remove_unreferenced(uri: str) -> None:
    """Delete a just-copied artifact unless a committed entry points at it (under the handle lock)."""
    try:
        with transaction.atomic():
            lock_global_handles("data")
            if not DataEntry.objects.filter(uri=uri).exists():
                artifact_store().delete(uri)
    except DatabaseError:
        # The caller's transaction is broken: keep the content-addressed orphan (harmless) rather
        # than risk deleting a file another registration relies on.
        return


def _first_readme(origin: str, *, teacher: str = "", note: str = "") -> str:
    """An entry's first readme note: where it came from, its teacher if declared, the caller's note."""
    text = origin + (f" Generated by teacher model {teacher}." if teacher else "")
    return text + (f"\n\n{note}" if note else "")


def data_register_from_workspace(
    *,
    workspace: Path,
    path: str,
    name: str,
    format: str | None = None,
    run: Run | None = None,
    node: ResearchNode | None = None,
    teacher: str = "",
    note: str = "",
) -> DataEntry:
    """Register a JSONL file that lies inside ``workspace`` (a Worker's folder).

    ``path`` is relative and must stay inside: ``..``, absolute paths and symlinks anywhere on the
    path are refused, as are non-regular, unreadable, empty and malformed files. ``format`` is
    sft or dpo, inferred from the first row when omitted. Identical bytes return the existing entry.
    """
    name = _check_name(name)
    parts = _relative_parts(path)
    shown = "/".join(parts)
    run = _scope(run, node)
    fd = _open_confined(Path(workspace), parts, shown=shown)
    staged = _stage_fd(fd, shown=shown, format=format)
    try:
        readme = _first_readme(
            f"Registered from workspace file {shown} ({staged.rows} rows, {staged.format}).", teacher=teacher, note=note
        )
        return _register_staged(
            staged,
            name=name,
            source_kind=SourceKind.WORKSPACE,
            source={"workspace_path": shown},
            what=f"workspace file {shown} as {name!r}",
            readme=readme,
            run=run,
            node=node,
            teacher=teacher,
        )
    finally:
        staged.discard()


def data_register_from_catalog(
    *,
    catalog_root: Path,
    dataset: str,
    name: str | None = None,
    run: Run | None = None,
    node: ResearchNode | None = None,
    note: str = "",
) -> DataEntry:
    """Register a local catalog dataset's ``data.jsonl``; its card (README.md) becomes the first readme.

    The catalog's own quality labels (meta.json ``quality``, ``tags``) are not copied: finding
    out what a dataset is worth is the agents' job.
    """
    if not isinstance(dataset, str) or not _CATALOG_NAME.match(dataset):
        raise ApplicationError("invalid_name", f"{dataset!r} is not a catalog dataset name.")
    name = _check_name(name or dataset)
    run = _scope(run, node)
    root = Path(catalog_root)
    meta_fd = _open_confined(root, [dataset, "meta.json"], shown=f"{dataset}/meta.json")
    with os.fdopen(meta_fd, "rb") as handle:
        try:
            meta = json.loads(handle.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ApplicationError("malformed_catalog", f"{dataset}/meta.json is not valid JSON.") from None
    if not isinstance(meta, dict):
        raise ApplicationError("malformed_catalog", f"{dataset}/meta.json is not an object.")
    files = meta.get("files") or ["data.jsonl"]
    if files != ["data.jsonl"]:
        raise ApplicationError("malformed_catalog", f"{dataset} lists files {files}; only data.jsonl is supported.")
    card = ""
    try:
        card_fd = _open_confined(root, [dataset, "README.md"], shown=f"{dataset}/README.md")
        with os.fdopen(card_fd, "rb") as handle:
            card = handle.read(MAX_README_CHARS).decode("utf-8", errors="replace")
    except ApplicationError as exc:
        if exc.code != "not_found":
            raise
    fd = _open_confined(root, [dataset, "data.jsonl"], shown=f"{dataset}/data.jsonl")
    staged = _stage_fd(fd, shown=f"{dataset}/data.jsonl", format=meta.get("format"))
    try:
        readme = f"Registered from the local catalog dataset {dataset} ({staged.rows} rows, {staged.format})."
        if card:
            readme += f"\n\nDataset card:\n\n{card.strip()}"
        if note:
            readme += f"\n\n{note}"
        return _register_staged(
            staged,
            name=name,
            source_kind=SourceKind.CATALOG,
            source={"catalog": dataset, "file": "data.jsonl", "license": str(meta.get("license", ""))},
            what=f"catalog dataset {dataset} as {name!r}",
            readme=readme,
            run=run,
            node=node,
        )
    finally:
        staged.discard()


def data_register_from_job(
    *,
    job: Job,
    path: Path,
    parents: list[DataEntry],
    name: str,
    format: str | None = None,
    teacher: str = "",
    note: str = "",
) -> DataEntry:
    """Register a JSONL file a data job wrote (``path`` on the job's local disk) with its parents."""
    name = _check_name(name)
    path = Path(path)
    fd = _open_confined(path.parent, [path.name], shown=path.name)
    staged = _stage_fd(fd, shown=path.name, format=format)
    try:
        readme = f"Written by {job.kind} job {job.uuid} (attempt {job.attempt}) from {[p.handle for p in parents]}."
        if note:
            readme += f"\n\n{note}"
        return _register_staged(
            staged,
            name=name,
            source_kind=SourceKind.JOB,
            source={"job": str(job.uuid), "attempt": job.attempt, "parents": [p.handle for p in parents]},
            what=f"job {job.uuid} output as {name!r}",
            readme=readme,
            run=job.run,
            node=None,
            teacher=teacher,
            parents=parents,
        )
    finally:
        staged.discard()


def data_register_export(
    *,
    rows: list[dict[str, Any]],
    name: str,
    source: dict[str, Any],
    readme: str,
    scan: Callable[[list[dict[str, Any]], str], None],
    actor: str = "system",
) -> DataEntry:
    """Register exported agent trajectories (format chat, source export) once ``scan`` lets them in.

    The rows are written as canonical JSONL and staged; ``scan(rows, sha256)`` then sees the rows
    read back from the staged bytes (exactly what would be stored) and raises to refuse them, in
    which case nothing is stored or recorded. Identical bytes return the existing entry.
    """
    name = _check_name(name)
    staged = _stage_rows(rows, shown="trajectory export", format=DataFormat.CHAT)
    try:
        scan(_staged_rows(staged), staged.sha256)
        entry = _register_staged(
            staged,
            name=name,
            source_kind=SourceKind.EXPORT,
            source=source,
            what=f"trajectory export {name!r} by {actor}",
            readme=f"{readme}\n\nRegistered by {actor} ({staged.rows} conversations, chat).",
            run=None,
            node=None,
            event_type="data.exported",
        )
    finally:
        staged.discard()
    return entry


def data_register_upload(
    *,
    content: bytes | Path,
    sha256: str,
    size: int,
    name: str,
    generator: str,
    run: Run,
    node: ResearchNode,
    format: str | None = None,
    teacher: str = "",
    note: str = "",
    max_bytes: int = MAX_DATA_BYTES,
    max_rows: int | None = None,
    scan: Callable[[list[dict[str, Any]], str], None] | None = None,
) -> DataEntry:
    """Register JSONL bytes an agent made and sent in its call (source ``agent``): ``content`` is
    the bytes, or the file a streamed upload was received into (apps.expos.uploads; read, not moved).

    The declared ``size`` and ``sha256`` are checked against the bytes that arrived before
    anything else, so a cut or altered transfer is refused as such (``size_mismatch``,
    ``sha256_mismatch``), not as malformed data. Then the steps every way in takes: staged,
    validated as JSONL of ``format``, held to the run's limits (``max_bytes``, ``max_rows``:
    ``file_too_large``, ``too_many_rows``), shown to ``scan(rows, sha256)`` — which raises to
    refuse, as the contamination review does — and only then stored and recorded. ``generator``
    says who or what made the rows (kept in the source and the readme); ``teacher`` is the model
    whose outputs they are, if any, and meets the teacher rules like any other entry's. Nothing is
    stored or recorded when any step refuses; identical bytes return the existing entry.
    """
    name = _check_name(name)
    if not isinstance(generator, str) or not generator.strip() or len(generator) > 200:
        raise ApplicationError("invalid_generator", "Say who or what made the data (generator, 1-200 characters).")
    run = _scope(run, node)  # type: ignore[assignment]
    shown = f"{name} (uploaded)"
    received, actual = _measure(content)
    if received != size:
        raise ApplicationError(
            "size_mismatch",
            f"size_bytes declares {size} bytes but {received} arrived; nothing was registered. Send the "
            "whole file again (the same Idempotency-Key is safe to reuse).",
            declared=size,
            received=received,
        )
    if actual != sha256:
        raise ApplicationError(
            "sha256_mismatch",
            f"sha256 declares {sha256} but the bytes that arrived hash to {actual}; nothing was registered. "
            "Hash the file you send (sha256sum) and send it again.",
            declared=sha256,
            received=actual,
        )
    if size > max_bytes:
        raise ApplicationError(
            "file_too_large", f"{shown} is {size} bytes; this run takes at most {max_bytes} per upload.", size=size
        )
    if isinstance(content, Path):
        staged = _stage_fd(os.open(content, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)), shown=shown, format=format)
    else:
        staged = _stage_bytes(content, shown=shown, format=format)
    try:
        if max_rows is not None and staged.rows > max_rows:
            raise ApplicationError(
                "too_many_rows",
                f"{shown} has {staged.rows} rows; this run takes at most {max_rows} per upload, so rows "
                f"{max_rows + 1}-{staged.rows} are over. Split the file.",
                rows=staged.rows,
                max_rows=max_rows,
            )
        if scan is not None:
            scan(_staged_rows(staged), staged.sha256)
        generator = generator.strip()
        readme = _first_readme(
            f"Uploaded by {node.handle} ({staged.rows} rows, {staged.format}), made by {generator}.",
            teacher=teacher,
            note=note,
        )
        return _register_staged(
            staged,
            name=name,
            source_kind=SourceKind.AGENT,
            source={"source": "agent", "generator": generator, "uploaded_by": node.handle, "declared_sha256": sha256},
            what=f"upload {name!r} by {node.handle}",
            readme=readme,
            run=run,
            node=node,
            teacher=teacher,
        )
    finally:
        staged.discard()


def upload_limits(run: Run) -> tuple[int, int | None, dict[str, Any]]:
    """The run's upload limits as they are now (bytes, rows) and its policy.

    Read fresh: a caller's resolved run may be a few seconds old (apps.expos.auth).
    """
    policy = type(run).objects.filter(pk=run.pk).values_list("policy", flat=True).first() or {}
    max_bytes = min(int(policy.get("upload_max_bytes") or MAX_DATA_BYTES), MAX_DATA_BYTES)
    return max_bytes, policy.get("upload_max_rows"), policy


def _measure(content: bytes | Path) -> tuple[int, str]:
    """The length and sha256 of bytes, or of a file's bytes (read in chunks)."""
    if not isinstance(content, Path):
        return len(content), hashlib.sha256(content).hexdigest()
    digest, size = hashlib.sha256(), 0
    with content.open("rb") as handle:
        while chunk := handle.read(_COPY_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


# --------------------------------------------------------------------------- readme and usage


def data_readme_append(
    *, entry: DataEntry, author: str, text: str, node: ResearchNode | None = None
) -> DataReadmeEntry:
    """Append a provenance note. Notes are never edited or removed (the database refuses it)."""
    if not isinstance(author, str) or not author.strip() or len(author) > 200:
        raise ApplicationError("invalid_author", "A readme note needs an author of 1-200 characters.")
    if not isinstance(text, str) or not text.strip():
        raise ApplicationError("empty_text", "A readme note needs some text.")
    if len(text) > MAX_README_CHARS:
        raise ApplicationError("text_too_long", f"A readme note is at most {MAX_README_CHARS} characters.")
    with transaction.atomic():
        note = DataReadmeEntry(entry=entry, author=author.strip(), text=text)
        note.full_clean()
        note.save(force_insert=True)
        event_append(
            run=entry.run,
            type="data.readme_appended",
            actor=author.strip(),
            role=node.kind if node is not None else "system",
            arguments={"handle": entry.handle, "chars": len(text)},
            result_ref=f"data:{entry.uuid}",
        )
    return note


def data_usage_record(*, entry: DataEntry, experiment: Experiment, purpose: str = "train") -> DataUsage:
    """Record that ``experiment`` used ``entry`` (idempotent per pair)."""
    if not isinstance(purpose, str) or not re.fullmatch(r"[a-z_]{1,16}", purpose):
        raise ApplicationError("invalid_purpose", "purpose is a short lowercase word such as train or eval.")
    existing = DataUsage.objects.filter(entry=entry, experiment=experiment).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            usage = DataUsage.objects.create(entry=entry, experiment=experiment, purpose=purpose)
            event_append(
                run=experiment.run,
                type="data.used",
                actor=experiment.owner.handle,
                role="worker",
                arguments={"handle": entry.handle, "experiment": experiment.handle, "purpose": purpose},
                result_ref=f"data:{entry.uuid}",
            )
    except IntegrityError:
        # A concurrent call recorded the same pair first; the unique constraint kept one row.
        return DataUsage.objects.get(entry=entry, experiment=experiment)
    return usage


# --------------------------------------------------------------------------- transforms


_UNREADABLE_HINT = "This entry cannot be read (nothing of it is shown); register a corrected copy."


def data_load_rows(*, entry: DataEntry, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of a stored entry (all, or the first ``limit``).

    Rows are parsed as strictly as at registration. An entry stored before a rule existed (a
    NaN, a lone surrogate) or whose bytes went bad answers 409 ``data_unreadable`` naming the
    entry, line and path, so one bad entry is refused alone instead of failing every reader.
    """
    rows: list[dict[str, Any]] = []
    shown = f"{entry.handle} (stored data)"
    with artifact_store().open(entry.uri, "rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            if limit is not None and len(rows) >= limit:
                break
            try:
                row = _parse_row(raw.decode("utf-8"), shown=shown, lineno=lineno)
                if not isinstance(row, dict):
                    raise ApplicationError("not_an_object", f"{shown} line {lineno} is not a JSON object.")
            except UnicodeDecodeError:
                raise Conflict(
                    "data_unreadable", f"{shown} line {lineno} is not UTF-8. {_UNREADABLE_HINT}", line=lineno
                ) from None
            except ApplicationError as exc:
                raise Conflict("data_unreadable", f"{exc.message} {_UNREADABLE_HINT}", **exc.detail) from None
            rows.append(row)
    return rows


def _scanner_for(params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    transforms._allowed(params, {"benchmark", "ngram", "threshold"}, "decontaminate")
    reference = params.get("benchmark")
    if not isinstance(reference, str) or not reference:
        raise ApplicationError("bad_params", "decontaminate needs benchmark: a benchmark name or uuid.")
    benchmark = benchmark_resolve(reference)
    ngram = transforms._int(params, "ngram", low=3, high=50) or 13
    threshold = transforms._float(params, "threshold", 0.75, low=0.3, high=1.0)
    scanner = benchmark_scanner(benchmark=benchmark, ngram=ngram, threshold=threshold)
    # Recorded as the benchmark's identity and version, never its items.
    return scanner, {"benchmark": benchmark.name, "version": benchmark.version, "ngram": ngram, "threshold": threshold}


def data_transform(
    *,
    op: str,
    inputs: list[DataEntry],
    params: dict[str, Any],
    job: Job | None = None,
    name: str | None = None,
    node: ResearchNode | None = None,
) -> DataEntry:
    """Derive a new datapool entry from ``inputs`` with one transform; parents and provenance recorded.

    ``op``: filter, deduplicate, mix (two or more inputs), convert, decontaminate (params
    ``benchmark`` plus optional ``ngram``/``threshold``). If the result has the bytes of an
    existing entry (e.g. a filter that kept every row), that entry is returned with a readme line.
    """
    if op not in TRANSFORM_OPS:
        raise ApplicationError("bad_params", f"op must be one of {list(TRANSFORM_OPS)}, got {op!r}.")
    if not isinstance(params, dict):
        raise ApplicationError("bad_params", "params must be an object.")
    if not inputs:
        raise ApplicationError("bad_params", f"{op} needs an input entry.")
    if op != "mix" and len(inputs) != 1:
        raise ApplicationError("bad_params", f"{op} takes exactly one input; mix combines several.")
    if op == "mix" and len({entry.format for entry in inputs}) != 1:
        raise ApplicationError("bad_params", "mix inputs must share one format (convert first).")
    recorded = dict(params)
    source_rows: list[dict[str, Any]] = []
    try:
        if op == "mix":
            rows, report = transforms.mix_rows([data_load_rows(entry=e) for e in inputs], params)
        else:
            source_rows = data_load_rows(entry=inputs[0])
            if op == "filter":
                rows, report = transforms.filter_rows(source_rows, params)
            elif op == "deduplicate":
                rows, report = transforms.deduplicate_rows(source_rows, params)
            elif op == "convert":
                rows, report = transforms.convert_rows(source_rows, params)
            else:
                scanner, recorded = _scanner_for(params)
                rows, report = transforms.decontaminate_rows(source_rows, scanner)
    except transforms.TransformError as exc:
        raise ApplicationError(exc.code, exc.message) from None
    if op != "mix" and rows == source_rows:
        # Nothing changed: the input already is the result; say so in its readme, no new entry.
        actor, role = _actor(node)
        return _reregistered(inputs[0], actor=actor, role=role, run=inputs[0].run,
                             what=f"{op} with {json.dumps(recorded, sort_keys=True)} changed nothing")  # fmt: skip
    if not rows:
        raise ApplicationError("empty_result", f"{op} left no rows ({json.dumps(report)}); loosen the parameters.")

    handles = [entry.handle for entry in inputs]
    out_format = inputs[0].format if op != "convert" else None
    staged = _stage_rows(rows, shown=f"{op} output", format=out_format)
    run = node.run if node is not None else (job.run if job is not None else inputs[0].run)
    try:
        readme = (
            f"{op} of {', '.join(handles)}"
            + (f" by job {job.uuid}" if job is not None else "")
            + f".\nParameters: {json.dumps(recorded, sort_keys=True)}\nResult: {json.dumps(report, sort_keys=True)}"
        )
        return _register_staged(
            staged,
            name=_check_name(name or f"{inputs[0].name}-{op}"),
            source_kind=SourceKind.JOB,
            source={
                "transform": op,
                "params": recorded,
                "inputs": handles,
                "job": str(job.uuid) if job is not None else None,
                "report": report,
            },
            what=f"{op} of {', '.join(handles)}",
            readme=readme,
            run=run,
            node=node,
            parents=list(inputs),
            event_type="data.transformed",
        )
    finally:
        staged.discard()


__all__ = [
    "DataFormat",
    "data_load_rows",
    "data_readme_append",
    "data_register_export",
    "data_register_from_catalog",
    "data_register_from_job",
    "data_register_from_workspace",
    "data_register_upload",
    "data_transform",
    "data_usage_record",
]
