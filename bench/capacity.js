#!/usr/bin/env node
'use strict'

// What one engine holds, for the operator (docs/operations.md):
//   - host memory per idle sandbox: a process holding 20, then 200 idle sandboxes (each has run
//     one command, so its agent is connected), against a raw client (bench/impl/floor.js) that
//     made and ran a command in as many containers; each in a child process of its own, RSS after
//     a collection;
//   - memory in the sandbox: the engine's one-shot stats of a few idle sandboxes;
//   - the machine: MemAvailable and the engine's processes per sandbox, which say what fills
//     first;
//   - a burst of 50 creates, each running its first command, against the floor's.
//
//   node --expose-gc bench/capacity.js [counts]     counts, default "20,200"
//
// Prints one JSON object. Every container it makes carries the bench label and is removed.

// The raw client's containers join no network, as the addon's do under its default egress
// policy: neither pays for network set-up.
process.env.BENCH_NETWORK ??= 'none'

const { execFileSync, spawn } = require('node:child_process')
const fs = require('node:fs')

const floor = require('./impl/floor')
const { BENCH_LABEL, IMAGE, benchLabels } = require('./impl/common')

const MiB = 1024 * 1024
const CONCURRENCY = 8
const BURST = Number(process.env.BENCH_BURST || 50)
const round1 = (x) => Math.round(x * 10) / 10
const round2 = (x) => Math.round(x * 100) / 100
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function settledRss() {
  for (let i = 0; i < 3; i++) {
    global.gc()
    await sleep(100)
  }
  return process.memoryUsage().rss
}

/** Runs `fn(i)` for i in [from, to) with at most CONCURRENCY at once. */
async function pool(from, to, fn) {
  let next = from
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < to) await fn(next++)
    }),
  )
}

function memAvailable() {
  const m = /MemAvailable:\s+(\d+) kB/.exec(fs.readFileSync('/proc/meminfo', 'utf8'))
  return m ? Number(m[1]) * 1024 : NaN
}

/** The implementation a child measures: `ours` (the addon) or `raw` (the floor). */
function implOf(role, namespace) {
  if (role === 'raw') {
    const f = floor.create()
    return {
      create: async () => {
        const id = await f.createSandbox()
        const r = await f.exec(id, 'true')
        if (r.exitCode !== 0) throw new Error(`raw exec: ${JSON.stringify(r)}`)
        return id
      },
      cleanup: () => f.cleanup(),
      dispose: async () => {},
    }
  }
  const { DockerSandboxProvider } = require('..')
  const p = new DockerSandboxProvider({ image: IMAGE, namespace, labels: benchLabels('addon') })
  const ids = []
  return {
    create: async () => {
      const { sandboxId } = await p.createSandbox()
      ids.push(sandboxId)
      const r = await p.exec({ sandboxId, command: 'true' })
      if (!r.success || r.response.exitCode !== 0) throw new Error(`exec: ${JSON.stringify(r)}`)
      return sandboxId
    },
    status: (id) => p.agentStatus(id),
    first: () => ids[0],
    cleanup: () => Promise.allSettled(ids.map((id) => p.removeSandbox(id))),
    dispose: () => p.dispose(),
  }
}

/** A child's work: hold `counts` sandboxes in turn, reporting RSS at each. */
async function child(role, counts) {
  const namespace = `bench-cap-${process.pid}`
  const impl = implOf(role, namespace)
  const out = { role, baseline: 0, at: [] }
  try {
    // The first sandbox loads what every later one shares (the client, the agent's binaries).
    await impl.create()
    out.baseline = await settledRss()
    let held = 1
    for (const n of counts) {
      const t = performance.now()
      await pool(held, n, () => impl.create())
      held = n
      const rss = await settledRss()
      out.at.push({
        sandboxes: n,
        rss,
        perSandboxMiB: round2((rss - out.baseline) / (n - 1) / MiB),
        createSeconds: round1((performance.now() - t) / 1000),
      })
    }
    if (impl.status) out.mode = (await impl.status(impl.first())).mode
  } finally {
    await impl.cleanup()
    await impl.dispose()
  }
  return out
}

function runChild(role, counts) {
  return new Promise((resolve) => {
    const c = spawn(process.execPath, ['--expose-gc', __filename, '--child', role, counts.join(',')], {
      stdio: ['ignore', 'pipe', 'inherit'],
    })
    let text = ''
    c.stdout.on('data', (d) => (text += d))
    c.on('exit', () => {
      try {
        resolve(JSON.parse(text))
      } catch {
        resolve({ error: `the ${role} child printed no result: ${text.slice(0, 300)}` })
      }
    })
  })
}

/** Memory in a few idle sandboxes, from the engine's one-shot stats (cache left out). */
async function inSandbox(namespace, sample = 5) {
  const { json } = floor.client()
  const filters = encodeURIComponent(JSON.stringify({ label: [`trueforge.sandbox.namespace=${namespace}`] }))
  const { data } = await json('GET', `/containers/json?filters=${filters}`)
  const used = []
  for (const c of data.slice(0, sample)) {
    const { data: s } = await json('GET', `/containers/${c.Id}/stats?stream=false`)
    const m = s.memory_stats || {}
    const cache = m.stats?.total_inactive_file ?? m.stats?.inactive_file ?? m.stats?.cache ?? 0
    used.push((m.usage || 0) - cache)
  }
  return used.length ? round2(used.reduce((a, b) => a + b, 0) / used.length / MiB) : null
}

/** The engine's own processes (dockerd, containerd, the shims) and their resident memory. */
function engineProcesses() {
  const text = execFileSync('ps', ['-eo', 'rss=,comm='], { encoding: 'utf8' })
  let count = 0
  let rss = 0
  for (const line of text.split('\n')) {
    const [kb, comm] = line.trim().split(/\s+/, 2)
    if (/^(dockerd|containerd|containerd-shim.*)$/.test(comm || '')) {
      count++
      rss += Number(kb) * 1024
    }
  }
  return { count, rss }
}

/** The machine with `n` idle sandboxes of ours, against none: per sandbox. */
async function machine(n) {
  const { DockerSandboxProvider } = require('..')
  const namespace = `bench-cap-m-${process.pid}`
  const p = new DockerSandboxProvider({ image: IMAGE, namespace, labels: benchLabels('addon') })
  const ids = []
  const before = { avail: memAvailable(), engine: engineProcesses() }
  try {
    await pool(0, n, async () => {
      const { sandboxId } = await p.createSandbox()
      ids.push(sandboxId)
      await p.exec({ sandboxId, command: 'true' })
    })
    await sleep(2000)
    const after = { avail: memAvailable(), engine: engineProcesses() }
    return {
      sandboxes: n,
      memAvailablePerSandboxMiB: round2((before.avail - after.avail) / n / MiB),
      engineRssPerSandboxMiB: round2((after.engine.rss - before.engine.rss) / n / MiB),
      engineProcessesPerSandbox: round2((after.engine.count - before.engine.count) / n),
      inSandboxMiB: await inSandbox(namespace),
      memAvailableLeftGiB: round1(after.avail / 1024 / MiB),
    }
  } finally {
    await Promise.allSettled(ids.map((id) => p.removeSandbox(id)))
    await p.dispose()
  }
}

/** `BURST` creates at once, each running its first command: wall time, ours and the floor's. */
async function burst() {
  const { DockerSandboxProvider } = require('..')
  const p = new DockerSandboxProvider({
    image: IMAGE,
    namespace: `bench-cap-b-${process.pid}`,
    labels: benchLabels('addon'),
  })
  const f = floor.create()
  const out = {}
  try {
    // One of each first, so image checks and the agent's volume are not part of the burst.
    const warm = await p.createSandbox()
    await p.exec({ sandboxId: warm.sandboxId, command: 'true' })
    await p.removeSandbox(warm.sandboxId)
    await f.exec(await f.createSandbox(), 'true')
    await f.cleanup()
    const ids = []
    let t = performance.now()
    const ours = await Promise.allSettled(
      Array.from({ length: BURST }, async () => {
        const { sandboxId } = await p.createSandbox()
        ids.push(sandboxId)
        const r = await p.exec({ sandboxId, command: 'true' })
        if (!r.success) throw new Error(r.error)
      }),
    )
    out.oursMs = Math.round(performance.now() - t)
    out.oursErrors = ours.filter((r) => r.status === 'rejected').length
    await Promise.allSettled(ids.map((id) => p.removeSandbox(id)))
    t = performance.now()
    const raw = await Promise.allSettled(
      Array.from({ length: BURST }, async () => {
        const id = await f.createSandbox()
        await f.exec(id, 'true')
      }),
    )
    out.floorMs = Math.round(performance.now() - t)
    out.floorErrors = raw.filter((r) => r.status === 'rejected').length
    out.ratio = round2(out.oursMs / out.floorMs)
  } finally {
    await f.cleanup()
    await p.dispose()
  }
  return { sandboxes: BURST, ...out }
}

async function main() {
  if (process.argv[2] === '--child') {
    const counts = process.argv[4].split(',').map(Number)
    process.stdout.write(JSON.stringify(await child(process.argv[3], counts)))
    return
  }
  const counts = (process.argv[2] || '20,200').split(',').map(Number)
  const out = { image: IMAGE, cpus: require('node:os').cpus().length }
  try {
    out.ours = await runChild('ours', counts)
    out.raw = await runChild('raw', counts)
    out.host = counts.map((n, i) => {
      const o = out.ours.at?.[i]
      const r = out.raw.at?.[i]
      return o && r
        ? {
            sandboxes: n,
            oursMiB: o.perSandboxMiB,
            rawMiB: r.perSandboxMiB,
            moreMiB: round2(o.perSandboxMiB - r.perSandboxMiB),
          }
        : null
    })
    out.machine = await machine(counts[counts.length - 1])
    out.burst = await burst()
  } catch (e) {
    out.error = String(e?.stack || e)
  } finally {
    await floor.sweep(BENCH_LABEL).catch(() => {})
  }
  process.stdout.write(JSON.stringify(out))
}

main().catch((e) => {
  process.stdout.write(JSON.stringify({ error: String(e?.stack || e) }))
  process.exitCode = 1
})
