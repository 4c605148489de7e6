"""The minibench `demo` profile: the `ci` arithmetic task with a reference trained in minutes.

A subpackage on purpose, as the `hard` profile is: ``build.source_digest`` hashes only the
``*.py`` files directly in the minibench package, so nothing here changes the `ci` and `full`
digests or their caches. The demo profile has its own digest (``demo_source_digest``).
"""

from __future__ import annotations

from .build import DEMO_REFERENCE_HPARAMS, NAMESPACE, build_demo, demo_source_digest

__all__ = ["DEMO_REFERENCE_HPARAMS", "NAMESPACE", "build_demo", "demo_source_digest"]
