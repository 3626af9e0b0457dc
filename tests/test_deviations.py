"""docs/deviations.md quotes the settings of the committed evidence as its run manifests record them, and the
settings of the paper's configurations and the demos as their files state them: each phrase below is made from those
files and must be on the page (its summary-quoted numbers are held by tests/test_docs_numbers.py). A change of a
setting that leaves the page behind fails here."""

from __future__ import annotations

import json
import re
import tarfile
from functools import cache
from pathlib import Path

from artifact.config import REPO, tomllib

PAGE = REPO / "docs" / "deviations.md"


@cache
def manifests() -> tuple[tuple[str, dict], ...]:
    """(evidence folder, manifest) of every committed run."""
    out = []
    for archive in sorted((REPO / "evidence").glob("*/records*.tar.xz")):
        with tarfile.open(archive) as tar:
            for member in tar:
                if member.isfile() and member.name.endswith("/manifest.json"):
                    out.append((archive.parent.name, json.loads(tar.extractfile(member).read())))
    return tuple(out)


def _workload(m: dict) -> dict:
    w = (m.get("config_data") or {}).get("workload") or {}
    return {**w, **(w.get("settings") or {})}


def _toml(path: Path) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def one(values) -> object:
    values = set(values)
    assert len(values) == 1, values
    return values.pop()


def phrases() -> list[str]:
    runs = manifests()
    gpu = [(m["host"]["gpus"][0]) for _, m in runs if (m.get("host") or {}).get("gpus")]
    ctx = {}
    for _, m in runs:
        family = ((m.get("config_data") or {}).get("model") or {}).get("family", "")
        ctx.setdefault("qwen" if family.startswith("qwen") else "smollm2", set()).add(
            m["config_data"]["server"]["ctx_size"]
        )
    bfcl = [_workload(m) for _, m in runs if _workload(m).get("name") == "bfcl_multi_turn_base"]
    gpu_bfcl = [
        _workload(m) for f, m in runs if f.startswith("h200") and _workload(m).get("name") == "bfcl_multi_turn_base"
    ]
    bridge = [m for f, m in runs if f.startswith("h200") and m.get("arm") == "bridge"]  # the GPU evidence's bridge
    vllm = [m["vllm"] for _, m in runs if m.get("vllm")]
    cpu_episodes = sorted(
        {
            len(m["episodes"])
            for f, m in runs
            if f.startswith("cpu") and _workload(m).get("name") == "bfcl_multi_turn_base"
        }
    )
    paper = [_toml(p) for p in sorted((REPO / "configs" / "paper").glob("*.toml")) if p.name != "all.toml"]
    demo = _toml(REPO / "configs" / "demo-smollm2-agent-cpu.toml")["workload"]
    demo_gsm8k = _toml(REPO / "configs" / "demo-smollm2-q4_1-cpu-gsm8k.toml")["workload"]
    lock = (REPO / "requirements-vllm.lock").read_text(encoding="utf-8")
    transformers = re.search(r"^transformers==(\S+)$", lock, re.M).group(1)
    nvcc = re.search(r"release [\d.]+, V([\d.]+)", (REPO / "evidence" / "h200-agent" / "nvcc.txt").read_text()).group(1)
    cuda_base = re.search(
        r"^# cuda-toolkit: ([\d.]+)$", (REPO / "docker" / "cuda-base" / "wheels.txt").read_text(), re.M
    )
    pythons = {f.split("-")[0]: set() for f, _ in runs}
    for f, m in runs:
        pythons[f.split("-")[0]].add(m["host"]["python"])
    return [
        f"compute capability {one(g['compute_capability'] for g in gpu)}",
        f"set 8192 for the SmolLM2-based models (their context) and {one(ctx['qwen'])} for Qwen2.5-Coder-0.5B"
        if one(ctx["smollm2"]) == 8192
        else "ctx_size of the SmolLM2-based runs changed",
        f"set {one(c['server']['ctx_size'] for c in paper if 'server' in c)} (BFCL's default prompt",
        f"`func_doc_fmt={one(w['prompt_variant'] for w in bfcl)}` variant",
        f"stop a turn after {one(w['max_steps_per_turn'] for w in gpu_bfcl)} executed steps",
        f"cap a reply at {one(w['n_predict'] for w in gpu_bfcl)} tokens",
        f"the same first {max(w['episodes'] for w in gpu_bfcl)} on the GPU",
        f"the CPU folders: {cpu_episodes[0]} to {cpu_episodes[-1]} episodes",
        f"ran {one(m['items_provenance']['n_items'] for m in bridge)} "
        f"{one(m['items_provenance']['data'] for m in bridge)} items per configuration",
        f"the evidence's synthetic bridge at {one(_workload(m)['n_predict'] for m in bridge)}",
        f"cap a reply at {one(c['workload']['n_predict'] for c in paper if c['workload']['name'] == 'gsm8k')} tokens",
        f"reports vLLM {one(v['vllm'] for v in vllm)}, torch {one(v['torch'] for v in vllm)} and transformers "
        f"{one(v['transformers'] for v in vllm)}",
        f"`requirements-vllm.lock` pins {transformers}",
        f"nvcc {nvcc}",
        f"CUDA {cuda_base.group(1)} bases",
        f"Python {one(pythons['h200'])}",
        f"(Python {one(pythons['cpu'])})",
        f"{demo['episodes']} episodes, their first {demo['max_turns']} turns, step limit {demo['max_steps_per_turn']}, "
        f"{demo['n_predict']} tokens per reply",
        f"runs {demo_gsm8k['episodes']} {demo_gsm8k['gsm8k_source']} items",
    ]


def test_the_settings_the_page_quotes_are_the_records_and_files():
    page = " ".join(PAGE.read_text(encoding="utf-8").split())
    missing = [p for p in phrases() if p not in page]
    assert not missing, "\n".join(missing)


def test_the_build_of_the_evidence_is_one_marked_paragraph():
    """The paragraph to update when the evidence is remade with another build is marked, and is the only one that
    names the evidence's llama.cpp build."""
    text = PAGE.read_text(encoding="utf-8")
    # the link definitions at the end name evidence folders, not builds
    text = "\n".join(line for line in text.splitlines() if not re.match(r"\[[\w-]+\]: ", line))
    paragraphs = text.split("\n\n")
    marked = [i for i, p in enumerate(paragraphs) if "the one paragraph to update" in p]
    assert len(marked) == 1
    builds = {m["engine_build"].split()[0] for _, m in manifests() if m.get("engine") == "llama.cpp"}
    for build in builds:
        tag = build.split("-")[0]
        assert [i for i, p in enumerate(paragraphs) if tag in p] == [marked[0]], tag
