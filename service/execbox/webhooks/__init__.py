"""Webhooks: signed delivery of finished executions, a durable consumer of the execution events."""
