"""Background tenants: the plans, their deterministic prompts (BFCL's real prompt builder on the
real data), what enters the manifest and the fingerprint, and the one-line refusals before anything starts."""

from __future__ import annotations

import dataclasses
import os

import pytest

from artifact import workloads
from artifact.catalog import load_config, load_plans
from artifact.engines.llama_cpp.adapter import ENGINE, server_args
from artifact.errors import ArtifactError
from artifact.protocol import background_tenants
from artifact.protocol.sessions import fingerprints

PROBE = "probe-agent-cpu"


@pytest.fixture(scope="module")
def probe():
    cfg = load_config(PROBE)
    workload = workloads.get(cfg.workload.name)
    return cfg, workload, workload.prepare(cfg)


def test_the_tenant_plans_share_one_server_and_differ_only_in_the_load():
    plans = load_plans()
    names = ["tenants0", "tenants1-shared", "tenants2-shared", "tenants1-unshared", "tenants2-unshared"]
    specs = {n: background_tenants.spec_of(plans[n]) for n in names}
    assert {n: (s.count, s.prefix) for n, s in specs.items()} == {
        "tenants0": (0, "shared"),
        "tenants1-shared": (1, "shared"),
        "tenants2-shared": (2, "shared"),
        "tenants1-unshared": (1, "unshared"),
        "tenants2-unshared": (2, "unshared"),
    }
    tables = {n: plans[n].engine_settings["llama_cpp"] for n in names}
    assert all(t == tables["tenants0"] for t in tables.values()) and tables["tenants0"]["slots"] == 3
    assert {k: v for k, v in tables["tenants0"].items() if k != "slots"} == plans["main"].engine_settings["llama_cpp"]
    assert background_tenants.spec_of(plans["main"]) is None and "tenants" not in plans["main"].as_dict()


def test_slots_keep_the_whole_context_per_slot():
    cfg, plans = load_config(PROBE), load_plans()
    args = server_args(cfg, ENGINE.settings(cfg, plans["tenants1-shared"]), "m", "p")
    assert args[args.index("-np") + 1] == "3" and args[args.index("-c") + 1] == str(3 * cfg.server.ctx_size)
    args = server_args(cfg, ENGINE.settings(cfg, plans["main"]), "m", "p")  # the protocol's server: unchanged
    assert args[args.index("-np") + 1] == "1" and args[args.index("-c") + 1] == str(cfg.server.ctx_size)


@pytest.mark.parametrize(
    "table, message",
    [
        ('{ count = 1, prefix = "shared", colour = 1 }', "unknown key 'tenants.colour'"),
        ('{ count = 1, prefix = "partly" }', "tenants.prefix = 'partly' is not one of: shared, unshared"),
        ('{ count = -1, prefix = "shared" }', "count must be >= 0"),
        ('{ prefix = "shared" }', "missing key 'tenants.count'"),
    ],
)
def test_a_bad_tenants_table_is_a_one_line_error(tmp_path, table, message):
    p = tmp_path / "plans.toml"
    p.write_text(f'[t]\ndescription = "x"\narms = ["off"]\nruns = 1\nlifecycle = "shared"\ntenants = {table}\n')
    with pytest.raises(ArtifactError, match=message) as exc:
        load_plans(p)
    assert "\n" not in str(exc.value) and "t.tenants" in str(exc.value)


def test_shared_prompts_share_the_measured_system_prompt_and_unshared_ones_nothing(probe):
    cfg, workload, prepared = probe
    plans = load_plans()
    shared = background_tenants.prepare(cfg, plans["tenants1-shared"], workload, prepared)
    unshared = background_tenants.prepare(cfg, plans["tenants1-unshared"], workload, prepared)
    ((first, raw),), _ = workload.tenant_prompts(cfg, prepared, 4)
    assert len(shared.prompts[0]) == 4 and shared.prompts[0] == raw
    us = shared.identity["units"][0]
    assert us["unit"] == "multi_turn_base_0" and len(set(us["prompts_sha256"])) == 4
    # the whole system prompt (function docs included) is shared; only the held-out question differs
    system = first[: first.rindex("<|im_start|>user")]
    assert all(c >= len(system) for c in us["shared_prefix_chars"]) and len(system) > 0.9 * len(first)
    assert all(p.startswith(system) and p[len(system) :] != first[len(system) :] for p in raw)
    # unshared: the same prompts with that prefix replaced by seeded words: same lengths and suffixes, no markup
    uu = unshared.identity["units"][0]
    assert uu["shared_prefix_chars"] == [0, 0, 0, 0] and uu["prompt_chars"] == us["prompt_chars"]
    for p, q, c in zip(raw, unshared.prompts[0], us["shared_prefix_chars"]):
        assert (
            q[c:] == p[c:] and "<|im_start|>" not in q[:c] and set(q[:c].split()[:-1]) <= set(background_tenants.WORDS)
        )  # the last word cut to length
    assert unshared.identity["unshared_filler"] and shared.identity["unshared_filler"] is None
    # deterministic data: made again, the same hashes
    again = background_tenants.prepare(cfg, plans["tenants1-unshared"], workload, prepared)
    assert again.identity == unshared.identity


def test_tenant_questions_come_from_held_out_episodes_only(probe):
    from artifact.workloads.bfcl import driver

    cfg, workload, prepared = probe
    ((_, raw),), _ = workload.tenant_prompts(cfg, prepared, 3)
    held = driver.load_episodes(3, max_turns=1, start=80)
    for p, e in zip(raw, held):
        assert e.entry["question"][0][0]["content"] in p
    evaluated = driver.load_episodes(80, max_turns=1)
    assert not any(e.entry["question"][0][0]["content"] in p for e in evaluated for p in raw)


def test_the_load_enters_the_pairing_fingerprint_of_tenant_plans_only(probe):
    cfg, workload, prepared = probe
    plans = load_plans()

    def fp(name):
        load = background_tenants.prepare(cfg, plans[name], workload, prepared)
        return fingerprints(cfg, plans[name], prepared.ids, prepared.identity, load=background_tenants.pairing(load))

    main = fp("main")
    assert "tenants" not in main.pairing_inputs
    assert main.pairing == fingerprints(cfg, plans["main"], prepared.ids, prepared.identity).pairing
    one, two = fp("tenants1-shared"), fp("tenants2-shared")
    assert one.pairing_inputs["tenants"]["spec"]["count"] == 1 and one.pairing != two.pairing != main.pairing
    assert fp("tenants1-unshared").pairing != one.pairing


def test_an_engine_without_background_requests_refuses_the_plan_in_one_line(probe):
    _, workload, prepared = probe
    cfg = load_config("demo-smollm2-agent-cpu-vllm")
    with pytest.raises(ArtifactError, match="needs background requests, which engine vllm does not have") as exc:
        background_tenants.prepare(cfg, load_plans()["tenants1-shared"], workload, prepared)
    assert "\n" not in str(exc.value)


def test_too_few_slots_for_the_tenants_is_refused_before_anything_starts(probe):
    cfg, workload, prepared = probe
    plan = load_plans()["tenants2-shared"]
    plan = dataclasses.replace(plan, engine_settings={"llama_cpp": {**plan.engine_settings["llama_cpp"], "slots": 2}})
    with pytest.raises(
        ArtifactError,
        match=r"runs 2 tenant\(s\) .* serves 2 request\(s\) at a time: give it at "
        r"least 3 slots in the plan's llama_cpp table",
    ):
        background_tenants.prepare(cfg, plan, workload, prepared)


def test_a_workload_without_tenant_prompts_refuses(probe):
    cfg = load_config("demo-smollm2-q4_1-cpu-gsm8k")
    with pytest.raises(ArtifactError, match="workload gsm8k has no prompts for background tenants"):
        workloads.get("gsm8k").tenant_prompts(cfg, None, 2)


def test_synthetic_text_is_seeded_and_exact_in_length():
    a = background_tenants.synthetic_text(1000, 42)
    assert len(a) == 1000 and a == background_tenants.synthetic_text(1000, 42) != background_tenants.synthetic_text(
        1000, 43
    )
    assert background_tenants.synthetic_text(0, 1) == ""


def test_overlap_is_the_union_of_tenant_intervals_within_a_request():
    assert background_tenants._covered([(0, 2), (1, 3), (5, 6)], 1.5, 5.5) == pytest.approx(
        2.0
    )  # [1.5, 3] and [5, 5.5]
    assert background_tenants._covered([], 0, 1) == 0.0
    assert background_tenants._covered([(0, 10)], 2, 3) == pytest.approx(1.0)


def test_measured_requests_stay_serial_and_the_protocol_record_is_unchanged():
    from artifact.protocol.sessions import PROTOCOL

    assert PROTOCOL["batch"] == 1 and PROTOCOL["serial"] is True
    assert os.path.basename(background_tenants.TENANTS_FILE) == "tenants.jsonl"
