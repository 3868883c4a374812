'use strict'

// The in-sandbox agent's own costs, run by run.js in a child process of its own (`node
// --expose-gc`) so that no other measurement's heap pollutes it:
//   - its resident set size in the sandbox once idle (the host's view of the agent process);
//   - the host's peak RSS growth while one command prints 1 GiB (the addon keeps only the cap's
//     head and tail, and the agent's stream is under flow control, so this must stay small).
// Prints one JSON line: { idleRssBytes, hostGrowthBytes, outputMs, keptBytes } or { error }.

const { execFileSync } = require('node:child_process')

const addon = require('./impl/addon')
const common = require('./impl/common')

const GiB = 1024 ** 3
const SAMPLE_MS = 5

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** The agent's RSS in bytes, with the spare shepherds it keeps ready, as the host's `ps` sees
 * them in the sandbox's container. */
function agentRss(sandboxId) {
  const name = execFileSync('docker', ['ps', '-q', '--filter', `label=trueforge.sandbox.id=${sandboxId}`], {
    encoding: 'utf8',
  }).trim()
  const rows = execFileSync('docker', ['top', name, '-o', 'pid,rss,args'], { encoding: 'utf8' }).split('\n').slice(1)
  // A linked agent is started with `--link <socket>`.
  const agent = rows.find((r) => /trueforge-agent-(x86_64|aarch64)(\s+--link\s+\S+)?\s*$/.test(r))
  if (!agent) throw new Error(`no agent process in ${name}: ${rows.join(' / ')}`)
  const spares = rows.filter((r) => /trueforge-agent-(x86_64|aarch64) shepherd /.test(r))
  return [agent, ...spares].reduce((sum, r) => sum + Number(r.trim().split(/\s+/)[1]) * 1024, 0)
}

async function main() {
  await addon.load()
  const im = addon.create({ name: 'addon (agent probe)', namespace: `${common.ADDON_NAMESPACE}-probe` })
  let id
  try {
    id = await im.createSandbox()
    await im.exec(id, 'true')
    await sleep(2000)
    const idleRssBytes = agentRss(id)
    global.gc()
    await sleep(50)
    global.gc()
    const baseline = process.memoryUsage().rss
    let peak = baseline
    const timer = setInterval(() => {
      peak = Math.max(peak, process.memoryUsage().rss)
    }, SAMPLE_MS)
    const t0 = performance.now()
    const r = await im.exec(id, `head -c ${GiB} /dev/zero`)
    const outputMs = performance.now() - t0
    clearInterval(timer)
    peak = Math.max(peak, process.memoryUsage().rss)
    if (r.exitCode !== 0) throw new Error(`the 1 GiB command exited ${r.exitCode}`)
    console.log(
      JSON.stringify({ idleRssBytes, hostGrowthBytes: peak - baseline, outputMs, keptBytes: r.output.length }),
    )
  } catch (e) {
    console.log(JSON.stringify({ error: String((e && e.message) || e) }))
  } finally {
    if (id) await im.remove(id).catch(() => {})
    await im.cleanup()
  }
}

main().then(() => process.exit(0))
