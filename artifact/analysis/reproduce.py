"""Does another machine (another build, another GPU) reproduce these records bit for bit?

`./run.sh compare A B` with two results directories pairs their runs by identity (configuration, plan, arm, run)
and compares every request record exactly: generated token ids, `cache_n` (prompt tokens served from cache),
top-2 log-probabilities and the prompt's sha256. Unlike the paper's comparisons, it does not require equal pairing
fingerprints: runs of two builds of the same engine are exactly what it is for. It says how the two sides differ
in what produced them (engine build, the server binary's and libraries' sha256, GPU, driver, host, CUDA MPS),
so a reviewer can tell "same build, same records" from "another build, same records" from "another build, other
records".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from artifact.records.store import Run, find_runs

FIELDS = ("output_tokens", "cache_n", "top_logprobs", "prompt_sha256")


@dataclass
class RunIdentity:
    label: str
    requests: tuple[int, int]
    identical: dict  # field -> requests (of the matched ones) whose field is equal
    matched: int
    first_difference: str | None  # "episode E request I: field F" (the first in episode order)
    provenance: list[str] = field(default_factory=list)  # how the two sides differ in what produced them

    @property
    def exact(self) -> bool:
        return (self.requests[0] == self.requests[1] == self.matched
                and all(v == self.matched for v in self.identical.values()))


def _key(r: dict) -> tuple:
    return dict.get(r, "episode_id"), dict.get(r, "request_index")


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
        out.append(f"{len(differ)} of {len(stems)} binaries and libraries differ in sha256 ({', '.join(differ[:5])}"
                   f"{', ...' if len(differ) > 5 else ''}): a different build")
    ha, hb = ma.get("host") or {}, mb.get("host") or {}
    for key, what in (("gpus", "GPU/driver"), ("cpu", "CPU"), ("os", "OS"), ("hostname_sha256", "host"),
                      ("cuda_mps", "CUDA MPS")):
        if ha.get(key) != hb.get(key):
            out.append(f"{what}: {ha.get(key)!r} vs {hb.get(key)!r}")
    # machine identity and GPU sharing, where both records carry them (older records do not)
    for key, what in (("machine_id_sha256", "machine-id"), ("boot_id_sha256", "boot"),
                      ("gpu_uuid_sha256", "GPU UUID")):
        if key in ha and key in hb and ha[key] != hb[key]:
            out.append(f"{what} (digest): {ha[key]!r} vs {hb[key]!r}")
    sa, sb = (tuple((h.get("gpu_sharing") or {}).get(k) for k in ("mode", "jobs_per_gpu")) for h in (ha, hb))
    if "gpu_sharing" in ha and "gpu_sharing" in hb and sa != sb:
        out.append(f"GPU sharing: {'/'.join(map(str, sa))} vs {'/'.join(map(str, sb))}")
    if ma.get("pairing_fingerprint") != mb.get("pairing_fingerprint"):
        out.append(f"pairing fingerprints differ ({ma.get('pairing_fingerprint')} vs {mb.get('pairing_fingerprint')})")
    return out


def compare_records(a: Run, b: Run) -> RunIdentity:
    rb = {_key(r): r for r in b.requests}
    identical = {f: 0 for f in FIELDS}
    matched, first = 0, None
    for r in sorted(a.requests, key=lambda r: (a.manifest["episodes"].index(dict.get(r, "episode_id"))
                                               if dict.get(r, "episode_id") in a.manifest["episodes"] else 1 << 30,
                                               dict.get(r, "request_index") or 0)):
        other = rb.get(_key(r))
        if other is None:
            first = first or f"episode {_key(r)[0]} request {_key(r)[1]}: only in {a.label}"
            continue
        matched += 1
        for f in FIELDS:
            if r.get(f) == other.get(f):
                identical[f] += 1
            elif first is None:
                first = f"episode {_key(r)[0]} request {_key(r)[1]}: {f}"
    if first is None and len(b.requests) > matched:
        first = f"{len(b.requests) - matched} request(s) only in {b.label}"
    return RunIdentity(a.label, (len(a.requests), len(b.requests)), identical, matched, first,
                       provenance_differences(a, b))


def identity_of(run: Run) -> tuple:
    m = run.manifest
    return m["config"], m["plan"], m["arm"], m["run"]


def compare_results(dir_a: Path, dir_b: Path) -> tuple[list[RunIdentity], list[str], list[str]]:
    """(the matched runs' comparisons, run labels only under A, only under B)."""
    a = {identity_of(r): r for r in find_runs(dir_a)}
    b = {identity_of(r): r for r in find_runs(dir_b)}
    both = [k for k in a if k in b]
    return ([compare_records(a[k], b[k]) for k in both], [a[k].label for k in a if k not in b],
            [b[k].label for k in b if k not in a])


def render(results: list[RunIdentity], only_a: list[str], only_b: list[str]) -> str:
    lines = []
    for r in results:
        verdict = "IDENTICAL" if r.exact else "DIFFERENT"
        counts = ", ".join(f"{f} {n}/{r.matched}" for f, n in r.identical.items())
        lines.append(f"{verdict:9}  {r.label}: requests {r.requests[0]} vs {r.requests[1]}; equal {counts}"
                     + ("" if r.exact else f"; first difference: {r.first_difference}"))
    provenance = sorted({p for r in results for p in r.provenance})
    if provenance:
        lines.append("what produced them differs: " + "; ".join(provenance))
    elif results:
        lines.append("what produced them: the same (engine build, binary and library hashes, GPU, host)")
    for which, labels in (("first", only_a), ("second", only_b)):
        if labels:
            lines.append(f"{len(labels)} run(s) only in the {which}, not compared ({', '.join(labels[:3])}"
                         f"{', ...' if len(labels) > 3 else ''})")
    exact = sum(r.exact for r in results)
    lines.append(f"{exact} of {len(results)} matched runs identical request by request "
                 f"({sum(r.matched for r in results)} requests compared)")
    return "\n".join(lines)
