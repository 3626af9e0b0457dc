"""What the report shows a reader of the records and verdicts, in their words: the one-glance summary (per claim
its verdict and key count; per verdict beyond the paper its statuses), recorded paths without the recording
machine's own folders, and a run's configuration file as this checkout names it."""

from __future__ import annotations

import re

from artifact.config import current_config_path
from artifact.verdict import STATUSES

# A recorded absolute path, as the page shows it: from the first folder a checkout or its environments name on
# (everything before it is the recording machine's own layout, which says nothing to a reader), else its last part.
_CHECKOUT_FOLDERS = {".venv", ".venv-cuda", ".venv-vllm", "vllm-venv", "models", "weights", "configs", "results"}
_SYSTEM = {"dev", "proc", "sys", "usr", "etc", "bin", "sbin", "lib", "lib64"}
_ABSOLUTE = re.compile(r"(?<![\w.~-])/[\w.+-]+(?:/[\w.+-]+)*")


def _cut(match: re.Match) -> str:
    parts = match.group(0).strip("/").split("/")
    if parts[0] in _SYSTEM:
        return match.group(0)
    at = next((i for i, p in enumerate(parts) if p in _CHECKOUT_FOLDERS), len(parts) - 1)
    return "…/" + "/".join(parts[at:])


def shown_path(text: str) -> str:
    """A recorded text with every absolute path in it cut to what a reader can place (`_CHECKOUT_FOLDERS`): the
    machine that recorded it keeps its folder names; the record keeps the whole path."""
    return _ABSOLUTE.sub(_cut, text)


def config_now(recorded) -> str:
    """A run's configuration file as the page shows it: its path in this checkout, where the recorded one exists or
    configs/renamed.toml maps it (a record keeps the path it ran with), and the recorded path beside it where they
    differ; else the recorded path, said to be absent."""
    if not recorded:
        return "-"
    now = current_config_path(str(recorded))
    shown = shown_path(str(recorded))
    if now is None:
        return f"{shown} (no such file in this checkout)"
    return now if now == shown else f"{now} (recorded as {shown}, renamed since)"


_INTERVALS = re.compile(r" \((?:Wilson|bootstrap)[^()]*\)")


def claim_title(statement: str) -> str:
    """A claim's statement up to its first colon or bracket: what it says, in a few words."""
    return re.split(r":| \(", statement, maxsplit=1)[0].strip().rstrip(".")


def key_count(observed: str, parts: int = 2) -> str:
    """The counts of a verdict's observation without their intervals, its first `parts` clauses: one glance."""
    return "; ".join(_INTERVALS.sub("", observed).split("; ")[:parts])


def glance(claims: list, beyond) -> dict:
    """The report's first screen: per claim its verdict and key count; per verdict beyond the paper its status."""
    rows = [
        {
            "id": c.id,
            "title": claim_title(c.statement),
            "status": c.status,
            "count": key_count(c.observed),
            "scopes": ", ".join(
                f"{n} {s}" for s in STATUSES if (n := sum(d.status == s for d in c.details if d.kind != "band"))
            ),
        }
        for c in claims
    ]
    verdicts = beyond.verdicts if beyond else []
    others = [
        {
            "id": vid,
            "scopes": ", ".join(
                f"{n} {s}" for s in STATUSES if (n := sum(v.id == vid and v.status == s for v in verdicts))
            ),
        }
        for vid in dict.fromkeys(v.id for v in verdicts)
    ]
    return {"claims": rows, "beyond": others}
