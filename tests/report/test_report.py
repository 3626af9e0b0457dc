"""report.html: self-contained, verdict table first, model text escaped; checked as text and in headless Chromium."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess

import pytest

from artifact.check.run import run_check
from artifact.report.render import TEMPLATE, environment
from synthetic_runs import OFF, ON1, timings, write_bfcl_run

TITLE = "Prefix caching and serving reproducibility: check report"
PAYLOAD = (
    "<script>document.title='pwned';document.body.insertAdjacentHTML('beforeend','<p id=\"pwned\">x</p>')"
    "</script><img src=x onerror=\"document.title='pwned2'\">"
)


@pytest.fixture
def report(tmp_path):
    """Results whose first diverging request has model text that tries to run a script; returns report.html."""
    texts = {("e0", 1): "Sure! " + PAYLOAD}
    lp = {("e0", 1): [[[6, -0.05], [1, -4.0]], [[7, -0.7], [9, -1.4]], [[9, -0.7], [8, -0.75]]]}
    for k in (1, 2):
        write_bfcl_run(tmp_path, "off", k, OFF, valid={"e1"})
        write_bfcl_run(tmp_path, "on", k, ON1, texts=texts, logprobs=lp, valid={"e1"})
    assert run_check(tmp_path, quiet=True) == 0
    return tmp_path / "check" / "report.html"


def test_report_is_self_contained_and_ordered(report):
    html = report.read_text()
    assert '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:;' in html
    assert "<script" not in html.lower()  # no script of ours, and the model's is escaped
    # every src/href is a data URI or an in-page anchor: nothing is fetched
    refs = re.findall(r'\b(?:src|href)\s*=\s*"([^"]*)"', html)
    assert refs and all(r.startswith(("data:image/png;base64,", "#")) for r in refs)
    assert "<link" not in html and "@import" not in html and "url(" not in html
    order = [
        html.index(f'id="{i}"') for i in ("verdict-table", "tab2", "agent", "fig1", "fig2", "example", "provenance")
    ]  # agent: the BFCL workload's own section
    assert order == sorted(order)
    assert html.count('<tr class="') >= 6 and 'data-claim="RQ1"' in html


def test_model_text_is_escaped(report):
    html = report.read_text()
    assert "&lt;script&gt;document.title=&#39;pwned&#39;" in html
    assert "&lt;img src=x onerror=&#34;document.title=&#39;pwned2&#39;&#34;&gt;" in html
    assert '<p id="pwned">' not in html and "<img src=x" not in html


def test_example_and_provenance_content(report):
    html = report.read_text()
    # e0 diverges at request 1 (1-based 2), token 2: ON generated 9 over 8 (margin 0.05), OFF 8
    assert "first diverging request\n  <strong>2</strong>" in html or "<strong>2</strong> (index 1)" in html
    assert "<mark>[9]</mark>" in html and "<mark>[8]</mark>" in html
    assert '<strong class="margin">0.0500</strong>' in html
    assert "llama-server -m x.gguf --cache-ram 8192" in html and "ab" * 32 in html
    assert "none (CPU only)" in html and "numpy 2.2.6" in html and "b10435-test" in html


def test_autoescape_is_on():
    env = environment()
    assert env.autoescape is True and TEMPLATE.endswith(".j2")  # .j2 would defeat select_autoescape
    assert env.from_string("{{ x }}").render(x="<b>&") == "&lt;b&gt;&amp;"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(tmp_path, *args) -> subprocess.CompletedProcess:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not installed (Debian package 'chromium'; CI installs it with apt-get install chromium)",
)
def test_report_in_a_real_browser(report, tmp_path):
    url = report.resolve().as_uri()
    r = chromium(tmp_path, "--dump-dom", url)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    # the page shows the verdict table with every claim
    assert '<table id="verdict-table">' in dom
    for claim in ("RQ1", "RQ2", "RQ2b", "RQ3", "RQ4", "RQ5"):
        assert f'data-claim="{claim}"' in dom
    # no script ran: the title is ours, no element was injected, the payload is shown as text
    title = re.search(r"<title>(.*?)</title>", dom, re.S).group(1)
    assert title == TITLE and "pwned" not in title
    assert '<p id="pwned">' not in dom and "<script" not in dom.lower()
    assert "&lt;script&gt;document.title='pwned'" in dom
    shot = tmp_path / "report.png"
    r = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2000", url)
    assert r.returncode == 0 and shot.stat().st_size > 10_000  # the page rendered to pixels


def write_bridge_run(root, data: str):
    """A GSM8K bridge run as the bridge runner records it: per item cold1, cold2, warm1, warm2."""
    from artifact.records.store import RunWriter

    d = root / "bridge-cfg" / "bridge" / "bridge-run1"
    items = {
        "i0": ("10", ([1, 2], "Answer: 10"), ([1, 2], "Answer: 10")),  # identical paths, both right
        "i1": ("7", ([3], "Answer: 6"), ([4], "Answer: 7")),  # a flip towards the cache path
        "i2": ("5", ([5], "Answer: 5"), ([6], "Answer: 4")),
    }  # a flip towards recompute
    w = RunWriter(
        d,
        {
            "config": "bridge-cfg",
            "plan": "bridge",
            "arm": "bridge",
            "run": 1,
            "session": "bridge",
            "episodes": list(items),
            "workload": "gsm8k",
            "lifecycle": "shared",
            "engine": "llama.cpp",
            "model": {"name": "TestLM", "quant": "Q8_0"},
            "data": data,
            "items_provenance": {"synthetic": data == "synthetic"},
            "server_cmd": ["llama-server", "-m", "x.gguf"],
        },
    )
    for item, (ref, cold, warm) in items.items():
        for index, (serving, (toks, text)) in enumerate(
            (("cold1", cold), ("cold2", cold), ("warm1", warm), ("warm2", warm))
        ):
            cache_n = 49 if serving.startswith("warm") else 0
            w.request(
                {
                    "episode_id": item,
                    "item_id": item,
                    "serving": serving,
                    "turn": 0,
                    "step": 0,
                    "request_index": index,
                    "prompt_sha256": hashlib.sha256(item.encode()).hexdigest(),
                    "prompt_tokens": 50,
                    "output_tokens": toks,
                    "output_text": text,
                    "top_logprobs": [None] * len(toks),
                    "cache_n": cache_n,
                    "prompt_n": 50 - cache_n,
                    # each item its own prompt, each serving its own server timings (as a real run's)
                    **dict(zip(("prompt_ms", "predicted_ms"), timings(item, serving))),
                    "stop_type": "eos",
                    "error": None,
                    "cache_check": "ok",
                }
            )
        w.episode({"episode_id": item, "item_id": item, "reference": ref, "n_requests": 4})
    w.finish(wall_s=1.0)


@pytest.mark.parametrize("data, status", [("synthetic", "NOT-RUN"), ("gsm8k", "INCONCLUSIVE")])
def test_gsm8k_bridge_in_report_and_rq5(tmp_path, data, status):
    pytest.importorskip("artifact.workloads.gsm8k.table")
    import json

    for k in (1, 2):
        write_bfcl_run(tmp_path, "off", k, OFF)
        write_bfcl_run(tmp_path, "on", k, ON1)
    write_bridge_run(tmp_path, data)
    assert run_check(tmp_path, quiet=True) == 0
    out = tmp_path / "check"
    rq5 = {c["id"]: c for c in json.loads((out / "check.json").read_text())["claims"]}["RQ5"]
    # 3 items: cold 3/3 and warm 3/3 identical; flips 1 to cache, 1 to recompute: McNemar p = 1, but 3 items give
    # no power to see a 1 pp shift (the exact test cannot reject below 6 discordant pairs): INCONCLUSIVE, not PASS
    assert rq5["status"] == status
    if data == "synthetic":
        assert "only synthetic items ran" in rq5["evidence"][0]
    else:
        assert "1 cache / 1 recompute" in rq5["details"][-1]["observed"]
        assert "power 0.00" in rq5["details"][-1]["evidence"][0]
    html = (out / "report.html").read_text()
    assert '<table id="tab3-table">' in html and f"<td>{data}</td>" in html and (out / "tab3.csv").exists()
