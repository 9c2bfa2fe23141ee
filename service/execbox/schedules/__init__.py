"""Schedules: a script fired on a cron calendar in a time zone (calendar), kept in Redis (store),
fired exactly once per slot by any number of scheduler threads (scheduler)."""
