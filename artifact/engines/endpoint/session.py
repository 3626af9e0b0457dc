"""One arm's runs against a server the user runs (`EndpointSession`): no process of ours; it checks the server is
the one the pairing fingerprint names, makes the first run start cold where the server can be reset, sends greedy
/v1/completions requests through the shared OpenAI client and records what the server reports."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from artifact.config import Config, Plan
from artifact.engines.base import Completion, RequestError
from artifact.engines.endpoint import observe
from artifact.engines.openai_client import (
    OpenAIClient,
    error_message,
    is_loopback,
    one_line,
    parse_completion,
    split_url,
)
from artifact.errors import ArtifactError

from artifact.engines.endpoint.servers import comparable, model_id, probe
from artifact.engines.endpoint.settings import (
    KIND,
    REQUEST_FIELDS,
    UNKNOWN,
    Settings,
    arm_urls,
    control_fields,
    describe,
    observes,
)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of two token id arrays."""
    m = min(len(a), len(b))
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if len(differ) else m


class EndpointSession:
    """One arm's runs against a server the user runs: no process of ours; start() checks the server is the one the
    pairing fingerprint names, stop() closes the connection. Its log records every request."""

    kind = KIND
    cmd: list[str] = []

    def __init__(self, engine: Any, cfg: Config, plan: Plan, arm: str, log_path: Path):
        # engine: the endpoint engine (adapter.py), which holds its settings and the servers' pairing identity
        self.engine, self.cfg, self.plan, self.arm, self.log_path = engine, cfg, plan, arm, log_path
        self.settings: Settings = engine.settings(cfg, plan)
        self.url = arm_urls(self.settings)[arm]
        self.client: OpenAIClient | None = None
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
        expected = self.engine.identity(self.cfg, self.plan)["servers"][self.arm]
        if comparable(self.identity) != comparable(expected) or self.identity.get("props") != expected.get("props"):
            raise ArtifactError(
                f"the server at {self.url} changed since the run's fingerprint was made (another model or build): rerun"
            )
        self.model = model_id(self.settings, self.identity, self.url)
        self.client = OpenAIClient(self.url, self.cfg.engine.request_timeout_s)
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
        answer = self.client.complete(payload)
        body, seconds = answer.body, answer.seconds
        if answer.status != 200:
            message, _, _ = error_message(answer.status, body, answer.text)
            raise ArtifactError(
                f"the server at {self.url} failed the timed request (HTTP {answer.status}: {one_line(message)})"
            )
        done = parse_completion(body, None, seconds * 1000)
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
                "not_applicable": {k: v for k, v in self.plan.engine_settings.items() if k != self.engine.settings_key},
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
        answer = self.client.complete(payload)
        body, seconds = answer.body, answer.seconds
        wall_ms = seconds * 1000
        if answer.status != 200:
            message, overflow, n = error_message(answer.status, body, answer.text)
            self._log(f"request: HTTP {answer.status}: {message}")
            if overflow:
                raise RequestError(f"HTTP {answer.status}: {message}", n)
            raise ArtifactError(f"the server at {self.url} failed a request (HTTP {answer.status}: {message})")
        after = self._counter() if self.metrics else None
        delta = None if before is None or after is None else after - before
        done = parse_completion(body, delta, wall_ms)
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
