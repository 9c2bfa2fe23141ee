"""The sandbox's kernel surface and its isolation from other sandboxes, tried from inside, under
runc and under gVisor. Each test names the attack it stands for."""

from __future__ import annotations

import contextlib
import json
import re
import select
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from execbox.sandbox.bwrap import wire
from execbox.sandbox.bwrap.helper import HEAD_WAIT_S
from execbox.sandbox.bwrap.running import uid_holders
from execbox.sandbox.protocol import LAUNCHER, frame_files
from execbox.sandbox.runtime import EXECUTION_LABEL
from tests.conftest import (
    BWRAP_IMAGES,
    ENGINE,
    EXECBOX,
    ROOT,
    UID_RANGE,
    Processes,
    Stack,
    answers_200,
    as_role,
    auth,
    create_key,
    deployment_env,
    free_port,
    run_code,
    start_redis,
    wait_until,
)  # fmt: skip

pytestmark = [pytest.mark.docker, pytest.mark.redis]

LAUNCHER_NAMES = ("launch.py", "python3-launcher", "/opt/execbox")
FIRST_UID, LAST_UID = (int(end) for end in UID_RANGE.split("-"))
"""The session's sandbox uids: the helper tests below take uids at the range's far end, which the
session's workers reach last."""


@pytest.fixture
def api(runtime_api: httpx.Client) -> httpx.Client:
    return runtime_api


def results(body: dict[str, Any]) -> Any:
    assert body["status"] == "succeeded", (body["error"], body["stderr"][-2000:])
    return json.loads(body["stdout"].strip().splitlines()[-1])


def no_launcher_internals(body: dict[str, Any]) -> None:
    visible = json.dumps({k: body.get(k) for k in ("stdout", "stderr", "error")})
    assert not any(name in visible for name in LAUNCHER_NAMES), visible


SYSCALLS = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def call(*args):
    ret = libc.syscall(*args)
    return "ok" if ret >= 0 else errno.errorcode[ctypes.get_errno()]
params = ctypes.create_string_buffer(120)
out = {"io_uring_setup": call(425, 8, params)}  # x86_64 numbers
for name, family in (("unix", 1), ("inet", 2), ("inet6", 10), ("netlink", 16), ("packet", 17),
                     ("bluetooth", 31), ("vsock", 40), ("alg", 38), ("xdp", 44)):
    out[name] = call(41, family, 1 if family != 16 else 3, 0)
print(json.dumps(out))
"""


def test_kernel_surface_is_narrowed(api: httpx.Client) -> None:
    """io_uring (a long run of privilege escalations) and the socket families a sandbox never needs
    (vsock reaches the hypervisor host through network_mode=none; packet, netlink, bluetooth, alg,
    xdp are old attack surface) are refused; the families programs use still work."""
    found = results(run_code(api, SYSCALLS))
    assert found.pop("io_uring_setup") in ("EPERM", "ENOSYS")
    assert {k: found[k] for k in ("unix", "inet", "inet6")} == {"unix": "ok", "inet": "ok", "inet6": "ok"}
    refused = {k: v for k, v in found.items() if k not in ("unix", "inet", "inet6")}
    assert all(v in ("EPERM", "EAFNOSUPPORT", "EINVAL") for v in refused.values()), refused


def test_cgroup_and_proc_reveal_nothing_of_the_host(api: httpx.Client) -> None:
    code = """
import contextlib
import json
def read(path):
    try:
        return open(path).read()
    except OSError as e:
        return "error " + type(e).__name__
print(json.dumps({"cgroup": read("/proc/self/cgroup"), "interrupts": read("/proc/interrupts")}))
"""
    found = results(run_code(api, code))
    lines = [line.split(":", 2)[2] for line in found["cgroup"].splitlines() if line.count(":") >= 2]
    # No docker/<container id>. gVisor 2024 emulates the cgroup files itself: there a path is the
    # sandbox's own container id, flat, with nothing of the host's hierarchy (runc's mountinfo shows
    # that id too, in its /etc/hosts bind).
    own = r"/|" + (r"/[0-9a-f]{64}" if getattr(api, "runtime", None) == "runsc" else "")
    assert all(re.fullmatch(own, path) for path in lines), found["cgroup"]
    assert found["interrupts"] in ("", "error PermissionError", "error FileNotFoundError"), found["interrupts"][:200]


def host_oom_scores(names: set[str]) -> dict[str, int]:
    """The kernel's OOM badness (/proc/<pid>/oom_score) of each host process named in `names`."""
    scores = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (name := (proc / "comm").read_text().strip()) in names:
                scores[f"{name}[{proc.name}]"] = int((proc / "oom_score").read_text())
        except OSError:
            continue  # the process ended meanwhile
    return scores


def bwrap_run_pids(execution_id: str) -> list[int]:
    """The host pids of a bwrap run, oldest first, from its cgroup (cgroup v1's pids controller or v2)."""
    for parent in (Path("/sys/fs/cgroup/pids/execbox-bwrap"), Path("/sys/fs/cgroup/execbox-bwrap")):
        for run in parent.glob(f"*.{execution_id}.*"):  # <helper instance>.<execution>.<token>
            return sorted(int(p) for p in (run / "cgroup.procs").read_text().split())
    return []


def test_a_sandboxs_host_process_has_the_highest_oom_score_adj(
    api: httpx.Client, docker_client: docker.DockerClient
) -> None:
    """The OOM killer kills the process of highest oom_score: the sandbox's host process (the
    launcher under runc, gVisor's sandbox kernel under runsc, bubblewrap's monitor under bwrap), with
    the configured oom_score_adj of 1000, must rank above the engine's daemons and Redis, so a host
    short of memory kills a sandbox first (the kernel's own ranking, read, not only the adjustment
    that feeds it)."""
    exe = api.post("/v1/executions", json={"language": "python", "code": "import time\ntime.sleep(30)"}).json()["id"]
    try:
        if getattr(api, "runtime", None) == "bwrap":  # no container: bubblewrap's monitor, in the run's cgroup
            pid = wait_until(lambda: next(iter(bwrap_run_pids(exe)), None), 30, "the sandbox")
        else:
            found = wait_until(lambda: docker_client.api.containers(filters={"label": f"{EXECUTION_LABEL}={exe}"}),
                               30, "the sandbox")  # fmt: skip
            pid = docker_client.api.inspect_container(found[0]["Id"])["State"]["Pid"]  # type: ignore[index]
        assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000"
        sandbox = int(Path(f"/proc/{pid}/oom_score").read_text())
        services = host_oom_scores({"dockerd", "containerd", "redis-server"})
        assert {name.split("[")[0] for name in services} >= {"dockerd", "redis-server"}, services
        assert all(sandbox > score for score in services.values()), (sandbox, services)
    finally:
        api.post(f"/v1/executions/{exe}/cancel")


INOTIFY_HOG = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
while True:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    held.append(fd)
print(len(held), os.strerror(ctypes.get_errno()), flush=True)
time.sleep(6)
"""
INOTIFY_ONE = """
import ctypes, os, time
time.sleep(0.5)
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print("created" if fd >= 0 else os.strerror(ctypes.get_errno()))
"""


def test_one_sandbox_exhausting_a_per_uid_limit_does_not_starve_another(api: httpx.Client) -> None:
    """inotify instances are counted per host uid (max_user_instances, 128 by default): with one
    uid for every sandbox, a tenant holding them all made inotify_init1 fail in every other
    tenant's concurrent sandbox. Each live sandbox now has a uid of its own."""
    hog_id = api.post("/v1/executions", json={"language": "python", "code": INOTIFY_HOG}).json()["id"]
    wait_until(lambda: api.get(f"/v1/executions/{hog_id}").json()["status"] == "running", 30, "the hog to start")
    other = run_code(api, INOTIFY_ONE)  # on the other worker, while the hog holds every instance it could get
    hog = api.get(f"/v1/executions/{hog_id}?wait=60").json()
    assert hog["status"] == "succeeded" and int(hog["stdout"].split()[0]) >= 64, hog["stdout"]
    assert hog["started_at"] < other["started_at"] < hog["finished_at"], "the two runs did not overlap"
    assert other["stdout"].strip() == "created", other["stdout"]


def test_a_traced_program_keeps_its_own_outcome(api: httpx.Client) -> None:
    """PTRACE_TRACEME makes the program's parent, the launcher, its tracer: every signal the
    program then receives stops it and is reported to the launcher, which used to read the stop as
    the program's exit and crash with its own traceback on the user's stderr."""
    traced = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
print("traceme", libc.ptrace(0, 0, None, None), flush=True)
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # each child's exit sends this program SIGCHLD: a stop under ptrace
print("forked and waited", flush=True)
"""
    body = run_code(api, traced)
    assert body["status"] == "succeeded", (body["error"], body["stderr"])
    assert body["stdout"] == "traceme 0\nforked and waited\n"
    no_launcher_internals(body)
    crash = run_code(api, traced + "raise RuntimeError('after tracing')\n")
    assert crash["error"]["category"] == "code.exception" and crash["error"]["details"]["type"] == "RuntimeError"
    no_launcher_internals(crash)


def test_a_program_that_stops_itself_is_ended_by_the_clock(api: httpx.Client) -> None:
    body = run_code(api, "import os, signal\nprint('stopping', flush=True)\nos.kill(os.getpid(), signal.SIGSTOP)",
                    timeout_s=2)  # fmt: skip
    assert body["error"]["category"] == "limit.timeout", body["error"]
    assert body["stdout"] == "stopping\n"
    no_launcher_internals(body)


def test_killing_its_own_process_group_or_closing_its_streams_ends_only_the_program(api: httpx.Client) -> None:
    killer = run_code(api, "import os, signal\nprint('bye', flush=True)\nos.killpg(0, signal.SIGKILL)")
    assert killer["error"]["category"] == "code.exit_nonzero" and killer["signal"] == "SIGKILL", killer["error"]
    assert killer["stdout"] == "bye\n"
    closer = run_code(api, "import os\nprint('before', flush=True)\nos.close(1)\nos.close(2)\nos._exit(4)")
    assert closer["error"]["details"]["exit_code"] == 4 and closer["stdout"] == "before\n"
    for body in (killer, closer):
        no_launcher_internals(body)


PIDS = """
import os, time
children = []
for _ in range({children}):
    pid = os.fork()
    if pid == 0:
        time.sleep(0.5)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print("ok", len(children))
"""


def test_the_pids_limit_is_the_programs_own(api: httpx.Client) -> None:
    """With `pids: 10` the program may have ten processes, itself and nine children, every time;
    the launcher (PID 1) is counted on top. An eleventh is refused. Twenty runs, submitted at once
    (each its own sandbox and pids cgroup; the workers' slots take them as they free)."""
    request = {"language": "python", "code": PIDS.format(children=9), "policy": {"pids": 10}}
    submitted = [api.post("/v1/executions", json=request) for _ in range(20)]
    assert all(r.status_code == 202 for r in submitted), [r.text for r in submitted if r.status_code != 202]
    for answer in submitted:
        body = api.get(f"/v1/executions/{answer.json()['id']}?wait=60").json()
        assert body["status"] == "succeeded" and body["stdout"] == "ok 9\n", (body["error"], body["stderr"][-500:])
    over = run_code(api, PIDS.format(children=10), pids=10)
    assert over["error"]["category"] == "limit.pids", over["error"]


def test_a_runtime_no_worker_offers_is_refused(stack: Stack, processes: Processes, tmp_path: Path) -> None:
    """A deployment of its own (Redis, API, one worker offering runc only): asking for gVisor is a
    422 naming policy.runtime, before anything is queued."""
    port, prefix = free_port(), f"{stack.prefix}rt"
    start_redis(processes, port, tmp_path, prefix)
    env = deployment_env(stack, port, prefix, "rt")
    key = create_key(env, "alpha")
    api_port = free_port()
    processes.spawn(f"rt-api-{api_port}", [EXECBOX, "api", "--port", str(api_port)], env)
    processes.spawn(f"rt-worker-{api_port}", [EXECBOX, "worker", "--name", f"{prefix}-w"],
                    as_role({**env, "EXECBOX_DOCKER__OFFERED_RUNTIMES": '["runc"]'}, "worker"))  # fmt: skip
    url = f"http://127.0.0.1:{api_port}"
    wait_until(lambda: answers_200(f"{url}/readyz"), 30, "the runtime test's API and worker")
    with httpx.Client(base_url=url, timeout=60, headers=auth(key)) as client:
        refused = client.post("/v1/executions", json={"language": "python", "code": "print(1)",
                                                      "policy": {"runtime": "runsc"}})  # fmt: skip
        accepted = client.post("/v1/executions?wait=30", json={"language": "python", "code": "print(1)",
                                                               "policy": {"runtime": "runc"}})  # fmt: skip
    assert refused.status_code == 422, refused.text
    assert [e["field"] for e in refused.json()["errors"]] == ["policy.runtime"] and "runsc" in refused.text
    assert accepted.status_code == 200 and accepted.json()["policy"]["runtime"] == "runc"


def _ask_helper(socket_path: str, head: dict[str, Any]) -> dict[str, Any]:
    """What the bubblewrap helper answers a HEAD sent straight to its socket (as a taken-over worker would)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(60)
        conn.connect(socket_path)
        conn.sendall(wire.pack_json(wire.HEAD, head))
        frame = wire.read(conn)
    assert frame is not None and frame[0] == wire.FAILED, frame
    return wire.parse_json(frame[1], "FAILED")


def test_a_second_bwrap_helper_starting_on_the_host_leaves_the_first_ones_run_alone(
    stack: Stack, bwrap_helper: str, tmp_path: Path
) -> None:
    """A helper sweeps what it left itself when it starts (cgroups, run directories): another
    deployment's helper, or a restarted one with another state, must not kill the runs of this one."""
    code = "import time\ntime.sleep(3)\nprint('survived')"
    api = stack.client()
    exe = api.post("/v1/executions", json={"language": "python", "code": code, "policy": {"runtime": "bwrap"}})
    assert exe.status_code == 202, exe.text
    wait_until(lambda: bwrap_run_pids(exe.json()["id"]), 30, "the run to be running")
    other = tmp_path / "other.sock"
    second = subprocess.Popen([EXECBOX, "bwrap-helper", "--socket", str(other), "--engine", ENGINE, "--state",
                               str(tmp_path / "state"), "--seccomp", str(ROOT / "policies" / "seccomp.json")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_until(other.exists, 10, "the second helper's socket (after its start-up sweep)")
        assert bwrap_run_pids(exe.json()["id"]), "the second helper's sweep killed the first one's run"
    finally:
        second.terminate()
        second.wait(10)
    ended = api.get(f"/v1/executions/{exe.json()['id']}?wait=30").json()
    api.close()
    assert (ended["status"], ended["stdout"]) == ("succeeded", "survived\n"), ended


def test_the_bwrap_helper_refuses_what_a_taken_over_worker_asks_beyond_a_sandbox_run(
    bwrap_helper: str, docker_client: docker.DockerClient
) -> None:
    """Straight to the helper's socket: an image that is no sandbox image (the base image every
    sandbox image is built on), a uid outside the helper's range, a path to collect beyond out/, a
    command that is not the launcher, a loader variable. Each is refused, naming what, and runs
    nothing."""
    sandbox = docker_client.images.get("execbox/sandbox-python").id
    base = docker_client.images.get("local/debian:trixie").id
    limits = {"cpu": 1, "cpu_time_s": 5, "memory_mb": 128, "pids": 16, "disk_mb": 16, "timeout_s": 5}
    good = {"image": sandbox, "uid": FIRST_UID + 1, "label": "exe_attack", "collect": "out", "limits": limits,
            "command": [*LAUNCHER, "python3", "/opt/execbox/oneshot.py", "main.py"], "env": []}  # fmt: skip
    asks: dict[str, dict[str, Any]] = {
        "not a sandbox image": {**good, "image": base},
        "uid: must be in": {**good, "uid": 0},
        "collect:": {**good, "collect": "out/../../etc"},
        "command:": {**good, "command": ["/bin/sh", "-c", "id"]},
        "LD_PRELOAD": {**good, "env": [["LD_PRELOAD", "/workspace/evil.so"]]},
        # Above every policy's ceiling (the helper's old bounds: 64 GiB, 86,400 s, 4,096 pids).
        "limits.memory_mb": {**good, "limits": {**limits, "memory_mb": 65_536}},
        "limits.timeout_s": {**good, "limits": {**limits, "timeout_s": 86_400}},
        "limits.pids": {**good, "limits": {**limits, "pids": 4096}},
    }
    for expected, head in asks.items():
        assert expected in _ask_helper(bwrap_helper, head)["error"], expected


# --- the bubblewrap helper's own bounds, asked straight on its socket (a taken-over worker) ----


SLEEPER = frame_files((("main.sh", b"sleep 60\n"),), "0123456789abcdef")
"""The launcher's frame for a program that sleeps and never reads its stdin."""


def _bwrap_head(docker_client: docker.DockerClient, uid: int, label: str) -> dict[str, Any]:
    limits = {"cpu": 1, "cpu_time_s": 30, "memory_mb": 128, "pids": 16, "disk_mb": 16, "timeout_s": 30}
    return {"image": docker_client.images.get("execbox/sandbox-bash").id, "uid": uid, "label": label,
            "collect": "out", "limits": limits, "command": [*LAUNCHER, "bash", "main.sh"], "env": []}  # fmt: skip


def _frames(conn: socket.socket, within_s: float = 60) -> list[tuple[int, Any]]:
    """Every frame the helper sends until it closes the connection (JSON frames decoded)."""
    conn.settimeout(within_s)
    found: list[tuple[int, Any]] = []
    with contextlib.suppress(ConnectionResetError):
        while (frame := wire.read(conn)) is not None:
            json_kinds = (wire.EXIT, wire.FAILED, wire.TAR_END)
            found.append((frame[0], json.loads(frame[1]) if frame[0] in json_kinds else frame[1]))
    return found


def _cgroup_dirs(label: str) -> list[Path]:
    """The run cgroup directories named after `label`, in every v1 controller (or v2)."""
    roots = [Path("/sys/fs/cgroup") / c / "execbox-bwrap" for c in ("memory", "pids", "cpu", "freezer")]
    return [d for root in [*roots, Path("/sys/fs/cgroup/execbox-bwrap")] for d in root.glob(f"*.{label}.*")]


def test_a_run_released_in_the_same_send_as_its_head_leaves_no_process_and_no_cgroup(
    bwrap_helper: str, docker_client: docker.DockerClient
) -> None:
    """HEAD, STDIN, STDIN_END and RELEASE in one send: the shell that joins the run's cgroups ran after
    Popen returned, so RELEASE's kill met an empty cgroup, the launcher lived on holding the run's
    uid (its uid then given to the next run) and four v1 cgroup directories stayed. The run's first
    process is now in its cgroups before anything of the conversation is read, and the helper says
    the uid is free only once no process holds it."""
    uid, label = LAST_UID - 98, "exe_race"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(bwrap_helper)
        conn.sendall(wire.pack_json(wire.HEAD, _bwrap_head(docker_client, uid, label)) + wire.pack(wire.STDIN, SLEEPER)
                     + wire.pack(wire.STDIN_END) + wire.pack(wire.RELEASE))  # fmt: skip
        frames = _frames(conn)
    assert (wire.EXIT, {"event": "released", "uid_free": True}) in frames, frames
    assert uid_holders(uid) == [], "a process of the released run still holds its uid"
    assert _cgroup_dirs(label) == []


def test_a_head_and_then_an_end_of_the_connection_leaves_no_cgroup(
    bwrap_helper: str, docker_client: docker.DockerClient
) -> None:
    """A HEAD and then the end of the connection, over and over: each left its four v1 cgroup
    directories (the memory controller's ids run out at 65,535 for the whole host)."""
    for attempt in range(3):
        label = f"exe_headonly{attempt}"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(bwrap_helper)
            conn.sendall(wire.pack_json(wire.HEAD, _bwrap_head(docker_client, LAST_UID - 88 + attempt, label)))
            conn.shutdown(socket.SHUT_WR)
            _frames(conn)  # until the helper closes its side: the run is cleaned up by then
        assert _cgroup_dirs(label) == [], attempt
        assert uid_holders(LAST_UID - 88 + attempt) == []


def test_a_head_trickled_a_byte_at_a_time_is_cut_at_the_heads_deadline(
    bwrap_helper: str, docker_client: docker.DockerClient
) -> None:
    """32 connections trickling a byte every 8 s held every slot: the deadline was per recv. It is
    now the whole HEAD's, however slowly its bytes come."""
    head = wire.pack_json(wire.HEAD, _bwrap_head(docker_client, LAST_UID - 78, "exe_trickle"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(bwrap_helper)
        started = time.monotonic()
        answer = None
        for byte in head:
            conn.sendall(bytes([byte]))
            if select.select([conn], [], [], 0.5)[0]:
                answer = wire.read(conn)
                break
        waited = time.monotonic() - started
    assert answer is not None and answer[0] == wire.FAILED, answer
    assert "deadline" in wire.parse_json(answer[1], "FAILED")["error"]
    assert waited < HEAD_WAIT_S + 2, waited


def test_stdin_past_the_helpers_window_ends_the_run(bwrap_helper: str, docker_client: docker.DockerClient) -> None:
    """A worker that sends stdin its program never reads: the root helper held up to 64 MiB of it
    per run. It now holds one window (1 MiB) and ends a run whose worker sends past it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(bwrap_helper)
        conn.sendall(wire.pack_json(wire.HEAD, _bwrap_head(docker_client, LAST_UID - 68, "exe_stdin"))
                     + wire.pack(wire.STDIN, SLEEPER))  # fmt: skip
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(4):
                conn.sendall(wire.pack(wire.STDIN, b"x" * wire.MAX_FRAME))
        frames = _frames(conn)
    failed = [f[1]["error"] for f in frames if f[0] == wire.FAILED]
    assert failed and "window" in failed[0], frames
    assert (wire.EXIT, {"event": "released", "uid_free": True}) in frames, frames


def test_stopping_the_bwrap_helper_kills_its_runs_and_tells_their_workers(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """SIGTERM to the helper left its runs alive (the launcher drops PR_SET_PDEATHSIG with its uid)
    and the worker read the closed connection as the program's end ("exit code None"). Now every
    run is killed and its worker told (a retryable fault, not the program's)."""
    path = tmp_path / "stopping.sock"
    helper = subprocess.Popen([EXECBOX, "bwrap-helper", "--socket", str(path), "--engine", ENGINE, "--state",
                               str(tmp_path / "state"), "--images", str(BWRAP_IMAGES), "--seccomp",
                               str(ROOT / "policies" / "seccomp.json")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    uid = LAST_UID - 58
    try:
        wait_until(path.exists, 10, "the helper's socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(path))
            conn.sendall(wire.pack_json(wire.HEAD, _bwrap_head(docker_client, uid, "exe_stopped"))
                         + wire.pack(wire.STDIN, SLEEPER))  # fmt: skip
            conn.settimeout(60)
            assert wire.read(conn) == (wire.EXIT, b'{"event":"started"}')
            wait_until(lambda: uid_holders(uid), 10, "the program to run")
            helper.send_signal(signal.SIGTERM)
            frames = _frames(conn)
        assert helper.wait(20) == 0
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait(10)
    failed = [f[1]["error"] for f in frames if f[0] == wire.FAILED]
    assert failed and "helper stopped" in failed[0], frames
    assert uid_holders(uid) == [], "the stopped helper's run lives on"
    assert _cgroup_dirs("exe_stopped") == []


SHM_AND_PROC_SYS = """
import json, os, shutil, subprocess
def flags(path):
    return "ro" if os.statvfs(path).f_flag & os.ST_RDONLY else "rw"
shutil.copy("/bin/true", "/dev/shm/t")
os.chmod("/dev/shm/t", 0o755)
try:
    subprocess.run(["/dev/shm/t"], check=True)
    ran = "ran"
except PermissionError:
    ran = "refused"
print(json.dumps({"proc_sys": flags("/proc/sys"), "shm_exec": ran}))
"""


def test_dev_shm_runs_nothing_and_proc_sys_is_read_only(api: httpx.Client) -> None:
    """Under bwrap, /dev/shm allowed exec (a dropped binary ran from it) and /proc/sys was the
    writable proc mount, while setpriv ran as uid 0 before dropping (core_pattern is writable by
    uid 0 without any capability). Each runtime now mounts /dev/shm noexec, and /proc/sys read-only
    (gVisor's /proc/sys is its own kernel's, with no host sysctl behind it, and says rw)."""
    found = results(run_code(api, SHM_AND_PROC_SYS))
    proc_sys = "rw" if getattr(api, "runtime", None) == "runsc" else "ro"
    assert found == {"proc_sys": proc_sys, "shm_exec": "refused"}, found


KERNEL_CALLS = """
import json, os, select, signal, subprocess
child = subprocess.Popen(["sleep", "30"])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
os.kill(-1, signal.SIGTERM)  # every process it may signal but itself: its child, never PID 1 (the launcher)
child.wait()
listing = subprocess.run(["ls", "/"], capture_output=True, text=True)
r, w = os.pipe()
os.write(w, b"x")
ready = select.select([r], [], [], 86_400.0)[0] == [r]  # a long timeout, answered at once
print(json.dumps({"child": child.returncode, "ls": listing.returncode, "ls_err": listing.stderr[-200:],
                  "stat": os.stat("/").st_ino > 0, "select": ready}))
"""


SIGNAL_PID_1 = """
import os, signal, time
for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL):
    os.kill(1, sig)
time.sleep(0.5)
print("went on")
"""


def test_a_program_that_signals_pid_1_is_told_its_own_outcome(api: httpx.Client) -> None:
    """Linux drops every signal a program sends its namespace's init (PID 1, the launcher) but
    those init handles; gVisor (20240729) delivers them, so SIGKILL ended the launcher and the run
    was a retryable sandbox.error: a program could make its own failure the service's, and be
    retried. Whatever the runtime, the program is told its own outcome and nothing is retryable
    (under runc and bwrap it goes on; under gVisor it ends killed by the signal it sent)."""
    body = run_code(api, SIGNAL_PID_1)
    if body["status"] == "succeeded":
        assert body["stdout"] == "went on\n", body
    else:
        assert body["error"]["category"] == "code.exit_nonzero" and not body["error"]["retryable"], body["error"]
        assert body["error"]["details"]["signal"] in ("SIGKILL", "SIGTERM"), body["error"]


def test_kill_minus_one_statx_and_a_long_select_behave_as_on_linux(api: httpx.Client) -> None:
    """Under Debian 12's gVisor, kill(-1, SIGTERM) reached PID 1 (the launcher: control C26 says no
    program signal reaches it), `ls /` failed with statx EINVAL and select with a long timeout
    returned EPERM: a program's own ordinary calls ended as sandbox.error or its own failure.
    scripts/install takes gVisor from Debian 13; each runtime now answers as Linux does."""
    found = results(run_code(api, KERNEL_CALLS))
    assert found == {"child": -15, "ls": 0, "ls_err": "", "stat": True, "select": True}, found
