"""Trust between the service's own components, tried from the attacker's side: what one role's
Redis credentials can do, and what a worker does with a queue message that is not execbox's."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
import redis
from redis.exceptions import AuthenticationError, NoPermissionError
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from execbox.core.redis_roles import role_url
from execbox.executions.queue import TASK
from execbox.sandbox.docker.hostconfig import host_config_kwargs
from execbox.sandbox.runtime import Limits, SandboxSpec
from execbox.sandbox.seccomp import SeccompProfiles
from execbox.sandbox.settings import DockerSettings
from tests.conftest import PASSWORDS, ROOT, UID_RANGE, Side, Stack, free_port, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.redis]


def connect(stack: Stack, role: str) -> redis.Redis:
    return redis.Redis.from_url(role_url(stack.env["EXECBOX_REDIS__URL"], role, PASSWORDS[role]))


def test_each_role_is_refused_what_it_does_not_need(stack: Stack, redis_server: Any) -> None:
    p = stack.prefix
    forbidden: dict[str, list[tuple[str, ...]]] = {
        # The proxy parses sandbox traffic: it may not touch records, keys or the queue.
        "egress": [("SET", f"{p}:exe:exe_x", "{}"), ("GET", f"{p}:apikeys"), ("LPUSH", "rq:queue:x", "y"),
                   ("HSET", f"{p}:secret:*:h", "X", "y"), ("GET", f"{p}:egress:denied:exe_x"), ("SCAN", "0"),
                   ("CONFIG", "GET", "*")],
        "api": [("CONFIG", "GET", "*"), ("GET", f"{p}:egress:rule:10.213.0.2"), ("HGETALL", f"{p}:secret:*:h"),
                ("FLUSHALL",), ("KEYS", "*"), ("ACL", "LIST"), ("SHUTDOWN",), ("CLIENT", "KILL", "ID", "1")],
        "worker": [("ACL", "GETUSER", "api"), ("GET", f"{p}:apikey:abc"), ("HGETALL", f"{p}:secret:*:h"),
                   ("GET", f"{p}:t:idem:alpha:x"), ("SET", f"{p}:file:f", "x"), ("CONFIG", "SET", "save", "")],
        "admin": [("GET", f"{p}:exe:exe_x"), ("LPUSH", "rq:queue:x", "y"), ("FLUSHALL",), ("ACL", "LIST")],
    }  # fmt: skip
    try:
        with pytest.raises(AuthenticationError):  # without credentials nothing at all
            redis.Redis(port=redis_server.port).get(f"{p}:exe:exe_x")
        with pytest.raises(AuthenticationError):  # and nobody may log in as the default user
            redis.Redis(port=redis_server.port, username="default", password="").ping()
        for role, commands in forbidden.items():
            client = connect(stack, role)
            assert client.ping()
            for command in commands:
                with pytest.raises(NoPermissionError):
                    client.execute_command(*command)  # type: ignore[no-untyped-call]
                    pytest.fail(f"{role} may {command}")
    finally:
        redis.Redis.from_url(redis_server.url).acl_log_reset()  # these refusals were on purpose


@pytest.fixture
def gated(stack: Stack, side_stack: Any) -> tuple[Side, str]:
    """A worker of its own, serving /metrics, on an otherwise idle queue."""
    side = side_stack()
    metrics = f"127.0.0.1:{free_port()}"
    side.worker("gate", EXECBOX_TELEMETRY__WORKER_METRICS_PORT=metrics.split(":")[1])
    wait_until(lambda: _refused(metrics) is not None, 30, "the gate worker's /metrics")
    return side, metrics


def _refused(metrics: str) -> dict[str, float] | None:
    try:
        text = httpx.get(f"http://{metrics}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    found = {}
    for line in text.splitlines():
        if line.startswith("execbox_jobs_refused_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            found[reason] = float(line.rsplit(" ", 1)[1])
    return found


def test_a_foreign_job_written_with_the_api_role_never_runs(gated: tuple[Side, str], tmp_path: Path) -> None:
    side, metrics = gated
    api = redis.Redis.from_url(side.env["EXECBOX_REDIS__URL"])  # what a compromised API holds
    queue = Queue(side.env["EXECBOX_QUEUE__NAME"], connection=api, serializer=JSONSerializer)
    markers = [tmp_path / f"marker-{i}" for i in range(4)]
    jobs = [
        queue.enqueue_call("os.system", args=(f"touch {markers[0]}",)),
        queue.enqueue_call("subprocess.check_call", args=(["touch", str(markers[1])],)),
        queue.enqueue_call(TASK, args=({},)),  # ours, but with a callback RQ would import and call
    ]
    api.hset(jobs[2].key, "failure_callback_name", "os.system")
    api.hset(jobs[2].key, "success_callback_name", "os.system")
    # A pickled message (RQ's default serializer) for os.system: never unpickled.
    pickled = Queue(side.env["EXECBOX_QUEUE__NAME"], connection=api)
    jobs.append(pickled.enqueue_call("os.system", args=(f"touch {markers[3]}",)))
    api.hset(jobs[3].key, "data", pickle.dumps(("os.system", None, (f"touch {markers[3]}",), {})))

    def settled() -> bool:
        statuses = [Job.fetch(j.id, connection=api, serializer=JSONSerializer).get_status() for j in jobs]
        return all(s is JobStatus.FAILED for s in statuses)

    wait_until(settled, 30, "the worker to refuse every foreign message")
    assert not any(m.exists() for m in markers)
    for job in jobs:
        latest = Job.fetch(job.id, connection=api, serializer=JSONSerializer).latest_result()
        assert (
            latest is not None
            and "refused" in str(latest.exc_string)
            and "nothing was imported" in str(latest.exc_string)
        )
    assert _refused(metrics) == {"function": 2.0, "callback": 1.0, "undecodable": 1.0}


def test_the_workers_docker_socket_refuses_what_a_sandbox_must_not_be(
    docker_proxy: str, docker_client: docker.DockerClient, stack: Stack
) -> None:
    """A worker taken over holds the docker proxy's socket, not the engine's: it can still start
    sandboxes of the runtime's shape (the whole suite runs its workers through it), but nothing that
    would give it the host (tests/unit/test_docker_proxy_rules.py holds the whole table)."""
    worker = docker.APIClient(base_url=docker_proxy, version="auto", timeout=10)
    uid = int(UID_RANGE.split("-")[0])  # the session's deployment's first sandbox uid
    labels = {"execbox.managed": "true", "execbox.deployment": stack.prefix}
    image = "execbox/sandbox-python:latest"
    limits = Limits(timeout_s=10, cpu=1.0, cpu_time_s=20, memory_mb=64, pids=16, disk_mb=64, output_bytes=1 << 20)
    spec = SandboxSpec("exe_trust", "", "trust", image, ("true",), (), (), limits, deployment=stack.prefix)
    seccomp = SeccompProfiles(ROOT / "policies" / "seccomp.json").json()
    good: dict[str, Any] = host_config_kwargs(spec, DockerSettings(), uid, seccomp)  # as the runtime makes it
    attempts: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "privileged": ({**good, "privileged": True}, {}),
        "bind of /": ({**good, "binds": ["/:/host"]}, {}),
        "docker socket": ({**good, "binds": ["/var/run/docker.sock:/var/run/docker.sock"]}, {}),
        "added capability": ({**good, "cap_add": ["SYS_ADMIN"]}, {}),
        "host pid": ({**good, "pid_mode": "host"}, {}),
        "host network": ({**good, "network_mode": "host"}, {}),
        "unconfined seccomp": ({**good, "security_opt": ["no-new-privileges", "seccomp=unconfined"]}, {}),
        "device": ({**good, "devices": ["/dev/kvm:/dev/kvm"]}, {}),
        "root user": (good, {"user": "0"}),
        "root user spelled 00:00": (good, {"user": "00:00"}),
        "memory 64 GiB": ({**good, "mem_limit": "64g", "memswap_limit": "64g"}, {}),
        "OOM score -1000": ({**good, "oom_score_adj": -1000}, {}),
        "no CPU quota": ({k: v for k, v in good.items() if k != "cpu_quota"}, {}),
        "seccomp allowing everything": (
            {**good, "security_opt": ["no-new-privileges", 'seccomp={"defaultAction":"SCMP_ACT_ALLOW"}']},
            {},
        ),
        "other image": (good, {"image": "execbox/service:latest"}),
        "another deployment": (good, {"labels": {"execbox.managed": "true", "execbox.deployment": "other"}}),
        "CPU weight above the default": ({**good, "cpu_shares": 262144}, {}),
    }
    for name, (host, extra) in attempts.items():
        with pytest.raises(docker.errors.APIError) as refused:
            worker.create_container(
                extra.get("image", image),
                "true",
                user=extra.get("user", f"{uid}:{uid}"),
                labels=extra.get("labels", labels),
                host_config=worker.create_host_config(**host),
            )
        assert refused.value.status_code == 403, name  # fmt: skip
    # A container that is not this deployment's (here: made on the engine directly) cannot be
    # touched: not read through the archive API, not stopped, not removed, not entered.
    other = docker_client.containers.create(image, "sleep 30", labels={"purpose": "not execbox"})
    other_id = str(other.id)
    try:
        for call in (lambda: worker.get_archive(other_id, "/etc"), lambda: worker.kill(other_id),
                     lambda: worker.remove_container(other_id, force=True), lambda: worker.exec_create(other_id, "id"),
                     lambda: worker.containers(all=True),  # a listing without execbox's label filter
                     lambda: worker.containers(all=True, filters={"label": "execbox.managed=true"}),  # all deployments
                     lambda: worker.inspect_image("execbox/service:latest"),  # type: ignore[no-untyped-call]
                     lambda: worker.create_network("x", internal=False, labels=labels)):  # fmt: skip
            with pytest.raises(docker.errors.APIError) as refused:
                call()
            assert refused.value.status_code == 403
        other.reload()
        assert other.status == "created"
    finally:
        other.remove(force=True)
    ok = worker.create_container(image, "true", user=f"{uid}:{uid}", labels=labels,
                                 host_config=worker.create_host_config(**good, cpu_shares=2))  # fmt: skip
    # A waiting warm container's weight may go back to the default, never above it.
    worker.update_container(ok["Id"], cpu_shares=1024)
    with pytest.raises(docker.errors.APIError) as refused:
        worker.update_container(ok["Id"], cpu_shares=4096)
    assert refused.value.status_code == 403
    worker.remove_container(ok["Id"], force=True, v=True)  # the hardened one is allowed, and ours to remove
