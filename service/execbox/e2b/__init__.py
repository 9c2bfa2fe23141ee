"""The E2B-compatible facade: an E2B sandbox is an execbox session, reached through E2B's own SDK.

The room owns E2B's vocabulary (templates, sandbox ids and access tokens, envd and code-interpreter
shapes) and translates it onto the sessions and executions rooms: nothing the native API refuses
becomes possible here, and every call is a native session or execution, with its quotas, metrics,
run records and trace ids. docs/e2b.md says what is offered and what is not."""
