"""One admission gate: a run is admitted as evidence, or it is not, and every analysis reads admitted
runs only.

A run is admitted when nothing makes it INVALID: it is complete and whole (`Run.integrity_problems`), it carries its
pairing fingerprint, it agrees with what its own records and its server's log say and is no copy of another run
(`check.facts.invalid`, whose reasons join the run's integrity problems), and, for a run of the cache-OFF arm, no
request was served cached tokens (`divergence.cache_problem`). These are `analysis.tables.run_problems`, the reasons
check names under INVALID. A run that is not admitted is listed (runs.csv, the report's run table, check.json's
`invalid`) and read by RQ1, whose verdict is about exactly these reasons (an OFF run served cached tokens FAILs it);
it feeds no comparison (`divergence.comparable`), no workload table, and no analysis beyond the paper
(`check.beyond`: quantization mechanism, fresh-server reruns, mitigation, margins, benefit, tiers, tenants).
docs/admission.md lists what admission derives from which recorded fact. The fields that route an admitted run are
derived from facts by one function each, which every reader asks (never the run's label): its server family
(`engines.server_family`), what its engine observed (`check.core.observes`), which quantization series its weights
are a level of (`analysis.groups.weights_lineage`), whether its tenants' prompts share the measured prefix
(`analysis.tenant_effect.prefix_of`), whether it ran loopback-only (`engines.network`).
"""

from __future__ import annotations

from artifact.analysis.tables import run_problems
from artifact.records.store import Run


def admitted(runs: list[Run]) -> list[Run]:
    """The runs admitted as evidence (`run_problems` empty), in their order. Call after `check.facts.check`, which
    adds its reasons to the runs' problems."""
    return [run for run in runs if not run_problems(run)]
