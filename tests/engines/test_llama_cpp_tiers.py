"""Which cache tier served each request: llama-server's INFO log parsed by the llama.cpp adapter.

The log lines below are copied from a real b10435 session log (evidence/h200-agent/logs.tar.gz). The test marked
`server` runs the real llama-server on this machine's CPU with prompts whose tiers are known by construction.
"""

from __future__ import annotations

import pytest

from artifact import engines
from artifact.catalog import load_config, load_plan
from artifact.engines.audit import Tier
from artifact.engines.llama_cpp.adapter import LlamaServer
from artifact.engines.llama_cpp.tiers import Selection, ServerCache, attribute, parse_log, server_cache, session_tiers
from artifact.models import verified_weights
from budget import with_workload

LOG = """\
0.00.357.121 I srv  llama_server: listening on http://127.0.0.1:36721
0.00.381.191 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1
0.00.381.258 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0
0.00.607.443 I slot print_timing: id  0 | task 0 | prompt eval time =     135.69 ms /  3776 tokens (    0.04 ms per token, 27827.52 tokens per second)
0.00.607.449 I slot print_timing: id  0 | task 0 |        eval time =      90.02 ms /    38 tokens (    2.43 ms per token,   411.04 tokens per second)
0.00.607.739 I slot      release: id  0 | task 0 | stop processing: n_tokens = 3813, truncated = 0
0.00.619.699 I slot get_availabl: id  0 | task -1 | selected slot by LCP similarity, f_sim_best = 0.983 (> 0.100 thold), f_keep = 1.000
0.00.665.774 I slot print_timing: id  0 | task 40 | prompt eval time =      15.87 ms /    66 tokens (    0.24 ms per token,  4158.79 tokens per second)
0.01.022.311 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = 889261747
0.01.190.151 I slot print_timing: id  0 | task 140 | prompt eval time =      78.39 ms /  2268 tokens (    0.03 ms per token, 28933.37 tokens per second)
0.01.490.562 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = 889732980
0.01.662.545 I slot print_timing: id  0 | task 243 | prompt eval time =      92.31 ms /    48 tokens (    0.03 ms per token, 34048.32 tokens per second)
"""
MAIN_CMD = ["llama-server", "-m", "m.gguf", "--cache-ram", "8192", "-sps", "0.1", "--cache-idle-slots"]


def rec(cache_n, prompt_tokens, prompt_n=None, error=None):
    return {
        "cache_n": cache_n,
        "prompt_tokens": prompt_tokens,
        "prompt_n": prompt_tokens - (cache_n or 0) if prompt_n is None else prompt_n,
        "error": error,
    }


def test_parse_log_reads_one_selection_per_completion_with_its_computed_tokens():
    sels = parse_log(LOG)
    assert [s.how for s in sels] == ["lru", "lcp", "lru", "lru"]
    assert [s.prompt_n for s in sels] == [3776, 66, 2268, 48]
    assert (sels[1].f_sim, sels[1].threshold, sels[1].f_keep) == (0.983, 0.1, 1.0)


def test_server_cache_settings_come_from_the_recorded_command_line_with_llama_servers_defaults():
    assert server_cache(MAIN_CMD) == ServerCache(host_cache=True, similarity=0.1)
    assert server_cache(["llama-server", "--cache-ram", "0", "-sps", "0"]) == ServerCache(False, 0.0)
    assert server_cache(["llama-server"]) == ServerCache(True, 0.1)  # b10435's defaults: 8192 MiB, 0.1


@pytest.mark.parametrize(
    "sel, record, cache, tier, certain",
    [
        (Selection("lru"), rec(0, 3776), ServerCache(True, 0.1), "none", True),
        (Selection("lcp", 0.983, 0.1, 1.0), rec(3810, 3876), ServerCache(True, 0.1), "slot", True),
        (Selection("lru"), rec(3745, 3793), ServerCache(True, 0.1), "host", True),  # 3745 > 0.1 x 3793
        (Selection("lru"), rec(200, 3793), ServerCache(True, 0.1), "slot_or_host", False),  # within the slot's reach
        (Selection("lru"), rec(200, 3793), ServerCache(False, 0.1), "slot", True),  # --cache-ram 0
        (Selection("lcp", 0.300, 0.1, 0.4), rec(2000, 4000), ServerCache(True, 0.1), "host", True),  # > 0.3005 x 4000
        (Selection("lcp", 0.300, 0.1, 0.4), rec(1200, 4000), ServerCache(True, 0.1), "slot_or_host", False),
        (Selection("lcp", 0.300, 0.1, 0.4), rec(150, 500), ServerCache(True, 0.1), "slot", True),  # band < 1 token
        (Selection("id"), rec(300, 500), ServerCache(True, 0.0), "slot", True),  # pinned, similarity off
        (Selection("id"), rec(300, 500), ServerCache(True, 0.1), "slot_or_host", False),
        (Selection("lru"), rec(None, 500), ServerCache(True, 0.1), "unknown", False),
    ],
)
def test_attribution_rules(sel, record, cache, tier, certain):
    got = attribute(sel, record, cache)
    assert (got.tier, got.certain) == (tier, certain), got.evidence


def test_a_session_whose_log_does_not_line_up_with_its_records_is_unknown_not_guessed():
    records = [rec(0, 3776, 3776), rec(3810, 3876, 66), rec(0, 2268, 2268), rec(5, 53, 48)]
    tiers = session_tiers({"server_cmd": MAIN_CMD}, records, LOG)
    assert [t.tier for t in tiers] == ["none", "slot", "none", "slot_or_host"]
    shifted = session_tiers({"server_cmd": MAIN_CMD}, records[:3], LOG)  # a request missing from the records
    assert {t.tier for t in shifted} == {"none", "unknown"} and "3" in shifted[1].evidence
    wrong = [dict(r) for r in records]
    wrong[1]["prompt_n"] = 65  # the log says 66
    assert session_tiers({"server_cmd": MAIN_CMD}, wrong, LOG)[1] == Tier(
        "unknown", False, "request 1 of the session computed 65 prompt tokens, its log line says 66"
    )
    assert [t.tier for t in session_tiers({"server_cmd": MAIN_CMD}, records, None)] == [
        "none",
        "unknown",
        "none",
        "unknown",
    ]


def test_engines_declare_their_tiers_and_vllm_attributes_to_its_one_tier():
    assert engines.get("llama.cpp").capabilities.cache_tiers == ("slot", "host")
    vllm = engines.get("vllm")
    assert vllm.capabilities.cache_tiers == ("blocks",)
    got = vllm.audit.request_tiers({}, [rec(0, 10), rec(32, 40), rec(None, 5)], None)
    assert [(t.tier, t.certain) for t in got] == [("none", True), ("blocks", True), ("unknown", False)]


PROMPT_A = "<|im_start|>user\n" + " ".join(f"apple {i} orchard" for i in range(120)) + "<|im_end|>\n"
PROMPT_B = "Zebra crossing notes: " + " ".join(f"stripe {i} black white" for i in range(100))


@pytest.mark.server
def test_known_tiers_on_the_real_server(tmp_path):
    """A, A + more (the slot's own prefix), B (unrelated: LRU, the slot saved to host memory), A again (restored
    from host memory): the adapter's attribution from the real log names each tier, certainly."""
    cfg = with_workload(load_config("demo-smollm2-agent-cpu"), episodes=1, max_turns=1, n_predict=4)
    plan = load_plan("main")
    log = tmp_path / "server.log"
    records = []
    with LlamaServer(cfg, plan, verified_weights(cfg.model), log) as server:
        for prompt in (PROMPT_A, PROMPT_A + " and a pear", PROMPT_B, PROMPT_A):
            c = server.complete(prompt, 4, True)
            records.append(
                {"cache_n": c.cache_n, "prompt_tokens": c.prompt_tokens, "prompt_n": c.prompt_n, "error": None}
            )
        cmd = server.cmd
    tiers = engines.get("llama.cpp").audit.request_tiers({"server_cmd": cmd}, records, log.read_text())
    assert [t.tier for t in tiers] == ["none", "slot", "none", "host"], [(t.tier, t.evidence) for t in tiers]
    assert all(t.certain for t in tiers)
    assert records[3]["cache_n"] >= records[3]["prompt_tokens"] - 2  # the whole of A came back from host memory
