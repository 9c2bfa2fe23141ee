'use strict';
// execbox: one JavaScript context of a session, started by the session kernel (kernel.py) on its
// first cell and kept until the session ends or its kernel restarts.
//
// Each line on stdin is a cell, {"code", "env"}. The code runs as a script in this process's own
// global context, so what one cell declares at its top level (var, let, const, function, class)
// the next one sees, as in Node's REPL; `require` resolves from the working directory. A cell
// whose last expression is a promise waits for it. A cell using `await` outside a function runs as
// the body of an async function instead: it may await, and its declarations stay inside it.
//
// Nothing of a cell runs on after it, as for every execbox call: the kernel stops this process
// (SIGSTOP) once the cell is answered, and the timers it set (setTimeout, setInterval,
// setImmediate, through the globals or node:timers) are cleared when it ends, so that they do not
// fire in the next cell. The answer carries the request's nonce ("n").
//
// console output is the cell's stdout and stderr (the kernel's, inherited). When the cell is over
// this process writes one JSON line on the fd named by its argument: {"status": 0 or 1, "result":
// the last value as util.inspect shows it, or null}. An uncaught error is written to stderr as
// Node writes one (its stack), which is how the service names it. SIGINT (the kernel's interrupt)
// stops a running cell, or the promise it waits for, and never this process.
const fs = require('node:fs');
const path = require('node:path');
const readline = require('node:readline');
const util = require('node:util');
const vm = require('node:vm');
const { createRequire } = require('node:module');

const answers = Number(process.argv[2]);
const TOP_LEVEL_AWAIT = /await is only valid in async functions and the top level bodies of modules/;

process.on('SIGHUP', () => {}); // never this process's end: the kernel's SIGKILL is
let interrupted = null; // rejects the promise a cell waits for when SIGINT arrives
process.on('SIGINT', () => {
  if (interrupted !== null) interrupted(new Error('Script execution was interrupted by `SIGINT`'));
});
// A callback of an earlier cell that throws reports on stderr and leaves the context as it was.
process.on('uncaughtException', (err) => report(err));
process.on('unhandledRejection', (err) => report(err));

const OWN_FRAMES = /\(?(node:vm|node:internal|node:events|.*js_context\.js)|sigintHandlersWrap/;

const timers = new Set(); // [clear, handle] of every timer set since the last cell ended
const timersModule = require('node:timers');
for (const [make, clear] of [['setTimeout', 'clearTimeout'], ['setInterval', 'clearInterval'],
  ['setImmediate', 'clearImmediate']]) {
  const original = timersModule[make];
  const cancel = timersModule[clear];
  const tracked = function (...args) {
    const handle = original.apply(this, args);
    timers.add([cancel, handle]);
    return handle;
  };
  globalThis[make] = tracked;
  timersModule[make] = tracked; // require('node:timers') and require('timers') are this object
}

function clearTimers() {
  for (const [cancel, handle] of timers) cancel(handle);
  timers.clear();
}

function report(err) {
  const text = err instanceof Error && err.stack ? err.stack : 'Uncaught ' + util.inspect(err);
  const lines = text.split('\n').filter((line) => !(/^\s+at /.test(line) && OWN_FRAMES.test(line)));
  process.stderr.write(lines.join('\n') + '\n');
}

function compile(code) {
  try {
    return new vm.Script(code, { filename: 'cell.js' });
  } catch (err) {
    if (!(err instanceof SyntaxError) || !TOP_LEVEL_AWAIT.test(err.message)) throw err;
    return new vm.Script('(async () => {\n' + code + '\n})()', { filename: 'cell.js', lineOffset: -1 });
  }
}

async function run(code) {
  globalThis.require = createRequire(path.join(process.cwd(), 'cell.js'));
  let value = compile(code).runInThisContext({ breakOnSigint: true, displayErrors: false });
  if (value !== null && typeof value === 'object' && typeof value.then === 'function') {
    value = await Promise.race([value, new Promise((_, reject) => (interrupted = reject))]);
  }
  return value === undefined ? null : util.inspect(value, { depth: 4, maxArrayLength: 200, breakLength: 100 });
}

async function main() {
  const cells = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of cells) {
    let request;
    try {
      request = JSON.parse(line);
    } catch {
      continue;
    }
    const env = request && typeof request.env === 'object' && request.env !== null ? request.env : {};
    const saved = {};
    for (const [name, value] of Object.entries(env)) {
      saved[name] = process.env[name];
      process.env[name] = String(value);
    }
    let answer = { status: 0, result: null };
    try {
      answer.result = await run(String(request.code ?? ''));
    } catch (err) {
      report(err);
      answer = { status: 1, result: null };
    } finally {
      interrupted = null;
      clearTimers();
      for (const [name, value] of Object.entries(saved)) {
        if (value === undefined) delete process.env[name];
        else process.env[name] = value;
      }
    }
    answer.n = request.n;
    fs.writeSync(answers, JSON.stringify(answer) + '\n');
  }
  process.exit(0);
}

main();
