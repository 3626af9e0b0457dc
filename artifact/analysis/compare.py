"""Are two runs' records the same outcome? `./run.sh compare A B`, field by field.

Two run directories are compared with each other; two results directories pair their runs by identity
(configuration, plan, arm, run) and compare each pair (does another machine, another build, reproduce these
records?). Unlike the paper's comparisons it does not require equal pairing fingerprints: runs of two builds of the
same engine are what it is for; it says how the two sides differ in what produced them (engine build, the server
binary's and libraries' sha256, GPU, driver, host, CUDA MPS).

What is compared: every field of every request record (matched by episode and request_index) and of every episode
record (matched by episode), and the manifest's list of episodes: the generated token ids (as integers: 75 and
75.0 are not the same value), the text, the cache counts, the log-probabilities, the prompts, and each episode's
calls, results and verdict; a workload's own fields too (the GSM8K servings). Values are equal only as JSON values
of the same type. Timing fields (TIMING) are different by design on every rerun: they are listed, never compared.
A request field that names the server that answered (PRODUCER: the OpenAI-style `system_fingerprint`, the server's
build label) says what produced the record, not what it is: a difference is reported with the engine build.
Each side is validated first through the one records schema (`check`'s `check_records`: a malformed record is an
error, exit 2) and for being whole (an incomplete run, or one not whole, is INVALID).

    compare_records(a, b)        RunDiff: the differing fields, each with its first differing episode and position
    compare_results(dir_a, dir_b)
    render(diffs, only_a, only_b)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from artifact.records.store import EPISODES, MANIFEST, REQUESTS, Run

# Fields whose values differ on every rerun by design (server and wall times): reported, not compared.
TIMING = {
    REQUESTS: ("prompt_ms", "predicted_ms", "engine_extra.wall_ms"),
    EPISODES: (),
    MANIFEST: ("started_at", "finished_at", "wall_s"),
}
MANIFEST_OUTCOME = ("episodes",)  # the manifest's part of the outcome (the rest says what produced it)
# Request fields that name the server that answered (its build label): what produced a record, not its outcome.
PRODUCER = {REQUESTS: ("engine_extra.system_fingerprint",), EPISODES: (), MANIFEST: ()}
_MISSING = object()


def same(x, y) -> bool:
    """Equal as JSON values of the same types (1 is not 1.0, nor true; NaN equals NaN)."""
    if type(x) is not type(y):
        return False
    if isinstance(x, list):
        return len(x) == len(y) and all(map(same, x, y))
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, float) and math.isnan(x):
        return math.isnan(y)
    return x == y


def first_position(x, y) -> int | None:
    """The first index at which two lists (or two texts) differ (the shorter one's length where one is the other's
    prefix)."""
    if isinstance(x, str) and isinstance(y, str):
        n = len(os.path.commonprefix([x, y]))
        return n if x != y and n else None  # (texts that differ from the start are shown whole)
    if not (isinstance(x, list) and isinstance(y, list)):
        return None
    for i, (u, v) in enumerate(zip(x, y)):
        if not same(u, v):
            return i
    return min(len(x), len(y)) if len(x) != len(y) else None


def _show(v) -> str:
    text = "(missing)" if v is _MISSING else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class FieldDiff:
    file: str  # requests.jsonl, episodes.jsonl or manifest.json
    name: str  # the field, dotted into engine_extra
    differ: int  # matched records whose field differs
    of: int  # matched records
    first: str  # where it first differs, with both values


@dataclass
class RunDiff:
    label: str  # "A vs B"
    requests: tuple[int, int]
    episodes: tuple[int, int]
    fields: list[FieldDiff] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # records on one side only (the first of each kind)
    timing: list[str] = field(default_factory=list)  # timing fields present, not compared
    provenance: list[str] = field(default_factory=list)  # how the two sides differ in what produced them
    # what of that is not recorded on both sides (so neither the same nor different is shown: `provenance_unknown`)
    unknown: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.fields and not self.unmatched


def _flat(rec: dict, file: str) -> dict:
    """A record's fields, engine_extra's spread out ("engine_extra.x"), timing fields left out."""
    out = {}
    keys = list(rec) + (["top_logprobs"] if "top_logprobs" in rec and "top_logprobs" not in dict.keys(rec) else [])
    for k in keys:  # (a LazyRecord holds top_logprobs as text until asked: `in` and `get` see it)
        v = rec.get(k)
        if k == "engine_extra" and isinstance(v, dict):
            out.update({f"engine_extra.{x}": y for x, y in v.items()})
        else:
            out[k] = v
    return {k: v for k, v in out.items() if k not in TIMING[file] and k not in PRODUCER[file]}


def _timing_present(records: list[dict], file: str) -> set[str]:
    present = set()
    for rec in records:
        for name in TIMING[file]:
            head, _, tail = name.partition(".")
            if (tail and isinstance(rec.get(head), dict) and tail in rec[head]) or (not tail and head in rec):
                present.add(name)
    return present


def _order(run: Run):
    pos = {e: i for i, e in enumerate(run.manifest["episodes"])}
    return lambda key: (pos.get(key[0], len(pos)), str(key[0]), key[1] if isinstance(key[1], int) else -1)


def _compare(file: str, a: dict, b: dict, order, where, diffs: dict) -> None:
    """Compare matched records (key -> record on each side) field by field, in `order`."""
    for key in sorted(set(a) & set(b), key=order):
        fa, fb = _flat(a[key], file), _flat(b[key], file)
        for name in list(dict.fromkeys([*fa, *fb])):
            va, vb = fa.get(name, _MISSING), fb.get(name, _MISSING)
            if va is not _MISSING and vb is not _MISSING and same(va, vb):
                continue
            d = diffs.setdefault((file, name), [0, None])
            d[0] += 1
            if d[1] is None:
                pos = first_position(va, vb)
                at = f", position {pos}" if pos is not None else ""
                if pos is not None and isinstance(va, str):  # texts: from the first differing character
                    shown = (va[pos : pos + 40], vb[pos : pos + 40])
                elif pos is not None:
                    shown = (va[pos] if pos < len(va) else _MISSING, vb[pos] if pos < len(vb) else _MISSING)
                else:
                    shown = (va, vb)
                d[1] = f"{where(key)}{at} (A: {_show(shown[0])}, B: {_show(shown[1])})"


def compare_records(a: Run, b: Run) -> RunDiff:
    """Every outcome field of two runs' records (see the module's doc)."""
    diff = RunDiff(
        a.label if a.label == b.label else f"{a.label} vs {b.label}",
        (len(a.requests), len(b.requests)),
        (len(a.episodes), len(b.episodes)),
    )
    ra = {(r.get("episode_id"), r.get("request_index")): r for r in a.requests}
    rb = {(r.get("episode_id"), r.get("request_index")): r for r in b.requests}
    ea = {e.get("episode_id"): e for e in a.episodes}
    eb = {e.get("episode_id"): e for e in b.episodes}
    order = _order(a)
    diffs: dict = {}
    _compare(REQUESTS, ra, rb, order, lambda k: f"episode {k[0]}, request {k[1]}", diffs)
    _compare(
        EPISODES,
        {(k, 0): v for k, v in ea.items()},
        {(k, 0): v for k, v in eb.items()},
        order,
        lambda k: f"episode {k[0]}",
        diffs,
    )
    for name in MANIFEST_OUTCOME:
        va, vb = a.manifest.get(name, _MISSING), b.manifest.get(name, _MISSING)
        if not (va is not _MISSING and vb is not _MISSING and same(va, vb)):
            pos = first_position(va, vb)
            diffs[(MANIFEST, name)] = [1, f"position {pos}" if pos is not None else f"(A: {_show(va)}, B: {_show(vb)})"]
    counts = {REQUESTS: len(set(ra) & set(rb)), EPISODES: len(set(ea) & set(eb)), MANIFEST: 1}
    for (file, name), (n, first) in diffs.items():
        diff.fields.append(FieldDiff(file, name, n, counts[file], first))
    for what, x, y, show in (
        (REQUESTS, ra, rb, lambda k: f"episode {k[0]} request {k[1]}"),
        (EPISODES, ea, eb, lambda k: f"episode {k}"),
    ):
        for side, mine, other in (("A", x, y), ("B", y, x)):
            only = [k for k in mine if k not in other]
            if only:
                diff.unmatched.append(f"{len(only)} {what} record(s) only in {side} (first: {show(only[0])})")
    diff.timing = sorted(
        f"{name} ({file})"
        for file, recs in ((REQUESTS, a.requests + b.requests), (MANIFEST, [a.manifest, b.manifest]))
        for name in _timing_present(recs, file)
    )
    diff.provenance = provenance_differences(a, b)
    for name in PRODUCER[REQUESTS]:
        _, _, key = name.partition(".")
        seen = [
            sorted(
                {
                    str((r.get("engine_extra") or {}).get(key))
                    for r in run.requests
                    if key in (r.get("engine_extra") or {})
                }
            )
            for run in (a, b)
        ]
        if seen[0] != seen[1]:
            diff.provenance.append(f"requests' {key}: {', '.join(seen[0]) or 'none'} vs {', '.join(seen[1]) or 'none'}")
    diff.unknown = provenance_unknown(a, b)
    return diff


# What the host records say of the machine; each is compared only where both sides recorded it ("the same
# host" was said where the machine, boot and GPU digests were missing).
HOST_FACTS = (
    ("gpus", "GPU/driver"),
    ("cpu", "CPU"),
    ("os", "OS"),
    ("hostname_sha256", "host name (digest)"),
    ("cuda_mps", "CUDA MPS"),
)
MACHINE_DIGESTS = (("machine_id_sha256", "machine-id"), ("boot_id_sha256", "boot"), ("gpu_uuid_sha256", "GPU UUID"))


def provenance_unknown(a: Run, b: Run) -> list[str]:
    """What produced the runs that is not recorded on both sides: engine build, binary sha256, and each host fact
    and machine digest (`HOST_FACTS`, `MACHINE_DIGESTS`) one side lacks (or records as null)."""
    ma, mb = a.manifest, b.manifest
    ha, hb = ma.get("host") or {}, mb.get("host") or {}
    out = [
        what
        for present, what in (
            (ma.get("engine_build") and mb.get("engine_build"), "engine build"),
            ((ma.get("binary") or {}).get("sha256") and (mb.get("binary") or {}).get("sha256"), "server binary sha256"),
        )
        if not present
    ]
    out += [what for key, what in HOST_FACTS + MACHINE_DIGESTS if ha.get(key) is None or hb.get(key) is None]
    return out


def same_provenance_line(diffs: list[RunDiff]) -> str:
    """What `render` says where nothing recorded differs: only what both sides recorded is said to be the same; what
    one side lacks is named as unknown (the same machine is said only where its digests are recorded and equal)."""
    unknown = sorted({u for d in diffs for u in d.unknown})
    known = [
        w
        for w in ("engine build", "server binary sha256", *(w for _, w in HOST_FACTS + MACHINE_DIGESTS))
        if w not in unknown
    ]
    line = f"what produced them, where both sides recorded it: the same ({', '.join(known) or 'nothing recorded'})"
    if unknown:
        line += f"; not recorded on both sides, so not shown to be the same: {', '.join(unknown)}"
    machine = [w for _, w in MACHINE_DIGESTS]
    if any(w in unknown for w in machine):
        line += " (whether the runs ran on the same machine is not known)"
    return line


def provenance_differences(a: Run, b: Run) -> list[str]:
    ma, mb = a.manifest, b.manifest
    out = []
    if ma.get("engine_build") != mb.get("engine_build"):
        out.append(f"engine build {ma.get('engine_build')} vs {mb.get('engine_build')}")
    ba, bb = ma.get("binary") or {}, mb.get("binary") or {}
    if ba.get("sha256") != bb.get("sha256"):
        out.append("server binary sha256 differs")
    fa, fb = ba.get("files") or {}, bb.get("files") or {}
    stems = sorted({n.split(".so")[0] for n in set(fa) | set(fb)})  # a library once, not per symlink name

    def digests(files, stem):
        return sorted(v for n, v in files.items() if n.split(".so")[0] == stem)

    differ = [s for s in stems if digests(fa, s) != digests(fb, s)]
    if differ:
        out.append(
            f"{len(differ)} of {len(stems)} binaries and libraries differ in sha256 ({', '.join(differ[:5])}"
            f"{', ...' if len(differ) > 5 else ''}): a different build"
        )
    ha, hb = ma.get("host") or {}, mb.get("host") or {}
    for key, what in (
        ("gpus", "GPU/driver"),
        ("cpu", "CPU"),
        ("os", "OS"),
        ("hostname_sha256", "host"),
        ("cuda_mps", "CUDA MPS"),
    ):  # HOST_FACTS (the names as these lines have always said them)
        if ha.get(key) != hb.get(key):
            out.append(f"{what}: {ha.get(key)!r} vs {hb.get(key)!r}")
    # machine identity and GPU sharing, where both records carry them (older records do not)
    for key, what in (("machine_id_sha256", "machine-id"), ("boot_id_sha256", "boot"), ("gpu_uuid_sha256", "GPU UUID")):
        if key in ha and key in hb and ha[key] != hb[key]:
            out.append(f"{what} (digest): {ha[key]!r} vs {hb[key]!r}")
    sa, sb = (tuple((h.get("gpu_sharing") or {}).get(k) for k in ("mode", "jobs_per_gpu")) for h in (ha, hb))
    if "gpu_sharing" in ha and "gpu_sharing" in hb and sa != sb:
        out.append(f"GPU sharing: {'/'.join(map(str, sa))} vs {'/'.join(map(str, sb))}")
    if ma.get("pairing_fingerprint") != mb.get("pairing_fingerprint"):
        out.append(f"pairing fingerprints differ ({ma.get('pairing_fingerprint')} vs {mb.get('pairing_fingerprint')})")
    return out


def identity_of(run: Run) -> tuple:
    m = run.manifest
    return m["config"], m["plan"], m["arm"], m["run"]


def compare_results(
    runs_a: list[Run], runs_b: list[Run]
) -> tuple[list[tuple[Run, Run, RunDiff]], list[str], list[str]]:
    """(each matched pair and its diff, run labels only under A, only under B)."""
    a = {identity_of(r): r for r in runs_a}
    b = {identity_of(r): r for r in runs_b}
    both = [k for k in a if k in b]
    return (
        [(a[k], b[k], compare_records(a[k], b[k])) for k in both],
        [a[k].label for k in a if k not in b],
        [b[k].label for k in b if k not in a],
    )


def render_diff(d: RunDiff) -> list[str]:
    verdict = "IDENTICAL" if d.exact else "DIFFERENT"
    lines = [
        f"{verdict:9}  {d.label}: {d.requests[0]} vs {d.requests[1]} requests, {d.episodes[0]} vs "
        f"{d.episodes[1]} episodes"
    ]
    for f in d.fields:
        what = "records" if f.file == MANIFEST else f.file.split(".")[0]
        lines.append(f"  {f.file} field '{f.name}' differs in {f.differ} of {f.of} {what}; first: {f.first}")
    lines += [f"  {u}" for u in d.unmatched]
    return lines


def render(diffs: list[RunDiff], only_a: list[str], only_b: list[str]) -> str:
    lines = [line for d in diffs for line in render_diff(d)]
    timing = sorted({t for d in diffs for t in d.timing})
    if timing:
        lines.append(f"timing fields, different by design, not compared: {', '.join(timing)}")
    provenance = sorted({p for d in diffs for p in d.provenance})
    if provenance:
        lines.append("what produced them differs: " + "; ".join(provenance))
    elif diffs:
        lines.append(same_provenance_line(diffs))
    for which, labels in (("first", only_a), ("second", only_b)):
        if labels:
            lines.append(
                f"{len(labels)} run(s) only in the {which}, not compared ({', '.join(labels[:3])}"
                f"{', ...' if len(labels) > 3 else ''})"
            )
    exact = sum(d.exact for d in diffs)
    lines.append(
        f"{exact} of {len(diffs)} compared run pair(s) identical in every outcome field "
        f"({sum(min(d.requests) for d in diffs)} requests compared)"
    )
    return "\n".join(lines)
