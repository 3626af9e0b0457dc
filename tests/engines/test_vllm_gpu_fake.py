"""The H200 vLLM 0.25.0 configurations through the real adapter, protocol, BFCL, record writer and check, with a FAKE
GPU server: what cannot run here (vLLM's CUDA build on an H200) is replaced by tests/engines/fake_vllm_gpu.py, an
HTTP server answering as vLLM 0.25.0's source says it answers, started as the `vllm` executable of a fake vLLM
environment whose probe reports vLLM 0.25.0 on torch 2.11.0+cu130 and an "NVIDIA H200 (fake)". Everything the
adapter decides is real: the version check, the arm's server flag, VLLM_BATCH_INVARIANT in the server environment,
the salted OFF arm's cache_salt per request, the attention backend read from the log, the records and check's
verdicts on them (RQ4 for plan main, the beyond-the-paper mitigation verdict for plan bi). The measured numbers come
from the fake and mean nothing; the real ones would come from a GPU host (docs/gpu-hosts.md, NOT RUN).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from artifact.analysis import compare
from artifact.cli import main as cli
from artifact.config import REPO
from artifact.catalog import load_config, load_plan
from artifact.errors import ArtifactError
from artifact.protocol.runner import execute_plan
from artifact.records.store import find_runs
from budget import with_workload

FAKE_SERVER = Path(__file__).with_name("fake_vllm_gpu.py")
FAKE_TORCH = """__version__ = "2.11.0+cu130"
class version:
    cuda = "13.0"
class cuda:
    @staticmethod
    def is_available(): return True
    @staticmethod
    def device_count(): return 1
    @staticmethod
    def get_device_name(i): return "NVIDIA H200 (fake)"
"""


def fake_vllm_env(root: Path, version: str = "0.25.0") -> Path:
    """A FAKE vLLM environment: `bin/vllm` runs the fake GPU server; its Python sees fake vllm, torch, transformers
    packages (for the adapter's probe) in front of this test's own Python."""
    pkgs = root / "pkgs"
    for name, text in (
        ("vllm/__init__.py", f'__version__ = "{version}"\n'),
        ("vllm/_version.py", '__commit_id__ = "gdd10e03f9"\n'),
        (f"vllm-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"),
        ("torch/__init__.py", FAKE_TORCH),
        ("transformers/__init__.py", '__version__ = "5.17.0"\n'),
    ):
        (pkgs / name).parent.mkdir(parents=True, exist_ok=True)
        (pkgs / name).write_text(text)
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    python = bin_dir / "python3"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{pkgs}" exec "{sys.executable}" "$@"\n')
    vllm = bin_dir / "vllm"
    vllm.write_text(f'#!{python}\nimport runpy\nrunpy.run_path("{FAKE_SERVER}", run_name="__main__")\n')
    for p in (python, vllm):
        p.chmod(0o755)
    return vllm


def fake_config(tmp_path: Path, base: str = "h200-vllm-agent-fp16", version: str = "0.25.0") -> Path:
    model = tmp_path / "model" / "config.json"  # a Hugging Face directory (the fake loads nothing)
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "note": "fake model directory"}))
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    vllm = fake_vllm_env(tmp_path / f"fake-vllm-{version}", version)
    cfg = tmp_path / f"fake-{base}.toml"
    cfg.write_text(
        f'extends = "{REPO}/configs/h200-vllm/{base}.toml"\nname = "fake-{base}"\n'
        f'[engine]\nbinary = "{vllm}"\nstartup_timeout_s = 30\n'
        f'[model]\nsource = "path:{model}"\nsha256 = "{digest}"\n'
    )
    return cfg


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fake-gpu")
    cfg = with_workload(load_config(str(fake_config(tmp))), episodes=2, max_turns=2, max_steps_per_turn=1, n_predict=16)
    results = tmp / "results"
    for plan in ("main", "bi", "bi-salt", "salt", "bi-fa2", "bi-triton"):
        execute_plan(cfg, load_plan(plan), results)
    runs = {(r.manifest["plan"], r.manifest["arm"], r.manifest["run"]): r for r in find_runs(results)}
    return results, runs


def test_every_manifest_records_version_environment_batch_invariance_and_backend(gpu_results):
    _, runs = gpu_results
    assert len(runs) == 4 + 4 + 2 + 2 + 4 + 4
    for (plan, arm, _), run in runs.items():
        if plan in ("bi-fa2", "bi-triton"):
            continue  # the kernel plans: test_a_kernel_plan_records_what_it_asked_and_what_vllm_chose
        m = run.manifest
        assert m["status"] == "complete" and m["engine"] == "vllm"
        assert m["engine_build"] == "vLLM 0.25.0 (CUDA build, torch 2.11.0+cu130, NVIDIA H200 (fake))"
        assert (
            m["vllm"]["vllm"] == "0.25.0"
            and m["vllm"]["build"] == "cuda"
            and m["server_version"] == {"version": "0.25.0"}
        )
        assert m["vllm_version"]["configured"] == "0.25.0" and m["vllm_version"]["torch_pin"] == "2.11.0"
        assert m["attention_backend"] == "FLASH_ATTN" and m["attention"]["flash_attn_version"] == 3
        assert m["attention"]["candidates"][0] == "FLASH_ATTN"
        bi = plan in ("bi", "bi-salt")
        assert m["batch_invariant"] is bi
        assert (m["server_env"].get("VLLM_BATCH_INVARIANT") == "1") is bi
        assert m["server_env"]["NCCL_NVLS_ENABLE"] == "0"  # multicast stays off on the GPU host
        assert (m["pairing_inputs"]["engine"]["server_env"].get("VLLM_BATCH_INVARIANT") == "1") is bi
        salted = plan in ("bi-salt", "salt") and arm == "off"
        flag = "--enable-prefix-caching" if arm == "on" or salted else "--no-enable-prefix-caching"
        assert m["server_cmd"][-1] == flag and m["cache_condition"]["arm_flag"] == flag
        assert m["cache_condition"]["cache_config_info"]["enable_prefix_caching"] == str(flag.startswith("--enable"))
        assert ("cache_salt" in m["cache_condition"]["description"]) is salted
        assert m["plan_data"]["server_overrides"] == ({"batch_invariant": True} if bi else {})


# The fields in which a salted OFF run differs from a true OFF run by design (its requests carry a salt; its server
# is started as the ON arm's: it counts prefix-cache queries, none of them hits, and its command line and cache
# condition differ)
SALTED_BY_DESIGN = {
    "engine_extra.cache_salt",
    "engine_extra.metrics_prefix_cache_queries",
    "server_cmd",
    "cache_condition",
    "plan",
    "plan_data",
    "pairing_fingerprint",
    "pairing_inputs",
    "run_dir",
    "server_log",
}


def test_a_salted_off_arm_is_never_served_from_cache_and_equals_the_true_off_arm(gpu_results):
    _, runs = gpu_results
    for plan, truth in (("salt", "main"), ("bi-salt", "bi")):
        salts = []
        for k in (1, 2) if plan == "salt" else (1,):
            requests = runs[(plan, "off", k)].requests
            assert requests and all(r["cache_n"] == 0 for r in requests)
            salts += [r["engine_extra"]["cache_salt"] for r in requests]
            same = compare.compare_records(runs[(plan, "off", k)], runs[(truth, "off", k)])
            # every outcome field equal; what differs by design: the salt itself and the server's cache switch
            differ = [f for f in same.fields if f.name not in SALTED_BY_DESIGN]
            assert not differ and not same.unmatched, [f.first for f in differ] + same.unmatched
        assert len(set(salts)) == len(salts)  # one salt per request, never reused
    # the ON arm of the same kind of server is served from cache: the salt, not the server, made the OFF arm
    assert any(r["cache_n"] > 0 for r in runs[("bi-salt", "on", 1)].requests)


def test_check_judges_rq4_on_gpu_records_and_batch_invariance_beyond_the_paper(gpu_results, capsys):
    results, _ = gpu_results
    cli(["check", str(results)])
    data = json.loads((results / "check" / "check.json").read_text())
    rq4 = next(c for c in data["claims"] if c["id"] == "RQ4")
    assert rq4["status"] == "PASS"
    scopes = [d["scope"] for d in rq4["details"]]
    assert scopes == ["fake-h200-vllm-agent-fp16 / main"], scopes  # bi: mitigation; salt: one arm only
    assert "vLLM 0.25.0 (CUDA build" in rq4["details"][0]["observed"]
    beyond = {v["id"]: v for v in data["beyond"]["verdicts"]}
    bi = beyond["BEYOND-MITIGATION-bi"]  # both arms with VLLM_BATCH_INVARIANT=1: ON == OFF, and at what cost
    assert bi["status"] == "PASS" and "bit-exact" in bi["observed"], bi
    assert "the main plan's" in bi["evidence"][0]  # its cost, set against plan main of the same configuration
    salt_bi = beyond["BEYOND-MITIGATION-bi-salt"]  # ON vs salted OFF on one kind of server
    assert salt_bi["status"] == "PASS", salt_bi
    row = next(r for r in data["beyond"]["mitigation"] if r["plan"] == "bi")
    assert row["on_rerun_diverged"] == 0 and row["off_rerun_diverged"] == 0


def test_a_configuration_for_another_vllm_version_is_refused_before_anything_runs(tmp_path):
    cfg = load_config(str(fake_config(tmp_path, version="0.11.0")))
    with pytest.raises(
        ArtifactError,
        match=r"vLLM 0\.11\.0 is installed, the configuration is written for vLLM "
        r"0\.25\.0",
    ):
        execute_plan(cfg, load_plan("main"), tmp_path / "results")
    assert not list(tmp_path.rglob("manifest.json"))


def test_a_kernel_plan_records_what_it_asked_and_what_vllm_chose(gpu_results):
    """A kernel plan's flags reach both arms' servers; its manifest records what it asked (`kernel_settings`) and
    what the server's log says it chose (`attention`), and the settings are the plan's server overrides."""
    _, runs = gpu_results
    asked = {"bi-fa2": ("FLASH_ATTN", 2), "bi-triton": ("TRITON_ATTN", None)}
    for (plan, arm, _), run in runs.items():
        if plan not in asked:
            assert run.manifest["kernel_settings"]["attention_backend"] is None
            continue
        m, (backend, fa) = run.manifest, asked[plan]
        assert m["kernel_settings"] == {
            "attention_backend": backend,
            "flash_attn_version": fa,
            "enforce_eager": False,
            "enforce_eager_from": None,
            "batch_invariant": True,
            "how": "--attention-config",
        }
        config = json.loads(m["server_cmd"][m["server_cmd"].index("--attention-config") + 1])
        assert config == {"backend": backend, **({"flash_attn_version": fa} if fa else {})}
        assert m["attention_backend"] == backend and m["attention"]["flash_attn_version"] == fa
        assert m["plan_data"]["server_overrides"]["attention_backend"] == backend
        assert m["server_env"].get("VLLM_BATCH_INVARIANT") == "1"
