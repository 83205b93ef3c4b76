"""The Hugging Face Hub's HTTP API as huggingface_hub calls it to list a repo's files and download some (repo
info, tree, resolve), served on 127.0.0.1 from files in memory; it records each request, so that a test
sees what was listed and what was downloaded, in order, with no network."""

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "c" * 40
_JSON = {"Content-Type": "application/json"}


class FakeHub:
    """One repo, `repo`, whose files are `files` (path -> content). `url`: its HF_ENDPOINT."""

    def __init__(self, repo: str, files: dict[str, bytes]) -> None:
        self.repo, self.files = repo, files
        self.requests: list[tuple[str, str]] = []  # (method, path)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(with_body=False)

            def do_GET(self) -> None:
                self._answer(with_body=True)

            def _answer(self, with_body: bool) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append((self.command, path))
                status, headers, body = hub.answer(path)
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value)
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str) -> tuple[int, dict[str, str], bytes]:
        api = f"/api/models/{self.repo}/"
        if path.startswith(api + "revision/"):
            return 200, _JSON, json.dumps({"id": self.repo, "sha": COMMIT}).encode()
        if path.startswith(api + "tree/"):
            tree = [
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for name, data in self.files.items()
            ]
            return 200, _JSON, json.dumps(tree).encode()
        resolve = f"/{self.repo}/resolve/"
        name = path[len(resolve) :].partition("/")[2] if path.startswith(resolve) else None
        if name in self.files:
            etag = f'"{hashlib.sha1(self.files[name]).hexdigest()}"'
            return 200, {"X-Repo-Commit": COMMIT, "ETag": etag}, self.files[name]
        return 404, {"X-Error-Code": "EntryNotFound"}, b"{}"

    def downloads(self) -> list[str]:
        """The files fetched (GET of their content), in order."""
        resolve = f"/{self.repo}/resolve/{COMMIT}/"
        return [
            path[len(resolve) :]
            for method, path in self.requests
            if method == "GET" and path.startswith(resolve)
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
