"""Draining a node (issue 30): two real worker processes on this host, each naming a node of its own
(EXECBOX_WORKER__NODE), on a side API's queue, with real sandboxes. A drained node finishes what it
runs and takes nothing new; undrained, it takes work again; the admin view counts per node."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import httpx

from tests.conftest import EXECBOX, Side, Stack, as_role, wait_until

TOKEN = "d" * 32
OPERATOR = {"Authorization": f"Bearer {TOKEN}"}


def _nodes(client: httpx.Client) -> dict[str, dict[str, Any]]:
    answer = client.get("/v1/admin/nodes", headers=OPERATOR)
    assert answer.status_code == 200, answer.text
    return {node["node"]: node for node in answer.json()}


def _execution(client: httpx.Client, execution_id: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/v1/executions/{execution_id}").json()
    return body


def _run(client: httpx.Client, code: str) -> dict[str, Any]:
    answer = client.post("/v1/executions?wait=60", json={"language": "python", "code": code})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _counted(client: httpx.Client, finished: dict[str, int]) -> dict[str, Any] | None:
    """The nodes' view once each node named has counted `finished` executions, else None."""
    view = _nodes(client)
    return view if all(view.get(node, {}).get("finished") == n for node, n in finished.items()) else None


def _drain(client: httpx.Client, node: str, on: bool) -> dict[str, Any]:
    path = f"/v1/admin/nodes/{node}/drain"
    answer = client.post(path, headers=OPERATOR) if on else client.delete(path, headers=OPERATOR)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    assert body["drained"] is on
    return body


def test_a_drained_node_finishes_its_run_takes_nothing_new_and_takes_work_again_when_undrained(
    stack: Stack, side_stack: Callable[..., Side]
) -> None:
    side = side_stack(EXECBOX_AUTH__ADMIN_TOKEN=TOKEN)
    node_a, node_b = f"{stack.prefix}-node-a", f"{stack.prefix}-node-b"
    side.worker("a", EXECBOX_WORKER__NODE=node_a)
    with side.client() as client:
        wait_until(lambda: len(_nodes(client).get(node_a, {}).get("workers", [])) == 1, 30, "node A's worker")
        # Only A listens yet, so the long run is A's.
        sleeper = {"language": "python", "code": "import time; time.sleep(8); print('finished')"}
        created = client.post("/v1/executions", json=sleeper)
        assert created.status_code == 202, created.text
        long_id = created.json()["id"]
        wait_until(lambda: _execution(client, long_id)["status"] == "running", 30, "the long run to start on A")
        assert _execution(client, long_id)["node"] == node_a
        side.worker("b", EXECBOX_WORKER__NODE=node_b)
        wait_until(lambda: len(_nodes(client).get(node_b, {}).get("workers", [])) == 1, 30, "node B's worker")

        drained = _drain(client, node_a, True)
        assert drained["running"] == 1, drained
        # A's worker is busy; its reaper thread sees the drain at its next look (every second here).
        wait_until(lambda: _nodes(client)[node_a]["draining_workers"] == 1, 10, "A's heartbeat to say draining")
        nodes_of_new = [_run(client, f"print({i})")["node"] for i in range(4)]
        assert nodes_of_new == [node_b] * 4, "everything submitted after the drain runs on B"
        done = client.get(f"/v1/executions/{long_id}?wait=60").json()
        assert (done["status"], done["stdout"], done["node"]) == ("succeeded", "finished\n", node_a)

        # A node's count grows after the execution's terminal transaction (a client may read the
        # result first), so the view is read until the counts arrive.
        view: Any = wait_until(lambda: _counted(client, {node_a: 1, node_b: 4}), 10, "the nodes' finished counts")
        assert (view[node_a]["drained"], view[node_a]["running"]) == (True, 0)
        assert view[node_b]["drained"] is False

        # Undrain A and drain B: the next one must run on A.
        _drain(client, node_a, False)
        _drain(client, node_b, True)
        try:
            assert _run(client, "print('again')")["node"] == node_a, "undrained, A takes work again"
        finally:
            _drain(client, node_b, False)
        wait_until(lambda: _counted(client, {node_a: 2}), 10, "node A's finished count")

        # The same view from the shell, with the admin Redis role.
        listed = subprocess.run([EXECBOX, "nodes", "list"], env=as_role(side.env, "admin"), capture_output=True,
                                text=True, check=True, timeout=30).stdout  # fmt: skip
        line_a = next(line for line in listed.splitlines() if line.startswith(node_a + " "))
        assert "active" in line_a and "finished 2" in line_a, listed


def test_only_the_admin_token_drains_and_a_bad_node_name_is_422(side_stack: Callable[..., Side]) -> None:
    side = side_stack(EXECBOX_AUTH__ADMIN_TOKEN=TOKEN)
    with side.client() as client:  # a tenant's key: known, but not the operator's (403, issue 44)
        assert client.get("/v1/admin/nodes").status_code == 403
        assert client.post("/v1/admin/nodes/some-node/drain").status_code == 403
        answer = client.post("/v1/admin/nodes/bad%20name/drain", headers=OPERATOR)
        assert answer.status_code == 422 and "node" in answer.text, answer.text
        refused = subprocess.run([EXECBOX, "nodes", "drain", "bad name"], env=as_role(side.env, "admin"),
                                 capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        assert refused.returncode == 2 and "not a node name" in refused.stderr
