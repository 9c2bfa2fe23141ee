// E2B's quickstart as a user of the hosted service writes it, with the unmodified JavaScript SDK
// (@e2b/code-interpreter). Pointed at execbox only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL
// (docs/e2b.md); run by tests/integration/test_e2b_node.py. Prints one JSON line with what it
// observed and exits 0, or prints the error and exits 1.
import { Sandbox } from '@e2b/code-interpreter'

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
