"""Network egress for allowlisted executions: rules (pure), sealed secrets (sealing), what the
egress path keeps in Redis (store), the asyncio proxy (proxy) and its process (main)."""
