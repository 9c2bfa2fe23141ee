"""The shared core: settings, the error tree, the stable enums, the Redis key schema and seam, the
event stream, metrics definitions, logging and tracing. It imports no feature (docs/architecture.md)."""
