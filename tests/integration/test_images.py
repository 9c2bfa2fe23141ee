"""The sandbox images as users meet them: current runtimes, the data stack, TypeScript, R (the
operator-added language), the python@slim variant and the policy that gates it, and the versions
GET /v1/languages reports against what the images really hold."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ROOT, Side, run_code

pytestmark = [pytest.mark.docker, pytest.mark.redis]

# The packages issue 19 names (import names), every one in the default python image.
DATA_STACK = ["numpy", "pandas", "scipy", "sklearn", "matplotlib", "seaborn", "statsmodels", "tabulate",
              "openpyxl", "pyarrow", "sympy", "PIL", "requests", "httpx", "bs4", "lxml", "networkx", "duckdb",
              "IPython"]  # fmt: skip


def test_the_default_python_imports_the_data_stack_on_a_current_interpreter(api: httpx.Client) -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {DATA_STACK!r}:\n"
        "    importlib.import_module(name)\n"
        "import pandas as pd\n"
        "frame = pd.DataFrame({'team': ['a', 'b', 'a'], 'points': [1, 2, 3]})\n"
        "print(frame.groupby('team').sum().to_markdown())\n"
        "print(sys.version_info >= (3, 12))\n"
    )
    body = run_code(api, code, memory_mb=1024, timeout_s=60)
    assert body["status"] == "succeeded", body["stderr"]
    *table, newer = body["stdout"].strip().splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    assert rows[0] == ["team", "points"] and rows[2:] == [["a", "4"], ["b", "2"]]
    assert newer == "True"


def test_node_is_a_current_lts_and_typescript_runs_with_its_types(api: httpx.Client) -> None:
    node = run_code(api, "console.log(process.versions.node)", language="javascript")
    assert int(node["stdout"].split(".")[0]) >= 20
    typed = "interface Point { x: number; y: number }\nconst p: Point = {x: 2, y: 3};\nconsole.log(p.x * p.y);"
    body = run_code(api, typed, language="typescript")
    assert (body["status"], body["stdout"]) == ("succeeded", "6\n"), body["stderr"]
    assert run_code(api, "const x: number = ;", language="ts")["error"]["category"] == "code.syntax"
    thrown = run_code(api, "function f(n: number): never { throw new RangeError(`bad ${n}`) }\nf(1);", language="ts")
    assert thrown["error"]["category"] == "code.exception"
    assert (thrown["error"]["details"]["type"], thrown["error"]["details"]["message"]) == ("RangeError", "bad 1")
    assert "main.ts" in thrown["stderr"]  # the source map points into the submitted file


def test_r_runs_end_to_end_with_the_categories_that_apply(api: httpx.Client) -> None:
    out = 'file.path(Sys.getenv("EXECBOX_OUTPUT_DIR"), "r.txt")'
    code = f'x <- c(3, 4)\ncat(sqrt(sum(x^2)), "\\n")\nwriteLines("done", {out})'
    ok = run_code(api, code, language="r")
    assert (ok["status"], ok["stdout"]) == ("succeeded", "5 \n"), (ok["error"], ok["stderr"])
    assert [a["name"] for a in ok["artifacts"]] == ["r.txt"]
    stopped = run_code(api, 'f <- function() stop("boom")\nf()', language="r")["error"]
    assert (stopped["category"], stopped["details"]["message"]) == ("code.exception", "boom")
    assert run_code(api, "x <- (1 +", language="r")["error"]["category"] == "code.syntax"
    assert run_code(api, "x <- 1 2", language="rscript")["error"]["category"] == "code.syntax"
    assert run_code(api, "q(status = 3)", language="r")["error"]["category"] == "code.exit_nonzero"
    assert run_code(api, "Sys.sleep(30)", language="r", timeout_s=1)["error"]["category"] == "limit.timeout"
    big = run_code(api, "x <- numeric(4e8)\nx[] <- 1\ncat(length(x))", language="r", memory_mb=128)
    assert big["error"]["category"] == "limit.memory"
    flood = run_code(api, 'repeat cat(strrep("x", 1000), "\\n")', language="r", output_bytes=4096)
    assert flood["error"]["category"] == "limit.output"


def test_a_variant_runs_where_the_policy_allows_it(api: httpx.Client) -> None:
    code = "import sys, importlib.util\nprint(sys.version_info >= (3, 12), importlib.util.find_spec('numpy'))"
    slim = run_code(api, code, language="python@slim")
    assert (slim["status"], slim["stdout"], slim["language"]) == ("succeeded", "True None\n", "python@slim")
    assert run_code(api, "import numpy", language="py@slim")["error"]["category"] == "code.exception"
    unknown = api.post("/v1/executions", json={"language": "python@gpu", "code": "1"})
    assert unknown.status_code == 422 and unknown.json()["errors"][0]["field"] == "language"


def test_a_variant_the_policy_does_not_allow_is_refused_with_the_field(
    side_stack: Callable[..., Side], tmp_path: Path
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(ROOT / "policies", policies)
    default = yaml.safe_load((policies / "default.yaml").read_text())
    (policies / "default.yaml").write_text(yaml.safe_dump({**default, "variants": []}))
    side = side_stack(EXECBOX_POLICIES_DIR=str(policies))
    with side.client() as client:
        refused = client.post("/v1/executions", json={"language": "python@slim", "code": "print(1)"})
        assert refused.status_code == 422, refused.text
        (problem,) = refused.json()["errors"]
        assert problem["field"] == "language" and "variants" in problem["message"]
        opened = client.post("/v1/sessions", json={"language": "python@slim"})
        assert opened.status_code == 422 and opened.json()["errors"][0]["field"] == "language"
        # The language's default image needs no permission.
        assert client.post("/v1/executions", json={"language": "python", "code": "print(1)"}).status_code == 202


def test_languages_report_the_versions_the_images_really_hold(api: httpx.Client) -> None:
    listed = {lang["name"]: lang for lang in api.get("/v1/languages").json()["languages"]}
    assert {"python", "python@slim", "javascript", "typescript", "bash", "r"} <= set(listed)
    assert all(lang["runtime"] and lang["packages"] for lang in listed.values())
    python = api.get("/v1/languages/py").json()
    assert python == listed["python"] and python["variant"] is None and python["sessions"] is True
    said = run_code(api, "import platform, numpy, pandas, json\nprint(json.dumps([platform.python_version(), "
                    "numpy.__version__, pandas.__version__]))")  # fmt: skip
    version, numpy, pandas = json.loads(said["stdout"])
    assert python["runtime"] == {"name": "CPython", "version": version}
    assert (python["packages"]["numpy"], python["packages"]["pandas"]) == (numpy, pandas)
    node = run_code(api, "console.log(process.versions.node)", language="javascript")["stdout"].strip()
    assert listed["javascript"]["runtime"]["version"] == node == listed["typescript"]["runtime"]["version"]
    r = run_code(api, 'cat(paste(R.version$major, R.version$minor, sep = "."))', language="r")["stdout"]
    assert listed["r"]["runtime"] == {"name": "R", "version": r}
    bash = run_code(api, 'echo "${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}.${BASH_VERSINFO[2]}"', language="bash")
    assert listed["bash"]["runtime"]["version"] == bash["stdout"].strip()
    missing = api.get("/v1/languages/cobol")
    assert missing.status_code == 404 and missing.json()["code"] == "language.not_found"
