"""A stand-in for the Hugging Face Hub on 127.0.0.1: the endpoints huggingface_hub 2.4's downloads call,
serving in-memory files, and a log of the requests it answered.

Endpoints (as huggingface_hub's hf_api.py and file_download.py call them):
  GET  /api/{models,datasets}/<repo>/revision/<rev>   repository info: "sha", "siblings" (name, size, blobId)
  HEAD /[datasets/]<repo>/resolve/<rev>/<path>        ETag, X-Repo-Commit and Content-Length of a file
  GET  /[datasets/]<repo>/resolve/<rev>/<path>        the file itself
<rev> is "main" or the commit. Unknown repositories, revisions and files get 404 with the X-Error-Code
huggingface_hub turns into RepositoryNotFoundError, RevisionNotFoundError and EntryNotFoundError. Files are
listed as the hub lists them: in Git LFS with their sha256 ("lfs"), or, those `add` names `plain`, as git
blobs whose "blobId" is the git object id of their bytes.

Faults, by file path (a hostile or broken hub or mirror): `served[path]` is sent as the file's body in place
of its bytes (the listing and HEAD still describe the true file), `listed_size[path]` is the size the listing
gives, `cut_short` files send half their body and close the connection, `redirect_loop` files answer with a
redirect to themselves.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import urllib.parse

COMMIT = "5e4c3b2a1f0e9d8c7b6a5e4c3b2a1f0e9d8c7b6a"
_INFO = re.compile(r"^/api/(models|datasets)/(.+)/revision/([^/]+)$")
_RESOLVE = re.compile(r"^/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class FakeHub:
    """Serves repositories added with `add`; use as a context manager. `url` is its HF_ENDPOINT; `requests`
    lists (method, path) of every request."""

    def __init__(self):
        self.repos: dict[tuple[str, str], dict[str, bytes]] = {}
        self.plain: set[tuple[str, str, str]] = set()  # (repo_type, repo_id, path) not in LFS
        self.served: dict[str, bytes] = {}
        self.listed_size: dict[str, int] = {}
        self.cut_short: set[str] = set()
        self.redirect_loop: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def add(self, repo_type: str, repo_id: str, files: dict[str, bytes], plain: tuple[str, ...] = ()) -> None:
        """Serves `files` ({path: bytes}) as a repository, `plain` ones as git blobs, the others in LFS."""
        self.repos[(repo_type, repo_id)] = dict(files)
        self.plain |= {(repo_type, repo_id, path) for path in plain}

    def sibling(self, repo_type: str, repo_id: str, path: str, data: bytes) -> dict:
        """A file's entry in the repository info, as the hub lists it with files_metadata."""
        size = self.listed_size.get(path, len(data))
        git_blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        if (repo_type, repo_id, path) in self.plain:
            return {"rfilename": path, "size": size, "blobId": git_blob}
        pointer = f"oid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n".encode()
        return {"rfilename": path, "size": len(pointer), "blobId": hashlib.sha1(pointer).hexdigest(),
                "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": size,
                        "pointerSize": len(pointer)}}

    def downloads(self) -> list[str]:
        """Paths of the files sent (GET .../resolve/...)."""
        return [path for method, path in self.requests if method == "GET" and "/resolve/" in path]

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _error(self, code: str) -> None:
                body = json.dumps({"error": code}).encode()
                self.send_response(404)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _files(self, repo_type: str, repo_id: str, revision: str) -> dict[str, bytes] | None:
                """The repository's files, or None after answering 404."""
                if (repo_type, repo_id) not in hub.repos:
                    self._error("RepoNotFound")
                    return None
                if revision not in ("main", COMMIT):
                    self._error("RevisionNotFound")
                    return None
                return hub.repos[(repo_type, repo_id)]

            def _info(self, match: re.Match) -> None:
                repo_type, repo_id = match[1].removesuffix("s"), match[2]
                files = self._files(repo_type, repo_id, urllib.parse.unquote(match[3]))
                if files is None:
                    return
                siblings = [hub.sibling(repo_type, repo_id, path, data)
                            for path, data in sorted(files.items())]
                body = json.dumps({"id": repo_id, "sha": COMMIT, "private": False, "siblings": siblings})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def _resolve(self, match: re.Match, send_body: bool) -> None:
                repo_type = "dataset" if match[1] else "model"
                files = self._files(repo_type, match[2], urllib.parse.unquote(match[3]))
                if files is None:
                    return
                path = urllib.parse.unquote(match[4])
                data = files.get(path)
                if data is None:
                    self._error("EntryNotFound")
                    return
                if path in hub.redirect_loop:
                    self.send_response(302)
                    self.send_header("Location", self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = hub.served.get(path, data) if send_body else data
                self.send_response(200)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body and path in hub.cut_short:
                    self.wfile.write(body[:len(body) // 2])
                    self.close_connection = True
                elif send_body:
                    self.wfile.write(body)

            def _route(self, send_body: bool) -> None:
                path = urllib.parse.urlsplit(self.path).path
                hub.requests.append((self.command, path))
                if send_body and (match := _INFO.match(path)):
                    self._info(match)
                elif match := _RESOLVE.match(path):
                    self._resolve(match, send_body)
                else:
                    self._error("NotFound")

            def do_GET(self) -> None:
                self._route(send_body=True)

            def do_HEAD(self) -> None:
                self._route(send_body=False)

        return Handler
