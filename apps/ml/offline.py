"""The library never reaches the Hub: imported first by every module that loads the ML stack.

Every model, tokenizer and dataset is a local path, and loads pass ``local_files_only=True``;
these variables cover whatever TRL or datasets import later. A module of its own, imported
before transformers, so they hold in the gpu worker and the minibench build without reaching the
processes that import only this package's light contracts (the web server's Hub connector).
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
