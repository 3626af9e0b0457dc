"""Result sets whose labels contradict what the runs recorded, copies passed off as reruns, trajectories that are not
their requests, unsafe server logs, planted outputs: each built as a results directory (the clean plan
of synthetic_runs, or the committed CPU kernel evidence where a real manifest is needed) with one thing changed,
then `./run.sh check` (artifact.cli.main) and the exit code and verdict asserted. docs/records.md lists the classes.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile

import pytest

from artifact.check.claims import INCONCLUSIVE, INVALID, PASS
from artifact.cli import main
from artifact.config import REPO
from artifact.provenance import fingerprint
from synthetic_runs import MODEL, OFF, ON1, ON2, main_plan, pairing_inputs, server_command, write_bfcl_run
from test_tampered import check, edit_manifest, malformed, records, rewrite


def manifest(run) -> dict:
    return json.loads((run.path / "manifest.json").read_text())


def put(run, m: dict) -> None:
    (run.path / "manifest.json").write_text(json.dumps(m))


def invalid(root, capsys, *needles: str) -> dict:
    """Exit 1 with every needle among the INVALID reasons; the claims by id."""
    code, err, claims, data = check(root, capsys)
    assert code == 1 and claims is not None, err
    for needle in needles:
        assert any(needle in p for p in data["invalid"]), (needle, data["invalid"])
    return claims


@pytest.fixture
def plan(tmp_path):
    return main_plan(tmp_path, OFF, ON1, ON2)


# --- a real run's manifest: the committed CPU kernel evidence (12 runs, 82 requests) ---------------------------


@pytest.fixture(scope="module")
def kernels_records(tmp_path_factory):
    root = tmp_path_factory.mktemp("kernels")
    with tarfile.open(REPO / "evidence" / "cpu-kernels" / "records.tar.xz") as tar:
        tar.extractall(root, filter="data")
    return root / "results"


@pytest.fixture
def kernels(kernels_records, tmp_path):
    """One configuration of the kernel experiment (OFF run 1, ON run 1 of plan kernels), as recorded."""
    shutil.copytree(kernels_records / "cpu-agent-q8_0", tmp_path / "cpu-agent-q8_0")
    return tmp_path, tmp_path / "cpu-agent-q8_0" / "kernels"


def edit_real(path, change, refingerprint: bool = False) -> None:
    m = json.loads((path / "manifest.json").read_text())
    change(m)
    if refingerprint:
        m["pairing_fingerprint"] = fingerprint(m["pairing_inputs"])
    (path / "manifest.json").write_text(json.dumps(m))


def test_the_committed_kernel_runs_pass_the_fact_checks(kernels, capsys):
    root, _ = kernels
    code, err, claims, _ = check(root, capsys)
    assert code == 3 and claims["RQ1"]["status"] == "NOT-RUN", err  # one OFF run: nothing to judge, nothing refused


# --- 1. a label decides which claim a run counts for: held against the facts ----------------------------------


def test_a_tenant_count_added_to_a_plan_without_tenants_is_corruption(tmp_path, plan, capsys):
    edit_manifest(plan[1], tenants={"spec": {"count": 1, "prefix": "shared", "prompts": 4, "n_predict": 32}})
    malformed(
        tmp_path,
        capsys,
        "off-run2/manifest.json: field 'tenants' records",
        "plan 'main' (configs/plans.toml) has no background tenants",
    )


def test_a_tenant_count_without_its_tenants_jsonl_is_corruption(tmp_path, capsys):
    spec = {"count": 1, "prefix": "shared", "prompts": 4, "n_predict": 32}
    for k in (1, 2):
        write_bfcl_run(tmp_path, "off", k, OFF, plan="mine", manifest={"tenants": {"spec": spec}})
    (tmp_path / "cfg" / "mine" / "off-run1" / "tenants.jsonl").unlink()
    malformed(
        tmp_path,
        capsys,
        "off-run1/manifest.json: field 'tenants' records 1 background tenant(s), but the run holds no tenants.jsonl",
    )


@pytest.mark.parametrize(
    "damage, why",
    [
        ("summary", "field 'tenants.measured.overlapped' is 0, tenants.jsonl holds 2 measured requests during which"),
        ("row", "tenants.jsonl:1: field 't_end' (0.0) is before t_start (0.5)"),
        ("unlabelled", "the run holds background tenants' records, but its manifest records no tenants"),
        ("count", "holds the requests of 1 tenant(s), the manifest's tenants count is 2"),
        ("prompt", "tenants.jsonl:1: field 'prompt_sha256' is 'bbbb"),
    ],
)
def test_tenants_jsonl_is_validated_and_the_manifests_load_is_held_against_it(tmp_path, capsys, damage, why):
    from tenant_runs import SPEC, load_record, loaded_plan

    main_plan(tmp_path, OFF, ON1, ON2)
    spec = {**SPEC, "count": 2} if damage == "count" else SPEC
    runs = loaded_plan(
        tmp_path,
        "tenants2-shared" if damage == "count" else "tenants1-shared",
        OFF,
        OFF,
        ON1,
        ON2,
        spec=spec,
        load=load_record(spec, overlapped=2, requests=2),
    )
    path = runs[0].path / "tenants.jsonl"
    if damage == "summary":
        m = manifest(runs[0])
        m["tenants"]["measured"]["overlapped"] = 0
        put(runs[0], m)
    elif damage == "row":
        rows = records(path)
        rows[0]["t_end"] = 0.0
        rewrite(path, rows)
    elif damage == "prompt":  # a tenant prompt the manifest's tenants.units does not hold for its unit
        rows = records(path)
        rows[0]["prompt_sha256"] = "bb" * 32
        rewrite(path, rows)
    elif damage == "unlabelled":
        shutil.copy(path, tmp_path / "cfg" / "main" / "off-run1" / "tenants.jsonl")
    else:  # every request made by tenant 0: one tenant where the manifest says two
        rewrite(path, [{**r, "tenant": 0} if r["kind"] == "tenant" else r for r in records(path)])
    malformed(tmp_path, capsys, why)


def test_the_load_the_claims_and_the_tenant_verdict_read_is_tenants_jsonl(tmp_path):
    from artifact.analysis import tenant_effect

    from tenant_runs import load_record, loaded_plan

    main_plan(tmp_path, OFF, ON1, ON2)
    runs = loaded_plan(tmp_path, "tenants1-shared", OFF, OFF, ON1, ON2, load=load_record(overlapped=2, requests=2))
    assert tenant_effect.under_load(runs[0]) and tenant_effect.recorded_load(runs[0]) == {
        "tenants": 1,
        "requests": 7,
        "failed": 0,
        "measured": 2,
        "overlapped": 2,
    }
    rows = tenant_effect.run_rows(runs)
    assert {r["measured_overlapped"] for r in rows} == {2} and {r["tenant_requests"] for r in rows} == {7}
    # a run whose file holds no tenant request is not under load, whatever its manifest's count says
    rewrite(
        runs[1].path / "tenants.jsonl", [r for r in records(runs[1].path / "tenants.jsonl") if r["kind"] == "measured"]
    )
    assert not tenant_effect.under_load(type(runs[1])(runs[1].path, runs[1].manifest))


@pytest.mark.parametrize(
    "overrides, why",
    [
        (
            {"ubatch_size": 512},
            "field 'plan_data.server_overrides' is {'ubatch_size': 512}, plan 'kernels' "
            "(configs/plans.toml) overrides nothing",
        ),
        (
            {"ubatch_size": 1},
            "field 'plan_data.server_overrides.ubatch_size' is 1, the server command line (server_cmd) shows 512",
        ),
    ],
)
def test_server_overrides_added_to_a_plan_are_corruption(kernels, capsys, overrides, why):
    root, plan_dir = kernels
    for run in ("off-run1", "on-run1"):
        edit_real(plan_dir / run, lambda m: m["plan_data"].update(server_overrides=overrides))
    malformed(root, capsys, "off-run1/manifest.json: ", why)


def _relabel_plan(root, plan_dir, new: str, deep: bool):
    target = plan_dir.parent / new
    shutil.move(plan_dir, target)
    for run in ("off-run1", "on-run1"):

        def change(m):
            m["plan"] = new
            if deep:
                m["plan_data"]["name"] = new

        edit_real(target / run, change)


@pytest.mark.parametrize(
    "deep, why",
    [
        (False, "field 'plan' is 'main', plan_data.name is 'kernels'"),
        (
            True,
            "field 'plan' is 'main', but the server command line (server_cmd) shows cache_ram_mib = 0, where plan "
            "'main' (configs/plans.toml) sets 8192",
        ),
    ],
)
def test_a_run_relabelled_as_another_plan_is_corruption(kernels, capsys, deep, why):
    root, plan_dir = kernels
    _relabel_plan(root, plan_dir, "main", deep)
    malformed(root, capsys, "off-run1/manifest.json: ", why)


def test_llama_server_records_relabelled_as_vllm_are_corruption(kernels, capsys):
    root, plan_dir = kernels

    def change(m):
        m["engine"] = "vllm"
        m["pairing_inputs"]["engine"]["engine"] = "vllm"

    for run in ("off-run1", "on-run1"):
        edit_real(plan_dir / run, change, refingerprint=True)
    malformed(
        root,
        capsys,
        "off-run1/manifest.json: field 'pairing_inputs.engine' lacks vllm, which every vllm identity records",
        "not a vllm server's record",
    )


def test_a_vllm_command_line_must_carry_its_arms_flag(tmp_path, capsys):
    for arm, k in (("off", 1), ("off", 2), ("on", 1)):
        write_bfcl_run(tmp_path, arm, k, OFF, engine="vllm")
    off2 = tmp_path / "cfg" / "main" / "off-run2"
    m = json.loads((off2 / "manifest.json").read_text())
    m["server_cmd"] = [a.replace("--no-enable-prefix-caching", "--enable-prefix-caching") for a in m["server_cmd"]]
    (off2 / "manifest.json").write_text(json.dumps(m))
    malformed(
        tmp_path,
        capsys,
        "off-run2/manifest.json: field 'server_cmd' lacks --no-enable-prefix-caching, the flag of arm 'off'",
    )


def _bridge_run(root):
    """A GSM8K bridge run of two synthetic items, as the runner records it (each item naming its source)."""
    import hashlib

    from artifact.records.store import RunWriter
    from artifact.workloads.gsm8k.prompts import SERVINGS

    d = root / "g" / "bridge" / "bridge-run1"
    inputs = pairing_inputs(MODEL, 8192, workload={"name": "gsm8k", "gsm8k_source": "synthetic"})
    w = RunWriter(
        d,
        {
            "config": "g",
            "plan": "bridge",
            "arm": "bridge",
            "run": 1,
            "session": "bridge",
            "episodes": ["synthetic_0000", "synthetic_0001"],
            "workload": "gsm8k",
            "lifecycle": "shared",
            "engine": "llama.cpp",
            "model": MODEL,
            "data": "synthetic",
            "items_source": "synthetic",
            "items_provenance": {"source": "synthetic", "synthetic": True, "data": "synthetic"},
            "workload_settings": {"name": "gsm8k", "gsm8k_source": "synthetic"},
            "pairing_inputs": inputs,
            "pairing_fingerprint": fingerprint(inputs),
            "server_cmd": server_command(inputs, "bridge"),
        },
    )
    for item in ("synthetic_0000", "synthetic_0001"):
        for i, (serving, cached) in enumerate(SERVINGS):
            cn = 49 if cached else 0
            w.request(
                {
                    "episode_id": item,
                    "item_id": item,
                    "serving": serving,
                    "turn": 0,
                    "step": 0,
                    "request_index": i,
                    "prompt_sha256": hashlib.sha256(item.encode()).hexdigest(),
                    "prompt_tokens": 50,
                    "output_tokens": [1, 2],
                    "output_text": "Answer: 3",
                    "top_logprobs": [None, None],
                    "cache_n": cn,
                    "prompt_n": 50 - cn,
                    "prompt_ms": 1.0 + i,
                    "predicted_ms": 2.0 + i,
                    "stop_type": "eos",
                    "error": None,
                    "cache_check": "ok",
                }
            )
        w.episode({"episode_id": item, "item_id": item, "source": "synthetic", "reference": "3", "n_requests": 4})
    w.finish(wall_s=1.0)
    return d


def test_gsm8k_items_relabelled_as_hub_data_are_corruption(tmp_path, capsys):
    run_dir = _bridge_run(tmp_path)
    assert check(tmp_path, capsys)[0] in (0, 3)
    shutil.rmtree(tmp_path / "check")
    m = json.loads((run_dir / "manifest.json").read_text())
    m.update(data="gsm8k", items_source="hub")
    m["items_provenance"].update(synthetic=False, data="gsm8k", source="hub")
    (run_dir / "manifest.json").write_text(json.dumps(m))
    malformed(tmp_path, capsys, "episodes.jsonl:1: field 'source' is 'synthetic', the manifest's data is 'gsm8k'")
    eps = records(run_dir / "episodes.jsonl")
    rewrite(run_dir / "episodes.jsonl", [{**e, "source": "gsm8k"} for e in eps])  # the items' own ids still say it
    malformed(
        tmp_path,
        capsys,
        "episodes.jsonl:1: field 'source' is 'gsm8k', but the item's id 'synthetic_0000' is a synthetic item's",
    )


def test_runs_of_a_plan_with_a_server_per_run_that_share_a_server_log_are_corruption(tmp_path, capsys):
    for arm, k in (("off", 1), ("off", 2)):
        write_bfcl_run(
            tmp_path, arm, k, OFF, plan="fresh", lifecycle="fresh", manifest={"server_log": "logs/server-off.log"}
        )
    malformed(
        tmp_path,
        capsys,
        "field 'lifecycle' is 'fresh' (a new server per run), but cfg/fresh/off-run1 and "
        "cfg/fresh/off-run2 record the same server log",
    )


# --- 2. provenance: the weights' pin, the binary's digests, the command line -----------------------------------


def test_a_derived_model_whose_sha256_is_not_its_recipe_pin_is_corruption(kernels, capsys):
    root, plan_dir = kernels
    for run in ("off-run1", "on-run1"):  # Q8_0 weights relabelled as the F32 twin of Q4_K_M
        edit_real(
            plan_dir / run,
            lambda m: m["model"].update(source="derived:smollm2-135m-bfcl-agent/Q4_K_M-as-F32", quant="F32"),
        )
    malformed(
        root,
        capsys,
        "off-run1/manifest.json: field 'model.sha256' is bf5a861704df16f0..., recipe "
        "smollm2-135m-bfcl-agent's pin for Q4_K_M-as-F32 is 5bf6bd8c1d5af5da...",
    )


@pytest.mark.parametrize(
    "change, why",
    [
        (
            lambda m: m["binary"].update(sha256="f" * 64),
            "field 'binary.sha256' is ffffffffffffffff..., the pairing inputs' engine.binary_sha256 is",
        ),
        (lambda m: m["binary"]["files"].update({"libggml-cpu.so": "0" * 64}), "field 'binary.files_sha256' ("),
        (
            lambda m: m["server_cmd"].__setitem__(m["server_cmd"].index("-ub") + 1, "1"),
            "field 'server_cmd' argument 12 is '1', the server_args the runs were paired by (pairing_inputs.engine) have "
            "'512'",
        ),
    ],
)
def test_the_manifests_binary_and_command_line_are_held_against_the_pairing_inputs(kernels, capsys, change, why):
    root, plan_dir = kernels
    edit_real(plan_dir / "on-run1", change)
    malformed(root, capsys, "on-run1/manifest.json: ", why)


# --- 3. copies do not count as independent evidence -----------------------------------------------------------


def _copy_records(src, dst) -> None:
    for name in ("requests.jsonl", "episodes.jsonl"):
        shutil.copy(src.path / name, dst.path / name)


def test_an_off_rerun_byte_copied_from_another_is_invalid(tmp_path, plan, capsys):
    _copy_records(plan[0], plan[1])
    claims = invalid(
        tmp_path,
        capsys,
        "cfg/main/off-run2 and cfg/main/off-run1 hold the same requests with identical server timings in 4 episode(s)",
        "not independent runs",
    )
    assert claims["RQ1"]["status"] == INVALID and claims["RQ2"]["status"] == INVALID


def test_an_on_rerun_copied_from_another_is_invalid(tmp_path, capsys):
    runs = [write_bfcl_run(tmp_path, arm, k, eps) for arm, eps in (("off", OFF), ("on", ON1)) for k in (1, 2)]
    _copy_records(runs[2], runs[3])
    claims = invalid(tmp_path, capsys, "cfg/main/on-run2 and cfg/main/on-run1 hold the same requests")
    assert claims["RQ1"]["status"] == PASS and claims["RQ2"]["status"] == INVALID


def test_a_configuration_duplicated_under_a_new_name_is_invalid(tmp_path, plan, capsys):
    shutil.copytree(tmp_path / "cfg", tmp_path / "copy")
    for run_dir in (tmp_path / "copy" / "main").iterdir():
        m = json.loads((run_dir / "manifest.json").read_text())
        (run_dir / "manifest.json").write_text(json.dumps({**m, "config": "copy"}))
    invalid(tmp_path, capsys, "copy/main/off-run1 and cfg/main/off-run1 hold the same requests")


def test_a_duplicated_episode_is_invalid(tmp_path, plan, capsys):
    reqs = records(plan[1].path / "requests.jsonl")
    e0 = [r for r in reqs if r["episode_id"] == "e0"]
    rewrite(
        plan[1].path / "requests.jsonl",
        [r for r in reqs if r["episode_id"] != "e1"] + [{**r, "episode_id": "e1"} for r in e0],
    )
    invalid(
        tmp_path,
        capsys,
        "cfg/main/off-run2 holds episodes e0 and e1 with the same requests and identical "
        "server timings: a duplicated episode",
        "cfg/main/off-run2: episode e1's first prompt",
    )


def test_renumbered_episodes_are_invalid(tmp_path, plan, capsys):
    swap = {"e1": "e2", "e2": "e1"}
    for name in ("requests.jsonl", "episodes.jsonl"):
        path = plan[3].path / name
        rewrite(path, [{**r, "episode_id": swap.get(r["episode_id"], r["episode_id"])} for r in records(path)])
    claims = invalid(
        tmp_path,
        capsys,
        "cfg/main/on-run2: episode e1's first prompt",
        "is not the one other runs of configuration cfg sent for it",
        "episodes renumbered or replaced",
    )
    assert claims["RQ2"]["status"] == INVALID


def _server_log(runs) -> str:
    """A llama-server session log for these runs' records, as b10435 writes it: the command line, then two timing
    lines per served request."""
    cmd = manifest(runs[0])["server_cmd"]
    import shlex

    lines = [f"$ {shlex.join(cmd)}"]
    task = 0
    for run in runs:
        for r in records(run.path / "requests.jsonl"):
            if r["error"] is None:
                lines.append(
                    f"0.01.116.309 I slot print_timing: id  0 | task {task} | prompt eval time = "
                    f"{r['prompt_ms']:10.2f} ms / {r['prompt_n']:5d} tokens (    0.05 ms per token)"
                )
                lines.append(
                    f"0.01.116.314 I slot print_timing: id  0 | task {task} |        eval time = "
                    f"{r['predicted_ms']:10.2f} ms / {len(r['output_tokens']):5d} tokens"
                )
                task += 1
    return "\n".join(lines) + "\n"


def test_records_that_disagree_with_their_servers_log_are_invalid(tmp_path, plan, capsys):
    log = tmp_path / "cfg" / "main" / "logs" / "server-off.log"
    log.parent.mkdir()
    for run in plan[:2]:
        edit_manifest(run, server_log="logs/server-off.log")
    log.write_text(_server_log(plan[:2]))
    assert check(tmp_path, capsys)[0] == 0  # the session's records are what its log says
    reqs = records(plan[1].path / "requests.jsonl")
    reqs[3]["prompt_ms"] += 0.01  # timings made up to pass for a rerun
    rewrite(plan[1].path / "requests.jsonl", reqs)
    claims = invalid(
        tmp_path,
        capsys,
        "cfg/main/off-run2: episode e1 request 1: requests.jsonl has prompt_ms",
        "its server log says",
        "its records are not what its server served",
    )
    assert claims["RQ1"]["status"] == INVALID


# --- 4. the agent trajectory against the request records -------------------------------------------------------

STEPS = [
    {"turn": 0, "step": 0, "calls": ["ls()"], "observations": ["a"]},
    {"turn": 0, "step": 1, "calls": None, "observations": []},
    {"turn": 1, "step": 0, "calls": None, "observations": []},
]


def _agent_plan(root, steps=STEPS, requests=((0, 0), (0, 1), (1, 0)), limit=5):
    """A plan whose episodes made three requests (turn 0 steps 0-1, turn 1 step 0) with this trajectory."""
    eps = {f"e{i}": [[1, 2], [3], [4]] for i in range(2)}
    runs = main_plan(root, eps, eps, eps, steps={e: steps for e in eps}, cache_n="warm")
    for run in runs:
        reqs = records(run.path / "requests.jsonl")
        for r in reqs:
            r["turn"], r["step"] = requests[r["request_index"]]
        rewrite(run.path / "requests.jsonl", reqs)
    return runs


def test_a_trajectory_that_agrees_with_its_requests_passes(tmp_path, capsys):
    _agent_plan(tmp_path)
    assert check(tmp_path, capsys)[0] in (0, 3)


@pytest.mark.parametrize(
    "steps, requests, why",
    [
        (STEPS[:2], None, "field 'steps' holds 2 steps, requests.jsonl 3 requests of episode e0"),
        (
            [STEPS[0], {**STEPS[1], "step": 2}, STEPS[2]],
            None,
            "field 'steps' position 1 is turn 0 step 2, request 1 of episode e0 in requests.jsonl is turn 0 step 1",
        ),
        (
            [STEPS[0], {**STEPS[1], "calls": ["cd('x')"]}, STEPS[2]],
            None,
            "field 'steps' position 1 (turn 0 step 1) made calls, so the next request is turn 0 step 2; requests.jsonl "
            "has turn 1 step 0",
        ),
        (
            [{**STEPS[0], "calls": None}, *STEPS[1:]],
            None,
            "field 'steps' position 0 (turn 0 step 0) made no call, which ends the turn, so the next request is turn 1 "
            "step 0; requests.jsonl has turn 0 step 1",
        ),
        (
            [*STEPS[:2], {**STEPS[2], "calls": ["ls()"]}],
            None,
            "field 'steps' position 2 (turn 1 step 0) made calls below the step limit (5), so BFCL sends another request",
        ),
        (STEPS, ((0, 1), (0, 1), (1, 0)), "episode e0's first request is turn 0 step 1, not turn 0 step 0"),
    ],
)
def test_a_trajectory_that_contradicts_its_requests_is_corruption(tmp_path, capsys, steps, requests, why):
    _agent_plan(tmp_path, steps, requests or ((0, 0), (0, 1), (1, 0)))
    malformed(tmp_path, capsys, "off-run1/episodes.jsonl:1: ", why)


def test_calls_at_the_step_limit_end_the_episode(tmp_path, capsys):
    steps = [{"turn": 0, "step": s, "calls": ["ls()"], "observations": []} for s in range(6)]
    eps = {"e0": [[1], [2], [3], [4], [5], [6]]}
    main_plan(tmp_path, eps, eps, eps, steps={"e0": steps}, cache_n="warm")  # step limit 5 (the pairing inputs')
    assert check(tmp_path, capsys)[0] in (0, 3)


def test_the_step_limit_is_read_where_real_manifests_keep_it():
    """Real manifests keep the workload's own settings under `settings` (the committed evidence's layout)."""
    from types import SimpleNamespace
    from artifact.workloads.bfcl.records import DEFAULT_STEP_LIMIT, step_limit

    real = {"workload_settings": {"name": "bfcl_multi_turn_base", "settings": {"max_steps_per_turn": 1}}}
    assert step_limit(SimpleNamespace(manifest=real)) == 1
    assert step_limit(SimpleNamespace(manifest={"pairing_inputs": {"workload": {"max_steps_per_turn": 5}}})) == 5
    assert step_limit(SimpleNamespace(manifest={})) == DEFAULT_STEP_LIMIT


def test_valid_must_be_the_verdict(tmp_path, plan, capsys):
    eps = records(plan[0].path / "episodes.jsonl")
    eps[2]["valid"] = True  # verdict "state_mismatch"
    rewrite(plan[0].path / "episodes.jsonl", eps)
    malformed(tmp_path, capsys, "off-run1/episodes.jsonl:3: field 'valid' is true, the verdict is 'state_mismatch'")


# --- 6. server logs obey the record files' rules ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, why",
    [
        ("absolute", "field 'server_log' ('/etc/hostname') must be a relative path under the run's plan directory"),
        (
            "climbing",
            "field 'server_log' ('../../etc/hostname') must be a relative path under the run's plan directory",
        ),
        ("pipe", "the server log is not a regular file (a pipe, device or directory); refusing to read it"),
        ("device link", "is a symbolic link (a server log -> /dev/zero)"),
        ("directory", "the server log is not a regular file"),
        ("oversized", "the server log holds 2048 bytes, more than the 1024 a server log may"),
    ],
)
def test_a_server_log_outside_the_rules_is_a_one_line_error_never_a_hang(
    tmp_path, plan, capsys, monkeypatch, kind, why
):
    log = tmp_path / "cfg" / "main" / "logs" / "server-off.log"
    log.parent.mkdir()
    rel = {"absolute": "/etc/hostname", "climbing": "../../etc/hostname"}.get(kind, "logs/server-off.log")
    for run in plan[:2]:
        edit_manifest(run, server_log=rel)
    if kind == "pipe":
        os.mkfifo(log)  # opened, it would block check for ever
    elif kind == "device link":
        log.symlink_to("/dev/zero")  # read, it would never end
    elif kind == "directory":
        log.mkdir()
    elif kind == "oversized":
        from artifact.records import store

        monkeypatch.setattr(store, "MAX_LOG_BYTES", 1024)
        log.write_text("x" * 2048)
    malformed(tmp_path, capsys, why)


# --- 7. an engine that always reports cache use ---------------------------------------------------------------


def test_an_off_run_that_reports_no_cache_use_on_an_engine_that_always_does_is_no_rq1_evidence(tmp_path, plan, capsys):
    reqs = records(plan[1].path / "requests.jsonl")
    rewrite(plan[1].path / "requests.jsonl", [{**r, "cache_n": None, "prompt_n": None} for r in reqs])
    code, _, claims, _ = check(tmp_path, capsys)
    rq1 = claims["RQ1"]["details"][0]
    assert claims["RQ1"]["status"] == INCONCLUSIVE and rq1["status"] == INCONCLUSIVE  # never PASS
    assert (
        "cfg/main/off-run2 reports no cache use on 8 of its 8 served requests (cache_n null), although llama.cpp "
        "reports it on every request it serves" in rq1["evidence"][0]
    )


# --- 8. check replaces only its own outputs ---------------------------------------------------------------------


def test_a_planted_check_json_does_not_make_check_delete_a_users_file(tmp_path, plan, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    (out / "check.json").write_text(json.dumps({"files": ["notes.txt"]}))  # names the user's file as an output
    assert main(["check", str(tmp_path), "--out", str(out)]) == 2
    assert "refusing to replace" in capsys.readouterr().err and (out / "notes.txt").read_text() == "keep"
    (out / "notes.txt").unlink()
    (out / "check.json").unlink()
    (out / "tab2.csv").write_text("mine")  # an output's name, in a folder no check made (no check.json)
    assert main(["check", str(tmp_path), "--out", str(out)]) == 2 and (out / "tab2.csv").read_text() == "mine"
    capsys.readouterr()
    (out / "tab2.csv").unlink()
    assert main(["check", str(tmp_path), "--out", str(out)]) == 0  # an empty folder is used (and a check's own
    assert (out / "check.json").exists()  # outputs replaced: test_tampered.py::test_a_failed_write_leaves_...)


def test_every_output_a_check_writes_has_one_of_its_own_names(tmp_path, plan, capsys):
    from artifact.check.run import output_names

    assert check(tmp_path, capsys)[0] == 0
    written = set(os.listdir(tmp_path / "check"))
    assert written <= output_names(), written - output_names()


# --- 9. compare: every outcome field, through the schema ---------------------------------------------------------


def compare(a, b, capsys) -> tuple[int, str]:
    code = main(["compare", str(a), str(b)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_compare_says_identical_only_for_the_same_outcome(tmp_path, capsys):
    a = write_bfcl_run(tmp_path / "a", "off", 1, OFF)
    b = write_bfcl_run(tmp_path / "b", "off", 1, OFF)  # the same records, another file
    code, out = compare(a.path, b.path, capsys)
    assert code == 0 and "IDENTICAL" in out and "timing fields, different by design, not compared: " in out
    assert "predicted_ms (requests.jsonl), prompt_ms (requests.jsonl)" in out
    assert compare(tmp_path / "a", tmp_path / "b", capsys)[0] == 0  # the same as results directories


@pytest.mark.parametrize(
    "damage, code, needles",
    [
        ("float token", 2, ["requests.jsonl:1: field 'output_tokens' must list token ids"]),
        ("no episodes.jsonl", 1, ["episodes.jsonl record(s) only in A", "INVALID: ", "has no episode record"]),
        (
            "verdict",
            1,
            [
                "episodes.jsonl field 'verdict' differs in 1 of 4 episodes; first: episode e1 (A: "
                "'state_mismatch', B: 'valid')",
                "field 'valid' differs",
            ],
        ),
        ("calls", 1, ["episodes.jsonl field 'steps' differs in 1 of 4 episodes; first: episode e0, position 0"]),
        (
            "text",
            1,
            [
                "requests.jsonl field 'output_text' differs in 1 of 8 requests; first: episode e1, request 1, "
                "position 5 (A: '[6, 7, 8]', B: 'other')"
            ],
        ),
        ("cache", 1, ["requests.jsonl field 'cache_n' differs", "field 'prompt_n' differs"]),
        (
            "logprob",
            1,
            [
                "requests.jsonl field 'top_logprobs' differs in 1 of 8 requests; first: episode e0, request 0, "
                "position 0"
            ],
        ),
        (
            "prompt",
            1,
            ["requests.jsonl field 'prompt_sha256' differs in 1 of 8 requests; first: episode e3, request 0"],
        ),
    ],
)
def test_compare_names_every_differing_outcome_field_and_exits_non_zero(tmp_path, capsys, damage, code, needles):
    steps = {
        "e0": [
            {"turn": 0, "step": 0, "calls": ["ls()"], "observations": ["a"]},
            {"turn": 0, "step": 1, "calls": None, "observations": []},
        ]
    }
    a = write_bfcl_run(tmp_path / "a", "off", 1, OFF, steps=steps)
    b = write_bfcl_run(tmp_path / "b", "off", 1, OFF, steps=steps)
    reqs, eps = records(b.path / "requests.jsonl"), records(b.path / "episodes.jsonl")
    if damage == "float token":
        reqs[0]["output_tokens"] = [1.0, 2, 3, 4, 5]
    elif damage == "no episodes.jsonl":
        (b.path / "episodes.jsonl").unlink()
    elif damage == "verdict":
        eps[1].update(verdict="valid", valid=True)
    elif damage == "calls":
        eps[0]["steps"][0]["calls"] = ["cd('x')"]
    elif damage == "text":
        reqs[3]["output_text"] = "text other"
    elif damage == "cache":
        reqs[2].update(cache_n=60, prompt_n=40)
    elif damage == "logprob":
        reqs[0]["top_logprobs"][0][1][1] = -2.75
    elif damage == "prompt":
        reqs[6]["prompt_sha256"] = "cd" * 32
    if damage != "no episodes.jsonl":
        rewrite(b.path / "requests.jsonl", reqs)
        rewrite(b.path / "episodes.jsonl", eps)
    got, out = compare(a.path, b.path, capsys)
    assert got == code, out
    for needle in needles:
        assert needle in out, (needle, out)


def test_compare_help_says_what_it_compares_and_its_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = capsys.readouterr().out
    assert "timing fields" in out.lower() and "never compared" in out and "exit codes:" in out
    assert "1  a compared field differs" in out and "2  the input is unreadable or malformed" in out
