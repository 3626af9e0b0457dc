"""What an engine can do (`Capabilities`, declared by its adapter), and what its facets read of it (`EngineFacts`).

The protocol checks a workload's needs against the capabilities before anything starts; the facets
(artifact/engines/audit.py, artifact/engines/builds.py) read their engine through `EngineFacts` only, so that they
sit below the interface (artifact/engines/base.py) that names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from artifact.config import Config, Plan


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do, declared by its adapter; the protocol checks a workload's needs against it before
    anything starts."""

    per_request_cache_switch: bool  # the cache can be used or not per request (else per server: one per arm)
    cache_tiers: tuple[str, ...]  # where a request's cached prefix can come from, as its records name them
    metrics_endpoint: str | None  # the server's Prometheus endpoint, if it has one
    image: str | None  # the Dockerfile `./run.sh all` builds this engine's image from
    # the arms its sessions serve; None: any arm (the cache is switched per request, so the arm is the workload's)
    arms: tuple[str, ...] | None = ("off", "on")
    packages: tuple[str, ...] = ()  # distributions whose versions every manifest lists first
    # its sessions serve requests of background tenants (`background`) concurrently with the measured ones, on
    # other slots of the same server (plans with `tenants`, artifact/protocol/background_tenants.py)
    background_requests: bool = False
    # its sessions load the configuration's weights (sha256-verified before every start); False: the weights are the
    # server's own (a server the artifact did not start), the configuration's model source is "server:"
    loads_weights: bool = True
    # every request it serves reports how many prompt tokens came from cache (`cache_n`, never null): a served
    # request of its runs with a null cache_n says nothing about cache use, and the claims do not read it as 0
    reports_cache_use: bool = False

    def missing(self, needs: dict[str, Any]) -> list[str]:
        """The needs (capability name -> required value, or for `arms` the arms needed) this engine lacks."""
        out = []
        for name, want in needs.items():
            have = getattr(self, name)
            if name == "arms":
                out += [f"arm {a!r}" for a in want if have is not None and a not in have]
            elif have != want:
                out.append(name.replace("_", " "))
        return out


class EngineFacts(Protocol):
    """What a facet reads of the engine it belongs to (artifact.engines.base.Engine has all of it)."""

    kind: str
    capabilities: Capabilities
    server_family: str | None

    def settings(self, cfg: Config, plan: Plan | None = None, where: str = "") -> Any: ...
