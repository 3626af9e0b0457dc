"""Every evidence number the documentation quotes is generated: each evidence folder's summary (summary.json,
summary.md) is remade here from its records and check outputs and must equal the committed one, and every quoted
number in README.md, ARTIFACT.md and docs/ is a link into an evidence folder whose title names the summary's key,
``[69/80](evidence/h200-agent/summary.md "divergence/h200-agent-q4_k_m:main/on_vs_off")`` (inline or as a
reference definition), and must read what that key holds. A change that makes a quoted number untrue fails here.
Numbers about committed files that are not evidence (the agent model's recipe and training record, the weights'
source specs) are held to those files, and every relative link to a file and heading that exist."""

from __future__ import annotations

import json
import re
import sys
import tarfile
from pathlib import Path

import pytest

from artifact import evidence
from artifact.config import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

EVIDENCE = REPO / "evidence"
FOLDERS = sorted(
    p.parent
    for p in EVIDENCE.glob("*/records*.tar.xz")
    if p.name == min(q.name for q in p.parent.glob("records*.tar.xz"))
)
DOCS = [REPO / "README.md", REPO / "ARTIFACT.md", *sorted((REPO / "docs").glob("*.md"))]

# [text](target "key") and [text][ref] ... [ref]: target "key"; a link's text may wrap across lines (not its ref)
INLINE = re.compile(r"\[([^\[\]]+)\]\(([^)\s]+) \"([^\"]+)\"\)")
REF_USE = re.compile(r"\[([^\[\]]+)\]\[([^\]\n]+)\]")
REF_DEF = re.compile(r"^\[([^\]\n]+)\]: (\S+) \"([^\"]+)\"$", re.M)


def evidence_folder(doc: Path, target: str) -> Path | None:
    """The evidence folder a link points into (its summary files or the folder itself), else None."""
    path = (doc.parent / target.split("#")[0]).resolve()
    try:
        rel = path.relative_to(EVIDENCE.resolve())
    except ValueError:
        return None
    return EVIDENCE / rel.parts[0] if rel.parts else None


def links(text: str) -> list[tuple[str, str, str]]:
    """(what the text says, target, key) for every titled link of a document, inline or through a reference."""
    refs = {ref.lower(): (target, key) for ref, target, key in REF_DEF.findall(text)}
    return INLINE.findall(text) + [
        (shown, *refs[ref.lower()]) for shown, ref in REF_USE.findall(text) if ref.lower() in refs
    ]


def quoted(doc: Path, text: str) -> list[tuple[str, Path, str]]:
    """(what the text says, evidence folder, key) for every quoted evidence number of a document."""
    return [
        (shown, folder, key)
        for shown, target, key in links(text)
        if (folder := evidence_folder(doc, target)) is not None
    ]


def value_problem(doc: Path, shown: str, data: dict, name: str, key: str) -> str | None:
    """What is wrong with quoting `shown` for `key` of `data` (a summary or record named `name`), or None."""
    try:
        value = evidence.lookup(data, key)
    except (KeyError, IndexError, ValueError):
        return f"{doc.name}: [{shown}] names {name}'s key {key!r}, which it lacks"
    if " ".join(shown.split()).strip("`* ") != shown_value(value):
        return f"{doc.name}: [{shown}] but {name} {key} is {shown_value(value)!r}"
    return None


def shown_value(value) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def mismatches(doc: Path, text: str) -> list[str]:
    """Each quoted number that its summary does not bear out, with where it is and what the summary says."""
    bad = []
    for shown, folder, key in quoted(doc, text):
        summary_path = folder / evidence.SUMMARY_JSON
        if not summary_path.exists():
            bad.append(f"{doc.name}: [{shown}] quotes {folder.name}, which has no {evidence.SUMMARY_JSON}")
            continue
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        if (why := value_problem(doc, shown, summary, folder.name, key)) is not None:
            bad.append(why)
    return bad


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_each_evidence_summary_is_made_from_its_records(folder):
    for name, text in evidence.outputs(folder).items():
        path = folder / name
        assert path.exists() and path.read_text(encoding="utf-8") == text, (
            f"{path} is not what its records and check outputs give: ./run.sh evidence-summary {folder.name}"
        )


def test_every_quoted_evidence_number_is_what_its_summary_says():
    bad = [m for doc in DOCS if doc.exists() for m in mismatches(doc, doc.read_text(encoding="utf-8"))]
    assert not bad, "\n".join(bad)


def test_the_front_page_quotes_its_results_through_the_summaries():
    readme = REPO / "README.md"
    found = quoted(readme, readme.read_text(encoding="utf-8"))
    assert len(found) >= 6, found  # at least one per claim of the claims table
    assert {key.split("/")[0] for _, _, key in found} >= {"claims"}


def test_a_quoted_number_made_untrue_is_caught():
    """The check above fails on a number changed on purpose, inline or through a reference definition."""
    doc = REPO / "README.md"
    good = (
        '[22](evidence/h200-agent/summary.md "runs") [PASS][r1]\n\n[r1]: evidence/h200-agent/summary.md "claims/RQ1"\n'
    )
    assert mismatches(doc, good) == []
    assert len(mismatches(doc, good.replace("[22]", "[23]"))) == 1
    assert len(mismatches(doc, good.replace("[PASS]", "[FAIL]"))) == 1
    assert len(mismatches(doc, good.replace('"runs"', '"no-such-key"'))) == 1
    # a link whose text wraps across a line is read whole, and held like any other
    assert mismatches(doc, good.replace("[PASS][r1]", "[\nPASS][r1]")) == []
    assert len(mismatches(doc, good.replace("[PASS][r1]", "[PA\nSS][r1]"))) == 1
    wrapped = '[OFF reruns\n0/80](evidence/h200-agent/summary.md "divergence/h200-agent-f16:main/off_rerun")'
    assert len(mismatches(doc, wrapped)) == 1 and mismatches(doc, wrapped.replace("OFF reruns\n", "")) == []


def test_every_evidence_folder_has_a_section_on_the_evidence_page():
    page = (REPO / "docs" / "evidence.md").read_text(encoding="utf-8")
    for folder in FOLDERS:
        assert re.search(rf"^## .*`evidence/{re.escape(folder.name)}/`", page, re.M), folder.name


# written on another branch, merged with this one
PENDING = {REPO / "docs" / "admission.md"}
# any reference definition, with or without a title
REF_TARGET = re.compile(r"^\[[^\]\n]+\]: (\S+)(?: \"[^\"]*\")?$", re.M)


def anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: the heading's text (a link's text only) lower-cased, every
    character but letters, digits, underscores, hyphens and spaces dropped, spaces made hyphens; a repeated heading
    gets -1, -2, ... Headings inside fenced code are none."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?)(?: +#+)? *$", text, re.M):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
        anchor = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(anchor, 0)
        seen[anchor] = n + 1
        found.add(anchor if n == 0 else f"{anchor}-{n}")
    return found


def broken_links(doc: Path, text: str) -> list[str]:
    """Each relative link of a document (inline or a reference definition) whose file does not exist, or whose
    anchor (#...) is not a heading of the page it points to (the same page for a bare #anchor)."""
    bad = []
    targets = re.findall(r"\]\(([^)\s]+)(?: \"[^\"]*\")?\)", text) + REF_TARGET.findall(text)
    for target in targets:
        if re.match(r"[a-z]+:", target):
            continue
        name, _, anchor = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc.resolve()
        if not path.exists():
            if path not in PENDING:
                bad.append(f"{doc.name}: {target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            bad.append(f"{doc.name}: {target} (no such heading in {path.name})")
    return bad


def test_every_relative_link_of_the_docs_points_to_a_file_and_heading_that_exist():
    bad = [b for doc in DOCS for b in broken_links(doc, doc.read_text(encoding="utf-8"))]
    assert not bad, bad


def test_a_broken_link_or_anchor_is_caught():
    doc = REPO / "docs" / "demo.md"
    good = "[a](gpu-hosts.md#vllm-on-a-gpu-host) [b](#runsh-demo) [c][r]\n\n[r]: ../README.md#claims\n"
    assert broken_links(doc, good) == []
    assert len(broken_links(doc, good.replace("#vllm-on-a-gpu-host", "#vllm-on-a-gpu"))) == 1
    assert len(broken_links(doc, good.replace("#runsh-demo", "#demo"))) == 1
    assert len(broken_links(doc, good.replace("gpu-hosts.md", "gpu-host.md"))) == 1
    assert len(broken_links(doc, good.replace("README.md#claims", "README.md#claim"))) == 1


def test_packing_speed_up_is_the_ratio_of_the_summaries():
    """The speed-up of sharing the docs quote is computed from the summaries: the six jobs timed alone
    (evidence/h200-packing, their spans summed) over the six jobs at once (evidence/h200-agent-native, first start to
    last finish), and its range over the three sittings of the six at once (h200-agent, -native, -image), since
    the two sides were never measured in one sitting; and each job's slow-down when sharing (its span at once over
    its span alone), lowest to highest."""

    def summary(name: str) -> dict:
        return json.loads((EVIDENCE / name / evidence.SUMMARY_JSON).read_text(encoding="utf-8"))

    alone, shared = summary("h200-packing"), summary("h200-agent-native")
    assert sorted(shared["jobs"]) == sorted(alone["jobs"]), "every job at once was also timed alone"
    ratio = alone["jobs_elapsed_sum_s"] / shared["elapsed_s"]
    sittings = [summary(n) for n in ("h200-agent", "h200-agent-native", "h200-agent-image")]
    assert all(sorted(s["jobs"]) == sorted(alone["jobs"]) for s in sittings)
    ratios = [alone["jobs_elapsed_sum_s"] / s["elapsed_s"] for s in sittings]
    slow = [shared["jobs"][j]["elapsed_s"] / alone["jobs"][j]["elapsed_s"] for j in alone["jobs"]]
    for doc in (REPO / "docs" / "evidence.md", REPO / "docs" / "gpu-hosts.md"):
        text = " ".join(doc.read_text(encoding="utf-8").split())
        assert f"sharing is {ratio:.1f}x faster" in text, f"{doc.name}: the speed-up is {ratio:.1f}x"
        assert f"from {min(ratios):.2f}x to {max(ratios):.2f}x against the three sittings" in text, doc.name
    text = " ".join((REPO / "docs" / "evidence.md").read_text(encoding="utf-8").split())
    assert f"took {min(slow):.1f}x to {max(slow):.1f}x as long sharing the GPU as alone" in text


def test_vllm_salted_off_and_cut_off_run_are_the_committed_files():
    """What docs/evidence.md says of evidence/h200-vllm beyond its summary: the salted OFF runs against a server
    without prefix caching (salt-vs-off.txt, `./run.sh compare`), and where float16 `bi`'s ON run 2 was cut off."""
    folder = EVIDENCE / "h200-vllm"
    text = (folder / "salt-vs-off.txt").read_text(encoding="utf-8")
    pairs = re.findall(r"diverged episodes: (\d+)/(\d+)", text)
    fields = set(re.findall(r"field '([^']+)' differs", text))
    assert fields == {"engine_extra.cache_salt", "engine_extra.metrics_prefix_cache_queries"}, fields
    assert len({p for p in pairs}) == 1
    doc = " ".join((REPO / "docs" / "evidence.md").read_text(encoding="utf-8").split())
    assert f"{pairs[0][0]} of {pairs[0][1]} episodes diverged in each of the {len(pairs)} pairs" in doc
    with tarfile.open(folder / "logs.tar.gz") as tar:
        log = tar.extractfile("session/fp16-bi.log").read().decode()
    last = re.findall(r"\[on run 2\] (\d+)/(\d+)", log)[-1]
    assert f"cut off at episode {last[0]} of {last[1]}" in doc


# Numbers about committed files that are not evidence (the agent model's recipe and its training record, the
# weights' source specs, the pinned vLLM requirements): each as the docs write it, made from the file it is about.
MODELS = REPO / "artifact" / "models"


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def committed_file_facts() -> dict[Path, list[str]]:
    """Per document, the phrases that quote a committed file's numbers, made from that file."""
    agent = _json(MODELS / "recipes" / "smollm2-135m-bfcl-agent.json")
    data, training, adapter = agent["data"], agent["training"], agent["adapter"]
    lora, opt, versions = training["lora"], training["optimizer"], training["versions"]
    rejected = len(data["oracle_not_valid"])
    assert training["data_sha256"] == data["sha256"] and training["pairs"] == data["pairs"]
    assert lora["dropout"] == 0 and opt["epochs"] == len(training["epochs"]) == 1
    first, last = re.findall(r"multi_turn_base_(\d+)", data["episodes"])[:2]
    lr = f"{opt['lr']:.0e}".replace("e-0", "e-")
    qwen = _json(MODELS / "sources" / "qwen2.5-coder-0.5b-instruct-q4_k_m.json")
    header, parts = qwen["header"], qwen["parts"]
    requant = _json(MODELS / "recipes" / "qwen2.5-coder-0.5b-requant.json")["products"]
    gemma = _json(MODELS / "sources" / "gemma-3-270m-q4_k_m.json")
    paper = tomllib.loads((REPO / "configs" / "paper" / "all.toml").read_text(encoding="utf-8"))["run"]
    hours = [(plan, h) for run in paper for plan, h in run["hours"].items()]
    per = {p: [h for q, h in hours if q == p] for p in ("main", "cram0", "fresh", "bridge")}
    gpu_hours = f"{sum(h for _, h in hours):.1f} GPU-hours"
    vllm_wheels = [
        line
        for line in (REPO / "scripts" / "vllm-device-wheels.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return {
        REPO / "docs" / "agent-model.md": [
            f"`multi_turn_base` episodes {first}-{last} only",
            f"{data['pairs']} (prompt, reply) pairs, sha256 `{data['sha256'][:8]}…`",
            f"accepts {data['oracle_valid']} of the {data['oracle_valid'] + rejected} oracle trajectories; "
            f"the {rejected} it rejects",
            f"on one {training['device'].removeprefix('NVIDIA ')}): LoRA r = {lora['r']}, alpha {lora['alpha']}, "
            "no dropout",
            f"({lora['trainable_parameters']:,} parameters)",
            f"AdamW lr {lr} with warm-up and cosine decay, batch {opt['batch']}, one epoch ({opt['steps']} steps, "
            f"mean loss {training['epochs'][0]['mean_loss']:.3f}, {training['wall_s']:.0f} s), seed {training['seed']}",
            f"torch {_minor(versions['torch'])}, transformers {_minor(versions['transformers'])}, "
            f"peft {_minor(versions['peft'])}",
            f"({adapter['bytes']:,} bytes, sha256 `{adapter['sha256'][:8]}…`)",
        ],
        REPO / "docs" / "qwen.md": [
            f"`{parts[0]['distribution']}` … `part{len(parts)}` {parts[0]['version']}",
            f"The joined file: {qwen['bytes']:,} bytes, sha256 `{qwen['sha256']}`",
            f"GGUF v{header['gguf_version']}, `general.architecture = {header['architecture']}`, "
            f'`general.name = "{header["name"]}"`',
            f"file type {header['file_type']} ({header['file_type_name']}), {header['block_count']} blocks, "
            f"embedding {header['embedding_length']}, context {header['context_length']:,}, "
            f"vocabulary {header['vocab_size']:,}",
            f"({len(qwen['chat_template']):,} characters, sha256 `{header['chat_template_sha256'][:8]}…`",
            *(f"{level} `{sha[:8]}…`" for level, sha in requant.items()),
            f"joined sha256 `{gemma['sha256'][:8]}…`",
        ],
        REPO / "docs" / "gpu-hosts.md": [
            f"{min(per['main'])}-{max(per['main'])} h per `main` job",
            f"{per['cram0'][0]} h `cram0`, {per['fresh'][0]} h `fresh`, {min(per['bridge'])}-{max(per['bridge'])} h per "
            "GSM8K bridge",
            f"{gpu_hours} in all",
        ],
        REPO / "README.md": [f"not run: {gpu_hours} estimated"],
        REPO / "ARTIFACT.md": [f"{gpu_hours} (estimate; not run)"],
        REPO / "docs" / "records.md": [
            f"sha256 `{agent['base']['sha256']}`",
            f"adapter `artifact/models/recipes/{adapter['file']}` sha256 `{adapter['sha256']}`",
            *(f"{level} `{agent['products'][level][:8]}…`" for level in ("F16", "Q8_0", "Q4_K_M", "Q3_K_M")),
            f"Q4_K_M GGUF sha256 `{qwen['sha256']}` ({qwen['bytes']:,} bytes)",
            *(f"{level} `{sha[:8]}…`" for level, sha in requant.items()),
            f"and the {len(vllm_wheels) - 1} requirements a Python with torch 2.11 lacks",
        ],
    }


def test_numbers_about_committed_files_are_what_the_files_say():
    """The training figures of the agent model (its recipe's `training` and `data`), the adapter's size and sha256,
    the Qwen GGUF's size, sha256 and header (its source spec), the requantized series' pins and the count of pinned
    vLLM requirements, as the docs quote them."""
    assert (
        MODELS / "recipes" / _json(MODELS / "recipes" / "smollm2-135m-bfcl-agent.json")["adapter"]["file"]
    ).stat().st_size == _json(MODELS / "recipes" / "smollm2-135m-bfcl-agent.json")["adapter"]["bytes"]
    missing = []
    for doc, phrases in committed_file_facts().items():
        text = " ".join(doc.read_text(encoding="utf-8").split())
        missing += [f"{doc.name}: {p!r}" for p in phrases if p not in text]
    assert not missing, "\n".join(missing)


def _on_run1_rows(folder: Path) -> list[str]:
    """ON run 1's requests of a committed endpoint run, as docs/own-server.md shows them: episode, request, prompt
    tokens, cache_n, session_prefix, cached_before_session."""
    with tarfile.open(folder / "records.tar.xz") as tar:
        member = next(m for m in tar if m.name.endswith("/on-run1/requests.jsonl"))
        lines = tar.extractfile(member).read().decode().splitlines()
    rows = []
    for line in filter(str.strip, lines):
        r = json.loads(line)
        x = r.get("engine_extra") or {}
        rows.append(
            f"{r['episode_id']} {r['request_index']} {r['prompt_tokens']} {r['cache_n']:>4} "
            f"{x['session_prefix']:>4} {x['cached_before_session']}"
        )
    return rows


def test_the_own_server_example_is_the_committed_runs_own_output():
    """docs/own-server.md's run against two servers started by hand (section 7): every output line it shows is a
    line of the committed session logs of evidence/cpu-endpoint (the dry run, the run, the check), and its table of
    ON run 1's requests is what the records say."""
    folder = EVIDENCE / "cpu-endpoint"
    with tarfile.open(folder / "logs.tar.gz") as tar:
        logged = {
            line.rstrip()
            for m in tar
            if m.isfile() and m.name.startswith("session/")
            for line in tar.extractfile(m).read().decode().splitlines()
        }
    section = (REPO / "docs" / "own-server.md").read_text(encoding="utf-8").split("\n## 7.")[1].split("\n## 8.")[0]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    assert len(blocks) == 4
    table = [line for line in blocks[2].splitlines() if line.strip()]
    assert table == _on_run1_rows(folder)
    shown = [
        line.rstrip()
        for b in (blocks[0], blocks[1], blocks[3])
        for line in b.splitlines()
        if line.strip() and not line.startswith(("$ ", "      --"))
    ]
    assert len(shown) > 40 and [line for line in shown if line not in logged] == []


def test_no_reference_is_defined_twice():
    """A reference defined twice reads as its first definition on GitHub: a second one silently quotes another key."""
    for doc in DOCS:
        names = [name.lower() for name in re.findall(r"^\[([^\]\n]+)\]: ", doc.read_text(encoding="utf-8"), re.M)]
        assert sorted({n for n in names if names.count(n) > 1}) == [], doc.name


FIRST_CONTACT = REPO / "bench" / "first-contact.json"  # bench/first_contact.py: a fresh demo's and CI's times


def first_contact_mismatches(doc: Path, text: str) -> list[str]:
    """Each time quoted from bench/first-contact.json (a link to it titled with a key) that it does not hold."""
    measured = json.loads(FIRST_CONTACT.read_text())
    return [
        why
        for shown, target, key in links(text)
        if (doc.parent / target.split("#")[0]).resolve() == FIRST_CONTACT
        and (why := value_problem(doc, shown, measured, FIRST_CONTACT.name, key)) is not None
    ]


def test_first_contact_times_in_the_docs_are_the_measured_ones():
    """README's time column quotes the fresh demo and the re-check of the evidence as bench/first_contact.py recorded
    them, each beside the machine-speed yardstick measured in the same run; a part recorded without a yardstick (an
    older CI run) has no wall time quoted anywhere: a time without the speed of its machine cannot be scaled."""
    docs = [*DOCS, REPO / "bench" / "README.md"]
    bad = [m for doc in docs for m in first_contact_mismatches(doc, doc.read_text(encoding="utf-8"))]
    assert not bad, "\n".join(bad)
    measured = json.loads(FIRST_CONTACT.read_text())
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    keys = {
        key
        for doc in docs
        for _, target, key in links(doc.read_text(encoding="utf-8"))
        if (doc.parent / target.split("#")[0]).resolve() == FIRST_CONTACT
    }
    for part, record in measured.items():
        assert record.get("commit") and record.get("cpu_cores", part == "ci"), f"{part}: commit and machine"
        if record.get("yardstick"):  # on the front page, with its yardstick
            assert any(k.startswith(f"{part}/") and "yardstick" not in k for k in keys), f"README lacks {part}"
            assert f'"{part}/yardstick/compile_s_before"' in readme, f"README quotes {part} without its yardstick"
        else:
            quoted = sorted(k for k in keys if k.startswith(f"{part}/") and not k.endswith("target_min"))
            assert not quoted, f"{part} has no yardstick, yet the docs quote {quoted}"


def test_first_contact_reads_the_demos_own_step_names():
    import importlib.util

    from artifact import cli

    spec = importlib.util.spec_from_file_location("first_contact", REPO / "bench" / "first_contact.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.BUILD_STEP in cli.SETUP_STEPS
    assert (
        module.demo_steps("x\n" + cli.time_table([(module.BUILD_STEP, 300.04), ("check", 1.0)]))[module.BUILD_STEP]
        == 300.0
    )


def test_the_demos_example_output_is_the_recorded_runs_own():
    """docs/demo.md's example of the demo's output: every line is a line the demo printed in the fresh run that
    bench/first-contact.json records (its output, bench/first-contact-demo.txt), not typed by hand."""
    printed = {line.rstrip() for line in (REPO / "bench" / "first-contact-demo.txt").read_text().splitlines()}
    page = (REPO / "docs" / "demo.md").read_text(encoding="utf-8")
    blocks, block = [], None
    for line in page.split("## RQ4 on a CPU")[0].splitlines():  # fenced blocks, each fence on a line of its own
        if line.startswith("```"):
            block = [] if block is None else blocks.append(block)
        elif block is not None:
            block.append(line)
    shown = [line.rstrip() for line in blocks[-1] if line.strip()]
    assert len(shown) > 10 and [line for line in shown if line not in printed] == []


def test_first_contact_reads_the_yardstick_ci_prints():
    """.ci/run prints the yardstick at its start and end; `first_contact.py ci` records both beside the phases, and
    the fixed compile's source is the same at every call (the yardstick is fixed by the script's commit)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("first_contact", REPO / "bench" / "first_contact.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ci = (REPO / ".ci" / "run").read_text()
    assert ci.count("bench/first_contact.py yardstick") == 2
    log = "ci: yardstick compile 1.37 s (x; 2 cores)\nci: ./run.sh test took 100 s\nci: yardstick compile 1.5 s\n"
    assert [float(m.group(1)) for line in log.splitlines() if (m := module.YARD_LINE.match(line))] == [1.37, 1.5]
    assert module.ci_phases(log) == {"run.sh test": 100.0}
    assert module.yardstick_source() == module.yardstick_source() and "int f199(" in module.yardstick_source()
