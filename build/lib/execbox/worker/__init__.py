"""The worker side: RQ entry point, worker process, reaper."""
