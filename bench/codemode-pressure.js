#!/usr/bin/env node
'use strict'

// Code Mode under pressure: what hostile sandboxes can make the host process hold, and how long
// they can hold its event loop. For 1, 4 and 16 sandboxes, each sends requests dense in values
// (empty objects, 21 times their bytes in V8's heap): one of 60 MiB of text (1.3 GiB of values,
// refused) and two that just fit the sandbox's bound, to a tool that keeps each for 3 s; then the
// same with a 1 s timeout and a tool that keeps each for 4 s (callers that stop waiting while
// the tool holds on). The host side runs in a process of its own
// (__test__/fixtures/codemode-host.js), whose resident memory, heap and event-loop delay are
// sampled every 5 ms.
//
//   node bench/codemode-pressure.js [counts]      counts: comma list, default 1,4,16
//
// Prints one JSON object: { image, bounds, runs: [{ sandboxes, scenario, boundMiB, rssGrowthMiB,
// heapGrowthMiB, ratio, maxStallMs, stall: { runMs, waitMs }, gcMs, dispatched, refused, timedOut, unroomed }] }.

const { spawn, execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')
const readline = require('node:readline')

const { DockerSandboxProvider } = require('..')

const MiB = 1024 * 1024
const IMAGE = process.env.BENCH_CM_IMAGE || 'trueforge-sandbox-debian:12'
const NAMESPACE = `bench-cmp-${process.pid}`
const HOST = path.join(__dirname, '..', '__test__', 'fixtures', 'codemode-host.js')
const CLIENT = fs.readFileSync(path.join(__dirname, '..', '__test__', 'fixtures', 'codemode-client.py'), 'utf8')
const SANDBOX_BOUND = 64 * MiB
const PROVIDER_BOUND = 256 * MiB
// 950,000 empty objects: 2.7 MiB of text, about 61 MiB of values, just under the sandbox's bound.
const FITS = 950_000

const SCENARIOS = {
  held: {
    job: { delayMs: 3000, requestTimeoutSeconds: 600 },
    spec: [
      { tool: 'dense', size: 0, dense: 20 * MiB },
      { tool: 'dense', size: 0, dense: FITS },
      { tool: 'dense', size: 0, dense: FITS, after: 1 },
    ],
  },
  timeouts: {
    job: { delayMs: 4000, requestTimeoutSeconds: 1 },
    spec: Array.from({ length: 4 }, (_, i) => ({ tool: 'dense', size: 0, dense: FITS, after: i * 1.2 })),
  },
}

/** Runs one scenario on `ids`: the host in its own process, every sandbox's requests at once. */
async function runScenario(provider, ids, scenario) {
  const { job, spec } = SCENARIOS[scenario]
  const child = spawn(
    process.execPath,
    [
      '--expose-gc',
      HOST,
      JSON.stringify({ options: { image: IMAGE, namespace: NAMESPACE }, sandboxIds: ids, sampleMs: 5, ...job }),
    ],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  )
  try {
    const lines = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]()
    const started = JSON.parse((await lines.next()).value)
    if (started.failed) throw new Error(started.failed)
    const answers = await Promise.all(
      ids.map(async (sandboxId, i) => {
        const r = await provider.exec({
          sandboxId,
          command: 'python3 -c "$CLIENT" "$SPEC"',
          env: { ...started.envs[i], CLIENT, SPEC: JSON.stringify(spec) },
          timeoutSeconds: 600,
        })
        if (!r.success || r.response.exitCode !== 0) throw new Error(`client: ${JSON.stringify(r).slice(0, 500)}`)
        return JSON.parse(r.response.result)
      }),
    )
    child.stdin.write('done\n')
    const stats = JSON.parse((await lines.next()).value)
    if (stats.failed) throw new Error(stats.failed)
    const errors = answers.flat().map((a) => a.reply?.error ?? a.error ?? '')
    const bound = Math.min(ids.length * SANDBOX_BOUND, PROVIDER_BOUND)
    const growth = stats.peak - stats.baseline
    return {
      sandboxes: ids.length,
      scenario,
      boundMiB: bound / MiB,
      rssGrowthMiB: Math.round(growth / MiB),
      heapGrowthMiB: Math.round((stats.heapPeak - stats.heapBaseline) / MiB),
      ratio: Number((growth / bound).toFixed(2)),
      maxStallMs: Math.round(stats.maxStallMs),
      stall: stats.longestStall,
      gcMs: stats.gcMs,
      dispatched: stats.dispatched,
      refused: errors.filter((e) => e.includes('JavaScript values')).length,
      timedOut: errors.filter((e) => e.includes('got no reply')).length,
      unroomed: errors.filter((e) => e.includes('found no room')).length,
    }
  } finally {
    child.kill('SIGKILL')
  }
}

async function main() {
  const counts = (process.argv[2] || '1,4,16').split(',').map(Number)
  const provider = new DockerSandboxProvider({ image: IMAGE, namespace: NAMESPACE })
  const runs = []
  try {
    const ids = []
    for (let i = 0; i < Math.max(...counts); i++) ids.push((await provider.createSandbox()).sandboxId)
    for (const n of counts) {
      for (const scenario of Object.keys(SCENARIOS)) {
        process.stderr.write(`codemode-pressure: ${n} sandbox(es), ${scenario} …\n`)
        runs.push(await runScenario(provider, ids.slice(0, n), scenario))
      }
    }
  } finally {
    await provider.dispose()
    const left = execFileSync('docker', ['ps', '-aq', '--filter', `label=trueforge.sandbox.namespace=${NAMESPACE}`])
      .toString()
      .split('\n')
      .filter(Boolean)
    if (left.length > 0) execFileSync('docker', ['rm', '-f', '-v', ...left])
  }
  return { image: IMAGE, bounds: { sandboxMiB: SANDBOX_BOUND / MiB, providerMiB: PROVIDER_BOUND / MiB }, runs }
}

main().then(
  (r) => process.stdout.write(`${JSON.stringify(r)}\n`),
  (e) => {
    process.stderr.write(`${(e && e.stack) || e}\n`)
    process.exit(1)
  },
)
