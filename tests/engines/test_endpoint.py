"""The endpoint engine (artifact/engines/endpoint/): the fixed protocol (paired ON/OFF arms, two runs each, batch 1,
serial, greedy, seed 42) against OpenAI-compatible servers the artifact did not start, then check's verdicts.

The servers are the real llama-server and the real vLLM 0.11.0 CPU server, started by these tests the way a user
starts them (tests/user_servers.py: plain command lines, separate processes on loopback), one per arm and module.
The budget is one episode, one turn, one step, 12 tokens per reply: the claims' verdicts on it are what is asserted,
not rates.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from artifact import engines
from artifact.check.run import run_check
from artifact.config import REPO, parse_setting
from artifact.catalog import load_config, load_plan
from artifact.errors import ArtifactError
from artifact.protocol.runner import execute_plan
from artifact.records.store import find_runs
from budget import with_workload
from user_servers import free_port, llama_server, vllm_server

BUDGET = dict(episodes=1, max_turns=1, max_steps_per_turn=1, n_predict=12)


def endpoint_cfg(**settings):
    """configs/endpoint.toml at the test budget; the servers are up already (a short wait), and a first request may
    wait for the server's own first-use compilation (vLLM's CPU build: minutes on a loaded machine)."""
    cfg = load_config("endpoint", settings)
    engine = dataclasses.replace(cfg.engine, startup_timeout_s=5, request_timeout_s=1800)
    return with_workload(dataclasses.replace(cfg, engine=engine), **BUDGET)


def protocol_and_check(cfg, results: Path) -> tuple[dict, dict]:
    """execute_plan(main) on `cfg`, then check: (runs by (arm, run), check.json's claims by id)."""
    execute_plan(cfg, load_plan("main"), results)
    run_check(results, results / "check", quiet=True)
    doc = json.loads((results / "check" / "check.json").read_text())
    return (
        {(r.manifest["arm"], r.manifest["run"]): r for r in find_runs(results)},
        {c["id"]: c for c in doc["claims"]},
    )


def reasons(claim: dict) -> str:
    return " | ".join(x for d in claim["details"] for x in d["evidence"])


# --- without a server ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"url_on": "", "url_off": ""}, "give url_on and url_off"),
        ({"url": "http://127.0.0.1:8080"}, "only with a per-request cache_control"),
        ({"cache_control": "cache_prompt"}, "cache_control applies to one url"),
        ({"url_off": "http://127.0.0.1:8080/v1"}, "are the same server"),
        ({"url_on": "http://192.0.2.1:8000"}, "not a loopback address: set allow_remote = true"),
        ({"url_on": "localhost.example.com:80"}, "not an http:// or https:// URL"),
        ({"extra_request": {"seed": 1}}, "extra_request sets seed"),
        ({"cache_control": "salt"}, "cache_control = 'salt' is not one of"),
    ],
)
def test_settings_that_cannot_work_are_one_line_errors(settings, message):
    with pytest.raises(ArtifactError, match=re.escape(message)):
        load_config("endpoint", settings)


def test_command_line_settings_are_read_as_toml_values_or_text():
    assert parse_setting("url=http://127.0.0.1:8080") == ("url", "http://127.0.0.1:8080")
    assert parse_setting("allow_remote=true") == ("allow_remote", True)
    assert parse_setting("extra_request={ ignore_eos = false }") == ("extra_request", {"ignore_eos": False})
    with pytest.raises(ArtifactError, match="expected KEY=VALUE"):
        parse_setting("url")


def test_one_url_with_a_cache_control_switches_the_cache_per_request_and_may_run_the_bridge():
    engine = engines.get("endpoint")
    two = load_config("endpoint")
    one = load_config("endpoint", {"url": "http://127.0.0.1:8080", "cache_control": "cache_salt"})
    assert not engine.capabilities_for(two).per_request_cache_switch
    assert engine.capabilities_for(one).per_request_cache_switch and engine.capabilities_for(one).arms is None
    with pytest.raises(ArtifactError, match="per request cache switch"):
        engines.check_needs(two, load_plan("bridge"), {"per_request_cache_switch": True}, "the GSM8K bridge")
    engines.check_needs(one, load_plan("bridge"), {"per_request_cache_switch": True}, "the GSM8K bridge")
    assert engine.loopback_servers(two) == ["127.0.0.1:8081", "127.0.0.1:8080"]


@pytest.mark.parametrize(
    "plan, message",
    [
        ("cram0", "llama_cpp.cache_ram_mib = 0"),
        ("fresh", "lifecycle 'fresh'"),
        ("ub1", "llama_cpp.ubatch_size = 1"),
    ],
)
def test_plans_that_set_a_server_condition_are_refused_before_anything_runs(plan, message, tmp_path):
    with pytest.raises(ArtifactError, match=re.escape(message)):
        execute_plan(endpoint_cfg(), load_plan(plan), tmp_path)
    assert not list(tmp_path.rglob("manifest.json"))


def test_a_wrong_port_fails_in_seconds_naming_the_url_and_its_setting(tmp_path):
    """Nothing listens there: refused after adapter.CONNECT_S (3 s), whatever startup_timeout_s says (120 s in
    configs/endpoint.toml), in one line that names the URL and which setting gave it."""
    import time

    cfg = load_config("endpoint", {"url_off": "http://127.0.0.1:9"})
    t0 = time.monotonic()
    with pytest.raises(
        ArtifactError,
        match=r"^nothing answers at the server at http://127.0.0.1:9 \(url_off, the "
        r"OFF arm\) .*start the server first, or fix the URL$",
    ) as err:
        execute_plan(cfg, load_plan("main"), tmp_path)
    assert time.monotonic() - t0 < 10 and "\n" not in str(err.value)


def test_no_code_outside_its_package_names_the_engine():
    """The engine is one folder plus its registry line: nothing else in the artifact's code names it."""
    out = subprocess.run(
        [
            "git",
            "grep",
            "-n",
            "-I",
            "-E",
            r"engines\.endpoint|[\"']endpoint[\"']",
            "--",
            "artifact",
            ":!artifact/engines/endpoint",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    lines = [x for x in out.stdout.splitlines() if x]
    assert [x.split(":", 2)[0] for x in lines] == ["artifact/engines/__init__.py"], lines


def test_the_server_family_is_what_the_server_reports_as_owned_by_and_never_guessed():
    from artifact.engines.endpoint.observe import server_family

    def models(*owners):
        return {"models": [{"id": f"m{i}", **({"owned_by": o} if o else {})} for i, o in enumerate(owners)]}

    assert server_family(models("vllm")) == "vllm" and server_family(models("llamacpp", "llamacpp")) == "llamacpp"
    assert server_family(models(" vLLM ")) == "vllm"
    for unknown in (models(None), models("vllm", "sglang"), models(""), {}, None):
        assert server_family(unknown) is None


def test_a_server_answering_html_is_a_one_line_error_naming_the_url_in_seconds(tmp_path):
    """A real HTTP server that is not an OpenAI-compatible one (a web page on the port): one line, which URL, why."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<!DOCTYPE html>\n<html>\n<body>\n<h1>It works!</h1>\n</body>\n</html>\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    port = free_port()
    httpd = http.server.HTTPServer(("127.0.0.1", port), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        cfg = load_config("endpoint", {"url_off": f"http://127.0.0.1:{port}"})
        t0 = time.monotonic()
        with pytest.raises(ArtifactError) as err:
            execute_plan(cfg, load_plan("main"), tmp_path)
        assert time.monotonic() - t0 < 10
    finally:
        httpd.shutdown()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(
        f"the server at http://127.0.0.1:{port} (url_off, the OFF arm) answered "
        "GET /v1/models with HTTP 200 (text/html): not an OpenAI-compatible"
    )


def run_args(**kw):
    base = dict(turns=None, steps=None, n_predict=None, startup_timeout=None, request_timeout=None)
    return argparse.Namespace(**{**base, **kw})


def test_the_budget_and_the_timeouts_are_command_line_options():
    from artifact.cli import budgeted, parser

    args = parser().parse_args(
        [
            "run",
            "endpoint",
            "--episodes",
            "3",
            "--turns",
            "2",
            "--steps",
            "4",
            "--n-predict",
            "64",
            "--startup-timeout",
            "30",
            "--request-timeout",
            "90",
            "--dry-run",
        ]
    )
    cfg = budgeted(load_config("endpoint"), args)
    assert cfg.workload.settings["max_turns"] == 2 and cfg.workload.settings["max_steps_per_turn"] == 4
    assert cfg.workload.n_predict == 64 and args.episodes == 3 and args.dry_run
    assert (cfg.engine.startup_timeout_s, cfg.engine.request_timeout_s) == (30.0, 90.0)
    with pytest.raises(ArtifactError, match="--turns: workload gsm8k of .* has no max_turns setting"):
        budgeted(load_config("demo-smollm2-q4_1-cpu-gsm8k"), run_args(turns=2))
    with pytest.raises(ArtifactError, match="--steps must be >= 1"):
        budgeted(load_config("endpoint"), run_args(steps=0))


def test_the_engine_timeouts_are_not_part_of_what_a_run_resumes_by():
    """A complete run made with other timeouts (how long to wait, not what is computed) resumes; anything else in
    the configuration still does not."""
    from artifact.protocol.sessions import fingerprints, resumes

    cfg = load_config("demo-smollm2-agent-cpu")
    plan = load_plan("main")
    made = fingerprints(cfg, plan, ["e0"], {"data": 1})
    slower = dataclasses.replace(
        cfg, engine=dataclasses.replace(cfg.engine, startup_timeout_s=999.0, request_timeout_s=5.0)
    )
    now = fingerprints(slower, plan, ["e0"], {"data": 1})
    manifest = {"fingerprint": made.resume, "config_data": cfg.as_dict()}
    assert now.resume != made.resume and resumes(now, manifest) and not resumes(now.resume, manifest)
    other = fingerprints(with_workload(slower, n_predict=7), plan, ["e0"], {"data": 1})
    assert not resumes(other, manifest)


# --- llama-server ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_urls(tmp_path_factory):
    """Two user-started llama-servers: one as it starts by default (prompt cache on), one with --no-cache-prompt."""
    logs = tmp_path_factory.mktemp("llama-user-servers")
    with llama_server(logs / "on.log") as on, llama_server(logs / "off.log", "--no-cache-prompt") as off:
        yield {"on": on, "off": off}


@pytest.mark.server
def test_llama_server_one_server_per_arm_decides_rq1_from_what_the_off_server_reports(llama_urls, tmp_path):
    """The user's two llama-servers, one per arm (one URL with cache_prompt is the contract test's): every request
    reports its cache use (timings.cache_n), so RQ1 is decided; the manifest says what could not be known."""
    runs, claims = protocol_and_check(endpoint_cfg(url_on=llama_urls["on"], url_off=llama_urls["off"]), tmp_path)
    assert sorted(runs) == [("off", 1), ("off", 2), ("on", 1), ("on", 2)]
    assert len({r.manifest["pairing_fingerprint"] for r in runs.values()}) == 1
    for (arm, _), run in runs.items():
        m = run.manifest
        assert m["engine"] == "endpoint" and m["status"] == "complete" and m["server"]["url"] == llama_urls[arm]
        assert m["engine_build"].startswith("b10434-") and "/props build_info" in m["engine_build"]
        assert "server_cmd" not in m and "binary" not in m
        assert set(m["unknown"]) >= {"server_cmd", "binary", "weights_sha256", "exclusive"}
        assert m["observes"]["weights_sha256"] is False and m["observes"]["cache_control"].startswith("per server")
        assert m["model"]["source"] == "server:" and m["model"]["sha256"] == ""
        ident = m["pairing_inputs"]["engine"]
        assert ident["servers"][arm]["props"]["build_info"] == m["engine_build"].split()[0]
        assert ident["model_id"] == m["server"]["model_id"] and "unknown" in ident
        assert "forwarded" in m["isolation"]
        for q in run.requests:
            assert q["engine_extra"]["cache_sources"]["timings.cache_n"] == q["cache_n"] is not None
            assert q["engine_extra"]["token_ids_source"] == "__verbose.tokens"
            assert len(q["top_logprobs"]) == len(q["output_tokens"]) and q["output_tokens"]
            assert q["cache_n"] == 0 or arm == "on"
        assert (run.path.parent / m["server_log"]).read_text().startswith("# endpoint session")
    assert any(q["cache_n"] for (arm, _), r in runs.items() if arm == "on" for q in r.requests)
    assert claims["RQ1"]["status"] == "PASS", claims["RQ1"]
    assert "not observable by the engine" in reasons(claims["RQ1"])
    # ON run 1's one request met the ON server cold, and the server says so: RQ2 is not decided on it
    assert claims["RQ2"]["status"] == "INCONCLUSIVE", claims["RQ2"]
    assert "on-run1 was served no cached token (cache_n = 0 on all 1 requests)" in reasons(claims["RQ2"])
    assert {claims[k]["status"] for k in ("RQ2b", "RQ3", "RQ4", "RQ5")} == {"NOT-RUN"}
    # the cold start: the server has no reset (no --slot-save-path), so the records are what shows it
    on1 = runs[("on", 1)]
    assert on1.manifest["cold_start"]["means"] == "none" and "--slot-save-path" in on1.manifest["cold_start"]["detail"]
    first = on1.requests[0]["engine_extra"]
    assert first["session_prefix"] == 0 and first["cached_before_session"] == 0
    on2 = runs[("on", 2)].requests[0]
    assert on2["cache_n"] > 0 and on2["engine_extra"]["cached_before_session"] == 0  # warm from its own run 1
    held = on1.manifest["pairing_inputs"]["engine"]["model_held"]
    assert held["reported"]["quant"] == "Q4_K_M" and 1.3e8 < held["reported"]["n_params"] < 1.4e8
    assert held["quant"].startswith("held") and held["n_params"].startswith("held")

    off_manifests = [runs[("off", k)].manifest for k in (1, 2)]

    # resumed with other engine timeouts: the complete sessions are reused, nothing is sent again
    slower = dataclasses.replace(
        cfg := endpoint_cfg(url_on=llama_urls["on"], url_off=llama_urls["off"]),
        engine=dataclasses.replace(cfg.engine, startup_timeout_s=33, request_timeout_s=999),
    )
    execute_plan(slower, load_plan("main"), tmp_path)
    assert {r.path: r.manifest["fingerprint"] for r in find_runs(tmp_path)} == {
        r.path: r.manifest["fingerprint"] for r in runs.values()
    }

    # the same servers again, into new results: the ON server has served these prompts, so ON run 1 starts warm,
    # the records say so, and check does not decide RQ2 on it. The new results start with this run's complete OFF
    # session (reused, as a resume reuses it: the OFF server caches nothing, so only the ON session is sent again)
    plan_dir = on1.path.parent
    again = tmp_path / "again" / plan_dir.relative_to(tmp_path)
    shutil.copytree(plan_dir, again, ignore=lambda d, names: [n for n in names if n.startswith("on-run")])
    runs, claims = protocol_and_check(
        endpoint_cfg(url_on=llama_urls["on"], url_off=llama_urls["off"]), tmp_path / "again"
    )
    assert [runs[("off", k)].manifest["started_at"] for k in (1, 2)] == [off["started_at"] for off in off_manifests]
    first = runs[("on", 1)].requests[0]
    assert first["cache_n"] > 0 and first["engine_extra"]["cached_before_session"] == first["cache_n"]
    assert claims["RQ2"]["status"] == "INCONCLUSIVE", claims["RQ2"]
    assert (
        f"on-run1 did not start cold: episode multi_turn_base_0 request 0 was served {first['cache_n']} cached "
        "prompt tokens its session had not sent"
    ) in reasons(claims["RQ2"])
    assert claims["RQ1"]["status"] == "PASS", claims["RQ1"]


@pytest.mark.server
@pytest.mark.parametrize(
    "name, quant, message",
    [
        (
            "Llama-3.1-8B-Instruct",
            "Q8_0",
            "reports its model is Q4_K - Medium, 135M parameters (/v1/models meta, /props), "
            "the configuration declares 'Llama-3.1-8B-Instruct' Q8_0",
        ),
        (
            "SmolLM2-1.7B-Instruct",
            "Q4_K_M",
            "reports a 135M-parameter model (/v1/models meta.n_params), the configuration "
            "declares 'SmolLM2-1.7B-Instruct' (1,700M)",
        ),
    ],
)
def test_a_declared_model_the_server_does_not_report_is_a_one_line_error_before_any_request(
    llama_urls, tmp_path, name, quant, message
):
    cfg = endpoint_cfg(url_on=llama_urls["on"], url_off=llama_urls["off"])
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=name, quant=quant))
    with pytest.raises(ArtifactError, match=re.escape(message)) as err:
        execute_plan(cfg, load_plan("main"), tmp_path)
    assert "\n" not in str(err.value) and str(err.value).startswith(f"the server at {llama_urls['off']} (url_off")
    assert not list(tmp_path.rglob("requests.jsonl"))


@pytest.mark.server
def test_the_dry_run_says_what_the_servers_can_decide_and_how_long_the_budget_takes(llama_urls, capsys):
    from artifact.cli import main

    t0 = time.monotonic()
    assert (
        main(
            [
                "run",
                "endpoint",
                "--dry-run",
                "--engine-setting",
                f"url_on={llama_urls['on']}",
                "--engine-setting",
                f"url_off={llama_urls['off']}",
                "--episodes",
                "2",
                "--turns",
                "1",
                "--steps",
                "1",
                "--n-predict",
                "12",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert time.monotonic() - t0 < 300
    assert re.search(r"timed: OFF [\d.]+ s for a [\d,]+-token prompt and 12 generated tokens; ON ", out), out
    assert re.search(
        r"budget: 2 episodes x 4 runs \(off, on x 2\), about 2 requests per episode \(at most 2 per "
        r"episode\), .*: about \d+ min",
        out,
    ), out
    assert "RQ1 (cache-OFF reruns identical): yes" in out and "RQ4 (a second engine): NOT-RUN" in out
    assert "quantization held: the server's file type" in out and "cold start of ON run 1: none" in out


@pytest.fixture(scope="module")
def resettable_url(tmp_path_factory):
    """One user-started llama-server whose cache can be reset: one slot, no host-memory prompt cache, and slot
    actions on (--slot-save-path): the engine erases its slot before ON run 1."""
    logs = tmp_path_factory.mktemp("llama-resettable")
    with llama_server(logs / "one.log", "-np", "1", "--cache-ram", "0", "--slot-save-path", str(logs)) as url:
        yield url


@pytest.mark.server
def test_one_url_with_cache_prompt_starts_on_run_1_cold_where_the_server_can_be_reset(resettable_url, tmp_path):
    """One URL, cache_prompt: the OFF runs' requests (cache_prompt false) leave their prompt in the slot, which the
    next cache_prompt true request would be served from; the engine erases the slot first, and the records show
    ON run 1 met it cold."""
    runs, claims = protocol_and_check(endpoint_cfg(url=resettable_url, cache_control="cache_prompt"), tmp_path)
    on1 = runs[("on", 1)]
    assert on1.manifest["cold_start"]["means"] == "slot erase"
    assert on1.requests[0]["cache_n"] == 0 and on1.requests[0]["engine_extra"]["cached_before_session"] == 0
    assert runs[("on", 2)].requests[0]["cache_n"] > 0
    assert "did not start cold" not in reasons(claims["RQ2"])
    assert claims["RQ1"]["status"] == "PASS", claims["RQ1"]


@pytest.mark.server
def test_one_url_with_cache_prompt_on_a_server_without_a_reset_is_called_warm(llama_urls, tmp_path):
    """The same on a llama-server as it starts by default (no --slot-save-path, host-memory prompt cache on): the
    OFF runs leave ON run 1's first prompt cached, nothing can erase it, and check says so instead of deciding RQ2."""
    runs, claims = protocol_and_check(endpoint_cfg(url=llama_urls["on"], cache_control="cache_prompt"), tmp_path)
    first = runs[("on", 1)].requests[0]
    assert runs[("on", 1)].manifest["cold_start"]["means"] == "none"
    assert first["cache_n"] > 0 and first["engine_extra"]["cached_before_session"] == first["cache_n"]
    assert claims["RQ2"]["status"] == "INCONCLUSIVE" and "on-run1 did not start cold" in reasons(claims["RQ2"])
    assert claims["RQ1"]["status"] == "PASS", claims["RQ1"]


@pytest.mark.server
def test_a_model_the_servers_do_not_serve_is_refused_before_any_request(llama_urls, tmp_path):
    cfg = endpoint_cfg(url_on=llama_urls["on"], url_off=llama_urls["off"], model="no-such-model")
    with pytest.raises(ArtifactError, match="does not serve model 'no-such-model'"):
        execute_plan(cfg, load_plan("main"), tmp_path)


# --- vLLM ------------------------------------------------------------------------------------------------------

# Served as the other vLLM server tests serve it (float32, eager: tests/budget.py; bf16 is far slower on a CPU
# without bf16 instructions). They run when asked (.ci/run asks): each starts a vLLM CPU server of its own.
VLLM_ENDPOINT = pytest.mark.skipif(
    os.environ.get("ARTIFACT_ENDPOINT_VLLM_TEST") != "1",
    reason="NOT RUN unless ARTIFACT_ENDPOINT_VLLM_TEST=1 (.ci/run sets it): the "
    "endpoint protocol on a user-started vLLM CPU server, which each of the two starts",
)


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    """One user-started vLLM server with prefix caching on and cache use reported in usage (its own flag), so that
    cache_salt switches the cache per request."""
    log = tmp_path_factory.mktemp("vllm-user-server") / "vllm.log"
    with vllm_server(
        log,
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--generation-config",
        "vllm",
        "--max-num-batched-tokens",
        "8192",
    ) as url:
        yield url


@pytest.mark.vllm
@VLLM_ENDPOINT
def test_vllm_cache_salt_with_its_metrics_decides_rq1(vllm_url, tmp_path):
    runs, claims = protocol_and_check(endpoint_cfg(url=vllm_url, cache_control="cache_salt"), tmp_path)
    for (arm, _), run in runs.items():
        m = run.manifest
        assert m["engine_build"].startswith("0.11.0 (/version")
        assert "/metrics vllm:prefix_cache_hits_total" in m["observes"]["cache_use"]
        for q in run.requests:
            assert q["engine_extra"]["token_ids_source"] == "choices[0].token_ids"
            assert q["cache_n"] is not None
            if arm == "off":
                assert q["cache_n"] == 0 and q["engine_extra"]["cache_salt"]
    assert claims["RQ1"]["status"] == "PASS", claims["RQ1"]
    # no salted OFF block matches an ON request: ON run 1 met the cache cold, as /metrics reports
    assert claims["RQ2"]["status"] == "INCONCLUSIVE", claims["RQ2"]
    assert "on-run1 was served no cached token" in reasons(claims["RQ2"])
    assert runs[("on", 2)].requests[0]["cache_n"] > 0


@pytest.mark.vllm
@VLLM_ENDPOINT
def test_vllm_without_its_metrics_reports_no_cache_use_on_a_miss_so_rq1_is_inconclusive(vllm_url, tmp_path):
    """vLLM fills usage.prompt_tokens_details only for a hit: without /metrics every OFF request's cache use is
    unknown (null), and check says RQ1 cannot be decided rather than guessing a PASS."""
    cfg = endpoint_cfg(url=vllm_url, cache_control="cache_salt", metrics_counter="")
    runs, claims = protocol_and_check(cfg, tmp_path)
    assert all(q["cache_n"] is None for (arm, _), r in runs.items() if arm == "off" for q in r.requests)
    assert claims["RQ1"]["status"] == "INCONCLUSIVE", claims["RQ1"]
    assert "the server reports no cache use" in reasons(claims["RQ1"])
    # the hits are reported (usage.prompt_tokens_details): ON run 2 repeats run 1's prompts and is told its hits, and
    # RQ2 reads them; ON run 1 may meet the cache cold (the salted OFF requests left nothing it can hit), a miss is
    # reported as nothing, and then RQ2 says that run is not shown to be cached rather than guessing
    on = {k: r for (arm, k), r in runs.items() if arm == "on"}
    assert all(q["cache_n"] for q in on[2].requests)
    assert all(q["cache_n"] is None or q["cache_n"] > 0 for q in on[1].requests)
    assert claims["RQ2"]["status"] in ("PASS", "INCONCLUSIVE")
    assert "on-run2 reports no cache use" not in reasons(claims["RQ2"])
    cold = not all(q["cache_n"] for q in on[1].requests)
    assert ("on-run1 reports no cache use" in reasons(claims["RQ2"])) == cold
