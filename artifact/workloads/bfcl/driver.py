"""BFCL multi_turn_base through the real, unmodified `bfcl_eval` package: the episode loop and its scoring.

The episode loop is BFCL's own `BaseHandler.inference_multi_turn_prompting` (step limit, turn-ending rules, message
history, tool execution), driven by BFCL's handler for the model's chat format. Only the transport is ours: the
handler *instance* gets a `_query_prompting` that sends BFCL's formatted prompt to llama-server. Scoring mirrors
`eval_runner._evaluate_single_multi_turn_entry` (which cannot be imported without BFCL's API-vendor SDKs) and calls
BFCL's `multi_turn_checker`.

BFCL caches simulator instances in a module's globals, keyed by a namespace; every episode gets its own namespace,
scoring another, and both are purged after scoring (see the shared notes on the global-state pitfall).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib
import os
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path(tempfile.gettempdir()) / "bfcl-project-root"))

from artifact.errors import ArtifactError
from bfcl_eval.constants import default_prompts
from bfcl_eval.constants.eval_config import MULTI_TURN_FUNC_DOC_PATH, POSSIBLE_ANSWER_PATH, PROMPT_PATH
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response
from bfcl_eval.model_handler import base_handler
from bfcl_eval.model_handler.local_inference.base_oss_handler import OSSHandler
from bfcl_eval.model_handler.utils import system_prompt_pre_processing_chat_model
from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry, sort_key

CATEGORY = "multi_turn_base"
BFCL_STEP_LIMIT = default_prompts.MAXIMUM_STEP_LIMIT
HANDLERS = {
    "qwen": ("bfcl_eval.model_handler.local_inference.qwen", "QwenHandler"),
    "qwen_fc": ("bfcl_eval.model_handler.local_inference.qwen_fc", "QwenFCHandler"),
    "llama": ("bfcl_eval.model_handler.local_inference.llama", "LlamaHandler"),
    "llama_3_1": ("bfcl_eval.model_handler.local_inference.llama_3_1", "LlamaHandler_3_1"),
}
# BFCL's own format-sensitivity variants of the system prompt ("default" = DEFAULT_SYSTEM_PROMPT_FORMAT).
PROMPT_VARIANTS = {
    "default": default_prompts.DEFAULT_SYSTEM_PROMPT_FORMAT,
    "python": "ret_fmt=python&tool_call_tag=False&func_doc_fmt=python&prompt_fmt=plaintext&style=classic",
}


@dataclass
class Episode:
    entry: dict  # BFCL's dataset entry (with populated function docs)
    ground_truth: list  # per turn, the ground-truth call strings

    @property
    def id(self) -> str:
        return self.entry["id"]


@dataclass
class EpisodeResult:
    id: str
    verdict: str  # "valid" or BFCL's error type, e.g. "multi_turn:instance_state_mismatch"
    n_requests: int
    n_turns: int
    error: str | None
    steps: list = field(default_factory=list)  # `trajectory(...)`: per request, the calls and their results


def trajectory(inference_log) -> list[dict]:
    """The agent trajectory from BFCL's own inference log, one entry per request (turn, step): the calls BFCL's
    decoder read from the reply (None where it read none: free text, which ends the turn) and the results BFCL's
    executor returned for them, which the next request's prompt shows the model."""
    steps = []
    if not isinstance(inference_log, list):
        return steps
    turns = [t for t in inference_log if isinstance(t, dict)]  # the state-log entries are lists (left out)
    for turn, log in enumerate(turns):
        for step in range(len(log)):
            entries = log.get(f"step_{step}")
            if entries is None:
                break
            decoded = next(
                (
                    e.get("model_response_decoded")
                    for e in entries
                    if e.get("role") == "handler_log" and "model_response_decoded" in e
                ),
                None,
            )
            calls = [str(c) for c in decoded] if isinstance(decoded, list) and decoded else None
            observations = [
                e["content"] if isinstance(e.get("content"), str) else repr(e.get("content"))
                for e in entries
                if e.get("role") == "tool"
            ]
            steps.append({"turn": turn, "step": step, "calls": calls, "observations": observations})
    return steps


def load_episodes(n: int, max_turns: int = 0, start: int = 0) -> list[Episode]:
    """`n` multi_turn_base episodes in BFCL's numeric id order from position `start` (the protocol evaluates the
    first N; the agent model trains on held-out ones), optionally cut to `max_turns` turns."""
    entries = sorted(load_dataset_entry(CATEGORY), key=sort_key)
    truth = {g["id"]: g["ground_truth"] for g in load_ground_truth_entry(CATEGORY)}
    episodes = []
    for entry in entries[start : start + n]:
        gt = truth[entry["id"]]
        if max_turns:
            entry = {**entry, "question": entry["question"][:max_turns]}
            gt = gt[:max_turns]
        episodes.append(Episode(entry, gt))
    return episodes


def data_identity() -> dict:
    """The BFCL package version and a sha256 over the data this workload reads (questions, ground truth, function
    docs): part of what produces the tokens, so part of every run's pairing fingerprint."""
    from importlib.metadata import version

    files = [
        PROMPT_PATH / f"BFCL_v4_{CATEGORY}.json",
        POSSIBLE_ANSWER_PATH / f"BFCL_v4_{CATEGORY}.json",
        *sorted(MULTI_TURN_FUNC_DOC_PATH.glob("*.json")),
    ]
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return {"bfcl_eval": version("bfcl-eval"), "data_sha256": h.hexdigest()}


def check_prompt_variant(handler_name: str, variant: str) -> None:
    """A non-default variant replaces the handler's system-prompt step with BFCL's own prompting step for that
    variant; that is BFCL's behaviour only for handlers that use OSSHandler's step unchanged. Other handlers (e.g.
    the FC ones, which put the functions in their chat template) would get a system prompt BFCL never sends."""
    if variant == "default":
        return
    module, cls = HANDLERS[handler_name]
    handler_cls = getattr(importlib.import_module(module), cls)
    if handler_cls._pre_query_processing_prompting is not OSSHandler._pre_query_processing_prompting:
        raise ArtifactError(
            f"prompt_variant {variant!r} cannot be used with chat.handler {handler_name!r}: that BFCL handler builds "
            'its own prompt (BFCL never sends it a variant system prompt); use prompt_variant = "default"'
        )


@functools.lru_cache(maxsize=None)
def _handler(name: str):
    """One handler instance per chat format, reused for every episode, as BFCL's own runner reuses one per model
    (constructing one builds an OpenAI client, ~40 ms of TLS set-up that would otherwise be paid per episode)."""
    module, cls = HANDLERS[name]
    handler_cls = getattr(importlib.import_module(module), cls)
    return handler_cls(
        model_name=f"artifact_{name}", temperature=0.0, registry_name=f"artifact_{name}", is_fc_model=False
    )


def make_handler(name: str, namespace: str):
    """The handler for `name`, set to this episode's namespace (the executor's instance-cache key prefix; must stay
    a valid identifier fragment). Its transport and prompt variant are attached per episode."""
    handler = _handler(name)
    handler.model_name_underline_replaced = namespace
    return handler


def purge_instances(namespace: str) -> int:
    """Delete BFCL's cached simulator instances of one namespace (inference and scoring); returns how many."""
    cache = vars(multi_turn_utils)
    keys = [k for k in cache if k.startswith(namespace + "_") and k.endswith("_instance")]
    for k in keys:
        del cache[k]
    return len(keys)


@contextlib.contextmanager
def step_limit(limit: int):
    """BFCL's per-turn step limit (MAXIMUM_STEP_LIMIT, 20) as a setting, restored afterwards."""
    saved = base_handler.MAXIMUM_STEP_LIMIT
    base_handler.MAXIMUM_STEP_LIMIT = limit
    try:
        yield
    finally:
        base_handler.MAXIMUM_STEP_LIMIT = saved


def position(messages: list[dict]) -> tuple[int, int]:
    """(turn, step) of the next request: turns are BFCL's user messages, steps the assistant replies since."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    turn = len(users) - 1
    step = sum(1 for m in messages[users[-1] + 1 :] if m["role"] == "assistant") if users else 0
    return turn, step


# A query function takes (prompt, turn, step) and returns (text, prompt_tokens, completion_tokens); it raises to
# end the episode (BFCL then records "Error during inference").
QueryFn = Callable[[str, int, int], tuple]


# The reply that ends a turn in an oracle trajectory: any text BFCL's decoder reads as no call ends the turn.
ORACLE_CLOSING_REPLY = "I have completed the requested operations."


def oracle_call_text(calls: list[str]) -> str:
    """A turn's ground-truth calls in the format BFCL's prompt asks for: `[f(a=1), g(b='x')]`."""
    return "[" + ", ".join(calls) + "]"


def oracle_query(episode: Episode, closing: str = ORACLE_CLOSING_REPLY, seen: list | None = None) -> QueryFn:
    """A query function that answers like a perfect agent: the turn's ground-truth calls at step 0 (BFCL executes
    them and shows their results), then `closing` to end the turn; a turn without ground-truth calls gets `closing`
    at once. With `seen`, each (turn, step, prompt, reply) is appended: the exact prompts BFCL's own prompt builder
    makes from its own executor's results (the agent model's training data, `oracle.py`)."""

    def query(prompt: str, turn: int, step: int):
        calls = episode.ground_truth[turn]
        reply = oracle_call_text(calls) if step == 0 and calls else closing
        if seen is not None:
            seen.append((turn, step, prompt, reply))
        return reply, 0, 0

    return query


def _attach_transport(handler, query: QueryFn) -> None:
    def _query_prompting(self, inference_data: dict):
        prompt = self._format_prompt(inference_data["message"], inference_data["function"])
        turn, step = position(inference_data["message"])
        text, n_prompt, n_out = query(prompt, turn, step)
        choice = types.SimpleNamespace(text=text)
        usage = types.SimpleNamespace(prompt_tokens=n_prompt, completion_tokens=n_out)
        return types.SimpleNamespace(choices=[choice], usage=usage), 0.0

    handler._query_prompting = types.MethodType(_query_prompting, handler)


def _attach_prompt_variant(handler, variant: str) -> None:
    """Select one of BFCL's own system-prompt variants (BFCL encodes it in the id, as its format-sensitivity
    category does); the default variant restores the handler's own step (the instance is reused across episodes)."""
    if variant == "default":
        vars(handler).pop("_pre_query_processing_prompting", None)
        return
    fmt = PROMPT_VARIANTS[variant]

    def _pre_query_processing_prompting(self, test_entry: dict) -> dict:
        functions = test_entry["function"]
        test_entry["question"][0] = system_prompt_pre_processing_chat_model(
            test_entry["question"][0], functions, f"{CATEGORY}:{fmt}:{test_entry['id']}"
        )
        return {"message": [], "function": functions}

    handler._pre_query_processing_prompting = types.MethodType(_pre_query_processing_prompting, handler)


def score(handler, model_result, episode: Episode, namespace: str) -> str:
    """BFCL's verdict for one episode: mirrors eval_runner._evaluate_single_multi_turn_entry."""
    if not isinstance(model_result, list):
        return "multi_turn:inference_error"
    if len(model_result) != len(episode.ground_truth):
        return "multi_turn:force_terminated"
    decoded_turns = []
    for turn in model_result:
        decoded = []
        for step_text in turn:
            try:
                calls = handler.decode_execute(step_text, has_tool_call_tag=False)
            except Exception:
                continue
            if not is_empty_execute_response(calls):
                decoded.append(calls)
        decoded_turns.append(decoded)
    result = multi_turn_checker(decoded_turns, episode.ground_truth, episode.entry, CATEGORY, namespace)
    return "valid" if result["valid"] else result["error_type"]


def run_episode(
    episode: Episode,
    handler_name: str,
    namespace: str,
    query: QueryFn,
    *,
    prompt_variant: str,
    max_steps_per_turn: int,
    log,
) -> EpisodeResult:
    """Run one episode through BFCL's own loop, score it with BFCL's checker, purge its instances."""
    check_prompt_variant(handler_name, prompt_variant)
    handler = make_handler(handler_name, namespace)
    _attach_prompt_variant(handler, prompt_variant)
    n_requests = 0

    def counting_query(prompt, turn, step):
        nonlocal n_requests
        n_requests += 1
        return query(prompt, turn, step)

    _attach_transport(handler, counting_query)
    error, metadata = None, {}
    try:
        with step_limit(max_steps_per_turn), contextlib.redirect_stdout(log):
            model_result, metadata = handler.inference(copy.deepcopy(episode.entry), False, True)
    except ArtifactError:  # the server is gone: fatal for the run, which stays incomplete
        purge_instances(namespace)
        raise
    except Exception as exc:  # BFCL's own runner turns any inference exception into this result
        error = f"{type(exc).__name__}: {exc}"
        model_result = f"Error during inference: {error}"
    try:
        with contextlib.redirect_stdout(log):
            verdict = score(handler, model_result, episode, namespace + "_score")
    finally:
        purge_instances(namespace)
    n_turns = len(model_result) if isinstance(model_result, list) else 0
    steps = trajectory(metadata.get("inference_log") if isinstance(metadata, dict) else None)
    return EpisodeResult(episode.id, verdict, n_requests, n_turns, error, steps)
