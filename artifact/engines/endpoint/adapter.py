"""OpenAI-compatible servers the user runs (`engine.kind = "endpoint"`): the fixed protocol against servers the
artifact did not start (a llama-server, vLLM, SGLang or TGI deployment of one's own), through /v1/completions.

Two ways to give the arms, in `[engine.settings]` or on the command line (`--engine-setting KEY=VALUE`):
  url_on, url_off   one server per arm, as the user started them: one with prefix caching on, one with it off. The
                    artifact cannot set or verify either condition; what the servers report per request shows it.
  url + cache_control
                    (url, where given, serves both arms, whatever url_on and url_off say)
                    one server, the cache switched per request by a field the server has: "cache_prompt"
                    (llama-server: false on OFF requests, true on ON requests) or "cache_salt" (vLLM >= 0.9: a new
                    random salt on every OFF request, so that no cached block can match; ON requests carry none).

What it observes (manifest `observes`; engines.base.OBSERVES): the server's identity (/v1/models without volatile
fields, its Server header, /version, /props and the Prometheus `*_info` families where it has them), per request the
token ids, the top-2 log-probabilities and the cached prompt tokens as the server reports them (observe.py: null where
it reports none). What it cannot know: the server's binary, its command line, the weights' sha256, and whether other
clients shared the server; the manifest says so (`unknown`), the pairing fingerprint holds only what is known (the
servers' identities, the model id, the request fields), and the two arms' servers must report the same identity.

The network: a loopback URL (127.0.0.0/8, ::1, localhost) is reached from inside the protocol's network isolation
through a relay of exactly its port (`loopback_servers`, scripts/isolate.sh). Any other URL is refused unless
`allow_remote = true`, and then only in a run without the isolation (ARTIFACT_ALLOW_NETWORK=1): its manifest's
isolation.network then says "host network (not isolated)", which check reports. Servers that need an API key are not
supported: the protocol executes model output in this process, so no credential may be reachable from it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


from artifact.config import Config, Plan
from artifact.engines.base import Capabilities, Engine
from artifact.engines.endpoint import observe
from artifact.engines.endpoint.records import EndpointAudit
from artifact.engines.openai_client import (
    OpenAIClient,
    is_loopback,
    split_url,
)
from artifact.errors import ArtifactError
from artifact import engines

from artifact.engines.endpoint.servers import comparable, held_to_declared, model_id, probe, SAME
from artifact.engines.endpoint.session import EndpointSession
from artifact.engines.endpoint.settings import (
    CONTROLS,
    KIND,
    REQUEST_FIELDS,
    Settings,
    arm_urls,
    describe,
    observes,
    role,
)


def claims_lines(s: Settings, ident: dict, reports: dict, plan: Plan) -> list[str]:
    """Which claims servers like these can decide (what check will say of them)."""
    family = observe.server_family(ident["servers"]["on"])
    out = ["claims these servers can decide:"]
    out.append(
        "  RQ1 (cache-OFF reruns identical): "
        + (
            "yes: the OFF server reports its cache use on every request"
            if reports.get("off")
            else "INCONCLUSIVE: the OFF server reports no cache use (cache_n null): that the cache was off is not shown"
        )
    )
    out.append(
        "  RQ2 (ON vs OFF diverges, more than reruns): "
        + (
            "yes, on a cold start of ON run 1 (see above) and once at least one episode diverges ON vs OFF (more "
            "often than in the reruns); 0 diverging episodes contradict the paper only from 7 episodes on (the Wilson "
            "95% upper bound of 0/7, 35.4%, is below its smallest ON-vs-OFF rate, 36.2%: expected/paper.toml)"
            if reports.get("on")
            else "INCONCLUSIVE: the ON server reports no cache use, so an ON run is not shown to use the cache"
        )
    )
    out.append(
        "  RQ2b (host cache off / fresh server per run): NOT-RUN: the artifact cannot restart or reconfigure "
        "your servers"
    )
    out.append(
        "  RQ3 (quantization amplifies): NOT-RUN: a quantization series is made of levels whose weights the "
        "artifact loaded and verified (their sha256 against its pins); a server's own weights are not "
        "observable, so its levels join no series"
    )
    out.append(
        "  RQ4 (a second engine): "
        + (
            "these runs count as vLLM runs (the server reports owned_by vllm)"
            if family == "vllm"
            else f"NOT-RUN here (the server reports owned_by {family!r}, not vllm)"
        )
    )
    out.append(
        "  RQ5 (GSM8K bridge): "
        + (
            "runnable: one URL with a per-request cache control (--plan bridge on a GSM8K configuration)"
            if s.url
            else "NOT-RUN: needs one URL with a per-request cache control"
        )
    )
    out.append(
        "  not observable whatever the budget: the server's binary, command line and weights' sha256, and "
        "whether other clients used it (an OFF server that served other requests can answer differently)"
    )
    return out


class Endpoint(Engine):
    kind = KIND
    # one server per arm by default; `url` with a cache control switches the cache per request (capabilities_for)
    # reports_cache_use False: a server reports cached tokens only where it has a field or counter for them (vLLM
    # without its /metrics reports none on a miss); a null cache_n is "not reported", and RQ1 says so (INCONCLUSIVE)
    capabilities = Capabilities(
        per_request_cache_switch=False,
        cache_tiers=(),
        metrics_endpoint=None,
        image=None,
        arms=("off", "on"),
        packages=(),
        loads_weights=False,
        reports_cache_use=False,
    )
    settings_type = Settings
    audit_facet = EndpointAudit  # records.py: a server it did not start (its family, its URL, a warm start)
    # no build facet: `./run.sh all` starts no server of the user's (./run.sh run CONFIG runs it)

    def problems(self, cfg: Config, s: Settings) -> list[str]:
        out = []
        if s.url and s.cache_control == "none":
            out.append(
                "engine.settings: one url serves both arms only with a per-request cache_control "
                f"({' or '.join(CONTROLS)}); for servers started with the cache on and off give url_on and "
                "url_off"
            )
        elif not s.url and not (s.url_on and s.url_off):
            out.append(
                "engine.settings: give url_on and url_off (a server with prefix caching on, one with it off), "
                "or url with cache_control (e.g. --engine-setting url_on=http://127.0.0.1:8080 "
                "--engine-setting url_off=http://127.0.0.1:8081)"
            )
        elif not s.url and s.cache_control != "none":
            out.append(
                "engine.settings: cache_control applies to one url; with url_on and url_off the servers "
                "set the condition"
            )
        urls = list(dict.fromkeys(u for u in arm_urls(s).values() if u))
        try:
            parsed = [split_url(u) for u in urls]
        except ArtifactError as exc:
            return out + [str(exc).removeprefix("engine.settings: ")]
        if not s.url and s.url_on and s.url_off and split_url(s.url_on)[0] == split_url(s.url_off)[0]:
            out.append(
                "engine.settings: url_on and url_off are the same server; give it once as url with a cache_control"
            )
        remote = [u for u, (_, host, _) in zip(urls, parsed) if not is_loopback(host)]
        if remote and not s.allow_remote:
            out.append(
                f"engine.settings: {remote[0]} is not a loopback address: set allow_remote = true to use a "
                "server elsewhere (the run then needs ARTIFACT_ALLOW_NETWORK=1, is not network-isolated, and "
                "check flags it)"
            )
        owned = sorted(set(s.extra_request) & ({"model", "prompt", "max_tokens", *CONTROLS} | set(REQUEST_FIELDS)))
        if owned:
            out.append(f"engine.settings.extra_request sets {owned[0]}, which the protocol sets itself")
        if not cfg.model.source.startswith("server:"):
            out.append(
                'model.source must be "server:" for engine endpoint: the weights are the server\'s, the '
                "artifact cannot verify them"
            )
        if cfg.server.extra_args:
            out.append("server.extra_args: the server was started by its user; the artifact passes it no arguments")
        return out

    def settings(self, cfg, plan=None, where: str = "") -> Settings:
        s = super().settings(cfg, plan, where)
        for problem in self.plan_problems(plan) if plan is not None else []:
            raise ArtifactError(f"{where or cfg.path}: plan '{plan.name}': {problem}")
        return s

    def plan_problems(self, plan: Plan) -> list[str]:
        """A server the artifact did not start runs as its user started it: a plan that sets another engine's
        server or cache condition away from that engine's defaults (cram0's host cache, a mitigation) cannot be
        applied to it, nor a new server per run."""
        out = []
        if plan.lifecycle != "shared":
            out.append(
                f"lifecycle {plan.lifecycle!r} needs a new server per run; a server the artifact did not "
                "start cannot be restarted by it"
            )
        by_key = {engines.get(k).settings_key: engines.get(k) for k in engines.REGISTRY}
        for key, table in plan.engine_settings.items():
            other = by_key.get(key)
            if other is None or other is self or other.settings_type is None:
                continue
            defaults = {f.name: f.default for f in dataclasses.fields(other.settings_type)}
            changed = sorted(k for k, v in table.items() if defaults.get(k, dataclasses.MISSING) != v)
            if changed:
                out.append(
                    f"it sets {key}.{changed[0]} = {table[changed[0]]!r}, a condition of a server the artifact "
                    "starts; a server it did not start runs as its user started it"
                )
        return out

    def capabilities_for(self, cfg) -> Capabilities:
        if self.settings(cfg).url:
            return dataclasses.replace(self.capabilities, per_request_cache_switch=True, arms=None)
        return self.capabilities

    def observes(self, cfg, plan) -> dict:
        return observes(self.settings(cfg, plan))

    def loopback_servers(self, cfg) -> list[str]:
        s = self.settings(cfg)
        out = []
        for u in dict.fromkeys(arm_urls(s).values()):
            _, host, port = split_url(u)
            if is_loopback(host):
                out.append(f"{'127.0.0.1' if host == 'localhost' else host}:{port}")
        return out

    def identity(self, cfg: Config, plan: Plan) -> dict:
        """What can be known of what produces the tokens (pairing fingerprint): each arm's server identity as it
        reports it, the model id, the cache control and the request fields. The two arms' servers must report the
        same model and build."""
        s = self.settings(cfg, plan)
        urls = arm_urls(s)
        idents = {u: probe(cfg, s, u) for u in dict.fromkeys(urls.values())}
        servers = {arm: idents[u] for arm, u in urls.items()}
        models = {arm: model_id(s, servers[arm], urls[arm]) for arm in servers}
        held = {
            arm: held_to_declared(
                cfg, servers[arm], models[arm], urls[arm], f"the server at {urls[arm]} ({role(s, urls[arm])})"
            )
            for arm in servers
        }
        if not s.url:
            a, b = comparable(servers["off"]), comparable(servers["on"])
            diff = next((k for k in SAME if a[k] != b[k]), None) or (None if models["on"] == models["off"] else "model")
            if diff:
                raise ArtifactError(
                    f"the ON and OFF servers ({s.url_on}, {s.url_off}) report different {diff}: "
                    "they are not a pair (serve the same model from the same build)"
                )
        return {
            "engine": KIND,
            "servers": servers,
            "model_id": models["on"],
            "cache_control": s.cache_control if s.url else "per server",
            "request_fields": {**REQUEST_FIELDS, **s.extra_request},
            "unknown": ["server_cmd", "binary", "weights_sha256"],
            # what the servers report of their model, held against the configuration's [model] (held_to_declared)
            "model_held": held["on"],
        }

    def dry_run(self, cfg: Config, plan: Plan) -> list[str]:
        """Before a run, in about a minute: the servers answer (connect check), are the model the configuration
        declares (held_to_declared) and a pair; one timed request per server (a prompt about as long as BFCL's first
        ones, sharing no prefix with them, so that nothing of the workload is cached by it) says whether each
        reports its cache use and about how long the budget takes; and which claims these servers can decide."""
        s = self.settings(cfg, plan)
        urls = arm_urls(s)
        ident = self.identity(cfg, plan)
        held = ident["model_held"]
        rep = held["reported"]
        size = f"{rep['n_params'] / 1e6:,.0f}M parameters, " if "n_params" in rep else ""
        lines = [
            f"servers: {', '.join(f'{a.upper()} {u}' for a, u in urls.items())}: answering, model "
            f"{ident['model_id']!r} ({size}{rep.get('ftype', 'file type not reported')}, build "
            f"{rep.get('build', 'not reported')}, context {rep.get('n_ctx', 'not reported')})",
            f"declared [model]: {cfg.model.name!r} {cfg.model.quant}: quantization {held['quant']}; size "
            f"{held['n_params']}",
        ]
        timed, reports, cold = {}, {}, {}
        for arm in ("off", "on"):
            session = EndpointSession(self, cfg, plan, arm, Path("/dev/null"))
            session.identity, session.model = ident["servers"][arm], ident["model_id"]
            session.client = OpenAIClient(urls[arm], cfg.engine.request_timeout_s)
            try:
                if arm == "on":
                    cold = session.cold = session.cold_start()
                done, seconds, n_prompt = session.timed_request(cfg.workload.n_predict, arm == "on")
            finally:
                session.stop()
            timed[arm] = (seconds, n_prompt, len(done.tokens))
            reports[arm] = done.cache_n is not None
        per_request = max(t for t, _, _ in timed.values())
        w = cfg.workload.settings
        turns, steps = w.get("max_turns", 0), w.get("max_steps_per_turn", 20)
        episodes, runs = cfg.workload.episodes, plan.runs * len(plan.arms)
        typical = 10  # the paper's average requests per BFCL episode (7-13 by configuration)
        per_episode = min(typical, turns * (steps + 1)) if turns else typical
        bound = f"at most {turns * (steps + 1)} per episode" if turns else "no cap on turns (--turns)"
        minutes = runs * episodes * per_episode * per_request / 60
        lines.append(
            "timed: "
            + "; ".join(
                f"{a.upper()} {t:.1f} s for a {n:,}-token prompt and {g} generated tokens"
                for a, (t, n, g) in timed.items()
            )
        )
        lines.append(
            f"budget: {episodes} episodes x {runs} runs ({', '.join(plan.arms)} x {plan.runs}), about "
            f"{per_episode} requests per episode ({bound}), every request timed as the slower cold one: "
            f"about {minutes:.0f} min (an upper estimate: ON requests served from cache are faster; "
            "--episodes, --turns, --steps, --n-predict change it)"
        )
        lines.append(
            f"cold start of ON run 1: {cold['means']}: {cold.get('detail', '')}"
            + ("; so start the ON server fresh before the run" if cold["means"] == "none" else "")
        )
        lines += claims_lines(s, ident, reports, plan)
        return lines

    def describe_cache(self, cfg: Config, plan: Plan, arm: str) -> str:
        return describe(self.settings(cfg, plan), arm)

    def open_session(self, cfg: Config, plan: Plan, arm: str, model_path, log_path: Path) -> EndpointSession:
        return EndpointSession(self, cfg, plan, arm, log_path)


ENGINE = Endpoint()
