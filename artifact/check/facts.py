"""What a run is, read from what it recorded: the checks `./run.sh check` makes across a run's records and across
runs, after the schema and before it judges anything (ARTIFACT.md §4, "What check refuses, and how").

The claims select runs by labels (the plan, the arm, the engine, the server settings, the load, the data source, the
weights). Each label is held against the facts the run recorded elsewhere: the server command line and the pairing
inputs it was paired by (`Engine.audit.manifest_problem`, `Engine.audit.command_settings`), the plan's definition in
configs/plans.toml, `tenants.jsonl`, each unit's own record (`Workload.record_problem`), the recipe pins of derived
weights, the binary's digests. Two outcomes:

  corruption   a run's records contradict each other: `corruption` raises ArtifactError (exit 2, one line naming
               the file, the field and both values) and nothing is judged. The checker cannot tell which of two
               values is true, so it judges neither; a verdict under either label could be the wrong claim's.
  INVALID      a run's record contradicts itself on a fact that routes it, as its engine reads it (who started the
               server, the server's identity and family, cache use, a cold start: `Engine.audit.record_problems`), or
               each run is consistent, but runs are not independent evidence (`invalid`): a run that holds another
               run's requests with identical server timings (a copy: rerunning changes the server's timings on every
               request), an episode whose first prompt is not the one the configuration's other runs sent for it
               (episodes renumbered or replaced), records that disagree with their own server's log. The runs are
               named under INVALID (exit 1); which one is the copy cannot be known, so each one involved is named.

    corruption(runs)          raise ArtifactError on the first contradiction
    invalid(runs)             {id(run): [reasons]}
    check(runs)               both; the reasons become the runs' problems (as a run that is not whole)

One module: every check of a run's facts before it is judged, in the order `check` applies them, so that what makes
a run INVALID reads in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
import functools
import hashlib
import itertools
import json
import operator
from collections import defaultdict
from pathlib import Path

from artifact import engines, workloads
from artifact.analysis.tenant_effect import tenant_counts
from artifact.errors import ArtifactError
from artifact.records.schema import TENANT
from artifact.records.store import MANIFEST, TENANTS, Run, read_server_log, read_tenants
from artifact.config import PLANS_FILE, read_toml
from artifact.analysis.groups import weights_digests
from artifact.models import derive, lineage

if TYPE_CHECKING:
    from artifact.engines.base import Engine
    from artifact.workloads.base import Workload

_get = dict.get  # plain lookups: requests may be lazily decoding records


def _table(x: object) -> dict[Any, Any]:
    return x if isinstance(x, dict) else {}


def engine_of(run: Run) -> Engine | None:
    """The run's engine adapter, or None for an engine this version does not implement (nothing to ask)."""
    kind = run.manifest.get("engine")
    if not isinstance(kind, str):
        return None
    try:
        return engines.get(kind)
    except ArtifactError:
        return None


@functools.lru_cache(maxsize=1)
def _plans() -> dict[str, Any]:
    """configs/plans.toml as tables (plan name -> its table: arms, lifecycle, each engine's table, tenants). Read
    as data, not through config.load_plans, which imports every engine adapter to validate the tables (the
    artifact's own tests validate the file; `check` needs only the values)."""
    return {name: body for name, body in read_toml(PLANS_FILE).items() if isinstance(body, dict)}


def _same(a: object, b: object) -> bool:
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _tenant_spec(m: dict[str, Any]) -> dict[str, Any]:
    t = _table(m.get("tenants"))
    return _table(t.get("spec")) if "spec" in t else t


# --- labels against facts: corruption ----------------------------------------------------------------------------


def plan_problem(run: Run, engine: Engine | None) -> str | None:
    """The plan's labels against the server command line, and the plan's name against its definition."""
    m = run.manifest
    name, pd = m["plan"], _table(m.get("plan_data"))
    if "name" in pd and pd["name"] != name:
        return f"field 'plan' is {name!r}, plan_data.name is {pd['name']!r}"
    if isinstance(m.get("lifecycle"), str) and "lifecycle" in pd and pd["lifecycle"] != m["lifecycle"]:
        return f"field 'lifecycle' is {m['lifecycle']!r}, plan_data.lifecycle is {pd['lifecycle']!r}"
    shown = engine.audit.command_settings(m) if engine is not None else {}
    key = engine.settings_key if engine is not None else None
    labels = (
        ("plan_data.server_overrides", _table(pd.get("server_overrides"))),
        ("plan_data", {k: pd[k] for k in (engine.cache_keys if engine is not None else ()) if k in pd}),
        (f"plan_data.engine_settings.{key}", _table(_table(pd.get("engine_settings")).get(key))),
        ("cache_condition.settings", _table(_table(m.get("cache_condition")).get("settings"))),
    )
    for where, table in labels:
        for k, v in table.items():
            if k in shown and not _same(shown[k], v):
                return f"field '{where}.{k}' is {v!r}, the server command line (server_cmd) shows {shown[k]!r}"
    plan = _plans().get(name)
    if plan is None:
        return None  # a plan this version does not define: its labels are held against the command line only
    where = f"plan {name!r} (configs/plans.toml)"
    table = _table(plan.get(key)) if engine is not None else {}
    for k, v in table.items():
        if k in shown and not _same(shown[k], v):
            return (
                f"field 'plan' is {name!r}, but the server command line (server_cmd) shows {k} = {shown[k]!r}, "
                f"where {where} sets {v!r}"
            )
    if engine is not None and isinstance(pd.get("server_overrides"), dict):
        want = {k: v for k, v in table.items() if k not in engine.cache_keys}  # as Engine.overrides(plan)
        if pd["server_overrides"] != want:
            return (
                f"field 'plan_data.server_overrides' is {pd['server_overrides']}, {where} overrides {want or 'nothing'}"
            )
    lifecycle, arms = plan.get("lifecycle", "shared"), list(plan.get("arms") or [])
    if isinstance(m.get("lifecycle"), str) and m["lifecycle"] != lifecycle:
        return f"field 'lifecycle' is {m['lifecycle']!r}, {where} has lifecycle {lifecycle!r}"
    if m["arm"] not in arms:
        return f"field 'arm' is {m['arm']!r}, {where} runs arm(s) {', '.join(map(str, arms))}"
    recorded, planned = _tenant_spec(m) or _table(pd.get("tenants")), _table(plan.get("tenants"))
    if bool(recorded) != bool(planned):
        return (
            f"field 'tenants' records {recorded or 'no background tenants'}, {where} has "
            f"{planned or 'no background tenants'}"
        )
    for k, v in planned.items():
        if k in recorded and recorded[k] != v:
            return f"field 'tenants.spec.{k}' is {recorded[k]!r}, {where} sets {v!r}"
    return None


def model_problem(run: Run) -> str | None:
    """A derived model's sha256 is its recipe's pin for its level, and its quant label that level's; any model's quant
    label is the level the artifact's pins give its weights' sha256, where a pin decides (`models.lineage.level_of`)."""
    model = _table(run.manifest.get("model"))
    source = model.get("source")
    if not (isinstance(source, str) and source.startswith(derive.SOURCE_PREFIX)):
        return _pinned_level_problem(run, model)
    return _derived_problem(model, source)


def _pinned_level_problem(run: Run, model: dict[str, Any]) -> str | None:
    """The quant label against the level the pins give the recorded weights (RQ3 places a run by it)."""
    digests = weights_digests(run)
    level = lineage.level_of(digests)
    label = model.get("quant")
    if level is None or not isinstance(label, str) or label.upper() == level:
        return None
    return (
        f"field 'model.quant' is {label!r}, but its weights (sha256 {digests[0][:16]}...) are pinned as level {level}"
    )


def _derived_problem(model: dict[str, Any], source: str) -> str | None:
    try:
        recipe_name, level = derive.parse_source(source)
        recipe = derive.load_recipe(recipe_name)
    except ArtifactError as exc:
        return f"field 'model.source' ({source!r}) cannot be checked against a pin: {exc}"
    pin = _table(recipe.get("products")).get(level)
    if not isinstance(pin, str):
        return (
            f"field 'model.source' names level {level!r}, which recipe {recipe_name!r} does not make (its "
            f"products: {', '.join(sorted(_table(recipe.get('products'))))})"
        )
    sha = model.get("sha256")
    if sha != pin:
        return (
            f"field 'model.sha256' is {str(sha)[:16]}..., recipe {recipe_name}'s pin for {level} is "
            f"{pin[:16]}...: the weights are not the product model.source names"
        )
    quant = level.rsplit("-as-", 1)[-1]
    if isinstance(model.get("quant"), str) and model["quant"].upper() != quant.upper():
        return f"field 'model.quant' is {model['quant']!r}, the level model.source names ({level}) is {quant!r}"
    derivation = _table(model.get("derivation"))
    for k, want in (("recipe", recipe_name), ("level", level), ("product_sha256", pin)):
        if k in derivation and derivation[k] != want:
            return f"field 'model.derivation.{k}' is {derivation[k]!r}, model.source and its pin say {want!r}"
    return None


def tenants_problem(run: Run) -> str | None:
    """The manifest's load (tenants, plan_data.tenants, pairing_inputs.tenants) against tenants.jsonl."""
    m, mf, path = run.manifest, run.path / MANIFEST, run.path / TENANTS
    spec = _tenant_spec(m)
    planned = _table(_table(m.get("plan_data")).get("tenants"))
    paired = _table(_table(_table(m.get("pairing_inputs")).get("tenants")).get("spec"))
    for where, other in (("plan_data.tenants", planned), ("pairing_inputs.tenants.spec", paired)):
        for k, v in other.items():
            if spec and k in spec and spec[k] != v:
                return f"{mf}: field 'tenants.spec.{k}' is {spec[k]!r}, {where}.{k} is {v!r}"
    count = next((t["count"] for t in (spec, planned, paired) if type(t.get("count")) is int), None)
    rows = read_tenants(run)
    if rows is None:
        if count and run.complete:
            return (
                f"{mf}: field 'tenants' records {count} background tenant(s), but the run holds no {TENANTS}: "
                "the load it claims was not recorded"
            )
        return None
    valid = TENANT.valid
    if not all(valid(r) for r in rows):
        i, bad = next((i, r) for i, r in enumerate(rows, 1) if not valid(r))
        return f"{path}:{i}: {TENANT.problem(bad)}"
    if not (spec or planned or paired):
        return (
            f"{path}: the run holds background tenants' records, but its manifest records no tenants (fields "
            "'tenants', 'plan_data.tenants')"
        )
    c = tenant_counts(rows)
    if run.complete and count is not None and c["tenants"] != count:
        return f"{path}: holds the requests of {c['tenants']} tenant(s), the manifest's tenants count is {count}"
    rec = _table(m.get("tenants"))
    sent, meas = _table(rec.get("sent")), _table(rec.get("measured"))
    for where, table, k, value, what in (
        ("tenants.sent.requests", sent, "requests", c["requests"], "tenant requests"),
        ("tenants.sent.failed", sent, "failed", c["failed"], "failed tenant requests"),
        ("tenants.measured.requests", meas, "requests", c["measured"], "measured requests"),
        (
            "tenants.measured.overlapped",
            meas,
            "overlapped",
            c["overlapped"],
            "measured requests during which a tenant request was in flight",
        ),
    ):
        if k in table and table[k] != value:
            return f"{mf}: field '{where}' is {table[k]!r}, {TENANTS} holds {value} {what}"
    return tenant_prompts_problem(rec, rows, mf, path)


def tenant_prompts_problem(rec: dict[str, Any], rows: list[dict[str, Any]], mf: Path, path: Path) -> str | None:
    """Each tenant request's prompt (tenants.jsonl: unit, prompt, prompt_sha256) against the prompts the manifest
    records for that unit (tenants.units: prompts_sha256), which decide whether the load shared the measured prefix
    (analysis.tenant_effect.prefix_of). A manifest without the units record (no tenant prompts) asks nothing here."""
    units = rec.get("units")
    if not isinstance(units, list) or not units:
        return None
    pools = {u.get("unit"): u.get("prompts_sha256") for u in units if isinstance(u, dict)}
    for i, r in enumerate(rows, 1):
        if r.get("kind") != "tenant":
            continue
        pool, k = pools.get(r["unit"]), r["prompt"]
        if not isinstance(pool, list):
            return f"{path}:{i}: a tenant request during unit {r['unit']!r}, for which {mf} records no tenant prompts"
        if k >= len(pool) or pool[k] != r["prompt_sha256"]:
            return (
                f"{path}:{i}: field 'prompt_sha256' is {r['prompt_sha256']!r}, but {mf} records "
                f"{pool[k] if k < len(pool) else 'no such prompt'!r} for prompt {k} of unit {r['unit']!r} "
                "(tenants.units)"
            )
    return None


def run_problem(run: Run) -> str | None:
    """The first contradiction among one run's records, as one line naming file and field, or None."""
    mf = run.path / MANIFEST
    engine = engine_of(run)
    for why in (
        (engine.audit.manifest_problem(run.manifest) if engine is not None else None),
        plan_problem(run, engine),
        model_problem(run),
    ):
        if why:
            return f"{mf}: {why}"
    why = tenants_problem(run)
    if why:
        return why
    workload: Workload | None = workloads.of_run(run)
    return workload.record_problem(run) if workload is not None else None


def sessions(runs: list[Run]) -> dict[tuple[Any, ...], list[Run]]:
    """(plan directory, server log) -> the complete runs one server session served, in the order they ran."""
    out: dict[tuple[Any, ...], list[Run]] = defaultdict(list)
    for run in runs:
        log = run.manifest.get("server_log")
        if run.complete and isinstance(log, str):
            out[(run.path.parent, log)].append(run)
    for members in out.values():
        members.sort(key=lambda r: (str(r.manifest.get("started_at") or ""), r.manifest["run"]))
    return out


def corruption(runs: list[Run]) -> None:
    """Raise ArtifactError (one line) on the first run whose records contradict each other, or on runs of a plan
    with a new server per run that share one server's log."""
    for run in runs:
        why = run_problem(run)
        if why:
            raise ArtifactError(why)
    for (_, log), members in sessions(runs).items():
        fresh = [r for r in members if r.manifest.get("lifecycle") == "fresh"]
        if fresh and len(members) > 1:
            a, b = members[0], members[1]
            raise ArtifactError(
                f"{fresh[0].path / MANIFEST}: field 'lifecycle' is 'fresh' (a new server per run), "
                f"but {a.label} and {b.label} record the same server log {log!r}"
            )


# --- runs that are not independent evidence: INVALID ----------------------------------------------------------

_FIELDS = ("episode_id", "request_index", "prompt_sha256", "prompt_ms", "predicted_ms")
_ROW = operator.itemgetter(*_FIELDS)


def _rows(run: Run) -> list[tuple[Any, ...]]:
    """(episode, request_index, prompt sha256, prompt_ms, predicted_ms) of every request: one pass at C speed
    (32,000 requests at paper scale), field by field only where a record lacks one of the optional fields."""
    try:
        return list(map(_ROW, run.requests))
    except KeyError:
        return [tuple(_get(r, f) for f in _FIELDS) for r in run.requests]


def _timed_units(rows_of: dict[int, Any]) -> list[list[tuple[Run, str]]]:
    """Each episode of each run as the sequence of its requests' (index, prompt sha256, prompt_ms, predicted_ms),
    over the requests that carry a server timing, in request index order -> the (run, episode)s that hold exactly
    that sequence: one list per sequence, in the order the sequences first appear. Sequences are looked up by their
    length and first row (hashing every row of every episode was most of the cost) and then compared whole."""
    units: list[list[tuple[Run, str]]] = []
    index: dict[
        tuple[Any, ...], list[tuple[list[Any], list[Any]]]
    ] = {}  # (length, first row) -> [(sequence, its holders)]
    for run, rows in rows_of.values():
        by: dict[
            str, list[Any]
        ] = {}  # episode -> its timed rows in the order they appear (the records hold runs of them)
        for eid, group in itertools.groupby(rows, _FIRST):
            timed = [row for row in group if row[3] is not None or row[4] is not None]
            if timed:
                seq = by.get(eid)
                if seq is None:
                    by[eid] = timed
                else:
                    seq += timed
        for eid, seq in by.items():
            seq.sort(key=_SECOND)
            same = index.setdefault((len(seq), seq[0][1:]), [])
            for other, holders in same:
                if all(map(operator.eq, map(_REST, other), map(_REST, seq))):
                    holders.append((run, eid))
                    break
            else:
                same.append((seq, [(run, eid)]))
                units.append(same[-1][1])
    return units


_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_REST = operator.itemgetter(slice(1, None))  # a row but its episode


def copies(rows_of: dict[int, Any], out: dict[int, list[str]]) -> None:
    """Runs holding the same requests with identical server timings (an episode copied, within a run or from
    another one)."""
    shared: dict[tuple[int, int], list[Any]] = {}
    for holders in _timed_units(rows_of):
        if len(holders) < 2:
            continue
        for i, (ra, ea) in enumerate(holders):
            for rb, eb in holders[i + 1 :]:
                shared.setdefault((id(ra), id(rb)), [ra, rb, []])[2].append((ea, eb))
    for ra, rb, eps in shared.values():
        ea, eb = eps[0]
        if ra is rb:
            why = (
                f"{ra.label} holds episodes {ea} and {eb} with the same requests and identical server timings: a "
                f"duplicated episode, not one the server served twice ({ra.path})"
            )
            out[id(ra)].append(why)
            continue
        what = (
            f"the same requests with identical server timings in {len(eps)} episode(s) (first: {ea}"
            + (f" as {eb}" if eb != ea else "")
            + ")"
        )
        out[id(ra)].append(
            f"{ra.label} and {rb.label} hold {what}: copied records, not independent runs "
            f"(rerunning changes the server's timings) ({ra.path})"
        )
        out[id(rb)].append(
            f"{rb.label} and {ra.label} hold {what}: copied records, not independent runs "
            f"(rerunning changes the server's timings) ({rb.path})"
        )


def _prompt_identity(run: Run) -> tuple[Any, ...]:
    """What makes a configuration's prompts: its name and its workload's settings and data (episode count aside)."""
    inputs = _table(run.manifest.get("pairing_inputs"))
    workload = {k: v for k, v in _table(inputs.get("workload")).items() if k != "episodes"}
    blob = json.dumps([workload, inputs.get("workload_data")], sort_keys=True, default=str)
    return run.manifest["config"], hashlib.sha256(blob.encode()).hexdigest()


def first_prompts(rows_of: dict[int, Any], out: dict[int, list[str]]) -> None:
    """An episode's first prompt is the same in every run of a configuration: a run whose first prompt of an
    episode is not the one most runs sent for it (every run involved, on a tie) holds renumbered or replaced
    episodes."""
    seen: dict[tuple[Any, ...], dict[str, dict[str, list[Run]]]] = defaultdict(lambda: defaultdict(dict))
    for run, rows in rows_of.values():
        episodes = seen[_prompt_identity(run)]
        for row in [row for row in rows if row[1] == 0]:
            episodes[row[0]].setdefault(row[2], []).append(run)
    flagged: set[int] = set()
    for (config, _), episodes in seen.items():
        for eid, by_sha in episodes.items():
            if len(by_sha) < 2:
                continue
            top = max(len({id(r) for r in rs}) for rs in by_sha.values())
            majority = [s for s, rs in by_sha.items() if len({id(r) for r in rs}) == top]
            for sha, rs in by_sha.items():
                if len(majority) == 1 and sha == majority[0]:
                    continue
                other = majority[0] if majority[0] != sha else next(s for s in by_sha if s != sha)
                for run in rs:
                    if id(run) not in flagged:
                        flagged.add(id(run))
                        out[id(run)].append(
                            f"{run.label}: episode {eid}'s first prompt (sha256 {str(sha)[:12]}) is not the one other "
                            f"runs of configuration {config} sent for it ({str(other)[:12]}): episodes renumbered or "
                            f"replaced ({run.path})"
                        )


def server_logs(runs: list[Run], out: dict[int, list[str]]) -> None:
    """Each server session's records against the session's own log, where it was kept and the engine can read it
    (sessions with background tenants aside: their log interleaves the tenants' requests)."""
    for (_, log), members in sessions(runs).items():
        if any(_tenant_spec(r.manifest).get("count") for r in members):
            continue
        engine = engine_of(members[0])
        if engine is None:
            continue
        text = read_server_log(members[0])
        if text is None:
            continue
        cmd = members[0].manifest.get("server_cmd")
        for r in members[1:]:
            if r.manifest.get("server_cmd") != cmd:
                out[id(r)].append(
                    f"{r.label} records another server command line than {members[0].label}, whose "
                    f"server log {log} it shares ({r.path})"
                )
        for run, why in zip(
            members, engine.audit.session_log_problems(members[0].manifest, [r.requests for r in members], text)
        ):
            if why:
                out[id(run)].append(
                    f"{run.label}: {why} ({log}): its records are not what its server served ({run.path})"
                )


def self_contradictions(runs: list[Run], out: dict[int, list[str]]) -> None:
    """Each run's record against itself on the facts that route it, as its engine reads them
    (`Engine.audit.record_problems`: who started the server, its identity and family, cache use, a cold start)."""
    for run in runs:
        engine = engine_of(run)
        if engine is None:
            continue
        for why in engine.audit.record_problems(run.manifest, run.requests):
            out[id(run)].append(f"{run.label}: {why} ({run.path})")


def invalid(runs: list[Run]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = defaultdict(list)
    self_contradictions(runs, out)
    rows_of = {id(run): (run, _rows(run)) for run in runs}
    copies(rows_of, out)
    first_prompts(rows_of, out)
    server_logs(runs, out)
    return out


def check(runs: list[Run]) -> None:
    """`corruption`, then `invalid`: each run's reasons join its problems (`Run.integrity_problems`), so that it is
    named under INVALID and enters no comparison, as a run that is not whole."""
    corruption(runs)
    reasons = invalid(runs)
    for run in runs:
        if reasons.get(id(run)):
            run._integrity = run.integrity_problems() + reasons[id(run)]
