"""The `execbox` command: `execbox api`, `execbox worker`, `execbox reap`."""

from __future__ import annotations

import argparse
import json

from execbox.settings import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="execbox", description="Sandboxed code execution for AI agents.")
    sub = parser.add_subparsers(dest="command", required=True)
    api = sub.add_parser("api", help="serve the REST API with uvicorn")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8000)
    worker = sub.add_parser("worker", help="run one worker process")
    worker.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    worker.add_argument("--name", help="worker name (default: host.pid)")
    sub.add_parser("reap", help="run one reaper sweep and print what it did")
    args = parser.parse_args(argv)
    settings = Settings()

    if args.command == "api":
        import uvicorn

        from execbox.api import create_app

        uvicorn.run(create_app(settings), host=args.host, port=args.port, log_config=None, access_log=False)
    elif args.command == "worker":
        from execbox.worker.main import run_worker

        run_worker(settings, burst=args.burst, name=args.name)
    elif args.command == "reap":
        from execbox.worker import reaper
        from execbox.worker.context import WorkerContext

        print(json.dumps(reaper.sweep(WorkerContext.build(settings, name="reaper-cli"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
