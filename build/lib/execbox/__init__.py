"""execbox: sandboxed code execution for AI agents."""

__version__ = "0.1.0"
