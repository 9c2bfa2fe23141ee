"""The Sentinel overlay's start scripts (deploy/kubernetes/components/sentinel) and the Secrets
deploy/kubernetes/secrets.sh makes for them: which primary a data node or a Sentinel starts with,
in each situation a pod can restart into, and the config it writes. The scripts run for real under
`sh`; only what they would reach in a cluster (the other pods through redis-cli, DNS, the hostname,
kubectl) is a stub on PATH. Then the configs and the users files, moved to loopback ports, run a
real primary, replica and Sentinel: the roles' ACLs are enough for replication and monitoring, and
a client role can ask where the primary is and nothing more."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from tests.conftest import free_port, wait_until

SCRIPTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "components" / "sentinel"
NODE = "execbox-redis-node-{}.execbox-redis-node"
SENTINEL = "execbox-sentinel-{}.execbox-sentinel"

STUBS = {
    # Answers from the file $STUB_ANSWERS ("<host> <command> <reply words...>"), one word a line as
    # redis-cli prints to a pipe; no line: the host does not answer. Each call is logged.
    "redis-cli": """#!/bin/sh
user="" host=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h) host=$2; shift 2 ;;
    -p) shift 2 ;;
    --user) user=$2; shift 2 ;;
    --no-auth-warning) shift ;;
    *) break ;;
  esac
done
echo "$user $REDISCLI_AUTH $host $*" >>"$STUB_LOG"
answer=$(grep -F "$host $1 " "$STUB_ANSWERS" | head -n 1 | cut -d' ' -f3-)
[ -n "$answer" ] || exit 1
printf '%s\\n' $answer
""",
    "timeout": '#!/bin/sh\nshift\nexec "$@"\n',
    "hostname": '#!/bin/sh\necho "$STUB_HOSTNAME"\n',
    "getent": '#!/bin/sh\necho "10.0.0.9 $2"\n',
    "redis-server": '#!/bin/sh\necho "$*" >"$STUB_SERVER_ARGS"\n',
}
EXECBOX = str(Path(sys.executable).with_name("execbox"))
PASSWORDS = {"REPLICATOR_PASSWORD": "rep-pw", "SENTINEL_PASSWORD": "sen-pw", "PEER_PASSWORD": "peer-pw"}


@dataclass(frozen=True)
class Started:
    config: list[str]  # the lines of the config file written
    server_args: str  # what redis-server was started with
    asked: list[str]  # "<user> <password> <host> <command...>", one per redis-cli call


def start(
    tmp_path: Path,
    script: str,
    hostname: str,
    answers: list[str],
    passwords: dict[str, str] = PASSWORDS,
    users_file: Path | None = None,
) -> Started:
    tmp_path.mkdir(exist_ok=True)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in STUBS.items():
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    (tmp_path / "answers").write_text("".join(f"{line}\n" for line in answers))
    users = tmp_path / "sentinel-users.acl"
    users.write_text("user api on #abc -@all +sentinel|get-master-addr-by-name\n")
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "STUB_ANSWERS": str(tmp_path / "answers"),
        "STUB_LOG": str(tmp_path / "log"),
        "STUB_HOSTNAME": hostname,
        "STUB_SERVER_ARGS": str(tmp_path / "server-args"),
        "REDIS_CONF_DIR": str(tmp_path),
        "SENTINEL_CONF_DIR": str(tmp_path),
        "SENTINEL_USERS_FILE": str(users_file or users),
        **passwords,
    }
    done = subprocess.run(["sh", str(SCRIPTS / script)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    config = tmp_path / ("redis.conf" if script == "redis-node.sh" else "sentinel.conf")
    assert oct(config.stat().st_mode & 0o777) == "0o600", "the config holds passwords: owner only"
    log = tmp_path / "log"
    return Started(
        config.read_text().splitlines(),
        (tmp_path / "server-args").read_text().strip(),
        log.read_text().splitlines() if log.exists() else [],
    )


def replicaof(started: Started) -> list[str]:
    return [line for line in started.config if line.startswith("replicaof ")]


def test_node_0_on_a_first_start_is_the_primary(tmp_path: Path) -> None:
    started = start(tmp_path, "redis-node.sh", "execbox-redis-node-0", answers=[])
    assert replicaof(started) == []
    assert f"replica-announce-ip {NODE.format(0)}" in started.config
    assert started.server_args == f"{tmp_path}/redis.conf"
    # It asked each Sentinel, as the replicator, before deciding; not itself.
    assert [line.split()[:3] for line in started.asked] == [
        ["replicator", "rep-pw", SENTINEL.format(i)] for i in range(3)
    ] + [["replicator", "rep-pw", NODE.format(1)]]


def test_node_1_on_a_first_start_replicates_node_0_which_says_it_is_primary(tmp_path: Path) -> None:
    started = start(tmp_path, "redis-node.sh", "execbox-redis-node-1", answers=[f"{NODE.format(0)} ROLE master 0"])
    assert replicaof(started) == [f"replicaof {NODE.format(0)} 6379"]
    assert "masteruser replicator" in started.config and "masterauth rep-pw" in started.config
    assert f"replica-announce-ip {NODE.format(1)}" in started.config


def test_node_0_back_after_a_fail_over_replicates_the_primary_a_sentinel_names(tmp_path: Path) -> None:
    answers = [
        f"{SENTINEL.format(0)} SENTINEL NOAUTH Authentication required.",  # a garbled answer is ignored
        f"{SENTINEL.format(1)} SENTINEL {NODE.format(1)} 6379",
        f"{NODE.format(1)} ROLE master 0",
    ]
    started = start(tmp_path, "redis-node.sh", "execbox-redis-node-0", answers)
    assert replicaof(started) == [f"replicaof {NODE.format(1)} 6379"]
    assert not [line for line in started.asked if " ROLE" in line], "a Sentinel's answer is enough"


def test_node_keeps_the_single_node_durability_and_loads_the_roles(tmp_path: Path) -> None:
    config = start(tmp_path, "redis-node.sh", "execbox-redis-node-0", answers=[]).config
    for line in (
        "appendonly yes",
        "appendfsync always",
        "maxmemory-policy noeviction",
        "aclfile /etc/execbox/users.acl",
    ):
        assert line in config


def monitored(started: Started) -> str:
    (line,) = [line for line in started.config if line.startswith("sentinel monitor ")]
    return line


def test_sentinel_on_a_first_start_monitors_node_0_by_name_with_hostnames_on(tmp_path: Path) -> None:
    started = start(tmp_path, "sentinel.sh", "execbox-sentinel-2", answers=[])
    assert monitored(started) == f"sentinel monitor execbox {NODE.format(0)} 6379 2"
    config = started.config
    assert config.index("sentinel resolve-hostnames yes") < config.index(monitored(started))
    assert config.index("sentinel announce-hostnames yes") < config.index(monitored(started))
    assert f"sentinel announce-ip {SENTINEL.format(2)}" in config
    assert started.server_args == f"{tmp_path}/sentinel.conf --sentinel"
    assert [line.split()[:3] for line in started.asked] == [
        ["peer", "peer-pw", SENTINEL.format(0)],
        ["peer", "peer-pw", SENTINEL.format(1)],
        ["sentinel", "sen-pw", NODE.format(0)],
        ["sentinel", "sen-pw", NODE.format(1)],
    ]


def test_sentinel_restarted_follows_the_primary_its_peers_name(tmp_path: Path) -> None:
    answers = [f"{SENTINEL.format(2)} SENTINEL {NODE.format(1)} 6379"]
    started = start(tmp_path, "sentinel.sh", "execbox-sentinel-0", answers)
    assert monitored(started) == f"sentinel monitor execbox {NODE.format(1)} 6379 2"


def test_sentinels_all_restarted_find_the_promoted_node_by_its_role(tmp_path: Path) -> None:
    answers = [f"{NODE.format(0)} ROLE slave", f"{NODE.format(1)} ROLE master 0"]
    started = start(tmp_path, "sentinel.sh", "execbox-sentinel-1", answers)
    assert monitored(started) == f"sentinel monitor execbox {NODE.format(1)} 6379 2"


def test_sentinel_lets_in_no_default_user_peers_by_digest_and_the_roles_file(tmp_path: Path) -> None:
    config = start(tmp_path, "sentinel.sh", "execbox-sentinel-0", answers=[]).config
    assert "user default off resetpass -@all" in config
    assert f"user peer on #{hashlib.sha256(b'peer-pw').hexdigest()} allchannels +@all" in config
    assert "peer-pw" not in "\n".join(line for line in config if line.startswith("user "))
    assert "user api on #abc -@all +sentinel|get-master-addr-by-name" in config
    assert "sentinel auth-user execbox sentinel" in config and "sentinel auth-pass execbox sen-pw" in config
    assert "sentinel sentinel-user peer" in config and "sentinel sentinel-pass peer-pw" in config


@pytest.mark.parametrize("script", ["redis-node.sh", "sentinel.sh"])
def test_the_scripts_are_posix_shell_without_bashisms(script: str) -> None:
    shell = "/usr/bin/dash" if os.path.exists("/usr/bin/dash") else "sh"
    done = subprocess.run([shell, "-n", str(SCRIPTS / script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


# --- secrets.sh's Secrets and the scripts' configs, run by a real redis-server on loopback

KUBECTL = """#!/bin/sh
# kubectl -n NS get secret NAME [-o jsonpath=...] | kubectl -n NS create secret generic NAME --from-...
shift 2
if [ "$1" = get ]; then
  dir="$STUB_SECRETS/$3"
  [ -d "$dir" ] || exit 1
  if [ $# -gt 3 ]; then base64 -w0 "$dir/egress.key"; fi
  exit 0
fi
dir="$STUB_SECRETS/$4"
mkdir -p "$dir"
shift 4
for arg in "$@"; do
  case "$arg" in
    --from-literal=*) kv=${arg#--from-literal=}; printf %s "${kv#*=}" >"$dir/${kv%%=*}" ;;
    --from-file=*) kv=${arg#--from-file=}; cat "${kv#*=}" >"$dir/${kv%%=*}" ;;
  esac
done
"""


def run_secrets(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """secrets.sh with a kubectl stub that keeps each Secret as a folder of files in tmp_path/secrets."""
    stubs = tmp_path / "kubectl-stub"
    stubs.mkdir(exist_ok=True)
    (stubs / "kubectl").write_text(KUBECTL)
    (stubs / "kubectl").chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_SECRETS": str(tmp_path / "secrets"), "EXECBOX": EXECBOX}
    return subprocess.run(
        ["bash", str(SCRIPTS.parents[1] / "secrets.sh"), *options], env=env, capture_output=True, text=True, timeout=60
    )


def make_secrets(tmp_path: Path, *options: str) -> tuple[Path, str]:
    done = run_secrets(tmp_path, *options)
    assert done.returncode == 0, done.stderr
    return tmp_path / "secrets", done.stdout


def read(store: Path, secret: str, key: str) -> str:
    return (store / secret / key).read_text()


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One run of `secrets.sh --sentinel --s3 seaweedfs` (each execbox CLI call takes seconds)."""
    return make_secrets(tmp_path_factory.mktemp("secrets"), "--sentinel", "--s3", "seaweedfs")


def test_secrets_for_sentinel_and_seaweedfs_hold_matching_keys(made: tuple[Path, str]) -> None:
    store, out = made
    assert out.startswith("EXECBOX_EGRESS__PUBLIC_KEY=")
    roles = ("api", "worker", "egress", "admin", "scaler")
    assert {p.name for p in store.iterdir()} == {
        *(f"execbox-redis-{role}" for role in roles),
        *("execbox-redis-acl", "execbox-redis-internal", "execbox-s3", "execbox-seaweedfs-s3", "execbox-egress-key"),
    }
    (identity,) = json.loads(read(store, "execbox-seaweedfs-s3", "s3.json"))["identities"]
    assert identity["credentials"] == [
        {"accessKey": read(store, "execbox-s3", "access-key"), "secretKey": read(store, "execbox-s3", "secret-key")}
    ]
    # Each role has on the Sentinels the digest of its own password, and the query commands only.
    sentinel_users = {
        line.split()[1]: line for line in read(store, "execbox-redis-internal", "sentinel-users.acl").splitlines()
    }
    assert set(sentinel_users) == {*roles, "replicator"}
    for role in roles:
        digest = hashlib.sha256(read(store, f"execbox-redis-{role}", "password").encode()).hexdigest()
        assert sentinel_users[role].startswith(f"user {role} on #{digest} -@all ")
        assert "+@all" not in sentinel_users[role] and "failover" not in sentinel_users[role]
    # Run again: everything is kept.
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    make_secrets(store.parent, "--sentinel", "--s3", "seaweedfs")
    assert before == {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}


def test_secrets_without_sentinel_are_refused_for_a_later_sentinel_overlay(tmp_path: Path) -> None:
    (tmp_path / "secrets" / "execbox-redis-acl").mkdir(parents=True)  # made earlier, without --sentinel
    done = run_secrets(tmp_path, "--sentinel")
    assert done.returncode == 1 and "made without --sentinel" in done.stderr


def test_secrets_refuse_an_unknown_s3_kind(tmp_path: Path) -> None:
    done = run_secrets(tmp_path, "--s3", "minio")
    assert done.returncode == 2 and "--s3 takes external or seaweedfs" in done.stderr


def on_loopback(config: list[str], port: int, data: Path, names: dict[str, str]) -> str:
    """A pod's config moved to this machine: its own port and directory, loopback only, the names
    it holds replaced (pods by loopback addresses, mounted files by their paths here)."""
    moved = [f"port {port}", "bind 127.0.0.1", f"dir {data}"]
    for line in config:
        if line.split(" ")[0] in ("port", "bind", "dir"):
            continue
        if line.startswith(("sentinel announce-ip ", "replica-announce-ip ")):
            line = f"{line.rsplit(' ', 1)[0]} 127.0.0.1"
        for name, here in names.items():
            line = line.replace(name, here)
        moved.append(line)
    return "\n".join(moved) + "\n"


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.terminate()
    for process in started:
        process.wait(timeout=20)


@pytest.mark.slow
def test_the_configs_and_secrets_run_a_real_primary_replica_and_sentinel(
    made: tuple[Path, str], tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    store, _ = made
    internal = {key: read(store, "execbox-redis-internal", key) for key in ("replicator", "sentinel", "peer")}
    passwords = {f"{key.upper()}_PASSWORD": value for key, value in internal.items()}
    acl = store / "execbox-redis-acl" / "users.acl"
    ports = [free_port() for _ in range(3)]
    names = {f"{NODE.format(0)} 6379": f"127.0.0.1 {ports[0]}", "/etc/execbox/users.acl": str(acl)}
    configs = [
        start(tmp_path / "n0", "redis-node.sh", "execbox-redis-node-0", [], passwords).config,
        start(tmp_path / "n1", "redis-node.sh", "execbox-redis-node-1", [f"{NODE.format(0)} ROLE master"],
              passwords).config,
        start(
            tmp_path / "s0", "sentinel.sh", "execbox-sentinel-0", [], passwords,
            users_file=store / "execbox-redis-internal" / "sentinel-users.acl",
        ).config,
    ]  # fmt: skip

    def run(index: int) -> None:
        data = tmp_path / f"data-{index}"
        data.mkdir()
        conf = tmp_path / f"run-{index}.conf"
        conf.write_text(on_loopback(configs[index], ports[index], data, names))
        args = ["redis-server", str(conf), *(["--sentinel"] if index == 2 else [])]
        processes.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def as_user(port: int, user: str | None, password: str | None) -> redis.Redis:
        return redis.Redis(port=port, username=user, password=password, socket_timeout=2, decode_responses=True)

    run(0)
    run(1)
    # The replica syncs as `replicator`: its ACL is enough for a full sync.
    primary = as_user(ports[0], "sentinel", internal["sentinel"])
    replica = lambda: primary.info("replication").get("slave0", {}).get("state") == "online"  # noqa: E731
    wait_until(lambda: _quiet(replica), 20, "the replica to sync")
    run(2)  # after the sync, so the Sentinel's first INFO of the primary already lists the replica
    api_password = read(store, "execbox-redis-api", "password")
    sentinel = as_user(ports[2], "api", api_password)
    # The Sentinel monitors the primary as `sentinel` and learns of the replica from it.
    peer = as_user(ports[2], "peer", internal["peer"])

    def sees_both() -> bool:
        state = cast(dict[str, Any], peer.sentinel_master("execbox"))
        return bool(state["flags"] == "master" and state["num-slaves"] == 1)

    wait_until(lambda: _quiet(sees_both), 30, "the Sentinel to see the primary and its replica")
    # A role may ask where the primary is, and do nothing else on a Sentinel.
    assert ask(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "execbox") == ["127.0.0.1", str(ports[0])]
    with pytest.raises(redis.exceptions.NoPermissionError):
        ask(sentinel, "SENTINEL", "FAILOVER", "execbox")
    with pytest.raises(redis.exceptions.AuthenticationError):
        ask(as_user(ports[2], None, None), "SENTINEL", "MASTERS")
    # What the start scripts ask, as whom they ask it: a Sentinel where the primary is, a data node its role.
    replicator = internal["replicator"]
    where = ask(as_user(ports[2], "replicator", replicator), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "execbox")
    assert where == ["127.0.0.1", str(ports[0])]
    assert ask(as_user(ports[1], "replicator", replicator), "ROLE")[0] == "slave"
    assert ask(as_user(ports[0], "sentinel", internal["sentinel"]), "ROLE")[0] == "master"
    # The role itself is the one the data nodes load: it may PING the primary, not read its replication.
    role_client = as_user(ports[0], "api", api_password)
    assert role_client.ping()
    with pytest.raises(redis.exceptions.NoPermissionError):
        ask(role_client, "REPLICAOF", "NO", "ONE")


def ask(client: redis.Redis, *command: str) -> Any:
    """A raw command (redis-py types execute_command loosely)."""
    return client.execute_command(*command)  # type: ignore[no-untyped-call]


def _quiet(check: Callable[[], object]) -> bool:
    """A check that is false while the server is not answering yet."""
    try:
        return bool(check())
    except redis.exceptions.RedisError:
        return False
