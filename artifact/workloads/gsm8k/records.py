"""Where a bridge run's items came from, read from each item's own record (`./run.sh check`, Tab. 3's `data`).

Every item record (episodes.jsonl) names its `source` ("synthetic": this artifact's generator; "gsm8k": the pinned
test split) and carries an id of that source's form (`synthetic_0000`, `gsm8k_test_0000`: data.py). The manifest
says it again, in several places: `data`, `items_source`, `items_provenance` (source, data, synthetic) and the
workload settings (`gsm8k_source`, also in the pairing inputs). All must name the items' own source; a label that
does not is a record that contradicts itself.

A label is not evidence that the items are GSM8K's: items that name the test split are held against it. Each item's
reference must be the one the split's row of its index gives, and every request of the item must have been sent the
prompt built from that row (its recorded `prompt_sha256`), with the run's chat handler. The split is the copy this
checkout carries (data/gsm8k/, checked against its pins), which is the Hub split row for row.
"""

from __future__ import annotations

import functools
import hashlib

from artifact.errors import ArtifactError
from artifact.records.store import EPISODES, REQUESTS, Run

SOURCES = {
    "synthetic": "synthetic",
    "gsm8k": "gsm8k",
    "hub": "gsm8k",
    "bundled": "gsm8k",
}  # a label -> the source it names
ID_PREFIX = {"synthetic": "synthetic_", "gsm8k": "gsm8k_test_"}


def _table(x) -> dict:
    return x if isinstance(x, dict) else {}


def manifest_labels(run: Run) -> list[tuple[str, object]]:
    """(field, value) of every manifest field that says where the items came from."""
    m = run.manifest
    prov = _table(m.get("items_provenance"))
    out = [(k, m[k]) for k in ("data", "items_source") if k in m]
    out += [(f"items_provenance.{k}", prov[k]) for k in ("source", "data") if k in prov]
    if isinstance(prov.get("synthetic"), bool):
        out.append(("items_provenance.synthetic", "synthetic" if prov["synthetic"] else "gsm8k"))
    for where, table in (
        ("workload_settings", _table(m.get("workload_settings"))),
        ("pairing_inputs.workload", _table(_table(m.get("pairing_inputs")).get("workload"))),
    ):
        if "gsm8k_source" in table:
            out.append((f"{where}.gsm8k_source", table["gsm8k_source"]))
    return out


def item_sources(run: Run) -> set:
    """The sources the run's items name themselves (their records' `source`)."""
    return {dict.get(e, "source") for e in run.episodes if isinstance(dict.get(e, "source"), str)}


@functools.lru_cache(maxsize=1)
def _split_rows() -> tuple:
    """(question, reference) of every row of the test split this checkout carries, in file order (checked first)."""
    from artifact.workloads.gsm8k.data import BUNDLED_FILE, load_gsm8k_bundled  # lazy: only GSM8K runs need it

    with open(BUNDLED_FILE, encoding="utf-8") as handle:
        n = sum(1 for line in handle if line.strip())
    items, _ = load_gsm8k_bundled(n)
    return tuple((i.question, i.answer) for i in items)


@functools.lru_cache(maxsize=4096)
def _prompt_sha256(index: int, handler: str) -> str:
    from artifact.workloads.gsm8k import prompts  # lazy: the chat handlers (bfcl_eval) load only for GSM8K runs
    from artifact.workloads.gsm8k.data import GSM8KItem

    question, answer = _split_rows()[index]
    item = GSM8KItem(f"gsm8k_test_{index:04d}", question, answer, "gsm8k")
    return hashlib.sha256(prompts.build_prompt(item, handler).encode()).hexdigest()


def split_problem(run: Run) -> str | None:
    """Items that name GSM8K's test split against the split itself: reference and the prompt every request was sent."""
    items = {e.get("item_id"): (line, e) for line, e in enumerate(run.episodes, 1) if e.get("source") == "gsm8k"}
    if not items:
        return None
    handler = run.manifest.get("chat_handler")
    try:
        rows = _split_rows()
    except ArtifactError as exc:
        return f"the items name GSM8K's test split, which cannot be read to hold them against it: {exc}"
    index: dict[object, int] = {}
    for item_id, (line, e) in items.items():
        where = f"{run.path / EPISODES}:{line}"
        suffix = item_id[len(ID_PREFIX["gsm8k"]) :] if isinstance(item_id, str) else ""
        if not (suffix.isdigit() and int(suffix) < len(rows)):
            return f"{where}: item {item_id!r} names no row of GSM8K's test split ({len(rows)} rows)"
        index[item_id] = int(suffix)
        if e.get("reference") != rows[int(suffix)][1]:
            return (
                f"{where}: field 'reference' is {e.get('reference')!r}, GSM8K's test row {int(suffix)} answers "
                f"{rows[int(suffix)][1]!r}"
            )
    for line, r in enumerate(run.requests, 1):
        if r.get("item_id") not in index:
            continue
        try:
            want = _prompt_sha256(index[r["item_id"]], str(handler))
        except ArtifactError as exc:
            return f"{run.path / 'manifest.json'}: field 'chat_handler' {handler!r}: {exc}"
        if r.get("prompt_sha256") != want:
            return (
                f"{run.path / REQUESTS}:{line}: the prompt sent for item {r['item_id']!r} (prompt_sha256 "
                f"{str(r.get('prompt_sha256'))[:12]}...) is not the one GSM8K's test row {index[r['item_id']]} "
                f"gives with chat handler {handler!r} ({want[:12]}...)"
            )
    return None


def record_problem(run: Run) -> str | None:
    labels = manifest_labels(run)
    for line, e in enumerate(run.episodes, 1):
        where = f"{run.path / EPISODES}:{line}"
        src, item = e.get("source"), e.get("item_id", e.get("episode_id"))
        if src is None:
            continue  # an older record: the manifest is all there is
        if src not in ID_PREFIX:
            return f"{where}: field 'source' is {src!r}, not one of {', '.join(map(repr, ID_PREFIX))}"
        for kind, prefix in ID_PREFIX.items():
            if isinstance(item, str) and item.startswith(prefix) and kind != src:
                return f"{where}: field 'source' is {src!r}, but the item's id {item!r} is a {kind} item's"
        for name, value in labels:
            if SOURCES.get(value, value) != src:
                return (
                    f"{where}: field 'source' is {src!r}, the manifest's {name} is {value!r}: the manifest "
                    "labels the items as other data than they are"
                )
    prov = _table(run.manifest.get("items_provenance"))
    data = _table(_table(run.manifest.get("pairing_inputs")).get("workload_data"))
    if "items_sha256" in prov and "items_sha256" in data and prov["items_sha256"] != data["items_sha256"]:
        return (
            f"{run.path / 'manifest.json'}: field 'items_provenance.items_sha256' is "
            f"{str(prov['items_sha256'])[:16]}..., "
            f"the pairing inputs' workload_data.items_sha256 is {str(data['items_sha256'])[:16]}..."
        )
    return split_problem(run)
