"""Protocol runs eval model output (BFCL): they must see no network and no secrets."""

import json
import subprocess
import sys

import pytest

from artifact import provenance
from artifact.config import REPO

PROBE = """
import json, socket
from artifact import provenance
s = socket.socket(); s.settimeout(3)
try:
    s.connect(("1.1.1.1", 443)); outside = "reached"
except OSError as exc:
    outside = type(exc).__name__
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
print(json.dumps({"interfaces": provenance.network_interfaces(), "outside": outside}))
"""


def test_isolate_script_leaves_only_loopback(monkeypatch):
    monkeypatch.delenv("ARTIFACT_ALLOW_NETWORK", raising=False)
    if subprocess.run(["unshare", "--user", "--map-root-user", "--net", "true"], capture_output=True).returncode:
        pytest.skip("this kernel does not allow unprivileged user namespaces")
    out = subprocess.run([str(REPO / "scripts/isolate.sh"), sys.executable, "-c", PROBE], cwd=REPO,
                         capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"})
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["interfaces"] == ["lo"] and seen["outside"] != "reached"


def test_isolation_record_tells_host_network_apart():
    assert provenance.isolation([])["network"] in ("loopback-only", "host network (not isolated)")


def test_secret_looking_variables_are_scrubbed():
    env = {"HF_TOKEN": "x", "OPENAI_API_KEY": "y", "AWS_SECRET_ACCESS_KEY": "z", "PATH": "/bin", "HOME": "/root"}
    assert provenance.scrub_secrets(env) == ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "OPENAI_API_KEY"]
    assert env == {"PATH": "/bin", "HOME": "/root"}
