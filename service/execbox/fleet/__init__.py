"""The fleet: which workers are alive, and what each one's engine can run (their heartbeats)."""
