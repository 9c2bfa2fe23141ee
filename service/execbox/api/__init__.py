"""The REST API: create_app(settings) builds the FastAPI application."""

from __future__ import annotations

from fastapi import FastAPI

from execbox import __version__, logs
from execbox.api import problems
from execbox.api.deps import Services
from execbox.api.routes import executions, health, languages
from execbox.languages import Languages
from execbox.policies import PolicySet
from execbox.queue import make_queue
from execbox.settings import Settings
from execbox.store import ExecutionStore, connect

__all__ = ["create_app"]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    logs.configure(settings.log_level, "api")
    client = connect(settings)
    app = FastAPI(
        title="execbox",
        version=__version__,
        description="Sandboxed code execution for AI agents: submit code with a resource policy, get back "
        "output, a categorized error, timings and a trace id.",
    )
    app.state.services = Services(
        settings=settings,
        store=ExecutionStore(client, settings),
        queue=make_queue(client, settings),
        policies=PolicySet.load(settings.policies_dir),
        languages=Languages.load(settings.images_dir),
    )
    problems.install(app, settings.api.max_body_bytes)
    app.include_router(executions.router)
    app.include_router(languages.router)
    app.include_router(health.router)
    return app
