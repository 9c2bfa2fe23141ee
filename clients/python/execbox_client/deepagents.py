"""A deepagents sandbox backend over an execbox session.

    from execbox_client import Client
    from execbox_client.deepagents import ExecboxSandbox

    backend = ExecboxSandbox.open(Client(url, api_key))
    try:
        print(backend.execute("echo hello").output)
    finally:
        backend.delete()

One session holds the sandbox: its files persist between calls, as deepagents expects. A shell
command runs through the session's Python kernel (subprocess, /bin/sh); uploads and downloads
are calls too (downloads come back as the call's artifacts, so large files are not squeezed
through stdout). deepagents builds read, write, edit, ls, grep and glob on these three.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse
from deepagents.backends.sandbox import BaseSandbox

from execbox_client import Client, ExecutionPublic

DEFAULT_TIMEOUT_S = 60
INLINE_OUTPUT_BYTES = 512 << 10
_RUN = """
import json as _j, os as _o, subprocess as _s, sys as _y
import execbox as _e
_a = _j.loads({args!r})
try:
    _p = _s.run(_a["command"], shell=True, stdout=_s.PIPE, stderr=_s.STDOUT, timeout=_a["timeout"],
                cwd=_o.environ.get("HOME", "/tmp"))
    _out, _code = _p.stdout, _p.returncode
except _s.TimeoutExpired as _t:
    _out, _code = (_t.output or b"") + b"\\n[command timed out]\\n", 124
_y.stdout.buffer.write(_out[: _a["inline"]])
_y.stdout.flush()
_e.emit("exit_code", _code)
_e.emit("truncated", len(_out) > _a["inline"])
"""
_UPLOAD = """
import errno as _n, json as _j, os as _o, shutil as _h
import execbox as _e
_errors = {{_n.ENOENT: "file_not_found", _n.EACCES: "permission_denied", _n.EPERM: "permission_denied",
           _n.EISDIR: "is_directory", _n.ENOTDIR: "invalid_path"}}
_done = []
for _i, _path in enumerate(_j.loads({args!r})):
    _staged = _o.path.join("/workspace", ".upload", str(_i))
    try:
        if not _path.startswith("/"):
            raise ValueError
        _o.makedirs(_o.path.dirname(_path) or "/", exist_ok=True)
        _h.copyfile(_staged, _path)
        _done.append(None)
    except ValueError:
        _done.append("invalid_path")
    except OSError as _x:
        _done.append(_errors.get(_x.errno, str(_x)))
    finally:
        _o.unlink(_staged)
_e.emit("errors", _done)
"""
_DOWNLOAD = """
import errno as _n, json as _j, os as _o, shutil as _h
import execbox as _e
_errors = {{_n.ENOENT: "file_not_found", _n.EACCES: "permission_denied", _n.EPERM: "permission_denied",
           _n.EISDIR: "is_directory", _n.ENOTDIR: "file_not_found"}}
_done = []
for _i, _path in enumerate(_j.loads({args!r})):
    try:
        if not _path.startswith("/"):
            raise ValueError
        if _o.path.isdir(_path):
            raise IsADirectoryError(_n.EISDIR, _path)
        _h.copyfile(_path, _o.path.join(_e.output_dir, "download-%d" % _i))
        _done.append(None)
    except ValueError:
        _done.append("invalid_path")
    except OSError as _x:
        _done.append(_errors.get(_x.errno, str(_x)))
_e.emit("errors", _done)
"""


class ExecboxSandbox(BaseSandbox):
    def __init__(self, client: Client, session_id: str, default_timeout_s: int = DEFAULT_TIMEOUT_S) -> None:
        self._client = client
        self._session = session_id
        self._timeout = default_timeout_s

    @classmethod
    def open(cls, client: Client, **session: Any) -> ExecboxSandbox:
        """A new session for the backend (limits as in POST /v1/sessions)."""
        # Room for what agents move through files: 50 MiB each way, a kernel of 1 GiB.
        session.setdefault("policy", {"timeout_s": 120, "cpu_time_s": 240, "disk_mb": 512, "pids": 256,
                                      "memory_mb": 1024, "input_file_bytes": 50 << 20, "input_total_bytes": 100 << 20,
                                      "artifact_file_bytes": 50 << 20, "artifact_total_bytes": 100 << 20})  # fmt: skip
        session.setdefault("idle_timeout_s", 1800)
        return cls(client, client.create_session("python", **session)["id"])

    @property
    def id(self) -> str:
        return self._session

    def delete(self) -> None:
        self._client.delete_session(self._session)

    def _call(self, code: str, timeout_s: int, files: list[dict[str, str]] | None = None) -> ExecutionPublic:
        execution = self._client.run(code, session=self._session, wait_s=timeout_s + 60,
                                     policy={"timeout_s": timeout_s + 10}, files=files or [])  # fmt: skip
        if execution["status"] != "succeeded":
            error = execution.get("error")
            message = error["message"] if error else None
            raise RuntimeError(f"execbox call {execution['id']} {execution['status']}: {message}")
        return execution

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        timeout_s = timeout or self._timeout
        args = json.dumps({"command": command, "timeout": timeout_s, "inline": INLINE_OUTPUT_BYTES})
        execution = self._call(_RUN.format(args=args), timeout_s)
        output = execution["stdout"]
        if execution["stdout_encoding"] == "base64":
            output = base64.b64decode(output).decode("utf-8", "replace")
        outputs = execution["outputs"]
        return ExecuteResponse(output=output, exit_code=outputs.get("exit_code"),
                               truncated=bool(outputs.get("truncated")) or execution["stdout_truncated"])  # fmt: skip

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        # The bytes travel as the call's input files (staged under .upload/), not inside its code.
        staged = [{"path": f".upload/{i}", "content_b64": base64.b64encode(data).decode()}
                  for i, (_, data) in enumerate(files)]  # fmt: skip
        code = _UPLOAD.format(args=json.dumps([path for path, _ in files]))
        execution = self._call(code, self._timeout, staged)
        return [FileUploadResponse(path=path, error=error)
                for (path, _), error in zip(files, execution["outputs"]["errors"], strict=True)]  # fmt: skip

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        execution = self._call(_DOWNLOAD.format(args=json.dumps(paths)), self._timeout)
        artifacts = {a["name"]: a["url"] for a in execution["artifacts"]}
        responses = []
        for i, (path, error) in enumerate(zip(paths, execution["outputs"]["errors"], strict=True)):
            url = artifacts.get(f"download-{i}")
            if error is None and url is None:
                error = "the file was not returned (artifact caps); see the execution's artifacts_not_kept"
            content = self._client.download(url) if error is None and url is not None else None
            responses.append(FileDownloadResponse(path=path, content=content, error=error))
        return responses
