"""Complete paired (ON/OFF) runs grouped by configuration and plan, their ON run k / OFF run k pairs, and what the
analyses read from manifests."""

from __future__ import annotations

import itertools
import operator

from artifact import engines
from artifact.analysis.divergence import (
    Comparison,
    compared,
    episode_outputs,
    first_difference,
    first_unequal,
    made_comparison,
)
from artifact.models import lineage
from artifact.records.store import Run

Group = dict[tuple[str, int], Run]  # (arm, run number) -> run


def by_plan(runs: list[Run]) -> dict[tuple[str, str], Group]:
    """(config, plan) -> its complete ON and OFF runs by (arm, run number), in sorted (config, plan) order."""
    out: dict[tuple[str, str], Group] = {}
    for r in runs:
        m = r.manifest
        if r.complete and m.get("arm") in ("off", "on"):
            out.setdefault((m["config"], m["plan"]), {})[(m["arm"], m["run"])] = r
    return dict(sorted(out.items()))


def on_off_pairs(group: Group) -> list[tuple[int, Run, Run]]:
    """(k, ON run k, OFF run k) for every run number both arms completed."""
    return [
        (k, group[("on", k)], group[("off", k)])
        for k in sorted({k for (_, k) in group})
        if ("on", k) in group and ("off", k) in group
    ]


def ok_requests(run: Run) -> list[dict]:
    """The requests the engine served (those recorded with an error carry no output)."""
    reqs = run.requests  # dict.get: never decodes lazy fields; at C speed
    return list(
        itertools.compress(
            reqs, map(operator.is_, map(dict.get, reqs, itertools.repeat("error")), itertools.repeat(None))
        )
    )


class SamePrompt:
    """The request pairs of two runs that sent the same prompt (`same_prompt`): `a[i]` and `b[i]` are the i-th pair's
    requests, `first[i]` the first position where their generated tokens differ (`first_difference`; None where they
    are equal), `len_a[i]` and `len_b[i]` how many tokens each generated. Lists, made once per pair of runs: do not
    change them."""

    __slots__ = ("a", "b", "first", "len_a", "len_b")

    def __init__(self, a: list, b: list, first: list, len_a: list, len_b: list):
        self.a, self.b, self.first, self.len_a, self.len_b = a, b, first, len_a, len_b


def _same_prompt(a: Run, b: Run) -> SamePrompt:
    """Episode by episode, on the runs' `episode_outputs` (lists compared at C speed): k, the pairs up to and
    including the first whose generated tokens differ; of those, the pairs before the first that has an error or
    different prompts."""
    qas, qbs, firsts, len_a, len_b = [], [], [], [], []
    oa, ob = episode_outputs(a), episode_outputs(b)
    eb = b.requests_by_episode()
    # where an episode's tokens first differ: from the runs' comparison, made once for both (ON vs OFF: the paper's
    # tables made it; the analyses that walk a pair compare it too), else (an episode it does not compare) here
    made = made_comparison(a, b)
    made = compared(a, b) if made is None else made
    diffs = {d.episode_id: d for d in made.episodes}
    for eid, reqs_a in a.requests_by_episode().items():
        reqs_b = eb.get(eid)
        if not reqs_a or not reqs_b:
            continue
        (ta, sa, xa, na), (tb, sb, xb, nb) = oa[eid], ob[eid]
        n = min(len(ta), len(tb))
        d = diffs.get(eid)
        if d is not None:  # compared: the first request whose tokens differ is where it diverged at a token
            t = d.first_request if d.first_token is not None else None
        else:
            t = first_unequal(ta, tb) if (ta != tb if len(ta) == len(tb) else ta[:n] != tb[:n]) else None
        k = n if t is None else t + 1
        if any(xa[:k]) or any(xb[:k]) or sa[:k] != sb[:k]:  # an error (a true one), or different prompts
            k = next(i for i in range(k) if xa[i] or xb[i] or sa[i] != sb[i])
            t = None
        qas += reqs_a[:k]
        qbs += reqs_b[:k]
        len_a += na[:k]
        len_b += nb[:k]
        firsts += [None] * k
        if t is not None:
            firsts[-1] = d.first_token if d is not None else first_difference(ta[t], tb[t])
    return SamePrompt(qas, qbs, firsts, len_a, len_b)


def same_prompt(a: Run, b: Run) -> SamePrompt:
    """The pairs `same_prompt_requests` yields, with where their tokens first differ: made once per pair of runs and
    kept on run a (the margins, the quantization and the tier analyses walk the same ON/OFF pairs)."""
    cache = a.__dict__.setdefault("_same_prompt", {})
    hit = cache.get(id(b))
    if hit is None:
        hit = cache[id(b)] = (b, _same_prompt(a, b))  # b is held so that its id is not reused
    return hit[1]


def same_prompt_requests(a: Run, b: Run):
    """(request of a, request of b), episode by episode, while both runs sent the same prompt without an error; an
    episode ends after the first pair whose generated tokens differ (the next prompts hold different text)."""
    sp = same_prompt(a, b)
    return zip(sp.a, sp.b)


def manifest_table(run: Run, key: str) -> dict:
    """A manifest field that should be a table (model, plan_data); {} when it is missing or is not one."""
    value = run.manifest.get(key)
    return value if isinstance(value, dict) else {}


def weights_digests(run: Run) -> tuple[str, ...]:
    """The sha256 of the weights a run recorded: its model's sha256, else (hf: sources, which pin every file) every
    file's, in order, as its configuration recorded the files the protocol verified before the server started; ()
    where it records none."""
    model = manifest_table(run, "model")
    if isinstance(model.get("sha256"), str) and model["sha256"]:
        return (model["sha256"],)
    files = manifest_table(run, "config_data").get("model")
    files = files.get("files") if isinstance(files, dict) else None
    shas = tuple(f.get("sha256") for f in files if isinstance(f, dict)) if isinstance(files, list) else ()
    return shas if shas and all(isinstance(s, str) and s for s in shas) else ()


def _loaded_weights(run: Run) -> bool:
    """Whether the run's engine loaded the configuration's weights itself (sha256-verified before its server
    started: `Capabilities.loads_weights`), so that the digests it recorded are the weights that served it."""
    engine = engines.of_manifest(run.manifest)
    return engine is not None and engine.capabilities.loads_weights


def weights_lineage(run: Run) -> tuple[str | None, str]:
    """(lineage, why none): which model the run's weights are a level of, derived from facts, never from
    the manifest's model name or family: only an engine that loads the configuration's weights itself (sha256-
    verified before its server starts: `Capabilities.loads_weights`) knows them, and their digest is looked up in
    the artifact's own pins (`models.lineage.of_digests`: a recipe's products, the configurations' pins), and only
    where the pins give the weights one level (`models.lineage.level_of`: where two configurations pin one digest at
    two levels, its `model.quant` label would place it). Where the facts cannot decide (a server the artifact did not
    start, no digest, a digest no pin knows, pins that disagree on its level) the lineage is None and `why` says why:
    such a run joins no quantization series."""
    if not _loaded_weights(run):
        return None, (
            "its weights are not known: the artifact did not load them (a server it did not start, or an "
            "engine this version does not know)"
        )
    digests = weights_digests(run)
    if not digests:
        return None, "it records no sha256 of its weights"
    found = lineage.of_digests(digests)
    if found is None:
        return None, (
            f"its weights (sha256 {digests[0][:12]}...) are pinned as a level of one model by no recipe "
            "or configuration of this checkout"
        )
    if lineage.level_of(digests) is None:  # its place in the series would be its label's
        levels = lineage.pinned_levels(digests)
        return None, (
            f"the configurations of this checkout that pin its weights (sha256 {digests[0][:12]}...) "
            + (f"give them different levels ({', '.join(levels)})" if levels else "give them no level")
            + ": no pin decides its level, and its label does not"
        )
    return found, ""


def pinned_model(run: Run) -> tuple[str, str] | None:
    """(family, name) the checkout's configurations pin the run's weights as (`models.lineage.pinned_model`), only
    for an engine that loaded those weights itself (see `weights_lineage`); None where the facts cannot decide."""
    return lineage.pinned_model(weights_digests(run)) if _loaded_weights(run) else None


def group_lineage(runs: list[Run]) -> tuple[str | None, str]:
    """`weights_lineage` of a configuration's runs: theirs where all agree, else None (and why)."""
    found = {weights_lineage(r) for r in runs}
    if len(found) == 1:
        return next(iter(found))
    known = sorted({x for x, _ in found if x})
    why = min((w for x, w in found if x is None), default="")
    if len(known) > 1:
        return None, f"its runs' weights are levels of different models ({', '.join(known)})"
    return None, f"not every run's weights are known: {why}" if known else why


# The cache-condition settings of records made before engines described their own condition (plan_data held them).
_LEGACY_CACHE_KEYS = ("cache_ram_mib", "slot_prompt_similarity", "pin_slot")


def cache_condition(run: Run) -> dict:
    """The cache condition a run ran under, as its engine adapter recorded it (`cache_condition`): `description`
    (in words) and `settings` (what the plan chose). Older records kept the settings in plan_data; their
    description is rebuilt from them in the words the adapter used."""
    cc = manifest_table(run, "cache_condition")
    settings = cc.get("settings")
    description = cc.get("description")
    if not isinstance(settings, dict):
        pd = manifest_table(run, "plan_data")
        settings = {k: pd[k] for k in _LEGACY_CACHE_KEYS if k in pd}
    if not isinstance(description, str):
        if "arm_flag" in cc:
            description = "prefix caching per arm's server"
        elif "cache_ram_mib" in settings:
            description = (
                f"host prompt cache {settings['cache_ram_mib']} MiB (--cache-ram), slot "
                f"{'pinned' if settings.get('pin_slot') else 'chosen by the server'}"
            )
        else:
            description = "not recorded"
    return {"description": description, "settings": settings}


def comparison(a: Run, b: Run) -> Comparison:
    """compare_runs(a, b), computed once per pair and kept on run a for the other analyses of this check
    (`divergence.compared`: the paper's tables ask for the same pairs)."""
    return compared(a, b)
