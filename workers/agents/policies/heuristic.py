"""The heuristic policy: deterministic rules per role, using exactly the tools an LLM agent gets.

It is the offline demo, the test driver and a baseline — never an LLM result. Every decision
depends only on the policy's saved state and the answers of its tool calls, so a step re-run after
a crash makes the same calls again (and the journal answers them).

Worker tasks written by the Main Agent carry a few ``key: value`` lines the heuristic Worker reads
(an LLM Worker reads the same text as prose)::

    Direction: data-screen | recipe-sweep | continue | verify | dpo
    Capability: arithmetic            (the search term for the catalog)
    avoid: arithmetic-noisy, ...      (datasets not to use)
    datasets: arithmetic-clean        (use these instead of searching)
    search: addition drills           (more search terms, beside the capability)
    recipe: sft lr=0.001 steps=200    (the training recipe to use)
    from: exp_0004                    (continue from / verify this experiment)

Workers end with a summary whose last line is machine-readable for the heuristic Main Agent::

    best: exp_0004 data=arithmetic-clean recipe=sft lr=0.001 steps=200 seed=0 score=0.41

The guidance forms the heuristic Main Agent understands are documented in docs/guidance.md.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

from workers.agents.client import ServerFault, ToolResult
from workers.agents.policies.base import Outcome, StepView
from workers.agents.policies.search import (
    Budget,
    FollowUp,
    diagnosis_weight,
    lines_of,
    loss_drop,
    search_policy,
    size_next_job,
)

EXP_RE = re.compile(r"\bexp_\d{4,}\b")
WORKER_RE = re.compile(r"\bworker_\d{4,}\b")
_DIRECTIVE_RE = re.compile(r"^\s*([A-Za-z][A-Za-z _-]{0,30}):\s*(.*\S)\s*$")
DIRECTIONS = ("data-screen", "recipe-sweep", "continue", "verify", "dpo")
MAX_INFLIGHT = 2
SUBMIT_STOP_CODES = ("run_not_running", "node_not_active", "run_not_active")


# --- shared parsing ----------------------------------------------------------------------------------


def parse_directives(text: str) -> dict[str, str]:
    """``key: value`` lines of a task text, keys lower-cased with ``_`` for spaces and dashes."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _DIRECTIVE_RE.match(line)
        if match:
            key = re.sub(r"[ -]+", "_", match.group(1).strip().lower())
            found.setdefault(key, match.group(2).strip())
    return found


def split_list(value: str | None) -> list[str]:
    return [item.strip() for item in re.split(r"[,\s]+", value or "") if item.strip()]


_RECIPE_KEYS = {"lr": "learning_rate", "learning_rate": "learning_rate", "steps": "max_steps",
                "max_steps": "max_steps", "batch": "batch_size", "batch_size": "batch_size", "seed": "seed",
                "warmup": "warmup_steps", "warmup_steps": "warmup_steps", "scheduler": "lr_scheduler_type",
                "lr_scheduler_type": "lr_scheduler_type"}  # fmt: skip


def parse_recipe(text: str | None) -> dict[str, Any]:
    """``sft lr=0.001 steps=200`` -> {"recipe": "sft", "learning_rate": 0.001, "max_steps": 200}."""
    recipe: dict[str, Any] = {}
    for token in re.split(r"[\s,;]+", text or ""):
        if not token:
            continue
        if token.lower() in ("sft", "dpo"):
            recipe["recipe"] = token.lower()
            continue
        if "=" not in token:
            continue
        key, _, value = token.partition("=")
        name = _RECIPE_KEYS.get(key.strip().lower())
        if name is None:
            continue
        try:
            if name == "lr_scheduler_type":
                recipe[name] = value
            elif name == "learning_rate":
                recipe[name] = float(value)
            else:
                recipe[name] = int(float(value))
        except ValueError:
            continue
    return recipe


def format_recipe(recipe: dict[str, Any]) -> str:
    parts = [str(recipe.get("recipe", "sft"))]
    short = {"learning_rate": "lr", "max_steps": "steps", "batch_size": "batch_size", "seed": "seed",
             "warmup_steps": "warmup", "lr_scheduler_type": "scheduler"}  # fmt: skip
    for key, label in short.items():
        if key in recipe:
            value = recipe[key]
            parts.append(f"{label}={value:g}" if isinstance(value, float) else f"{label}={value}")
    return " ".join(parts)


def parse_best_line(summary: str) -> dict[str, Any] | None:
    """The ``best: exp_N key=value ...`` line of a heuristic Worker's summary (None when absent)."""
    for line in reversed(summary.splitlines()):
        match = re.match(r"^\s*best:\s*(exp_\d{4,})\s*(.*)$", line)
        if not match:
            continue
        fields: dict[str, Any] = {"experiment": match.group(1)}
        for key, value in re.findall(r"(\w+)=(\S+)", match.group(2)):
            fields[key] = value
        if "score" in fields:
            try:
                fields["score"] = float(fields["score"])
            except ValueError:
                fields.pop("score")
        return fields
    return None


class _ServerFaultsRaise:
    """The step's view, except that a server fault (5xx) raises :class:`ServerFault`.

    The rules below read a failed answer as a refusal: skip the dataset, drop the spawn, the node
    is gone. A 5xx is no refusal, and acting on it lost real work (a Worker took one failed
    state_get_current_worker as "gone" and abandoned its branch; a Main Agent lost the trigger
    it was reading). Raised instead, it ends the attempt uncommitted, so the step is retried from
    its journal and its triggers stay in the inbox. Transient faults (503, connection errors)
    never get here: the client retries them, then raises ApiUnavailable for a later retry.
    """

    def __init__(self, view: StepView) -> None:
        self._view = view

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)

    def call(self, name: str, args: dict[str, Any] | None = None, *, if_match: str | None = None) -> ToolResult:
        result = self._view.call(name, args, if_match=if_match)
        if result.status >= 500:
            raise ServerFault(result)
        return result


def _error(result: ToolResult) -> str:
    return f"{result.name}: {result.status} {result.error_code}: {result.error_message}"[:600]


def _policy_defaults(view: StepView) -> dict[str, Any]:
    heuristic = (view.briefing.get("policy") or {}).get("heuristic") or {}
    return {
        "screen_steps": int(heuristic.get("screen_steps", 60)),
        "train_steps": int(heuristic.get("train_steps", 200)),
        "learning_rate": float(heuristic.get("learning_rate", 2e-3)),
        "batch_size": int(heuristic.get("batch_size", 64)),
        # The trainings' learning-rate schedule (the training default, cosine, unless the run sets one).
        "lr_scheduler_type": str(heuristic.get("lr_scheduler_type", "cosine")),
        "screen_datasets": int(heuristic.get("screen_datasets", 3)),
        "max_workers": int(heuristic.get("max_workers", 4)),
        "reviewers": bool((view.briefing.get("policy") or {}).get("reviewers", True)),
        # The run's seed: the first training seed of every recipe (replicates count up from it).
        "seed": int((view.briefing.get("policy") or {}).get("seed", 0)),
        # Weakening switches (the suites' heuristic-weak configuration, apps/dojo/agents.py):
        # rank_data false takes catalog datasets in search order, unranked and unfiltered;
        # fixed_recipe true trains every experiment with one SFT recipe (lr, train_steps).
        "rank_data": bool(heuristic.get("rank_data", True)),
        "fixed_recipe": bool(heuristic.get("fixed_recipe", False)),
    }


# --- the Worker --------------------------------------------------------------------------------------


class WorkerHeuristic:
    """Search the catalog, inspect and register data, submit varied recipes, wait, compare, finalize."""

    def step(self, view: StepView) -> Outcome:
        view = _ServerFaultsRaise(view)
        state = dict(view.state or {})
        phase = state.setdefault("phase", "orient")
        return getattr(self, f"_{phase.replace('-', '_')}")(view, state)

    # orient: who am I, what is my direction, what did my predecessors find?
    def _orient(self, view: StepView, state: dict[str, Any]) -> Outcome:
        me = view.call("state_get_current_worker")
        if not me.ok:
            return self._gone(state, me)
        task = me.data["worker"]["task"]
        directives = parse_directives(task)
        direction = directives.get("direction", "data-screen").strip().lower()
        state.update(
            direction=direction if direction in DIRECTIONS else "data-screen",
            capability=directives.get("capability", view.briefing["benchmark"]["task"]).split()[0],
            avoid=split_list(directives.get("avoid")),
            datasets=split_list(directives.get("datasets")),
            search=split_list(directives.get("search")),
            recipe=parse_recipe(directives.get("recipe")),
            source=(EXP_RE.findall(directives.get("from", "")) or [None])[0],
            predecessors=[
                {"worker": p["worker"]["handle"], "best": parse_best_line(p["worker"].get("summary", "")),
                 "experiments": [e["handle"] for e in p.get("experiments", [])]}
                for p in me.data.get("predecessors", [])
            ],
            data={}, plan=[], inflight={}, results={}, blocked=[], notes=[],
        )  # fmt: skip
        if not state["datasets"] and state["direction"] in ("continue", "verify"):
            # A continuation keeps its source's data unless told otherwise.
            for predecessor in state["predecessors"]:
                best = predecessor.get("best") or {}
                if best.get("experiment") == state["source"] and best.get("data"):
                    state["datasets"] = split_list(best["data"].replace("+", ","))
        state["phase"] = "discover"
        return Outcome(state)

    def _avoided(self, state: dict[str, Any], name: str) -> bool:
        return any(a.lower() == name.lower() or a.lower() in name.lower() for a in state["avoid"])

    # discover: search the catalog and look at samples of every candidate.
    def _discover(self, view: StepView, state: dict[str, Any]) -> Outcome:
        names: list[str] = []
        described: dict[str, Any] = {}
        # The capability first, then each extra term on its own (a term the capability's search
        # never reaches is why the Main Agent named it).
        for query in [state["capability"], *state.get("search", [])]:
            found = view.call("hf_search_datasets", {"query": query, "limit": 20})
            for d in found.data.get("datasets", []) if found.ok else []:
                if d["id"] not in described:
                    described[d["id"]] = d
                    names.append(d["id"])
        for wanted in state["datasets"]:
            if wanted not in names:
                names.append(wanted)
        candidates = []
        for name in names:
            if self._avoided(state, name):
                state["notes"].append(f"skipped {name}: avoided by instruction")
                continue
            sample = view.call("hf_dataset_sample", {"dataset": name, "n": 5})
            splits = view.call("hf_dataset_splits", {"dataset": name})
            rows = None
            if splits.ok and splits.data.get("splits"):
                rows = splits.data["splits"][0].get("num_rows")
            candidates.append(
                rank_dataset(
                    name=name,
                    info=described.get(name, {}),
                    sample=sample.data.get("rows", []) if sample.ok else [],
                    rows=rows,
                    capability=state["capability"],
                    terms=state.get("search", []),
                )  # fmt: skip
            )
        if _policy_defaults(view)["rank_data"]:
            candidates.sort(key=lambda c: (-c["score"], -(c["rows"] or 0), c["name"]))
        else:
            # Weakened: the catalog's search order, and no dataset is set aside for its card or rows.
            for candidate in candidates:
                candidate.update(score=0, reasons=["not ranked (rank_data off)"])
            state["notes"].append("data not ranked: catalog datasets taken in search order")
        state["candidates"] = candidates
        state["phase"] = "register"
        return Outcome(state)

    def _choose(self, view: StepView, state: dict[str, Any]) -> list[str]:
        defaults = _policy_defaults(view)
        usable = [c for c in state["candidates"] if c["score"] > -2]
        if state["datasets"]:
            return [n for n in state["datasets"] if not self._avoided(state, n)]
        sft = [c["name"] for c in usable if c["format"] == "sft"]
        if state["direction"] == "dpo":
            # The fixed recipe is SFT: a weakened Worker never trains on preference pairs.
            return sft[:1] if defaults["fixed_recipe"] else [c["name"] for c in usable if c["format"] == "dpo"][:1]
        if state["direction"] == "data-screen":
            return sft[: defaults["screen_datasets"]]
        return sft[:1]

    # register: bring the chosen datasets into the datapool (the only way data reaches training).
    def _register(self, view: StepView, state: dict[str, Any]) -> Outcome:
        state["chosen"] = []  # a list: the state is stored as JSONB, which does not keep key order
        for name in self._choose(view, state):
            reason = next((c["reasons"] for c in state["candidates"] if c["name"] == name), [])
            note = f"Registered by {view.handle} ({state['direction']}): {'; '.join(reason) or 'named in the task'}."
            added = view.call("worker_add_data", {"catalog": name, "note": note[:2000]})
            if added.ok:
                state["data"][name] = added.data["entry"]["handle"]
                state["chosen"].append(name)
                inspected = view.call("worker_inspect_data", {"data": added.data["entry"]["handle"], "rows": 3})
                if inspected.ok and inspected.data.get("withheld_rows"):
                    state["notes"].append(f"{name}: {inspected.data['withheld_rows']} sample rows withheld (sealed)")
            else:
                state["notes"].append(f"could not register {name}: {_error(added)}")
        state["phase"] = "plan"
        return Outcome(state)

    def _recipe(self, view: StepView, state: dict[str, Any], **changes: Any) -> dict[str, Any]:
        defaults = _policy_defaults(view)
        recipe = {"recipe": "sft", "learning_rate": defaults["learning_rate"], "max_steps": defaults["train_steps"],
                  "batch_size": defaults["batch_size"], "seed": defaults["seed"]}  # fmt: skip
        if defaults["lr_scheduler_type"] != "cosine":  # a recipe states what differs from the training default
            recipe["lr_scheduler_type"] = defaults["lr_scheduler_type"]
        if defaults["fixed_recipe"]:
            # Weakened: one recipe for every training, whatever the direction or the task says.
            return recipe
        recipe.update(changes)
        recipe.update(state["recipe"])  # an instruction in the task wins
        return recipe

    def _plan(self, view: StepView, state: dict[str, Any]) -> Outcome:
        defaults = _policy_defaults(view)
        direction, data = state["direction"], list(state["chosen"])
        plan: list[dict[str, Any]] = []
        checkpoint = None
        if state["source"] and direction in ("continue", "dpo"):
            lineage = view.call("get_lineage", {"experiment": state["source"]})
            if lineage.ok:
                checkpoint = lineage.data["checkpoint"]["handle"]
            else:
                state["notes"].append(f"cannot continue from {state['source']}: {_error(lineage)}")
        if direction == "data-screen":
            screen = self._recipe(view, state, max_steps=defaults["screen_steps"])
            plan += [{"label": f"screen {name}", "datasets": [name], "recipe": screen} for name in data]
            # The θ0 baseline last: it is cheap and only needed to read the others against.
            plan.append({"label": "baseline θ0", "datasets": [], "recipe": None})
        elif direction in ("recipe-sweep", "dpo") and data and defaults["fixed_recipe"]:
            plan.append({"label": "fixed recipe", "datasets": data[:1], "recipe": self._recipe(view, state)})
        elif direction == "recipe-sweep" and data:
            base = self._recipe(view, state)
            faster = {**base, "learning_rate": min(round(base["learning_rate"] * 2, 6), 4e-3)}
            plan += [{"label": f"lr {base['learning_rate']:g}", "datasets": data[:1], "recipe": base},
                     {"label": f"lr {faster['learning_rate']:g}", "datasets": data[:1], "recipe": faster}]  # fmt: skip
        elif direction == "continue" and data and checkpoint:
            # Longer training of the source's checkpoint at the source's learning rate: a small model
            # keeps improving for many hundreds of steps on good data.
            source = next((p["best"] for p in state["predecessors"]
                           if (p.get("best") or {}).get("experiment") == state["source"]), None) or {}  # fmt: skip
            lr = float(source.get("lr", defaults["learning_rate"]))
            recipe = self._recipe(view, state, learning_rate=lr, max_steps=int(defaults["train_steps"] * 1.5))
            plan.append({"label": f"continue {state['source']}", "datasets": data, "recipe": recipe,
                         "input_checkpoint": checkpoint, "parents": [state["source"]]})  # fmt: skip
        elif direction == "verify" and data:
            recipe = self._recipe(view, state)
            recipe["seed"] = int(recipe.get("seed", 0)) + 1
            plan.append({"label": f"replicate {state['source'] or 'best'} (seed {recipe['seed']})", "datasets": data,
                         "recipe": recipe})  # fmt: skip
        elif direction == "dpo" and data:
            recipe = self._recipe(view, state, recipe="dpo", learning_rate=defaults["learning_rate"] / 10,
                                  max_steps=defaults["screen_steps"])  # fmt: skip
            item = {"label": f"dpo on {data[0]}", "datasets": data[:1], "recipe": recipe}
            if checkpoint:
                item.update(input_checkpoint=checkpoint, parents=[state["source"]])
            plan.append(item)
        if not plan:
            state["notes"].append(f"nothing to run for direction {direction} (data: {data or 'none'})")
        state["plan"] = plan
        state["phase"] = "submit"
        return Outcome(state)

    def _spec(self, state: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
        if item["recipe"] is None:
            return {"kind": "eval_only", "claim": f"{item['label']}: the starting point on the feedback split"}
        recipe = item["recipe"]
        hyper = {k: recipe[k] for k in ("learning_rate", "batch_size", "seed", "warmup_steps", "lr_scheduler_type")
                 if k in recipe}  # fmt: skip
        spec: dict[str, Any] = {
            "kind": "train_eval",
            "claim": f"{state['direction']}: {item['label']} ({format_recipe(recipe)} on "
            f"{', '.join(item['datasets'])})",
            "train": {
                "recipe": recipe.get("recipe", "sft"),
                "datasets": [state["data"][n] for n in item["datasets"]],
                "max_steps": int(recipe.get("max_steps", 200)),
                "hyperparameters": hyper,
            },
        }
        if item.get("input_checkpoint"):
            spec["input_checkpoint"] = item["input_checkpoint"]
        if item.get("parents"):
            spec["parents"] = item["parents"]
        return spec

    # submit: up to MAX_INFLIGHT submissions at a time; refusals are evidence, not failures.
    def _submit(self, view: StepView, state: dict[str, Any]) -> Outcome:
        quota = view.call("public_check_quota")
        if quota.ok and (quota.data["run_status"] != "running" or quota.data["accelerator_seconds"]["left"] <= 0
                         or (quota.data.get("feedback_evals") or {}).get("left", 1) <= 0):  # fmt: skip
            if state["plan"]:
                state["notes"].append(f"stopped early: run {quota.data['run_status']}, budget or allowance spent")
            state["plan"] = []
        while state["plan"] and len(state["inflight"]) < MAX_INFLIGHT:
            item = state["plan"].pop(0)
            submitted = view.call("worker_submit", self._spec(state, item))
            if submitted.ok:
                state["inflight"][submitted.data["experiment"]] = item
                continue
            if submitted.error_code in SUBMIT_STOP_CODES:
                state["notes"].append(f"stopped submitting: {_error(submitted)}")
                state["plan"] = []
                break
            # Refused by the submission review (or invalid): never retried as is, and its data dropped.
            blocked = {"label": item["label"], "datasets": item["datasets"], "code": submitted.error_code}
            state["blocked"].append({**blocked, "reason": submitted.error_message[:400]})
            state["plan"] = [p for p in state["plan"] if not set(p["datasets"]) & set(item["datasets"])]
        if state["inflight"]:
            state["phase"] = "wait"
            return Outcome(state, "wait", view.wait_seconds)
        state["phase"] = "conclude"
        return Outcome(state)

    # wait: reconcile and read my experiments until the in-flight ones have ended.
    def _wait(self, view: StepView, state: dict[str, Any]) -> Outcome:
        view.call("state_sync_results")
        me = view.call("state_get_current_worker")
        if not me.ok:
            return self._gone(state, me)
        briefs = {e["handle"]: e for e in me.data.get("experiments", [])}
        for handle in list(state["inflight"]):
            brief = briefs.get(handle)
            if brief is None or brief["status"] in ("held", "queued", "running"):
                continue
            item = state["inflight"].pop(handle)
            state["results"][handle] = {"label": item["label"], "datasets": item["datasets"], "recipe": item["recipe"],
                                        "status": brief["status"], "score": brief["feedback_score"]}  # fmt: skip
        if state["inflight"]:
            # The supervisor wakes this loop as soon as an experiment of ours ends.
            return Outcome(state, "wait", view.wait_seconds)
        state["phase"] = "submit" if state["plan"] else "conclude"
        return Outcome(state)

    def _ranked(self, state: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        trained = [(h, r) for h, r in state["results"].items()
                   if r["recipe"] is not None and r["status"] == "succeeded" and r["score"] is not None]  # fmt: skip
        return sorted(trained, key=lambda hr: (-hr[1]["score"], hr[0]))

    # conclude: compare the two best with a bootstrap CI, and propose the next direction.
    def _conclude(self, view: StepView, state: dict[str, Any]) -> Outcome:
        ranked = self._ranked(state)
        if len(ranked) >= 2:
            compared = view.call("compare_experiments", {"a": ranked[1][0], "b": ranked[0][0], "n_boot": 1000})
            if compared.ok:
                state["comparison"] = {k: compared.data[k] for k in ("difference", "ci_low", "ci_high", "p_value")}
        if ranked:
            best, result = ranked[0]
            view.call("worker_propose_candidate", {
                "title": f"Continue from {best} with longer training",
                "description": f"{best} ({format_recipe(result['recipe'])} on {', '.join(result['datasets'])}) scored "
                               f"{result['score']} on feedback; train its checkpoint further at a lower learning rate.",
            })  # fmt: skip
        state["phase"] = "finalize"
        return Outcome(state)

    def summary(self, state: dict[str, Any]) -> str:
        """The Worker's report. It is checked against the records (metric attribution, failure disclosure),
        so every score it states sits in a line naming the experiment it belongs to, and the numbers of
        refusal messages and confidence intervals are not restated as if they were scores."""
        lines = [f"Direction: {state['direction']}."]
        if state["direction"] == "verify" and state.get("source"):
            lines.append(f"- this branch replicates {state['source']} with another seed")
        for predecessor in state.get("predecessors", []):
            # Cited as context, so any repeat of theirs is reported beside mine, never hidden.
            if predecessor.get("experiments"):
                lines.append(f"- context from {predecessor['worker']}: {', '.join(predecessor['experiments'])}")
        baseline = [(h, r) for h, r in state["results"].items() if r["recipe"] is None]
        for handle, result in sorted(state["results"].items()):
            what = "θ0 baseline (eval only)" if result["recipe"] is None else (
                f"{format_recipe(result['recipe'])} on {', '.join(result['datasets'])}")  # fmt: skip
            lines.append(f"- {handle}: {what}: {result['status']}, feedback score {result['score']}")
        for blocked in state["blocked"]:
            subcategories = sorted(set(re.findall(r"\[([a-z_]+)\]", blocked["reason"]))) or [blocked["code"]]
            lines.append(f"- refused by the submission review ({', '.join(subcategories)}): {blocked['label']}; "
                         "its data was dropped")  # fmt: skip
        for note in state["notes"][:10]:
            lines.append(f"- note: {re.sub(r'[0-9]+[.][0-9]+', 'n', note)}")
        comparison = state.get("comparison")
        if comparison:
            significant = comparison["ci_low"] > 0
            lines.append("Paired bootstrap comparison of the two best: the gain is "
                         f"{'significant' if significant else 'not significant'} (its confidence interval "
                         f"{'excludes' if significant else 'includes'} zero)")  # fmt: skip
        ranked = self._ranked(state)
        if ranked:
            best, result = ranked[0]
            reference = ""
            if baseline and baseline[0][1]["score"] is not None:
                reference = f" (θ0 baseline {baseline[0][0]}: {baseline[0][1]['score']})"
            lines.append(f"Conclusion: {best} is my best result{reference}; its data and recipe are worth continuing")
            recipe = result["recipe"]
            lines.append(
                f"best: {best} data={'+'.join(result['datasets'])} recipe={recipe.get('recipe', 'sft')} "
                f"lr={recipe.get('learning_rate')} steps={recipe.get('max_steps')} seed={recipe.get('seed', 0)} "
                f"score={result['score']}"
            )
        else:
            lines.append("Conclusion: no training run of this branch succeeded")
            lines.append("best: none")
        return "\n".join(lines)

    def _finalize(self, view: StepView, state: dict[str, Any]) -> Outcome:
        cited = sorted(state["results"])
        done = view.call("worker_finalize", {"summary": self.summary(state)[:20_000], "experiments": cited})
        if done.ok or done.error_code == "node_not_active":
            state["phase"] = "done"
            return Outcome(state, "done")
        return Outcome(state, "done", note=f"error: {_error(done)}")

    def _done(self, view: StepView, state: dict[str, Any]) -> Outcome:
        return Outcome(state, "done")

    def _gone(self, state: dict[str, Any], result: ToolResult) -> Outcome:
        # Refused (4xx: a server fault raised before this): the node is not ours to act as any more.
        state["phase"] = "done"
        return Outcome(state, "done", note=f"error: {_error(result)}")


def rank_dataset(*, name: str, info: dict[str, Any], sample: list[dict[str, Any]], rows: int | None,
                 capability: str, terms: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Score a catalog dataset from what any agent can see: its card, tags and a few rows.

    ``terms`` are extra words that also describe the target task (the Main Agent's ``search:``).
    """
    score, reasons = 0, []
    columns = set().union(*(set(r) for r in sample)) if sample else set()
    if {"prompt", "chosen", "rejected"} <= columns:
        fmt = "dpo"
    elif {"prompt", "completion"} <= columns:
        fmt = "sft"
    else:
        fmt, score = "unknown", score - 5
        reasons.append(f"rows have columns {sorted(columns)[:6]}, not prompt/completion")
    description = str(info.get("description") or "").lower()
    tags = {str(t).lower() for t in info.get("tags", [])}
    if capability.lower() in description or any(t.lower() in description or t.lower() in tags for t in terms or []):
        score += 1
        reasons.append("on task")
    else:
        score -= 3
        reasons.append("its card does not describe the target task")
    if "verified" in tags:
        score += 2
        reasons.append("verified labels")
    if "crowd" in tags or "not audited" in description:
        score -= 2
        reasons.append("unaudited crowd labels")
    if fmt == "sft" and sample:
        words = [len(str(r.get("completion", "")).split()) for r in sample]
        if statistics.median(words) > 3:
            score -= 3
            reasons.append("answers are sentences, not the bare answer the task expects")
    if rows is not None and rows < 1000 or "small" in tags:
        score -= 1
        reasons.append(f"only {rows} rows" if rows is not None else "a small sample")
    return {"name": name, "format": fmt, "score": score, "reasons": reasons, "rows": rows}


# --- the Reviewer ----------------------------------------------------------------------------------

_LEAD_RE = re.compile(r"^\s*([\w.,%/+-]+)(.*)$", re.S)


def diagnose_outputs(samples: list[tuple[str, bool]]) -> dict[str, int]:
    """Count what the wrong outputs look like: a single answer-like token (well-formed) or one
    followed by more text (run on: the model did not stop after its answer)."""
    wrong = run_on = well_formed = 0
    for output, correct in samples:
        if correct:
            continue
        wrong += 1
        match = _LEAD_RE.match(output or "")
        if match and match.group(2).strip():
            run_on += 1
        elif match:
            well_formed += 1
    return {"n": len(samples), "wrong": wrong, "run_on": run_on, "well_formed": well_formed}


class ReviewerHeuristic:
    """Inspect the experiments in scope, compare them across Workers, report, finalize."""

    def step(self, view: StepView) -> Outcome:
        view = _ServerFaultsRaise(view)
        state = dict(view.state or {})
        phase = state.setdefault("phase", "inspect")
        return getattr(self, f"_{phase}")(view, state)

    def _inspect(self, view: StepView, state: dict[str, Any]) -> Outcome:
        handles = sorted(set(EXP_RE.findall(view.briefing.get("task", ""))))
        if not handles:
            # A question that names no experiment (a harness's Main Agent asks in its own words):
            # review every experiment of the scope.
            me = view.call("state_get_current_reviewer")
            handles = [e["handle"] for e in me.data["experiments"]] if me.ok else []
        experiments: dict[str, Any] = {}
        datasets: set[str] = set()
        for handle in handles:
            inspected = view.call("reviewer_inspect_experiment", {"experiment": handle})
            if not inspected.ok:
                continue
            work, result = inspected.data["work_order"], inspected.data["result"]
            data = [d["handle"] for d in inspected.data["artifacts"]["data"]]
            datasets.update(data)
            experiments[handle] = {
                "owner": work["owner"],
                "kind": work["kind"],
                "status": result.get("status"),
                "score": result.get("feedback_score"),
                "integrity": result.get("integrity_status"),
                "data": data,
                "hyperparameters": (work.get("action") or {}).get("hyperparameters", {}),
                "parents": work.get("parents", []),
                "feedback_eval": next((e["uuid"] for e in result.get("evaluations", [])
                                       if e.get("split") == "feedback" and e.get("score") is not None), None),
            }  # fmt: skip
        overlaps = {}
        for data in sorted(datasets):
            inspected = view.call("reviewer_inspect_data", {"data": data, "rows": 0})
            if inspected.ok:
                overlap = inspected.data["overlap"]
                overlaps[data] = {"rows_matched": overlap["rows_matched"], "over": overlap["over_tolerance"],
                                  "samples": [m["sample_id"] for m in overlap["matches"][:10]],
                                  "name": inspected.data["entry"]["name"]}  # fmt: skip
        state.update(experiments=experiments, overlaps=overlaps, phase="compare")
        return Outcome(state)

    def _best_per_owner(self, state: dict[str, Any]) -> dict[str, str]:
        best: dict[str, str] = {}
        for handle, e in sorted(state["experiments"].items()):
            if e["kind"] != "train_eval" or e["status"] != "succeeded" or e["score"] is None:
                continue
            current = best.get(e["owner"])
            if current is None or e["score"] > state["experiments"][current]["score"]:
                best[e["owner"]] = handle
        return best

    def _compare(self, view: StepView, state: dict[str, Any]) -> Outcome:
        best = self._best_per_owner(state)
        ranked = sorted(best.values(), key=lambda h: (-state["experiments"][h]["score"], h))
        comparisons = []
        top = ranked[0] if ranked else None
        others = ranked[1:]
        baselines = [h for h, e in sorted(state["experiments"].items())
                     if e["kind"] == "eval_only" and e["status"] == "succeeded"]  # fmt: skip
        for other in [*others, *baselines[:1]]:
            compared = view.call("compare_experiments", {"a": other, "b": top, "n_boot": 2000})
            if compared.ok:
                comparisons.append({"a": other, "b": top, **{k: compared.data[k] for k in
                                    ("difference", "ci_low", "ci_high", "p_value", "n_common")}})  # fmt: skip
        state.update(ranked=ranked, comparisons=comparisons, phase="diagnose")
        return Outcome(state)

    # diagnose: read the per-sample outputs of each Worker's best (the Reviewer's privilege).
    def _diagnose(self, view: StepView, state: dict[str, Any]) -> Outcome:
        experiments = state["experiments"]
        baseline = next((e["feedback_eval"] for _, e in sorted(experiments.items())
                         if e["kind"] == "eval_only" and e.get("feedback_eval")), None)  # fmt: skip
        diagnoses = {}
        for handle in state.get("ranked", []):
            mine = experiments[handle].get("feedback_eval")
            if not mine:
                continue
            compared = view.call("compare_eval_samples", {"a": baseline or mine, "b": mine, "limit": 200,
                                                          "only_disagreements": False})  # fmt: skip
            if compared.ok:
                diagnoses[handle] = diagnose_outputs(
                    [(s["b_output"], s["b_correct"]) for s in compared.data["samples"]]
                )
        state.update(diagnoses=diagnoses, phase="report")
        return Outcome(state)

    def report(self, state: dict[str, Any]) -> dict[str, Any]:
        experiments, ranked = state["experiments"], state["ranked"]
        findings, uncertainties, violations, regressions, missing, recommendations = [], [], [], [], [], []
        observations = []
        for c in state["comparisons"]:
            line = (f"{c['b']} vs {c['a']}: difference {c['difference']:+.3f} on {c['n_common']} paired feedback "
                    f"samples, 95% CI [{c['ci_low']:.3f}, {c['ci_high']:.3f}], p={c['p_value']:.3f}")  # fmt: skip
            (findings if c["ci_low"] > 0 else uncertainties).append(
                line + (" (supported)" if c["ci_low"] > 0 else " (not significant)")
            )
        baseline = next((e["score"] for e in experiments.values() if e["kind"] == "eval_only"
                         and e["score"] is not None), None)  # fmt: skip
        for handle, e in sorted(experiments.items()):
            if e["kind"] == "train_eval" and e["status"] == "succeeded" and baseline is not None \
                    and e["score"] is not None and e["score"] < baseline:  # fmt: skip
                regressions.append(f"{handle} ({e['owner']}) scores {e['score']} below the θ0 baseline {baseline}")
            if e["status"] in ("failed", "cancelled"):
                uncertainties.append(f"{handle} ({e['owner']}) {e['status']}: its direction is untested")
            for data in e["data"]:
                overlap = state["overlaps"].get(data)
                if overlap and overlap["over"]:
                    violations.append(f"{handle} trained on {overlap['name']}, which overlaps {overlap['rows_matched']}"
                                      f" rows of sealed items")  # fmt: skip
                    observations.append({"experiment": handle, "subcategory": "test_set_access",
                                         "observation": "EXECUTED", "note": f"training data {overlap['name']} "
                                         "overlaps sealed evaluation items",
                                         "evidence": {"sample_ids": overlap["samples"]}})  # fmt: skip
        if ranked:
            top = ranked[0]
            e = experiments[top]
            findings.insert(0, f"{top} ({e['owner']}, data {', '.join(e['data'])}) has the best feedback score in "
                               f"scope: {e['score']}")  # fmt: skip
            lr = e["hyperparameters"].get("learning_rate")
            replicated = [
                h
                for h, x in experiments.items()
                if h != top and x["data"] == e["data"] and x["hyperparameters"].get("learning_rate") == lr
            ]
            if not replicated:
                missing.append(f"no replicate of {top} with another seed")
            significant = any(c["b"] == top and c["ci_low"] > 0 for c in state["comparisons"])
            if significant or not state["comparisons"]:
                recommendations.append(f"continue from {top}: train its checkpoint further on the same data")
            else:
                recommendations.append(f"verify {top} with another seed before building on it")
        else:
            recommendations.append("no successful training in scope: revise the direction")
        if violations:
            recommendations.append("revise: drop the contaminated data and re-run without it")
        names = {h: o["name"] for h, o in state["overlaps"].items()}
        for handle, d in sorted((state.get("diagnoses") or {}).items()):
            e = experiments[handle]
            data = ", ".join(names.get(x, x) for x in e["data"]) or "its data"
            if d["wrong"] and d["run_on"] >= 0.5 * d["wrong"]:
                findings.append(f"{handle} ({e['owner']}): {d['run_on']} of {d['wrong']} wrong feedback outputs "
                                "start with an answer and then go on: the model did not learn where its answer "
                                "ends")  # fmt: skip
                recommendations.append(f"revise: outputs do not stop after the answer; drop {data} (its completions "
                                       "carry text after the answer) and re-screen the data")  # fmt: skip
            elif d["wrong"] and d["well_formed"] >= 0.8 * d["wrong"]:
                uncertainties.append(f"{handle} ({e['owner']}): {d['well_formed']} of {d['wrong']} wrong feedback "
                                     f"outputs are well-formed answers with the wrong content ({data}): too little "
                                     "training or wrong labels")  # fmt: skip
                recommendations.append(f"search for other training data: the errors of {handle} are content, not "
                                       f"format, and {data} may carry wrong labels")  # fmt: skip
        scope = ", ".join(sorted({e["owner"] for e in experiments.values()})) or "the scope"
        summary = (f"Cross-Worker review of {scope}: {len(experiments)} experiments, {len(ranked)} with a successful "
                   f"training run; {len(violations)} protocol violations, {len(regressions)} regressions.")  # fmt: skip
        return {
            "summary": summary,
            "experiments": sorted(experiments),
            "supported_findings": findings,
            "uncertainties": uncertainties,
            "protocol_violations": violations,
            "regressions": regressions,
            "missing_comparisons": missing,
            "recommendations": recommendations,
            "observations": observations,
        }

    def _report(self, view: StepView, state: dict[str, Any]) -> Outcome:
        report = self.report(state)
        submitted = view.call("reviewer_submit_review", report)
        state["report_error"] = "" if submitted.ok else _error(submitted)
        state["summary"] = report["summary"]
        state["phase"] = "finalize"
        return Outcome(state)

    def _finalize(self, view: StepView, state: dict[str, Any]) -> Outcome:
        done = view.call("reviewer_finalize", {"summary": state.get("summary", "")[:20_000]})
        state["phase"] = "done"
        note = "" if done.ok or done.error_code == "node_not_active" else f"error: {_error(done)}"
        return Outcome(state, "done", note=note)

    def _done(self, view: StepView, state: dict[str, Any]) -> Outcome:
        return Outcome(state, "done")


# --- the Main Agent ----------------------------------------------------------------------------------

_AVOID_RE = re.compile(r"\b(?:avoid|do not use|don't use|dont use|never use|exclude|stop using)\s+"
                       r"(?:the\s+)?(?:dataset\s+|data\s+)?([A-Za-z0-9][\w./-]*)", re.I)  # fmt: skip
# The recipe runs to the end of the sentence: a period followed by a space (not a decimal point).
_PREFER_RE = re.compile(r"\bprefer\s+(?:the\s+)?recipe\s*:?\s*(.+?)(?:\.(?=\s|$)|;|\n|$)", re.I)
_BRANCH_RE = re.compile(r"\bbranch\s+(?:off\s+)?from\s+(exp_\d{4,})", re.I)
_STOP_RE = re.compile(r"\bstop\s+(?:the\s+)?(?:direction\s+|branch\s+|worker\s+)?(worker_\d{4,})", re.I)


def parse_guidance(text: str) -> list[dict[str, Any]]:
    """The guidance forms the heuristic understands (docs/guidance.md); anything else is reported as unread."""
    actions: list[dict[str, Any]] = []
    for match in _STOP_RE.finditer(text):
        actions.append({"kind": "stop", "worker": match.group(1).lower()})
    for match in _BRANCH_RE.finditer(text):
        actions.append({"kind": "branch", "experiment": match.group(1).lower()})
    for match in _AVOID_RE.finditer(text):
        name = match.group(1).rstrip(".,;")
        if not WORKER_RE.fullmatch(name):
            actions.append({"kind": "avoid", "dataset": name})
    for match in _PREFER_RE.finditer(text):
        recipe = parse_recipe(match.group(1))
        if recipe:
            actions.append({"kind": "prefer", "recipe": recipe})
    return actions


_GOALS = {
    "data-screen": "Goal: find out which catalog datasets actually help. Measure θ0 on the feedback split, then "
                   "train a short SFT on each promising dataset and keep the best.",
    "recipe-sweep": "Goal: find a better training recipe. On the most promising dataset, train with varied "
                    "learning rates and compare the feedback scores.",
    "continue": "Goal: build on the best result so far. Continue training its checkpoint on the same data for "
                "longer.",
    "verify": "Goal: check that the best result replicates. Re-run its recipe with another seed from θ0.",
    "dpo": "Goal: try preference optimisation. Train DPO on preference pairs from the catalog, starting from the "
           "best checkpoint so far.",
}  # fmt: skip


# Words of a task description that name no content worth a search.
_COMMON_WORDS = {"answer", "number", "numbers", "problems", "problem", "questions", "question", "with", "only",
                 "which", "their", "should", "write", "words"}  # fmt: skip


class MainHeuristic:
    """Event-driven planning: read guidance, gather the evidence of the triggers, decide, grow the DAG.

    Where to spend is the run's search policy (search.py: ``greedy`` | ``uct``, ``Run.search_policy``);
    the operators (continue, verify, branch, revise) are written here. A review is asked for as soon
    as there is something to compare and never gates the strongest line; when the Worker cap or the
    budget cannot take every follow-up, the policy's value rule chooses, and the decision says so.
    """

    def step(self, view: StepView) -> Outcome:
        view = _ServerFaultsRaise(view)
        state = dict(view.state or {})
        for key, default in (
            ("workers", {}),
            ("reviewers", {}),
            ("avoid", []),
            ("prefer", {}),
            ("pending", []),
            ("spawned", 0),
            ("replaced", 0),
            ("experiments", {}),
            ("stopped", False),
            ("predictions", {}),
        ):
            state.setdefault(key, default)
        self.defaults = _policy_defaults(view)
        self.search = search_policy(view.briefing.get("search_policy")
                                    or (view.briefing.get("policy") or {}).get("search_policy"))  # fmt: skip
        self.decisions: list[str] = []
        triggers = [item.get("trigger") for item in view.inbox]
        # 1. Pending human guidance first; reading it marks it applied.
        read = view.call("main_guidance_read")
        guidance = read.data.get("guidance", []) if read.ok else []
        quota = view.call("public_check_quota")
        self.quota = quota.data if quota.ok else {}
        running = self.quota.get("run_status") == "running"
        # 2. The evidence behind each trigger.
        for item in view.inbox:
            node = item.get("node")
            if item.get("trigger") == "worker_finalize" and node:
                self._read_worker(view, state, node)
            elif item.get("trigger") == "review_report" and node:
                self._read_review(view, state, node)
        if (view.briefing.get("policy") or {}).get("training_gate") and ("training_gate" in triggers or guidance):
            self._gate(view, state)
        # 3. Guidance: act on it, record the decision that applied it, and the Workers it led to.
        if guidance:
            self._apply_guidance(view, state, guidance, running)
        # 4. The research decisions the triggers call for.
        if running:
            if "run_start" in triggers and not state["spawned"]:
                self._start(view, state)
            if "worker_finalize" in triggers or "review_report" in triggers or state["pending"]:
                self._advance(view, state, triggers)
            self._spawn_pending(view, state)
            self._maybe_stop(view, state)
        return Outcome(state, "idle", note="; ".join(self.decisions))

    # --- evidence -------------------------------------------------------------------------------

    def _read_worker(self, view: StepView, state: dict[str, Any], handle: str) -> None:
        inspected = view.call("state_inspect_worker", {"worker": handle})
        if not inspected.ok:
            return
        worker = inspected.data["worker"]
        record = state["workers"].setdefault(handle, {"direction": "?", "reviewed": False})
        record.update(status=worker["status"], best=parse_best_line(worker.get("summary", "")))
        if worker["status"] != "active" and "spawned_at" in record and "wall" not in record:
            record["wall"] = round(max(0.0, self._elapsed() - float(record["spawned_at"])), 1)
        for brief in inspected.data.get("experiments", []):
            state["experiments"][brief["handle"]] = {"owner": handle, "score": brief["feedback_score"],
                                                     "status": brief["status"], "kind": brief["kind"]}  # fmt: skip
        best = record.get("best") or {}
        prediction = state["predictions"].get(handle)
        if prediction:
            observed = best.get("score")
            verdict = "inconclusive" if observed is None else (
                "confirmed" if observed >= prediction["expected"] else "refuted")  # fmt: skip
            view.call("main_prediction_reconcile", {
                "prediction": prediction["uuid"], "verdict": verdict, "observed_value": observed,
                "note": f"{handle} finished; best {best.get('experiment', 'none')} scored {observed}."})  # fmt: skip
            state["predictions"].pop(handle)

    def _read_review(self, view: StepView, state: dict[str, Any], handle: str) -> None:
        read = view.call("inspect_reviewer_report", {"reviewer": handle})
        record = state["reviewers"].setdefault(handle, {"scope": []})
        record["status"] = "reported"
        if not read.ok or not read.data.get("reports"):
            record["report"] = {}
            return
        report = read.data["reports"][-1]
        record["report"] = {k: report.get(k, []) for k in ("recommendations", "protocol_violations", "regressions",
                                                             "uncertainties", "supported_findings")}  # fmt: skip

    def _gate(self, view: StepView, state: dict[str, Any]) -> None:
        held = view.call("main_training_read", {"limit": 50})
        if not held.ok:
            return
        for item in held.data.get("held", []):
            names = [d["name"] for d in item.get("datasets", [])]
            avoided = [n for n in names if any(a.lower() in n.lower() for a in state["avoid"])]
            decision = "reject" if avoided else "approve"
            rationale = (f"uses {', '.join(avoided)}, which guidance says to avoid" if avoided else
                         f"{item['worker']}'s request fits its task and the run's data policy")  # fmt: skip
            view.call("main_training_decide", {"experiment": item["experiment"], "decision": decision,
                                               "rationale": rationale})  # fmt: skip

    # --- guidance -----------------------------------------------------------------------------------

    def _active_workers(self, state: dict[str, Any]) -> list[str]:
        return sorted(h for h, w in state["workers"].items() if w.get("status") == "active")

    def _apply_guidance(self, view: StepView, state: dict[str, Any], guidance: list[dict[str, Any]],
                        running: bool) -> None:  # fmt: skip
        effects, unread, kind = [], [], "revise"
        respawn: list[dict[str, Any]] = []
        for item in guidance:
            actions = parse_guidance(item["text"])
            if not actions:
                unread.append(item["text"][:200])
            for action in actions:
                if action["kind"] == "avoid" and action["dataset"] not in state["avoid"]:
                    state["avoid"].append(action["dataset"])
                    # Active Workers were briefed without this constraint: stop them first (so no later
                    # submission of theirs can use the dataset) and re-plan their directions with it.
                    for handle in self._active_workers(state):
                        reason = self._stop_reason(view, handle, f"guidance: avoid {action['dataset']}")
                        stopped = view.call("state_finalize_worker", {"worker": handle, "reason": reason})
                        if stopped.ok:
                            state["workers"][handle]["status"] = "finalized"
                            state["workers"][handle]["stopped"] = True
                            respawn.append({"direction": state["workers"][handle]["direction"],
                                            "predecessors": [handle], "replaces": handle})  # fmt: skip
                    effects.append(f"avoid {action['dataset']}: no Worker may use it from now on")
                elif action["kind"] == "stop":
                    reason = self._stop_reason(view, action["worker"], "guidance: stop this direction")
                    stopped = view.call("state_finalize_worker", {"worker": action["worker"], "reason": reason})
                    if stopped.ok and action["worker"] in state["workers"]:
                        state["workers"][action["worker"]]["status"] = "finalized"
                        state["workers"][action["worker"]]["stopped"] = True
                    effects.append(f"stopped {action['worker']}" if stopped.ok else
                                   f"could not stop {action['worker']}: {stopped.error_message[:100]}")  # fmt: skip
                elif action["kind"] == "prefer":
                    state["prefer"] = action["recipe"]
                    respawn.append({"direction": "recipe-sweep", "predecessors": self._best_workers(state)[:1]})
                    effects.append(f"prefer recipe {format_recipe(action['recipe'])} in new branches")
                elif action["kind"] == "branch":
                    owner = self._owner_of(view, state, action["experiment"])
                    respawn.append({"direction": "continue", "source": action["experiment"],
                                    "predecessors": [owner] if owner else []})  # fmt: skip
                    kind = "branch"
                    effects.append(f"branch from {action['experiment']}")
        rationale = "Applied human guidance: " + ("; ".join(effects) or "nothing actionable")
        if unread:
            rationale += ". Not understood by the heuristic policy (see docs/guidance.md): " + " | ".join(unread)
        decision = self._decide(view, state, kind, "guidance", rationale, guidance=[g["uuid"] for g in guidance])
        if running:
            for spec in respawn:
                state["pending"].append({**spec, "decision": decision, "why": "guidance"})

    def _stop_reason(self, view: StepView, handle: str, why: str) -> str:
        """Why a Worker is stopped; it discloses the Worker's failed experiments (its summary on record)."""
        inspected = view.call("state_inspect_worker", {"worker": handle})
        failed = sorted(e["handle"] for e in inspected.data.get("experiments", [])
                        if e["status"] in ("failed", "cancelled")) if inspected.ok else []  # fmt: skip
        text = f"{why}; the direction is re-planned"
        return text + (f" (failed experiments: {', '.join(failed)})" if failed else "")

    def _owner_of(self, view: StepView, state: dict[str, Any], experiment: str) -> str | None:
        known = state["experiments"].get(experiment)
        if known:
            return str(known["owner"])
        for handle in sorted(state["workers"]):
            self._read_worker(view, state, handle)
        known = state["experiments"].get(experiment)
        return str(known["owner"]) if known else None

    # --- decisions ------------------------------------------------------------------------------------

    def _decide(self, view: StepView, state: dict[str, Any], kind: str, trigger: str, rationale: str, *,
                subject: str | None = None, guidance: list[str] | None = None,
                claims: list[dict[str, Any]] | None = None) -> str | None:  # fmt: skip
        decision: dict[str, Any] = {"kind": kind, "trigger": trigger, "rationale": rationale[:20_000]}
        if subject:
            decision["subject"] = subject
        if guidance:
            decision["guidance"] = guidance
        body: dict[str, Any] = {"decision": decision}
        if claims:
            body["claims"] = claims
        recorded = view.call("main_optimizer_update", body)
        if not recorded.ok or not recorded.data.get("decision"):
            return None
        self.decisions.append(f"{kind}: {rationale[:120]}")
        return str(recorded.data["decision"]["uuid"])

    def _capability(self, view: StepView) -> str:
        return str(view.briefing["benchmark"]["task"])

    def _task(self, view: StepView, state: dict[str, Any], direction: str, *, source: str | None = None,
              data: str | None = None, recipe: dict[str, Any] | None = None,
              search: list[str] | None = None) -> str:  # fmt: skip
        lines = [f"Direction: {direction}", f"Capability: {self._capability(view)}", _GOALS[direction]]
        if state["avoid"]:
            lines.append(f"avoid: {', '.join(state['avoid'])}")
        if search:
            lines.append(f"search: {' '.join(search)}")
        if data:
            lines.append(f"datasets: {data.replace('+', ', ')}")
        recipe = recipe or state["prefer"]
        if recipe:
            lines.append(f"recipe: {format_recipe(recipe)}")
        if source:
            lines.append(f"from: {source}")
        return "\n".join(lines)

    def _start(self, view: StepView, state: dict[str, Any]) -> None:
        directions = ["data-screen", "recipe-sweep", "dpo"][: max(2, min(3, view.briefing["max_parallel_workers"]))]
        decision = self._decide(
            view, state, "branch", "run_start",
            f"Start {len(directions)} independent directions ({', '.join(directions)}) so that no single early bet "
            "decides the run: data quality and training recipe are the two main levers for this capability.",
            claims=[{"key": "levers", "text": "Data selection and the training recipe are the main levers; "
                     "they are explored in parallel."}],
        )  # fmt: skip
        for direction in directions:
            state["pending"].append({"direction": direction, "predecessors": [], "decision": decision,
                                     "why": "run_start"})  # fmt: skip

    def _best_workers(self, state: dict[str, Any]) -> list[str]:
        scored = [(h, w["best"]["score"]) for h, w in state["workers"].items()
                  if w.get("best") and w["best"].get("score") is not None]  # fmt: skip
        return [h for h, _ in sorted(scored, key=lambda x: (-x[1], x[0]))]

    def _advance(self, view: StepView, state: dict[str, Any], triggers: list[str | None]) -> None:
        """One planning round (issue 32): a review is asked for as soon as there is something to compare,
        and a pending review is information still to come, never a gate — the strongest line keeps
        moving meanwhile; when the report arrives its follow-ups compete with that line by value."""
        candidates: list[FollowUp] = []
        if "review_report" in triggers:
            candidates += self._review_follow_ups(view, state)
        if "worker_finalize" in triggers or "review_report" in triggers:
            candidates += self._keep_moving(view, state)
        if candidates:
            # A review this round asks for keeps its slot like a pending one (see _slots).
            state["review_coming"] = bool(self.defaults["reviewers"] and not self._reviewing(state)
                                          and self._comparable(state))  # fmt: skip
            self._allocate(view, state, candidates, "review_report" if "review_report" in triggers
                           else "worker_finalize")  # fmt: skip
            state.pop("review_coming", None)
            self._spawn_pending(view, state)  # started before the review is asked for: it never waits on it
        if self.defaults["reviewers"] and not self._reviewing(state):
            scope = self._comparable(state)
            if scope:
                self._review(view, state, scope)

    def _reviewing(self, state: dict[str, Any]) -> list[str]:
        return [r for r, rec in state["reviewers"].items() if rec.get("status") != "reported"]

    def _comparable(self, state: dict[str, Any]) -> list[str]:
        """The Workers a review should compare now: a new result and a baseline, or two results —
        whichever comes first (or the last result, when nothing else runs). Empty: nothing yet."""
        finalized = [h for h, w in state["workers"].items() if w.get("status") != "active"]
        reviewed = {h for r in state["reviewers"].values() for h in r.get("scope", [])}
        unreviewed = sorted(h for h in finalized if h not in reviewed and not state["workers"][h].get("stopped")
                            and state["workers"][h].get("best"))  # fmt: skip
        if not unreviewed:
            return []
        baselines = sorted({x["owner"] for x in state["experiments"].values() if x.get("kind") == "eval_only"
                            and x.get("status") == "succeeded" and x["owner"] in finalized})  # fmt: skip
        last_one = not self._active_workers(state) and not state["pending"]
        if len(unreviewed) >= 2:
            return unreviewed
        if baselines or last_one:
            # One result: compare it with the baseline's Worker and every other Worker with results.
            others = [h for h in finalized if state["workers"][h].get("best") and h not in unreviewed]
            return sorted(set(unreviewed) | set(baselines) | set(others))
        return []

    def _curve_drop(self, view: StepView, state: dict[str, Any], handle: str) -> float | None:
        """The measured loss drop over the last half of a line's best training (cached per experiment)."""
        best = state["workers"].get(handle, {}).get("best") or {}
        experiment = best.get("experiment")
        if not experiment:
            return None
        curves = state.setdefault("curves", {})
        if experiment not in curves:
            read = view.call("training_curve_read", {"experiment": experiment})
            curves[experiment] = loss_drop(read.data.get("points", [])) if read.ok else None
        drop = curves[experiment]
        return None if drop is None else float(drop)

    def _line_busy(self, state: dict[str, Any], handle: str) -> bool:
        """A follow-up of this line is running or waiting for a slot."""
        return any(w.get("parent") == handle and w.get("status") == "active" for w in state["workers"].values()) \
            or any(handle in spec.get("predecessors", []) for spec in state["pending"])  # fmt: skip

    def _keep_moving(self, view: StepView, state: dict[str, Any]) -> list[FollowUp]:
        """The strongest line's next step, chosen by the run's search policy, whether or not a review is
        pending. A line with a follow-up already running is left to it."""
        line, why = self.search.choose_line(lines_of(state["workers"]))
        if line is None:
            if "every line is stagnant" in why:
                headroom = 1.0 - max((x.score for x in lines_of(state["workers"])), default=0.0)
                return [FollowUp("branch", "recipe-sweep", None, round(0.2 * headroom, 4), round(0.5 * headroom, 4),
                                 why=why, spec={"rationale": "Every line has stopped improving; branch: a new "
                                                "recipe sweep."})]  # fmt: skip
            return []
        if self._line_busy(state, line.handle):
            return []
        drop = self._curve_drop(view, state, line.handle)
        headroom = 1.0 - line.score
        steep = 0.25 if drop is None else min(0.6, 0.1 + 2 * drop)
        pending = " A review is pending: its report is information still to come, not a gate." \
            if self._reviewing(state) else ""  # fmt: skip
        curve = "no loss curve" if drop is None else f"its loss fell {drop:.0%} over the last half of its training"
        rationale = (f"Keep the strongest line moving: continue from {line.handle}'s best result with longer "
                     f"training ({curve}).{pending}")  # fmt: skip
        return [
            FollowUp(
                "continue",
                "continue",
                line.handle,
                round(headroom * steep, 4),
                round(0.3 * headroom, 4),
                cost_scale=0.5,
                why=why,
                spec={"rationale": rationale},
            )
        ]

    def _review_follow_ups(self, view: StepView, state: dict[str, Any]) -> list[FollowUp]:
        """What the latest report calls for, each weighed by the evidence it cites (search.diagnosis_weight)."""
        latest = [r for r in state["reviewers"].values() if r.get("status") == "reported"]
        report = latest[-1].get("report", {}) if latest else {}
        recommendations = report.get("recommendations", [])
        best = self._best_workers(state)
        top = best[0] if best else None
        headroom = 1.0 - (state["workers"][top]["best"]["score"] if top else 0.0)
        drop = self._curve_drop(view, state, top) if top else None
        items: list[FollowUp] = []
        if report.get("protocol_violations"):
            items.append(FollowUp("revise", "data-screen", None, headroom, 0.0, mandatory=True,
                                  why="integrity first: a protocol violation is always revised",
                                  spec={"rationale": "The review found protocol violations; revise: re-screen the "
                                        "data without the offending sets."}))  # fmt: skip
        stops = [r for r in recommendations if "do not stop" in r]
        content = [r for r in recommendations if "search for other training data" in r]
        if stops:
            weighed = diagnosis_weight(report, "run_on", drop)
            avoid = [d for r in stops for name in re.findall(r"drop (.+?) \(its completions", r)
                     for d in split_list(name)]  # fmt: skip
            items.append(FollowUp("revise", "data-screen", None, round(0.5 * headroom * weighed.weight, 4),
                                  round(0.3 * headroom, 4), why=f"diagnosis 'outputs run on' {weighed.note}",
                                  spec={"avoid": avoid, "search": True, "rationale": "The review found outputs that "
                                        "do not stop after the answer; revise: drop the data that teaches it and "
                                        "re-screen with a wider search."}))  # fmt: skip
        if content and not state.get("searched_wider"):
            weighed = diagnosis_weight(report, "content", drop)
            items.append(FollowUp("branch", "data-screen", None, round(0.4 * headroom * weighed.weight, 4),
                                  round(0.3 * headroom, 4), why=f"diagnosis 'content errors' {weighed.note}",
                                  spec={"search": True, "rationale": "The review reads the errors as content, not "
                                        "format (too little training or wrong labels); branch: screen data found "
                                        "with a wider search."}))  # fmt: skip
        if top and any("verify" in r for r in recommendations):
            items.append(FollowUp("verify", "verify", top, round(0.05 * headroom, 4), round(0.2 * headroom, 4),
                                  cost_scale=0.5, why="the review could not separate the best results",
                                  spec={"rationale": f"The review could not separate the best results; verify "
                                        f"{top}'s best with another seed."}))  # fmt: skip
        if not top and not items:
            items.append(
                FollowUp(
                    "revise",
                    "recipe-sweep",
                    None,
                    0.2,
                    0.2,
                    why="no branch has a usable result",
                    spec={"rationale": "No branch produced a usable result; revise the recipe."},
                )
            )
        return items

    def _allocate(self, view: StepView, state: dict[str, Any], items: list[FollowUp], trigger: str) -> None:
        """Spend the Worker cap and the budget by value (search policy's rule), never by the order written;
        every chosen follow-up's decision records its value and what it was chosen over."""
        walls = [w["wall"] for w in state["workers"].values() if "wall" in w]
        budget = Budget.from_quota(self.quota, lines_spawned=max(1, int(state["spawned"])), line_walls=walls)
        ranked = self.search.rank(items, budget)
        slots = 0 if self._budget_low() else self._slots(state, trigger)
        chosen = [i for i in ranked if i.mandatory or i.value > 0][:slots]
        left_out = [i for i in ranked if i not in chosen]
        for item in chosen:
            lines = [item.spec.get("rationale", ""), item.why,
                     f"Value rule [{self.search.name}], {len(chosen)} of {len(ranked)} follow-ups taken ({slots} "
                     f"Worker slots left): {item.kind} {item.direction}: {item.explain}."]  # fmt: skip
            if left_out:
                lines.append("Chosen over: " + "; ".join(f"{o.kind} {o.direction} (value {o.value:.3f}"
                                                         + (f"; {o.why}" if o.why else "") + ")"
                                                         for o in left_out) + ".")  # fmt: skip
            for name in item.spec.get("avoid", []):
                if name not in state["avoid"]:
                    state["avoid"].append(name)
            self._follow_up(view, state, item.direction, item.kind, trigger, "\n".join(x for x in lines if x),
                            search=bool(item.spec.get("search")), subject=item.subject)  # fmt: skip

    def _review(self, view: StepView, state: dict[str, Any], scope: list[str]) -> None:
        lines = []
        for handle in scope:
            mine = sorted(e for e, x in state["experiments"].items() if x["owner"] == handle)
            lines.append(f"{handle}: {', '.join(mine) or 'no experiments'}")
        kind = "Cross-Worker review" if len(scope) > 1 else "Review"
        question = (f"{kind}: which of these results hold up, and are they comparable? Check data "
                    "provenance and overlap with sealed items, compare the best results with confidence intervals, "
                    "and recommend whether to continue, verify or revise.\n" + "\n".join(lines))  # fmt: skip
        moving = [h for h, w in state["workers"].items() if w.get("status") == "active" and w.get("parent")]
        decision = self._decide(view, state, "verify", "worker_finalize",
                                f"Ask for a {kind.lower()} of {', '.join(scope)} as soon as there is something to "
                                "compare (a result and a baseline, or two results); the report is information still "
                                "to come, not a gate" + (f": {', '.join(moving)} keeps the strongest line moving "
                                "meanwhile." if moving else "."))  # fmt: skip
        body: dict[str, Any] = {"question": question, "scope": scope}
        if decision:
            body["decision"] = decision
        added = view.call("state_add_new_reviewer", body)
        if added.ok:
            state["reviewers"][added.data["reviewer"]["handle"]] = {"scope": scope, "status": "active"}

    def _slots(self, state: dict[str, Any], trigger: str) -> int:
        """Worker slots this trigger's follow-ups may take. While a review is pending, one slot is kept
        for what its report calls for: the report is information still to come, and one that arrives
        to a full cap could change nothing. The strongest line still moves meanwhile in the others."""
        taken = self._branches(state) + len(state["pending"])
        pending_review = bool(state.get("review_coming")) or any(
            r.get("status") != "reported" for r in state["reviewers"].values()
        )
        keep = 1 if pending_review and trigger != "review_report" else 0
        return max(0, int(self.defaults["max_workers"]) - taken - keep)

    def _follow_up(self, view: StepView, state: dict[str, Any], direction: str, kind: str, trigger: str,
                   rationale: str, *, search: bool = False, subject: str | None = None) -> None:  # fmt: skip
        if self._slots(state, trigger) <= 0 or self._budget_low():
            return
        if search:
            state["searched_wider"] = True
        best = self._best_workers(state)
        line_of = subject or (best[0] if best else None)
        source = data = None
        predecessors: list[str] = []
        if line_of and direction in ("continue", "verify", "dpo"):
            line = state["workers"][line_of]["best"]
            source, data = line["experiment"], line.get("data")
            predecessors = [line_of]
            if direction == "verify" and line.get("recipe"):
                recipe = {"recipe": line.get("recipe"), "learning_rate": float(line.get("lr", 0.001)),
                          "max_steps": int(line.get("steps", 200)), "seed": int(line.get("seed", 0))}  # fmt: skip
                state.setdefault("verify_recipe", recipe)
        sized: dict[str, Any] | None = None
        if direction == "continue" and source:
            sized, why = self._size_continuation(view, state["workers"][line_of]["best"])
            if sized:
                rationale = f"{rationale} Sized from the last job's hardware: {why}."
        decision = self._decide(
            view, state, kind, trigger, rationale, subject=predecessors[0] if predecessors else None
        )
        state["pending"].append({"direction": direction, "predecessors": predecessors, "source": source,
                                 "data": data, "decision": decision, "why": trigger, "recipe": sized,
                                 "search": self._search_terms(view) if search else []})  # fmt: skip

    def _size_continuation(self, view: StepView, line: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """The continuation's steps and batch from the line's last training's runtime and peak memory."""
        read = view.call("job_hardware", {"experiment": line["experiment"]})
        trainings = [j for j in (read.data or {}).get("jobs", []) if j.get("kind") == "train"] if read.ok else []
        if not trainings:
            return None, "no hardware evidence"
        accel = self.quota.get("accelerator_seconds") or {}
        changes, why = size_next_job(
            planned_steps=int(self.defaults["train_steps"] * 1.5),
            last_steps=int(line.get("steps", 200)),
            last_hardware=trainings[-1].get("summary"),
            accelerator_left_seconds=float(accel.get("left", 0.0)),
            batch_size=int(self.defaults["batch_size"]),
        )
        if not changes:
            return None, why
        return {"recipe": str(line.get("recipe") or "sft"), **changes}, why

    def _search_terms(self, view: StepView) -> list[str]:
        """Other words for the target: the longer words of the run's target capability text."""
        text = str(view.briefing.get("target_capability") or "")
        capability = self._capability(view).lower()
        words = [w.lower() for w in re.findall(r"[A-Za-z]{5,}", text)]
        return [w for w in dict.fromkeys(words) if w != capability and w not in _COMMON_WORDS][:4]

    def _branches(self, state: dict[str, Any]) -> int:
        return int(state["spawned"]) - int(state["replaced"])

    def _elapsed(self) -> float:
        return float((self.quota.get("wall_clock_seconds") or {}).get("elapsed", 0.0))

    def _budget_low(self) -> bool:
        """Under 15 % left of the accelerator budget or of the wall clock, whichever binds first."""
        accel = self.quota.get("accelerator_seconds") or {}
        budget = float(accel.get("budget", 0)) - float(accel.get("reserved_final", 0))
        wall = self.quota.get("wall_clock_seconds") or {}
        wall_budget = float(wall.get("budget", 0))
        return (budget > 0 and float(accel.get("left", 0)) < 0.15 * budget) or (
            wall_budget > 0 and float(wall.get("left", 0)) < 0.15 * wall_budget
        )

    def _spawn_pending(self, view: StepView, state: dict[str, Any]) -> None:
        remaining = []
        for spec in state["pending"]:
            if (self._branches(state) >= self.defaults["max_workers"] and not spec.get("replaces")) \
                    or self._budget_low():  # fmt: skip
                continue  # dropped: the run has spent what it allows for new branches
            direction = spec["direction"]
            recipe = state.get("verify_recipe") if direction == "verify" else spec.get("recipe")
            task = self._task(
                view,
                state,
                direction,
                source=spec.get("source"),
                data=spec.get("data"),
                recipe=recipe,
                search=spec.get("search"),
            )
            body: dict[str, Any] = {"task": task, "predecessors": spec.get("predecessors", [])}
            if spec.get("decision"):
                body["decision"] = spec["decision"]
            added = view.call("state_add_new_worker", body)
            if added.ok:
                handle = added.data["handle"]
                state["spawned"] += 1
                # A replacement continues a stopped branch: it does not count as a new one.
                state["replaced"] += 1 if spec.get("replaces") else 0
                state["workers"][handle] = {"direction": direction, "status": "active", "reviewed": False,
                                            "spawned_at": self._elapsed()}  # fmt: skip
                if direction in ("continue", "verify") and spec.get("predecessors"):
                    state["workers"][handle]["parent"] = spec["predecessors"][0]
                self._predict(view, state, handle, direction)
            elif added.error_code == "worker_limit":
                remaining.append(spec)  # a finishing Worker frees a slot and wakes us again
            # other refusals (run not active) drop the spawn
        state["pending"] = remaining

    def _predict(self, view: StepView, state: dict[str, Any], handle: str, direction: str) -> None:
        best = self._best_workers(state)
        current = state["workers"][best[0]]["best"]["score"] if best else 0.0
        expected = round(min(1.0, current + (0.02 if best else 0.05)), 3)
        bound = view.call(
            "main_prediction_bind_worker",
            {
                "worker": handle,
                "metric": "feedback_score",
                "expected_value": expected,
                "text": f"{direction} reaches a feedback score of at least {expected} (best so far: {current}).",
            },
        )
        if bound.ok:
            state["predictions"][handle] = {"uuid": bound.data["uuid"], "expected": expected}

    def _maybe_stop(self, view: StepView, state: dict[str, Any]) -> None:
        if state["stopped"] or self._active_workers(state) or state["pending"]:
            return
        if any(r.get("status") != "reported" for r in state["reviewers"].values()):
            return
        if self._branches(state) < self.defaults["max_workers"] and not self._budget_low():
            return
        best = self._best_workers(state)
        reason = (f"{state['spawned']} branches explored; best result from {best[0] if best else 'none'}. "
                  "Stopping for the final evaluation.")  # fmt: skip
        stopped = view.call("stop_loop", {"reason": reason})
        if stopped.ok:
            state["stopped"] = True
            self.decisions.append("stop: " + reason)
