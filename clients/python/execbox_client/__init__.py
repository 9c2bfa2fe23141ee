"""The Python client of execbox: every endpoint of its REST API, sync and async.

    from execbox_client import Client
    with Client("http://127.0.0.1:8000", api_key) as box:   # or EXECBOX_URL / EXECBOX_API_KEY
        print(box.run("print(6 * 7)")["stdout"])             # 42
        session = box.create_session("python")["id"]
        box.run("x = 41", session=session)
        print(box.run("x + 1", session=session)["results"][0]["data"]["text/plain"]["text"])  # 42
        box.delete_session(session)

A light install: httpx and httpx-sse, nothing of the server's.
"""

from execbox_client.client import AsyncClient, Client, Event
from execbox_client.errors import (
    Conflict,
    ExecboxError,
    FieldProblem,
    Forbidden,
    InvalidRequest,
    NotFound,
    RateLimited,
    ServerError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from execbox_client.types import (
    ApprovalPublic,
    ExecutionPublic,
    FilePublic,
    Firing,
    Handoff,
    LanguagePublic,
    LanguagesPublic,
    RunPublic,
    RunRecord,
    Schedule,
    ScriptDetail,
    ScriptSummary,
    ScriptVersion,
    SessionList,
    SessionPublic,
    Surprise,
    Validation,
)

__all__ = [
    "AsyncClient", "Client", "Conflict", "Event", "ExecboxError", "FieldProblem", "Forbidden", "InvalidRequest",
    "NotFound", "RateLimited", "ServerError", "TooLarge", "Unauthorized", "Unavailable",
    # what the endpoint methods answer (the rest, nested in these: execbox_client.types)
    "ApprovalPublic", "ExecutionPublic", "FilePublic", "Firing", "Handoff", "LanguagePublic", "LanguagesPublic",
    "RunPublic", "RunRecord", "Schedule", "ScriptDetail", "ScriptSummary", "ScriptVersion", "SessionList",
    "SessionPublic", "Surprise", "Validation",
]  # fmt: skip
__version__ = "0.2.0"
