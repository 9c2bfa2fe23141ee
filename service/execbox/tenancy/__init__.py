"""Tenants: API keys (apikeys), quotas and the admission counters behind them (quotas)."""
