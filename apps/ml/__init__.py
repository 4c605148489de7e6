"""The training and inference core: Django-free code that both apps/ and workers/ import.

The GPU worker (`workers.gpu.tasks`) claims a job row and calls `training.train` or
`inference.evaluate`; the minibench build (`apps.benchmarks.minibench.build`) trains its reference
checkpoints with the same `train`. Keeping it here, below both, means neither imports upward, and
the build and the worker cannot drift apart. Not a Django app: nothing here touches the ORM.

Safety rules kept here rather than at each call site: weights load and save as safetensors only
(never pickle), no `trust_remote_code`, and no network access to the Hub.
"""

# The Hub is turned off (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE) by apps.ml.offline, which every
# module that loads transformers, TRL or datasets imports first. Not here: the light contracts of
# this package (hparams, evaluators, row_format) are imported by the web server too, whose Hub
# connector must reach a configured Hub.
