"""Protocol fidelity: the plan's cache condition is the one in effect, nothing outside the configuration
can move a token unseen, and infrastructure failures never become episode outcomes.

Tests marked `server` run the real llama-server (b10434) with SmolLM2-135M on this machine's CPU. The fault
injection for HTTP 5xx and malformed responses is a forwarding proxy in front of that real server (the only way to
make a healthy server answer badly on cue); its tests say so in their names.
"""

from __future__ import annotations

import dataclasses
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from artifact import engines
from artifact.config import REPO
from artifact.catalog import load_config, load_plan
from artifact.engines.llama_cpp import adapter as llama_server
from artifact.engines.llama_cpp.adapter import LlamaServer, resolve_binary
from artifact.models import verified_weights
from artifact.errors import ArtifactError
from artifact.protocol import sessions
from artifact.protocol.runner import execute_plan
from artifact.records.store import RunWriter, find_runs
from artifact.workloads.bfcl import driver as bfcl
from budget import with_workload


def small(cfg, **workload):
    return with_workload(cfg, **{**dict(episodes=1, max_turns=1, max_steps_per_turn=1, n_predict=24), **workload})


@pytest.fixture(scope="module")
def cfg():
    return small(load_config("demo-smollm2-agent-cpu"))


# Two unrelated prompts of a few hundred tokens each (they share almost no prefix).
PROMPT_A = "<|im_start|>user\n" + " ".join(f"apple {i} orchard" for i in range(120)) + "<|im_end|>\n"
PROMPT_B = "Zebra crossing notes: " + " ".join(f"stripe {i} black white" for i in range(100))


def a_b_a(cfg, plan, tmp_path) -> tuple[int, int]:
    """Prompts A, B, A on one server (cache on); returns (cached tokens, prompt tokens) of the second A."""
    with LlamaServer(cfg, plan, verified_weights(cfg.model), tmp_path / f"{plan.name}.log") as server:
        server.complete(PROMPT_A, 4, True)
        server.complete(PROMPT_B, 4, True)
        again = server.complete(PROMPT_A, 4, True)
    return again.cache_n, again.prompt_tokens


@pytest.mark.server
def test_host_prompt_cache_serves_a_returning_prompt_in_main_and_not_in_cram0(cfg, tmp_path):
    main, cram0 = load_plan("main"), load_plan("cram0")
    cached, total = a_b_a(cfg, main, tmp_path)
    assert total > 300 and cached >= total - 2, (cached, total)  # restored from host memory
    cached, total = a_b_a(cfg, cram0, tmp_path)
    assert cached < 16, (cached, total)  # recomputed: only the shared first tokens
    # A pinned slot with similarity selection off bypasses the host cache even at 8192 MiB: the condition the
    # artifact used to run by mistake (id_slot 0, -sps 0).
    pinned = dataclasses.replace(
        main,
        name="pinned",
        engine_settings={
            "llama_cpp": {**main.engine_settings["llama_cpp"], "pin_slot": True, "slot_prompt_similarity": 0.0}
        },
    )
    cached, _ = a_b_a(cfg, pinned, tmp_path)
    assert cached < 16


def test_plans_carry_their_cache_condition_as_data(cfg):
    plans = {name: load_plan(name) for name in ("main", "cram0", "fresh", "bridge")}
    conditions = {n: llama_server.cache_condition(llama_server.ENGINE.settings(cfg, p)) for n, p in plans.items()}
    assert conditions["main"] == {
        "server_args": ["--cache-ram", "8192", "-sps", "0.1", "--cache-idle-slots"],
        "request": {"id_slot": -1},
        "description": "host prompt cache 8192 MiB (--cache-ram), slot chosen by the server",
        "settings": {"cache_ram_mib": 8192, "slot_prompt_similarity": 0.1, "pin_slot": False},
    }
    assert conditions["cram0"]["server_args"][:2] == ["--cache-ram", "0"]
    assert conditions["fresh"] == conditions["main"] and plans["fresh"].lifecycle == "fresh"


@pytest.mark.server
def test_a_user_config_file_cannot_reach_the_server(cfg, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".config" / "llama.cpp").mkdir(parents=True)
    (home / ".config" / "llama.cpp" / "config.ini").write_text("ctx-size = 512\n")
    binary = resolve_binary(cfg.engine.binary)
    # Control: the same binary, given this HOME, does read the file.
    seen = subprocess.run(
        [str(binary), "--version"],
        env={"HOME": str(home), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert llama_server.CONFIG_FILE_LOG_LINE in seen.stdout + seen.stderr
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    with LlamaServer(cfg, load_plan("main"), verified_weights(cfg.model), tmp_path / "s.log") as server:
        assert server.props["default_generation_settings"]["n_ctx"] == cfg.server.ctx_size
    assert llama_server.CONFIG_FILE_LOG_LINE not in (tmp_path / "s.log").read_text()


@pytest.mark.server
def test_a_server_that_says_it_used_a_config_file_is_refused(cfg, tmp_path):
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(
        f"#!/bin/sh\necho 'using config file: /somewhere/config.ini'\nexec {resolve_binary(cfg.engine.binary)} \"$@\"\n"
    )
    wrapper.chmod(0o755)
    wrapped = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, binary=str(wrapper)))
    with pytest.raises(ArtifactError, match="applied a configuration file"):
        LlamaServer(wrapped, load_plan("main"), verified_weights(cfg.model), tmp_path / "s.log").start()


@pytest.mark.server  # needs the built llama-server (its binary is hashed or started)
def test_a_system_config_file_is_refused_before_start(cfg, tmp_path, monkeypatch):
    system = tmp_path / "config.ini"
    system.write_text("temp = 1.0\n")
    monkeypatch.setattr(llama_server, "SYSTEM_CONFIG", system)
    with pytest.raises(ArtifactError, match="move it away"):
        LlamaServer(cfg, load_plan("main"), Path("unused.gguf"), tmp_path / "s.log").start()


def test_llama_arg_and_other_variables_never_reach_the_server(tmp_path, monkeypatch):
    from artifact.engines.server_process import server_env

    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "512")
    monkeypatch.setenv("GGML_CUDA_DISABLE_GRAPHS", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    env = server_env(tmp_path)
    assert not any(k.startswith(("LLAMA_ARG_", "GGML_", "HF_")) for k in env)
    assert env["HOME"] == str(tmp_path) and env["XDG_CONFIG_HOME"] == str(tmp_path / "config")


# -- the pairing fingerprint ------------------------------------------------------------------------------------


@pytest.mark.server  # needs the built llama-server (its binary is hashed or started)
def test_engine_identity_covers_binary_args_requests_and_threads(cfg, tmp_path):
    main = load_plan("main")
    ident = engines.identity(cfg, main)
    assert ident["binary_sha256"] == llama_server.binary_identity(resolve_binary(cfg.engine.binary))["sha256"]
    args = ident["server_args"]
    assert args[args.index("--port") + 1] == "<port>" and cfg.model.sha256 in args[args.index("-m") + 1]
    assert ident["request_fields"]["id_slot"] == -1 and "cache_prompt" not in ident["request_fields"]
    two = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, threads=2))
    one = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, threads=1))
    assert engines.identity(two, main)["threads"] == 2 and engines.identity(two, main) != engines.identity(one, main)
    assert engines.identity(cfg, load_plan("cram0")) != ident  # another cache condition, another fingerprint
    # another binary (one byte differs) is another identity, whatever build_info it would report
    copy = tmp_path / "bin" / "llama-server"
    copy.parent.mkdir()
    shutil.copy2(resolve_binary(cfg.engine.binary), copy)
    with open(copy, "ab") as fh:
        fh.write(b"\0")
    other = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, binary=str(copy)))
    assert engines.identity(other, main)["binary_sha256"] != ident["binary_sha256"]


@pytest.mark.server  # needs the built llama-server (its binary is hashed or started)
def test_pairing_fingerprint_covers_workload_data_and_is_the_same_for_both_arms(cfg):
    main = load_plan("main")
    data = bfcl.data_identity()
    assert data["bfcl_eval"] == "2026.3.23" and len(data["data_sha256"]) == 64
    a = sessions.fingerprints(cfg, main, ["multi_turn_base_0"], data)
    b = sessions.fingerprints(cfg, main, ["multi_turn_base_0"], {**data, "data_sha256": "0" * 64})
    assert a.pairing != b.pairing and a.resume != b.resume
    # the arm is not an input: OFF and ON runs of one plan share it (the ON switch is the only difference)
    assert "arm" not in json.dumps(a.pairing_inputs)


# -- configurations validated against what exists --------------------------------------------------------------


def test_an_engine_kind_that_is_not_implemented_is_refused(cfg, tmp_path):
    other = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, kind="sglang"))
    with pytest.raises(ArtifactError, match="engine.kind = 'sglang' is not implemented"):
        execute_plan(other, load_plan("main"), tmp_path)
    assert not list(tmp_path.rglob("manifest.json"))


def test_a_prompt_variant_bfcl_never_sends_to_a_handler_is_refused(cfg, tmp_path):
    fc = dataclasses.replace(cfg, chat=dataclasses.replace(cfg.chat, handler="qwen_fc"))
    with pytest.raises(ArtifactError, match="cannot be used with chat.handler 'qwen_fc'"):
        execute_plan(fc, load_plan("main"), tmp_path)
    bfcl.check_prompt_variant("qwen_fc", "default")  # BFCL's own prompt is always fine


def test_step_limit_is_bfcls_a_turn_makes_at_most_limit_plus_one_requests():
    episode = bfcl.load_episodes(1, max_turns=1)[0]
    calls = []

    def always_calls_a_tool(prompt, turn, step):
        calls.append(step)
        return "[ls()]", 0, 0

    result = bfcl.run_episode(
        episode,
        "qwen",
        "ep_steps",
        always_calls_a_tool,
        prompt_variant="python",
        max_steps_per_turn=3,
        log=io.StringIO(),
    )
    assert len(calls) == 4 and result.n_requests == 4 and result.verdict != "valid"


# -- infrastructure failures end the run, never an episode ------------------------------------------------------


class FaultProxy(http.server.ThreadingHTTPServer):
    """Forwards to a real llama-server; the `fail_at`-th /completion is answered by `fault(response_json)`."""

    def __init__(self, upstream: str, fail_at: int, fault):
        self.upstream, self.fail_at, self.fault, self.completions = upstream, fail_at, fault, 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                r = httpx.post(proxy.upstream + self.path, content=body, timeout=600)
                status, payload = r.status_code, r.content
                if self.path == "/completion":
                    proxy.completions += 1
                    if proxy.completions == proxy.fail_at:
                        status, payload = proxy.fault(r.json())
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        super().__init__(("127.0.0.1", 0), Handler)


def run_through_fault(cfg, tmp_path, monkeypatch, fault):
    real_start = LlamaServer.start
    proxies = []

    def start_behind_proxy(self):
        real_start(self)
        proxy = FaultProxy(f"http://127.0.0.1:{self.proc.port}", 1, fault)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        proxies.append(proxy)
        self.proc.client = httpx.Client(
            base_url=f"http://127.0.0.1:{proxy.server_address[1]}", timeout=600, trust_env=False
        )
        return self

    monkeypatch.setattr(LlamaServer, "start", start_behind_proxy)
    plan = dataclasses.replace(load_plan("main"), arms=("off",), runs=1)
    try:
        with pytest.raises(ArtifactError) as err:
            execute_plan(small(cfg, max_steps_per_turn=3), plan, tmp_path)
    finally:
        for p in proxies:
            p.shutdown()
    [run] = find_runs(tmp_path)
    assert run.manifest["status"] == "incomplete"
    assert not any(e["verdict"] == "multi_turn:inference_error" for e in run.episodes)
    return str(err.value)


@pytest.mark.server
def test_http_5xx_fails_the_run_not_the_episode_fault_proxy(cfg, tmp_path, monkeypatch):
    message = run_through_fault(
        cfg, tmp_path, monkeypatch, lambda body: (500, b'{"error": {"code": 500, "message": "boom", "type": "server"}}')
    )
    assert "HTTP 500" in message and "boom" in message


@pytest.mark.server
def test_a_malformed_response_fails_the_run_not_the_episode_fault_proxy(cfg, tmp_path, monkeypatch):
    def drop_timings(body):
        body.pop("timings")
        return 200, json.dumps(body).encode()

    assert "'timings'" in run_through_fault(cfg, tmp_path, monkeypatch, drop_timings)


@pytest.mark.server
def test_a_full_disk_fails_the_run_not_the_episode(cfg, tmp_path, monkeypatch):
    real_init = RunWriter.__init__

    def requests_to_dev_full(self, run_dir, manifest):
        real_init(self, run_dir, manifest)
        self._requests.close()
        self._requests = open("/dev/full", "a")  # every flush fails with ENOSPC, as on a full disk

    monkeypatch.setattr(RunWriter, "__init__", requests_to_dev_full)
    plan = dataclasses.replace(load_plan("main"), arms=("off",), runs=1)
    with pytest.raises(ArtifactError, match="cannot write the request record"):
        execute_plan(cfg, plan, tmp_path)
    [run] = find_runs(tmp_path)
    assert run.manifest["status"] == "incomplete" and run.episodes == []


# -- one writer per results directory ---------------------------------------------------------------------------


def test_a_second_writer_on_the_same_plan_directory_is_refused(tmp_path):
    pdir = tmp_path / "results" / "demo-smollm2-agent-cpu" / "main"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from artifact.protocol.sessions import "
            "plan_lock\nwith plan_lock(Path(sys.argv[1])):\n    print('locked', flush=True); time.sleep(60)",
            str(pdir),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        (pdir / "off-run1").mkdir()
        (pdir / "off-run1" / "marker").write_text("live run")
        r = subprocess.run(
            [sys.executable, "-m", "artifact", "run", "demo-smollm2-agent-cpu", "--results", str(tmp_path / "results")],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        error = r.stderr.strip().splitlines()[-1]  # (a warning line precedes it when pytest runs unisolated)
        assert r.returncode == 2 and error.startswith("error: ") and "is being written by pid" in error
        assert (pdir / "off-run1" / "marker").read_text() == "live run"  # nothing moved away
    finally:
        holder.kill()
        holder.wait()


# -- secrets out of reach, network isolation recorded -----------------------------------------------------------


@pytest.mark.server
def test_a_run_through_run_sh_starts_without_secrets_and_without_network(tmp_path):
    config = tmp_path / "tiny.toml"
    text = (REPO / "configs" / "demo-smollm2-agent-cpu.toml").read_text()
    for old, new in [
        ("max_steps_per_turn = 3 ", "max_steps_per_turn = 0 "),
        ("max_turns = 2", "max_turns = 1"),
        ("n_predict = 192", "n_predict = 8"),
    ]:
        text = text.replace(old, new)
    config.write_text(text)
    env = {**os.environ, "SERVICE_API_TOKEN": "sekrit", "AWS_SECRET_ACCESS_KEY": "sekrit"}
    env.pop("ARTIFACT_ALLOW_NETWORK", None)
    r = subprocess.run(
        [
            str(REPO / "run.sh"),
            "run",
            str(config),
            "--plan",
            "cram0",
            "--episodes",
            "1",
            "--results",
            str(tmp_path / "results"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    for run in find_runs(tmp_path / "results"):
        iso = run.manifest["isolation"]
        assert iso["network"] == "loopback-only" and iso["secrets_in_initial_environment"] == []
        assert "SERVICE_API_TOKEN" not in iso["initial_environment"]
        assert "sekrit" not in json.dumps(run.manifest)


def test_log_probabilities_align_to_tokens_when_the_server_drops_a_position():
    # llama-server drops the entry of a token whose text ends inside a UTF-8 character (seen on the H200: a
    # Q8_0 run stopped on it); entries name their token, which places them.
    def entry(tok):
        return {"id": tok, "logprob": -0.1, "top_logprobs": [{"id": tok, "logprob": -0.1}, {"id": 9, "logprob": -2.0}]}

    top = llama_server.align_top_logprobs([5, 6, 7], [entry(5), entry(7)])
    assert top == [[[5, -0.1], [9, -2.0]], None, [[7, -0.1], [9, -2.0]]]
    assert llama_server.align_top_logprobs([5], []) == [None]
    with pytest.raises(ArtifactError, match="do not align"):
        llama_server.align_top_logprobs([5, 6], [entry(8)])


def test_the_recorded_command_line_and_binary_are_held_against_the_identity(cfg):
    """A manifest as LlamaServer records it (the command line `server_args` makes, the binary's digests, the
    identity with its placeholders) passes the checker's engine facts; an edited argument or digest does not, and
    the settings the command line shows are read back (artifact.check.facts)."""
    import hashlib
    import json

    from artifact.engines.llama_cpp.adapter import ENGINE, Settings, cache_condition, server_args

    settings = Settings(ubatch_size=512, flash_attn="on", cache_ram_mib=0)
    files = {"llama-server": "aa" * 32, "libggml.so": "bb" * 32}
    combined = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    ident = {
        "engine": "llama.cpp",
        "binary_sha256": "aa" * 32,
        "binary_files_sha256": combined,
        "server_args": server_args(cfg, settings, f"<model sha256 {cfg.model.sha256}>", "<port>"),
        "request_fields": {"id_slot": -1},
    }
    m = {
        "model": {"sha256": cfg.model.sha256},
        "pairing_inputs": {"engine": ident},
        "server_cmd": ["/bin/llama-server"] + server_args(cfg, settings, "/models/x.gguf", "40001"),
        "binary": {"path": "/bin/llama-server", "sha256": "aa" * 32, "files_sha256": combined, "files": files},
        "cache_condition": cache_condition(settings),
    }
    assert ENGINE.audit.manifest_problem(m) is None
    shown = ENGINE.audit.command_settings(m)
    assert shown == {
        "ubatch_size": 512,
        "flash_attn": settings.flash_attn,
        "gpu_layers": settings.gpu_layers,
        "slots": 1,
        "cache_ram_mib": 0,
        "slot_prompt_similarity": 0.1,
        "pin_slot": False,
    }
    edited = {**m, "server_cmd": [a if a != "512" else "1" for a in m["server_cmd"]]}
    assert "the server ran another command line" in ENGINE.audit.manifest_problem(edited)
    assert "not the one the runs were paired by" in ENGINE.audit.manifest_problem(
        {**m, "binary": {**m["binary"], "sha256": "cc" * 32}}
    )
    assert "is not the digest of binary.files" in ENGINE.audit.manifest_problem(
        {**m, "binary": {**m["binary"], "files": {**files, "libggml.so": "dd" * 32}}}
    )


def test_a_model_pinned_file_by_file_is_named_by_its_first_file_in_the_pairing_and_the_check():
    """The paper's configurations (hf: sources, sha256 per file): the pairing placeholder names the first file's
    sha256 (the file `-m` loads), and the records check holds the command line to it instead of refusing it."""
    from artifact.config import read_config
    from artifact.engines.llama_cpp.adapter import model_file_sha256
    from artifact.engines.llama_cpp.records import manifest_problem

    cfg = read_config("paper/qwen2.5-7b-q4_k_m")
    first = cfg.model.files[0].sha256
    assert cfg.model.sha256 == "" and model_file_sha256(cfg) == first
    manifest = {
        "model": {"sha256": "", "files": [{"name": f.name, "sha256": f.sha256} for f in cfg.model.files]},
        "pairing_inputs": {"engine": {"server_args": ["-m", f"<model sha256 {first}>", "--port", "<port>"]}},
        "server_cmd": ["llama-server", "-m", "/w/qwen-00001-of-00002.gguf", "--port", "8080"],
    }
    assert manifest_problem(manifest) is None
    other = {
        **manifest,
        "pairing_inputs": {"engine": {"server_args": ["-m", f"<model sha256 {'0' * 64}>", "--port", "<port>"]}},
    }
    assert "names model sha256 000000000000" in manifest_problem(other)
