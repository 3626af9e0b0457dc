"""An evidence folder's summary, made from its records and its check outputs only: `./run.sh evidence-summary`.

Every number the documentation quotes about the committed evidence comes from one of these summaries
(`evidence/NAME/summary.json`, and `summary.md`, the same facts for a reader). A quoted number is a markdown link
into the folder whose title names the summary's key, e.g. ``[PASS](evidence/h200-agent/summary.md "claims/RQ1")``;
`tests/test_docs_numbers.py` recomputes every summary from the records and holds every such link to it.

What a summary holds: the check's exit code and verdicts (`check/check.json`), each configuration-plan's divergence
counts (`check/tab2.csv`), the cache bridge's counts per configuration (`check/tab3.csv`: identity, divergence,
correct answers, flips each way, McNemar p, power and the items it would need), what check observed in each scope of
a verdict beyond the paper, the agent table (`check/agent.csv`), comparisons written beside the records
(`compare.txt`, `reproduction.txt`: IDENTICAL / DIFFERENT lines), the stage an offline set-up was made from
(`STAGE.json`: files, MiB, transfers), and from the run manifests in `records*.tar.xz`: runs, episodes, requests
(lines of each run's `requests.jsonl`), wall seconds, when the runs started and finished (in all and per
configuration-plan, i.e. per job), and the host: GPU, driver, CPU, container, CUDA MPS, GPU sharing, the runs the
MPS daemon served, network isolation. Nothing in it depends on when or where the summary is made.

One module: the facts a summary holds and the page that shows them are one contract (`render_md` shows what
`summarize` computes, key for key), read top to bottom; the documentation's links name the same keys.
"""

from __future__ import annotations

import csv
import io
import json
import re
import tarfile
from datetime import datetime
from pathlib import Path

from artifact import engines

ARCHIVES = "records*.tar.xz"
LOGS = "logs*.tar.gz"
# lines the session logs end their steps with: `build wall 283.34 s`, `6 done, 0 failed, 0 skipped, in 0:05:31`
WALL_LINE = re.compile(rb"^(\w+) wall ([0-9.]+) s$")
MATRIX_LINE = re.compile(rb"^(\d+) done, (\d+) failed, (\d+) skipped, in (\d+:\d\d:\d\d)$")
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
STAGE = "STAGE.json"
# `./run.sh compare` outputs written beside the records, and the summary key of each: against another folder's
# records (compare.txt), and a second machine's runs against this folder's own (reproduction.txt)
COMPARISONS = (("compare.txt", "compare"), ("reproduction.txt", "reproduction"))
CHECK_SEVERITY = ("FAIL", "INVALID", "INCONCLUSIVE", "OUT-OF-BAND", "PASS", "NOT-RUN")


def _runs(folder: Path) -> list[dict]:
    """Per run (a directory with manifest.json in an archive): its manifest and how many request records it holds."""
    manifests, requests = {}, {}
    for archive in sorted(folder.glob(ARCHIVES)):
        with tarfile.open(archive) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                parent, name = str(Path(member.name).parent), Path(member.name).name
                if name == "manifest.json":
                    manifests[parent] = json.loads(tar.extractfile(member).read())
                elif name == "requests.jsonl":
                    requests[parent] = sum(1 for line in tar.extractfile(member) if line.strip())
    return [{"manifest": m, "requests": requests.get(path, 0)} for path, m in sorted(manifests.items())]


def _log_walls(folder: Path) -> dict:
    """From the session logs in `logs*.tar.gz` (not the servers' or jobs' own logs): each step's `NAME wall S s`
    line (build, train, all) as NAME -> the seconds of each log that states it, and each `./run.sh all` ending
    (`N done, F failed, S skipped, in H:MM:SS`)."""
    walls: dict[str, list[float]] = {}
    matrix: list[str] = []
    for archive in sorted(folder.glob(LOGS)):
        with tarfile.open(archive) as tar:
            for member in tar:
                parts = Path(member.name).parts
                if not member.isfile() or (
                    len(parts) > 2 and parts[-2] == "logs" and parts[-1].startswith(("server-", "native-"))
                ):
                    continue
                seen = set()
                for line in tar.extractfile(member).read().splitlines():
                    line = line.strip()
                    if (m := WALL_LINE.match(line)) and line not in seen:
                        seen.add(line)
                        walls.setdefault(m[1].decode(), []).append(float(m[2]))
                    elif m := MATRIX_LINE.match(line):
                        matrix.append(line.decode())
    # a step repeated in a second log of the same session (pipeline.log repeats train.log's line) counts once
    return {"walls_s": {k: sorted(set(v)) for k, v in sorted(walls.items())}, "matrix": sorted(set(matrix))}


def _distinct(values) -> list:
    out = []
    for v in values:
        if v is not None and v not in out:
            out.append(v)
    return sorted(out, key=lambda v: json.dumps(v, sort_keys=True))


def _elapsed(manifests: list[dict]) -> float | None:
    """Seconds from the first run's start to the last run's finish (runs side by side count once)."""
    starts = [datetime.fromisoformat(m["started_at"]) for m in manifests if m.get("started_at")]
    ends = [datetime.fromisoformat(m["finished_at"]) for m in manifests if m.get("finished_at")]
    return round((max(ends) - min(starts)).total_seconds(), 1) if starts and ends else None


def _by_job(manifests: list[dict]) -> dict[tuple[str, str], list[dict]]:
    jobs: dict[tuple[str, str], list[dict]] = {}
    for m in manifests:
        jobs.setdefault((str(m.get("config")), str(m.get("plan"))), []).append(m)
    return jobs


def _mps_served(manifests: list[dict]) -> str:
    """ "K/N": of the N runs whose manifest records `gpu_mps`, K whose server the MPS daemon listed as its client;
    "not recorded" where none does."""
    recorded = [m["gpu_mps"] for m in manifests if isinstance(m.get("gpu_mps"), dict)]
    return f"{sum(bool(g.get('served')) for g in recorded)}/{len(recorded)}" if recorded else "not recorded"


def _worst(statuses: list[str]) -> str:
    return min(statuses, key=CHECK_SEVERITY.index)


def _int(value: str):
    """A CSV cell as an integer ("3", "3.0"), or "-" where empty."""
    return int(float(value)) if value not in ("", None) else "-"


def _ratio(row: dict, key: str) -> str | None:
    k, n = row.get(f"{key}_k"), row.get(f"{key}_n")
    if k in (None, "") or n in (None, ""):
        return None
    return f"{int(float(k))}/{int(float(n))}"


def summarize(folder: Path) -> dict:
    """The summary of one evidence folder (see the module's docstring)."""
    folder = Path(folder)
    runs = _runs(folder)
    manifests = [r["manifest"] for r in runs]
    hosts = [m.get("host") or {} for m in manifests]
    gpus = _distinct(f"{g.get('name')} (driver {g.get('driver')})" for h in hosts for g in h.get("gpus") or [])
    wall = sum(m.get("wall_s") or 0 for m in manifests)
    summary: dict = {
        "folder": folder.name,
        "runs": len(runs),
        "complete_runs": sum(m.get("status") == "complete" for m in manifests),
        "configs": _distinct(m.get("config") for m in manifests),
        "plans": _distinct(m.get("plan") for m in manifests),
        "episodes": sum(len(m.get("episodes") or []) for m in manifests),
        "requests": sum(r["requests"] for r in runs),
        "wall_s": round(wall, 1),
        "wall_h": round(wall / 3600, 2),
        "started": min((m["started_at"] for m in manifests if m.get("started_at")), default=None),
        "finished": max((m["finished_at"] for m in manifests if m.get("finished_at")), default=None),
        "elapsed_s": _elapsed(manifests),
        "engine_builds": _distinct(m.get("engine_build") for m in manifests),
        # the attention backend each server chose, as its start-up log said (vLLM; none for llama.cpp)
        "attention_backends": _distinct(
            m["attention_backend"]
            + (f" (FlashAttention {v})" if (v := (m.get("attention") or {}).get("flash_attn_version")) else "")
            for m in manifests
            if m.get("attention_backend")
        ),
        "host": {
            "gpus": gpus or ["none"],
            "cpu": _distinct(h.get("cpu") for h in hosts),
            "cpu_count": _distinct(h.get("cpu_count") for h in hosts),
            "container": _distinct(h.get("container") or "none" for h in hosts),
            "cuda_mps": _distinct(h.get("cuda_mps") for h in hosts),
            "gpu_sharing": _distinct(
                (h.get("gpu_sharing") or {}).get("mode")
                if isinstance(h.get("gpu_sharing"), dict)
                else h.get("gpu_sharing")
                for h in hosts
            ),
            # the network as the records show it (engines.network: "loopback-only" only where the server the run
            # talked to was on loopback by its recorded address)
            "network": _distinct(engines.network(m)[0] for m in manifests),
            # CUDA MPS as the control daemon itself said of each run's server (`gpu_mps`, recorded since the
            # daemon's client list is asked): runs it listed as its client, of the runs that carry the record
            "mps_served": _mps_served(manifests),
            # how many GPUs the runs ran on, told apart by their UUIDs' digests (recorded since the machine-identity
            # digests; "not recorded" where no run carries one)
            "distinct_gpus": len(digests)
            if (digests := {d for h in hosts for d in h.get("gpu_uuid_sha256") or []})
            else "not recorded",
        },
        # each configuration-plan (one `./run.sh all` job): its runs and its span, first start to last finish
        "jobs": {
            f"{c}:{p}": {"runs": len(ms), "elapsed_s": _elapsed(ms)}
            for (c, p), ms in sorted(_by_job(manifests).items())
        },
    }
    # the jobs' spans summed: what the jobs took one after another (jobs run one at a time: the time to run them all)
    spans = [j["elapsed_s"] for j in summary["jobs"].values()]
    summary["jobs_elapsed_sum_s"] = round(sum(spans), 1) if spans and None not in spans else None
    logs = _log_walls(folder)
    if logs["walls_s"] or logs["matrix"]:
        summary["logs"] = logs
    check_json = folder / "check" / "check.json"
    if check_json.exists():
        check = json.loads(check_json.read_text(encoding="utf-8"))
        beyond: dict[str, list[str]] = {}
        for v in (check.get("beyond") or {}).get("verdicts") or []:
            beyond.setdefault(v["id"], []).append(v["status"])
        summary["check"] = {
            "exit_code": check.get("exit_code"),
            "runs": check.get("runs"),
            "invalid": len(check.get("invalid") or []),
        }
        summary["claims"] = {c["id"]: c["status"] for c in check.get("claims") or []}
        summary["beyond"] = {k: _worst(v) for k, v in sorted(beyond.items())}
        # every scope of every verdict beyond the paper, with what check observed there (its numbers, as check
        # wrote them): key ID -> scope (its "/" written ":") -> status and observed
        scopes: dict[str, dict] = {}
        for v in (check.get("beyond") or {}).get("verdicts") or []:
            if v["scope"] != "-":
                scopes.setdefault(v["id"], {})[v["scope"].replace("/", ":")] = {
                    "status": v["status"],
                    "observed": v["observed"],
                }
        summary["beyond_scopes"] = scopes
    tab2 = folder / "check" / "tab2.csv"
    if tab2.exists():
        rows = list(csv.DictReader(io.StringIO(tab2.read_text(encoding="utf-8"))))
        summary["divergence"] = {
            f"{r['config']}:{r['plan']}": {
                k: v for k in ("off_rerun", "on_rerun", "on_vs_off") if (v := _ratio(r, k)) is not None
            }
            for r in rows
        }
    tab3 = folder / "check" / "tab3.csv"
    if tab3.exists():  # the cache-bridge table (RQ5): per configuration and pooled, counts as check wrote them
        rows = list(csv.DictReader(io.StringIO(tab3.read_text(encoding="utf-8"))))
        summary["bridge"] = {
            r["config"]: {
                "data": r["data"],
                "items": _int(r["n"]),
                "cold_identical": f"{_int(r['cold_identical'])}/{_int(r['n'])}",
                "warm_identical": f"{_int(r['warm_identical'])}/{_int(r['n'])}",
                "cold_warm_diverged": f"{_int(r['cold_warm_diverged'])}/{_int(r['n'])}",
                "correct_recompute": f"{_int(r['cold_numeric_correct'])}/{_int(r['n'])}",
                "correct_cache": f"{_int(r['warm_numeric_correct'])}/{_int(r['n'])}",
                "flips_to_cache": _int(r["flips_numeric_cache"]),
                "flips_to_recompute": _int(r["flips_numeric_recompute"]),
                "mcnemar_p": round(float(r["mcnemar_p"]), 2) if r.get("mcnemar_p") else None,
                "power_1pp": round(float(r["power_1pp"]), 2) if r.get("power_1pp") else None,
                "items_for_power_1pp": _int(r["items_for_power_1pp"]) if r.get("items_for_power_1pp") else None,
                "truncated": _int(r["truncated"]),
            }
            for r in rows
        }
    mitigation = folder / "check" / "mitigation.csv"
    if mitigation.exists():  # a mitigation plan's price: its times over plan main's (same configuration and episodes)
        rows = list(csv.DictReader(io.StringIO(mitigation.read_text(encoding="utf-8"))))
        costs = {
            f"{r['config']}:{r['plan']}": {k: round(float(r[k]), 2) for k in MITIGATION_COSTS if r.get(k)}
            for r in rows
            if r.get("server_overrides")
        }
        if any(costs.values()):  # where check set a price (only against a main plan with the same episodes)
            summary["mitigation"] = {k: v for k, v in costs.items() if v}
    agent = folder / "check" / "agent.csv"
    if agent.exists():  # the agent workload's per-run table: does the model act as an agent
        rows = list(csv.DictReader(io.StringIO(agent.read_text(encoding="utf-8"))))
        summary["agent"] = {
            f"{r['config']}:{r['plan']}:{r['arm']}{r['run']}": {
                "with_tool_call": f"{_int(r['episodes_with_tool_call'])}/{_int(r['episodes'])}",
                "calls": _int(r["calls_executed"]),
                # executed is not worked: the calls whose result was an error, and the episodes with one that was not
                **(
                    {
                        "calls_returned_error": _int(r["calls_returned_error"]),
                        "calls_raised": _int(r["calls_raised"]),
                        "with_successful_call": f"{_int(r['episodes_with_successful_call'])}/{_int(r['episodes'])}",
                    }
                    if r.get("calls_returned_error")
                    else {}
                ),
                "requests_per_episode": round(float(r["requests_per_episode"] or "nan"), 2),
                # the workload's own checker's count of valid episodes (its column: WORKLOAD_valid)
                "valid": f"{_int(next((v for k, v in r.items() if k.endswith('_valid')), ''))}/{_int(r['episodes'])}",
            }
            for r in rows
        }
    stage = folder / STAGE
    if stage.exists():  # the offline set-up's stage (scripts/stage-device.py): what was carried to the host, and how
        st = json.loads(stage.read_text(encoding="utf-8"))
        calls = st.get("calls") or []
        summary["stage"] = {
            "files": len(st.get("files") or []),
            "total_mib": st.get("total_mib"),
            "transfers": len(calls),
            "largest_transfer_mib": max((c["mib"] for c in calls), default=None),
            "carried_mib": st.get("carried_mib"),
            "limit_mib": st.get("limit_mib"),
        }
    for name, key in COMPARISONS:
        compare = folder / name
        if compare.exists():
            words = [line.split()[0] for line in compare.read_text(encoding="utf-8").splitlines() if line.strip()]
            summary[key] = {w.lower(): words.count(w) for w in sorted(set(words)) if w.isupper()}
    return summary


MITIGATION_COSTS = ("on_prompt_ms_vs_main", "on_wall_s_vs_main", "off_prompt_ms_vs_main", "off_wall_s_vs_main")


def render_md(s: dict) -> str:
    """summary.json's facts for a reader (made from it; never edited by hand)."""
    h = s["host"]
    lines = [
        f"# Evidence summary: `{s['folder']}`",
        "",
        f"Made by `./run.sh evidence-summary evidence/{s['folder']}` from the records and the check outputs",
        "in this folder; do not edit (summary.json holds the same facts).",
        "",
        "| fact | value |",
        "|---|---|",
        f"| runs (complete) | {s['runs']} ({s['complete_runs']}) |",
        f"| configurations | {', '.join(s['configs'])} |",
        f"| plans | {', '.join(s['plans'])} |",
        f"| episodes, requests | {s['episodes']}, {s['requests']} |",
        f"| wall time of the runs, summed | {s['wall_s']} s ({s['wall_h']} h) |",
        f"| first start to last finish | {s['elapsed_s']} s |",
        f"| first start, last finish | {s['started']}, {s['finished']} |",
        f"| engine builds | {', '.join(s['engine_builds'])} |",
        *(
            [f"| attention backends (the servers' start-up logs) | {', '.join(s['attention_backends'])} |"]
            if s.get("attention_backends")
            else []
        ),
        f"| GPUs | {', '.join(h['gpus'])} |",
        f"| CPU (cores) | {', '.join(map(str, h['cpu']))} ({', '.join(map(str, h['cpu_count']))}) |",
        f"| container; CUDA MPS; GPU sharing | {', '.join(map(str, h['container']))}; "
        f"{', '.join(map(str, h['cuda_mps'])) or 'not recorded'}; "
        f"{', '.join(map(str, h['gpu_sharing'])) or 'not recorded'} |",
        f"| runs served through CUDA MPS (the daemon's client list) | {h['mps_served']} |",
        f"| distinct GPUs (by their UUIDs' digests) | {h['distinct_gpus']} |",
        f"| network of the runs | {', '.join(h['network'])} |",
    ]
    if "check" in s:
        c = s["check"]
        lines += [
            f"| check: exit code, runs, invalid | {c['exit_code']}, {c['runs']}, {c['invalid']} |",
            "",
            "| claim | verdict |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v} |" for k, v in s["claims"].items()]
        if s.get("beyond"):
            lines += ["", "| beyond the paper | verdict (most severe scope) |", "|---|---|"]
            lines += [f"| {k} | {v} |" for k, v in s["beyond"].items()]
    if s.get("beyond_scopes"):
        lines += ["", "Beyond the paper, per scope (what check observed):", ""]
        lines += [
            f"- {k} {scope}: {v['status']}; {v['observed']}"
            for k, per in s["beyond_scopes"].items()
            for scope, v in per.items()
        ]
    if s.get("divergence"):
        lines += ["", "| configuration:plan | OFF rerun | ON rerun | ON vs OFF |", "|---|---|---|---|"]
        lines += [
            f"| {k} | {v.get('off_rerun', '-')} | {v.get('on_rerun', '-')} | {v.get('on_vs_off', '-')} |"
            for k, v in s["divergence"].items()
        ]
    if s.get("bridge"):
        lines += [
            "",
            "| cache bridge (Tab. 3) | data | cold 1 = cold 2 | warm 1 = warm 2 | cold vs warm diverged "
            "| correct: recompute | correct: cache | flips to cache | flips to recompute | McNemar p | power (1 pp) "
            "| cold 1 and warm 1 servings at the token cap |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {k} | {v['data']} | {v['cold_identical']} | {v['warm_identical']} | {v['cold_warm_diverged']} | "
            f"{v['correct_recompute']} | {v['correct_cache']} | {v['flips_to_cache']} | {v['flips_to_recompute']} | "
            f"{'-' if v['mcnemar_p'] is None else v['mcnemar_p']} | {'-' if v['power_1pp'] is None else v['power_1pp']} "
            f"| {v['truncated']} |"
            for k, v in s["bridge"].items()
        ]
    if s.get("mitigation"):
        lines += [
            "",
            "| mitigation plan | ON prompt time | ON wall | OFF prompt time | OFF wall |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {k} | " + " | ".join(f"{v[c]}x plan main's" if c in v else "-" for c in MITIGATION_COSTS) + " |"
            for k, v in s["mitigation"].items()
        ]
    if s.get("jobs"):
        lines += ["", "| job (configuration:plan) | runs | first start to last finish |", "|---|---|---|"]
        lines += [f"| {k} | {v['runs']} | {v['elapsed_s']} s |" for k, v in s["jobs"].items()]
        if s.get("jobs_elapsed_sum_s") is not None:
            lines += [
                f"| the jobs' spans, summed | {sum(v['runs'] for v in s['jobs'].values())} | "
                f"{s['jobs_elapsed_sum_s']} s |"
            ]
    if s.get("logs"):
        walls = "; ".join(f"{k} {', '.join(f'{x} s' for x in v)}" for k, v in s["logs"]["walls_s"].items())
        lines += [
            "",
            f"Session logs: {walls or 'no step times'}"
            + (f"; ./run.sh all: {'; '.join(s['logs']['matrix'])}" if s["logs"]["matrix"] else "")
            + ".",
        ]
    if s.get("agent"):
        lines += [
            "",
            "| run | episodes with a call executed | calls executed | of them returned an error (could not run) "
            "| episodes with a call that returned no error | requests / episode | valid (the workload's checker) |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {k} | {v['with_tool_call']} | {v['calls']} | "
            + (
                f"{v['calls_returned_error']} ({v['calls_raised']}) | {v['with_successful_call']}"
                if "calls_returned_error" in v
                else "not recorded | not recorded"
            )
            + f" | {v['requests_per_episode']} | {v['valid']} |"
            for k, v in s["agent"].items()
        ]
    if s.get("stage"):
        st = s["stage"]
        lines += [
            "",
            f"{STAGE}: {st['files']} files, {st['total_mib']} MiB, carried in {st['transfers']} transfers of "
            f"at most {st['largest_transfer_mib']} MiB beside the repository's {st['carried_mib']} MiB (limit "
            f"{st['limit_mib']} MiB per transfer).",
        ]
    for name, key in COMPARISONS:
        if s.get(key):
            lines += ["", f"{name}: " + ", ".join(f"{v} {k}" for k, v in s[key].items())]
    return "\n".join(lines) + "\n"


def outputs(folder: Path) -> dict[str, str]:
    """File name -> content of the summary files of `folder`."""
    s = summarize(folder)
    return {SUMMARY_JSON: json.dumps(s, indent=1, ensure_ascii=False) + "\n", SUMMARY_MD: render_md(s)}


def lookup(summary: dict, key: str):
    """The value at `key` ("claims/RQ1", "divergence/CONFIG:PLAN/on_vs_off", "host/gpus/0"); KeyError if none."""
    value = summary
    for part in key.split("/"):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def main(folders: list[str], check_only: bool = False) -> int:
    """Write (or with check_only, compare) each folder's summary; 1 when a committed summary is out of date."""
    stale = 0
    for name in folders:
        folder = Path(name)
        for fname, text in outputs(folder).items():
            path = folder / fname
            if check_only:
                if not path.exists() or path.read_text(encoding="utf-8") != text:
                    print(f"out of date: {path} (./run.sh evidence-summary {folder})")
                    stale = 1
            elif not path.exists() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path}")
    return stale
