"""Sandbox runtimes: run one program in one fresh, locked-down container."""

from execbox.sandbox.runtime import ContainerInfo, Runtime, SandboxControl, SandboxOutcome, SandboxSpec

__all__ = ["ContainerInfo", "Runtime", "SandboxControl", "SandboxOutcome", "SandboxSpec"]
