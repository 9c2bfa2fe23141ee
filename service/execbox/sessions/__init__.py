"""Sessions: one sandbox held for one tenant for a bounded time, whose workspace and (for Python)
interpreter persist across the executions sent to it, one at a time, in submission order."""
