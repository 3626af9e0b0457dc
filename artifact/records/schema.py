"""The one schema of the run records: every field of the manifest, request and unit (episode) records, typed.

The writer (`store.RunWriter`) refuses a record that breaks it before writing it, and every reader (`check`, the
analyses, `summary`, `compare`) validates the records it loads through the same `Schema` objects, so writer and
readers cannot drift apart. A field not listed is allowed (engines and workloads add their own: `engine_extra`,
BFCL's `steps`, the GSM8K bridge's `servings`); a listed one must have its type. A request that failed (its
`error` is set) carries no output, so the fields only a served request has are required only when `error` is null
(and type-checked whenever present). Each kind also has its cross-field rules (`Rule`: a request's cache
accounting, its log-probabilities against its tokens; a manifest's timestamps and its pairing fingerprint against
`pairing_inputs`, the model and the engine), checked after the fields.

    MANIFEST, REQUEST, UNIT    the three record kinds of every run
    TENANT                     tenants.jsonl, the fourth, of a run with background tenants
    Schema.problem(record)     the first broken field or rule as "field 'x' ...", or None
    Schema.valid(record)       the same test as a bool, compiled (the readers' fast path)
    Schema.decoder(raw)        a msgspec decoder that checks every field's type and range while decoding (the
                               fields named in `raw` are kept as JSON text), and
    Schema.valid_decoded(r)    the rest of `valid` for a record that decoder returned: required fields and rules

One module: the schema is one contract, read top to bottom: the field types, the rules across fields and the record
kinds that use them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Annotated, Any, Callable, TypedDict, Union

from artifact.provenance import fingerprint

NoneType = type(None)
Number = (int, float)


def _is(value: Any, kinds: tuple[Any, ...]) -> bool:
    """isinstance without bool passing for int (JSON true is not a count)."""
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds)


@dataclass(frozen=True)
class Field:
    name: str
    kinds: tuple[Any, ...]  # accepted Python types of the decoded JSON value (NoneType for null)
    doc: str
    required: bool = True  # must be present (with one of `kinds`); a present field is always type-checked
    served: bool = False  # requests: required only when the request did not fail (error is null)
    check: Callable[[Any], str | None] | None = None  # a further rule: a reason, or None

    def problem(self, record: dict[str, Any], served: bool = True) -> str | None:
        if self.name not in record:
            return f"field '{self.name}' is missing" if self.required and (served or not self.served) else None
        value = record[self.name]
        if not _is(value, self.kinds):
            names = "/".join("null" if k is NoneType else k.__name__ for k in self.kinds)
            return f"field '{self.name}' must be {names}, not {type(value).__name__}"
        if self.check is not None and value is not None:
            why = self.check(value)
            if why:
                return f"field '{self.name}' {why}"
        return None


@dataclass(frozen=True)
class Rule:
    """A fact that relates fields of one record; `check` gets the record once its fields are valid, and returns
    the reason it is broken ("field 'x' ..."), or None."""

    doc: str
    check: Callable[[dict[str, Any]], str | None]


@dataclass(frozen=True)
class Schema:
    kind: str  # "manifest", "request", "unit"
    file: str
    fields: tuple[Field, ...]
    rules: tuple[Rule, ...] = ()
    names: dict[str, Any] = field(init=False, repr=False, compare=False)
    valid: Callable[..., Any] = field(
        init=False, repr=False, compare=False
    )  # record -> bool, the fast path of problem()
    valid_decoded: Callable[..., Any] = field(
        init=False, repr=False, compare=False
    )  # the same, for `decoder`'s records

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", {f.name: f for f in self.fields})
        object.__setattr__(self, "valid", _compile(self.fields, self.rules))
        object.__setattr__(self, "valid_decoded", _compile(self.fields, self.rules, typed=True))

    def decoder(self, raw: tuple[str, ...] = ()) -> Any:
        """A msgspec JSON decoder of one record of this kind that refuses, while decoding, every value whose type or
        range the schema refuses (a field's kinds and check: `_decoder`), so that `valid_decoded` need only check the
        required fields and the rules. It returns a plain dict holding the fields that were present; the fields
        named in `raw` are returned as msgspec.Raw (their JSON text, checked by the caller), and fields the schema
        does not list are left out (the caller notices: `reading._all_keys_decoded`)."""
        return _decoder(self, raw)

    def problem(self, record: Any) -> str | None:
        """The first field this record breaks, or None."""
        if not isinstance(record, dict):
            return f"a {self.kind} record must be a JSON object, not {type(record).__name__}"
        served = dict.get(record, "error") is None  # plain lookup: readers may hand a lazily decoding dict
        for f in self.fields:
            why = f.problem(record, served)
            if why:
                return why
        return next((why for r in self.rules if (why := r.check(record))), None)

    def describe(self) -> list[dict[str, Any]]:
        """The schema as data, one entry per field (the records docs/records.md describes in words)."""
        return [
            {
                "field": f.name,
                "type": "/".join("null" if k is NoneType else k.__name__ for k in f.kinds),
                "required": f.required and not f.served,
                "doc": f.doc,
            }
            for f in self.fields
        ]


_MISSING = object()


def _compile(fields: tuple[Any, ...], rules: tuple[Any, ...], typed: bool = False) -> Callable[[dict[str, Any]], bool]:
    """One function that tells whether a record satisfies every field and rule, with no per-field call: readers run
    it on every request of every run (32,000 at paper scale), and `problem` says why only when it answers False.
    typed: for records `Schema.decoder` returned, whose fields' types and ranges it checked already."""
    lines = ["def valid(r):", " if not isinstance(r, dict): return False", " served = _get(r, 'error') is None"]
    env: dict[str, Any] = {"_get": dict.get, "_MISSING": _MISSING}
    for i, f in enumerate(fields):
        if typed and not f.required:
            continue  # its type and range were checked as it was decoded: nothing is left to check
        env[f"k{i}"] = frozenset(f.kinds)
        lines.append(f" v = _get(r, {f.name!r}, _MISSING)")
        if f.required:
            lines.append(f" if v is _MISSING{' and served' if f.served else ''}: return False")
        if typed:
            continue
        lines.append(f" if v is not _MISSING and type(v) not in k{i}: return False")
        if f.check is not None:
            env[f"c{i}"] = f.check
            lines.append(f" if v is not _MISSING and v is not None and c{i}(v): return False")
    for i, rule in enumerate(rules):
        env[f"r{i}"] = rule.check
        lines.append(f" if r{i}(r): return False")
    lines.append(" return True")
    exec("\n".join(lines), env)  # our own field table, not input
    valid: Callable[[dict[str, Any]], bool] = env["valid"]
    return valid


def _nonneg(v: float) -> str | None:
    return "must be >= 0" if v < 0 else None


def _positive(v: float) -> str | None:
    return "must be >= 1" if v < 1 else None


_HEX64 = re.compile("[0-9a-f]{64}")


def _hex64(v: str) -> str | None:
    return None if _HEX64.fullmatch(v) else "must be 64 lower-case hex digits"


def _ints(v: list[Any]) -> str | None:
    return None if all(type(t) is int and t >= 0 for t in v) else "must list token ids (integers >= 0)"


def _strs(v: list[Any]) -> str | None:
    return None if all(type(t) is str for t in v) else "must list unit ids (strings)"


def _status(v: str) -> str | None:
    return None if v in ("incomplete", "complete") else "must be 'incomplete' or 'complete'"


def _iso(v: str) -> str | None:
    try:
        ok = datetime.fromisoformat(v).utcoffset() is not None
    except ValueError:
        ok = False
    return None if ok else "must be an ISO 8601 time with its UTC offset"


# --- cross-field rules ----------------------------------------------------------------------------------------
# A rule runs once the record's fields are valid, so it may trust their types. Plain dict lookups: readers hand
# records whose top_logprobs are still JSON text (reading.LazyRecord); those are checked in bulk by the reader
# (store.top2_problem), by the same rule as `top_logprobs_problem`.

_get = dict.get


def _cache_accounting(r: dict[str, Any]) -> str | None:
    """Where a prompt's tokens came from adds up (llama.cpp's timings and vLLM's usage both say it): cache_n and
    prompt_n never exceed prompt_tokens, and for a served request cache_n + prompt_n = prompt_tokens, so a cached
    token can neither be reported as 0 nor hide behind a null cache_n."""
    cn, pn, pt = _get(r, "cache_n"), _get(r, "prompt_n"), _get(r, "prompt_tokens")
    if pt is None:
        if _get(r, "error") is None and (cn or pn is not None):
            return (
                "field 'prompt_tokens' is null in a served request that reports cache_n or prompt_n: its cache "
                "accounting cannot be checked"
            )
        return None
    for name, v in (("cache_n", cn), ("prompt_n", pn)):
        if v is not None and v > pt:
            return f"field '{name}' ({v}) exceeds prompt_tokens ({pt})"
    if _get(r, "error") is not None or pn is None or (cn or 0) + pn == pt:
        return None
    if cn is None:
        return (
            f"field 'cache_n' is null (not reported) although prompt_n ({pn}) < prompt_tokens ({pt}): "
            "the other prompt tokens were served from somewhere"
        )
    return (
        f"field 'cache_n' ({cn}) + prompt_n ({pn}) must equal prompt_tokens ({pt}) in a served request: "
        "the record's cache accounting does not add up"
    )


# What a softmax can give, within the rounding of the engines' float32 arithmetic: the H200 evidence holds
# log-probabilities of exactly 0.0 and top-2 probabilities that sum to 1 + 6e-8.
LOGPROB_TOLERANCE = 1e-6  # a log-probability is <= this (nats)
PROB_SUM_TOLERANCE = 1e-6  # the probabilities of one position sum to <= 1 + this


def top_logprobs_problem(top: list[Any], tokens: list[Any]) -> str | None:
    """Why a request's log-probabilities do not belong to its tokens, or None: one position per generated token,
    each null (the engine gave none) or [[token id, logprob], ...] best first, as a softmax gives them (finite
    log-probabilities <= 0, each token once, probabilities that sum to <= 1, within LOGPROB_TOLERANCE and
    PROB_SUM_TOLERANCE), the emitted token among the most likely (greedy decoding: it is the argmax; a tie may list
    another first). `store.top2_problem` checks the same rule on a run's top-2 texts at once."""
    if len(top) != len(tokens):
        return f"field 'top_logprobs' has {len(top)} positions for {len(tokens)} output_tokens"
    for i, (tok, at) in enumerate(zip(tokens, top)):
        if at is None:
            continue
        if not (
            type(at) is list
            and at
            and all(type(e) is list and len(e) == 2 and type(e[0]) is int and type(e[1]) in Number for e in at)
        ):
            return f"field 'top_logprobs' position {i} must be null or a list of [token id, logprob] pairs"
        lps = [e[1] for e in at]
        bad = next((lp for lp in lps if not math.isfinite(lp)), None)
        if bad is not None:
            return f"field 'top_logprobs' position {i}: log-probability {bad} is not finite"
        if max(lps) > LOGPROB_TOLERANCE:
            return (
                f"field 'top_logprobs' position {i}: log-probability {max(lps)!r} is above 0 (tolerance "
                f"{LOGPROB_TOLERANCE:g}): no softmax gives it"
            )
        ids = [e[0] for e in at]
        if len(set(ids)) != len(ids):
            twice = next(t for k, t in enumerate(ids) if t in ids[:k])
            return f"field 'top_logprobs' position {i}: token {twice} is listed twice"
        total = math.fsum(math.exp(lp) for lp in lps)
        if total > 1 + PROB_SUM_TOLERANCE:
            return (
                f"field 'top_logprobs' position {i}: the probabilities sum to {total:.9g} > 1 (tolerance "
                f"{PROB_SUM_TOLERANCE:g}): no softmax gives them"
            )
        if any(not a >= b for a, b in zip(lps, lps[1:])):
            return f"field 'top_logprobs' position {i} is not ordered best first"
        if not any(e[0] == tok and e[1] == lps[0] for e in at):
            return f"field 'top_logprobs' position {i}: the emitted token {tok} is not the most likely entry"
    return None


def _top_logprobs(r: dict[str, Any]) -> str | None:
    top = _get(r, "top_logprobs")
    return None if top is None else top_logprobs_problem(top, r["output_tokens"])


def _timestamps(m: dict[str, Any]) -> str | None:
    start, end = _get(m, "started_at"), _get(m, "finished_at")
    if _get(m, "status") == "complete" and end is None:
        return "field 'finished_at' is null in a run marked complete"
    if start is not None and end is not None and datetime.fromisoformat(end) < datetime.fromisoformat(start):
        return f"field 'finished_at' ({end}) is before started_at ({start})"
    return None


def _pairing(m: dict[str, Any]) -> str | None:
    """A pairing fingerprint is the digest of the manifest's pairing_inputs (artifact.provenance.fingerprint, as
    the protocol makes it), and those name the manifest's own model (sha256), engine and episodes."""
    fp = _get(m, "pairing_fingerprint")
    if fp is None:
        return None  # made by an older version: INVALID for comparisons (analysis.divergence.record_problems)
    inputs = _get(m, "pairing_inputs")
    if inputs is None:
        return "field 'pairing_inputs' is missing: the pairing_fingerprint cannot be verified"
    if fingerprint(inputs) != fp:
        return f"field 'pairing_fingerprint' ({fp}) is not the digest of the manifest's pairing_inputs"
    engine = _get(inputs, "engine")
    engine = _get(engine, "engine") if isinstance(engine, dict) else engine
    model = _get(m, "model")
    facts = (
        (
            "model_sha256",
            inputs.get("model_sha256"),
            "model.sha256",
            _get(model, "sha256") if isinstance(model, dict) else None,
        ),
        ("engine", engine, "engine", _get(m, "engine")),
    )
    for name, theirs, field_name, ours in facts:
        if theirs is None or theirs != ours:
            return f"field 'pairing_inputs' names {name} {theirs!r}, the manifest's {field_name} is {ours!r}"
    if "units" in inputs and inputs["units"] != m["episodes"]:
        return "field 'pairing_inputs' lists other units than the manifest's episodes"
    return None


# --- the typed decoder (msgspec) ------------------------------------------------------------------------------
# Each field's kinds and check as a msgspec type, so that the decoder refuses what `Field.problem` refuses: msgspec
# never reads JSON true as an int nor 2.0 as an int, and its constraints are the checks' (`meta`, `elements`). A
# check without an entry there cannot be typed (`_decoder` raises TypeError): only REQUEST is decoded this way.


def _kind_type(kind: Any, element: Any = Any) -> Any:
    if kind is NoneType:
        return None
    if kind is list:
        return list[element]
    if kind is dict:
        return dict[str, Any]
    return kind


@cache
def _decoder(schema: Schema, raw: tuple[str, ...]) -> Any:
    import msgspec  # the writer never decodes

    meta: dict[Callable[[Any], str | None], Any] = {
        _nonneg: msgspec.Meta(ge=0),
        _positive: msgspec.Meta(ge=1),
        _hex64: msgspec.Meta(pattern=r"\A[0-9a-f]{64}\Z"),
    }  # msgspec searches: anchored, no final newline
    elements: dict[Callable[[Any], str | None] | None, Any] = {_ints: Annotated[int, msgspec.Meta(ge=0)], _strs: str}
    types: dict[str, Any] = {}
    for f in schema.fields:
        if f.name in raw:
            types[f.name] = msgspec.Raw
            continue
        if f.check is None or f.check in elements:
            kinds = [_kind_type(k, elements.get(f.check, Any)) for k in f.kinds]
        elif f.check in meta:
            kinds = [None if k is NoneType else Annotated[k, meta[f.check]] for k in f.kinds]
        else:
            raise TypeError(f"field '{f.name}': its check {f.check.__name__} has no msgspec type")
        types[f.name] = Union[tuple(kinds)] if len(kinds) > 1 else kinds[0]
    record_type = TypedDict(f"{schema.kind.title()}Record", types, total=False)  # type: ignore[misc]  # built at run time from the schema
    return msgspec.json.Decoder(record_type)


def decoded_text_fields(schema: Schema, raw: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The fields of `schema.decoder(raw)`'s records whose values may hold a JSON string (a string, or a list or
    object of any values): not the numbers, nulls, booleans and token-id lists (`_ints`) among them, nor the fields
    named in `raw`. reading._all_keys_decoded counts the ':' of a line against its record's: one per key and those
    inside these values; no field name may hold a ':' (TypeError)."""
    named = next((f.name for f in schema.fields if ":" in f.name), None)
    if named is not None:
        raise TypeError(f"field '{named}': a field name holds ':'")
    return tuple(
        f.name
        for f in schema.fields
        if f.name not in raw and any(k in (str, dict) or (k is list and f.check is not _ints) for k in f.kinds)
    )


# The records' schema version, in every manifest from version 2 on (`schema_version`). A manifest without one was
# written before the version was recorded (version 1: the committed evidence of 2026-11 and 2026-12); a version
# above this one's was written by a newer artifact and is refused, since its fields may mean what this one cannot
# tell. Raise it when a field's meaning or a rule changes; a field only added (and not required) keeps it.
SCHEMA_VERSION = 2


def _schema_version(value: int) -> str | None:
    if value < 1:
        return f"must be >= 1, not {value}"
    if value > SCHEMA_VERSION:
        return (
            f"is {value}: written by a newer version of the artifact (this one reads records up to schema "
            f"{SCHEMA_VERSION}); check them with that version"
        )
    return None


MANIFEST = Schema(
    "manifest",
    "manifest.json",
    (
        Field(
            "schema_version",
            (int,),
            "the records' schema version (records.schema.SCHEMA_VERSION); absent: 1",
            required=False,
            check=_schema_version,
        ),
        Field("config", (str,), "the configuration's name"),
        Field("plan", (str,), "the plan's name (configs/plans.toml)"),
        Field("arm", (str,), "off, on, or a workload's own arm (bridge)"),
        Field("run", (int,), "the run's number within its arm", check=_positive),
        Field("episodes", (list,), "the units of the run, in order (episode or item ids)", check=_strs),
        Field("status", (str,), "incomplete until the run finished, then complete", check=_status),
        Field("started_at", (str,), "UTC, ISO 8601", required=False, check=_iso),
        Field(
            "finished_at",
            (str, NoneType),
            "UTC, ISO 8601; null while incomplete, not before started_at",
            required=False,
            check=_iso,
        ),
        Field("wall_s", Number, "the run's wall time", required=False, check=_nonneg),
        Field("workload", (str,), "the workload (artifact.workloads.REGISTRY)", required=False),
        Field("engine", (str,), "the engine kind (artifact.engines.REGISTRY)", required=False),
        Field("engine_build", (str, NoneType), "the engine's own build string", required=False),
        Field(
            "server_family",
            (str, NoneType),
            "the family of server that served the run, as the server calls itself "
            "(/v1/models owned_by; Engine.server_family); null where it is not known; older records have none "
            "(their engine's)",
            required=False,
        ),
        Field(
            "model",
            (dict,),
            "family, name, quant, sha256, source (and a derived model's derivation, a pypi-parts model's origin)",
            required=False,
        ),
        Field("session", (str,), "the server session the run belongs to", required=False),
        Field("lifecycle", (str,), "shared or fresh", required=False),
        Field("plan_data", (dict,), "the plan as run", required=False),
        Field("cache_condition", (dict,), "the engine's own description of the cache condition", required=False),
        Field(
            "pairing_inputs",
            (dict,),
            "what produced the tokens (engine, model, workload, protocol); names the "
            "manifest's engine and model.sha256 (and its episodes, as units)",
            required=False,
        ),
        Field(
            "pairing_fingerprint",
            (str, NoneType),
            "digest of pairing_inputs (recomputed): runs are compared only if "
            "equal (missing or null: made by an older version, INVALID for comparisons)",
            required=False,
        ),
        Field("fingerprint", (str,), "resume identity (configuration and plan as written)", required=False),
        Field("host", (dict,), "CPU, GPUs, driver, OS, Python, CUDA MPS", required=False),
        Field("packages", (dict,), "installed distributions", required=False),
        Field(
            "isolation",
            (dict,),
            "network namespace, host loopback ports forwarded into it, scrubbed environment",
            required=False,
        ),
        Field(
            "observes",
            (dict,),
            "what the engine observed of its server (server_cmd, binary, weights_sha256, "
            "cache_use, cache_control, logprobs, exclusive: artifact.engines.base.OBSERVES); missing: everything "
            "(an engine that starts its own server)",
            required=False,
        ),
        Field("server_cmd", (list,), "the server's full command line", required=False),
        Field(
            "server_log",
            (str, NoneType),
            "the server session's log, relative to the plan directory (null: none)",
            required=False,
        ),
        Field(
            "tenants",
            (dict,),
            "background tenants (plans with tenants): spec, prompt hashes, schedule, and at the "
            "end what they sent (artifact/protocol/background_tenants.py; every request in tenants.jsonl)",
            required=False,
        ),
    ),
    rules=(
        Rule("finished_at is not before started_at", _timestamps),
        Rule(
            "pairing_fingerprint is the digest of pairing_inputs, which name the manifest's model and engine", _pairing
        ),
    ),
)

REQUEST = Schema(
    "request",
    "requests.jsonl",
    (
        Field("episode_id", (str,), "the unit the request belongs to"),
        Field("request_index", (int,), "0, 1, ... within the unit, in the order sent", check=_nonneg),
        Field("turn", (int,), "the unit's turn", required=False, check=_nonneg),
        Field("step", (int,), "the step within the turn", required=False, check=_nonneg),
        Field("prompt_sha256", (str,), "sha256 of the prompt text", check=_hex64),
        Field("output_tokens", (list,), "generated token ids", check=_ints),
        Field("output_text", (str,), "generated text", required=False),
        Field(
            "top_logprobs",
            (list,),
            "per generated position: [[token id, logprob], ...] best first, or null; "
            "one per output token, the emitted token the most likely",
            required=False,
        ),
        Field("prompt_tokens", (int, NoneType), "prompt length as the engine tokenized it", served=True, check=_nonneg),
        Field(
            "cache_n",
            (int, NoneType),
            "prompt tokens served from cache; null = not reported, never 0",
            served=True,
            check=_nonneg,
        ),
        Field(
            "prompt_n",
            (int, NoneType),
            "prompt tokens computed: cache_n + prompt_n = prompt_tokens when served",
            required=False,
            check=_nonneg,
        ),
        Field("prompt_ms", (int, float, NoneType), "the engine's prompt time", required=False, check=_nonneg),
        Field("predicted_ms", (int, float, NoneType), "the engine's generation time", required=False, check=_nonneg),
        Field("stop_type", (str, NoneType), "why generation stopped", required=False),
        Field("n_predict", (int,), "the per-request cap", required=False, check=_nonneg),
        Field("error", (str, NoneType), "why the engine could not serve it (null when served)", required=False),
        Field("engine_extra", (dict,), "engine-specific evidence", required=False),
    ),
    rules=(
        Rule("cache_n, prompt_n <= prompt_tokens; served: cache_n + prompt_n = prompt_tokens", _cache_accounting),
        Rule(
            "top_logprobs: one position per output token, best first, the emitted token the most likely", _top_logprobs
        ),
    ),
)

UNIT = Schema(
    "unit",
    "episodes.jsonl",
    (
        Field("episode_id", (str,), "the unit's id (an episode or an item)"),
        Field("n_requests", (int,), "requests the unit made (its requests.jsonl lines)", check=_nonneg),
        Field("verdict", (str,), "the workload's verdict", required=False),
        Field("valid", (bool,), "whether the workload judged the unit correct", required=False),
        Field("error", (str, NoneType), "why the unit ended early", required=False),
        Field("steps", (list,), "an agent trajectory: per request, calls and their results", required=False),
    ),
)


# tenants.jsonl (plans with background tenants, artifact/protocol/background_tenants.py): one line per tenant request
# and one per measured request (its interval, and the tenant requests in flight during it).
TENANT_KINDS = {
    "tenant": ("tenant", "request", "prompt", "prompt_sha256", "error"),
    "measured": ("tenants_in_flight_at_start",),
}


def _tenant_kind(r: dict[str, Any]) -> str | None:
    kind = r["kind"]
    if kind not in TENANT_KINDS:
        return f"field 'kind' is {kind!r}, not one of {', '.join(map(repr, TENANT_KINDS))}"
    missing = next((f for f in TENANT_KINDS[kind] if f not in r), None)
    if missing is not None:
        return f"field '{missing}' is missing (a {kind} record has it)"
    if r["t_end"] < r["t_start"]:
        return f"field 't_end' ({r['t_end']}) is before t_start ({r['t_start']})"
    return None


TENANT = Schema(
    "tenant",
    "tenants.jsonl",
    (
        Field("kind", (str,), "tenant (a background tenant's request) or measured (a measured request's interval)"),
        Field("unit", (str,), "the measured unit during which it ran"),
        Field("t_start", Number, "seconds from the run's start", check=_nonneg),
        Field("t_end", Number, "seconds from the run's start, not before t_start", check=_nonneg),
        Field("tenant", (int,), "tenant: which tenant (0, 1, ...)", required=False, check=_nonneg),
        Field("request", (int,), "tenant: its request number within the unit", required=False, check=_nonneg),
        Field("prompt", (int,), "tenant: the prompt's position in the unit's pool", required=False, check=_nonneg),
        Field("prompt_sha256", (str,), "tenant: sha256 of the prompt text", required=False, check=_hex64),
        Field("error", (str, NoneType), "tenant: why the server did not serve it (null when served)", required=False),
        Field("slot", (int, NoneType), "tenant: the server's slot", required=False),
        Field("prompt_tokens", (int, NoneType), "tenant: prompt length", required=False, check=_nonneg),
        Field("cache_n", (int, NoneType), "tenant: prompt tokens served from cache", required=False, check=_nonneg),
        Field("prompt_n", (int, NoneType), "tenant: prompt tokens computed", required=False, check=_nonneg),
        Field("predicted_n", (int, NoneType), "tenant: tokens generated", required=False, check=_nonneg),
        Field("prompt_ms", (int, float, NoneType), "tenant: the server's prompt time", required=False, check=_nonneg),
        Field(
            "predicted_ms",
            (int, float, NoneType),
            "tenant: the server's generation time",
            required=False,
            check=_nonneg,
        ),
        Field(
            "tenants_in_flight_at_start",
            (int,),
            "measured: tenant requests in flight when it was sent",
            required=False,
            check=_nonneg,
        ),
        Field(
            "tenant_requests_overlapping",
            (int,),
            "measured: tenant requests whose interval overlaps it",
            required=False,
            check=_nonneg,
        ),
        Field(
            "overlap_s",
            Number,
            "measured: seconds of it during which a tenant request was in flight",
            required=False,
            check=_nonneg,
        ),
    ),
    rules=(Rule("kind is tenant or measured, with that kind's fields; t_end is not before t_start", _tenant_kind),),
)

SCHEMAS = {s.kind: s for s in (MANIFEST, REQUEST, UNIT, TENANT)}
