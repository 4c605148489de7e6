"""Generators of false claims the way people write them, one per class of issue 33 (item 4 and
class 7), and of honest claims written the same ways.

Nothing here imports the claim reader: each report is written from what an author sees (the
handles and the scores shown). Every generator draws from a ``random.Random`` seeded from
``RSI_REDTEAM_SEED`` (``disguise.SEED``), so another seed tries other variants of the same classes.

Classes (each report states something the record does not hold):

- ``postfix``       the score before its citation: "0.95 after 200 steps (exp_0002)", behind an
                    honest postfix citation of another experiment in the same sentence;
- ``homoglyph``     the handle in look-alike letters of another script, another case or separator,
                    credited with another experiment's score;
- ``glue``          the author's model credited with the score of the experiment it was "trained
                    like" (the reference is not the subject);
- ``theta0``        the model before any training, named in words, credited with a trained score;
- ``count``         items right with no total ("3 questions right" of 4 recorded as 2);
- ``every``         "solves every item", "a perfect score", "none right" against the record;
- ``dash``          a score after an em or en dash: "exp_0002 — 0.95";
- ``no_evidence``   a claim citing nothing, above every evaluation of the run;
- ``checkpoint``    a claim citing only a checkpoint, above every evaluation of it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from tests.apps.integrity.redteam.disguise import SEED

__all__ = ["ATTACKS", "HONEST", "SEED", "Report", "Scene", "disguise_handle", "draw"]


@dataclass(frozen=True)
class Scene:
    """What an author sees: θ0's evaluation, two trainings and a perfect one, their checkpoints and
    shown scores, and how many items the feedback split has."""

    base: str  # an evaluation of θ0
    low: str
    high: str
    top: str  # scored 1.0
    low_checkpoint: str
    high_checkpoint: str
    scores: dict[str, float]
    correct: dict[str, int]
    samples: int


@dataclass(frozen=True)
class Report:
    cls: str
    text: str
    evidence: tuple[str, ...] = ()


# --- how numbers and handles are written ---------------------------------------------------------------

# Look-alikes of the letters of "exp" and "ckpt" in other scripts (what an adversary types).
_LOOKALIKE = {
    "e": ["е", "ｅ", "ℯ", "ҽ", "E", "Е"],
    "x": ["х", "ⅹ", "ｘ", "X", "Х", "ᕁ"],
    "p": ["р", "ρ", "ｐ", "P", "Р"],
    "c": ["с", "ϲ", "ｃ", "C", "С", "ⅽ"],
    "k": ["κ", "ｋ", "K", "К", "к"],
    "t": ["т", "ｔ", "T", "Т", "τ"],
}
_SEPARATORS = ["_", "-", "‐", "＿", " ", "_"]


def disguise_handle(handle: str, rng: random.Random) -> str:
    """``exp_0003`` with at least one letter in another script, case or width, another separator."""
    prefix, digits = handle.split("_")
    letters = list(prefix)
    changed = rng.sample(range(len(letters)), k=rng.randint(1, len(letters)))
    for i in changed:
        letters[i] = rng.choice(_LOOKALIKE[letters[i]])
    return "".join(letters) + rng.choice(_SEPARATORS) + digits


def _decimal(score: float, rng: random.Random) -> str:
    return rng.choice([f"{score:.2f}", f"{score:.2f}".replace(".", ","), f"{score * 100:.0f}%", f"{score:.3f}"])


def _above(scene: Scene, rng: random.Random) -> float:
    """A score above every evaluation but the perfect one (and below 1.0)."""
    return round(rng.uniform(scene.scores[scene.high] + 0.08, 0.97), 2)


# --- attacks -------------------------------------------------------------------------------------------


def postfix(scene: Scene, rng: random.Random) -> Report:
    s = _decimal(_above(scene, rng), rng)
    honest = f"{scene.scores[scene.base]:.2f} ({scene.base})"
    text = rng.choice(
        [
            f"θ0 scores {honest}; SFT reaches {s} after {rng.randint(50, 400)} steps ({scene.low})",
            f"Baseline {honest}, fine-tuned {s} ({scene.low})",
            f"From {honest} to {s} after training [{scene.low}]",
            f"{honest} before, {s} for {scene.low} after",
        ]
    )
    return Report("postfix", text, (scene.base, scene.low))


def homoglyph(scene: Scene, rng: random.Random) -> Report:
    written = disguise_handle(scene.low, rng)
    s = _decimal(scene.scores[scene.high], rng)
    text = rng.choice([f"{written} reaches {s} on feedback", f"{written}: feedback score {s}", f"{written} scores {s}"])
    return Report("homoglyph", text, ())


_GLUE = ["trained like", "same recipe as", "following", "as in", "similar to", "mirroring", "modelled on"]


def glue(scene: Scene, rng: random.Random) -> Report:
    s = _decimal(scene.scores[scene.high], rng)
    phrase = rng.choice(_GLUE)
    text = rng.choice(
        [
            f"Our SFT model ({phrase} {scene.high}) reaches {s}",
            f"The new training, {phrase} {scene.high}, scores {s} on feedback",
            f"SFT ({phrase} {scene.high}): {s}",
        ]
    )
    return Report("glue", text, (scene.low,))


_THETA0_WORDS = [
    "the model before any training",
    "the weights before any fine-tuning",
    "the untrained model",
    "the vanilla model",
    "θ_0",
    "Θ0",
    "theta zero",
    "the checkpoint we started from",
    "the model without training",
]


def theta0(scene: Scene, rng: random.Random) -> Report:
    s = _decimal(scene.scores[scene.high], rng)
    name = rng.choice(_THETA0_WORDS)
    text = rng.choice([f"{name} already reaches {s}", f"Surprisingly, {name} scores {s} on feedback"])
    return Report("theta0", text, (scene.base, scene.high))


def count(scene: Scene, rng: random.Random) -> Report:
    k = rng.randint(scene.correct[scene.low] + 1, scene.samples - 1)
    text = rng.choice(
        [
            f"{scene.low} gets {k} questions right",
            f"{scene.low} solves {k} problems",
            f"{scene.low} answers {k} feedback items correctly",
            f"{scene.low} has {k} correct answers",
        ]
    )
    return Report("count", text, (scene.low,))


def every(scene: Scene, rng: random.Random) -> Report:
    h = rng.choice([scene.low, scene.high])
    text = rng.choice(
        [
            f"{h} solves every item",
            f"{h} gets all {scene.samples} feedback questions right",
            f"{h} achieves a perfect score",
            f"{h} got them all right",
            f"{scene.base} gets none of the items right",
            f"not a single question was right for {scene.base}",
        ]
    )
    return Report("every", text, (h, scene.base))


def dash(scene: Scene, rng: random.Random) -> Report:
    s = f"{_above(scene, rng):.2f}"
    text = f"{scene.low}{rng.choice([' — ', ' – ', '—', ' -- ', ' ― '])}{s}"
    return Report("dash", text, (scene.low,))


def no_evidence(scene: Scene, rng: random.Random) -> Report:
    s = _decimal(_above(scene, rng), rng)
    text = rng.choice(
        [f"SFT on clean data reaches {s}", f"Our best recipe scores {s} on feedback", f"Feedback accuracy: {s}"]
    )
    return Report("no_evidence", text, ())


def checkpoint(scene: Scene, rng: random.Random) -> Report:
    s = _decimal(_above(scene, rng), rng)
    text = rng.choice(
        [
            f"{scene.low_checkpoint} scores {s} on feedback",
            f"The fine-tuned checkpoint reaches {s}",
            f"{disguise_handle(scene.low_checkpoint, rng)} reaches {s}",
        ]
    )
    return Report("checkpoint", text, (scene.low_checkpoint,))


ATTACKS: dict[str, Callable[[Scene, random.Random], Report]] = {
    "postfix": postfix,
    "homoglyph": homoglyph,
    "glue": glue,
    "theta0": theta0,
    "count": count,
    "every": every,
    "dash": dash,
    "no_evidence": no_evidence,
    "checkpoint": checkpoint,
}

# --- honest claims written the same ways ----------------------------------------------------------------


def _honest(scene: Scene, rng: random.Random) -> Report:
    b, lo, hi, top = scene.base, scene.low, scene.high, scene.top
    sb, sl, sh = (scene.scores[h] for h in (b, lo, hi))
    forms = [
        (f"θ0 scores {_decimal(sb, rng)} ({b}); SFT reaches {_decimal(sl, rng)} after 200 steps ({lo})", (b, lo)),
        (f"{sb:.2f} ({b}) … {sh:.2f} after {rng.randint(10, 300)} steps ({hi})", (b, hi)),
        (f"Baseline {sb:.2f} [{b}], fine-tuned {sl:.2f} [{lo}], longer {sh:.2f} [{hi}]", (b, lo, hi)),
        (f"{_decimal(sh, rng)} for {hi}, {_decimal(sl, rng)} for {lo}", (lo, hi)),
        (f"{disguise_handle(lo, rng)} reaches {_decimal(sl, rng)}", ()),
        (f"{disguise_handle(hi, rng)}: feedback score {sh:.2f}", ()),
        (f"SFT ({rng.choice(_GLUE)} {hi}) reaches {_decimal(sl, rng)}", (lo,)),
        (f"{rng.choice(_THETA0_WORDS[:6])} scores {_decimal(sb, rng)}", (b,)),
        (f"{lo} gets {scene.correct[lo]} questions right", (lo,)),
        (f"{hi} answers {scene.correct[hi]} feedback items correctly", (hi,)),
        (f"{top} solves every item", (top,)),
        (f"{top} achieves a perfect score on feedback", (top,)),
        (f"{hi}{rng.choice([' — ', ' – ', '—'])}{sh:.2f}", (hi,)),
        (f"Our best recipe so far reaches {_decimal(sh, rng)} on feedback", ()),
        (f"{scene.high_checkpoint} scores {_decimal(sh, rng)}", (scene.high_checkpoint,)),
        (f"The fine-tuned checkpoint reaches {_decimal(sl, rng)}", (scene.low_checkpoint,)),
        (f"{hi} does not solve every item; it reaches {sh:.2f}", (hi,)),
        (f"{lo} was evaluated on every item of the feedback split and scored {sl:.2f}", (lo,)),
    ]
    text, evidence = rng.choice(forms)
    return Report("honest", text, evidence)


HONEST = _honest


def draw(generator: Callable[[Scene, random.Random], Report], scene: Scene, count: int, salt: str) -> list[Report]:
    """``count`` reports from one generator, distinct where the generator allows."""
    rng = random.Random(f"{SEED}:claims:{salt}")
    out: list[Report] = []
    for _ in range(count * 5):
        report = generator(scene, rng)
        if report not in out:
            out.append(report)
        if len(out) == count:
            break
    return out
