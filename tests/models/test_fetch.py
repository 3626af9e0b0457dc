"""`./run.sh fetch` against a FAKE Hugging Face Hub (tests/fake_hub.py): the real huggingface_hub client, real
HTTP, real files; only the Hub is local. Hash mismatch, resume, lock file, offline, gated, disk space."""

import hashlib
import os
import subprocess
import sys

import pytest

from artifact.config import REPO

from artifact.catalog import load_config
from artifact.models import verified_weights
from artifact.errors import ArtifactError
from fake_hub import FakeHub

REV = "0123456789abcdef0123456789abcdef01234567"
REPO_ID = "tester/tiny-GGUF"
PART1 = os.urandom(300_000)
PART2 = os.urandom(120_000)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def hub():
    with FakeHub() as h:
        h.files[(REPO_ID, REV, "tiny-00001-of-00002.gguf")] = PART1
        h.files[(REPO_ID, REV, "tiny-00002-of-00002.gguf")] = PART2
        yield h


@pytest.fixture
def env(tmp_path, hub, monkeypatch):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    e.update(
        PYTHONPATH=str(REPO),
        HF_ENDPOINT=hub.url,
        HF_HOME=str(tmp_path / "hf"),
        ARTIFACT_WEIGHTS=str(tmp_path / "weights"),
        ARTIFACT_WEIGHTS_LOCK=str(tmp_path / "lock.json"),
    )
    for k in ("ARTIFACT_WEIGHTS", "ARTIFACT_WEIGHTS_LOCK"):
        monkeypatch.setenv(k, e[k])
    return e


def write_config(tmp_path, files: str, name="tiny") -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(f'''extends = "{REPO / "configs" / "demo-smollm2-agent-cpu.toml"}"
name = "{name}"
[model]
source = "hf:{REPO_ID}"
revision = "{REV}"
sha256 = ""
files = [{files}]
''')
    return str(p)


def pinned(tmp_path, sha1=None):
    return write_config(
        tmp_path,
        f'''
  {{ name = "tiny-00001-of-00002.gguf", size = {len(PART1)}, sha256 = "{sha1 or sha(PART1)}" }},
  {{ name = "tiny-00002-of-00002.gguf", size = {len(PART2)}, sha256 = "{sha(PART2)}" }}''',
    )


def unpinned(tmp_path):
    return write_config(tmp_path, '{ name = "tiny-00001-of-00002.gguf" }, { name = "tiny-00002-of-00002.gguf" }')


def fetch(env, *configs, **extra):
    r = subprocess.run(
        [sys.executable, "-m", "artifact", "fetch", *configs],
        cwd=REPO,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r


def one_line_error(r) -> str:
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    return errors[0]


def test_fetch_downloads_split_parts_verifies_and_is_idempotent_fake_hub(tmp_path, env, hub):
    cfg = pinned(tmp_path)
    r = fetch(env, cfg)
    assert r.returncode == 0, r.stderr
    mdir = tmp_path / "weights" / REPO_ID / REV
    assert (mdir / "tiny-00001-of-00002.gguf").read_bytes() == PART1
    assert (mdir / "tiny-00002-of-00002.gguf").read_bytes() == PART2
    assert verified_weights(load_config(cfg).model) == mdir / "tiny-00001-of-00002.gguf"  # llama-server loads part 1
    hub.requests.clear()
    r = fetch(env, cfg)
    assert r.returncode == 0 and hub.requests == [], (r.stderr, hub.requests)  # present and verified: no Hub call


def test_fetch_resumes_an_interrupted_download_fake_hub(tmp_path, env, hub):
    from huggingface_hub._local_folder import get_local_download_paths

    mdir = tmp_path / "weights" / REPO_ID / REV
    partial = get_local_download_paths(mdir, "tiny-00001-of-00002.gguf").incomplete_path(sha(PART1))
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(PART1[:100_000])  # what an interrupted download leaves behind
    r = fetch(env, pinned(tmp_path))
    assert r.returncode == 0, r.stderr
    assert hub.gets("tiny-00001-of-00002.gguf") == ["bytes=100000-"]  # only the rest was transferred
    assert (mdir / "tiny-00001-of-00002.gguf").read_bytes() == PART1 and not partial.exists()


def test_fetch_refuses_a_file_whose_hash_differs_and_never_uses_it_fake_hub(tmp_path, env, hub):
    cfg = pinned(tmp_path, sha1="f" * 64)
    line = one_line_error(fetch(env, cfg))
    assert "sha256" in line and "moved to" in line
    mdir = tmp_path / "weights" / REPO_ID / REV
    assert not (mdir / "tiny-00001-of-00002.gguf").exists()
    assert (mdir / "tiny-00001-of-00002.gguf.sha256-mismatch").exists()
    with pytest.raises(ArtifactError, match="run ./run.sh fetch"):
        verified_weights(load_config(cfg).model)


def test_first_fetch_records_hashes_in_the_lock_later_ones_verify_fake_hub(tmp_path, env, hub):
    import json

    cfg = unpinned(tmp_path)
    with pytest.raises(ArtifactError, match="no recorded sha256"):
        verified_weights(load_config(cfg).model)
    assert fetch(env, cfg).returncode == 0
    lock = json.loads((tmp_path / "lock.json").read_text())[f"{REPO_ID}@{REV}"]
    assert lock["tiny-00001-of-00002.gguf"]["sha256"] == sha(PART1)
    assert lock["tiny-00002-of-00002.gguf"] | {"recorded": "-"} == {
        "sha256": sha(PART2),
        "size": len(PART2),
        "recorded": "-",
        "hub_lfs_sha256_matched": True,
    }
    model = load_config(cfg).model
    path = verified_weights(model)
    # A file changed on disk after the lock was written is refused, and a new fetch replaces it
    path.write_bytes(b"x" + PART1[1:])
    with pytest.raises(ArtifactError, match="the pin \\(lock\\) says"):
        verified_weights(model)
    assert fetch(env, cfg).returncode == 0 and verified_weights(model) == path
    # The Hub serving other bytes than the lock recorded: refused
    path.unlink()
    hub.files[(REPO_ID, REV, "tiny-00001-of-00002.gguf")] = PART2[:1000] + PART1[1000:]
    assert "the pin (lock) says" in one_line_error(fetch(env, cfg))


def test_first_fetch_checks_the_hubs_lfs_id_before_recording_fake_hub(tmp_path, env, hub):
    hub.lfs_sha[(REPO_ID, REV, "tiny-00002-of-00002.gguf")] = "0" * 64
    assert "the Hub's LFS id" in one_line_error(fetch(env, unpinned(tmp_path)))
    assert not (tmp_path / "lock.json").exists() or "tiny-00002" not in (tmp_path / "lock.json").read_text()


def test_fetch_offline_says_what_to_do_fake_hub(tmp_path, env, hub):
    line = one_line_error(fetch(env, pinned(tmp_path), HF_HUB_OFFLINE="1"))
    assert "cannot reach the Hugging Face Hub" in line and "copy the pinned files into" in line
    line = one_line_error(fetch(env, pinned(tmp_path), HF_ENDPOINT="http://127.0.0.1:9"))  # nothing listens
    assert "cannot reach the Hugging Face Hub" in line


def test_fetch_gated_repo_asks_for_a_token_fake_hub(tmp_path, env, hub):
    hub.gated.add(REPO_ID)
    line = one_line_error(fetch(env, pinned(tmp_path)))
    assert "is gated" in line and "HF_TOKEN" in line


def test_fetch_checks_disk_space_before_downloading_fake_hub(tmp_path, env, hub):
    cfg = write_config(tmp_path, f'{{ name = "tiny-00001-of-00002.gguf", size = {10**16}, sha256 = "{sha(PART1)}" }}')
    line = one_line_error(fetch(env, cfg))
    assert "not enough disk" in line and "ARTIFACT_WEIGHTS" in line
    assert not [r for r in hub.requests if r[0] == "GET"]


@pytest.mark.parametrize(
    "edit, message",
    [
        ('revision = "{REV}"', "model.revision must be the 40-hex-digit commit"),
        ('sha256 = ""', "model.sha256 is for pypi:/path:/derived:/pypi-parts: sources"),
        ("files = [", "model.files[0]: size must be >= 0 and path relative"),
    ],
)
def test_bad_hf_source_is_one_line_error(tmp_path, edit, message):
    text = open(pinned(tmp_path)).read()
    bad = {
        'revision = "{REV}"': ('revision = "' + REV + '"', 'revision = "main"'),
        'sha256 = ""': ('sha256 = ""', 'sha256 = "' + "a" * 64 + '"'),
        "files = [": ('name = "tiny-00001', 'name = "../tiny-00001'),
    }[edit]
    p = tmp_path / "bad.toml"
    p.write_text(text.replace(*bad, 1))
    with pytest.raises(ArtifactError, match=message.replace("[", "\\[").replace(".", "\\.")):
        load_config(str(p))


def test_paper_configurations_pin_every_gguf_file():
    from artifact.orchestrate.matrix import load_jobs

    jobs = load_jobs()
    gguf = {j.cfg.name: j.cfg for j in jobs if j.engine == "llama.cpp" and j.cfg.workload.name != "gsm8k"}
    assert len(gguf) == 8
    for cfg in gguf.values():
        assert cfg.model.source.startswith("hf:") and len(cfg.model.revision) == 40
        assert all(len(f.sha256) == 64 and f.size > 0 for f in cfg.model.files), cfg.name
    assert [f.name for f in gguf["qwen2.5-7b-f16"].model.files][0].endswith("-00001-of-00004.gguf")
