"""Command line: `python -m artifact COMMAND` (run.sh sets up the environment and calls this).

One module: the command line, each command's function beside the parser that lists them all, so that what a user can
run reads in one place; what a command does lives in the package it calls, and the helpers here serve only these
commands (the demo's time table, an evidence folder unpacked for check).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from pathlib import Path

from artifact.config import REPO
from artifact.errors import ArtifactError

DEMO_FILE = REPO / "configs" / "demo.toml"  # what the demo runs: configurations, plans, which option counts them
DEFAULT_RESULTS = REPO / "results"
# Set by run.sh (and the images) for the commands they start: the environment is set up and, for a protocol run, its
# own (an empty environment plus an allowlist, loopback only: scripts/isolate.sh). Invoked otherwise (the console
# script `prefix-cache-artifact`), the commands that set up, build or run the protocol hand over to run.sh, which
# sets up and isolates; those that only read records run here.
SET_UP_ENV = "ARTIFACT_SET_UP"
HANDED_TO_RUN_SH = ("setup", "test", "bench", "demo", "run", "all")
# The committed GPU evidence the demo re-checks beside its own run (80 episodes per run; the demo's 2 cannot make
# RQ2 significant).
DEMO_EVIDENCE = REPO / "evidence" / "h200-agent"

EPILOG = """\
commands:
  demo      the paired protocol on the embedded CPU default (SmolLM2-135M, llama-server b10434), then a summary;
            demo --vllm: the same on vLLM 0.11.0's CPU build (RQ4)
  run       one configuration's protocol:  run CONFIG [--plan main] [--episodes N] [--turns N] [--steps N]
            [--n-predict N] [--startup-timeout S] [--request-timeout S] [--results DIR] [--dry-run]
            [--engine-setting KEY=VALUE ...]  (an engine's settings; e.g. the URLs of servers you run yourself,
            docs/own-server.md)
  compare   two runs field by field:       compare RUN_DIR_A RUN_DIR_B; two results directories (another
            machine's runs of the same configurations): compare RESULTS_A RESULTS_B (exit codes: compare --help)
  summary   the paired-protocol table of every run under a results directory
  check     judge results against the paper's claims:  check [RESULTS_DIR] [--out DIR]  (report.html, check.json)
  fetch     download and verify pinned weights:  fetch [CONFIG ...]  (default: every configuration `all` runs)
  models    derived models and weights files:  models derive [LEVEL ...] [--pin]  (make or pin a recipe's
            products: artifact/models/derive.py);  models files CONFIG...  (the weights files they need, as JSON)
  all       the paper's configurations in pinned containers over the host's GPUs, then check and the report:
            all [--dry-run] [--configs A,B] [--gpus 0,2] [--cpu]
"""


def engine_settings(pairs: list[str] | None) -> dict:
    """`--engine-setting KEY=VALUE` options as a table over the configuration's [engine.settings]."""
    from artifact.config import parse_setting  # lazy: each command imports only what it runs

    return dict(parse_setting(p) for p in pairs or [])


# run's budget options -> the workload setting each replaces (a workload without that setting refuses the option)
BUDGET_SETTINGS = {"turns": "max_turns", "steps": "max_steps_per_turn"}


def budgeted(cfg, args):
    """The configuration under run's budget options (--turns, --steps, --n-predict, --startup-timeout,
    --request-timeout; --episodes is `execute`'s), each a one-line error where it cannot apply."""
    import dataclasses  # lazy: each command imports only what it runs

    from artifact import workloads  # lazy: each command imports only what it runs
    from artifact.workloads.base import replace_settings  # lazy: each command imports only what it runs

    settings_type = workloads.get(cfg.workload.name).settings_type
    known = {f.name for f in dataclasses.fields(settings_type)} if settings_type else set()
    changes = {}
    for option, key in BUDGET_SETTINGS.items():
        value = getattr(args, option, None)
        if value is None:
            continue
        if value < 1:
            raise ArtifactError(f"--{option} must be >= 1")
        if key not in known:
            raise ArtifactError(f"--{option}: workload {cfg.workload.name} of {cfg.name} has no {key} setting")
        changes[key] = value
    if getattr(args, "n_predict", None) is not None:
        if args.n_predict < 1:
            raise ArtifactError("--n-predict must be >= 1")
        changes["n_predict"] = args.n_predict
    if changes:
        cfg = replace_settings(cfg, **changes)
    engine = {}
    for option, key in (("startup_timeout", "startup_timeout_s"), ("request_timeout", "request_timeout_s")):
        value = getattr(args, option, None)
        if value is not None:
            if value <= 0:
                raise ArtifactError(f"--{option.replace('_', '-')} must be > 0 seconds")
            engine[key] = float(value)
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, **engine)) if engine else cfg


def execute(
    config: str,
    plan_name: str | None,
    episodes: int | None,
    results: Path,
    settings: list[str] | None = None,
    args=None,
) -> list[Path]:
    """Run (or resume) one configuration's protocol under a plan (default: its workload's); `args`: run's budget
    options (`budgeted`)."""
    from artifact import workloads  # lazy: each command imports only what it runs
    from artifact.catalog import load_config, load_plan
    from artifact.protocol.runner import execute_plan, with_episodes

    cfg = budgeted(with_episodes(load_config(config, engine_settings(settings)), episodes), args)
    return execute_plan(cfg, load_plan(plan_name or workloads.get(cfg.workload.name).default_plan), results)


def dry_run(args) -> int:
    """`run --dry-run`: what the configuration's engine says of its servers and the budget before anything runs
    (Engine.dry_run; an engine that starts its own server: `./run.sh all --dry-run`)."""
    from artifact import engines, workloads  # lazy: each command imports only what it runs
    from artifact.catalog import load_config, load_plan
    from artifact.protocol.runner import with_episodes

    cfg = budgeted(with_episodes(load_config(args.config, engine_settings(args.engine_setting)), args.episodes), args)
    plan = load_plan(args.plan or workloads.get(cfg.workload.name).default_plan)
    for line in engines.get(cfg.engine.kind).dry_run(cfg, plan):
        print(line)
    return 0


def demo_variants() -> dict:
    """NAME -> its help, for each `./run.sh demo --NAME` configs/demo.toml declares ([variants.NAME])."""
    from artifact.config import read_toml  # lazy: each command imports only what it runs

    try:
        variants = read_toml(DEMO_FILE).get("variants") or {}
    except ArtifactError:
        return {}  # the demo command reports it (demo_entries)
    return {
        name: str(v.get("help", f"instead: [[{name}]] of configs/demo.toml, then check"))
        for name, v in variants.items()
        if isinstance(v, dict)
    }


def demo_entries(kind: str) -> list[dict]:
    from artifact.config import read_toml  # lazy: each command imports only what it runs

    entries = read_toml(DEMO_FILE).get(kind)
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and {"config", "plan", "count"} <= set(e) for e in entries
    ):
        raise ArtifactError(f"{DEMO_FILE}: [[{kind}]] must list tables with config, plan and count")
    return entries


def cmd_run(args) -> int:
    from artifact.report.summary import render_results  # lazy: each command imports only what it runs
    from artifact.records.store import load_run

    if args.dry_run:
        return dry_run(args)
    from artifact.report.divergences import first_divergences, render  # lazy: each command imports only what it runs

    run_dirs = execute(args.config, args.plan, args.episodes, Path(args.results), args.engine_setting, args)
    runs = [load_run(d) for d in run_dirs]
    print(render_results(runs))
    print("first divergences (every pair; ./run.sh check writes them beside the verdicts):")
    print(render(first_divergences(runs)), end="")
    return 0


def forwards(argv: list[str]) -> int:
    """Internal (`forwards RUN_ARGS...`: run.sh asks it before it isolates a run): the host loopback servers the
    configuration's engine talks to, which scripts/isolate.sh relays into the isolation (none for an engine that
    starts its own server). Takes `run`'s arguments and ignores all but the configuration and its engine settings."""
    from artifact import engines  # lazy: each command imports only what it runs
    from artifact.catalog import load_config

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("config", nargs="?")
    p.add_argument("--engine-setting", action="append", default=[])
    for option in (
        "--plan",
        "--episodes",
        "--results",
        "--turns",
        "--steps",
        "--n-predict",
        "--startup-timeout",
        "--request-timeout",
    ):  # run's options with a value, so that no value is the config
        p.add_argument(option)
    args, _ = p.parse_known_args(argv)
    if args.config is None or {"-h", "--help"} & set(argv):
        return 0
    try:
        cfg = load_config(args.config, engine_settings(args.engine_setting))
        print(" ".join(engines.get(cfg.engine.kind).loopback_servers(cfg)))
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def cmd_demo(args) -> int:
    import time

    from artifact.report.summary import render_results  # lazy: each command imports only what it runs
    from artifact.check.run import run_check
    from artifact.records.store import load_run

    results = Path(args.results)
    counts = {"episodes": args.episodes, "items": args.items}
    run_dirs = []
    steps = setup_steps()
    variant = next((v for v in demo_variants() if getattr(args, v, False)), None)  # e.g. RQ4 on this machine
    for entry in demo_entries(variant or "demo"):
        t = time.monotonic()
        run_dirs += execute(entry["config"], entry["plan"], counts.get(entry["count"]), results)
        steps.append((f"run {entry['config']}/{entry['plan']}", time.monotonic() - t))
    print(render_results([load_run(d) for d in run_dirs]))
    t = time.monotonic()
    code = run_check(results)
    steps.append(("check", time.monotonic() - t))
    if variant is None:
        t = time.monotonic()
        recheck_evidence(results)
        steps.append(("the committed evidence re-checked", time.monotonic() - t))
    print("\n" + time_table(steps))
    return code


# What run.sh's set-up took before this process started: ARTIFACT_SETUP_TIMES holds its clock at the start and after
# each of its steps (seconds since the epoch), in this order.
SETUP_STEPS = ("set-up: Python environment and packages", "set-up: llama-server build", "set-up: the agent model")


def setup_steps() -> list[tuple[str, float]]:
    """(step, seconds) of run.sh's set-up (ARTIFACT_SETUP_TIMES; none when it is not set or not numbers)."""
    import os

    try:  # bash writes its clock with the locale's decimal mark
        clock = [float(x.replace(",", ".")) for x in os.environ.get("ARTIFACT_SETUP_TIMES", "").split()]
    except ValueError:
        return []
    return [(name, b - a) for name, a, b in zip(SETUP_STEPS, clock, clock[1:])]


def time_table(steps: list[tuple[str, float]]) -> str:
    """The demo's time per step and in all (set-up steps are ~0 s once they have run on a machine)."""
    import os

    rows = steps + [("total", sum(s for _, s in steps))]
    width = max(len(name) for name, _ in rows)
    lines = [f"time on this machine ({os.cpu_count()} CPU cores):"]
    lines += [f"  {name:<{width}}  {seconds:8.1f} s" for name, seconds in rows]
    return "\n".join(lines)


def recheck_evidence(results: Path) -> None:
    """Check the committed GPU evidence again (seconds, no GPU) into RESULTS/check-evidence/ and print its verdicts
    beside the demo's: the live run shows the mechanism on two episodes, the committed records the rates."""
    import json

    from artifact.check.run import run_check  # lazy: each command imports only what it runs

    if not list(DEMO_EVIDENCE.glob(EVIDENCE_ARCHIVES)):
        print(f"(no committed evidence under {DEMO_EVIDENCE} to re-check)")
        return
    out = results / "check-evidence"
    with evidence_results(DEMO_EVIDENCE) as runs_dir:
        run_check(runs_dir, out, quiet=True, label=evidence_label(DEMO_EVIDENCE))
    live = json.loads((results / "check" / "check.json").read_text())
    ev = json.loads((out / "check.json").read_text())
    ev_status = {c["id"]: c for c in ev["claims"]}
    rows = [
        ("claim", "this machine: the demo's live run", f"committed H200 records ({DEMO_EVIDENCE.name}, re-checked)")
    ]
    rows += [(c["id"], c["status"], ev_status.get(c["id"], {}).get("status", "-")) for c in live["claims"]]
    w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
    print("\n" + "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows))
    print(f"committed evidence: {ev['runs']} runs, exit code {ev['exit_code']}; report: {out / 'report.html'}")


EVIDENCE_ARCHIVES = "records*.tar.xz"  # committed evidence keeps its run records compressed (evidence/*/)
EVIDENCE_LOGS = "logs*.tar.gz"  # and its logs: the server-session logs in them are what tier attribution reads


def unpack_evidence(archive: Path, dest: str, only=None) -> None:
    """Unpack `archive` into `dest`; `only(name)` picks members (default: all)."""
    import tarfile

    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar if only is None or only(m.name)]
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")  # no absolute paths, escapes, device files
            else:  # Python < 3.10.12 / 3.11.4: the same rule by hand
                bad = [
                    m.name
                    for m in members
                    if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in Path(m.name).parts
                ]
                if bad:
                    raise ArtifactError(f"{archive}: refusing to unpack unsafe member {bad[0]!r}")
                tar.extractall(dest, members=members)
    except (tarfile.TarError, OSError) as exc:
        raise ArtifactError(f"{archive}: cannot unpack ({exc})") from None


def server_log_member(tops: set[str]):
    """Members of a logs archive that are server-session logs of the unpacked records (<top>/.../logs/server-*)."""

    def pick(name: str) -> bool:
        parts = Path(name).parts
        return len(parts) > 2 and parts[0] in tops and parts[-2] == "logs" and parts[-1].startswith("server-")

    return pick


def cmd_check(args) -> int:
    """Judge a results directory; an evidence folder holding `records*.tar.xz` (and no unpacked runs) has every
    archive unpacked into one temporary directory first, and its report is re-rendered into the folder's check/
    (or --out)."""
    from artifact.check.run import run_check  # lazy: each command imports only what it runs

    from artifact.records.listing import entries  # lazy: each command imports only what it runs

    results = Path(args.results)
    archives = sorted(results.glob(EVIDENCE_ARCHIVES)) if results.is_dir() else []
    out = Path(args.out) if args.out else results / "check"
    if archives and not any(Path(e.rel).name == "manifest.json" for e in entries(results, skip=out)):
        with evidence_results(results) as runs_dir:
            return run_check(runs_dir, out, label=evidence_label(results))
    return run_check(results, args.out)


def evidence_label(folder: Path) -> str:
    """How a check of an evidence folder names its results: the folder (relative to the repository where it lies in
    it, e.g. `evidence/h200-agent`), never the temporary directory its records were unpacked into."""
    path = Path(folder).resolve()
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else folder)


@contextlib.contextmanager
def evidence_results(folder: Path):
    """An evidence folder's run records: every `records*.tar.xz` unpacked into one temporary directory (with the
    server-session logs of those runs from `logs*.tar.gz`), removed afterwards; yields their common top-level folder
    (results/) where they share one, else the directory."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="artifact-evidence-") as tmp:
        for archive in sorted(folder.glob(EVIDENCE_ARCHIVES)):
            unpack_evidence(archive, tmp)
        tops = list(Path(tmp).iterdir())
        for archive in sorted(folder.glob(EVIDENCE_LOGS)):
            unpack_evidence(archive, tmp, server_log_member({p.name for p in tops}))
        yield tops[0] if len(tops) == 1 and tops[0].is_dir() else Path(tmp)


COMPARE_HELP = """\
Compares two runs field by field: every field of every request record (token ids as integers, text, cache counts,
log-probabilities, prompts, ...), every field of every episode record (verdict, calls and their results, ...) and
the manifest's episode list; each differing field is named with its first differing episode and position and both
values. Timing fields (prompt_ms, predicted_ms, engine_extra.wall_ms, started_at, finished_at, wall_s) differ on
every rerun by design: they are listed, never compared. Two run directories are also compared episode by episode
as the paper compares runs. Two results directories: every run present in both (same configuration, plan, arm and
run), and how the two sides differ in what produced them. Both sides are validated first through the records
schema.

exit codes:
  0  both sides valid and every compared field identical
  1  a compared field differs, a record is on one side only, or a run is invalid (incomplete, not whole, without a
     pairing fingerprint, an OFF run served cached tokens)
  2  the input is unreadable or malformed (not a run or results directory, a record that breaks the schema)
"""


def _validated(runs: list) -> list:
    """The runs, each validated through the records schema as `check` validates it (ArtifactError otherwise)."""
    from artifact.check.run import check_records  # lazy: each command imports only what it runs

    for run in runs:
        check_records(run)
    return runs


def cmd_compare(args) -> int:
    """Two run directories, or two results directories: every outcome field (COMPARE_HELP)."""
    from artifact.analysis import compare  # lazy: each command imports only what it runs
    from artifact.analysis.divergence import cache_exposure, compare_runs, validity_problems
    from artifact.report.summary import render_comparison
    from artifact.records.store import MANIFEST, load_run

    pa, pb = Path(args.run_a), Path(args.run_b)
    if not (pa / MANIFEST).exists() and not (pb / MANIFEST).exists():
        for p in (pa, pb):
            if not p.is_dir():
                raise ArtifactError(f"{p} is neither a run directory nor a results directory")
        from artifact.check.run import load_results  # lazy: each command imports only what it runs

        runs_a, runs_b = load_results(pa), load_results(pb)  # through the schema, one run per identity
        pairs, only_a, only_b = compare.compare_results(runs_a, runs_b)
        if not pairs:
            raise ArtifactError(f"no run of {pa} has the same configuration, plan, arm and run as one of {pb}")
        print(compare.render([d for _, _, d in pairs], only_a, only_b))
        problems = [p for a, b, _ in pairs for p in validity_problems(a) + validity_problems(b)]
    else:
        a, b = _validated([load_run(pa), load_run(pb)])
        print(render_comparison(compare_runs(a, b)))
        for run in (a, b):
            exp = cache_exposure(run)
            print(
                f"  {run.label}: {exp.cached_tokens}/{exp.prompt_tokens} prompt tokens from cache "
                f"({100 * exp.share:.1f}%), {exp.requests_with_cache}/{exp.requests} requests with cache hits"
            )
        pairs = [(a, b, compare.compare_records(a, b))]
        print("field by field:")
        print(compare.render([pairs[0][2]], [], []))
        problems = validity_problems(a) + validity_problems(b)
    for p in dict.fromkeys(problems):
        print(f"INVALID: {p}")
    return 1 if problems or not all(d.exact for _, _, d in pairs) else 0


def cmd_summary(args) -> int:
    from artifact.report.summary import render_results  # lazy: each command imports only what it runs
    from artifact.records.store import find_runs

    runs = find_runs(Path(args.results))
    if not runs:
        raise ArtifactError(f"no runs (manifest.json files) under {args.results}")
    print(render_results(runs))
    return 0


def cmd_fetch(args) -> int:
    """The configurations named, or without names every configuration of the paper's matrix."""
    from artifact.catalog import load_config  # lazy: each command imports only what it runs
    from artifact.fetch import fetch
    from artifact.orchestrate.matrix import load_jobs

    return fetch([load_config(n) for n in args.configs] if args.configs else [j.cfg for j in load_jobs()])


def cmd_models(args) -> int:
    """`models derive ...` (a derived model's recipe: artifact.models.derive) or `models files CONFIG...` (the weights
    files the configurations need, as JSON: artifact.fetch.listing)."""
    import json

    if args.models_command == "derive":
        import artifact.engines  # noqa: F401 -- lazy: registers each engine's tools for the recipes (derive.TOOL_DIRS)
        from artifact.models import derive

        return derive.command(args)
    from artifact.catalog import load_config  # lazy: each command imports only what it runs
    from artifact.fetch import listing

    print(json.dumps(listing([load_config(n) for n in args.configs]), indent=1))
    return 0


def cmd_evidence_summary(args) -> int:
    from artifact import evidence, paper_vs_here  # lazy: each command imports only what it runs

    folders = args.folders or [
        str(p.parent.relative_to(REPO))
        for p in sorted(REPO.glob("evidence/*/records*.tar.xz"))
        if p.name == min(q.name for q in p.parent.glob("records*.tar.xz"))
    ]
    stale = evidence.main(folders, check_only=args.check)
    # the page of the paper's values beside the evidence's is made from every committed summary: remade (or checked)
    # whenever a summary of the repository's own evidence is
    if all(Path(f).resolve().is_relative_to((REPO / "evidence").resolve()) for f in folders):
        stale = max(stale, paper_vs_here.main(check_only=args.check))
    return stale


def cmd_all(args) -> int:
    from artifact.orchestrate.command import cmd_all  # lazy: each command imports only what it runs

    if args.results is None:
        args.results = str(DEFAULT_RESULTS)
    return cmd_all(args)


def prog() -> str:
    """How the user called the command line: ./run.sh, or the console script."""
    return "./run.sh" if os.environ.get(SET_UP_ENV) else "prefix-cache-artifact"


CHECKOUT_ENV = "ARTIFACT_CHECKOUT"  # a copy of the package (`pip install .`) hands its commands to this checkout


def is_checkout(top: Path) -> bool:
    """Whether TOP is a checkout of the project: run.sh, the package and a pyproject.toml naming this project."""
    project = top / "pyproject.toml"
    if not ((top / "run.sh").is_file() and (top / "artifact" / "cli.py").is_file() and project.is_file()):
        return False
    try:
        return 'name = "prefix-cache-artifact"' in project.read_text(errors="replace")
    except OSError:
        return False


def checkout_around(folder: Path) -> Path | None:
    """The project's checkout at FOLDER or above it (`is_checkout`)."""
    return next((top for top in (folder, *folder.parents) if is_checkout(top)), None)


def installed_from() -> Path | None:
    """The folder this copy of the package was installed from (`pip install DIR` records it: direct_url.json), or
    None where that is not recorded (a wheel, an index)."""
    import json  # lazy: only a copy of the package asks
    from importlib import metadata
    from urllib.parse import unquote, urlsplit

    try:
        text = metadata.distribution("prefix-cache-artifact").read_text("direct_url.json")
        url = urlsplit(json.loads(text or "{}").get("url") or "")
    except (metadata.PackageNotFoundError, ValueError, AttributeError, OSError):
        return None
    return Path(unquote(url.path)) if url.scheme == "file" and url.path else None


def checkout_for_copy() -> tuple[Path | None, str]:
    """Whose run.sh a copy of the package (`pip install .`) hands a command to, and, where none, why (one line).
    Never a script found in the folder it runs in, unless that folder is (in) the checkout the copy was installed
    from, or the user names a checkout (CHECKOUT_ENV): a folder received from someone else can hold a run.sh, a
    package and a pyproject.toml."""
    named = os.environ.get(CHECKOUT_ENV, "").strip()
    if named:
        if is_checkout(Path(named)):
            return Path(named), ""
        return None, f"{CHECKOUT_ENV}={named} is not a checkout of the project (run.sh, artifact/, pyproject.toml)"
    try:
        here = checkout_around(Path.cwd())
    except OSError:  # the folder it runs in is gone
        here = None
    source = installed_from()
    if here is not None and source is not None and os.path.realpath(here) == os.path.realpath(source):
        return here, ""
    if here is not None:
        return None, (
            f"the folder it runs in ({here}) holds a checkout it was not installed from, whose run.sh it does not run"
        )
    return None, ""


def not_the_checkout(argv: list[str], why: str = "") -> int:
    """A copy of the package (`pip install .`) run outside the checkout it was installed from: every command needs a
    checkout's run.sh, configs/ and expected/, so one line says how to run it."""
    print(
        f"error: this installation of the package ({REPO / 'artifact'}) is a copy, not a checkout with run.sh, "
        f"configs/ and expected/{'; ' + why if why else ''}: run ./run.sh {' '.join(argv)} in the checkout, or "
        f"there `pip install -e .`, or name the checkout: {CHECKOUT_ENV}=DIR prefix-cache-artifact {' '.join(argv)}",
        file=sys.stderr,
    )
    return 2


def hand_over(argv: list[str], checkout: Path = REPO) -> int:
    """Run CHECKOUT's `run.sh ARGV` in this process's place (set-up, isolation); returns only where it cannot."""
    if not (checkout / "run.sh").is_file():
        return not_the_checkout(argv)
    try:
        os.execv(str(checkout / "run.sh"), [str(checkout / "run.sh"), *argv])
    except OSError as exc:
        print(
            f"error: cannot start {checkout / 'run.sh'} ({exc.strerror}): run ./run.sh {' '.join(argv)} from the "
            "checkout",
            file=sys.stderr,
        )
    return 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog(),
        description="Prefix caching and serving reproducibility: "
        "the paper's paired cache ON/OFF protocol on BFCL multi_turn_base.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def engine_setting_arg(sp):
        sp.add_argument(
            "--engine-setting",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="one of the engine's settings over the configuration's [engine.settings] (repeatable; "
            'VALUE is read as TOML: true, 8, "text"; else as text), e.g. url_on=http://127.0.0.1:8080',
        )

    def results_arg(sp):
        sp.add_argument("--results", default=str(DEFAULT_RESULTS), help="results directory (default: results/)")

    sp = sub.add_parser("demo", help="paired protocol on the embedded CPU default")
    sp.add_argument("--episodes", type=int, default=None, help="BFCL episodes per run (default: the demo config's)")
    sp.add_argument("--items", type=int, default=None, help="GSM8K bridge items (default: the demo config's)")
    variants = sp.add_mutually_exclusive_group()
    for name, help_text in demo_variants().items():  # configs/demo.toml's [variants.NAME]: --NAME
        variants.add_argument(f"--{name}", action="store_true", help=help_text)
    results_arg(sp)
    sp.set_defaults(func=cmd_demo)

    sp = sub.add_parser("run", help="one configuration's protocol")
    sp.add_argument("config", help="a configs/*.toml name or a path")
    sp.add_argument(
        "--plan", default=None, help="a plan from configs/plans.toml (default: main; bridge for a GSM8K configuration)"
    )
    sp.add_argument("--episodes", type=int, default=None, help="episodes per run (default: the config's)")
    sp.add_argument("--turns", type=int, default=None, help="turns per episode at most (BFCL max_turns)")
    sp.add_argument("--steps", type=int, default=None, help="requests per turn at most (BFCL max_steps_per_turn)")
    sp.add_argument("--n-predict", type=int, default=None, help="tokens per reply at most (workload n_predict)")
    sp.add_argument(
        "--startup-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a loading server is waited for (engine.startup_timeout_s; not in the resume fingerprint)",
    )
    sp.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds one request may take (engine.request_timeout_s; not in the resume fingerprint)",
    )
    sp.add_argument(
        "--dry-run",
        action="store_true",
        help="run nothing: what the engine can say before a run (servers you run yourself: which "
        "claims they can decide, and about how long the budget takes, from one timed request)",
    )
    engine_setting_arg(sp)
    results_arg(sp)
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser(
        "compare",
        help="compare two runs, or two results directories, field by field",
        description=COMPARE_HELP.split("\n\nexit codes:")[0],
        epilog="exit codes:" + COMPARE_HELP.split("\n\nexit codes:")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sp.add_argument("run_a")
    sp.add_argument("run_b")
    sp.set_defaults(func=cmd_compare)

    sp = sub.add_parser("summary", help="summary table of a results directory")
    sp.add_argument("results", nargs="?", default=str(DEFAULT_RESULTS))
    sp.set_defaults(func=cmd_summary)

    from artifact.check.exit_codes import exit_codes_help  # lazy: each command imports only what it runs

    sp = sub.add_parser(
        "check",
        help="verdicts per paper claim, tables, figures and report.html",
        description="Judge the runs under RESULTS against the paper's claims: one verdict per claim "
        "(PASS, FAIL, OUT-OF-BAND, INCONCLUSIVE, INVALID, NOT-RUN; docs/claims.md), tables, "
        "figures, check.json and a self-contained report.html.",
        epilog=exit_codes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sp.add_argument("results", nargs="?", default=str(DEFAULT_RESULTS))
    sp.add_argument("--out", default=None, help="output directory (default: RESULTS/check)")
    sp.set_defaults(func=cmd_check)

    sp = sub.add_parser(
        "evidence-summary",
        help="write each evidence folder's summary.json and summary.md, and docs/paper-vs-here.md",
        description="Summarize evidence folders from their records and check outputs "
        "(artifact/evidence.py): what the documentation quotes of the committed evidence; then the page of the "
        "paper's values beside the evidence's, docs/paper-vs-here.md (artifact/paper_vs_here.py).",
    )
    sp.add_argument("folders", nargs="*", help="evidence folders (default: every evidence/*/ with records)")
    sp.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a summary or the page is out of date"
    )
    sp.set_defaults(func=cmd_evidence_summary)

    sp = sub.add_parser("fetch", help="download and verify pinned weights")
    sp.add_argument("configs", nargs="*", help="configurations (default: every configuration `all` runs)")
    sp.set_defaults(func=cmd_fetch)

    from artifact.models import derive  # lazy: each command imports only what it runs

    sp = sub.add_parser("models", help="derive a recipe's models; list the weights files configurations need")
    msub = sp.add_subparsers(dest="models_command", required=True, metavar="derive|files")
    derive.add_arguments(
        msub.add_parser("derive", help="make (or verify) or pin a recipe's products", description=derive.DESCRIPTION)
    )
    files = msub.add_parser("files", help="the weights files the configurations' models need, as JSON")
    files.add_argument("configs", nargs="+", metavar="CONFIG")
    sp.set_defaults(func=cmd_models)

    for name, help_text in (
        (
            "setup",
            "create .venv, install the pinned packages, build llama-server, derive the "
            "agent model (run.sh setup; idempotent)",
        ),
        ("test", "set up, then run the test suite (run.sh test; arguments go to pytest)"),
        ("bench", "benchmarks (run.sh bench: check on synthetic paper-scale results)"),
    ):
        sp = sub.add_parser(name, help=help_text)
        sp.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        sp.set_defaults(func=lambda args: hand_over([args.command, *args.rest]))

    from artifact.orchestrate.arguments import add_parser  # lazy: each command imports only what it runs

    add_parser(sub)
    sub.choices["all"].set_defaults(func=cmd_all)
    return p


def one_line(text: str) -> str:
    """An error message on one line: a line break a name holds (a file named so) written as its escape."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["forwards"]:
        return forwards(argv[1:])
    copy = not (REPO / "run.sh").is_file()  # `pip install .`: the package away from its checkout
    why = ""
    if copy and argv[:1] not in ([], ["-h"], ["--help"]):
        checkout, why = checkout_for_copy()
        if checkout is not None:  # the checkout it was installed from, or the one the user names: its run.sh
            return hand_over(argv, checkout)
    if argv[:1] and argv[0] in HANDED_TO_RUN_SH and not os.environ.get(SET_UP_ENV):
        return not_the_checkout(argv, why) if copy else hand_over(argv)
    args = parser().parse_args(argv)
    if copy:  # every command reads the checkout's configs/ and expected/
        return not_the_checkout(argv, why)
    # Ctrl-C and `kill` alike unwind through the protocol's cleanup (the server is stopped, the run stays
    # 'incomplete'), even when the shell that started us ignored SIGINT (background jobs).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return args.func(args)
    except ArtifactError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # e.g. a full disk or an unwritable results directory: one line, never a traceback
        print(
            f"error: {one_line(str(exc.strerror or exc))}: {one_line(str(exc.filename or ''))} (a run in progress "
            "stays incomplete and is re-run on the next invocation)",
            file=sys.stderr,
        )
        return 2
    except Exception as exc:  # anything unforeseen: one line and exit 2, never a traceback (ARTIFACT_DEBUG shows it)
        if os.environ.get("ARTIFACT_DEBUG"):
            raise
        what = " ".join(str(exc).split())[:300]
        print(
            f"error: {args.command} stopped on {type(exc).__name__}: {what} (set ARTIFACT_DEBUG=1 for the traceback, "
            "and please report it)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(
            "interrupted: the current run stays 'incomplete'; the next invocation re-runs its session"
            if getattr(args, "command", None) in ("run", "demo", "all")
            else "interrupted",
            file=sys.stderr,
        )
        return 130
