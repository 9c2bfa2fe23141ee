// execbox preloaded Node.js: the launcher starts it in a warm sandbox before any code arrives (the
// same protocol as preload.py). It requires the modules in EXECBOX_PRELOAD_MODULES (none by
// default: the gain is Node's own start, ~0.1 s here), says "r" on fd 4, and waits for its job on
// fd 3 (the program's argv and environment, NUL-separated, the argv count first). If it can run
// the job as a fresh `node main.js` would, it answers "y" and runs main.js as this process's main
// module: still single-use, the sandbox user, every limit of the container. Otherwise it answers
// "n" and exits, and the launcher starts a fresh node.
//
// It declines when the job's environment sets, differently from the one it started with, a
// variable Node reads as it starts (NODE_*, UV_*, OpenSSL's and ICU's, the loader's, the locale,
// TZ, PATH, HOME), or a command other than `node FILE`. One difference stays: an uncaught error's
// stack ends in this file's frames below the program's own.
'use strict';

const fs = require('fs');
const Module = require('module');
const path = require('path');

const READY = '/tmp/.execbox-preloaded';
const STARTUP = /^(NODE_|UV_|ICU_|SSL_|OPENSSL_|LD_|MALLOC_|LC_)/;
const STARTUP_NAMES = new Set(['PATH', 'HOME', 'TZ', 'LANG', 'TMPDIR']);

function readJob() {
  const chunks = [];
  const buffer = Buffer.alloc(1 << 16);
  for (;;) {
    const n = fs.readSync(3, buffer, 0, buffer.length, null);
    if (n === 0) break;
    chunks.push(Buffer.from(buffer.subarray(0, n)));
  }
  const fields = Buffer.concat(chunks).toString('utf8').split('\0');
  const count = Number(fields[0]);
  const env = {};
  for (const pair of fields.slice(1 + count)) {
    const at = pair.indexOf('=');
    if (at > 0) env[pair.slice(0, at)] = pair.slice(at + 1);
  }
  return [fields.slice(1, 1 + count), env];
}

function canRun(argv, env) {
  if (argv.length !== 2 || path.basename(argv[0]) !== 'node' || argv[1].startsWith('-')) return false;
  const names = new Set([...Object.keys(env), ...Object.keys(process.env)]);
  for (const name of names) {
    if ((STARTUP.test(name) || STARTUP_NAMES.has(name)) && env[name] !== process.env[name]) return false;
  }
  return true;
}

function main() {
  for (const name of (process.env.EXECBOX_PRELOAD_MODULES || '').split(',').filter(Boolean)) {
    try {
      require(name);
    } catch (error) {
      // the program requires it again and fails as it would have
    }
  }
  fs.writeFileSync(READY, '');
  fs.writeSync(4, 'r');
  const [argv, env] = readJob();
  fs.unlinkSync(READY);
  if (!canRun(argv, env)) {
    fs.writeSync(4, 'n');
    return;
  }
  fs.writeSync(4, 'y');
  fs.closeSync(3);
  fs.closeSync(4);
  for (const name of Object.keys(process.env)) delete process.env[name];
  Object.assign(process.env, env);
  process.chdir('/workspace');
  process.argv = [process.execPath, path.resolve(argv[1])];
  Module.runMain(); // process.argv[1] as the main module, as `node main.js` loads it
}

main();
