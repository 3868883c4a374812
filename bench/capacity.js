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
//   - bursts of 20 and of 50 creates, each running its first command, against the floor's;
//   - busy sandboxes: 10, then 20, each running a command loop through the agent (a CPU burst,
//     file writes and reads in the shell, a file up and back), while a probe sandbox measures
//     what a session feels (exec, 1 KiB transfers, create → first exec of one more) against the
//     same with those sandboxes idle, beside the engine's exec floor; the host process, the
//     engine's and the machine's load; errors. Each count in a child process of its own, so its
//     RSS is that of a server holding just those sandboxes.
//
//   node --expose-gc bench/capacity.js [counts] [busy counts]
//                                     defaults "20,200" and "10,20"; an empty busy list skips it
//   BENCH_BUSY_PAUSE_MS   each busy sandbox's pause between loop rounds (default 250)
//   BENCH_BURSTS          the burst sizes (default "20,50")
//   BENCH_BURST_PAIRS     alternating pairs per size, ours and the floor's (default 3)
//
// Prints one JSON object. Every container it makes carries the bench label and is removed.

// The raw client's containers join no network, as the addon's do under its default egress
// policy: neither pays for network set-up.
process.env.BENCH_NETWORK ??= 'none'

const { execFileSync, spawn } = require('node:child_process')
const fs = require('node:fs')

const floor = require('./impl/floor')
const { BENCH_LABEL, IMAGE, benchLabels, fewAtATime } = require('./impl/common')
const { summarize } = require('./stats')

const KiB = 1024
const MiB = 1024 * 1024
const CONCURRENCY = 8
const BURSTS = (process.env.BENCH_BURSTS || '20,50').split(',').map(Number)
// Odd, so the median is one pair's, and ours leads in one more pair than the floor.
const BURST_PAIRS = Number(process.env.BENCH_BURST_PAIRS || 3)
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

/** Removes sandboxes a few at a time (`fewAtATime`). */
function removeAll(p, ids) {
  return fewAtATime(ids, (id) => p.removeSandbox(id))
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
    cleanup: () => removeAll(p, ids),
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

function runChild(what, args) {
  return new Promise((resolve) => {
    const c = spawn(process.execPath, ['--expose-gc', __filename, ...args], {
      stdio: ['ignore', 'pipe', 'inherit'],
    })
    let text = ''
    c.stdout.on('data', (d) => (text += d))
    c.on('exit', () => {
      try {
        resolve(JSON.parse(text))
      } catch {
        resolve({ error: `the ${what} child printed no result: ${text.slice(0, 300)}` })
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

const ENGINE_COMM = /^(dockerd|containerd|containerd-shim.*)$/

/** The engine's own processes (dockerd, containerd, the shims) and their resident memory. */
function engineProcesses() {
  const text = execFileSync('ps', ['-eo', 'rss=,comm='], { encoding: 'utf8' })
  let count = 0
  let rss = 0
  for (const line of text.split('\n')) {
    const [kb, comm] = line.trim().split(/\s+/, 2)
    if (ENGINE_COMM.test(comm || '')) {
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
    await removeAll(p, ids)
    await p.dispose()
  }
}

/** `n` creates at once, each running its first command: wall time, ours and the floor's.
 * The two alternate, ours first in one pair and second in the next, so that neither always
 * meets the engine right after the other's removals; the ratio is the median of the pairs',
 * as one pair in a loaded run is noise. */
async function burst(n) {
  const { DockerSandboxProvider } = require('..')
  const p = new DockerSandboxProvider({
    image: IMAGE,
    namespace: `bench-cap-b-${process.pid}`,
    labels: benchLabels('addon'),
  })
  const f = floor.create()
  const errors = (results) => results.filter((r) => r.status === 'rejected').length
  const ours = async () => {
    const ids = []
    const t = performance.now()
    const results = await Promise.allSettled(
      Array.from({ length: n }, async () => {
        const { sandboxId } = await p.createSandbox()
        ids.push(sandboxId)
        const r = await p.exec({ sandboxId, command: 'true' })
        if (!r.success) throw new Error(r.error)
      }),
    )
    const ms = performance.now() - t
    await removeAll(p, ids)
    return { ms, errors: errors(results) }
  }
  const raw = async () => {
    const t = performance.now()
    const results = await Promise.allSettled(
      Array.from({ length: n }, async () => {
        const id = await f.createSandbox()
        await f.exec(id, 'true')
      }),
    )
    const ms = performance.now() - t
    await f.cleanup()
    return { ms, errors: errors(results) }
  }
  const pairs = []
  try {
    // One of each first, so image checks and the agent's volume are not part of the burst.
    const warm = await p.createSandbox()
    await p.exec({ sandboxId: warm.sandboxId, command: 'true' })
    await p.removeSandbox(warm.sandboxId)
    await f.exec(await f.createSandbox(), 'true')
    await f.cleanup()
    for (let i = 0; i < BURST_PAIRS; i++) {
      const [first, second] = i % 2 === 0 ? [ours, raw] : [raw, ours]
      const a = await first()
      await sleep(1000)
      const b = await second()
      await sleep(1000)
      const [o, r] = i % 2 === 0 ? [a, b] : [b, a]
      pairs.push({ oursMs: Math.round(o.ms), floorMs: Math.round(r.ms), oursErrors: o.errors, floorErrors: r.errors })
    }
  } finally {
    await f.cleanup()
    await p.dispose()
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
  return {
    sandboxes: n,
    pairs,
    oursMs: median(pairs.map((x) => x.oursMs)),
    floorMs: median(pairs.map((x) => x.floorMs)),
    oursErrors: pairs.reduce((sum, x) => sum + x.oursErrors, 0),
    floorErrors: pairs.reduce((sum, x) => sum + x.floorErrors, 0),
    ratio: round2(median(pairs.map((x) => x.oursMs / x.floorMs))),
  }
}

// ---------------------------------------------------------------------------------------------
// Busy sandboxes

const BUSY_PAUSE_MS = Number(process.env.BENCH_BUSY_PAUSE_MS || 250)
// One round of a busy session's command: about 30 ms of shell arithmetic on one CPU of this
// machine, then four 64 KiB files written and read back. Its output is checked, so a lost or
// cut output counts as an error rather than a fast sample.
const BUSY_COMMAND =
  'i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; ' +
  'for f in 1 2 3 4; do head -c 65536 /dev/urandom > /tmp/busy.$f; done; cat /tmp/busy.* | wc -c'
const BUSY_OUTPUT = String(4 * 65536)
const BUSY_FILE_BYTES = 16 * KiB
// The probe's repetitions in each phase: enough for a p95 of the exec, a p50 of the rest.
const PROBE = { exec: 40, xfer: 20, floor: 15, create: 3 }
// The loops run this long before the busy phase is measured, so it starts in their steady state.
const BUSY_WARMUP_MS = 3000
const LOAD_WINDOW_MS = 5000
const CLK_TCK = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' })) || 100

/** CPU time so far, in clock ticks: the engine's processes, and the whole machine's busy and idle. */
function cpuTicks() {
  let engine = 0
  for (const pid of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue
    let stat
    try {
      stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8')
    } catch {
      continue // it ended between the listing and the read
    }
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    const close = stat.lastIndexOf(')')
    if (!ENGINE_COMM.test(stat.slice(stat.indexOf('(') + 1, close))) continue
    const f = stat.slice(close + 2).split(' ')
    engine += Number(f[11]) + Number(f[12]) // utime and stime, fields 14 and 15
  }
  const cpu = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number)
  return { engine, total: cpu.reduce((a, b) => a + b, 0), idle: cpu[3] + cpu[4], at: performance.now() }
}

/** What a window cost: the engine's CPU in % of one CPU, the machine's busy share of all of them. */
function cpuShare(from, to) {
  const seconds = (to.at - from.at) / 1000
  return {
    engineCpuPct: round1(((to.engine - from.engine) / CLK_TCK / seconds) * 100),
    machineBusyPct: round1((1 - (to.idle - from.idle) / (to.total - from.total)) * 100),
  }
}

const p50 = (xs) => round2(summarize(xs).p50)

/**
 * What a session feels in the probe sandbox: exec `true`, 1 KiB up and down, the engine's exec
 * floor on a raw container, and create → first exec of one more sandbox (removed after).
 */
async function probe(p, f, probeId, floorId, fail) {
  const exec = []
  const up = []
  const down = []
  const raw = []
  const create = []
  const timed = async (samples, fn) => {
    const t = performance.now()
    try {
      await fn()
      samples.push(performance.now() - t)
    } catch (e) {
      fail(e)
    }
  }
  const content = Buffer.alloc(KiB, 7)
  for (let i = 0; i < PROBE.exec; i++)
    await timed(exec, async () => {
      const r = await p.exec({ sandboxId: probeId, command: 'true' })
      if (!r.success || r.response.exitCode !== 0) throw new Error(`probe exec: ${r.error ?? r.response.exitCode}`)
    })
  for (let i = 0; i < PROBE.xfer; i++) {
    await timed(up, () => p.uploadFile({ sandboxId: probeId, remotePath: '/tmp/probe.bin', content }))
    await timed(down, async () => {
      const back = await p.downloadFile({ sandboxId: probeId, path: '/tmp/probe.bin' })
      if (!content.equals(back)) throw new Error('probe download: not the bytes uploaded')
    })
  }
  for (let i = 0; i < PROBE.floor; i++)
    await timed(raw, async () => {
      const r = await f.exec(floorId, 'true')
      if (r.exitCode !== 0) throw new Error(`floor exec: exit code ${r.exitCode}`)
    })
  for (let i = 0; i < PROBE.create; i++) {
    let made = null
    await timed(create, async () => {
      made = (await p.createSandbox()).sandboxId
      const r = await p.exec({ sandboxId: made, command: 'true' })
      if (!r.success || r.response.exitCode !== 0) throw new Error(`first exec: ${r.error ?? r.response.exitCode}`)
    })
    if (made) await p.removeSandbox(made).catch(fail)
  }
  const e = summarize(exec)
  return {
    execTrueP50Ms: round2(e.p50),
    execTrueP95Ms: round2(e.p95),
    upload1KiBP50Ms: p50(up),
    download1KiBP50Ms: p50(down),
    floorExecTrueP50Ms: p50(raw),
    createFirstExecP50Ms: p50(create),
  }
}

/**
 * One phase (the sandboxes idle, or busy): what the sandboxes alone load the engine and the
 * machine with, over a window before the probe (whose own creates and raw execs are engine work
 * too); then the probe, with the host's RSS (its peak, and after collections).
 */
async function phase(n, base, measure) {
  let peak = 0
  const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 50)
  try {
    const from = cpuTicks()
    await sleep(LOAD_WINDOW_MS)
    const share = cpuShare(from, cpuTicks())
    const load1 = round2(require('node:os').loadavg()[0])
    const memAvailableGiB = round1(memAvailable() / 1024 / MiB)
    const m = await measure()
    const rss = await settledRss()
    return {
      ...m,
      hostRssPerSandboxMiB: round2((rss - base.rss) / n / MiB),
      hostPeakRssPerSandboxMiB: round2((Math.max(peak, rss) - base.rss) / n / MiB),
      ...share,
      load1,
      memAvailableGiB,
    }
  } finally {
    clearInterval(sampler)
  }
}

/**
 * A child's work for the busy part: a probe sandbox and a raw container, then `n` sandboxes
 * measured idle, then the same `n` each running the command loop.
 */
async function busyChild(n) {
  const { DockerSandboxProvider } = require('..')
  const p = new DockerSandboxProvider({
    image: IMAGE,
    namespace: `bench-cap-busy-${process.pid}`,
    labels: benchLabels('addon'),
  })
  const f = floor.create()
  const ids = []
  const errors = []
  const fail = (e) => errors.push(String(e?.message || e))
  const out = {
    sandboxes: n,
    setup: {
      pauseMs: BUSY_PAUSE_MS,
      warmupMs: BUSY_WARMUP_MS,
      fileKiB: BUSY_FILE_BYTES / KiB,
      loadWindowMs: LOAD_WINDOW_MS,
      probe: PROBE,
    },
  }
  let stop = false
  const loops = []
  try {
    const make = async () => {
      const { sandboxId } = await p.createSandbox()
      ids.push(sandboxId)
      const r = await p.exec({ sandboxId, command: 'true' })
      if (!r.success || r.response.exitCode !== 0) throw new Error(`first exec: ${r.error ?? r.response.exitCode}`)
      return sandboxId
    }
    const probeId = await make()
    const floorId = await f.createSandbox()
    await f.exec(floorId, 'true')
    // One round of everything first, so the probe's first transfers and raw exec are in neither
    // phase; its errors still count in the total.
    await probe(p, f, probeId, floorId, fail)
    const warmupErrors = errors.length
    const base = { rss: await settledRss() }
    const held = []
    await pool(0, n, async () => held.push(await make()))
    const measure = () => probe(p, f, probeId, floorId, fail)
    out.idle = await phase(n, base, measure)
    out.idle.errors = errors.length - warmupErrors

    const rounds = []
    const execs = []
    const file = Buffer.alloc(BUSY_FILE_BYTES, 0x61)
    const loop = async (id, k) => {
      // Staggered, so the sandboxes do not run in step.
      await sleep((k / n) * BUSY_PAUSE_MS)
      while (!stop) {
        const t = performance.now()
        try {
          const r = await p.exec({ sandboxId: id, command: BUSY_COMMAND })
          execs.push(performance.now() - t)
          if (!r.success || r.response.exitCode !== 0 || r.response.result.trim() !== BUSY_OUTPUT)
            throw new Error(`busy exec: ${r.error ?? `${r.response.exitCode} ${r.response.result.slice(0, 80)}`}`)
          await p.uploadFile({ sandboxId: id, remotePath: '/tmp/edit.bin', content: file })
          const back = await p.downloadFile({ sandboxId: id, path: '/tmp/edit.bin' })
          if (!file.equals(back)) throw new Error('busy download: not the bytes uploaded')
          rounds.push(performance.now() - t)
        } catch (e) {
          fail(e)
        }
        await sleep(BUSY_PAUSE_MS)
      }
    }
    const started = performance.now()
    loops.push(...held.map((id, k) => loop(id, k)))
    await sleep(BUSY_WARMUP_MS)
    out.busy = await phase(n, base, measure)
    stop = true
    await Promise.all(loops)
    const seconds = (performance.now() - started) / 1000
    out.busy.errors = errors.length - warmupErrors - out.idle.errors
    out.workload = {
      rounds: rounds.length,
      roundsPerSecond: round1(rounds.length / seconds),
      roundP50Ms: p50(rounds),
      execP50Ms: p50(execs),
      seconds: round1(seconds),
    }
  } catch (e) {
    out.error = String(e?.stack || e)
  } finally {
    stop = true
    await Promise.allSettled(loops)
    await removeAll(p, ids)
    await f.cleanup()
    await p.dispose()
  }
  out.errors = errors.length
  out.errorMessages = [...new Set(errors)].slice(0, 3)
  return out
}

async function main() {
  if (process.argv[2] === '--child') {
    const counts = process.argv[4].split(',').map(Number)
    process.stdout.write(JSON.stringify(await child(process.argv[3], counts)))
    return
  }
  if (process.argv[2] === '--busy') {
    process.stdout.write(JSON.stringify(await busyChild(Number(process.argv[3]))))
    return
  }
  const counts = (process.argv[2] || '20,200').split(',').map(Number)
  const busyCounts = (process.argv[3] ?? '10,20').split(',').filter(Boolean).map(Number)
  const out = { image: IMAGE, cpus: require('node:os').cpus().length }
  try {
    out.ours = await runChild('ours', ['--child', 'ours', counts.join(',')])
    out.raw = await runChild('raw', ['--child', 'raw', counts.join(',')])
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
    out.bursts = []
    for (const n of BURSTS) out.bursts.push(await burst(n))
    out.busy = []
    for (const n of busyCounts) out.busy.push(await runChild(`busy ${n}`, ['--busy', String(n)]))
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
