"""Which queue messages a worker runs: only execbox's own job functions, checked before any import.

RQ resolves a job's function (and its success, failure and stopped callbacks) by importing the
dotted path stored in the message, and sends the webhooks a message lists. Whoever can write to
Redis could therefore make a worker, which holds the Docker socket, import and call anything
(`os.system`) or fetch any URL. The gate reads the message as data (the JSON serializer decodes
it without importing anything) and refuses all but the fixed set in `execbox.executions.queue.JOB_FUNCTIONS`
called the way execbox calls them: one JSON object argument, no instance, no callbacks, no webhooks.
"""

from __future__ import annotations

from rq.exceptions import DeserializationError
from rq.job import Job

from execbox.executions.queue import JOB_FUNCTIONS


def refusal(job: Job) -> str | None:
    """Why this message must not run (a bounded label for the metric), or None for one of ours."""
    try:
        name, instance, args, kwargs = job.func_name, job.instance, job.args, job.kwargs
    except DeserializationError:
        return "undecodable"
    if name not in JOB_FUNCTIONS:
        return "function"
    if instance is not None:
        return "instance"
    if any((job._success_callback_name, job._failure_callback_name, job._stopped_callback_name)):
        return "callback"
    if job.webhooks:
        return "webhook"
    if kwargs or len(args) != 1 or not isinstance(args[0], dict):
        return "arguments"
    return None


def disarm(job: Job) -> None:
    """Strip what RQ would act on while recording a refused message as failed (callbacks it would
    import, webhooks it would send, retries that would queue it again)."""
    job._success_callback_name = job._failure_callback_name = job._stopped_callback_name = None
    job.webhooks = []
    job.retries_left = None


def describe(job: Job) -> str:
    """The refused function's name for logs, bounded and never decoded further than the gate did."""
    try:
        return repr(job.func_name)[:200]
    except DeserializationError:
        return "<undecodable>"
