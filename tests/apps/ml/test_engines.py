"""Engine choice by configuration, and the managed vLLM server's refusal of a copy that is not the checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.core.hashing import sha256_tree
from apps.ml.engines import EngineError, VLLMServer, choose_engine
from apps.ml.vllm_client import VLLMError


def test_auto_is_hf_on_cpu_and_vllm_on_cuda(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    assert choose_engine({}, cuda=False).engine == "hf"
    on_cuda = choose_engine({"RSI_VLLM_PYTHON": str(python)}, cuda=True)
    assert (on_cuda.engine, on_cuda.python, on_cuda.provenance) == ("vllm", str(python), "verified")
    # A job's own backend wins over the host default.
    assert choose_engine({"RSI_VLLM_PYTHON": str(python)}, requested="hf", cuda=True).engine == "hf"


def test_vllm_without_its_environment_says_how_to_create_it(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"\./dev env vllm"):
        choose_engine({"RSI_EVAL_ENGINE": "vllm", "RSI_VLLM_PYTHON": str(tmp_path / "missing")}, cuda=False)
    with pytest.raises(EngineError, match="auto, hf or vllm"):
        choose_engine({"RSI_EVAL_ENGINE": "tgi"}, cuda=False)


def test_an_external_server_is_unknown_provenance_unless_trusted() -> None:
    env = {"RSI_EVAL_ENGINE": "vllm", "RSI_VLLM_URL": "http://10.0.0.5:8000/"}
    external = choose_engine(env, cuda=False)
    assert (external.engine, external.url, external.provenance) == ("vllm-external", "http://10.0.0.5:8000", "unknown")
    assert choose_engine({**env, "RSI_VLLM_TRUSTED": "1"}, cuda=False).provenance == "trusted"
    with pytest.raises(EngineError, match="http"):
        choose_engine({**env, "RSI_VLLM_URL": "file:///etc/passwd"}, cuda=False)


def test_managed_server_refuses_to_serve_files_that_differ_from_the_manifest(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    manifest = sha256_tree(checkpoint)
    (checkpoint / "model.safetensors").write_bytes(b"swapped")  # changed after registration
    server = VLLMServer(checkpoint_dir=checkpoint, manifest=manifest, python=str(tmp_path / "never-started"))
    with pytest.raises(VLLMError, match=r"differs from the checkpoint's manifest: \['model.safetensors'\]"), server:
        pass
    assert server.model_dir
    assert not server.model_dir.exists()
