"""Margins or kernels, on records whose margins and perturbations are known: at every position
of an episode's second request (the ON arm's cached one) the OFF arm's top-2 margin is m and the ON arm's margin on
the same two tokens is m - d, for d chosen per configuration ("known kernels")."""

from __future__ import annotations

import json

import numpy as np
import pytest

from artifact.analysis import quantization as qm
from artifact.check.beyond import write_beyond
from artifact.records.store import find_runs
from synthetic_runs import MODEL, series_model, write_bfcl_run

# per episode, the margins of the 10 positions of its second request: mostly wide, one narrow (0.05 nats)
MARGINS = [2.0] * 9 + [0.05]
N_EP = 30


def arm_records(d: float, margins=MARGINS):
    """OFF and ON outputs and top-2 lists: token 10 + i best in OFF with margin m; in ON the margin is m - d
    (negative: the ON arm's best is the other token, a flip)."""
    off_eps, on_eps, off_lp, on_lp = {}, {}, {}, {}
    for e in range(N_EP):
        eid = f"e{e}"
        toks = [10 + i for i in range(len(margins))]
        off_top = [[[t, -0.7], [t + 100, -0.7 - m]] for t, m in zip(toks, margins)]  # probabilities sum to < 1
        on_top, on_toks = [], []
        for t, m in zip(toks, margins):
            mo = m - d
            if mo >= 0:
                on_top.append([[t, -0.7], [t + 100, -0.7 - mo]])
                on_toks.append(t)
            else:
                on_top.append([[t + 100, -0.7], [t, -0.7 + mo]])
                on_toks.append(t + 100)
                break
        off_eps[eid] = [[1, 2], toks]
        on_eps[eid] = [[1, 2], on_toks]
        off_lp[(eid, 1)] = off_top
        on_lp[(eid, 1)] = on_top
    return off_eps, on_eps, off_lp, on_lp


def configuration(root, config, source, quant, d, margins=MARGINS, plan="kernels", manifest=None):
    """A configuration's OFF and ON run 1; `source` "derived:r/LEVEL": the level of one series (the agent recipe's
    pinned product: references are found by the weights' lineage, never the display name)."""
    model = {**series_model(MODEL, source.rsplit("/", 1)[-1]), "name": "TestLM agent", "quant": quant}
    off, on, off_lp, on_lp = arm_records(d, margins)
    write_bfcl_run(root, "off", 1, off, config=config, plan=plan, model=model, logprobs=off_lp, manifest=manifest)
    write_bfcl_run(root, "on", 1, on, config=config, plan=plan, model=model, logprobs=on_lp, manifest=manifest)


def test_positions_give_margin_perturbation_and_flip_exactly(tmp_path):
    configuration(tmp_path, "lvl", "derived:r/Q8_0", "Q8_0", d=0.1)
    pos = qm.position_frame(find_runs(tmp_path))
    assert len(pos) == N_EP * 10  # every position of the cached request, the last one flipping
    assert pos["delta"].to_numpy() == pytest.approx(np.full(len(pos), 0.1))
    assert pos.groupby("episode_id")["flip"].sum().eq(1).all()
    assert set(pos[pos["flip"] == 1]["margin"].round(6)) == {0.05}


def test_the_same_weights_through_f32_kernels_is_the_reference_and_kernels_explain_the_flips(tmp_path):
    """Equal margins, the level's perturbation 100x the reference's: H-kernel holds, H-margin fails."""
    configuration(tmp_path, "lvl", "derived:r/Q8_0", "Q8_0", d=0.1)
    configuration(tmp_path, "lvl-f32", "derived:r/Q8_0-as-F32", "F32", d=0.001)
    tables, verdicts, _ = qm.analyse(find_runs(tmp_path))
    pairs = tables["quant_mechanism_pairs.csv"]
    (row,) = pairs.to_dict("records")
    assert (row["config"], row["reference"], row["reference_kind"]) == (
        "lvl",
        "lvl-f32",
        "same weights through F32 kernels",
    )
    assert row["flip_rate"] == pytest.approx(0.1) and row["reference_flip_rate"] == 0
    assert row["margin_only_rate"] == 0  # the level's margins with the reference's perturbations: no flip
    assert row["kernel_only_rate"] > 0.05  # the level's perturbations with the reference's margins: flips
    by_id = {v.id: v for v in verdicts}
    assert by_id["BEYOND-QUANT-KERNEL"].status == "PASS"
    assert by_id["BEYOND-QUANT-MARGIN"].status == "FAIL"


def test_the_kernel_experiments_grid_separates_kernels_from_weight_precision(tmp_path):
    """Q8_0 vs its own weights in F32 (kernels differ), Q8_0-as-F32 vs F16-as-F32 (the same F32 kernels, weights of
    different precision): the perturbation comes with the quantized kernel only, so KERNEL holds and WEIGHTS not."""
    configuration(tmp_path, "q8", "derived:r/Q8_0", "Q8_0", d=0.1)
    configuration(tmp_path, "q8-f32", "derived:r/Q8_0-as-F32", "F32", d=0.001)
    configuration(tmp_path, "f16-f32", "derived:r/F16-as-F32", "F32", d=0.001)
    tables, verdicts, _ = qm.analyse(find_runs(tmp_path))
    pairs = {
        r["config"]: (r["reference"], r["reference_kind"])
        for r in tables["quant_mechanism_pairs.csv"].to_dict("records")
    }
    assert pairs == {"q8": ("q8-f32", qm.SAME_WEIGHTS), "q8-f32": ("f16-f32", qm.SAME_KERNELS)}
    got = {(v.id, v.scope.split(" vs ")[0]): v.status for v in verdicts}
    assert got[("BEYOND-QUANT-KERNEL", "q8")] == "PASS" and got[("BEYOND-QUANT-MARGIN", "q8")] == "FAIL"
    assert got[("BEYOND-QUANT-WEIGHTS", "q8-f32")] != "PASS"
    assert ("BEYOND-QUANT-KERNEL", "q8-f32") not in got


H200 = {
    "cpu": "Test CPU",
    "cpu_count": 16,
    "gpus": [{"name": "NVIDIA H200", "driver": "580"}],
    "os": "Linux-test",
    "python": "3.12",
    "machine_id_sha256": "m1",
    "gpu_uuid_sha256": ["g1"],
}


@pytest.mark.parametrize("host", [H200, {**H200, "gpu_uuid_sha256": ["g2"]}, {**H200, "machine_id_sha256": None}])
def test_a_twin_on_another_machine_is_no_reference(tmp_path, host):
    """A configuration is held against a reference only where both ran on the same recorded machine (the
    CPU twin of an H200 level, or one on another GPU or machine-id, is none; a digest one side lacks is not the
    same)."""
    configuration(tmp_path, "q8", "derived:r/Q8_0", "Q8_0", d=0.1, manifest={"host": H200})
    configuration(
        tmp_path, "q8-f32", "derived:r/Q8_0-as-F32", "F32", d=0.001, manifest=None if host is H200 else {"host": host}
    )
    tables, _, _ = qm.analyse(find_runs(tmp_path))
    assert tables["quant_mechanism_pairs.csv"].empty
    configuration(tmp_path / "same", "q8", "derived:r/Q8_0", "Q8_0", d=0.1, manifest={"host": H200})
    configuration(tmp_path / "same", "q8-f32", "derived:r/Q8_0-as-F32", "F32", d=0.001, manifest={"host": H200})
    tables, _, _ = qm.analyse(find_runs(tmp_path / "same"))
    assert tables["quant_mechanism_pairs.csv"]["reference"].tolist() == ["q8-f32"]


def test_when_only_the_margins_differ_the_margin_explanation_holds(tmp_path):
    """The level has more narrow margins and no larger perturbations (the reference's are a little larger): H-margin
    holds (no excess of flips at equal margins), H-kernel does not."""
    narrow = [2.0] * 5 + [0.05] * 5
    configuration(tmp_path, "q4", "derived:r/Q4_K_M", "Q4_K_M", d=0.1, margins=narrow, plan="main")
    configuration(tmp_path, "f16", "derived:r/F16", "F16", d=0.12, plan="main")
    tables, verdicts, _ = qm.analyse(find_runs(tmp_path))
    (row,) = tables["quant_mechanism_pairs.csv"].to_dict("records")
    assert (row["config"], row["reference"], row["reference_kind"]) == ("q4", "f16", "the series' F16 level")
    by_id = {v.id: v for v in verdicts}
    assert by_id["BEYOND-QUANT-MARGIN"].status == "PASS", by_id["BEYOND-QUANT-MARGIN"].observed
    assert by_id["BEYOND-QUANT-KERNEL"].status == "FAIL"


def test_another_models_f16_under_the_same_display_name_is_no_reference(tmp_path):
    """The series' F16 reference is found by the weights' lineage (artifact.models.lineage), never the display name:
    Qwen's requantized F16 carrying the agent level's name and family is no reference for it; the agent's own F16
    under another name is."""
    narrow = [2.0] * 5 + [0.05] * 5
    configuration(tmp_path, "q4", "derived:r/Q4_K_M", "Q4_K_M", d=0.1, margins=narrow, plan="main")
    other = {**series_model(MODEL, "F16", "qwen2.5-coder-0.5b-requant"), "name": "TestLM agent"}
    off, on, off_lp, on_lp = arm_records(0.12)
    write_bfcl_run(tmp_path, "off", 1, off, config="f16", plan="main", model=other, logprobs=off_lp)
    write_bfcl_run(tmp_path, "on", 1, on, config="f16", plan="main", model=other, logprobs=on_lp)
    tables, verdicts, _ = qm.analyse(find_runs(tmp_path))
    assert tables["quant_mechanism_pairs.csv"].empty and verdicts == []
    configuration(tmp_path, "agent-f16", "derived:r/F16", "F16", d=0.12, plan="main")
    m = tmp_path / "agent-f16" / "main" / "off-run1" / "manifest.json"
    assert json.loads(m.read_text())["model"]["name"] == "TestLM agent"
    for run in find_runs(tmp_path / "agent-f16"):  # its own F16, named otherwise: the reference all the same
        (run.path / "manifest.json").write_text(
            json.dumps({**run.manifest, "model": {**run.manifest["model"], "name": "Another name"}})
        )
    tables, _, _ = qm.analyse(find_runs(tmp_path))
    assert tables["quant_mechanism_pairs.csv"]["reference"].tolist() == ["agent-f16"]


def test_a_configuration_without_a_reference_is_summarised_not_judged(tmp_path):
    configuration(tmp_path, "lone", "derived:r/Q8_0", "Q8_0", d=0.1)
    tables, verdicts, _ = qm.analyse(find_runs(tmp_path))
    assert verdicts == [] and tables["quant_mechanism_pairs.csv"].empty
    (s,) = tables["quant_mechanism.csv"].to_dict("records")
    assert s["positions"] == N_EP * 10 and s["flips"] == N_EP


def test_check_writes_the_mechanism_tables_and_figure(tmp_path):
    root = tmp_path / "results"
    configuration(root, "lvl", "derived:r/Q8_0", "Q8_0", d=0.1)
    configuration(root, "lvl-f32", "derived:r/Q8_0-as-F32", "F32", d=0.001)
    out = tmp_path / "check"
    out.mkdir()
    b = write_beyond(find_runs(root), out)
    assert {"quant_mechanism.csv", "quant_mechanism_pairs.csv", "quant_mechanism.png"} <= set(b.files)
    ctx = b.report_context(lambda p: "data:")
    assert ctx["quant_pairs"][0]["reference"] == "lvl-f32"
    assert {v["id"] for v in b.as_dict()["verdicts"]} >= {"BEYOND-QUANT-KERNEL", "BEYOND-QUANT-MARGIN"}


def test_the_committed_cpu_kernel_experiment_rechecks_as_documented(tmp_path):
    """evidence/cpu-kernels (docs/beyond-the-paper.md): the quantized kernels perturb more than the same weights through F32
    kernels; the same F32 kernels with Q8_0's weights do not perturb more than with F16's."""
    import csv

    from artifact.cli import main
    from artifact.config import REPO

    assert main(["check", str(REPO / "evidence" / "cpu-kernels"), "--out", str(tmp_path)]) == 3  # no paper claim
    rows = list(csv.DictReader((tmp_path / "beyond_verdicts.csv").open()))
    got = {(r["id"], r["scope"].split(" vs ")[0]): r["status"] for r in rows if r["id"].startswith("BEYOND-QUANT")}
    assert got[("BEYOND-QUANT-KERNEL", "cpu-agent-q8_0")] == "PASS"
    assert got[("BEYOND-QUANT-KERNEL", "cpu-agent-q4_k_m")] == "PASS"
    assert got[("BEYOND-QUANT-KERNEL", "cpu-agent-f16")] == "FAIL"
    assert got[("BEYOND-QUANT-WEIGHTS", "cpu-agent-q8_0-as-f32")] == "FAIL"
