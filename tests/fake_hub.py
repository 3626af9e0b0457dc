"""A FAKE Hugging Face Hub (the real one is unreachable here): a local HTTP server that answers the two calls
huggingface_hub's `hf_hub_download` makes, HEAD and GET on `/<owner>/<repo>/resolve/<revision>/<file>`, with the
headers the real Hub sends for an LFS file (X-Repo-Commit, X-Linked-Etag = sha256, X-Linked-Size), HTTP ranges for
resumed downloads, and the gated-repo answer (401, X-Error-Code: GatedRepo). Tests that use it say so in their names
(`..._fake_hub`)."""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHub:
    def __init__(self):
        self.files: dict[tuple[str, str, str], bytes] = {}  # (repo, revision, name) -> bytes served
        self.lfs_sha: dict[tuple[str, str, str], str] = {}  # what X-Linked-Etag claims (default: the real sha256)
        self.gated: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, body: bool):
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                m = re.match(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<name>.+)$", self.path)
                if not m:
                    self.send_error(404)
                    return
                repo, rev, name = m["repo"], m["rev"], m["name"]
                if repo in hub.gated:
                    self.send_response(401)
                    self.send_header("X-Error-Code", "GatedRepo")
                    self.send_header("X-Error-Message", f"Access to model {repo} is restricted.")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = hub.files.get((repo, rev, name))
                if data is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                sha = hub.lfs_sha.get((repo, rev, name), hashlib.sha256(data).hexdigest())
                start = 0
                rng = self.headers.get("Range")
                if rng and body:
                    start = int(re.match(r"bytes=(\d+)-", rng)[1])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("X-Repo-Commit", rev)
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("ETag", f'"{sha}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if body:
                    self.wfile.write(data[start:])

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def gets(self, name: str) -> list[str | None]:
        """The Range headers of the GET requests for a file."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + name)]
