import re

import pytest

from artifact.catalog import load_config, load_plan, load_plans
from artifact.config import CONFIG_DIR, PLANS_FILE, read_toml
from artifact.errors import ArtifactError

DEMO = "demo-smollm2-agent-cpu"


def test_demo_config_loads_with_pinned_model():
    cfg = load_config(DEMO)
    assert cfg.engine.kind == "llama.cpp"
    assert cfg.model.sha256 == "a2de4d0f8d38aaa2a6481dbc73f2c0b3665bcb739d7f05c4481076fe0709388c"
    assert cfg.model.source == "derived:smollm2-135m-bfcl-agent/Q4_K_M"
    assert cfg.chat.handler == "qwen"
    assert cfg.workload.settings["prompt_variant"] == "python"


def test_plans_follow_the_paper():
    plans = load_plans()
    main = plans["main"]
    assert (main.arms, main.runs, main.lifecycle) == (("off", "on"), 2, "shared")
    assert main.engine_settings["llama_cpp"]["cache_ram_mib"] == 8192
    assert plans["cram0"].engine_settings["llama_cpp"]["cache_ram_mib"] == 0
    assert plans["fresh"].lifecycle == "fresh"
    with pytest.raises(ArtifactError, match="unknown plan 'nope'"):
        load_plan("nope")


def _write(tmp_path, text):
    base = load_config(DEMO).path and open(load_config(DEMO).path).read()
    p = tmp_path / "c.toml"
    p.write_text(text(base))
    return p


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.replace("ctx_size = 8192", "ctx_size = 8192\nctx = 1"), "unknown key 'server.ctx'"),
        (lambda s: s.replace('quant = "Q4_K_M"\n', ""), "missing key 'model.quant'"),
        (lambda s: s.replace("ctx_size = 8192", 'ctx_size = "big"'), "server.ctx_size: expected int"),
        (
            lambda s: s.replace('flash_attn = "on"', 'flash_attn = "auto"'),
            "engine.settings.flash_attn = 'auto' is not one of",
        ),
        (
            lambda s: s.replace("ubatch_size = 512", "ubatch_size = 512\nmicro = 1"),
            "unknown key 'engine.settings.micro'",
        ),
        (
            lambda s: s.replace("ubatch_size = 512", "ubatch_size = 4096"),
            "ubatch_size must not exceed server.batch_size",
        ),
        (lambda s: s.replace('kind = "llama.cpp"', 'kind = "sglang"'), "engine.kind = 'sglang' is not implemented"),
        (lambda s: s.replace("episodes = 2 ", "episodes = true "), "workload.episodes: expected int, got bool"),
        (lambda s: s.replace("a2de4d", "zzzzzz"), "sha256 must be 64 lower-case hex"),
        (lambda s: s + "\nsurprise = 1\n", "unknown key"),
        (lambda s: s.replace("[model]", "[model\n"), "not valid TOML"),
        # the configuration's name is its results directory: never outside --results, nor its root
        *(
            (
                lambda s, bad=bad: re.sub(r'^name = ".*"$', f"name = {bad!r}", s, count=1, flags=re.M),
                f"name {bad!r} must be letters",
            )
            for bad in ("../outside", "/abs", "a/b", "", ".", "..", "-x", "a b")
        ),
    ],
)
def test_bad_config_gives_one_line_error_naming_file_and_key(tmp_path, edit, message):
    path = _write(tmp_path, edit)
    with pytest.raises(ArtifactError) as exc:
        load_config(str(path))
    text = str(exc.value)
    assert message in text and str(path) in text and "\n" not in text


def test_unknown_config_name_lists_known_ones():
    with pytest.raises(ArtifactError, match="known: .*demo-smollm2-agent-cpu"):
        load_config("no-such-config")


# The TOML files under configs/ that are lists, not configurations: the plans, the renamed files, the demo's (configuration, plan)
# entries, and the run matrices of `./run.sh all` (configs/paper/all.toml, configs/ci/*.toml: [[run]] tables only).
LISTS = (PLANS_FILE, CONFIG_DIR / "demo.toml", CONFIG_DIR / "renamed.toml")


def configurations():
    return [p for p in sorted(CONFIG_DIR.rglob("*.toml")) if p not in LISTS and set(read_toml(p)) != {"run"}]


def test_every_configuration_is_named_after_its_file():
    """One name per configuration: its `name` (its results directory, RESULTS/NAME/PLAN, and the `config` of every
    manifest it writes) is its file's stem, in whichever folder of configs/ the file lies: configs/h200/NAME.toml,
    configs/NAME.toml. Committed evidence records the names, so a file is renamed to its name, never the reverse. The
    lists above are exempt (they name no configuration of their own); no two configurations share a name."""
    paths = configurations()
    assert len(paths) > 40 and CONFIG_DIR / f"{DEMO}.toml" in paths
    names = {p: load_config(str(p)).name for p in paths}
    wrong = [f"{p.relative_to(CONFIG_DIR)}: name = {n!r}" for p, n in names.items() if n != p.stem]
    assert not wrong, "configurations not named after their files:\n  " + "\n  ".join(wrong)
    stems = [p.stem for p in paths]
    assert len(set(stems)) == len(stems), sorted(s for s in stems if stems.count(s) > 1)
