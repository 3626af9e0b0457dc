"""The small interface every workload satisfies; the protocol runs any of them with one loop.

A workload (one package under `artifact/workloads/`, registered in `artifact.workloads.REGISTRY`) owns its data, its
prompts, the execution of one unit (a BFCL episode, a GSM8K item), its scoring and its tables. The protocol owns the
arms, runs, sessions, resume and records (`artifact.protocol`): for every unit of every run it calls `run_unit` with
a `Query`, the one way to send a request, which records it (`requests.jsonl`) as it happens; `run_unit` returns the
unit's record (`episodes.jsonl`).
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, TextIO

from artifact.config import Config, Plan, build_table
from artifact.errors import ArtifactError

if TYPE_CHECKING:
    from artifact.records.store import Run


@dataclass
class Prepared:
    """What a workload hands the protocol for one configuration: its units, in order, and what identifies them."""

    units: list[Any]  # the workload's own unit objects
    ids: list[str]  # one id per unit (manifests list them; records name them)
    identity: dict[str, Any]  # what produces the prompts (data version and hash, ...): part of the pairing fingerprint
    label: str  # e.g. "80 episodes", for progress lines
    manifest: dict[str, Any] = field(default_factory=dict)  # extra manifest fields every run of it carries


@dataclass(frozen=True)
class CacheBridge:
    """What a cache-bridge workload (each item served cold and warm, the paper's RQ5: answers flip both ways
    without an accuracy shift) gives the claim that judges it (artifact/check/claims/rq5.py)."""

    table: str  # the file among its `table_files` the claim reads (one row per configuration, and "pooled")
    paper_data: str  # the `data` of rows made of the paper's items; rows of other data are no evidence (NOT RUN)
    net_shift: float  # the net accuracy shift the pooled power is computed for
    servings_per_item: int  # servings per item (cold and warm), for the share of flagged servings


@dataclass(frozen=True)
class Wording:
    """How the report names a workload and what it does with the model's replies: the report's headings, column
    names and prose about a workload come from here, never from the report's own templates. The defaults are neutral
    words that fit any workload; a workload sets its own (e.g. BFCL's, artifact/workloads/bfcl)."""

    title: str = ""  # its name in the report's headings ("Tab. 2: ... (<title>)"); "": its registry name
    valid_column: str = "valid"  # its validity column: Tab. 2's "<valid_column> OFF" and "<valid_column> ON"
    # what reads the calls from a reply, executes them and returns their results: "the calls <harness>'s decoder
    # read from it, the results <harness>'s executor returned", "<harness> executed different calls"
    harness: str = "the workload"
    executes_output: bool = False  # whether the harness executes the model's output (the network warning says so)


class Query(Protocol):
    """Sends one greedy request, records it, returns its record (raises RequestError once recorded if the engine
    cannot serve it; anything else that fails is fatal for the run)."""

    def __call__(
        self,
        prompt: str,
        *,
        turn: int = 0,
        step: int = 0,
        cache_prompt: bool | None = None,
        tags: dict[str, Any] | None = None,
        annotate: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]: ...


class Workload(abc.ABC):
    """A workload. Required (what a protocol run needs): `name`, `prepare` and `run_unit`; everything else (its
    settings, the arms it runs, the engine capabilities it needs, its tables, summary, report section and wording)
    has a default."""

    name: str  # configs' workload.name
    unit: str = "episode"  # what one unit is called in messages
    settings_type: type | None = None  # a dataclass: its own [workload] keys (beyond name, episodes, n_predict)
    arms: tuple[str, ...] = ("off", "on")  # the arms its plans may have
    needs: dict[str, Any] = {}  # engine capabilities it needs (artifact.engines.base.Capabilities field -> value)
    default_plan: str = "main"
    packages: tuple[str, ...] = ()  # distributions whose versions every manifest lists first

    def settings(self, cfg: Config) -> Any:
        """Its settings, validated from the configuration's [workload] table (one-line errors)."""
        if self.settings_type is None:
            if cfg.workload.settings:
                raise ArtifactError(
                    f"{cfg.path}: workload {self.name} takes no key 'workload.{sorted(cfg.workload.settings)[0]}'"
                )
            return None
        return build_table(self.settings_type, dict(cfg.workload.settings), cfg.path or cfg.name, "workload.")

    def check(self, cfg: Config, plan: Plan) -> None:
        """Refuse, in one line and before anything starts, what this workload cannot run."""
        bad = [a for a in plan.arms if a not in self.arms]
        if bad:
            raise ArtifactError(
                f"plan '{plan.name}' has arm {bad[0]!r}; workload {self.name} runs plans whose arms "
                f"are among {', '.join(self.arms)} (e.g. plan '{self.default_plan}')"
            )

    @abc.abstractmethod
    def prepare(self, cfg: Config) -> Prepared:
        """Its units for one configuration, in order, and what identifies them (once per run)."""

    @abc.abstractmethod
    def run_unit(
        self, cfg: Config, prepared: Prepared, index: int, arm: str, query: Query, log: TextIO
    ) -> dict[str, Any]:
        """Execute one unit on the session's server through `query`; return its record (episodes.jsonl)."""

    def progress(self, record: dict[str, Any]) -> str:
        """What a progress line says about a finished unit."""
        return str(record.get("verdict", ""))

    def finish(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Extra manifest fields of a finished run, from its unit records."""
        return {}

    def tenant_prompts(self, cfg: Config, prepared: Prepared, n: int) -> tuple[list[tuple[str, list[str]]], str]:
        """For background tenants (plans with `tenants`, artifact/protocol/background_tenants.py): per unit, its first
        prompt and `n` prompts of data the protocol never evaluates that share that prompt's prefix as another user of
        the same application would; and how they were made (recorded in every manifest)."""
        from artifact import workloads  # lazy: the registry, the package above this module (its __init__ imports this)

        having = [n for n in workloads.REGISTRY if type(workloads.get(n)).tenant_prompts is not Workload.tenant_prompts]
        raise ArtifactError(
            f"workload {self.name} has no prompts for background tenants; plans with tenants run "
            f"on a workload that has them ({', '.join(having) or 'none in this version'})"
        )

    # -- reading results (check, summary, report) --------------------------------------------------------------

    table_files: tuple[str, ...] = ()  # the file names `tables` may return (the only ones `check` may replace)
    wording: Wording = Wording()  # its name and words in the report's headings, columns and prose
    cache_bridge: CacheBridge | None = None  # a cache-bridge workload's table for its claim (RQ5); None: not one

    def tables(self, runs: list[Any]) -> dict[str, Any]:
        """Its own tables of these runs (file name -> DataFrame, names among `table_files`), written by
        `./run.sh check`."""
        return {}

    def record_problem(self, run: Run) -> str | None:
        """Why a run's unit records contradict its requests or its manifest in this workload's own terms
        ("FILE:LINE: field 'x' ...", naming both values), or None. `./run.sh check` refuses such records as corrupt
        before it judges anything (artifact.check.facts)."""
        return None

    def summary(self, runs: list[Any], tables: dict[str, Any]) -> list[str]:
        """Its blocks of the terminal summary."""
        return []

    def run_columns(self, run: Run) -> dict[str, str]:
        """Its own columns of the terminal summary's per-run table of the paired protocol (column -> value)."""
        return {}

    def report_section(self, runs: list[Any], tables: dict[str, Any]) -> dict[str, Any] | None:
        """Its section of report.html: {"template": "<package>/<file>.j2", ...context}, or None."""
        return None

    # --- the report's divergence example (artifact.report.example.divergence_example) --------------------------------
    def divergence_change(self, run_a: Run, run_b: Run, unit_id: str, first_request: int | None) -> str | None:
        """What a unit's first divergence changed beyond the reply (an agent: "observation" where it made other
        calls and saw other results, "call" where the calls differ only), or None; the example prefers units where
        it changed something. The default knows nothing beyond the replies."""
        return None

    def example_trajectory(self, run: Run, reqs: list[Any], unit_id: str, start: int) -> list[dict[str, Any]]:
        """Per request from `start` (up to 4): request (1-based), turn, step, text, and what the workload did with
        the reply (calls, observations: an agent's decoded calls and their results; None and [] where it records
        none)."""
        out = []
        for i in range(start, min(len(reqs), start + 4)):
            out.append(
                {
                    "request": i + 1,
                    "turn": reqs[i].get("turn"),
                    "step": reqs[i].get("step"),
                    "text": reqs[i].get("output_text") or "",
                    "calls": None,
                    "observations": [],
                }
            )
        return out

    def fetch(self, cfgs: list[Any]) -> None:
        """Download and verify the data these configurations need (`./run.sh fetch`), if any."""

    def container_mounts(self, cfg: Config, hf_cache: Path | None) -> dict[str, str]:
        """The host data a containerised run of `cfg` reads: {host folder: folder in the container}, read-only.
        `hf_cache` is the host's Hugging Face Hub cache (a Path, or None); the images read theirs at /hf-cache
        (HF_HUB_CACHE). Default: none (the data are in the image or made by the run)."""
        return {}


def replace_settings(cfg: Config, **changes: Any) -> Config:
    """The configuration with workload settings changed (tests and budgets: e.g. max_turns=1)."""
    common = {k: changes.pop(k) for k in list(changes) if k in ("episodes", "n_predict")}
    workload = dataclasses.replace(cfg.workload, settings={**cfg.workload.settings, **changes}, **common)
    return dataclasses.replace(cfg, workload=workload)
