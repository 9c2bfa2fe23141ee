"""Sandbox runtimes: run one program in one fresh, locked-down container."""

from execbox.sandbox.runtime import ContainerInfo, RunControl, RunOutcome, RunSpec, Runtime

__all__ = ["ContainerInfo", "RunControl", "RunOutcome", "RunSpec", "Runtime"]
