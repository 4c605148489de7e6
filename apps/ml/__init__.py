"""The training and inference core: Django-free code that both apps/ and workers/ import.

The GPU worker (`workers.gpu.tasks`) claims a job row and calls `training.train` or
`inference.evaluate`; the minibench build (`apps.benchmarks.minibench.build`) trains its reference
checkpoints with the same `train`. Keeping it here, below both, means neither imports upward, and
the build and the worker cannot drift apart. Not a Django app: nothing here touches the ORM.

Safety rules kept here rather than at each call site: weights load and save as safetensors only
(never pickle), no `trust_remote_code`, and no network access to the Hub.
"""

import os

# The library must never reach the Hub: every model, tokenizer and dataset is a local path. Loads
# also pass local_files_only=True; these cover whatever TRL or datasets import later. Set in the
# package so they hold before any submodule imports transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
