"""Executions: the request and public view (schemas), the stored record (record), its store and
state changes (store), submission and cancellation without HTTP (submit), input preparation
(inputs), fair dispatch on the queue (queue), the life after acceptance top to bottom
(lifecycle, with its outputs, outcome and classify steps), waiting for an end (waits) and what
happens at the end (events). Nothing here imports lifecycle: the API imports this room and must
never reach the sandbox."""
