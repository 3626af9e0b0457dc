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
import ipaddress
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from artifact.config import Config, Plan, choice
from artifact.engines.base import GREEDY, TOP_N, Capabilities, Completion, Engine, RequestError
from artifact.engines.endpoint import observe
from artifact.errors import ArtifactError
from artifact.provenance import network_interfaces
from artifact import engines

KIND = "endpoint"
REQUEST_FIELDS = {
    # OpenAI's own fields
    "temperature": GREEDY["temperature"], "top_p": GREEDY["top_p"], "seed": GREEDY["seed"], "logprobs": TOP_N,
    "stream": False,
    # greedy beyond OpenAI's fields, in the names the common servers read (a server ignores those it lacks)
    "top_k": GREEDY["top_k"], "min_p": GREEDY["min_p"], "repetition_penalty": GREEDY["repeat_penalty"],
    "repeat_penalty": GREEDY["repeat_penalty"], "samplers": ["top_k"], "post_sampling_probs": False,
    # the generated token ids (vLLM: return_token_ids, return_tokens_as_token_ids; llama-server: return_tokens and
    # verbose, whose __verbose field carries them whole)
    "return_token_ids": True, "return_tokens_as_token_ids": True, "return_tokens": True, "verbose": True,
}
CONTROLS = ("cache_prompt", "cache_salt")
UNKNOWN = "not observable: a server the artifact did not start (its API does not say)"


@dataclass(frozen=True)
class Settings:
    url_on: str = ""  # one server per arm, as the user started them: prefix caching on, and off
    url_off: str = ""
    url: str = ""  # or one server for both arms (where given, url_on and url_off do not apply) ...
    cache_control: str = choice("none", *CONTROLS, default="none")  # ... with a per-request cache control
    model: str = ""  # the model id requested; "" = the only one /v1/models lists
    # a Prometheus counter of cached prompt tokens on the server's /metrics, read before and after every request
    # (requests are serial); "" = read none
    metrics_counter: str = "vllm:prefix_cache_hits_total"
    allow_remote: bool = False  # a URL that is not loopback: refused unless set (and then only without isolation)
    extra_request: dict = field(default_factory=dict)  # more request fields (the server's own; recorded)


def split_url(url: str) -> tuple[str, str, int]:
    """(base URL without a trailing /v1, host, port) of a server URL; ArtifactError if it is not http(s)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ArtifactError(f"engine.settings: {url!r} is not an http:// or https:// URL")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ArtifactError(f"engine.settings: {url!r}: give the server's base URL (no query, fragment or "
                            "credentials)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ArtifactError(f"engine.settings: {url!r} has an invalid port") from None
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    host = parts.hostname
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}{path}", host, port


def is_loopback(host: str) -> bool:
    """A loopback address or "localhost" (names are not resolved: any other name counts as remote)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def arm_urls(s: Settings) -> dict[str, str]:
    """arm -> the base URL that serves it."""
    if s.url:
        return {"off": s.url, "on": s.url}
    return {"off": s.url_off, "on": s.url_on}


def control_fields(s: Settings, cache_prompt: bool) -> dict:
    """The per-request cache control (none with one server per arm)."""
    if s.cache_control == "cache_prompt":
        return {"cache_prompt": cache_prompt}
    if s.cache_control == "cache_salt" and not cache_prompt:
        return {"cache_salt": uuid.uuid4().hex}  # a new salt: no cached block can match
    return {}


def observes(s: Settings, metrics: bool | None = None) -> dict:
    """What this engine observes of its servers (engines.base.OBSERVES)."""
    sources = ["timings.cache_n", "usage.prompt_tokens_details.cached_tokens"]
    if s.metrics_counter and metrics is not False:
        sources.append(f"/metrics {s.metrics_counter}" + (" (if the server has it)" if metrics is None else ""))
    control = (f"per request ({s.cache_control}), by the artifact" if s.url else
               "per server, declared by the user (url_on, url_off): not set or verified by the artifact")
    return {"server_cmd": False, "binary": False, "weights_sha256": False,
            "cache_use": "as the server reports it: " + ", ".join(sources) + "; null where it reports none",
            "cache_control": control, "logprobs": True, "exclusive": False}


class Client:
    """HTTP to one server, every failure a one-line ArtifactError."""

    def __init__(self, base: str, timeout: float):
        self.base = base
        self.http = httpx.Client(base_url=base, timeout=timeout, trust_env=False)  # no proxy from the environment

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ArtifactError(f"the server at {self.base} does not answer ({type(exc).__name__}: {exc})") from None

    def get(self, path: str):
        """(status, headers, JSON body, or text for /metrics, or None)"""
        r = self.request("GET", path)
        if path == "/metrics":
            return r.status_code, r.headers, r.text if r.status_code == 200 else None
        try:
            return r.status_code, r.headers, r.json()
        except ValueError:
            return r.status_code, r.headers, None


def wait_for(client: Client, timeout: float) -> None:
    """Until the server answers /v1/models, at most `timeout` seconds (a server the user just started)."""
    deadline, said = time.monotonic() + timeout, False
    while True:
        try:
            client.http.get("/v1/models", timeout=5)
            return
        except httpx.TransportError as exc:
            if time.monotonic() > deadline:
                raise ArtifactError(f"no server answers at {client.base} ({type(exc).__name__}) after "
                                    f"{timeout:.0f} s (engine.startup_timeout_s): start it first") from None
            if not said:
                print(f"waiting up to {timeout:.0f} s for the server at {client.base} (engine.startup_timeout_s)",
                      file=sys.stderr, flush=True)
                said = True
            time.sleep(0.5)


def probe(cfg: Config, s: Settings, url: str) -> dict:
    """The identity of the server at `url` (observe.server_identity), after the network checks."""
    _, host, _ = split_url(url)
    if not is_loopback(host) and network_interfaces() == ["lo"]:
        raise ArtifactError(f"{url} is not a loopback address and this run is network-isolated: run it with "
                            "ARTIFACT_ALLOW_NETWORK=1 (the run is then not isolated, and check says so)")
    client = Client(url, cfg.engine.request_timeout_s)
    try:
        wait_for(client, cfg.engine.startup_timeout_s)
        return observe.server_identity(client.get)
    finally:
        client.close()


def model_id(s: Settings, ident: dict, url: str) -> str:
    ids = [m.get("id") for m in ident["models"]]
    if s.model:
        if s.model not in ids:
            raise ArtifactError(f"the server at {url} does not serve model {s.model!r} (it lists: "
                                f"{', '.join(map(str, ids)) or 'none'})")
        return s.model
    if len(ids) != 1:
        raise ArtifactError(f"the server at {url} lists {len(ids)} models ({', '.join(map(str, ids))}): choose one "
                            "with engine setting model")
    return str(ids[0])


# what two arms' servers must report alike to be a pair (their addresses, paths and metrics may differ)
SAME = ("models", "version", "build_info", "n_ctx")


def comparable(ident: dict) -> dict:
    props = ident.get("props") or {}
    return {"models": ident.get("models"), "version": ident.get("version"), "build_info": props.get("build_info"),
            "n_ctx": props.get("n_ctx")}


class EndpointSession:
    """One arm's runs against a server the user runs: no process of ours; start() checks the server is the one the
    pairing fingerprint names, stop() closes the connection. Its log records every request."""

    kind = KIND
    cmd: list[str] = []

    def __init__(self, cfg: Config, plan: Plan, arm: str, log_path: Path):
        self.cfg, self.plan, self.arm, self.log_path = cfg, plan, arm, log_path
        self.settings = ENGINE.settings(cfg, plan)
        self.url = arm_urls(self.settings)[arm]
        self.client: Client | None = None
        self.identity: dict = {}
        self.model = ""
        self.metrics = False  # whether the server's /metrics has the counter
        self.remote = not is_loopback(split_url(self.url)[1])

    def _log(self, line: str) -> None:
        with open(self.log_path, "a") as fh:
            fh.write(line.rstrip() + "\n")

    def start(self) -> "EndpointSession":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.identity = probe(self.cfg, self.settings, self.url)
        expected = ENGINE.identity(self.cfg, self.plan)["servers"][self.arm]
        if comparable(self.identity) != comparable(expected) or self.identity.get("props") != expected.get("props"):
            raise ArtifactError(f"the server at {self.url} changed since the run's fingerprint was made (another "
                                "model or build): rerun")
        self.model = model_id(self.settings, self.identity, self.url)
        self.client = Client(self.url, self.cfg.engine.request_timeout_s)
        self.metrics = bool(self.settings.metrics_counter) and self._counter() is not None
        self._log(f"# endpoint session: arm {self.arm}, {self.url}, model {self.model!r}; the server was started by "
                  f"its user, not by the artifact\n# identity: {json.dumps(self.identity, sort_keys=True)}\n"
                  f"# cached tokens from /metrics {self.settings.metrics_counter}: "
                  f"{'yes' if self.metrics else 'no (the server has no such counter)'}")
        return self

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def __enter__(self) -> "EndpointSession":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _counter(self) -> float | None:
        status, _, text = self.client.get("/metrics")
        return observe.counter(text, self.settings.metrics_counter) if status == 200 and text else None

    def provenance(self) -> dict:
        s = self.settings
        return {
            "engine": KIND, "engine_build": observe.build_string(self.identity),
            "server_family": observe.server_family(self.identity),  # what the server says it is (owned_by)
            "server": {"url": self.url, "remote": self.remote, "model_id": self.model, "identity": self.identity,
                       "started_by": "the user (not the artifact)"},
            "unknown": {"server_cmd": UNKNOWN, "binary": UNKNOWN, "weights_sha256": UNKNOWN,
                        "exclusive": "whether other clients used the server during the runs: not observable"},
            "observes": observes(s, self.metrics),
            "cache_condition": {
                "description": describe(s, self.arm),
                "control": s.cache_control if s.url else "per server (url_on, url_off)",
                "settings": {"arms": arm_urls(s), "cache_control": s.cache_control},
                "not_applicable": {k: v for k, v in self.plan.engine_settings.items() if k != ENGINE.settings_key},
            },
            "not_applicable_server_settings": dataclasses.asdict(self.cfg.server),
        }

    def count_tokens(self, prompt: str) -> int:
        """The prompt's length as the server tokenizes it (/tokenize, in vLLM's and llama-server's field names)."""
        r = self.client.request("POST", "/tokenize", json={
            "model": self.model, "prompt": prompt, "add_special_tokens": True,
            "content": prompt, "add_special": True, "parse_special": True})
        try:
            tokens = r.json().get("tokens")
        except (ValueError, AttributeError):
            tokens = None
        if r.status_code != 200 or not isinstance(tokens, list):
            raise ArtifactError(f"the server at {self.url} has no usable /tokenize (HTTP {r.status_code})")
        return len(tokens)

    def complete(self, prompt: str, n_predict: int, cache_prompt: bool) -> Completion:
        """One greedy /v1/completions request. A prompt beyond the context raises RequestError; any other
        failure is fatal (ArtifactError)."""
        s = self.settings
        if not s.url and cache_prompt != (self.arm == "on"):
            raise ArtifactError(f"a cache_prompt={cache_prompt} request on the {self.arm!r} arm's server: with one "
                                "server per arm the cache cannot be switched per request")
        payload = {"model": self.model, "prompt": prompt, "max_tokens": n_predict, **REQUEST_FIELDS,
                   **s.extra_request, **control_fields(s, cache_prompt)}
        before = self._counter() if self.metrics else None
        t0 = time.monotonic()
        r = self.client.request("POST", "/v1/completions", json=payload)
        wall_ms = (time.monotonic() - t0) * 1000
        try:
            body = r.json()
        except ValueError:
            raise ArtifactError(f"the server at {self.url} answered HTTP {r.status_code} without JSON: "
                                f"{r.text[:200]}") from None
        if r.status_code != 200:
            message, overflow, n = observe.error_message(r.status_code, body, r.text)
            self._log(f"request: HTTP {r.status_code}: {message}")
            if overflow:
                raise RequestError(f"HTTP {r.status_code}: {message}", n)
            raise ArtifactError(f"the server at {self.url} failed a request (HTTP {r.status_code}: {message})")
        after = self._counter() if self.metrics else None
        delta = None if before is None or after is None else after - before
        done = observe.parse_completion(body, delta, wall_ms)
        salt = payload.get("cache_salt")
        if salt:
            done.extra["cache_salt"] = salt
        self._log(f"request: prompt_tokens {done.prompt_tokens}, cache_n {done.cache_n} "
                  f"{json.dumps(done.extra['cache_sources'])}, {len(done.tokens)} tokens, {wall_ms:.0f} ms")
        return done


def describe(s: Settings, arm: str) -> str:
    if s.url:
        off = {"cache_prompt": "cache_prompt false", "cache_salt": "a new cache_salt on every request"}
        on = {"cache_prompt": "cache_prompt true", "cache_salt": "no cache_salt"}
        return (f"one server run by its user ({s.url}), the cache switched per request: OFF {off[s.cache_control]}, "
                f"ON {on[s.cache_control]}")
    url = s.url_on if arm == "on" else s.url_off
    return f"the {arm.upper()} arm's server run by its user ({url}): prefix caching {arm} as declared, not set here"


class Endpoint(Engine):
    kind = KIND
    # one server per arm by default; `url` with a cache control switches the cache per request (capabilities_for)
    # reports_cache_use False: a server reports cached tokens only where it has a field or counter for them (vLLM
    # without its /metrics reports none on a miss); a null cache_n is "not reported", and RQ1 says so (INCONCLUSIVE)
    capabilities = Capabilities(per_request_cache_switch=False, cache_tiers=(), metrics_endpoint=None, image=None,
                                arms=("off", "on"), packages=(), loads_weights=False, reports_cache_use=False)
    settings_type = Settings
    identity_keys = ("engine", "servers", "model_id", "cache_control", "request_fields", "unknown")

    def family_of(self, manifest: dict) -> str | None:
        """What the recorded server identity reports (its /v1/models owned_by; None where it reports none or
        several), never the manifest's `server_family` label."""
        server = manifest.get("server")
        return observe.server_family(server.get("identity") if isinstance(server, dict) else None)

    def native_unavailable(self, cfg: Config, gpu: bool) -> str | None:
        return (f"engine {self.kind} talks to servers the user runs, which `./run.sh all` does not start: "
                "./run.sh run CONFIG (docs/your-own-stack.md)")

    def problems(self, cfg: Config, s: Settings) -> list[str]:
        out = []
        if s.url and s.cache_control == "none":
            out.append("engine.settings: one url serves both arms only with a per-request cache_control "
                       f"({' or '.join(CONTROLS)}); for servers started with the cache on and off give url_on and "
                       "url_off")
        elif not s.url and not (s.url_on and s.url_off):
            out.append("engine.settings: give url_on and url_off (a server with prefix caching on, one with it off), "
                       "or url with cache_control (e.g. --engine-setting url_on=http://127.0.0.1:8080 "
                       "--engine-setting url_off=http://127.0.0.1:8081)")
        elif not s.url and s.cache_control != "none":
            out.append("engine.settings: cache_control applies to one url; with url_on and url_off the servers "
                       "set the condition")
        urls = list(dict.fromkeys(u for u in arm_urls(s).values() if u))
        try:
            parsed = [split_url(u) for u in urls]
        except ArtifactError as exc:
            return out + [str(exc).removeprefix("engine.settings: ")]
        if not s.url and s.url_on and s.url_off and split_url(s.url_on)[0] == split_url(s.url_off)[0]:
            out.append("engine.settings: url_on and url_off are the same server; give it once as url with a "
                       "cache_control")
        remote = [u for u, (_, host, _) in zip(urls, parsed) if not is_loopback(host)]
        if remote and not s.allow_remote:
            out.append(f"engine.settings: {remote[0]} is not a loopback address: set allow_remote = true to use a "
                       "server elsewhere (the run then needs ARTIFACT_ALLOW_NETWORK=1, is not network-isolated, and "
                       "check flags it)")
        owned = sorted(set(s.extra_request) & ({"model", "prompt", "max_tokens", *CONTROLS} | set(REQUEST_FIELDS)))
        if owned:
            out.append(f"engine.settings.extra_request sets {owned[0]}, which the protocol sets itself")
        if not cfg.model.source.startswith("server:"):
            out.append("model.source must be \"server:\" for engine endpoint: the weights are the server's, the "
                       "artifact cannot verify them")
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
            out.append(f"lifecycle {plan.lifecycle!r} needs a new server per run; a server the artifact did not "
                       "start cannot be restarted by it")
        by_key = {engines.get(k).settings_key: engines.get(k) for k in engines.REGISTRY}
        for key, table in plan.engine_settings.items():
            other = by_key.get(key)
            if other is None or other is self or other.settings_type is None:
                continue
            defaults = {f.name: f.default for f in dataclasses.fields(other.settings_type)}
            changed = sorted(k for k, v in table.items() if defaults.get(k, dataclasses.MISSING) != v)
            if changed:
                out.append(f"it sets {key}.{changed[0]} = {table[changed[0]]!r}, a condition of a server the artifact "
                           "starts; a server it did not start runs as its user started it")
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
        if not s.url:
            a, b = comparable(servers["off"]), comparable(servers["on"])
            diff = next((k for k in SAME if a[k] != b[k]), None) or (None if models["on"] == models["off"] else
                                                                      "model")
            if diff:
                raise ArtifactError(f"the ON and OFF servers ({s.url_on}, {s.url_off}) report different {diff}: "
                                    "they are not a pair (serve the same model from the same build)")
        return {
            "engine": KIND, "servers": servers, "model_id": models["on"],
            "cache_control": s.cache_control if s.url else "per server",
            "request_fields": {**REQUEST_FIELDS, **s.extra_request},
            "unknown": ["server_cmd", "binary", "weights_sha256"],
        }

    def describe_cache(self, cfg: Config, plan: Plan, arm: str) -> str:
        return describe(self.settings(cfg, plan), arm)

    def open_session(self, cfg: Config, plan: Plan, arm: str, model_path, log_path: Path) -> EndpointSession:
        return EndpointSession(cfg, plan, arm, log_path)


ENGINE = Endpoint()
