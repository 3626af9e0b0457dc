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
    out = subprocess.run(
        [str(REPO / "scripts/isolate.sh"), sys.executable, "-c", PROBE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["interfaces"] == ["lo"] and seen["outside"] != "reached"


def test_isolation_record_tells_host_network_apart():
    assert provenance.isolation([])["network"] in ("loopback-only", "host network (not isolated)")


def test_secret_looking_variables_are_scrubbed():
    env = {"HF_TOKEN": "x", "OPENAI_API_KEY": "y", "AWS_SECRET_ACCESS_KEY": "z", "PATH": "/bin", "HOME": "/root"}
    assert provenance.scrub_secrets(env) == ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "OPENAI_API_KEY"]
    assert env == {"PATH": "/bin", "HOME": "/root"}


RELAYED = """
import json, os, socket, urllib.request
from artifact import provenance
def get(port):
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
    except OSError as exc:
        return type(exc).__name__
print(json.dumps({"named": get(%d), "other": get(%d), "forwarded": provenance.isolation([])["forwarded"],
                  "network": provenance.isolation([])["network"]}))
"""


def test_isolate_script_relays_exactly_the_named_host_loopback_servers(monkeypatch, tmp_path):
    """A server the user started on the host's loopback is reachable inside the isolation only through
    ARTIFACT_FORWARD (the namespace's loopback is its own), and no other port of the host is."""
    import http.server
    import threading

    monkeypatch.delenv("ARTIFACT_ALLOW_NETWORK", raising=False)
    if subprocess.run(["unshare", "--user", "--map-root-user", "--net", "true"], capture_output=True).returncode:
        pytest.skip("this kernel does not allow unprivileged user namespaces")

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello from the host")

        def log_message(self, *args):
            pass

    servers = [http.server.HTTPServer(("127.0.0.1", 0), Hello) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    named, other = (s.server_address[1] for s in servers)
    env = {
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
        "TMPDIR": str(tmp_path),
        "ARTIFACT_FORWARD": f"127.0.0.1:{named}",
    }
    try:
        out = subprocess.run(
            [str(REPO / "scripts/isolate.sh"), sys.executable, "-c", RELAYED % (named, other)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        refused = subprocess.run(
            [str(REPO / "scripts/isolate.sh"), "true"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "ARTIFACT_FORWARD": "192.0.2.1:80"},
        )
    finally:
        for s in servers:
            s.shutdown()
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["named"] == "hello from the host" and seen["other"] == "URLError"
    assert seen["forwarded"] == [f"127.0.0.1:{named}"] and seen["network"] == "loopback-only"
    assert refused.returncode != 0 and "not a loopback host:port" in refused.stderr
    assert not list(tmp_path.iterdir())  # the relay's socket folder is gone
