"""Executions: the request and public view (schemas), the stored record (record), its store and
state changes (store), submission and cancellation without HTTP (submit), input preparation
(inputs), fair dispatch on the queue (queue), waiting for an end (waits) and what happens at the
end (events)."""
