"""The engine contract: what the protocol relies on from every engine adapter, checked against each registered engine
(the real llama-server, and the real vLLM 0.11.0 CPU server), with the same test code for both."""

from __future__ import annotations

import pytest

from artifact import engines
from artifact.config import REPO
from artifact.catalog import load_config, load_plan
from artifact.engines.audit import RecordAudit
from artifact.engines.base import Capabilities, Engine, RequestError
from artifact.models import verified_weights
from artifact.protocol.requests import new_record, send
from artifact.records.schema import REQUEST
from budget import vllm_test_config, with_workload

CONFIGS = {
    "llama.cpp": ("demo-smollm2-agent-cpu", pytest.mark.server),
    "vllm": ("demo-smollm2-agent-cpu-vllm", pytest.mark.vllm),
    # servers the user runs: one user-started llama-server, the cache switched per request (cache_prompt)
    "endpoint": ("endpoint", pytest.mark.server),
}
# Longer than two of vLLM's CPU blocks (128 tokens): a prefix cache reuses whole blocks only.
SYSTEM = " ".join(f"Rule {i}: answer briefly and name colours in English." for i in range(30))
PROMPT = (
    f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
)


def test_every_registered_engine_declares_its_capabilities():
    assert set(CONFIGS) == set(engines.REGISTRY)  # a new engine gets this suite too
    for kind in engines.REGISTRY:
        engine = engines.get(kind)
        assert isinstance(engine, Engine) and engine.kind == kind
        caps = engine.capabilities
        assert isinstance(caps, Capabilities) and isinstance(caps.per_request_cache_switch, bool)
        assert caps.image is None or (REPO / caps.image).is_file()
        assert caps.arms is None or {"off", "on"} <= set(caps.arms)


@pytest.fixture(scope="module")
def user_llama_server(tmp_path_factory):
    """For the endpoint engine: a llama-server started the way a user starts it (tests/user_servers.py)."""
    from user_servers import llama_server

    with llama_server(tmp_path_factory.mktemp("user-server") / "llama.log") as url:
        yield url


@pytest.fixture(params=[pytest.param(kind, marks=mark, id=kind) for kind, (_, mark) in CONFIGS.items()])
def cfg(request):
    settings = {}
    if not engines.get(request.param).capabilities.loads_weights:  # it talks to a server someone else started
        settings = {"url": request.getfixturevalue("user_llama_server"), "cache_control": "cache_prompt"}
    if request.param == "vllm":  # served float32, as every vLLM server test (tests/budget.py says why)
        return vllm_test_config(CONFIGS["vllm"][0], episodes=1, n_predict=8)
    return with_workload(load_config(CONFIGS[request.param][0], settings), episodes=1, n_predict=8)


def serve(server, cfg, prompt: str, cache_prompt: bool, index: int, out: list) -> dict:
    return send(server, cfg, prompt, cache_prompt, new_record("e0", 0, 0, index, prompt), out.append)


def test_each_arm_serves_greedy_recorded_completions_and_reports_its_cache_use(cfg, tmp_path):
    plan = load_plan("main")
    engine = engines.get(cfg.engine.kind)
    model = verified_weights(cfg.model) if engine.capabilities.loads_weights else None
    # the pairing identity holds the keys check holds every manifest of this engine to (Engine.audit.manifest_problem)
    ident = engine.identity(cfg, plan)
    assert set(engine.audit.identity_keys) <= set(ident) and ident["engine"] == cfg.engine.kind
    started = {"server_cmd": ["server"]} if engine.capabilities.loads_weights else {}  # it records what it started
    assert RecordAudit(engine).manifest_problem({"pairing_inputs": {"engine": ident}, **started}) is None
    outputs = {}
    for arm in ("off", "on"):
        written: list = []
        log = tmp_path / f"{arm}.log"
        with engines.open_session(cfg, plan, arm, model, log) as server:
            first = serve(server, cfg, PROMPT, arm == "on", 0, written)
            assert first["prompt_tokens"] > 2 * 128
            second = serve(server, cfg, PROMPT, arm == "on", 1, written)
            assert server.count_tokens(PROMPT) == first["prompt_tokens"]
            prov = server.provenance()
            assert prov["engine"] == cfg.engine.kind and prov["engine_build"]
            # its command line, or the statement that it is not known (a server the artifact did not start)
            assert prov.get("server_cmd") or "server_cmd" in prov["unknown"]
            assert isinstance(prov["cache_condition"]["description"], str) and prov["cache_condition"]["description"]
        assert getattr(getattr(server, "proc", None), "proc", None) is None and log.read_text()  # stopped, log kept
        for rec in written:  # every record the writer would accept, as the protocol sends it
            assert REQUEST.valid(rec), REQUEST.problem(rec)
            # an engine that declares it reports cache use reports it on every request it serves (check relies on it)
            assert rec["cache_n"] is not None or not engine.capabilities.reports_cache_use
            assert len(rec["top_logprobs"]) == len(rec["output_tokens"]) and rec["output_tokens"]
        assert first["output_tokens"] == second["output_tokens"]  # greedy: the same prompt, the same tokens
        if arm == "off":
            assert first["cache_n"] == second["cache_n"] == 0
        else:
            assert second["cache_n"] > 0  # the repeated prompt was served from the prefix cache
        outputs[arm] = first["output_tokens"]
    assert outputs["off"] and outputs["on"]


def test_a_prompt_longer_than_the_context_is_a_request_error_recorded_with_the_request(cfg, tmp_path):
    written: list = []
    long = PROMPT * 40  # far beyond SmolLM2's 8192 tokens
    model = verified_weights(cfg.model) if engines.get(cfg.engine.kind).capabilities.loads_weights else None
    with engines.open_session(cfg, load_plan("main"), "off", model, tmp_path / "s.log") as s:
        with pytest.raises(RequestError):
            serve(s, cfg, long, False, 0, written)
        assert serve(s, cfg, PROMPT, False, 1, written)["error"] is None  # the session goes on
    assert written[0]["error"] and REQUEST.valid(written[0])


def test_capabilities_decide_what_a_workload_may_ask(cfg):
    engine = engines.get(cfg.engine.kind)
    needs = {"per_request_cache_switch": True}
    caps = engine.capabilities_for(cfg)  # under this configuration's settings
    missing = caps.missing({"arms": ("bridge",), **needs})
    assert (missing == []) == caps.per_request_cache_switch
    if missing:
        with pytest.raises(Exception, match="per request cache switch"):
            engines.check_needs(cfg, load_plan("bridge"), needs, "a per-request workload")
