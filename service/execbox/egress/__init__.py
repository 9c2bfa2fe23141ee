"""Network egress for allowlisted executions: rules (pure), the asyncio proxy, its process."""
