"""Files in, artifacts out, declared outputs, checks and expectations (real Docker, real Redis)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.redis]

ANALYSIS = """
import execbox, pandas as pd, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from pathlib import Path

out = Path(execbox.output_dir)
df = pd.read_csv("data/sales.csv")
print("rows", len(df))
(out / "log.txt").write_text(f"read {len(df)} rows\\n")
execbox.check({"region", "amount"} <= set(df.columns), "sales.csv lacks the expected columns",
              expected=["region", "amount"], found=sorted(df.columns))
totals = df.groupby("region")["amount"].agg(["sum", "mean", "count"]).sort_values("sum", ascending=False)
ax = totals["sum"].plot.bar()
ax.figure.savefig(out / "chart.png")
(out / "summary.md").write_text("# Sales by region\\n\\n" + totals.to_string())
execbox.emit("top", {"region": totals.index[0], "sum": round(float(totals["sum"].iloc[0]), 2)})
"""


def make_csv(rows: int, columns: tuple[str, str] = ("region", "amount")) -> tuple[bytes, dict[str, float]]:
    rng = random.Random(7)
    totals: dict[str, float] = defaultdict(float)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for _ in range(rows):
        region = rng.choice(["north", "south", "east", "west"])
        amount = round(rng.uniform(1, 500), 2)
        totals[region] += amount
        writer.writerow((region, amount))
    return buffer.getvalue().encode(), dict(totals)


def upload(api: httpx.Client, name: str, data: bytes) -> dict[str, Any]:
    response = api.post("/v1/files", files={"file": (name, data, "text/csv")})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    assert body["size"] == len(data) and body["sha256"] == hashlib.sha256(data).hexdigest()
    return body


def execute(api: httpx.Client, **request: Any) -> dict[str, Any]:
    response = api.post("/v1/executions?wait=60", json={"language": "python", **request})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def artifact(body: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [a for a in body["artifacts"] if a["name"] == name]
    assert found, f"no artifact {name}: {body['artifacts']} / not kept {body['artifacts_not_kept']}"
    return found[0]


def download(api: httpx.Client, item: dict[str, Any]) -> bytes:
    response = api.get(item["url"])
    assert response.status_code == 200, response.text
    assert hashlib.sha256(response.content).hexdigest() == item["sha256"]
    assert len(response.content) == item["size"] and response.headers["etag"] == f'"{item["sha256"]}"'
    return response.content


def test_analysis_agent_end_to_end(api: httpx.Client) -> None:
    data, totals = make_csv(3000)
    uploaded = upload(api, "sales.csv", data)
    # Cold pandas, matplotlib and a chart: the default 10 s was once not enough on a busy 2-core CI host.
    body = execute(api, code=ANALYSIS, files=[{"path": "data/sales.csv", "file_id": uploaded["id"]}],
                   policy={"timeout_s": 40})  # fmt: skip
    assert body["status"] == "succeeded", body["error"]
    assert body["error"] is None and "rows 3000" in body["stdout"]
    top = max(totals, key=lambda region: totals[region])
    assert body["outputs"]["top"] == {"region": top, "sum": round(totals[top], 2)}
    chart = download(api, artifact(body, "chart.png"))
    assert chart.startswith(b"\x89PNG") and artifact(body, "chart.png")["media_type"] == "image/png"
    summary = download(api, artifact(body, "summary.md")).decode()
    assert summary.startswith("# Sales by region") and top in summary
    assert {a["name"] for a in body["artifacts"]} == {"chart.png", "summary.md", "log.txt"}


def test_changed_columns_fail_the_check_and_keep_everything_else(api: httpx.Client) -> None:
    data, _ = make_csv(500, columns=("area", "value"))
    body = execute(
        api, code=ANALYSIS, files=[{"path": "data/sales.csv", "content_b64": base64.b64encode(data).decode()}]
    )
    assert body["status"] == "failed"
    error = body["error"]
    assert error["category"] == "check.failed" and error["retryable"] is False
    assert error["details"]["message"] == "sales.csv lacks the expected columns"
    assert error["details"]["details"] == {"expected": ["region", "amount"], "found": ["area", "value"]}
    assert "rows 500" in body["stdout"]
    assert download(api, artifact(body, "log.txt")) == b"read 500 rows\n"
    assert body["outputs"] == {}


def test_links_in_output_dir_are_never_followed(api: httpx.Client) -> None:
    code = """
import os
os.symlink("/etc/passwd", "out/passwd")
os.symlink("/workspace/main.py", "out/code")
os.symlink("..", "out/up")
for target, name in (("/etc/passwd", "hard-etc"), ("data/in.txt", "hard-input")):
    try:
        os.link(target, "out/" + name)
        print("linked", name)
    except OSError as exc:
        print("refused", name, exc.errno)
open("out/plain.txt", "w").write("mine")
"""
    body = execute(api, code=code, files=[{"path": "data/in.txt", "content_b64": base64.b64encode(b"input").decode()}])
    assert body["status"] == "succeeded", body
    assert "refused hard-etc 18" in body["stdout"]  # EXDEV: /etc is another filesystem
    assert "refused hard-input 1" in body["stdout"]  # EPERM: inputs are root's, protected_hardlinks
    assert [a["name"] for a in body["artifacts"]] == ["plain.txt"]
    skipped = {item["name"]: item["reason"] for item in body["artifacts_not_kept"]}
    assert skipped == {"passwd": "symlink", "code": "symlink", "up": "symlink"}
    passwd = Path("/etc/passwd").read_bytes()
    for item in body["artifacts"]:
        assert download(api, item) != passwd


@pytest.mark.parametrize(
    "path",
    [
        "../escape.txt",
        "/etc/cron.d/x",
        "a/../../b",
        "a//b",
        "./a",
        "a\x00b",
        ".execbox/inputs.json",
        "out/.execbox/result.json",
        "a\\b",
    ],
)
def test_traversal_input_paths_are_refused(api: httpx.Client, path: str) -> None:
    response = api.post(
        "/v1/executions",
        json={"language": "python", "code": "print(1)", "files": [{"path": path, "content_b64": "eA=="}]},
    )
    assert response.status_code == 422, response.text
    assert "files.0.path" in {e["field"] for e in response.json()["errors"]}


def test_traversal_multipart_filename_is_refused(api: httpx.Client) -> None:
    response = api.post(
        "/v1/executions",
        data={"request": json.dumps({"language": "python", "code": "print(1)"})},
        files=[("files", ("../../etc/evil", b"x"))],
    )
    assert response.status_code == 422, response.text


def test_multipart_execution_with_files(api: httpx.Client) -> None:
    request = {"language": "python", "code": "print(open('a/b.txt').read() + open('c.bin', 'rb').read().hex())"}
    response = api.post(
        "/v1/executions?wait=60",
        data={"request": json.dumps(request)},
        files=[("files", ("a/b.txt", b"hello ")), ("files", ("c.bin", b"\x00\x01"))],
    )
    assert response.status_code == 200, response.text
    assert response.json()["stdout"] == "hello 0001\n"


def test_artifact_caps_give_limit_artifacts_with_lists(api: httpx.Client) -> None:
    code = (
        "for i in range(5):\n    open(f'out/f{i}.txt', 'w').write('x' * (i * 100))\n"
        "open('out/big.bin', 'wb').write(b'y' * 5000)\n"
    )
    body = execute(api, code=code, policy={"artifact_files": 3, "artifact_file_bytes": 4096})
    assert body["status"] == "failed"
    error = body["error"]
    assert error["category"] == "limit.artifacts"
    kept = error["details"]["kept"]
    not_kept = {item["name"]: item["reason"] for item in error["details"]["not_kept"]}
    assert len(kept) == 3 and set(kept) | set(not_kept) == {"f0.txt", "f1.txt", "f2.txt", "f3.txt", "f4.txt", "big.bin"}
    assert "larger than 4096" in not_kept["big.bin"]
    assert {a["name"] for a in body["artifacts"]} == set(kept)
    assert {a["name"] for a in body["artifacts_not_kept"]} == set(not_kept)


def test_input_caps_are_422(api: httpx.Client) -> None:
    big = base64.b64encode(b"z" * 2048).decode()
    response = api.post(
        "/v1/executions",
        json={
            "language": "python",
            "code": "print(1)",
            "policy": {"input_file_bytes": 1024},
            "files": [{"path": "big.txt", "content_b64": big}],
        },
    )
    assert response.status_code == 422 and response.json()["code"] == "request.policy_exceeded"
    assert "files.0" in {e["field"] for e in response.json()["errors"]}
    many = [{"path": f"f{i}", "content_b64": "eA=="} for i in range(4)]
    response = api.post(
        "/v1/executions", json={"language": "python", "code": "print(1)", "policy": {"input_files": 3}, "files": many}
    )
    assert response.status_code == 422 and "files" in {e["field"] for e in response.json()["errors"]}
    response = api.post(
        "/v1/executions",
        json={"language": "python", "code": "print(1)", "files": [{"path": "x", "file_id": "file_" + "a" * 26}]},
    )
    assert response.status_code == 422 and "files.0.file_id" in {e["field"] for e in response.json()["errors"]}


def test_expectations_name_each_unmet_one(api: httpx.Client) -> None:
    code = "import execbox\nexecbox.emit('count', 'three')\n"
    body = execute(
        api,
        code=code,
        expect={
            "artifacts": ["report.md"],
            "outputs_schema": {
                "type": "object",
                "required": ["count", "total"],
                "properties": {"count": {"type": "integer"}},
            },
        },
    )
    assert body["status"] == "failed" and body["error"]["category"] == "output.invalid"
    unmet = body["error"]["details"]["unmet"]
    assert any("report.md" in u for u in unmet)
    assert any("'total' is a required property" in u for u in unmet)
    assert any(u.startswith("outputs.count:") for u in unmet)


def test_expected_exit_code_is_success(api: httpx.Client) -> None:
    assert execute(api, code="import sys\nsys.exit(3)", expect={"exit_code": 3})["status"] == "succeeded"
    body = execute(api, code="print('ok')", expect={"exit_code": 3})
    assert body["error"]["category"] == "output.invalid" and "exit code was 0, expected 3" in body["error"]["message"]


def test_inputs_stdin_and_globs(api: httpx.Client) -> None:
    code = (
        "import execbox, sys\ndata = sys.stdin.read()\nopen('report.md', 'w').write(data.upper())\n"
        "open('notes.txt', 'w').write('not wanted')\nexecbox.emit('n', execbox.inputs['n'] * 2)\n"
    )
    body = execute(api, code=code, stdin="hello", inputs={"n": 21}, outputs={"files": ["*.md"]})
    assert body["status"] == "succeeded", body["error"]
    assert body["outputs"] == {"n": 42}
    assert [a["name"] for a in body["artifacts"]] == ["report.md"]
    assert download(api, body["artifacts"][0]) == b"HELLO"


def test_binary_stdin_and_stdout_stay_exact(api: httpx.Client) -> None:
    raw = bytes(range(256))
    body = execute(
        api,
        code="import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])",
        stdin_b64=base64.b64encode(raw).decode(),
    )
    assert body["stdout_encoding"] == "base64"
    assert base64.b64decode(body["stdout"]) == raw[::-1]
    text = execute(api, code="print('héllo ✓')")
    assert text["stdout_encoding"] == "utf-8" and text["stdout"] == "héllo ✓\n"


def test_large_emitted_value_becomes_artifact(api: httpx.Client) -> None:
    body = execute(api, code="import execbox\nexecbox.emit('big', list(range(50000)))\nexecbox.emit('small', 1)")
    assert body["status"] == "succeeded", body["error"]
    assert body["outputs"]["small"] == 1
    ref = body["outputs"]["big"]["artifact"]
    assert json.loads(download(api, artifact(body, ref))) == list(range(50000))


def test_javascript_helper_emits_and_checks(api: httpx.Client) -> None:
    code = "const execbox = require('execbox');\nexecbox.emit('sum', execbox.inputs.a + execbox.inputs.b);\n"
    body = execute(api, language="javascript", code=code, inputs={"a": 2, "b": 3})
    assert body["status"] == "succeeded", body["error"]
    assert body["outputs"] == {"sum": 5}
    failed = execute(api, language="javascript", code="require('execbox').check(false, 'nope', {k: 1});")
    assert failed["error"]["category"] == "check.failed" and failed["error"]["details"]["details"] == {"k": 1}


def test_printing_cannot_forge_outputs(api: httpx.Client) -> None:
    code = 'print(\'{"outputs": {"top": "forged"}, "check": null}\')'
    body = execute(api, code=code)
    assert body["status"] == "succeeded" and body["outputs"] == {}


def test_bash_helper_emits_and_fails(api: httpx.Client) -> None:
    code = (
        'source execbox.sh\nn=$(jq .n "$EXECBOX_INPUTS_FILE")\nexecbox_emit double "$((n * 2))"\n'
        'echo hi > "$EXECBOX_OUTPUT_DIR/a.txt"\n'
    )
    body = execute(api, language="bash", code=code, inputs={"n": 4})
    assert body["status"] == "succeeded", body["error"]
    assert body["outputs"] == {"double": 8} and [a["name"] for a in body["artifacts"]] == ["a.txt"]
    failed = execute(api, language="bash", code='source execbox.sh\nexecbox_fail "no data" \'{"rows": 0}\'')
    assert failed["error"]["category"] == "check.failed"
    assert failed["error"]["details"] == {"message": "no data", "details": {"rows": 0}}
