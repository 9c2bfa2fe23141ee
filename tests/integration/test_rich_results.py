"""Rich results of one-shot Python runs (sessions have theirs in test_sessions): the last
expression's value, display() and plt.show(), while the program still runs as `python3 main.py`."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import run_code

pytestmark = [pytest.mark.docker, pytest.mark.redis]


def test_the_last_expression_a_display_and_a_figure_come_back_as_results(api: httpx.Client) -> None:
    done = run_code(api, "import execbox\nimport pandas as pd\nimport matplotlib.pyplot as plt\n"
                         "execbox.display(pd.Series([1, 2]))\nplt.plot([3, 1, 2])\nplt.show()\n"
                         "pd.DataFrame({'a': [1, 2], 'b': [3, 4]})\n")  # fmt: skip
    assert done["status"] == "succeeded", done
    kinds = [r["kind"] for r in done["results"]]
    assert kinds == ["display_data", "display_data", "execute_result"], "in the order shown"
    frame = done["results"][2]["data"]
    assert "<table" in frame["text/html"]["text"] and "a  b" in frame["text/plain"]["text"]
    png = done["results"][1]["data"]["image/png"]
    assert api.get(png["url"]).content.startswith(b"\x89PNG\r\n\x1a\n")
    assert done["artifacts"] == [], "results are not artifacts"


def test_a_program_still_runs_as_python3_main_py(api: httpx.Client) -> None:
    done = run_code(api, "import sys, os\nif __name__ == '__main__':\n    print(sys.argv, __file__, sys.path[0])\n")
    assert done["stdout"] == "['main.py'] /workspace/main.py /workspace\n", done
    assert done["results"] == [], "print() returns None: nothing to show"
    failed = run_code(api, "def f():\n    raise ValueError('boom')\nf()\n")
    error = failed["error"]
    assert error["category"] == "code.exception" and error["details"]["type"] == "ValueError", error
    assert 'File "/workspace/main.py", line 2, in f' in failed["stderr"]
    assert "oneshot" not in failed["stderr"], "the runner's own frames are not shown"
    syntax = run_code(api, "def broken(:\n")
    assert syntax["error"]["category"] == "code.syntax" and "oneshot" not in syntax["stderr"], syntax
    leaving = run_code(api, "import sys\nsys.exit(4)\n")
    assert leaving["exit_code"] == 4 and leaving["error"]["category"] == "code.exit_nonzero"


def test_results_come_back_beside_globbed_outputs(api: httpx.Client) -> None:
    request = {"language": "python", "code": "open('report.txt', 'w').write('r')\n6 * 7\n",
               "outputs": {"files": ["*.txt"]}}  # fmt: skip
    done = api.post("/v1/executions?wait=60", json=request).json()
    assert [a["name"] for a in done["artifacts"]] == ["report.txt"], done
    assert done["results"][0]["data"]["text/plain"]["text"] == "42"
