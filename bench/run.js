#!/usr/bin/env node
'use strict'

// Benchmark harness: the addon against a minimal dockerode equivalent, the docker CLI and the
// floor (the fewest raw Engine API requests), on the same engine and image. Prints a table and
// writes bench/RESULTS.md. Exits non-zero only when it could not run, never on a slow figure.
//
//   npm --prefix bench install && node bench/run.js        (or: cd bench && npm run bench)
//
// Environment:
//   BENCH_REPS            'full' (default), 'small' (a quick check), a number N (every count
//                         scaled by N/30, i.e. N execs), or overrides like 'exec=50,create=20'
//                         (keys: exec, create, xfer_small, xfer_10m, xfer_100m, conc_exec,
//                         conc_create, mem)
//   BENCH_IMPLS           comma list to run a subset of addon,addon-engine,floor,floor-exec,
//                         dockerode,testcontainers,cli (addon: through the in-sandbox agent;
//                         addon-engine: `agent: false`; floor-exec: transfers through a raw
//                         exec's streams)
//   BENCH_OPS             comma list of operation keys to run a subset (see OPS below)
//   BENCH_SKIP_MEM=1      skip the memory probes; BENCH_SKIP_REQS=1 skip the request count;
//                         BENCH_SKIP_AGENT=1 the agent probe; BENCH_SKIP_CODEMODE=1 Code Mode
//                         (its round trip and the pressure runs; BENCH_CM_PRESSURE: their
//                         sandbox counts, default 1,4,16); BENCH_SKIP_EGRESS=1 the egress
//                         proxy's section (BENCH_EGRESS_ROUNDS, default 5); BENCH_SKIP_RUNSC=1
//                         gVisor's (it starts and stops scripts/engines/gvisor-engine.sh);
//                         BENCH_SKIP_LOAD=1 the run under load (BENCH_LOAD: how many
//                         CPU-bound processes spin beside it, default 2); BENCH_SKIP_CAPACITY=1
//                         the capacity section (BENCH_CAPACITY: its idle counts, default 20,200;
//                         BENCH_CAPACITY_BUSY: its busy counts, default 10,20, empty to leave the
//                         busy part out; BENCH_BUSY_PAUSE_MS: a busy sandbox's pause between
//                         rounds, default 250)
//   BENCH_WARM_POOL_SIZE  pool size for the "addon (warm pool)" rows (default 2)
//   BENCH_WARM_SETTLE_MS  pause after each warm-pool create so the refill does not load the
//                         next measurement (default 1500)
//   BENCH_NETWORK         run every implementation on this network (made, and removed after,
//                         when missing) instead of the engine's default bridge
//   BENCH_IMAGE, BENCH_NAMESPACE, BENCH_DOCKER_SOCKET, BENCH_RESULTS (output path)

const os = require('node:os')
const fs = require('node:fs')
const path = require('node:path')
const { fork, execFile, spawn } = require('node:child_process')

const common = require('./impl/common')
const addonImpl = require('./impl/addon')
const floorImpl = require('./impl/floor')
const dockerodeImpl = require('./impl/dockerode')
const cliImpl = require('./impl/cli')
const { startProxy } = require('./reqcount')
const { percentile, summarize, mbps, fmtMs, fmtNum, fmtRatio, fmtSigned, fmtBytes } = require('./stats')

const KiB = 1024
const MiB = 1024 * 1024
const EXEC_1M_COMMAND = "head -c 1048576 /dev/zero | tr '\\0' a"
const OP_TIMEOUT_MS = 180_000

// ---------------------------------------------------------------------------------------------
// Settings

const PRESETS = {
  // Sized for a 2-core machine: the whole run stays around 5–7 minutes.
  full: { exec: 30, create: 10, xfer_small: 30, xfer_10m: 10, xfer_100m: 5, conc_exec: 5, conc_create: 3, mem: 2 },
  small: { exec: 5, create: 3, xfer_small: 5, xfer_10m: 3, xfer_100m: 2, conc_exec: 2, conc_create: 1, mem: 1 },
}

function parseReps(spec) {
  const s = (spec || 'full').trim().toLowerCase()
  if (s === 'full' || s === 'default' || s === '') return { name: 'full', reps: { ...PRESETS.full } }
  if (s === 'small' || s === 'quick' || s === 'smoke') return { name: 'small', reps: { ...PRESETS.small } }
  if (/^\d+$/.test(s)) {
    const n = Number(s)
    const reps = {}
    for (const [k, v] of Object.entries(PRESETS.full)) reps[k] = Math.max(1, Math.round((v * n) / PRESETS.full.exec))
    return { name: `scaled to ${n} execs`, reps }
  }
  const reps = { ...PRESETS.full }
  for (const part of s.split(',')) {
    const [k, v] = part.split('=').map((x) => x.trim())
    if (!(k in reps) || !/^\d+$/.test(v || '')) throw new Error(`BENCH_REPS: bad entry ${JSON.stringify(part)}`)
    reps[k] = Math.max(1, Number(v))
  }
  return { name: `custom (${s})`, reps }
}

function listEnv(name) {
  const v = process.env[name]
  return v
    ? v
        .split(',')
        .map((x) => x.trim())
        .filter(Boolean)
    : null
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

function withTimeout(promise, ms, what) {
  let t
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      t = setTimeout(() => reject(new Error(`${what} took longer than ${ms / 1000} s`)), ms)
    }),
  ]).finally(() => clearTimeout(t))
}

function shortError(e) {
  const m = String((e && e.message) || e)
  return m.length > 200 ? `${m.slice(0, 200)}…` : m
}

/** A payload whose every page is written (so it is resident) and that no filter compresses. */
function makePayload(size) {
  const b = Buffer.allocUnsafe(size)
  for (let i = 0; i + 4 <= size; i += 4) b.writeUInt32LE((i * 2654435761) >>> 0, i)
  for (let i = size - (size % 4); i < size; i++) b[i] = i & 0xff
  return b
}

// ---------------------------------------------------------------------------------------------
// Operations. Each has `run(impl, ctx, scratch)` (the timed part; ids it creates go into
// `scratch` and are removed untimed afterwards), optional `setup`/`teardown` per implementation
// (untimed, once), and optional `check(result, ctx)` (untimed validation of each result).

function expectExit0(r) {
  if (r.exitCode !== 0) throw new Error(`exit code ${r.exitCode}: ${String(r.output).slice(0, 200)}`)
}

function transferOps(size, label, repsKey) {
  const up = `/tmp/bench-up-${label}.bin`
  const down = `/tmp/bench-down-${label}.bin`
  return [
    {
      key: `upload_${label}`,
      title: `upload ${label}`,
      repsKey,
      bytes: size,
      uses: 'work',
      setup: async () => ({ payload: payloadOf(size) }),
      run: (im, ctx) => im.upload(ctx.work, up, ctx.payload),
      // Untimed check that the whole file landed.
      teardown: async (im, ctx) => {
        const r = await im.exec(ctx.work, `wc -c < ${up}; rm -f ${up}`)
        if (Number(r.output.trim()) !== size)
          throw new Error(`uploaded file has ${r.output.trim()} bytes, expected ${size}`)
      },
    },
    {
      key: `download_${label}`,
      title: `download ${label}`,
      repsKey,
      bytes: size,
      uses: 'work',
      setup: async (im, ctx) => {
        await (im.seed || im.upload)(ctx.work, down, payloadOf(size))
        return { payload: payloadOf(size) }
      },
      run: (im, ctx) => im.download(ctx.work, down),
      check: (buf, ctx) => {
        if (!buf.equals(ctx.payload))
          throw new Error(`downloaded ${buf.length} bytes that differ from the ${size} uploaded`)
      },
      teardown: (im, ctx) => im.exec(ctx.work, `rm -f ${down}`),
    },
  ]
}

const payloads = new Map()
function payloadOf(size) {
  if (!payloads.has(size)) payloads.set(size, makePayload(size))
  return payloads.get(size)
}

const OPS = [
  {
    key: 'create',
    title: 'create sandbox (cold)',
    repsKey: 'create',
    warmPoolRow: true,
    run: async (im, _ctx, scratch) => {
      scratch.push(await im.createSandbox())
    },
  },
  {
    key: 'create_exec',
    title: 'create → first exec `true`',
    repsKey: 'create',
    warmPoolRow: true,
    run: async (im, _ctx, scratch) => {
      const id = await im.createSandbox()
      scratch.push(id)
      // The first exec on its own, in the same sample: what the create left undone shows here.
      const t = performance.now()
      const r = await im.exec(id, 'true')
      scratch.partMs = performance.now() - t
      return r
    },
    check: expectExit0,
  },
  {
    key: 'exec_true',
    title: 'exec `true`',
    repsKey: 'exec',
    uses: 'work',
    run: (im, ctx) => im.exec(ctx.work, 'true'),
    check: expectExit0,
  },
  {
    key: 'exec_1m',
    title: 'exec printing 1 MiB',
    repsKey: 'exec',
    bytes: MiB,
    uses: 'work',
    run: (im, ctx) => im.exec(ctx.work, EXEC_1M_COMMAND),
    check: (r) => {
      expectExit0(r)
      if (r.output.length !== MiB) throw new Error(`got ${r.output.length} bytes of output, expected ${MiB}`)
    },
  },
  ...transferOps(KiB, '1KiB', 'xfer_small'),
  ...transferOps(10 * MiB, '10MiB', 'xfer_10m'),
  ...transferOps(100 * MiB, '100MiB', 'xfer_100m'),
  {
    key: 'exec_x50',
    title: '50 concurrent execs over 10 sandboxes (wall)',
    repsKey: 'conc_exec',
    concurrent: true,
    setup: async (im) => {
      // Untimed; two at a time keeps it quick without a burst of 10 creates per implementation.
      const ids = []
      try {
        for (let i = 0; i < 10; i += 2) ids.push(...(await Promise.all([im.createSandbox(), im.createSandbox()])))
      } catch (e) {
        await im.cleanup() // the impl knows every container it made, including the batch that failed
        throw e
      }
      return { ids }
    },
    run: async (im, ctx) => {
      const results = await Promise.allSettled(
        Array.from({ length: 50 }, (_, i) => im.exec(ctx.ids[i % ctx.ids.length], 'true')),
      )
      return tally(results, (r) => expectExit0(r))
    },
    teardown: (im, ctx) => Promise.allSettled(ctx.ids.map((id) => im.remove(id))),
  },
  {
    key: 'create_x20',
    title: '20 concurrent creates (wall)',
    repsKey: 'conc_create',
    concurrent: true,
    run: async (im, _ctx, scratch) => {
      const results = await Promise.allSettled(
        Array.from({ length: 20 }, async () => {
          const id = await im.createSandbox()
          scratch.push(id)
        }),
      )
      return tally(results)
    },
  },
]

/** Counts failures among settled promises (a rejected one, or one `check` throws for). */
function tally(results, check) {
  const messages = []
  for (const r of results) {
    if (r.status === 'rejected') messages.push(shortError(r.reason))
    else if (check) {
      try {
        check(r.value)
      } catch (e) {
        messages.push(shortError(e))
      }
    }
  }
  return { errors: messages.length, messages }
}

// ---------------------------------------------------------------------------------------------
// Measurement

/** Rotates the order each repetition so no implementation always runs right after another. */
function rotate(list, k) {
  const n = list.length
  return list.map((_, i) => list[(i + k) % n])
}

async function iterate(op, im, ctx, row) {
  const scratch = []
  const t0 = performance.now()
  let res
  let err = null
  try {
    res = await withTimeout(
      Promise.resolve().then(() => op.run(im, ctx, scratch)),
      OP_TIMEOUT_MS,
      op.title,
    )
  } catch (e) {
    err = e
  }
  const ms = performance.now() - t0
  if (!err && op.check) {
    try {
      op.check(res, ctx)
    } catch (e) {
      err = e
    }
  }
  await Promise.allSettled(scratch.map((id) => im.remove(id)))
  if (im.settleAfterMs) await sleep(im.settleAfterMs)
  if (!row) return err
  if (err) {
    row.errors++
    row.messages.push(shortError(err))
    return err
  }
  row.samples.push(ms)
  row.loads.push(os.loadavg()[0])
  if (scratch.partMs !== undefined) row.parts.push(scratch.partMs)
  if (op.concurrent && res && res.errors) {
    row.errors += res.errors
    row.messages.push(...res.messages)
  }
  return null
}

/** The per-implementation context of an operation: its work sandbox and what `setup` adds. */
async function prepare(op, im, works) {
  const base = op.uses === 'work' ? { work: works.get(im.name) } : {}
  if (op.uses === 'work' && !base.work) throw new Error('no work sandbox (its creation failed)')
  return { ...base, ...(op.setup ? await op.setup(im, base) : {}) }
}

/**
 * After a failure: if the work sandbox is gone (something outside the bench removed it; the
 * engine is shared), make a new one and set the operation up again, so one outside removal
 * costs a few samples rather than the rest of the run. Returns the new context, or null.
 */
async function recoverWork(op, im, works) {
  if (op.uses !== 'work') return null
  try {
    await im.exec(works.get(im.name), 'true')
    return null // still there: the failure was the operation's own
  } catch {
    // gone: replace it below
  }
  works.set(im.name, await im.createSandbox())
  return prepare(op, im, works)
}

async function runOp(op, impls, reps, works) {
  const rows = new Map()
  const ctxs = new Map()
  for (const im of impls) {
    const row = { samples: [], parts: [], loads: [], errors: 0, messages: [] }
    rows.set(im.name, row)
    try {
      ctxs.set(im.name, await prepare(op, im, works))
    } catch (e) {
      try {
        const again = await recoverWork(op, im, works)
        if (!again) throw e
        ctxs.set(im.name, again)
        row.messages.push(`the work sandbox had vanished before setup (${shortError(e)}); made a new one`)
      } catch (e2) {
        row.errors = reps
        row.messages.push(`setup failed: ${shortError(e2)}`)
      }
    }
  }
  const active = impls.filter((im) => ctxs.has(im.name))
  const attempt = async (im, row) => {
    const err = await iterate(op, im, ctxs.get(im.name), row)
    if (!err) return
    try {
      const again = await recoverWork(op, im, works)
      if (again) {
        ctxs.set(im.name, again)
        if (row) row.messages.push('the work sandbox had vanished; made a new one')
      }
    } catch (e) {
      if (row) row.messages.push(`could not replace a vanished work sandbox: ${shortError(e)}`)
    }
  }
  // One unrecorded warm-up iteration each: first-use costs (connections, caches) are not the
  // steady state being compared.
  for (const im of active) await attempt(im, null)
  for (let rep = 0; rep < reps; rep++) {
    for (const im of rotate(active, rep)) await attempt(im, rows.get(im.name))
  }
  for (const im of active) {
    if (!op.teardown) continue
    try {
      await op.teardown(im, ctxs.get(im.name))
    } catch (e) {
      const row = rows.get(im.name)
      row.errors++
      row.messages.push(`after the run: ${shortError(e)}`)
    }
  }
  return rows
}

/** Peak RSS growth during one 100 MiB upload or download, each in a fresh child process. */
async function memoryProbes(impls, reps, log) {
  const size = 100 * MiB
  const out = {}
  for (const im of impls) {
    out[im.name] = {}
    if (im.noProbe) {
      out[im.name].skipped = im.noProbe
      log(`  memory ${im.name}: left out: ${im.noProbe}`)
      continue
    }
    let id
    try {
      id = await im.createSandbox()
      await im.upload(id, '/tmp/bench-mem-down.bin', payloadOf(size))
      for (const dir of ['upload', 'download']) {
        const runs = []
        for (let r = 0; r < reps; r++) {
          const p = dir === 'upload' ? '/tmp/bench-mem-up.bin' : '/tmp/bench-mem-down.bin'
          runs.push(await probe({ impl: im.name, dir, id, path: p, size }))
        }
        const ok = runs.filter((r) => r.ok)
        out[im.name][dir] = {
          // The worst run: the targets are bounds.
          growth: ok.length ? Math.max(...ok.map((r) => r.growth)) : NaN,
          ms: ok.length ? Math.max(...ok.map((r) => r.ms)) : NaN,
          runs: runs.length,
          errors: runs.filter((r) => !r.ok).map((r) => r.error.split('\n')[0]),
        }
        log(`  memory ${im.name} ${dir}: peak growth ${fmtBytes(out[im.name][dir].growth)}`)
      }
      out[im.name].load = os.loadavg()[0]
    } catch (e) {
      out[im.name].error = shortError(e)
      log(`  memory ${im.name}: ${out[im.name].error}`)
    } finally {
      if (id) await im.remove(id).catch(() => {})
    }
  }
  return out
}

function probe(spec) {
  return new Promise((resolve) => {
    const child = fork(path.join(__dirname, 'memprobe.js'), [], {
      execArgv: ['--expose-gc'],
      env: { ...process.env, BENCH_PROBE: JSON.stringify(spec) },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    })
    let result = null
    const timer = setTimeout(() => child.kill('SIGKILL'), OP_TIMEOUT_MS)
    child.on('message', (m) => (result = m))
    child.on('exit', (code) => {
      clearTimeout(timer)
      resolve(result || { ok: false, error: `probe exited with code ${code} and no result` })
    })
  })
}

/** Which engine requests each implementation makes per operation, through a counting proxy. */
async function requestCounts(implNames, log) {
  const proxy = await startProxy()
  const out = {}
  try {
    for (const name of implNames) {
      const rec = {}
      let im
      let warm
      let id
      try {
        im = makeImpl(name, { socket: proxy.socket })
        // Warm-up: version negotiation and the like happen once per process, not per call.
        warm = await im.createSandbox()
        await im.exec(warm, 'true')
        proxy.take()
        id = await im.createSandbox()
        rec.create = proxy.take()
        await im.exec(id, 'true')
        rec.exec = proxy.take()
        await im.upload(id, '/tmp/bench-reqs.bin', Buffer.alloc(KiB, 1))
        rec.upload = proxy.take()
        await im.download(id, '/tmp/bench-reqs.bin')
        rec.download = proxy.take()
      } catch (e) {
        rec.error = shortError(e)
      } finally {
        for (const x of [id, warm]) if (x) await im.remove(x).catch(() => {})
        if (im) await im.cleanup()
      }
      out[name] = rec
    }
  } finally {
    await proxy.close()
  }
  log(
    `  request counts: ${Object.entries(out)
      .map(
        ([n, r]) => `${n} ${['create', 'exec', 'upload', 'download'].map((k) => (r[k] ? r[k].length : '?')).join('/')}`,
      )
      .join(', ')}`,
  )
  return out
}

/** The container behind one of the addon's sandboxes (its id label). */
async function containerOf(sandboxId) {
  const filters = encodeURIComponent(JSON.stringify({ label: [`trueforge.sandbox.id=${sandboxId}`] }))
  const { data } = await floorImpl.client(common.SOCKET).json('GET', `/containers/json?filters=${filters}`)
  if (!data.length) throw new Error(`no container for sandbox ${sandboxId}`)
  return data[0].Id
}

const ECHO_ROUNDS = 200
/** The limit's parts and ours are taken in this many rounds, one after the other in each. */
const LIMIT_ROUNDS = 5

/**
 * The least an exec of `true` can cost through the engine's exec stream and the sandbox's shell,
 * in the addon's own work sandbox: the shell's spawn as the sandbox's user (through the addon's
 * exec, so its user and its shell) plus one small round trip on an attached exec stream; beside
 * it ours, one call after another. The three are taken in rounds, so that a machine whose speed
 * drifts during the minute (a shared virtual machine) weighs on each alike.
 */
async function execLimit(im, sandboxId, n) {
  const exec = async (command) => {
    const r = await im.exec(sandboxId, command)
    if (r.exitCode !== 0) throw new Error(`${command}: exit code ${r.exitCode}: ${String(r.output).slice(0, 200)}`)
    return r.output
  }
  const container = await containerOf(sandboxId)
  const per = Math.ceil(ECHO_ROUNDS / LIMIT_ROUNDS)
  const spawns = []
  const echoes = []
  const times = []
  let shell = 'sh'
  for (let r = 0; r < LIMIT_ROUNDS; r++) {
    const s = await common.shellSpawnMs(exec, n)
    shell = s.shell
    spawns.push(s.ms)
    echoes.push(...(await common.engineEcho(container, per, common.SOCKET)).samples)
    // Ours in the same conditions as the two above: one call after another in a loop, with no
    // other implementation's calls between them.
    for (let i = 0; i < 5 + per; i++) {
      const t = performance.now()
      await im.exec(sandboxId, 'true')
      if (i >= 5) times.push(performance.now() - t)
    }
  }
  const spawnMs = [...spawns].sort((a, b) => a - b)[Math.floor(spawns.length / 2)]
  const echo = { ...summarize(echoes), p99: percentile(echoes, 99) }
  const loop = summarize(times)
  const load = os.loadavg()[0]
  return {
    shell,
    n,
    rounds: LIMIT_ROUNDS,
    spawnMs,
    spawns,
    spawnLoad: load,
    echo,
    echoLoad: load,
    loop,
    loopLoad: load,
    limitMs: spawnMs + echo.p50,
  }
}

/** Children that spin a CPU each, as other work on a busy server would. */
const spinners = new Set()

function startSpinners(n) {
  for (let i = 0; i < n; i++) {
    const c = spawn(process.execPath, ['-e', 'for (;;);'], { stdio: 'ignore' })
    spinners.add(c)
    c.on('exit', () => spinners.delete(c))
  }
}

function stopSpinners() {
  for (const c of spinners) c.kill('SIGKILL')
}

const LOAD_OPS = ['exec_true', 'exec_x50']

/** exec `true` and the 50 concurrent execs for the addon and the floor, with `n` spinners beside. */
async function underLoad(impls, reps, works, n) {
  const pair = impls.filter((im) => im.name === OURS || im.name === 'floor')
  if (pair.length < 2) return { error: 'it needs the addon and the floor among BENCH_IMPLS' }
  for (const im of pair) if (!works.has(im.name)) works.set(im.name, await im.createSandbox())
  startSpinners(n)
  try {
    // Long enough for the spinners to be running flat out before the first sample.
    await sleep(1000)
    const results = {}
    for (const key of LOAD_OPS) {
      const op = OPS.find((o) => o.key === key)
      results[key] = await runOp(op, pair, reps[op.repsKey], works)
    }
    return { spinners: n, results }
  } finally {
    stopSpinners()
  }
}

// ---------------------------------------------------------------------------------------------
// Implementations

const IMPL_ORDER = ['addon', 'addon-engine', 'floor', 'floor-exec', 'dockerode', 'testcontainers', 'cli']
const EXEC_FLOOR = 'floor (exec stream)'
const OURS = 'addon'
const WARM = 'addon (warm pool)'
const ENGINE_PATH = common.ENGINE_PATH

function makeImpl(name, opts = {}) {
  switch (name) {
    case 'addon':
      return addonImpl.create(opts)
    case 'addon-engine':
    case ENGINE_PATH:
      return addonImpl.create({
        name: ENGINE_PATH,
        namespace: common.ADDON_ENGINE_NAMESPACE,
        extra: { agent: false },
        ...opts,
      })
    case 'floor':
      return floorImpl.create(opts)
    case 'floor-exec':
      return floorImpl.createExecStream(opts)
    case 'dockerode':
      return dockerodeImpl.create(opts)
    case 'testcontainers':
      // Loaded only when asked for: it is a large package.
      return require('./impl/testcontainers').create(opts)
    case 'cli':
      return cliImpl.create(opts)
    default:
      throw new Error(`unknown implementation ${name}`)
  }
}

/** The warm-pool variant, or the reason it cannot be made (an unknown option, say). */
function makeWarmPoolImpl() {
  const size = Number(process.env.BENCH_WARM_POOL_SIZE || 2)
  try {
    const im = addonImpl.create({
      name: WARM,
      namespace: common.ADDON_WARM_NAMESPACE,
      extra: { warmPool: { size } },
    })
    im.settleAfterMs = Number(process.env.BENCH_WARM_SETTLE_MS || 1500)
    // Start filling now where the provider can (else the first create does it).
    if (typeof im.provider.warmUp === 'function') im.provider.warmUp().catch(() => {})
    return { im, size }
  } catch (e) {
    return {
      note: `"${WARM}" rows skipped: constructing the provider with warmPool: { size: ${size} } threw: ${shortError(e)}`,
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Cleanup: everything the bench makes carries the bench label; the addon's containers also
// carry their namespace label.

async function sweepAll() {
  let n = 0
  for (const label of [
    `${common.BENCH_LABEL}=1`,
    `${common.NAMESPACE_LABEL}=${common.ADDON_NAMESPACE}`,
    `${common.NAMESPACE_LABEL}=${common.ADDON_WARM_NAMESPACE}`,
    `${common.NAMESPACE_LABEL}=${common.ADDON_ENGINE_NAMESPACE}`,
  ]) {
    n += await floorImpl.sweep(label)
  }
  return n
}

/**
 * Can the engine run a container at all (a broken bridge network, say)? Without that every
 * figure would be an error, so it counts as "could not run".
 */
async function preflight() {
  const im = floorImpl.create()
  try {
    const id = await im.createSandbox()
    const r = await im.exec(id, 'true')
    if (r.exitCode !== 0) throw new Error(`\`true\` exited ${r.exitCode}`)
  } catch (e) {
    const hint = common.NETWORK
      ? ''
      : ' (if the default bridge is what fails, BENCH_NETWORK=trueforge-bench runs every implementation on a network of its own)'
    throw new Error(`the engine cannot run a container of ${common.IMAGE}: ${shortError(e)}${hint}`)
  } finally {
    await im.cleanup()
  }
}

// ---------------------------------------------------------------------------------------------
// Reporting

function buildRows(opsRun, results) {
  const rows = []
  for (const op of opsRun) {
    const byImpl = results[op.key]
    const ours = byImpl.get(OURS)
    const oursS = ours && ours.samples.length ? summarize(ours.samples) : null
    for (const [name, r] of byImpl) {
      const s = summarize(r.samples)
      rows.push({
        op,
        impl: name,
        n: s.n,
        errors: r.errors,
        messages: r.messages,
        p50: s.p50,
        p95: s.p95,
        partP50: r.parts.length ? summarize(r.parts).p50 : NaN,
        mbps: op.bytes ? mbps(op.bytes, s.p50) : NaN,
        r50: oursS && name !== OURS ? s.p50 / oursS.p50 : name === OURS ? 1 : NaN,
        r95: oursS && name !== OURS ? s.p95 / oursS.p95 : name === OURS ? 1 : NaN,
        load: r.loads.length ? summarize(r.loads).p50 : NaN,
      })
    }
  }
  return rows
}

const HEAD = ['operation', 'impl', 'n', 'err', 'p50 ms', 'p95 ms', 'MB/s', 'alt/ours p50', 'alt/ours p95', 'load 1m']

function fmtMbps(x) {
  return fmtNum(x, x >= 100 ? 0 : x >= 1 ? 1 : 3)
}

function cells(r) {
  return [
    r.op.title,
    r.impl,
    String(r.n),
    String(r.errors),
    fmtMs(r.p50),
    fmtMs(r.p95),
    r.op.bytes ? fmtMbps(r.mbps) : '',
    r.impl === OURS ? '(ours)' : fmtRatio(r.r50),
    r.impl === OURS ? '(ours)' : fmtRatio(r.r95),
    fmtNum(r.load, 2),
  ]
}

function textTable(rows) {
  const all = [HEAD, ...rows.map(cells)]
  const w = HEAD.map((_, i) => Math.max(...all.map((c) => c[i].length)))
  const right = new Set([2, 3, 4, 5, 6, 7, 8, 9])
  const line = (c) => c.map((x, i) => (right.has(i) ? x.padStart(w[i]) : x.padEnd(w[i]))).join('  ')
  const out = [line(HEAD), w.map((n) => '-'.repeat(n)).join('  ')]
  let last = null
  for (const r of rows) {
    const c = cells(r)
    if (last === r.op.key) c[0] = ''
    else if (last !== null) out.push('')
    last = r.op.key
    out.push(line(c))
  }
  return out.join('\n')
}

function mdTable(head, rows, rightCols = []) {
  const right = new Set(rightCols)
  const esc = (s) => String(s).replace(/\|/g, '\\|')
  return [
    `| ${head.map(esc).join(' | ')} |`,
    `| ${head.map((_, i) => (right.has(i) ? '---:' : '---')).join(' | ')} |`,
    ...rows.map((c) => `| ${c.map(esc).join(' | ')} |`),
  ].join('\n')
}

function evaluateTargets(rows, mem) {
  const get = (key, impl) => rows.find((r) => r.op.key === key && r.impl === impl)
  const ok = (r) => r && r.n > 0 && Number.isFinite(r.p50)
  const targets = []
  const add = (name, met, detail) =>
    targets.push({ name, status: met === null ? 'N/A' : met ? 'MET' : 'MISSED', detail })

  for (const key of ['create', 'create_exec', 'exec_true', 'exec_1m']) {
    const ours = get(key, OURS)
    const floor = get(key, 'floor')
    const dko = get(key, 'dockerode')
    const cli = get(key, 'cli')
    if (!ok(ours) || !ok(floor)) {
      add(`${key}: p50 within 1.1× of the floor, no slower than dockerode or the CLI`, null, 'not measured')
      continue
    }
    const parts = [
      `ours ${fmtMs(ours.p50)} ms, floor ${fmtMs(floor.p50)} ms (${(ours.p50 / floor.p50).toFixed(2)}×, limit 1.10×)`,
    ]
    let met = ours.p50 <= 1.1 * floor.p50
    for (const [label, r] of [
      ['dockerode', dko],
      ['CLI', cli],
    ]) {
      if (!ok(r)) continue
      parts.push(`${label} ${fmtMs(r.p50)} ms`)
      met = met && ours.p50 <= r.p50
    }
    add(`${ours.op.title}: p50 ≤ 1.1× floor and ≤ dockerode, CLI`, met, parts.join('; '))
  }

  for (const size of ['1KiB', '10MiB', '100MiB']) {
    for (const dir of ['upload', 'download']) {
      const key = `${dir}_${size}`
      const ours = get(key, OURS)
      const floor = get(key, 'floor')
      const cli = get(key, 'cli')
      if (!ok(ours) || !ok(floor)) {
        add(`${dir} ${size}: throughput ≥ 0.9× floor and above docker cp`, null, 'not measured')
        continue
      }
      let met = ours.mbps >= 0.9 * floor.mbps
      const parts = [
        `ours ${fmtMbps(ours.mbps)} MB/s, floor ${fmtMbps(floor.mbps)} MB/s (${(ours.mbps / floor.mbps).toFixed(2)}×, need ≥ 0.90×)`,
      ]
      if (ok(cli)) {
        met = met && ours.mbps > cli.mbps
        parts.push(`docker cp ${fmtMbps(cli.mbps)} MB/s`)
      }
      add(`${dir} ${size}: throughput ≥ 0.9× floor and > docker cp`, met, parts.join('; '))
    }
  }

  for (const dir of ['upload', 'download']) {
    const m = mem && mem[OURS] && mem[OURS][dir]
    if (!m || !Number.isFinite(m.growth)) {
      add(`peak RSS growth during the 100 MiB ${dir} ≤ 2× payload`, null, 'not measured')
      continue
    }
    const d = mem.dockerode && mem.dockerode[dir]
    const extra = d && Number.isFinite(d.growth) ? `; dockerode ${fmtBytes(d.growth)}` : ''
    add(
      `peak RSS growth during the 100 MiB ${dir} ≤ 2× payload`,
      m.growth <= 2 * 100 * MiB,
      `ours ${fmtBytes(m.growth)} (${(m.growth / (100 * MiB)).toFixed(2)}× payload)${extra}`,
    )
  }

  const ours = get('exec_x50', OURS)
  const dko = get('exec_x50', 'dockerode')
  if (!ok(ours)) add('50 concurrent execs: no errors, wall time ≤ dockerode', null, 'not measured')
  else {
    let met = ours.errors === 0
    const parts = [`ours ${ours.errors} errors, p50 ${fmtMs(ours.p50)} ms`]
    if (ok(dko)) {
      met = met && ours.p50 <= dko.p50
      parts.push(`dockerode p50 ${fmtMs(dko.p50)} ms`)
    }
    add('50 concurrent execs: no errors, wall time ≤ dockerode', met, parts.join('; '))
  }
  return targets
}

// The agent's bounds against the floor for the rows the run under load repeats: one place, so
// the two sections judge alike.
const FLOOR_BOUNDS = { exec_true: 0.1, exec_x50: 0.2 }

/** The issue's bounds for the agent path, against the floor (the fewest raw engine requests). */
function agentTargets(rows, probe) {
  const get = (key, impl) => rows.find((r) => r.op.key === key && r.impl === impl)
  const ok = (r) => r && r.n > 0 && Number.isFinite(r.p50)
  const targets = []
  const add = (name, met, detail) =>
    targets.push({ name, status: met === null ? 'N/A' : met ? 'MET' : 'MISSED', detail })
  const vsFloor = (key, factor, title) => {
    const ours = get(key, OURS)
    const floor = get(key, 'floor')
    const eng = get(key, ENGINE_PATH)
    if (!ok(ours) || !ok(floor)) return add(`agent: ${title} ≤ ${factor}× the floor`, null, 'not measured')
    const engine = ok(eng) ? `; the engine-exec path ${fmtMs(eng.p50)} ms` : ''
    add(
      `agent: ${title} ≤ ${factor}× the floor`,
      ours.p50 <= factor * floor.p50,
      `ours ${fmtMs(ours.p50)} ms, floor ${fmtMs(floor.p50)} ms (${(ours.p50 / floor.p50).toFixed(3)}×)${engine}`,
    )
  }
  vsFloor('exec_true', FLOOR_BOUNDS.exec_true, 'exec `true` p50')
  vsFloor('exec_x50', FLOOR_BOUNDS.exec_x50, '50 concurrent execs over 10 sandboxes, wall p50')
  vsFloor('upload_1KiB', 0.15, '1 KiB upload p50')
  vsFloor('download_1KiB', 0.15, '1 KiB download p50')
  for (const dir of ['upload', 'download']) {
    const key = `${dir}_100MiB`
    const title = `agent: 100 MiB ${dir} ≥ 0.9× the floor's throughput`
    const ours = get(key, OURS)
    const floor = get(key, 'floor')
    if (!ok(ours) || !ok(floor)) {
      add(title, null, 'not measured')
      continue
    }
    // What the exec stream itself moves, with nothing of ours on it: the bound for the agent.
    const viaExec = get(key, EXEC_FLOOR)
    const bound = ok(viaExec)
      ? `; through a raw exec's stream (\`cat\`, nothing of ours) ${fmtMbps(viaExec.mbps)} MB/s: ours is ${(ours.mbps / viaExec.mbps).toFixed(2)}× that`
      : ''
    add(
      title,
      ours.mbps >= 0.9 * floor.mbps,
      `ours ${fmtMbps(ours.mbps)} MB/s, floor ${fmtMbps(floor.mbps)} MB/s (${(ours.mbps / floor.mbps).toFixed(2)}×)${bound}`,
    )
  }
  const create = get('create', OURS)
  const first = get('create_exec', OURS)
  // Judged within each sample (the first exec timed right after its own create): the two rows'
  // p50s come from different samples, and create's spread alone is wider than 15 ms.
  if (!ok(create) || !ok(first) || !Number.isFinite(first.partP50))
    add('agent: create → first exec ≤ create + 15 ms', null, 'not measured')
  else
    add(
      'agent: create → first exec ≤ create + 15 ms',
      first.partP50 <= 15,
      `the first exec right after its create: p50 ${fmtMs(first.partP50)} ms; across rows: create ${fmtMs(create.p50)} ms, create → first exec ${fmtMs(first.p50)} ms (${fmtSigned(first.p50 - create.p50, fmtMs)} ms)`,
    )
  if (!probe || probe.error) {
    const why = probe ? probe.error : 'not measured'
    add('agent: idle RSS in the sandbox (with the shepherds it keeps ready) ≤ 8 MiB', null, why)
    add('agent: host RSS growth for 1 GiB of output ≤ 30 MiB', null, why)
  } else {
    add(
      'agent: idle RSS in the sandbox (with the shepherds it keeps ready) ≤ 8 MiB',
      probe.idleRssBytes <= 8 * MiB,
      fmtBytes(probe.idleRssBytes),
    )
    add(
      'agent: host RSS growth for 1 GiB of output ≤ 30 MiB',
      probe.hostGrowthBytes <= 30 * MiB,
      `${fmtBytes(probe.hostGrowthBytes)} while 1 GiB went through in ${fmtMs(probe.outputMs)} ms (${fmtBytes(probe.keptBytes)} kept under the output cap)`,
    )
  }
  return targets
}

const LIMIT_FACTOR = 1.25

/** exec `true` through the agent against the in-sandbox limit measured beside it, both in a
 * loop (the row's alternating figure is given beside it). */
function execLimitTargets(rows, limit) {
  const name = `exec \`true\` p50 ≤ ${LIMIT_FACTOR} × (shell spawn + exec-stream echo), each in a loop`
  const row = rows.find((r) => r.op.key === 'exec_true' && r.impl === OURS)
  if (!limit || limit.error || !limit.loop?.n) return [{ name, status: 'N/A', detail: limit?.error || 'not measured' }]
  const ours = limit.loop.p50
  const alternating = row?.n
    ? `; alternating with the other implementations (the row above) ${fmtMs(row.p50)} ms, ${(row.p50 / limit.limitMs).toFixed(2)}×`
    : ''
  return [
    {
      name,
      status: ours <= LIMIT_FACTOR * limit.limitMs ? 'MET' : 'MISSED',
      detail: `ours ${fmtMs(ours)} ms, limit ${fmtMs(limit.limitMs)} ms (\`${limit.shell} -c true\` ${fmtMs(limit.spawnMs)} ms + echo ${fmtMs(limit.echo.p50)} ms): ${(ours / limit.limitMs).toFixed(2)}×, bound ${fmtMs(LIMIT_FACTOR * limit.limitMs)} ms${alternating}`,
    },
  ]
}

/** Per repeated row: ours and the floor under load, their ratio, and the same ratio quiet. */
function loadRows(load, results) {
  return LOAD_OPS.map((key) => {
    const op = OPS.find((o) => o.key === key)
    const p50 = (m, name) => (m && m.get(name) ? summarize(m.get(name).samples).p50 : NaN)
    const loaded = load.results[key]
    const ours = p50(loaded, OURS)
    const floor = p50(loaded, 'floor')
    const quiet = results[key] ? p50(results[key], OURS) / p50(results[key], 'floor') : NaN
    const both = [...loaded.values()]
    return {
      key,
      title: op.title,
      ours,
      floor,
      ratio: ours / floor,
      quiet,
      errors: both.reduce((n, r) => n + r.errors, 0),
      load: summarize(both.flatMap((r) => r.loads)).p50,
    }
  })
}

function loadTargets(load, results) {
  const bounds = LOAD_OPS.map(
    (k) => `${k === 'exec_true' ? 'exec `true`' : '50 concurrent execs'} ≤ ${FLOOR_BOUNDS[k]}×`,
  )
  const name = `Under load (${load.spinners ?? '?'} CPU-bound processes beside the bench): ours/floor p50 within the quiet targets (${bounds.join(', ')})`
  if (load.error) return [{ name, status: 'N/A', detail: load.error }]
  const rows = loadRows(load, results)
  const ok = rows.every((r) => r.errors === 0 && Number.isFinite(r.ratio) && r.ratio <= FLOOR_BOUNDS[r.key])
  return [
    {
      name,
      status: ok ? 'MET' : 'MISSED',
      detail: rows
        .map(
          (r) =>
            `${r.title}: ${fmtRatio3(r.ratio)} (ours ${fmtMs(r.ours)} ms, floor ${fmtMs(r.floor)} ms, ${r.errors} errors; quiet ${Number.isFinite(r.quiet) ? fmtRatio3(r.quiet) : 'not measured'})`,
        )
        .join('; '),
    },
  ]
}

/**
 * Runs a bench script of ours in a child process (node `args`, the script first) and resolves
 * with the JSON object it prints at the end (on one line, or pretty-printed from a line that
 * starts with `{`), or `{ error }` (never rejects: one section failing leaves the others).
 */
function childJson(args, timeout) {
  return new Promise((resolve) => {
    execFile(process.execPath, args, { maxBuffer: 16 * MiB, timeout }, (err, stdout, stderr) => {
      if (err) return resolve({ error: (stderr || err.message).trim().split('\n').slice(-3).join(' ') })
      try {
        resolve(JSON.parse(stdout.slice(stdout.lastIndexOf('\n{') + 1)))
      } catch (e) {
        resolve({ error: `unreadable output: ${e.message}` })
      }
    })
  })
}

/** The agent probe (bench/agentprobe.js): its idle RSS, the host while a command prints 1 GiB. */
function agentProbe() {
  return childJson(['--expose-gc', path.join(__dirname, 'agentprobe.js')], 300_000)
}

/** The Code Mode round trip (bench/codemode.js). */
function codeModeBench() {
  const { BENCH_CM_API = '300', BENCH_CM_CLI = '60', BENCH_CM_ROUNDS = '5' } = process.env
  return childJson([path.join(__dirname, 'codemode.js'), BENCH_CM_API, BENCH_CM_CLI, BENCH_CM_ROUNDS], 600_000)
}

/** Code Mode under pressure (bench/codemode-pressure.js). */
function codeModePressureBench() {
  return childJson([path.join(__dirname, 'codemode-pressure.js'), process.env.BENCH_CM_PRESSURE || '1,4,16'], 1_200_000)
}

/**
 * gVisor beside runc (bench/runsc.js) on the engine of scripts/engines/gvisor-engine.sh, started for it
 * and stopped after (`{ error }` where it cannot run: no root, no runsc package).
 */
async function runscBench() {
  const script = path.join(__dirname, '..', 'scripts', 'engines', 'gvisor-engine.sh')
  const sh = (cmd) =>
    new Promise((resolve) =>
      execFile('bash', [script, cmd], { timeout: 300_000 }, (err, _o, e) =>
        resolve(err ? (e || err.message).trim() : null),
      ),
    )
  const failed = await sh('start')
  if (failed) {
    await sh('teardown')
    return { error: `the gVisor engine did not start: ${failed.split('\n').slice(-2).join(' ')}` }
  }
  try {
    return await childJson([path.join(__dirname, 'runsc.js')], 900_000)
  } finally {
    await sh('teardown')
  }
}

/**
 * gVisor's target: the agent's exec within 0.2 of the engine's exec floor, both on runsc, the
 * floor taken in the same sandbox and the same minutes; judged on ours one call after another.
 */
function runscTargets(r) {
  const name = 'gVisor: exec `true` through the agent on runsc, p50 ≤ 0.2 × the engine exec floor on runsc'
  if (r.error) return [{ name, status: 'N/A', detail: r.error }]
  const a = r.runsc?.agent
  if (a?.execTrueP50Ms === undefined || a.floorExecTrueP50Ms === undefined) {
    return [{ name, status: 'N/A', detail: JSON.stringify(r.runsc).slice(0, 300) }]
  }
  const ratio = (x) => Math.round((x / a.floorExecTrueP50Ms) * 100) / 100
  return [
    {
      name,
      status: ratio(a.execTrueP50Ms) <= 0.2 ? 'MET' : 'MISSED',
      detail: `one after another ${a.execTrueP50Ms} ms, floor ${a.floorExecTrueP50Ms} ms: ${ratio(a.execTrueP50Ms)}×; each after a floor's exec ${a.execAlternatingP50Ms} ms (${ratio(a.execAlternatingP50Ms)}×); spawning the command's shell alone takes ${a.shellSpawnMs} ms in the sandbox on runsc, ${ratio(a.shellSpawnMs)}× the floor (every system call crosses gVisor's ptrace platform)`,
    },
  ]
}

/** What one engine holds (bench/capacity.js). */
function capacityBench() {
  return childJson(
    [
      '--expose-gc',
      path.join(__dirname, 'capacity.js'),
      process.env.BENCH_CAPACITY || '20,200',
      process.env.BENCH_CAPACITY_BUSY ?? '10,20',
    ],
    1_800_000,
  )
}

/** Host memory per idle sandbox within 0.5 MiB of a raw client's; a burst at the floor. */
function capacityTargets(c) {
  const counts = (process.env.BENCH_CAPACITY || '20,200').split(',').join(' and ')
  const memory = `Host memory per idle sandbox (${counts}): at most 0.5 MiB more than a raw client holding as many`
  if (c.error) return [{ name: memory, status: 'N/A', detail: c.error.split('\n')[0] }]
  const host = c.host.filter(Boolean)
  return [
    {
      name: memory,
      status: host.length && host.every((h) => h.moreMiB <= 0.5) ? 'MET' : 'MISSED',
      detail: host
        .map((h) => `${h.sandboxes}: ours ${h.oursMiB} MiB, raw ${h.rawMiB} MiB (${fmtSigned(h.moreMiB)})`)
        .join('; '),
    },
    ...(c.bursts || []).map((b) => ({
      name: `A burst of ${b.sandboxes} creates, each running its first command: wall time ≤ 1.0 × the floor's`,
      status: b.oursErrors === 0 && b.ratio <= 1 ? 'MET' : 'MISSED',
      detail: `median of ${b.pairs.length} alternating pairs: ours ${b.oursMs} ms (${b.oursErrors} errors), floor ${b.floorMs} ms: ${b.ratio}×`,
    })),
    ...busyTargets(c.busy || [], c.cpus),
  ]
}

/**
 * Busy sandboxes: no errors, and the agent's exec of `true` in a probe sandbox beside them still
 * under what the engine's own exec costs with nothing busy. A raw exec is the least any client
 * of the engine pays per command, so a session through the agent on a busy engine stays better
 * off than any client of a quiet one.
 */
function busyTargets(busy, cpus) {
  if (!busy.length) return []
  const name = `Busy (${busy.map((b) => b.sandboxes).join(' and ')} sandboxes each running a command loop through the agent, ${cpus} CPUs): no errors, and exec \`true\` p50 through the agent in a probe sandbox under the engine's idle exec floor (raw create + start + inspect of \`true\`, beside the same sandboxes idle)`
  const failed = busy.find((b) => b.error || !b.busy)
  if (failed) return [{ name, status: 'N/A', detail: (failed.error || 'no busy phase').split('\n')[0] }]
  return [
    {
      name,
      status: busy.every((b) => b.errors === 0 && b.busy.execTrueP50Ms < b.idle.floorExecTrueP50Ms) ? 'MET' : 'MISSED',
      detail: busy
        .map(
          (b) =>
            `${b.sandboxes}: agent ${b.busy.execTrueP50Ms} ms busy (${b.idle.execTrueP50Ms} idle), floor ${b.idle.floorExecTrueP50Ms} ms idle (${b.busy.floorExecTrueP50Ms} busy), ${b.errors} errors`,
        )
        .join('; '),
    },
  ]
}

/** The egress proxy (bench/egress.js). */
function egressBench() {
  return childJson([path.join(__dirname, 'egress.js'), process.env.BENCH_EGRESS_ROUNDS || '5'], 900_000)
}

/** The egress proxy's targets: its throughput against the agent's own, its set-up cost. */
function egressTargets(e) {
  const throughput = "Egress: a 100 MiB download through the proxy ≥ 0.8 × the agent's own downloadFile throughput"
  const setup = 'Egress: connection set-up through the proxy, p50 ≤ 2 ms over a direct loopback connect from the host'
  if (e.error) return [{ name: throughput, status: 'N/A', detail: e.error }]
  const d = e.download_100mib_mbps
  return [
    {
      name: throughput,
      status: d.ratio >= 0.8 ? 'MET' : 'MISSED',
      detail: `${d.proxy} MB/s through the proxy, ${d.download_file} MB/s by downloadFile: ${d.ratio}×`,
    },
    {
      name: setup,
      status: e.setup_ms.overhead_p50 <= 2 ? 'MET' : 'MISSED',
      detail: `CONNECT answered in ${e.setup_ms.proxy_p50} ms p50 in the sandbox, a direct connect ${e.setup_ms.direct_p50} ms on the host: ${e.setup_ms.overhead_p50} ms more`,
    },
  ]
}

/**
 * What hostile Code Mode requests can make the host hold: resident memory within twice the
 * in-flight bound, no event-loop stall over 100 ms.
 */
function codeModePressureTargets(p) {
  const memory = 'Code Mode, dense requests from 1/4/16 sandboxes: host RSS growth ≤ 2 × the in-flight bound'
  const stall = 'Code Mode, dense requests from 1/4/16 sandboxes: no event-loop stall over 100 ms'
  if (p.error) return [{ name: memory, status: 'N/A', detail: p.error }]
  const each = (f) => p.runs.map((r) => `${r.sandboxes}/${r.scenario} ${f(r)}`).join(', ')
  return [
    {
      name: memory,
      status: p.runs.every((r) => r.ratio <= 2) ? 'MET' : 'MISSED',
      detail: each((r) => `${r.ratio}×`),
    },
    {
      name: stall,
      status: p.runs.every((r) => r.maxStallMs <= 100) ? 'MET' : 'MISSED',
      detail: each((r) => `${r.maxStallMs} ms`),
    },
  ]
}

/**
 * The issue's bounds for Code Mode through the agent: the Python API within 1.2 × (the
 * bind-mounted socket's round trip + one round trip on the engine's exec stream, which any
 * transport over that stream adds), and the static `mcp-client` within 10 ms.
 */
function codeModeTargets(cm) {
  const api = 'Code Mode Python API round trip: p50 ≤ 1.2 × (bind-mounted socket + exec-stream echo)'
  const cli = 'Code Mode `mcp-client call-tool` in the sandbox (the static client): p50 ≤ 10 ms'
  if (cm.error) return [{ name: api, status: 'N/A', detail: cm.error }]
  return [
    {
      name: api,
      status: cm.agent.api_p50 <= cm.target_api_p50_ms ? 'MET' : 'MISSED',
      detail: `agent ${cm.agent.api_p50} ms, bound ${cm.target_api_p50_ms} ms (floor ${cm.floor.api_p50} ms + echo ${cm.engine_exec_echo.p50} ms); the Python relay (agent: false) ${cm.relay?.api_p50 ?? '–'} ms`,
    },
    {
      name: cli,
      status: cm.agent.cli_p50 <= cm.target_cli_p50_ms ? 'MET' : 'MISSED',
      detail: `static client ${cm.agent.cli_p50} ms; the Python CLI over the same agent ${cm.agent.pycli_p50} ms, through the Python relay ${cm.relay?.cli_p50 ?? '–'} ms, at the floor ${cm.floor.cli_p50} ms`,
    },
  ]
}

/** Ratios far below 1, where two decimals would hide the change. */
function fmtRatio3(x) {
  return Number.isFinite(x) ? `${x.toFixed(3)}×` : '-'
}

/** The 1-minute load average at a child section's start and end. */
function sectionLoad(l) {
  return l ? `1-minute load average: ${fmtNum(l[0], 2)} at its start, ${fmtNum(l[1], 2)} at its end.` : ''
}

function fmtLoad(l) {
  return l.map((x) => x.toFixed(2)).join(' / ')
}

/** The capacity section's busy part: each count's sandboxes idle, then busy, side by side. */
function renderBusy(L, capacity) {
  L.push('')
  L.push('### Busy sandboxes')
  L.push('')
  const runs = capacity.busy
  for (const b of runs) if (b.error) L.push(`${b.sandboxes} busy: could not run: ${b.error.split('\n')[0]}`, '')
  const ok = runs.filter((b) => !b.error && b.busy)
  if (!ok.length) return
  const w = ok[0].setup
  const both = (f) => ok.flatMap((b) => [f(b.idle, b), f(b.busy, b)])
  const rows = [
    ['exec `true` through the agent, p50 ms', both((x) => fmtMs(x.execTrueP50Ms))],
    ['exec `true` through the agent, p95 ms', both((x) => fmtMs(x.execTrueP95Ms))],
    ['1 KiB upload, p50 ms', both((x) => fmtMs(x.upload1KiBP50Ms))],
    ['1 KiB download, p50 ms', both((x) => fmtMs(x.download1KiBP50Ms))],
    ['create → first exec of one more sandbox, p50 ms', both((x) => fmtMs(x.createFirstExecP50Ms))],
    [
      "the engine's exec floor (raw create + start + inspect of `true`), p50 ms",
      both((x) => fmtMs(x.floorExecTrueP50Ms)),
    ],
    [
      'host process RSS per sandbox, MiB (after collections / peak)',
      both((x) => `${x.hostRssPerSandboxMiB} / ${x.hostPeakRssPerSandboxMiB}`),
    ],
    ["the engine's processes' CPU, % of one CPU", both((x) => x.engineCpuPct)],
    [`the machine's CPU busy, % of its ${capacity.cpus}`, both((x) => x.machineBusyPct)],
    ['1-minute load average', both((x) => x.load1)],
    ['MemAvailable, GiB', both((x) => x.memAvailableGiB)],
    ['errors', both((x) => x.errors)],
    [
      'busy loop: rounds per second (all sandboxes) / round p50 ms / its exec p50 ms',
      ok.flatMap((b) => [
        '',
        `${b.workload.roundsPerSecond} / ${fmtMs(b.workload.roundP50Ms)} / ${fmtMs(b.workload.execP50Ms)}`,
      ]),
    ],
  ]
  L.push(
    mdTable(
      ['probe sandbox, beside', ...ok.flatMap((b) => [`${b.sandboxes} idle`, `${b.sandboxes} busy`])],
      rows.map(([label, cells]) => [label, ...cells]),
      ok.flatMap((_, i) => [1 + 2 * i, 2 + 2 * i]),
    ),
  )
  L.push('')
  for (const b of ok)
    if (b.errors) L.push(`${b.sandboxes} busy: ${b.errors} error(s): ${b.errorMessages.join(' | ')}`, '')
  L.push(
    `Each busy sandbox runs rounds of: an exec of a shell loop (20,000 rounds of arithmetic, then four 64 KiB files written and read back; its output checked), a ${w.fileKiB} KiB \`uploadFile\` and its \`downloadFile\` (the bytes checked), then a ${w.pauseMs} ms pause; the sandboxes start staggered and loop for ${w.warmupMs / 1000} s before the busy column is measured. The probe, in a sandbox of its own in the same process: ${w.probe.exec} execs of \`true\`, ${w.probe.xfer} uploads and downloads of 1 KiB, ${w.probe.create} creates of one more sandbox each with its first exec (removed after), and the floor's ${w.probe.floor} raw execs in a container of its own (no network). Idle: the same sandboxes held, each having run one command. Each count runs in a child process of its own; its RSS per sandbox is over that process holding only the probe. The engine's and the machine's figures are over ${w.loadWindowMs / 1000} s before the probe, with only the sandboxes running (the probe's creates and raw execs are engine work of their own); the engine and the machine are shared with whatever else runs there, and the load average lags by its minute.`,
  )
}

function renderMarkdown({
  env,
  presetName,
  reps,
  rows,
  mem,
  reqs,
  codemode,
  pressure,
  egress,
  runsc,
  capacity,
  limit,
  load,
  results,
  sectionLoads,
  targets,
  notes,
  wallMs,
}) {
  const L = []
  L.push('# Benchmark results')
  L.push('')
  L.push('Generated by `node bench/run.js`; do not edit by hand. Times are milliseconds; `alt/ours` is the')
  L.push("alternative's time over the addon's (above 1× means the addon is faster). MB/s is 10^6 bytes/s at")
  L.push('the p50 time. Percentiles interpolate between ranks, so with few repetitions p95 is near the maximum.')
  L.push('')
  L.push('## Environment')
  L.push('')
  L.push(
    mdTable(
      ['', ''],
      [
        ['date', env.date],
        ['engine', `Docker ${env.engine.Version} (API ${env.engine.ApiVersion}, ${env.engine.Os}/${env.engine.Arch})`],
        ['kernel', env.kernel],
        ['CPUs', `${env.cpus} × ${env.cpuModel}`],
        ['memory', `${(os.totalmem() / 1024 ** 3).toFixed(1)} GiB`],
        ['node', env.node],
        ['image', common.IMAGE],
        [
          'network',
          common.NETWORK
            ? `${common.NETWORK} (BENCH_NETWORK; a user-defined bridge for every implementation)`
            : "the engine's default bridge",
        ],
        [
          'repetitions',
          `${presetName}: ${Object.entries(reps)
            .map(([k, v]) => `${k}=${v}`)
            .join(', ')} (plus one warm-up each)`,
        ],
        [
          'load average (1/5/15 min)',
          `${fmtLoad(env.loadStart)} at start, ${fmtLoad(os.loadavg())} at the end (other work on the machine widens p95 and can flip close comparisons)`,
        ],
        ['total run time', `${(wallMs / 1000).toFixed(0)} s`],
      ],
    ),
  )
  L.push('')
  L.push('Implementations: **addon** (this package), **floor** (fewest raw Engine API requests over the unix')
  L.push('socket with Node `http`), **dockerode** (minimal dockerode + tar-stream equivalent), **testcontainers**')
  L.push('(the `testcontainers` package as its users write it: GenericContainer…start(), exec, copyContentToContainer,')
  L.push(
    'copyArchiveFromContainer, stop; its Ryuk reaper off), **cli** (`docker` run/exec/cp through child processes).',
  )
  L.push('Repetitions alternate between implementations, rotating the order. `load 1m` is the median of the')
  L.push("machine's 1-minute load average taken after each of the row's samples.")
  L.push('')
  L.push('## Results')
  L.push('')
  L.push(mdTable(HEAD, rows.map(cells), [2, 3, 4, 5, 6, 7, 8, 9]))
  L.push('')
  if (limit) {
    L.push('## Exec `true` against the in-sandbox limit')
    L.push('')
    if (limit.error) L.push(`Could not run: ${limit.error}`)
    else {
      const ours = rows.find((r) => r.op.key === 'exec_true' && r.impl === OURS)
      L.push(
        mdTable(
          ['measure', 'ms', 'load 1m'],
          [
            [
              `\`${limit.shell} -c true\` spawned in the sandbox as its user, per spawn, the median of the rounds (${(limit.spawns ?? []).map(fmtMs).join(', ')})`,
              fmtMs(limit.spawnMs),
              fmtNum(limit.spawnLoad, 2),
            ],
            [
              `a 128-byte echo through an attached engine exec stream, p50 (p99 ${fmtMs(limit.echo.p99)})`,
              fmtMs(limit.echo.p50),
              fmtNum(limit.echoLoad, 2),
            ],
            ['the limit: spawn + echo', fmtMs(limit.limitMs), ''],
            [
              `exec \`true\` through the addon, one after another, p50 (p95 ${fmtMs(limit.loop.p95)})`,
              fmtMs(limit.loop.p50),
              fmtNum(limit.loopLoad, 2),
            ],
            ['exec `true` one after another / the limit', fmtRatio(limit.loop.p50 / limit.limitMs), ''],
            [
              'exec `true` through the addon alternating with the other implementations, p50 (the row above)',
              ours ? fmtMs(ours.p50) : '–',
              ours ? fmtNum(ours.load, 2) : '',
            ],
            ['exec `true` alternating / the limit', ours ? fmtRatio(ours.p50 / limit.limitMs) : '–', ''],
          ],
          [1, 2],
        ),
      )
      L.push('')
      L.push(
        `Measured in the addon's work sandbox right after the exec \`true\` rows, in ${limit.rounds ?? 1} rounds, each taking the three one after the other, so that the machine's drift weighs on all three alike. The spawn: the addon's exec of a loop of ${limit.n} \`${limit.shell} -c true\` (the shell the addon runs commands with in ${common.IMAGE}) less an empty loop, each the best of three, so the exec carrying the loop cancels out. The echo: ${ECHO_ROUNDS} round trips in all (after 20 unrecorded in each round) of 120 bytes to \`cat\` in the same container and back on one attached exec stream, the hop any transport over that stream adds. Ours one after another: ${ECHO_ROUNDS} execs of \`true\` in all (after 5 unrecorded in each round) in the same sandbox, in a loop as the spawn and the echo are; the target is judged on it. Alternating, each exec of ours follows the other implementations' calls (tens of milliseconds of quiet for the agent), as the rows above are taken.`,
      )
    }
    L.push('')
  }
  if (load) {
    L.push(`## Under load (${load.spinners ?? '?'} CPU-bound processes beside the bench)`)
    L.push('')
    if (load.error) L.push(`Could not run: ${load.error}`)
    else {
      L.push(
        mdTable(
          ['operation', 'ours p50 ms', 'floor p50 ms', 'ours/floor under load', 'ours/floor quiet', 'err', 'load 1m'],
          loadRows(load, results).map((r) => [
            r.title,
            fmtMs(r.ours),
            fmtMs(r.floor),
            fmtRatio3(r.ratio),
            fmtRatio3(r.quiet),
            String(r.errors),
            fmtNum(r.load, 2),
          ]),
          [1, 2, 3, 4, 5, 6],
        ),
      )
      L.push('')
      L.push(
        `The same operations as the rows above, for the addon and the floor only, while ${load.spinners} child processes each spin a CPU (\`for (;;);\` in node), started a second before the first sample and stopped after the last; the quiet ratio is the one of the rows above. The 1-minute load average lags: it climbs through the section.`,
      )
    }
    L.push('')
  }
  if (mem) {
    L.push('## Peak RSS growth (100 MiB transfer, fresh child process each)')
    L.push('')
    const mrows = []
    for (const [name, m] of Object.entries(mem)) {
      if (m.skipped) {
        mrows.push([name, '–', '–', '', `left out: ${m.skipped}`])
        continue
      }
      if (m.error) {
        mrows.push([name, 'error', 'error', '', m.error])
        continue
      }
      const cell = (d) =>
        d && Number.isFinite(d.growth) ? `${fmtBytes(d.growth)} (${(d.growth / (100 * MiB)).toFixed(2)}×)` : 'error'
      const errs = [...(m.upload?.errors || []), ...(m.download?.errors || [])]
      mrows.push([name, cell(m.upload), cell(m.download), fmtNum(m.load, 2), errs.join('; ')])
    }
    L.push(mdTable(['impl', 'upload', 'download', 'load 1m', 'errors'], mrows, [3]))
    L.push('')
    L.push('Growth is peak RSS (sampled every 2 ms) minus RSS just before the call, after GC, with the upload')
    L.push('payload already resident; a download necessarily holds the 100 MiB result (1×). Worst of the runs.')
    L.push('')
  }
  if (reqs) {
    L.push('## Engine requests per operation (counting proxy, untimed pass)')
    L.push('')
    const rrows = []
    for (const [name, r] of Object.entries(reqs)) {
      if (r.error) {
        rrows.push([name, r.error, '', '', ''])
        continue
      }
      rrows.push([name, ...['create', 'exec', 'upload', 'download'].map((k) => `${r[k].length}: ${r[k].join(', ')}`)])
    }
    L.push(mdTable(['impl', 'create', 'exec', 'upload', 'download'], rrows))
    L.push('')
  }
  if (codemode) {
    L.push('## Code Mode round trip (`call_tool` from inside the sandbox)')
    L.push('')
    L.push(sectionLoad(sectionLoads.codemode))
    L.push('')
    if (codemode.error) L.push(`Could not run: ${codemode.error}`)
    else {
      const { agent, relay, floor } = codemode
      L.push(
        mdTable(
          ['client', 'agent p50', 'agent p99', 'Python relay p50', 'floor p50', 'floor p99'],
          [
            ['Python API', agent.api_p50, agent.api_p99, relay.api_p50, floor.api_p50, floor.api_p99],
            ['CLI (`mcp-client call-tool`)', agent.cli_p50, agent.cli_p99, relay.cli_p50, floor.cli_p50, floor.cli_p99],
            ['Python CLI (`mcp-client-python`)', agent.pycli_p50, '', '', '', ''],
          ],
          [1, 2, 3, 4, 5],
        ),
      )
      L.push('')
      L.push(
        `Image ${codemode.image}; ${codemode.apiCalls} API and ${codemode.cliCalls} CLI calls per round, best of ${codemode.rounds} rounds. Agent: the provider's transport through the in-sandbox agent (its socket; \`mcp-client\` is its static client). Python relay: the same with \`agent: false\` (a Python relay in the sandbox; \`mcp-client\` is the Python CLI). Both ride the engine's attached exec stream. Floor: the same client and dispatcher over a Unix socket bind-mounted from the host. Python start-up alone (\`import mcp_client\`): ${agent.startup_p50} ms. The engine's own round trip on an attached exec stream (128 bytes to \`cat\` and back, which any transport over that stream adds to the floor): p50 ${codemode.engine_exec_echo.p50} ms, p99 ${codemode.engine_exec_echo.p99} ms; floor plus that echo: ${codemode.design_floor_api_p50_ms} ms (agent ${codemode.ratio.agent_api_p50_vs_design_floor}× that, Python relay ${codemode.ratio.relay_api_p50_vs_design_floor}×).`,
      )
    }
    L.push('')
  }
  if (runsc) {
    L.push("## gVisor (`runtime: 'runsc'`) beside runc (`bench/runsc.js`)")
    L.push('')
    L.push(sectionLoad(sectionLoads.runsc))
    L.push('')
    if (runsc.error) L.push(`Could not run: ${runsc.error}`)
    else {
      const row = (label, f) => [
        label,
        ...['runc', 'runsc'].flatMap((rt) => ['agent', 'agentFalse'].map((a) => f(runsc[rt]?.[a] ?? {}))),
      ]
      L.push(
        mdTable(
          ['p50', 'runc, agent', 'runc, agent: false', 'runsc, agent', 'runsc, agent: false'],
          [
            row('exec `true`, one after another, ms', (x) => x.execTrueP50Ms ?? x.error ?? '–'),
            row('exec `true`, each after a floor exec, ms', (x) => x.execAlternatingP50Ms ?? '–'),
            row('engine exec floor `true`, ms', (x) => x.floorExecTrueP50Ms ?? ''),
            row('a shell `-c true` spawned in the sandbox, ms', (x) => x.shellSpawnMs ?? ''),
            row('create → first exec, ms', (x) => x.createToFirstExecP50Ms ?? '–'),
            row('1 KiB upload / download, ms', (x) =>
              x.files ? `${x.files['1KiB'].uploadP50Ms} / ${x.files['1KiB'].downloadP50Ms}` : '–',
            ),
            row('100 MiB upload / download, MB/s', (x) =>
              x.files ? `${x.files['100MiB'].uploadMBps} / ${x.files['100MiB'].downloadMBps}` : '–',
            ),
            row('Code Mode `mcp-client call-tool` round trip, ms', (x) => x.codeModeCallMs ?? ''),
          ],
          [1, 2, 3, 4],
        ),
      )
      L.push('')
      L.push(
        `Image ${runsc.image}, ${runsc.rounds ?? 1} rounds of ${runsc.runs} execs one after another, then ${runsc.runs} of the floor's execs each followed by one of ours, on a private engine (scripts/engines/gvisor-engine.sh) that runs both runtimes, so the two columns share everything but the runtime. The floor is the fewest raw requests for an exec (create, start to the stream's end, inspect), in the same sandbox and the same minutes as ours. The Code Mode round trip is the agent's static \`mcp-client call-tool\` in the sandbox to a dispatcher in the bench's process, per call in a loop of ${runsc.runs} less an empty loop (Code Mode without the agent needs Python, which the image lacks).`,
      )
    }
    L.push('')
  }
  if (egress) {
    L.push('## Egress under a policy (`bench/egress.js`)')
    L.push('')
    L.push(sectionLoad(sectionLoads.egress))
    L.push('')
    if (egress.error) L.push(`Could not run: ${egress.error}`)
    else {
      const d = egress.download_100mib_mbps
      const u = egress.setup_ms
      L.push(
        mdTable(
          ['measure', 'through the proxy', 'baseline', 'ratio or difference'],
          [
            ['100 MiB download, MB/s (p50)', d.proxy, `${d.download_file} (downloadFile)`, `${d.ratio}×`],
            [
              'connection set-up, ms (p50)',
              u.proxy_p50,
              `${u.direct_p50} (direct loopback connect)`,
              `${fmtSigned(u.overhead_p50)} ms`,
            ],
          ],
          [1, 3],
        ),
      )
      L.push('')
      L.push(
        `Image ${egress.image}; ${egress.rounds} rounds. The download is plain HTTP from an origin on the host's loopback, read by curl in the sandbox (timed by curl) through the agent's port and the host's proxy; downloadFile reads a 100 MiB file out of the same sandbox over the same agent stream. A set-up is a CONNECT to that origin answered \`200\` (timed in the sandbox, in Python), against a plain connect to it from the host.`,
      )
    }
    L.push('')
  }
  if (capacity) {
    L.push('## Capacity: what one engine holds (`bench/capacity.js`)')
    L.push('')
    L.push(sectionLoad(sectionLoads.capacity))
    L.push('')
    if (capacity.error) L.push(`Could not run: ${capacity.error.split('\n')[0]}`)
    else {
      const m = capacity.machine
      L.push(
        mdTable(
          ['idle sandboxes', 'host process, MiB per sandbox', 'raw client, MiB per container', 'difference'],
          capacity.host.filter(Boolean).map((h) => [h.sandboxes, h.oursMiB, h.rawMiB, fmtSigned(h.moreMiB)]),
          [1, 2, 3],
        ),
      )
      L.push('')
      L.push(
        mdTable(
          ['per idle sandbox, with ' + m.sandboxes, 'value'],
          [
            ['memory in the sandbox (engine stats, page cache left out), MiB', m.inSandboxMiB],
            ["the engine's processes (dockerd, containerd, shims): resident MiB", m.engineRssPerSandboxMiB],
            ["the engine's processes: count", m.engineProcessesPerSandbox],
            ["the machine's MemAvailable: MiB gone", m.memAvailablePerSandboxMiB],
            [`MemAvailable left with ${m.sandboxes}, GiB`, m.memAvailableLeftGiB],
            ...(capacity.bursts || []).map((b) => [
              `a burst of ${b.sandboxes} creates + first command, ms (ours / floor, each pair)`,
              `${b.pairs.map((x) => `${x.oursMs} / ${x.floorMs}`).join('; ')} (median ratio ${b.ratio}×)`,
            ]),
          ],
          [1],
        ),
      )
      L.push('')
      L.push(
        `Image ${capacity.image}; ${capacity.cpus} CPUs. Host memory: a child process holding that many idle sandboxes (each ran one command, so its agent is connected), RSS after collections, per sandbox past the first; the raw client (the floor's plain HTTP) made and ran a command in as many containers, on no network, as the addon's sandboxes under their default egress policy. The machine's figures: ${m.sandboxes} sandboxes of ours against none. The bursts alternate, ours first in one pair and the floor first in the next; the ratio is the median of the pairs' ratios.`,
      )
      if (capacity.busy?.length) renderBusy(L, capacity)
    }
    L.push('')
  }
  if (pressure) {
    L.push('## Code Mode under pressure (requests dense in values, `bench/codemode-pressure.js`)')
    L.push('')
    L.push(sectionLoad(sectionLoads.pressure))
    L.push('')
    if (pressure.error) L.push(`Could not run: ${pressure.error}`)
    else {
      L.push(
        mdTable(
          [
            'sandboxes',
            'scenario',
            'bound MiB',
            'RSS growth MiB',
            '× bound',
            'heap growth MiB',
            'longest stall ms',
            'that stall: on a CPU / waiting for one, ms',
            'longest GC pause ms',
            'dispatched',
            'refused',
            'timed out',
            'no room',
          ],
          pressure.runs.map((r) => [
            r.sandboxes,
            r.scenario,
            r.boundMiB,
            r.rssGrowthMiB,
            r.ratio,
            r.heapGrowthMiB,
            r.maxStallMs,
            `${r.stall.runMs} / ${r.stall.waitMs}`,
            Math.max(0, ...Object.values(r.gcMs)),
            r.dispatched,
            r.refused,
            r.timedOut,
            r.unroomed,
          ]),
          [0, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12],
        ),
      )
      L.push('')
      L.push(
        `Image ${pressure.image}; bounds ${pressure.bounds.sandboxMiB} MiB per sandbox, ${pressure.bounds.providerMiB} MiB per provider (the defaults); the bound of a run is the smaller of its sandboxes' sum and the provider's. Each sandbox sends 60 MiB of empty objects (about 1.3 GiB of V8 heap: refused) and two requests of 950,000 empty objects (2.7 MiB of text, about 61 MiB of values) to a tool that keeps each 3 s ("held"); then four of those at 1.2 s intervals with a 1 s timeout to a tool that keeps each 4 s ("timeouts"). The host runs in a child process sampled every 5 ms (resident memory, heap, how late a 5 ms timer fires, and for the longest delay the main thread's time on a CPU and waiting for one, from \`/proc/self/task/<pid>/schedstat\`: waiting is the machine's other load, not the host's work).`,
      )
    }
    L.push('')
  }
  L.push('## Targets')
  L.push('')
  for (const t of targets) L.push(`- **${t.status}** — ${t.name}: ${t.detail}`)
  L.push('')
  if (notes.length) {
    L.push('## Notes')
    L.push('')
    for (const n of notes) L.push(`- ${n}`)
    L.push('')
  }
  return L.join('\n')
}

// ---------------------------------------------------------------------------------------------
// Main

async function main() {
  try {
    await bench()
  } finally {
    // Containers first: a network with endpoints cannot be removed.
    await sweepAll().catch(() => {})
    await floorImpl.sweepNetworks().catch(() => {})
  }
}

async function bench() {
  const started = performance.now()
  const log = (...a) => console.log(...a)
  const { name: presetName, reps } = parseReps(process.env.BENCH_REPS)
  const wantImpls = listEnv('BENCH_IMPLS') || IMPL_ORDER
  const wantOps = listEnv('BENCH_OPS')
  const notes = []

  // Preconditions: without these the bench cannot run at all (the only non-zero exits).
  let engine
  try {
    engine = await floorImpl.engineVersion()
  } catch (e) {
    throw new Error(`the Docker engine at ${common.SOCKET} is not reachable: ${shortError(e)}`)
  }
  if (!(await floorImpl.imageExists(common.IMAGE)))
    throw new Error(`image ${common.IMAGE} is not present on the engine`)
  if (wantImpls.includes('addon') || wantImpls.includes('addon-engine')) await addonImpl.load()

  const env = {
    date: new Date().toISOString(),
    engine,
    kernel: `${os.release()} (engine reports ${engine.KernelVersion})`,
    cpus: os.cpus().length,
    cpuModel: (os.cpus()[0] && os.cpus()[0].model) || 'unknown',
    node: process.version,
    loadStart: os.loadavg(),
  }
  log(
    `engine ${engine.Version} (API ${engine.ApiVersion}), kernel ${os.release()}, ${env.cpus} CPUs, node ${process.version}, load ${fmtLoad(env.loadStart)}`,
  )
  log(`repetitions: ${presetName}: ${JSON.stringify(reps)}`)
  const leftover = await sweepAll()
  if (leftover) log(`removed ${leftover} container(s) left by an earlier run`)
  if (common.NETWORK && (await floorImpl.ensureNetwork(common.NETWORK))) log(`created network ${common.NETWORK}`)
  await preflight()

  const impls = IMPL_ORDER.filter((n) => wantImpls.includes(n)).map((n) => makeImpl(n))
  const allImpls = [...impls]
  const results = {}
  const opsRun = OPS.filter((op) => !wantOps || wantOps.includes(op.key))

  // Cleanup on interruption too: nothing may be left running.
  let stopping = false
  const onSignal = async (sig) => {
    if (stopping) return
    stopping = true
    console.error(`\n${sig}: removing the bench's containers…`)
    stopSpinners()
    await Promise.allSettled(allImpls.map((im) => im.cleanup()))
    await sweepAll().catch(() => {})
    process.exit(130)
  }
  process.on('SIGINT', onSignal)
  process.on('SIGTERM', onSignal)

  let warm = null
  const works = new Map()
  let mem = null
  let reqs = null
  let codemode = null
  let pressure = null
  let egress = null
  let runsc = null
  let capacity = null
  let agent = null
  let limit = null
  let load = null
  const sectionLoads = {}
  const withLoad = async (key, f) => {
    const before = os.loadavg()[0]
    const r = await f()
    sectionLoads[key] = [before, os.loadavg()[0]]
    return r
  }
  try {
    // One long-lived sandbox per implementation for the exec and transfer operations.
    if (opsRun.some((op) => op.uses === 'work')) {
      for (const im of impls) {
        try {
          works.set(im.name, await im.createSandbox())
        } catch (e) {
          notes.push(`${im.name}: could not create its work sandbox: ${shortError(e)}`)
        }
      }
    }

    for (const op of opsRun) {
      let opImpls = impls
      if (op.warmPoolRow && impls.some((im) => im.name === OURS)) {
        if (!warm) {
          warm = makeWarmPoolImpl()
          if (warm.note) notes.push(warm.note)
          else {
            allImpls.push(warm.im)
            await sleep(warm.im.settleAfterMs) // let the pool fill before the first measurement
          }
        }
        if (warm.im) {
          const i = impls.findIndex((im) => im.name === OURS)
          opImpls = [...impls.slice(0, i + 1), warm.im, ...impls.slice(i + 1)]
        }
      }
      // The pool's containers would load every later measurement: stop it once its rows are done.
      if (!op.warmPoolRow && warm && warm.im && !warm.done) {
        await warm.im.cleanup()
        await floorImpl.sweep(`${common.NAMESPACE_LABEL}=${common.ADDON_WARM_NAMESPACE}`)
        warm.done = true
      }
      // An implementation that measures only some operations (the exec-stream floor: transfers).
      opImpls = opImpls.filter((im) => !im.only || im.only.test(op.key))
      const n = reps[op.repsKey]
      const t0 = performance.now()
      process.stdout.write(`${op.title} ×${n} … `)
      results[op.key] = await runOp(op, opImpls, n, works)
      const summary = [...results[op.key]]
        .map(([name, r]) => `${name} ${fmtMs(summarize(r.samples).p50)}${r.errors ? ` (${r.errors} err)` : ''}`)
        .join(', ')
      log(`${((performance.now() - t0) / 1000).toFixed(1)} s — p50: ${summary}`)
      const ours = opImpls.find((im) => im.name === OURS)
      if (op.key === 'exec_true' && ours && works.has(OURS)) {
        const t1 = performance.now()
        process.stdout.write('the in-sandbox limit of an exec (shell spawn + exec-stream echo) … ')
        try {
          limit = await execLimit(ours, works.get(OURS), Math.max(20, reps.exec))
          log(
            `${((performance.now() - t1) / 1000).toFixed(1)} s — ${limit.shell} spawn ${fmtMs(limit.spawnMs)} ms + echo ${fmtMs(limit.echo.p50)} ms = ${fmtMs(limit.limitMs)} ms`,
          )
        } catch (e) {
          limit = { error: shortError(e) }
          log(limit.error)
        }
      }
    }
    if (warm && warm.im && !warm.done) {
      await warm.im.cleanup()
      await floorImpl.sweep(`${common.NAMESPACE_LABEL}=${common.ADDON_WARM_NAMESPACE}`)
    }

    if (process.env.BENCH_SKIP_LOAD !== '1' && (!wantOps || wantOps.includes('load'))) {
      const n = Number(process.env.BENCH_LOAD || 2)
      const t0 = performance.now()
      log(`under load (${n} CPU-bound processes; exec \`true\` and 50 concurrent execs, addon and floor) …`)
      try {
        load = await underLoad(impls, reps, works, n)
      } catch (e) {
        load = { spinners: n, error: shortError(e) }
      }
      if (load.error) log(`  ${load.error}`)
      else
        for (const r of loadRows(load, results))
          log(
            `  ${r.title}: ours/floor ${fmtRatio3(r.ratio)} under load, ${fmtRatio3(r.quiet)} quiet (load ${fmtNum(r.load, 2)})`,
          )
      log(`  ${((performance.now() - t0) / 1000).toFixed(1)} s`)
    }

    // Free the work sandboxes before the memory probes so they do not share the engine.
    await Promise.allSettled(
      impls.map((im) => (works.has(im.name) ? im.remove(works.get(im.name)).catch(() => {}) : null)),
    )
    works.clear()

    if (process.env.BENCH_SKIP_MEM !== '1' && (!wantOps || wantOps.some((k) => k.includes('100MiB') || k === 'mem'))) {
      const t0 = performance.now()
      log(`memory probes (100 MiB, ${reps.mem} run(s) each, child processes) …`)
      mem = await memoryProbes(
        impls.filter((im) => im.name !== ENGINE_PATH && !im.only),
        reps.mem,
        log,
      )
      log(`  ${((performance.now() - t0) / 1000).toFixed(1)} s`)
    }
    if (process.env.BENCH_SKIP_AGENT !== '1' && (!wantOps || wantOps.includes('agent'))) {
      const t0 = performance.now()
      log('agent probe (its idle RSS; the host while a command prints 1 GiB) …')
      agent = await agentProbe()
      log(`  ${((performance.now() - t0) / 1000).toFixed(1)} s`)
    }
    if (process.env.BENCH_SKIP_CODEMODE !== '1' && (!wantOps || wantOps.includes('codemode'))) {
      const t0 = performance.now()
      log('Code Mode round trip (bench/codemode.js: the agent and the Python relay vs a bind-mounted socket) …')
      codemode = await withLoad('codemode', codeModeBench)
      log(`  ${((performance.now() - t0) / 1000).toFixed(1)} s`)
    }
    if (process.env.BENCH_SKIP_RUNSC !== '1' && (!wantOps || wantOps.includes('runsc'))) {
      const t0 = performance.now()
      log('gVisor beside runc (bench/runsc.js on the engine of scripts/engines/gvisor-engine.sh) …')
      runsc = await withLoad('runsc', runscBench)
      log(`  ${((performance.now() - t0) / 1000).toFixed(1)} s`)
    }
    if (process.env.BENCH_SKIP_EGRESS !== '1' && (!wantOps || wantOps.includes('egress'))) {
      const t0 = performance.now()
      log('egress (bench/egress.js: a 100 MiB download and connection set-ups through the proxy) …')
      egress = await withLoad('egress', egressBench)
      log(`  ${((performance.now() - t0) / 1000).toFixed(1)} s`)
    }
    if (process.env.BENCH_SKIP_CODEMODE !== '1' && (!wantOps || wantOps.includes('codemode-pressure'))) {
      const t0 = performance.now()
      log('Code Mode under pressure (bench/codemode-pressure.js: dense requests from 1, 4 and 16 sandboxes) …')
      pressure = await withLoad('pressure', codeModePressureBench)
      log(`  ${((performance.now() - t0) / 1000).toFixed(1)} s`)
    }
    if (process.env.BENCH_SKIP_CAPACITY !== '1' && (!wantOps || wantOps.includes('capacity'))) {
      const t0 = performance.now()
      log(
        'capacity (bench/capacity.js: memory per idle sandbox at 20 and 200 against a raw client, bursts of 20 and 50, busy sandboxes beside a probe) …',
      )
      capacity = await withLoad('capacity', capacityBench)
      log(`  ${((performance.now() - t0) / 1000).toFixed(1)} s`)
    }
    if (process.env.BENCH_SKIP_REQS !== '1') {
      reqs = await requestCounts(
        impls.filter((im) => !im.only).map((im) => im.name),
        log,
      )
    }
  } finally {
    stopSpinners()
    await Promise.allSettled(allImpls.map((im) => im.cleanup()))
    const left = await sweepAll().catch(() => 0)
    if (left) notes.push(`${left} container(s) were still present at the end and were removed by the label sweep`)
  }

  const rows = buildRows(opsRun, results)
  for (const r of rows) {
    if (r.messages.length) {
      const uniq = [...new Set(r.messages)]
      notes.push(
        `${r.op.title} / ${r.impl}: ${r.errors} error(s): ${uniq.slice(0, 3).join(' | ')}${uniq.length > 3 ? ' …' : ''}`,
      )
    }
  }
  const targets = evaluateTargets(rows, mem)
  targets.push(...agentTargets(rows, agent))
  targets.push(...execLimitTargets(rows, limit))
  if (load) targets.push(...loadTargets(load, results))
  if (codemode) targets.push(...codeModeTargets(codemode))
  if (pressure) targets.push(...codeModePressureTargets(pressure))
  if (egress) targets.push(...egressTargets(egress))
  if (runsc) targets.push(...runscTargets(runsc))
  if (capacity) targets.push(...capacityTargets(capacity))
  const wallMs = performance.now() - started

  log('')
  log(textTable(rows))
  if (mem) {
    log('')
    log('peak RSS growth during 100 MiB transfers (fresh child process each):')
    for (const [name, m] of Object.entries(mem)) {
      if (m.skipped) log(`  ${name.padEnd(14)} left out: ${m.skipped}`)
      else if (m.error) log(`  ${name.padEnd(14)} error: ${m.error}`)
      else
        log(
          `  ${name.padEnd(14)} upload ${fmtBytes(m.upload?.growth).padStart(10)}   download ${fmtBytes(m.download?.growth).padStart(10)}`,
        )
    }
  }
  log('')
  log('targets:')
  for (const t of targets) log(`  ${t.status.padEnd(6)} ${t.name}: ${t.detail}`)
  if (notes.length) {
    log('')
    log('notes:')
    for (const n of notes) log(`  - ${n}`)
  }

  const out = process.env.BENCH_RESULTS || path.join(__dirname, 'RESULTS.md')
  fs.writeFileSync(
    out,
    renderMarkdown({
      env,
      presetName,
      reps,
      rows,
      mem,
      reqs,
      codemode,
      pressure,
      egress,
      runsc,
      capacity,
      limit,
      load,
      results,
      sectionLoads,
      targets,
      notes,
      wallMs,
    }) + '\n',
  )
  log('')
  log(`wrote ${path.relative(process.cwd(), out) || out}; total ${(wallMs / 1000).toFixed(1)} s`)
}

main().then(
  () => process.exit(0),
  async (e) => {
    console.error(`bench could not run: ${(e && e.stack) || e}`)
    await sweepAll().catch(() => {})
    process.exit(1)
  },
)
