"""langchain-tests' SandboxIntegrationTests against a live execbox, through ExecboxSandbox.

Run by scripts/conformance (its own virtualenv, pinned versions) against the service at
EXECBOX_URL with the key EXECBOX_API_KEY; nothing here is mocked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from deepagents.backends.protocol import SandboxBackendProtocol
from execbox_client import Client
from execbox_client.deepagents import ExecboxSandbox
from langchain_tests.integration_tests import SandboxIntegrationTests


class TestExecboxSandbox(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    def sandbox(self) -> Iterator[SandboxBackendProtocol]:
        client = Client(os.environ["EXECBOX_URL"], os.environ["EXECBOX_API_KEY"])
        backend = ExecboxSandbox.open(client)
        try:
            yield backend
        finally:
            backend.delete()
            client.close()
