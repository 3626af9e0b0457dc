import pytest

from artifact.config import load_config, load_plan, load_plans
from artifact.errors import ArtifactError

DEMO = "demo-smollm2-cpu"


def test_demo_config_loads_with_pinned_model():
    cfg = load_config(DEMO)
    assert cfg.engine.kind == "llama.cpp"
    assert cfg.model.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert cfg.chat.handler == "qwen"
    assert cfg.workload.prompt_variant == "python"


def test_plans_follow_the_paper():
    plans = load_plans()
    main = plans["main"]
    assert (main.arms, main.runs, main.lifecycle, main.cache_ram_mib) == (("off", "on"), 2, "shared", 8192)
    assert plans["cram0"].cache_ram_mib == 0
    assert plans["fresh"].lifecycle == "fresh"
    with pytest.raises(ArtifactError, match="unknown plan 'nope'"):
        load_plan("nope")


def _write(tmp_path, text):
    base = (load_config(DEMO).path and open(load_config(DEMO).path).read())
    p = tmp_path / "c.toml"
    p.write_text(text(base))
    return p


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace("ctx_size = 8192", "ctx_size = 8192\nctx = 1"), "unknown key 'server.ctx'"),
    (lambda s: s.replace("quant = \"Q4_K_M\"\n", ""), "missing key 'model.quant'"),
    (lambda s: s.replace("ctx_size = 8192", "ctx_size = \"big\""), "server.ctx_size: expected int"),
    (lambda s: s.replace("flash_attn = \"on\"", "flash_attn = \"auto\""), "server.flash_attn = 'auto' is not one of"),
    (lambda s: s.replace("episodes = 2 ", "episodes = true "), "workload.episodes: expected int, got bool"),
    (lambda s: s.replace("b179c9", "zzzzzz"), "sha256 must be 64 lower-case hex"),
    (lambda s: s + "\nsurprise = 1\n", "unknown key"),
    (lambda s: s.replace("[model]", "[model\n"), "not valid TOML"),
])
def test_bad_config_gives_one_line_error_naming_file_and_key(tmp_path, edit, message):
    path = _write(tmp_path, edit)
    with pytest.raises(ArtifactError) as exc:
        load_config(str(path))
    text = str(exc.value)
    assert message in text and str(path) in text and "\n" not in text


def test_unknown_config_name_lists_known_ones():
    with pytest.raises(ArtifactError, match="known: .*demo-smollm2-cpu"):
        load_config("no-such-config")
