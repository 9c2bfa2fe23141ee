"""The worker process: RQ entry point and job gate (main, gate), one job's run (tasks), turning a
run's outcome into the record (results, classify), what a process builds once (context), and the
reaper (expiries, lost workers, orphaned containers, heartbeats)."""
