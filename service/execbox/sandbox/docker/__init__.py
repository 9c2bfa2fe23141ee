"""The Docker runtime, split by job: container settings (hostconfig), the run's lifecycle
(runtime), its output (capture), per-run egress networks (networks), deferred clean-up (cleanup)
and the engine's error mapping (engine). The only package that imports the docker SDK."""

from execbox.sandbox.docker.runtime import DockerRuntime

__all__ = ["DockerRuntime"]
