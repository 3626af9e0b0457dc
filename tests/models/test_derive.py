"""Derived models: the agent model's recipe (its adapter and every product pinned, configurations agreeing with the
pins), malformed sources and levels refused, products made from the pinned inputs by the engine's own tools."""

import pytest

from artifact.config import CONFIG_DIR

from artifact.catalog import load_config
from artifact.errors import ArtifactError
from artifact.models import derive
from artifact.models.hub import sha256_file

RECIPE = "smollm2-135m-bfcl-agent"
QWEN = "qwen2.5-coder-0.5b-requant"


def test_recipe_pins_the_adapter_and_every_configuration_agrees_with_its_products():
    recipe = derive.load_recipe(RECIPE)
    assert sha256_file(derive.RECIPES / recipe["adapter"]["file"]) == recipe["adapter"]["sha256"]
    assert recipe["data"]["pairs"] == 945 and "80..multi_turn_base_199" in recipe["data"]["episodes"]
    used: dict = {}
    for path in sorted(CONFIG_DIR.rglob("*.toml")):
        if path.name == "plans.toml" or "derived:" not in path.read_text():
            continue
        cfg = load_config(str(path))
        name, level = derive.parse_source(cfg.model.source)
        assert cfg.model.sha256 == derive.load_recipe(name)["products"][level], path
        used[name] = used.get(name, 0) + 1
    assert used[RECIPE] >= 5  # the CPU demo and the four H200 levels
    assert used[QWEN] == 4  # the Qwen series requantized from 4-bit weights: F16, Q8_0, Q4_K_M, Q3_K_M


def test_a_recipe_without_an_adapter_makes_its_series_from_the_base_alone():
    """The Qwen series: F16 is the fetched Q4_K_M dequantized, every other level quantized from that F16; products
    are named after the base's sha256 (no adapter), and every configuration says they are requantized."""
    recipe = derive.load_recipe(QWEN)
    assert "adapter" not in recipe and recipe["base"]["source"].startswith("pypi-parts:")
    assert [name for name, _ in derive._steps_to(recipe, "Q3_K_M")] == ["F16", "Q3_K_M"]
    assert recipe["base"]["sha256"][:12] in derive.product_name(recipe, "Q8_0")
    assert set(recipe["products"]) == {"F16", "Q8_0", "Q4_K_M", "Q3_K_M"}
    assert derive.describe(f"derived:{QWEN}/Q8_0")["adapter"] is None
    for level in recipe["products"]:
        cfg = load_config(f"h200/h200-qwen2.5-coder-0.5b-rq-{level.lower()}")
        assert "requantized from 4-bit weights" in cfg.model.name and cfg.model.quant == level


@pytest.mark.parametrize("source", ["derived:", "derived:x", "derived:x/", "derived:../x/F16", "derived:x/a/b"])
def test_a_malformed_derived_source_is_a_one_line_error(source):
    with pytest.raises(ArtifactError, match="derived:<recipe>/<LEVEL>"):
        derive.parse_source(source)


def test_an_unknown_recipe_or_level_is_refused():
    with pytest.raises(ArtifactError, match="unknown derived model recipe 'nope'"):
        derive.load_recipe("nope")
    with pytest.raises(ArtifactError, match="no pinned level Q2_K"):
        derive.make(derive.load_recipe(RECIPE), "Q2_K")


def test_a_step_may_use_a_level_the_any_level_step_makes():
    """The kernel experiment's products: a level's weights dequantized to F32, made from that level's product."""
    recipe = derive.load_recipe(RECIPE)
    chain = [name for name, _ in derive._steps_to(recipe, "Q8_0-as-F32")]
    assert chain == ["base-F16", "F16", "Q8_0", "Q8_0-as-F32"]
    assert [name for name, _ in derive._steps_to(recipe, "Q4_K_M")] == ["base-F16", "F16", "Q4_K_M"]
    for level in ("F16-as-F32", "Q8_0-as-F32", "Q4_K_M-as-F32"):
        assert level in recipe["products"]


def test_products_are_named_after_their_adapter():
    recipe = derive.load_recipe(RECIPE)
    assert recipe["adapter"]["sha256"][:12] in derive.product_name(recipe, "Q4_K_M")


@pytest.mark.server
def test_derivation_makes_the_pinned_bytes_and_refuses_a_tampered_product(tmp_path, monkeypatch):
    monkeypatch.setenv("ARTIFACT_MODELS", str(tmp_path))
    recipe = derive.load_recipe(RECIPE)
    path, digests = derive.make(recipe, "Q4_K_M")
    assert digests == {k: recipe["products"][k] for k in ("base-F16", "F16", "Q4_K_M")}
    with open(path, "r+b") as fh:  # one flipped byte in the product
        fh.seek(4096)
        b = fh.read(1)
        fh.seek(4096)
        fh.write(bytes([b[0] ^ 1]))
    with pytest.raises(ArtifactError, match="derived smollm2-135m-bfcl-agent Q4_K_M has sha256"):
        derive.make(recipe, "Q4_K_M")
    assert not path.exists() and path.with_name(path.name + ".mismatch").exists()
    assert derive.make(recipe, "Q4_K_M")[0] == path  # made again from the pinned inputs
