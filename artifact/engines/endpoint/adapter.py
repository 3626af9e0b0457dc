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
import numpy as np

from artifact.config import Config, Plan, choice
from artifact.engines.base import GREEDY, TOP_N, Capabilities, Completion, Engine, RequestError
from artifact.engines.endpoint import observe
from artifact.errors import ArtifactError
from artifact.provenance import network_interfaces
from artifact import engines

KIND = "endpoint"
REQUEST_FIELDS = {
    # OpenAI's own fields
    "temperature": GREEDY["temperature"],
    "top_p": GREEDY["top_p"],
    "seed": GREEDY["seed"],
    "logprobs": TOP_N,
    "stream": False,
    # greedy beyond OpenAI's fields, in the names the common servers read (a server ignores those it lacks)
    "top_k": GREEDY["top_k"],
    "min_p": GREEDY["min_p"],
    "repetition_penalty": GREEDY["repeat_penalty"],
    "repeat_penalty": GREEDY["repeat_penalty"],
    "samplers": ["top_k"],
    "post_sampling_probs": False,
    # the generated token ids (vLLM: return_token_ids, return_tokens_as_token_ids; llama-server: return_tokens and
    # verbose, whose __verbose field carries them whole)
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
    "return_tokens": True,
    "verbose": True,
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
        raise ArtifactError(f"engine.settings: {url!r}: give the server's base URL (no query, fragment or credentials)")
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


def control_fields(s: Settings, cache_prompt: bool, session_salt: str = "") -> dict:
    """The per-request cache control (none with one server per arm), and the session's own salt on requests that
    use the cache (cold_start: no block cached before the session can match them)."""
    if s.cache_control == "cache_prompt":
        return {"cache_prompt": cache_prompt}
    if s.cache_control == "cache_salt" and not cache_prompt:
        return {"cache_salt": uuid.uuid4().hex}  # a new salt: no cached block can match
    return {"cache_salt": session_salt} if session_salt and cache_prompt else {}


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of two token id arrays."""
    m = min(len(a), len(b))
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if len(differ) else m


def observes(s: Settings, metrics: bool | None = None) -> dict:
    """What this engine observes of its servers (engines.base.OBSERVES)."""
    sources = ["timings.cache_n", "usage.prompt_tokens_details.cached_tokens"]
    if s.metrics_counter and metrics is not False:
        sources.append(f"/metrics {s.metrics_counter}" + (" (if the server has it)" if metrics is None else ""))
    control = (
        f"per request ({s.cache_control}), by the artifact"
        if s.url
        else "per server, declared by the user (url_on, url_off): not set or verified by the artifact"
    )
    return {
        "server_cmd": False,
        "binary": False,
        "weights_sha256": False,
        "cache_use": "as the server reports it: " + ", ".join(sources) + "; null where it reports none",
        "cache_control": control,
        "logprobs": True,
        "exclusive": False,
    }


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


CONNECT_S = 3.0  # how long a URL where nothing listens is retried before the one-line error


def role(s: Settings, url: str) -> str:
    """Which setting gave `url`, for error messages: "url_on, the ON arm", "url_off, the OFF arm", "url, both arms"."""
    if s.url:
        return "url, both arms"
    return (
        " and ".join(f"url_{a}, the {a.upper()} arm" for a in ("on", "off") if getattr(s, f"url_{a}") == url) or "url"
    )


def connect(client: Client, timeout: float, where: str) -> None:
    """Up front, in seconds: a URL where nothing listens (connection refused, no such host) or that does not answer
    fails after CONNECT_S with a one-line error naming it; a server that answers "loading" (HTTP 503, a server the
    user just started) is waited for at most `timeout` seconds (engine.startup_timeout_s)."""
    t0 = time.monotonic()
    said = False
    while True:
        try:
            r = client.http.get("/v1/models", timeout=CONNECT_S)
        except httpx.TimeoutException:
            raise ArtifactError(
                f"{where} does not answer GET /v1/models within {CONNECT_S:.0f} s: is it the "
                "server's URL, and is the server up?"
            ) from None
        except httpx.TransportError as exc:
            if time.monotonic() - t0 > CONNECT_S:
                raise ArtifactError(
                    f"nothing answers at {where} ({type(exc).__name__}: "
                    f"{observe.one_line(exc, 80)}): start the server first, or fix the URL"
                ) from None
            time.sleep(0.3)
            continue
        if r.status_code != 503:
            return
        if time.monotonic() - t0 > timeout:
            raise ArtifactError(
                f"{where} still answers HTTP 503 (loading) after {timeout:.0f} s "
                "(engine.startup_timeout_s, --startup-timeout)"
            )
        if not said:
            print(
                f"{where} is loading (HTTP 503): waiting up to {timeout:.0f} s (engine.startup_timeout_s)",
                file=sys.stderr,
                flush=True,
            )
            said = True
        time.sleep(0.5)


def probe(cfg: Config, s: Settings, url: str) -> dict:
    """The identity of the server at `url` (observe.server_identity), after the network checks."""
    _, host, _ = split_url(url)
    where = f"the server at {url} ({role(s, url)})"
    if not is_loopback(host) and network_interfaces() == ["lo"]:
        raise ArtifactError(
            f"{url} ({role(s, url)}) is not a loopback address and this run is network-isolated: "
            "run it with ARTIFACT_ALLOW_NETWORK=1 (the run is then not isolated, and check says so)"
        )
    client = Client(url, cfg.engine.request_timeout_s)
    try:
        connect(client, cfg.engine.startup_timeout_s, where)
        return observe.server_identity(client.get, where)
    finally:
        client.close()


def held_to_declared(cfg: Config, ident: dict, model: str, url: str, where: str) -> dict:
    """What the server reports of its model (observe.reported_model), held against the configuration's [model]: a
    file type that is another quantization, or a parameter count that is not the size the model's name declares, is
    a one-line error before any request. Returns what was held and how (recorded in the pairing inputs)."""
    reported = observe.reported_model(ident, model)
    held = {"reported": reported, "declared": {"name": cfg.model.name, "quant": cfg.model.quant}}
    declared_quant = observe.quant_label(cfg.model.quant)
    got = reported.get("quant")
    if got and declared_quant and got != declared_quant:
        size = f", {reported['n_params'] / 1e6:,.0f}M parameters" if "n_params" in reported else ""
        raise ArtifactError(
            f"{where} reports its model is {reported['ftype']}{size} (/v1/models meta, /props), the "
            f"configuration declares {cfg.model.name!r} {cfg.model.quant}: set [model] name and "
            "quant to what the server serves, or give the URL of the declared model's server"
        )
    held["quant"] = "held: the server's file type" if got else "declared only: the server reports no file type"
    params, n = observe.declared_params(cfg.model.name), reported.get("n_params")
    if params and n:
        if not 0.7 < n / params < 1.4:
            raise ArtifactError(
                f"{where} reports a {n / 1e6:,.0f}M-parameter model (/v1/models meta.n_params), the "
                f"configuration declares {cfg.model.name!r} ({params / 1e6:,.0f}M): set [model] to "
                "what the server serves, or give the URL of the declared model's server"
            )
        held["n_params"] = "held: the server's parameter count against the size the model's name declares"
    else:
        held["n_params"] = "declared only: " + (
            "the server reports no parameter count" if params else "the model's name declares no size (e.g. 8B, 135M)"
        )
    return held


def model_id(s: Settings, ident: dict, url: str) -> str:
    ids = [m.get("id") for m in ident["models"]]
    if s.model:
        if s.model not in ids:
            raise ArtifactError(
                f"the server at {url} does not serve model {s.model!r} (it lists: {', '.join(map(str, ids)) or 'none'})"
            )
        return s.model
    if len(ids) != 1:
        raise ArtifactError(
            f"the server at {url} lists {len(ids)} models ({', '.join(map(str, ids))}): choose one "
            "with engine setting model"
        )
    return str(ids[0])


# what two arms' servers must report alike to be a pair (their addresses, paths and metrics may differ)
SAME = ("models", "version", "build_info", "n_ctx")


def comparable(ident: dict) -> dict:
    props = ident.get("props") or {}
    return {
        "models": ident.get("models"),
        "version": ident.get("version"),
        "build_info": props.get("build_info"),
        "n_ctx": props.get("n_ctx"),
    }


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
        self.cold: dict = {}  # how this session's first run was made to start cold (cold_start)
        self.salt = ""  # the session's own cache_salt, on its requests that use the cache (cold_start)
        # the token ids each request of this session can have left in the server's cache (its prompt, then what it
        # generated): a cached prefix longer than any of them was cached before the session (`complete`)
        self.sent: list[np.ndarray] | None = []

    def _log(self, line: str) -> None:
        with open(self.log_path, "a") as fh:
            fh.write(line.rstrip() + "\n")

    def start(self) -> "EndpointSession":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.identity = probe(self.cfg, self.settings, self.url)
        expected = ENGINE.identity(self.cfg, self.plan)["servers"][self.arm]
        if comparable(self.identity) != comparable(expected) or self.identity.get("props") != expected.get("props"):
            raise ArtifactError(
                f"the server at {self.url} changed since the run's fingerprint was made (another model or build): rerun"
            )
        self.model = model_id(self.settings, self.identity, self.url)
        self.client = Client(self.url, self.cfg.engine.request_timeout_s)
        self.metrics = bool(self.settings.metrics_counter) and self._counter() is not None
        self.cold = self.cold_start()
        self._log(
            f"# endpoint session: arm {self.arm}, {self.url}, model {self.model!r}; the server was started by "
            f"its user, not by the artifact\n# identity: {json.dumps(self.identity, sort_keys=True)}\n"
            f"# cached tokens from /metrics {self.settings.metrics_counter}: "
            f"{'yes' if self.metrics else 'no (the server has no such counter)'}\n"
            f"# cold start: {json.dumps(self.cold, sort_keys=True)}"
        )
        return self

    def cold_start(self) -> dict:
        """Make this session's first run start cold, by the server's own means (the paper's protocol starts ON run 1
        on a cache no request has touched): a salt of the session's own on every request that uses the cache, where
        the server has cache_salt (vLLM; or the user says so: cache_control = "cache_salt"), else the server's cache
        reset where it has one (llama-server: POST /slots/{id}?action=erase on every slot, which needs
        --slot-save-path), else none. Whatever the means, every request records how many of its cached tokens its
        session had not sent (`cached_before_session`), and check calls a run whose records show any warm
        (Endpoint.start_problem). The OFF arm's session needs none: it uses no cache."""
        if self.arm == "off":
            return {"means": "none needed (the OFF arm uses no cache)"}
        if self.settings.cache_control == "cache_salt" or observe.server_family(self.identity) == "vllm":
            self.salt = f"artifact-{uuid.uuid4().hex}"
            return {
                "means": "cache_salt",
                "detail": "a new cache_salt for this session on every request that uses "
                "the cache: no block cached before it can match",
                "salt": self.salt,
            }
        slots = (self.identity.get("props") or {}).get("total_slots")
        if isinstance(slots, int) and slots > 0:
            answers = [self.client.request("POST", f"/slots/{i}", params={"action": "erase"}) for i in range(slots)]
            if all(r.status_code == 200 for r in answers):
                return {
                    "means": "slot erase",
                    "detail": f"POST /slots/{{id}}?action=erase on all {slots} slots "
                    "before the first run (llama-server's host-memory prompt cache, --cache-ram, is not erased "
                    "by it: the records show whether the start was cold)",
                }
            bad = next(r for r in answers if r.status_code != 200)
            why = f"POST /slots/0?action=erase answered HTTP {bad.status_code}"
            if bad.status_code == 501:
                why += " (llama-server: start it with --slot-save-path DIR, and --cache-ram 0, to let it be reset)"
        else:
            why = "the server reports no slots to erase and no cache_salt"
        return {
            "means": "none",
            "detail": f"no way to reset this server's cache: {why}; the first run starts "
            "from whatever the server cached before, which the records show (cached_before_session)",
        }

    def _post_completion(self, payload: dict):
        """POST /v1/completions, timed: the response, its JSON body and the seconds it took; a body that is not
        JSON is a one-line error naming the server."""
        t0 = time.monotonic()
        r = self.client.request("POST", "/v1/completions", json=payload)
        seconds = time.monotonic() - t0
        try:
            body = r.json()
        except ValueError:
            raise ArtifactError(
                f"the server at {self.url} answered POST /v1/completions with HTTP {r.status_code} "
                f"without JSON: {observe.one_line(r.text)}"
            ) from None
        return r, body, seconds

    def timed_request(self, n_predict: int, cache_prompt: bool, target: int = 3800) -> tuple[Completion, float, int]:
        """One greedy request of about `target` prompt tokens that shares no prefix with the workload's prompts
        (plain text, no chat template), generating `n_predict` tokens where the server lets it ignore the end of
        text: (its completion, seconds, prompt tokens). Not recorded."""
        unit = "Timing request of the artifact's dry run, not part of any episode. "
        per = max(1, len(self.tokenize(unit)))
        prompt = unit * max(1, target // per)
        s = self.settings
        payload = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": n_predict,
            **REQUEST_FIELDS,
            "ignore_eos": True,
            **s.extra_request,
            **control_fields(s, cache_prompt, self.salt),
        }
        if payload.get("cache_salt"):
            payload["cache_salt"] = f"dry-run-{uuid.uuid4().hex}"
        r, body, seconds = self._post_completion(payload)
        if r.status_code != 200:
            message, _, _ = observe.error_message(r.status_code, body, r.text)
            raise ArtifactError(
                f"the server at {self.url} failed the timed request (HTTP {r.status_code}: {observe.one_line(message)})"
            )
        done = observe.parse_completion(body, None, seconds * 1000)
        return done, seconds, done.prompt_tokens

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
            "engine": KIND,
            "engine_build": observe.build_string(self.identity),
            "server_family": observe.server_family(self.identity),  # what the server says it is (owned_by)
            "server": {
                "url": self.url,
                "remote": self.remote,
                "model_id": self.model,
                "identity": self.identity,
                "started_by": "the user (not the artifact)",
            },
            "unknown": {
                "server_cmd": UNKNOWN,
                "binary": UNKNOWN,
                "weights_sha256": UNKNOWN,
                "exclusive": "whether other clients used the server during the runs: not observable",
            },
            "observes": observes(s, self.metrics),
            "cold_start": self.cold,
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
        return len(self.tokenize(prompt))

    def tokenize(self, prompt: str) -> list:
        """The prompt's token ids as the server tokenizes it for a completion (/tokenize, in vLLM's and
        llama-server's field names); ArtifactError if it has no usable /tokenize."""
        r = self.client.request(
            "POST",
            "/tokenize",
            json={
                "model": self.model,
                "prompt": prompt,
                "add_special_tokens": True,
                "content": prompt,
                "add_special": True,
                "parse_special": True,
            },
        )
        try:
            tokens = r.json().get("tokens")
        except (ValueError, AttributeError):
            tokens = None
        if r.status_code != 200 or not isinstance(tokens, list):
            raise ArtifactError(f"the server at {self.url} has no usable /tokenize (HTTP {r.status_code})")
        return tokens

    def session_prefix(self, prompt: str) -> tuple[np.ndarray | None, int | None]:
        """(the prompt's token ids, the longest prefix of them any earlier request of this session can have left in
        the server's cache); (None, None) where the server cannot tokenize. The first request's is 0 untokenized."""
        if self.sent is None or self.arm == "off":
            return None, None
        first = not self.sent
        try:
            ids = np.asarray(self.tokenize(prompt), dtype=np.int64)
        except ArtifactError:
            self.sent = None  # no /tokenize: only the first request's start is known
            return None, (0 if first else None)
        return ids, max((common_prefix(ids, done) for done in self.sent), default=0)

    def complete(self, prompt: str, n_predict: int, cache_prompt: bool) -> Completion:
        """One greedy /v1/completions request. A prompt beyond the context raises RequestError; any other
        failure is fatal (ArtifactError)."""
        s = self.settings
        if not s.url and cache_prompt != (self.arm == "on"):
            raise ArtifactError(
                f"a cache_prompt={cache_prompt} request on the {self.arm!r} arm's server: with one "
                "server per arm the cache cannot be switched per request"
            )
        payload = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": n_predict,
            **REQUEST_FIELDS,
            **s.extra_request,
            **control_fields(s, cache_prompt, self.salt),
        }
        ids, prefix = self.session_prefix(prompt)
        before = self._counter() if self.metrics else None
        r, body, seconds = self._post_completion(payload)
        wall_ms = seconds * 1000
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
        if prefix is not None:
            # cached tokens beyond what this session's own earlier requests can have left: cached before the session
            # (a warm start; Endpoint.start_problem), or by another client
            done.extra["session_prefix"] = prefix
            done.extra["cached_before_session"] = max(0, done.cache_n - prefix) if done.cache_n is not None else None
        if ids is not None and self.sent is not None:
            self.sent.append(np.concatenate([ids, np.asarray(done.tokens, dtype=np.int64)]))
        self._log(
            f"request: prompt_tokens {done.prompt_tokens}, cache_n {done.cache_n} "
            f"{json.dumps(done.extra['cache_sources'])}, {len(done.tokens)} tokens, {wall_ms:.0f} ms"
        )
        return done


def describe(s: Settings, arm: str) -> str:
    if s.url:
        off = {"cache_prompt": "cache_prompt false", "cache_salt": "a new cache_salt on every request"}
        on = {"cache_prompt": "cache_prompt true", "cache_salt": "no cache_salt"}
        return (
            f"one server run by its user ({s.url}), the cache switched per request: OFF {off[s.cache_control]}, "
            f"ON {on[s.cache_control]}"
        )
    url = s.url_on if arm == "on" else s.url_off
    return f"the {arm.upper()} arm's server run by its user ({url}): prefix caching {arm} as declared, not set here"


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
    identity_keys = ("engine", "servers", "model_id", "cache_control", "request_fields", "unknown")
    # (records made since also hold `model_held`: what the server reports of its model against [model])

    def family_of(self, manifest: dict) -> str | None:
        """What the recorded server identity reports (its /v1/models owned_by; None where it reports none or
        several), never the manifest's `server_family` label."""
        server = manifest.get("server")
        return observe.server_family(server.get("identity") if isinstance(server, dict) else None)

    def native_unavailable(self, cfg: Config, gpu: bool) -> str | None:
        return (
            f"engine {self.kind} talks to servers the user runs, which `./run.sh all` does not start: "
            "./run.sh run CONFIG (docs/own-server.md)"
        )

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

    def remote_servers(self, manifest: dict) -> list[str] | None:
        """The run's server as its manifest records it (`server.url`, the URL its requests went to): [] where that
        is a loopback address, [url] where it is not, None where no URL is recorded."""
        server = manifest.get("server")
        url = server.get("url") if isinstance(server, dict) else None
        if not isinstance(url, str):
            return None
        try:
            host = split_url(url)[1]
        except ArtifactError:
            return [url]  # not a URL this engine could have reached: not known to be loopback
        return [] if is_loopback(host) else [url]

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

    def start_problem(self, manifest: dict, requests: list[dict]) -> str | None:
        """A run of a session that uses the cache whose records show cached prompt tokens its session had not sent
        (`cached_before_session`: the server's cache from before the session, or another client's): a warm start.
        Records without that field (no /tokenize): the session's first run's first request served from cache. A
        first run whose server had no means to be reset and reports no cache use on its first request is not shown
        cold either."""
        arm, run = manifest.get("arm"), manifest.get("run")
        if arm == "off" or not requests:
            return None
        label = f"{arm}-run{run}"
        cold = manifest.get("cold_start") if isinstance(manifest.get("cold_start"), dict) else {}
        means = cold.get("means", "not recorded")
        for r in requests:
            n = (r.get("engine_extra") or {}).get("cached_before_session")
            if isinstance(n, int) and n > 0:
                return (
                    f"{label} did not start cold: episode {r.get('episode_id')} request {r.get('request_index')} "
                    f"was served {n} cached prompt tokens its session had not sent (of {r.get('cache_n')} "
                    f"cached; the server's cache from before the session, or another client's; cold-start "
                    f"means: {means})"
                )
        first = requests[0]
        if run == 1 and "cached_before_session" not in (first.get("engine_extra") or {}):
            n = first.get("cache_n")
            if isinstance(n, int) and n > 0:
                return (
                    f"{label} did not start cold: its first request was served {n} cached prompt tokens "
                    f"(cold-start means: {means})"
                )
            if n is None and means == "none":
                return (
                    f"{label}'s start is not shown cold: the server reports no cache use on its first request "
                    "and had no means to be reset"
                )
        return None

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
            session = EndpointSession(cfg, plan, arm, Path("/dev/null"))
            session.identity, session.model = ident["servers"][arm], ident["model_id"]
            session.client = Client(urls[arm], cfg.engine.request_timeout_s)
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
        return EndpointSession(cfg, plan, arm, log_path)


ENGINE = Endpoint()
