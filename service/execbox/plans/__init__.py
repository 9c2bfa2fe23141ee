"""Plans: the planner-executor on top of executions. A plan (schemas) is validated up front
(validation, refs), run step by step through `executions.submit` (executor), its state kept in
Redis (store), advanced from the execution event stream (consumer); approvals gate steps, and a
failed run hands the agent what a re-planner needs (handoff) until a revision continues it."""
