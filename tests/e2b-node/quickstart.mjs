// E2B's quickstart as a user of the hosted service writes it (code with state, a chart, a file
// written, read and listed, commands in the foreground and background, kill), with the unmodified
// JavaScript SDK (@e2b/code-interpreter). Pointed at execbox only by E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL (docs/e2b.md); run by tests/integration/test_e2b_node.py. Prints one JSON line
// with what it observed and exits 0, or prints the error and exits 1.
import { CommandExitError, Sandbox } from '@e2b/code-interpreter'

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

async function main() {
  const sbx = await Sandbox.create({ timeoutMs: 120_000 })
  const observed = { sandboxId: sbx.sandboxId }
  try {
    const set = await sbx.runCode('x = 20')
    observed.setError = set.error ? set.error.name : null
    const sum = await sbx.runCode('x + 22')
    observed.text = sum.text ?? null

    const plot = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()')
    const pngs = plot.results.filter((r) => r.png)
    observed.plotError = plot.error ? plot.error.name : null
    observed.pngCount = pngs.length
    observed.pngIsPng = pngs.length > 0 && Buffer.from(pngs[0].png, 'base64').subarray(0, 8).equals(PNG_SIGNATURE)

    const failed = await sbx.runCode('1/0')
    observed.errorName = failed.error ? failed.error.name : null
    observed.errorValue = failed.error ? failed.error.value : null

    await sbx.files.write('/home/user/hello.txt', 'hello from node')
    observed.fileText = await sbx.files.read('/home/user/hello.txt')
    const entries = await sbx.files.list('/home/user')
    observed.listedHello = entries.some((entry) => entry.name === 'hello.txt')

    const cat = await sbx.commands.run('cat /home/user/hello.txt && echo done')
    observed.commandExitCode = cat.exitCode
    observed.commandStdout = cat.stdout

    try {
      await sbx.commands.run('exit 3')
      observed.failedCommand = 'resolved'
    } catch (error) {
      observed.failedCommand = error instanceof CommandExitError ? 'CommandExitError' : String(error)
      observed.failedExitCode = error instanceof CommandExitError ? error.exitCode : null
    }

    const sleeper = await sbx.commands.run('sleep 30', { background: true })
    const running = await sbx.commands.list()
    observed.backgroundListed = running.some((command) => command.pid === sleeper.pid)
    observed.backgroundKilled = await sbx.commands.kill(sleeper.pid)
    try {
      await sleeper.wait()
      observed.backgroundEnd = 'exited 0'
    } catch (error) {
      observed.backgroundEnd = error instanceof CommandExitError ? 'CommandExitError' : String(error)
    }
    const after = await sbx.commands.list()
    observed.backgroundListedAfterKill = after.some((command) => command.pid === sleeper.pid)
  } finally {
    observed.killed = await sbx.kill()
  }
  observed.killedAgain = await Sandbox.kill(observed.sandboxId)
  return observed
}

try {
  console.log(JSON.stringify(await main()))
  process.exit(0)
} catch (error) {
  console.error(error)
  process.exit(1)
}
