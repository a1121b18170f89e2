"""What the ``*_validate_sampled.py`` benchmarks share: a fixed-seed sample of the plans the search finds
feasible (the best 8 of each case and a draw from the rest), each sampled plan again with one more option
set where it stays legal, a child interpreter per core that runs a framework's own start-up checks on a
batch of jobs, and the summary table of what the framework refused.
"""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root

from autotune.catalog import load_model, make_cluster  # noqa: E402
from autotune.errors import ConfigError  # noqa: E402
from autotune.legality import check_plan  # noqa: E402
from autotune.plan import Framework, ParallelPlan  # noqa: E402
from autotune.ranking import plan_search  # noqa: E402
from autotune.space import SearchSpace, load_space  # noqa: E402
from autotune.specs import ModelSpec  # noqa: E402

Case = tuple[str, int, str, int, dict]
"""(model, GPUs, GPU, sequence length, knobs that replace the bundled space's)."""
Unsupported = Callable[[ModelSpec, ParallelPlan], list[str]]
"""Why the framework's emitter writes no file for the plan ([] when it writes one)."""


def sample_plans(
    cases: Sequence[Case],
    space: str,
    framework: Framework,
    unsupported: Unsupported,
    per_case: int,
    seed: int,
) -> list[tuple[str, str, ParallelPlan]]:
    """(case, GPU, plan): the best 8 feasible ``framework`` plans of each case in the bundled ``space`` and
    ``per_case`` drawn from the rest; plans the framework's emitter cannot express left out."""
    rng = random.Random(seed)
    out = []
    for name, gpus, gpu, seq, knobs in cases:
        model, cluster = load_model(name), make_cluster(num_gpus=gpus, gpu=gpu)
        bundled = load_space(space)
        ranking = plan_search(
            SearchSpace(knobs={**bundled.knobs, **knobs}, source=bundled.source),
            model,
            cluster,
            pins={},
            global_batch=None,
            seq_len=seq,
            frameworks=[framework],
        )
        feasible = [e.plan for e in ranking.feasible]
        picked = feasible[:8] + rng.sample(feasible[8:], min(per_case, len(feasible) - 8))
        label = f"{name} on {gpus} {gpu}" + (", fp8 " + "/".join(knobs["fp8_recipe"]) if knobs else "")
        out += [(label, gpu, p) for p in picked if not unsupported(model, p)]
    return out


def option_variants(
    plans: list[tuple[str, str, ParallelPlan]], options: Mapping[str, dict], unsupported: Unsupported
) -> list[tuple[str, str, ParallelPlan]]:
    """Each plan with each of ``options`` set, where the plan stays legal for its model and cluster and the
    framework's emitter can express it (memory is not judged: start-up checks do not see it)."""
    out = []
    for case, gpu, plan in plans:
        model, cluster = load_model(case.split(" on ")[0]), make_cluster(num_gpus=plan.world_size, gpu=gpu)
        for option, fields in options.items():
            try:
                variant = plan.replace(**fields)
            except ConfigError:
                continue
            legal = not check_plan(variant, model, cluster) and not unsupported(model, variant)
            if variant != plan and legal:
                out.append((f"{case}; {option}", gpu, variant))
    return out


def run_children(child: str, jobs: list[dict], env: Mapping[str, str], procs: int = 2) -> dict[int, dict]:
    """``jobs`` split over ``procs`` interpreters running ``child`` (the framework imports once per batch),
    which reads the jobs as JSON on stdin and prints ``RESULT {"id": ..., "ok": ..., "error": ...}`` a job."""
    halves = tuple(jobs[i::procs] for i in range(procs))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", child],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env),
        )
        for _ in halves
    ]
    results: dict[int, dict] = {}
    for proc, half in zip(children, halves, strict=True):
        out, err = proc.communicate(json.dumps(half), timeout=1800)
        got = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
        if len(got) != len(half):
            raise SystemExit(f"a validation child stopped early: {err[-800:]}")
        results |= {g["id"]: g for g in got}
    return results


def fields(plan: ParallelPlan) -> dict:
    """The plan's fields that differ from the defaults (``ParallelPlan.from_dict`` reads them back)."""
    default = ParallelPlan(global_batch=plan.global_batch, seq_len=plan.seq_len).to_dict()
    return {k: v for k, v in plan.to_dict().items() if v != default[k] or k in ("global_batch", "seq_len")}


def summary(rows: list[dict], title: str, what: str, kind: str) -> str:
    """The markdown report: ``what`` ends the first sentence (the script and the framework's version);
    plans and refusals per case and per option, then each distinct refusal. A row whose ``ok`` is None
    stopped where the framework imports a kernel library that is not installed here (``error`` says which):
    counted apart, neither passed nor refused."""

    def table(head: str, key) -> list[str]:
        tally: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
        for r in rows:
            tally[key(r)][0] += 1
            tally[key(r)][1] += r["ok"] is False
            tally[key(r)][2] += r["ok"] is None
        extra = " not checked |" if unchecked else ""
        return ["", f"| {head} | plans | refused |{extra}", "|---|---|---|" + "---|" * bool(unchecked)] + [
            f"| {k} | {n} | {bad} |" + (f" {skip} |" if unchecked else "")
            for k, (n, bad, skip) in tally.items()
        ]

    failed = [r for r in rows if r["ok"] is False]
    unchecked = collections.Counter(r["error"] for r in rows if r["ok"] is None)
    searched = sum("; " not in r["case"] for r in rows)
    variants = len(rows) - searched
    lines = [
        f"# {title}",
        "",
        f"Generated by {what}: {searched} feasible {kind} plans of the search and {variants} legal "
        f"variants of them with one more option set ({len(rows)} in all), {len(failed)} refused"
        + (f", {unchecked.total()} not checked to the end" if unchecked else "")
        + ".",
        *table("case", lambda r: r["case"].split("; ")[0]),
        *table("option", lambda r: r["case"].split("; ")[1] if "; " in r["case"] else "as searched"),
    ]
    for head, counts in (
        ("refusals", collections.Counter(r["error"] for r in failed)),
        ("not checked", unchecked),
    ):
        if counts:
            lines += ["", f"| {head} | error |", "|---|---|"]
            lines += [f"| {n} | {e} |" for e, n in counts.most_common()]
    return "\n".join(lines) + "\n"


def write_results(out: Path, text: str, rows: list[dict], meta: dict) -> None:
    """``<out>.md`` (the summary) and ``<out>.json``: every searched plan with its verdict, the variants
    counted per option and listed where refused or not checked."""
    searched = [r for r in rows if "; " not in r["case"]]
    variants = collections.Counter(r["case"].split("; ")[1] for r in rows if "; " in r["case"])
    refused = [r for r in rows if "; " in r["case"] and r["ok"] is not True]
    doc = {**meta, "plans": searched, "variants_per_option": variants, "refused_variants": refused}
    out.with_suffix(".json").write_text(json.dumps(doc) + "\n")
    out.with_suffix(".md").write_text(text)
