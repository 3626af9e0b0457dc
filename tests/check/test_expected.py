"""expected/paper.toml: transcribed values, unreported markers, and the loader's schema checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from artifact.check.expected import load_document, load_expected
from artifact.errors import ArtifactError

SEED = Path(__file__).resolve().parents[2] / "expected" / "paper-summary.md"  # the summary the values quote


@pytest.fixture(scope="module")
def expected():
    return load_expected()


@pytest.mark.parametrize(
    "key, value",
    [
        ("on_vs_off_qwen2.5-7b_F16", 0.362),
        ("on_vs_off_qwen2.5-7b_Q4_K_M", 0.750),
        ("on_vs_off_llama-3.1-8b_Q8_0", 0.550),
        ("on_vs_off_llama-3.1-8b_Q4_K_M", 0.700),
        ("on_vs_off_llama-3.1-8b_Q3_K_M", 0.688),
        ("on_vs_off_divergence_min", 0.362),
        ("on_vs_off_divergence_max", 0.912),
        ("on_rerun_divergence_min", 0.088),
        ("on_rerun_divergence_max", 0.775),
        ("on_rerun_vllm_16bit", 0.088),
        ("on_rerun_vllm_16bit_other_session", 0.275),
        ("on_vs_off_vllm_16bit", 0.625),
        ("on_rerun_llama.cpp_16bit", 0.200),
        ("fig1_off_rerun", 0.0),
        ("fig1_on_rerun_cram0", 0.012),
        ("fig1_on_rerun_default", 0.388),
        ("fig1_on_vs_off_within_run", 0.812),
        ("trend_z_qwen2.5-7b", 5.68),
        ("trend_p_qwen2.5-7b", 1.3e-8),
        ("gsm8k_cold_vs_warm_F16", 0.035),
        ("gsm8k_cold_vs_warm_Q8_0", 0.445),
        ("gsm8k_cold_vs_warm_Q4_K_M", 0.415),
        ("gsm8k_cold_vs_warm_Q3_K_M", 0.480),
        ("gsm8k_flips", 20),
        ("gsm8k_flips_favor_cache", 13),
        ("gsm8k_flips_favor_recompute", 7),
        ("gsm8k_mcnemar_p", 0.26),
        ("gsm8k_mcnemar_power_1pp", 0.81),
        ("gsm8k_discordant_rate", 0.0154),
        ("vllm_cache_hit_rate_start", 0.871),
        ("vllm_cache_hit_rate_end", 0.991),
        ("vllm_cache_hit_observations", 226),
        ("bfcl_success_min", 0.012),
        ("bfcl_success_max", 0.188),
        ("gsm8k_accuracy_min", 0.89),
        ("gsm8k_accuracy_max", 0.93),
        ("first_diverging_token_median_min", 3.5),
        ("first_diverging_token_median_max", 17),
    ],
)
def test_transcribed_values(expected, key, value):
    assert expected[key]["reported"] is True
    assert expected[key]["value"] == pytest.approx(value)


def test_counts(expected):
    off = expected["off_rerun_divergence_all"]
    assert (off["k"], off["n"], off["value"]) == (0, 800, 0.0)
    cram0 = expected["fig1_on_rerun_cram0"]
    assert (cram0["k"], cram0["n"]) == (1, 80)  # "agreement on 79/80 episodes"
    for key in ("gsm8k_cold_internal_agreement", "gsm8k_warm_internal_agreement"):
        assert (expected[key]["k"], expected[key]["n"]) == (200, 200)
    assert expected["gsm8k_strict_scorer_flip_inflation"]["approximate"] is True


def test_unreported_values_are_marked(expected):
    for key in ("on_vs_off_qwen2.5-7b_Q8_0", "on_vs_off_qwen2.5-7b_Q3_K_M", "on_vs_off_qwen2.5-14b_Q4_K_M"):
        assert expected[key]["reported"] is False
        assert "value" not in expected[key]


def test_meta_and_configs():
    doc = load_document()
    meta = doc["meta"]
    assert meta["episodes"] == 80 and meta["seed"] == 42 and meta["vllm"] == "0.11.0"
    assert meta["llama_cpp_commit"].startswith("7e4c0a9") and meta["llama_cpp_build"] == "b10434"
    engines = [c["engine"] for c in doc["config"]]
    assert len(engines) == 10 and engines.count("llama.cpp") == 8 and engines.count("vLLM") == 2
    ids = {c["id"] for c in doc["config"]}
    assert "qwen2.5-7b/llama.cpp/F16" in ids and "qwen2.5-14b/llama.cpp/Q4_K_M" in ids


def test_quotes_and_numbers_come_from_the_summary(expected):
    # Every quote fragment is verbatim in the summary, and every reported rate appears in its quote.
    seed = SEED.read_text(encoding="utf-8")
    for key, entry in expected.items():
        for fragment in entry["quote"].split(" ... "):
            assert fragment in seed, f"{key}: quote not found in the paper summary: {fragment!r}"
        if entry["reported"] and entry["unit"] == "fraction":
            v = 100 * entry["value"]
            shown = {f"{v:.1f}", f"{v:g}"}
            if "k" in entry:
                shown |= {f"{entry['k']}/{entry['n']}", f"{entry['n'] - entry['k']}/{entry['n']}"}
            assert any(s in entry["quote"] for s in shown), f"{key}: {shown} not in quote"


# --- schema errors -----------------------------------------------------------


def _minimal(extra_value: str = "", extra_meta: str = "") -> str:
    fields = {**load_document()["meta"], "configurations": 1}
    meta = "\n".join(f"{k} = {json.dumps(v)}" for k, v in fields.items())  # JSON str/int is valid TOML
    return f"""[meta]
{meta}
{extra_meta}
[[config]]
id = "m/llama.cpp/F16"
engine = "llama.cpp"
quant = "F16"
engine_stated = true

[[value]]
key = "x"
value = 0.5
unit = "fraction"
source = "Tab. 2"
quote = "50%"
{extra_value}
"""


def _write(tmp_path, text):
    path = tmp_path / "paper.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_minimal_file_loads(tmp_path):
    got = load_expected(_write(tmp_path, _minimal('config = "m/llama.cpp"')))
    assert got["x"]["value"] == 0.5 and got["x"]["reported"] is True and got["x"]["approximate"] is False


@pytest.mark.parametrize(
    "extra, message",
    [
        ("colour = 'red'", "unknown field 'colour'"),
        ("reported = false", "has a 'value' but reported = false"),
        ('config = "other/engine"', "config 'other/engine'"),
        ('comparison = "sideways"', "unknown comparison"),
        ("k = 3\nn = 2", "0 <= k <= n"),
        ("approximate = 1", "field 'approximate' has the wrong type"),
        ('[[value]]\nkey = "x"\nvalue = 1\nunit = "count"\nsource = "s"\nquote = "q"', "duplicate key"),
        ('[[value]]\nkey = "y"\nunit = "count"\nsource = "s"\nquote = "q"', "missing field 'value'"),
        ('[[value]]\nkey = "z"\nvalue = 1\nunit = "count"\nsource = "s"', "missing field 'quote'"),
    ],
)
def test_schema_errors_name_file_and_key(tmp_path, extra, message):
    path = _write(tmp_path, _minimal(extra))
    with pytest.raises(ArtifactError) as err:
        load_expected(path)
    text = str(err.value)
    assert message in text and str(path) in text and "\n" not in text


def test_unknown_meta_field_and_bad_toml(tmp_path):
    with pytest.raises(ArtifactError, match=r"\[meta\]: unknown field 'gpu_count'"):
        load_expected(_write(tmp_path, _minimal(extra_meta="gpu_count = 1\n")))
    with pytest.raises(ArtifactError, match="invalid TOML"):
        load_expected(_write(tmp_path, "[meta\n"))
    with pytest.raises(ArtifactError, match="cannot read"):
        load_expected(tmp_path / "missing.toml")
