"""A small client of the execbox REST API: executions and sessions.

from execbox_client import Client
with Client("http://127.0.0.1:8000", api_key) as box:
    session = box.open_session("python")
    box.run("x = 41", session=session)
    print(box.run("x + 1", session=session)["results"][0]["data"]["text/plain"]["text"])  # 42
    box.close_session(session)
"""

from __future__ import annotations

import time
from typing import Any

import httpx

__all__ = ["Client", "ExecboxError"]


class ExecboxError(Exception):
    """The service refused a request (its problem document is `problem`)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {problem.get('code', '')}: {problem.get('detail', problem)}")
        self.status = status
        self.problem = problem


class Client:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 120.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                problem = response.json()
            except ValueError:
                problem = {"detail": response.text}
            raise ExecboxError(response.status_code, problem)
        return response.json()

    def run(self, code: str, language: str = "python", session: str | None = None, wait_s: float = 60,
            **fields: Any) -> dict[str, Any]:  # fmt: skip
        """Submit code and return the finished execution (polling past the server's longest wait)."""
        body = {"language": language, "code": code, **fields}
        if session is not None:
            body["session"] = session
        execution = self._json(self._http.post(f"/v1/executions?wait={min(wait_s, 60)}", json=body))
        deadline = time.monotonic() + wait_s
        while execution["status"] in ("queued", "running") and time.monotonic() < deadline:
            execution = self._json(self._http.get(f"/v1/executions/{execution['id']}?wait=60"))
        return dict(execution)

    def download(self, url: str) -> bytes:
        response = self._http.get(url)
        if response.status_code >= 400:
            self._json(response)
        return response.content

    def open_session(self, language: str = "python", **fields: Any) -> str:
        return str(self._json(self._http.post("/v1/sessions", json={"language": language, **fields}))["id"])

    def session(self, session_id: str) -> dict[str, Any]:
        return dict(self._json(self._http.get(f"/v1/sessions/{session_id}")))

    def close_session(self, session_id: str) -> dict[str, Any]:
        return dict(self._json(self._http.delete(f"/v1/sessions/{session_id}")))
