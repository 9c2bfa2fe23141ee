"""The `execbox` command: `api`, `worker`, `egress`, `docker-proxy`, `bwrap-helper`, `reap`, `keys`, `secrets`,
`egress-key`, `redis-acl`, `dead-letters`, `nodes`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from execbox.settings import Settings


def _engine_socket() -> str:
    """The engine's unix socket: DOCKER_HOST's when it names one (an engine of its own), else Docker's default."""
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else "/var/run/docker.sock"


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
    sub.add_parser("scheduler", help="fire schedules (as the API processes do) without serving HTTP")
    egress = sub.add_parser("egress", help="run the egress proxy (in its container)")
    egress.add_argument("--host", default="0.0.0.0")
    secrets = sub.add_parser("secrets", help="manage secret headers the egress proxy adds per host")
    secrets_sub = secrets.add_subparsers(dest="secrets_command", required=True)
    put = secrets_sub.add_parser("set", help="add or replace a header for requests to a host")
    put.add_argument("--host", required=True)
    put.add_argument("--header", required=True, help="e.g. Authorization")
    put.add_argument("--value", required=True, help="the header's value; - reads it from stdin")
    put.add_argument("--tenant", default="*", help="only this tenant's executions (default: every tenant)")
    put.add_argument("--tls", action="store_true", help="speak HTTPS to the host for http:// requests")
    secrets_sub.add_parser("list", help="list registered secrets (never their values)")
    reseal = secrets_sub.add_parser(
        "reseal", help="re-seal every secret to EXECBOX_EGRESS__PUBLIC_KEY (key rotation; needs the old private key)"
    )
    reseal.add_argument("--old-private-key-file", required=True, type=Path)
    drop = secrets_sub.add_parser("delete", help="remove a header")
    drop.add_argument("--host", required=True)
    drop.add_argument("--header", required=True)
    drop.add_argument("--tenant", default="*")
    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="issue a key for a tenant and print it (shown once)")
    create.add_argument("--tenant", required=True)
    create.add_argument(
        "--require-approval",
        action="store_true",
        help="its executions and run steps with side effects wait for another key's approval; it decides none",
    )
    keys.add_parser("list", help="list keys (ids and tenants, never the keys)")
    revoke = keys.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    nodes = sub.add_parser("nodes", help="the nodes workers run on; drain one before maintenance (admin role)")
    nodes_sub = nodes.add_subparsers(dest="nodes_command", required=True)
    nodes_sub.add_parser("list", help="each node: workers, drained or not, executions running and finished")
    nodes_sub.add_parser("drain", help="its workers finish what they run and take nothing new").add_argument("node")
    nodes_sub.add_parser("undrain", help="its workers take work again").add_argument("node")
    dproxy = sub.add_parser("docker-proxy", help="serve a narrowed Docker socket for workers (in its container)")
    dproxy.add_argument("--listen", required=True, help="unix socket path the workers connect to")
    dproxy.add_argument("--engine", default=_engine_socket(), help="the engine's socket (default: DOCKER_HOST's)")
    dproxy.add_argument("--deployment", default="execbox", help="the deployment label (EXECBOX_REDIS__KEY_PREFIX)")
    dproxy.add_argument("--egress-container", default="execbox-egress", help="the egress proxy's container name")
    dproxy.add_argument(
        "--egress-service",
        help="on a Swarm node: the egress proxy is this service's task here (its container is Swarm-named)",
    )
    bwrap = sub.add_parser("bwrap-helper", help="run the bubblewrap runtime's root helper on this host (as root)")
    bwrap.add_argument("--socket", type=Path, default=Path("/run/execbox/bwrap.sock"), help="where workers connect")
    bwrap.add_argument("--group", default="0", help="the group (name or id) whose members may connect: the workers'")
    bwrap.add_argument("--uids", default="200000-299999", help="the sandbox uid range (EXECBOX_DOCKER__UID_RANGE)")
    bwrap.add_argument("--engine", default=_engine_socket(), help="the engine whose sandbox images it runs")
    bwrap.add_argument("--state", type=Path, default=Path("/var/lib/execbox-bwrap"), help="this helper's own state")
    bwrap.add_argument(
        "--images", type=Path, default=None, help="unpacked images (default STATE/rootfs); helpers may share one"
    )
    bwrap.add_argument("--seccomp", type=Path, default=Path("policies/seccomp.json"), help="execbox's seccomp profile")
    bwrap.add_argument(
        "--policies",
        type=Path,
        default=Path(os.environ.get("EXECBOX_POLICIES_DIR", "policies")),
        help="the workers' policy directory: no run may ask more than its highest ceilings (EXECBOX_POLICIES_DIR)",
    )
    bwrap.add_argument(
        "--oom-score-adj", type=int, default=1000, help="the runs' (the host's OOM killer picks them first)"
    )
    egress_key = sub.add_parser(
        "egress-key", help="make the egress proxy's key pair (if missing); print the public key"
    )
    egress_key.add_argument("path", type=Path, help="where the private key is (or is written, mode 0400)")
    sub.add_parser("migrate", help="move data stored under an older key layout (the API does it at start)")
    acl = sub.add_parser("redis-acl", help="print the Redis ACL file for the roles api, worker, egress, admin")
    acl.add_argument("--prefix", default="execbox", help="the deployment's key prefix (EXECBOX_REDIS__KEY_PREFIX)")
    acl.add_argument("--passwords", type=Path, required=True, help="env file with REDIS_<ROLE>_PASSWORD lines")
    records = sub.add_parser("records", help="remove a stored record (one an older version stored unreadable)")
    records_rm = records.add_subparsers(dest="records_command", required=True).add_parser("rm", help="remove one")
    records_rm.add_argument("kind", choices=["run", "schedule"])
    records_rm.add_argument("record_id", help="run_... or sch_...")
    dead = sub.add_parser("dead-letters", help="messages and records a background loop set aside (admin role)")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True)
    dead_sub.add_parser("list", help="every dead letter: loop, id, item, attempts, error").add_argument("--loop")
    for verb, what in (("show", "print one as JSON"), ("replay", "hand it back to its loop"), ("drop", "delete it")):
        one = dead_sub.add_parser(verb, help=what)
        one.add_argument("loop", help="plans, scheduler, surprises, webhooks, ...")
        one.add_argument("letter_id", help="its id, as `list` prints it")
    args = parser.parse_args(argv)
    if args.command == "docker-proxy":
        from execbox.core import logs
        from execbox.dockerproxy.server import run
        from execbox.dockerproxy.shape import shape_from

        logs.configure("INFO", "docker-proxy")
        # The sandbox shape from the workers' own settings (EXECBOX_POLICIES_DIR, EXECBOX_DOCKER__*).
        settings = Settings()
        shape = shape_from(settings.docker, settings.policies_dir, settings.egress.subnet_pool)
        run(args.listen, args.engine, args.deployment, args.egress_container, shape, args.egress_service)
        return 0
    if args.command == "bwrap-helper":
        from execbox.core import logs
        from execbox.sandbox.bwrap.helper import HelperSettings
        from execbox.sandbox.bwrap.helper import main as helper_main

        logs.configure("INFO", "bwrap-helper")
        engine = args.engine if "://" in args.engine else f"unix://{args.engine}"
        helper_main(
            HelperSettings(
                args.socket,
                args.group,
                args.uids,
                engine,
                args.state,
                args.seccomp,
                oom_score_adj=args.oom_score_adj,
                policies=args.policies,
                images=args.images,
            )
        )
        return 0
    if args.command == "egress-key":
        from execbox.egress.sealing import generate

        print(generate(args.path))
        return 0
    if args.command == "redis-acl":
        from execbox.core.redis_roles import ROLES, acl_file
        from execbox.keyschema import SCHEMA

        lines = dict(line.split("=", 1) for line in args.passwords.read_text().split() if "=" in line)
        passwords = {r: lines.get(f"REDIS_{r.upper()}_PASSWORD", "") for r in ROLES}
        sys.stdout.write(acl_file(args.prefix, passwords, SCHEMA))
        return 0
    settings = Settings()

    if args.command == "api":
        from execbox.api import create_app
        from execbox.api.server import serve

        serve(create_app(settings), settings.api, args.host, args.port)  # head deadline, connection bound
    elif args.command == "scheduler":
        import signal
        import threading

        from prometheus_client import CollectorRegistry

        from execbox.assembly import assemble
        from execbox.core import logs

        logs.configure(settings.log_level, "scheduler")
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        plane = assemble(settings, CollectorRegistry(), component="scheduler")  # no app: one loop, no HTTP
        try:
            plane.schedules.run(stop)
        finally:
            plane.close()
    elif args.command == "migrate":
        from execbox.core.keymigration import migrate
        from execbox.core.redis import connect
        from execbox.keyschema import Keys

        done = migrate(connect(settings), Keys(settings.redis.key_prefix))
        print(f"moved {done.moved} keys, merged {done.merged}, listed {done.untangled} index members as their tenant's")
    elif args.command == "worker":
        from execbox.worker.main import run_worker

        run_worker(settings, burst=args.burst, name=args.name)
    elif args.command == "keys":
        from execbox.core.redis import connect
        from execbox.tenancy.apikeys import ApiKeys

        api_keys = ApiKeys(connect(settings), settings.redis.key_prefix)
        if args.keys_command == "create":
            key, info = api_keys.create(args.tenant, args.require_approval)
            print(key)
            gated = ", its writes need approval" if info.require_approval else ""
            print(f"key id {info.key_id} for tenant {info.tenant}{gated}", file=sys.stderr)
        elif args.keys_command == "list":
            for info in api_keys.list():
                gated = "  requires-approval" if info.require_approval else ""
                print(f"{info.key_id}  {info.tenant}  {'revoked' if info.revoked else 'active'}{gated}")
        elif not api_keys.revoke(args.key_id):
            print(f"no key {args.key_id}", file=sys.stderr)
            return 1
    elif args.command == "nodes":
        return _nodes(settings, args)
    elif args.command == "egress":
        from execbox.egress.main import run_egress

        run_egress(settings, host=args.host)
    elif args.command == "secrets":
        from execbox.core.redis import connect
        from execbox.egress.sealing import Opener, SealingError, seal
        from execbox.egress.store import EgressStore
        from execbox.keyschema import Keys

        store = EgressStore(connect(settings), Keys(settings.redis.key_prefix), settings.retention_s)
        public_key = settings.egress.public_key
        if args.secrets_command in ("set", "reseal") and not public_key:
            print("EXECBOX_EGRESS__PUBLIC_KEY is not set: secrets are stored sealed to the egress proxy's key "
                  "(`execbox egress-key PATH` prints it)", file=sys.stderr)  # fmt: skip
            return 2
        if args.secrets_command == "set":
            value = sys.stdin.read().strip() if args.value == "-" else args.value
            store.set_secret(args.tenant, args.host.lower(), args.header, seal(str(public_key), value), args.tls)
        elif args.secrets_command == "reseal":
            old = Opener(args.old_private_key_file)
            try:
                for tenant, host, header, sealed, tls in store.sealed_secrets():
                    store.set_secret(tenant, host, header, seal(str(public_key), old.open(sealed)), tls)
            except SealingError as exc:
                print(f"{exc}", file=sys.stderr)
                return 1
        elif args.secrets_command == "list":
            for tenant, host, header, tls in store.secret_names():
                print(f"{tenant}  {host}  {header}{'  (https upstream)' if tls else ''}")
        elif not store.delete_secret(args.tenant, args.host.lower(), args.header):
            print(f"no secret {args.header} for {args.host} ({args.tenant})", file=sys.stderr)
            return 1
    elif args.command == "records":
        # Needs the Redis role that owns runs and schedules: run it where the API runs (its role).
        from execbox.core.redis import connect
        from execbox.keyschema import Keys
        from execbox.plans.store import RunStore
        from execbox.schedules.store import ScheduleStore

        client, key_schema = connect(settings), Keys(settings.redis.key_prefix)
        if args.kind == "run":
            removed = RunStore(client, key_schema, settings.retention_s).remove(args.record_id)
        else:
            removed = ScheduleStore(client, key_schema).remove(args.record_id)
        print(
            f"{'removed' if removed else 'no'} {args.kind} {args.record_id}", file=sys.stdout if removed else sys.stderr
        )
        return 0 if removed else 1
    elif args.command == "dead-letters":
        import dataclasses

        from execbox.core.deadletters import DeadLetters
        from execbox.core.redis import connect
        from execbox.keyschema import LOOPS, Keys

        letters = DeadLetters(connect(settings), Keys(settings.redis.key_prefix), LOOPS)
        if args.dead_command == "list":
            for letter in letters.list(args.loop):
                print(f"{letter.loop}  {letter.id}  {letter.item}  {letter.attempts} attempts  {letter.error[:120]}")
            return 0
        found = letters.get(args.loop, args.letter_id)
        if found is None:
            print(f"no dead letter {args.letter_id} of loop {args.loop}", file=sys.stderr)
            return 1
        if args.dead_command == "show":
            print(json.dumps(dataclasses.asdict(found), indent=2))
        elif args.dead_command == "replay":
            letters.replay(args.loop, args.letter_id)
            print(f"{args.letter_id} handed back to loop {args.loop} (it puts it back within a round)")
        else:
            letters.drop(args.loop, args.letter_id)
            print(f"{args.letter_id} dropped")
    elif args.command == "reap":
        from execbox.worker import reaper
        from execbox.worker.context import WorkerContext

        print(json.dumps(reaper.sweep(WorkerContext.build(settings, name="reaper-cli"))))
    return 0


def _nodes(settings: Settings, args: argparse.Namespace) -> int:
    """`execbox nodes list|drain NODE|undrain NODE`, with the admin role's Redis credentials."""
    from execbox.core.redis import connect
    from execbox.executions.store import ExecutionStore
    from execbox.fleet.nodes import Nodes, node_problem
    from execbox.keyschema import Keys

    client = connect(settings)
    nodes, store = Nodes(client, Keys(settings.redis.key_prefix)), ExecutionStore(client, settings)
    if args.nodes_command != "list":
        problem = node_problem(args.node)
        if problem is not None:
            print(f"node: {problem}", file=sys.stderr)
            return 2
        if args.nodes_command == "drain":
            nodes.drain(args.node)
        elif not nodes.undrain(args.node):
            print(f"node {args.node} was not drained", file=sys.stderr)
    views = nodes.overview(store.holders())
    if args.nodes_command != "list":
        views = [view for view in views if view.node == args.node] or [nodes.view(args.node, {})]
    for view in views:
        state = "drained" if view.drained else "active"
        if view.drained and view.workers:
            state += f" ({view.draining_workers}/{len(view.workers)} workers see it)"
        print(f"{view.node or '(unnamed)'}  {state}  workers {len(view.workers)}  running {view.running}  "
              f"finished {view.finished}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
