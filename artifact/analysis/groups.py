"""Complete paired (ON/OFF) runs grouped by configuration and plan, their ON run k / OFF run k pairs, and what the
analyses read from manifests."""

from __future__ import annotations

from artifact.analysis.compare import Comparison, compare_runs
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
    return [(k, group[("on", k)], group[("off", k)]) for k in sorted({k for (_, k) in group})
            if ("on", k) in group and ("off", k) in group]


def ok_requests(run: Run) -> list[dict]:
    """The requests the engine served (those recorded with an error carry no output)."""
    return [r for r in run.requests if dict.get(r, "error") is None]  # dict.get: never decodes lazy fields


def same_prompt_requests(a: Run, b: Run):
    """(request of a, request of b), episode by episode, while both runs sent the same prompt without an error; an
    episode ends after the first pair whose generated tokens differ (the next prompts hold different text)."""
    eb = b.requests_by_episode()
    for eid, reqs_a in a.requests_by_episode().items():
        for qa, qb in zip(reqs_a, eb.get(eid, [])):
            if dict.get(qa, "error") or dict.get(qb, "error") or qa["prompt_sha256"] != qb["prompt_sha256"]:
                break
            yield qa, qb
            if qa["output_tokens"] != qb["output_tokens"]:
                break


def manifest_table(run: Run, key: str) -> dict:
    """A manifest field that should be a table (model, plan_data); {} when it is missing or is not one."""
    value = run.manifest.get(key)
    return value if isinstance(value, dict) else {}


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
            description = (f"host prompt cache {settings['cache_ram_mib']} MiB (--cache-ram), slot "
                           f"{'pinned' if settings.get('pin_slot') else 'chosen by the server'}")
        else:
            description = "not recorded"
    return {"description": description, "settings": settings}


def comparison(a: Run, b: Run) -> Comparison:
    """compare_runs(a, b), computed once per pair and kept on run a for the other analyses of this check."""
    cache = a.__dict__.setdefault("_comparisons", {})
    if id(b) not in cache:
        cache[id(b)] = (b, compare_runs(a, b))  # b is held so that its id is not reused
    return cache[id(b)][1]
