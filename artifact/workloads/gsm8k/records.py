"""Where a bridge run's items came from, read from each item's own record (`./run.sh check`, Tab. 3's `data`).

Every item record (episodes.jsonl) names its `source` ("synthetic": this artifact's generator; "gsm8k": the pinned
test split) and carries an id of that source's form (`synthetic_0000`, `gsm8k_test_0000`: data.py). The manifest
says it again, in several places: `data`, `items_source`, `items_provenance` (source, data, synthetic) and the
workload settings (`gsm8k_source`, also in the pairing inputs). All must name the items' own source; a label that
does not is a record that contradicts itself.
"""

from __future__ import annotations

from artifact.records.store import EPISODES, Run

SOURCES = {"synthetic": "synthetic", "gsm8k": "gsm8k", "hub": "gsm8k"}  # a label -> the source it names
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
    return None
