// execbox: talk back to the service from inside a sandbox. const execbox = require("execbox");
// execbox.inputs, execbox.outputDir, execbox.emit(name, value), execbox.check(cond, message, details),
// execbox.idempotencyKey() (the key to forward, the same on every attempt), execbox.outcomeUnknown(reason)
// (stop: whether the effect happened is unknown) and execbox.context (run_id, step_id, attempt, idempotency_key)
"use strict";
const fs = require("fs");
const path = require("path");

const outputDir = process.env.EXECBOX_OUTPUT_DIR || "/workspace/out";
const resultFile = process.env.EXECBOX_RESULT_FILE || path.join(outputDir, ".execbox", "result.json");
const inputsFile = process.env.EXECBOX_INPUTS_FILE || "/workspace/.execbox/inputs.json";
const state = { outputs: {}, check: null };

function readContext() {
  // Read at each use: a session's JavaScript context loads this module once and runs many calls.
  const found = {};
  for (const name of ["run_id", "step_id", "attempt", "idempotency_key"]) {
    const value = process.env["EXECBOX_" + name.toUpperCase()];
    if (value !== undefined) found[name] = value;
  }
  return found;
}

function idempotencyKey() {
  // Read now, not at load: a session's JavaScript context loads this once and runs many calls.
  const key = process.env.EXECBOX_IDEMPOTENCY_KEY;
  return key === undefined ? null : key;
}

function loadInputs() {
  try {
    return JSON.parse(fs.readFileSync(inputsFile, "utf8"));
  } catch (err) {
    if (err.code === "ENOENT") return null;
    throw err;
  }
}

function save() {
  fs.mkdirSync(path.dirname(resultFile), { recursive: true });
  const partial = resultFile + ".partial";
  fs.writeFileSync(partial, JSON.stringify(state));
  fs.renameSync(partial, resultFile);
}

function emit(name, value) {
  if (typeof name !== "string" || !name) throw new TypeError("emit() needs a non-empty string name");
  JSON.stringify(value);
  state.outputs[name] = value;
  save();
}

function check(condition, message, details = {}) {
  if (condition) return;
  state.check = { message: String(message), details };
  save();
  process.exit(1);
}

function outcomeUnknown(reason) {
  state.check = { message: String(reason), details: {}, outcome_unknown: true };
  save();
  process.exit(1);
}

module.exports = { inputs: loadInputs(), outputDir, emit, check, idempotencyKey, outcomeUnknown };
Object.defineProperty(module.exports, "context", { get: readContext, enumerable: true });
