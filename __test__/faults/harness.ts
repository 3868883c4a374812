// The fault suite's harness: the isolated fault engine (scripts/engines/fault-engine.sh) and a docker CLI
// wrapper aimed at it, a call wrapper that counts every provider call and classifies how it
// settled, fault and leak accounting, an unhandled-rejection watch on the real process, and
// child processes (a fresh provider in a fresh process). Each file's figures go to
// test-results/.faults-parts/, which the global teardown sums into test-results/faults.json.

import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import * as fs from 'node:fs'
import * as path from 'node:path'
import { inspect } from 'node:util'

import { DockerSandboxProvider } from '../..'
import {
  BUSYBOX,
  ExecParams,
  ExecResult,
  LABEL_MANAGED_BY,
  LABEL_NAMESPACE,
  LABEL_TEST_NAMESPACE,
  MANAGED_BY,
  Provider,
  containerNameFor,
} from '../helpers'

const paths = require('./paths') as {
  ENGINE_SCRIPT: string
  PARTS_DIR: string
  FAULT_HOST: string
  MAIN_HOST: string
  runPrefix: () => string
}

export { BUSYBOX }
export const FAULT_HOST = paths.FAULT_HOST
export const MAIN_HOST = paths.MAIN_HOST
/** Only `jest --selectProjects faults` sets this; the default `jest` run skips the fault files. */
export const ENABLED = process.env.TRUEFORGE_FAULTS === '1'
export const describeFaults: jest.Describe = ENABLED ? describe : describe.skip
const CHILD = path.join(__dirname, 'child.js')
/** How long a call may run past its deadline before the suite stops waiting for it. */
const LOST_WAIT_MS = 30_000

export const MiB = 1024 * 1024

/** An exec that ran. */
export type ExecResultOk = Extract<ExecResult, { success: true }>

// ---------------------------------------------------------------------------------------------
// Names

/** A namespace of this run: `flt<run>-<tag>-<8 hex>` (at most 32 characters). */
export function faultNamespace(tag: string): string {
  const ns = `${paths.runPrefix()}${tag}-${randomBytes(4).toString('hex')}`
  if (!/^[a-z0-9-]{1,32}$/.test(ns)) throw new Error(`bad fault namespace ${ns}`)
  return ns
}

/** A name for a container the suite makes with the CLI (the teardown finds it by prefix). */
export function cliName(tag: string): string {
  return `${paths.runPrefix()}${tag}-${randomBytes(4).toString('hex')}`
}

// ---------------------------------------------------------------------------------------------
// The fault engine and the docker CLI

export type EngineCommand = 'start' | 'stop' | 'restart' | 'pause' | 'resume' | 'status'

/** Runs scripts/engines/fault-engine.sh; throws with its output on failure. */
export function faultEngine(cmd: EngineCommand): string {
  try {
    return execFileSync('bash', [paths.ENGINE_SCRIPT, cmd], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: 120_000,
    }).trim()
  } catch (e) {
    const err = e as { stderr?: string; stdout?: string; message: string }
    throw new Error(`fault-engine.sh ${cmd} failed: ${err.stderr || err.stdout || err.message}`)
  }
}

/** The same without blocking the event loop (so calls in flight keep settling meanwhile). */
export function faultEngineAsync(cmd: EngineCommand): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('bash', [paths.ENGINE_SCRIPT, cmd], { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    child.stdout.on('data', (d) => (out += d))
    child.stderr.on('data', (d) => (out += d))
    child.on('error', reject)
    child.on('exit', (code) =>
      code === 0 ? resolve() : reject(new Error(`fault-engine.sh ${cmd} exited ${code}: ${out}`)),
    )
  })
}

/** Runs the docker CLI against `host` (the fault engine by default); throws on failure. */
export function dk(args: string[], host = FAULT_HOST, timeout = 60_000): string {
  try {
    return execFileSync('docker', ['-H', host, ...args], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout,
      maxBuffer: 64 * MiB,
    }).trim()
  } catch (e) {
    const err = e as { stderr?: string; message: string }
    throw new Error(`docker -H ${host} ${args.join(' ')} failed: ${err.stderr || err.message}`)
  }
}

export function dkTry(args: string[], host = FAULT_HOST): { status: number; stdout: string; stderr: string } {
  const r = spawnSync('docker', ['-H', host, ...args], { encoding: 'utf8', timeout: 60_000 })
  return { status: r.status ?? -1, stdout: (r.stdout ?? '').trim(), stderr: (r.stderr ?? '').trim() }
}

/** `docker inspect` of a container, parsed; null when it does not exist. */
export function inspectOn(nameOrId: string, host = FAULT_HOST): any | null {
  const r = dkTry(['inspect', '--type', 'container', nameOrId], host)
  if (r.status !== 0) return null
  return (JSON.parse(r.stdout) as any[])[0] ?? null
}

export function isRunning(nameOrId: string, host = FAULT_HOST): boolean | null {
  const info = inspectOn(nameOrId, host)
  return info ? info.State?.Running === true : null
}

/** Ids of every container labelled with this namespace (ours, or made by the suite's CLI). */
export function containersOf(namespace: string, host = FAULT_HOST, onlyOurs = false): string[] {
  const ids = new Set<string>()
  const filters = onlyOurs
    ? [['--filter', `label=${LABEL_NAMESPACE}=${namespace}`, '--filter', `label=${LABEL_MANAGED_BY}=${MANAGED_BY}`]]
    : [
        ['--filter', `label=${LABEL_NAMESPACE}=${namespace}`],
        ['--filter', `label=${LABEL_TEST_NAMESPACE}=${namespace}`],
      ]
  for (const f of filters) {
    const out = dk(['ps', '-aq', '--no-trunc', ...f], host)
    for (const id of out.split('\n')) if (id.trim()) ids.add(id.trim())
  }
  return [...ids]
}

/** The container name the provider uses for a sandbox. */
export function nameOf(namespace: string, sandboxId: string): string {
  return containerNameFor(namespace, sandboxId)
}

/**
 * Processes in a container running a command of ours: the engine-exec wrapper (its arguments
 * mention `trueforge-exec`) or a command's shell under the in-sandbox agent (`sh -c` or
 * `bash -c`, not the init script's). The CLI's `ps` itself is neither.
 */
export function execLeftovers(container: string, host = FAULT_HOST): string[] {
  const out = dk(['exec', container, 'ps', '-o', 'pid,args'], host)
  return out
    .split('\n')
    .filter((l) => l.includes('trueforge-exec') || (/(^|[\s/])(ba)?sh -c /.test(l) && !l.includes('trueforge-init')))
}

// ---------------------------------------------------------------------------------------------
// Accounting

interface LostCall {
  kind: string
  reason: string
  ms: number
}

interface FileStats {
  file: string
  calls: number
  succeeded: number
  clearErrors: number
  lost: number
  lostCalls: LostCall[]
  faults: Record<string, number>
  leaked: string[]
  memoryGrowthMiB?: number
  unhandled: string[]
}

const stats: FileStats = {
  file: path.basename(expect.getState().testPath ?? 'unknown'),
  calls: 0,
  succeeded: 0,
  clearErrors: 0,
  lost: 0,
  lostCalls: [],
  faults: {},
  leaked: [],
  unhandled: [],
}

export function flushStats(): void {
  if (!ENABLED) return
  fs.mkdirSync(paths.PARTS_DIR, { recursive: true })
  fs.writeFileSync(path.join(paths.PARTS_DIR, `${stats.file}.json`), JSON.stringify(stats, null, 2))
}

/** Records one injected fault (engine restart, stop, freeze, container kill …). */
export function injectFault(kind: string): void {
  stats.faults[kind] = (stats.faults[kind] ?? 0) + 1
}

export function recordMemoryGrowth(mib: number): void {
  stats.memoryGrowthMiB = Math.round(mib * 10) / 10
}

/** How a call settled: `ok` (it did its job), `error` (a clear error by its deadline) or `lost`. */
export interface Outcome<T> {
  kind: string
  status: 'ok' | 'error' | 'lost'
  value?: T
  /** The error message (a rejection's, or an exec's `error`). */
  error?: string
  /** A rejection's `code`, when it had one. */
  code?: string
  errorName?: string
  ms: number
  deadlineMs: number
  reason?: string
}

function record(kind: string, status: 'ok' | 'error' | 'lost', ms: number, reason?: string): void {
  stats.calls++
  if (status === 'ok') stats.succeeded++
  else if (status === 'error') stats.clearErrors++
  else {
    stats.lost++
    stats.lostCalls.push({ kind, reason: reason ?? 'lost', ms: Math.round(ms) })
  }
}

/**
 * Makes one provider call and classifies it. It is lost when it does not settle by
 * `deadlineMs`, or settles with something that is not a clear error (a rejection without a
 * message and code, an exec error without text). `judge` turns a resolved value into an error
 * (an exec's `{ success: false }`).
 */
export async function call<T>(
  kind: string,
  deadlineMs: number,
  fn: () => Promise<T>,
  judge?: (v: T) => string | null,
): Promise<Outcome<T>> {
  const started = performance.now()
  type Settled = { s: 'resolved'; v: T } | { s: 'rejected'; e: unknown } | { s: 'pending' }
  const p: Promise<Settled> = Promise.resolve()
    .then(fn)
    .then(
      (v) => ({ s: 'resolved' as const, v }),
      (e) => ({ s: 'rejected' as const, e }),
    )
  let timer: NodeJS.Timeout | undefined
  const cap = new Promise<Settled>((r) => {
    timer = setTimeout(() => r({ s: 'pending' }), deadlineMs + LOST_WAIT_MS)
  })
  const settled = await Promise.race([p, cap])
  clearTimeout(timer)
  const ms = performance.now() - started
  const out: Outcome<T> = { kind, status: 'lost', ms, deadlineMs }
  if (settled.s === 'pending') {
    out.reason = `did not settle within ${deadlineMs + LOST_WAIT_MS} ms`
  } else if (settled.s === 'resolved') {
    out.value = settled.v
    const err = judge ? judge(settled.v) : null
    if (err === null) out.status = 'ok'
    else if (typeof err === 'string' && err.trim().length > 0) {
      out.status = 'error'
      out.error = err
    } else out.reason = `resolved with an unclear failure: ${inspect(settled.v).slice(0, 300)}`
  } else {
    const e = settled.e as { message?: unknown; code?: unknown; name?: unknown } | null
    const message = e && typeof e.message === 'string' ? e.message : ''
    out.error = message || inspect(settled.e).slice(0, 300)
    out.code = e && typeof e.code === 'string' ? e.code : undefined
    out.errorName = e && typeof e.name === 'string' ? e.name : undefined
    if (message.trim().length > 0 && out.code) out.status = 'error'
    else out.reason = `rejected with an unclear error: ${out.error}`
  }
  if (out.status !== 'lost' && ms > deadlineMs) {
    out.reason = `settled (${out.status}) after ${Math.round(ms)} ms, past its ${deadlineMs} ms deadline`
    out.status = 'lost'
  }
  record(kind, out.status, ms, out.reason)
  return out
}

/** `provider.exec` through `call`; `{ success: false }` is a (clear) error. */
export function execCall(
  provider: Provider,
  params: ExecParams,
  deadlineMs: number,
  kind = 'exec',
): Promise<Outcome<ExecResult>> {
  return call(
    kind,
    deadlineMs,
    () => provider.exec(params) as Promise<ExecResult>,
    (r) => (r.success ? null : typeof r.error === 'string' ? r.error : ''),
  )
}

/** An exec that must run and exit 0; returns its output. */
export async function mustRun(
  provider: Provider,
  sandboxId: string,
  command: string,
  timeoutSeconds = 60,
): Promise<string> {
  const o = await execCall(provider, { sandboxId, command, timeoutSeconds }, timeoutSeconds * 1000 + 15_000)
  if (o.status !== 'ok') throw new Error(`exec ${JSON.stringify(command)} ${o.status}: ${o.error ?? o.reason}`)
  const r = o.value as ExecResult & { success: true }
  if (r.response.exitCode !== 0)
    throw new Error(`${JSON.stringify(command)} exited ${r.response.exitCode}: ${r.response.result}`)
  return r.response.result
}

/** A call that must succeed (create, upload, download …); returns its value. */
export async function must<T>(kind: string, fn: () => Promise<T>, deadlineMs = 60_000): Promise<T> {
  const o = await call(kind, deadlineMs, fn)
  if (o.status !== 'ok') throw new Error(`${kind} ${o.status}: ${o.error ?? o.reason}`)
  return o.value as T
}

/** Folds calls a child process made into this file's figures. */
export function recordChildCalls(list: ChildCall[], deadlineMs: number): void {
  for (const c of list) {
    const late = c.ms > deadlineMs
    const status = late ? 'lost' : c.status
    record(c.kind, status, c.ms, late ? `settled after ${Math.round(c.ms)} ms, past ${deadlineMs} ms` : c.reason)
  }
}

// ---------------------------------------------------------------------------------------------
// Providers and cleanup

export function faultProvider(namespace: string, extra: Record<string, unknown> = {}): Provider {
  return new DockerSandboxProvider({
    image: BUSYBOX,
    dockerHost: FAULT_HOST,
    namespace,
    network: 'none',
    ...extra,
  } as ConstructorParameters<typeof DockerSandboxProvider>[0])
}

/**
 * The sandboxes of one namespace. `cleanup` removes them through the provider, counts what is
 * still there as leaked (ours that the provider left behind), then force-removes everything in
 * the namespace with the CLI, so nothing is left even when a test failed.
 */
export class Tracker {
  readonly ids = new Set<string>()
  /** Containers the suite made itself with the CLI (decoys): never counted as leaked. */
  readonly cliMade = new Set<string>()

  constructor(
    readonly namespace: string,
    readonly provider: Provider,
    readonly host = FAULT_HOST,
  ) {}

  async create(provider: Provider = this.provider, deadlineMs = 60_000): Promise<string> {
    const { sandboxId } = await must('createSandbox', () => provider.createSandbox(), deadlineMs)
    this.ids.add(sandboxId)
    return sandboxId
  }

  add(sandboxId: string): string {
    this.ids.add(sandboxId)
    return sandboxId
  }

  async cleanup(): Promise<string[]> {
    for (const id of this.ids) {
      await call('removeSandbox', 60_000, () => this.provider.removeSandbox(id))
    }
    this.ids.clear()
    let leaked: string[] = []
    try {
      leaked = containersOf(this.namespace, this.host, true).flatMap((id) => {
        const info = inspectOn(id, this.host)
        const name = (info?.Name ?? id).replace(/^\//, '')
        return this.cliMade.has(name) ? [] : [`${name} (${info?.State?.Status ?? '?'})`]
      })
      stats.leaked.push(...leaked)
      const all = containersOf(this.namespace, this.host)
      if (all.length > 0) dkTry(['rm', '-f', '-v', ...all], this.host)
    } catch (e) {
      console.warn(`cleanup of namespace ${this.namespace} failed: ${(e as Error).message}`)
    }
    flushStats()
    return leaked
  }
}

// ---------------------------------------------------------------------------------------------
// Child processes

export interface ChildCall {
  kind: string
  status: 'ok' | 'error' | 'lost'
  ms: number
  reason?: string
}

/** Runs __test__/faults/child.js with a JSON job; resolves with the JSON it prints last. */
export function runChild<R = any>(
  job: Record<string, unknown>,
  timeoutMs = 120_000,
): Promise<R & { calls: ChildCall[] }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CHILD, JSON.stringify(job)], { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    child.stdout.on('data', (d) => (out += d))
    child.stderr.on('data', (d) => (err += d))
    const timer = setTimeout(() => {
      if (child.pid) process.kill(child.pid, 'SIGKILL')
      reject(new Error(`child ${job.mode} did not finish within ${timeoutMs} ms; stderr: ${err}`))
    }, timeoutMs)
    child.on('error', reject)
    child.on('exit', (code, signal) => {
      clearTimeout(timer)
      const last = out.trim().split('\n').pop() ?? ''
      let parsed: any
      try {
        parsed = JSON.parse(last)
      } catch {
        reject(
          new Error(
            `child ${job.mode} exited ${code ?? signal} without a result; stdout: ${out.slice(-2000)} stderr: ${err.slice(-2000)}`,
          ),
        )
        return
      }
      if (code !== 0) {
        reject(new Error(`child ${job.mode} exited ${code ?? signal}: ${last} stderr: ${err.slice(-2000)}`))
        return
      }
      resolve(parsed)
    })
  })
}

// ---------------------------------------------------------------------------------------------
// Per-file hooks

// jest gives each test file a copy of `process`; listeners on the copy never fire. A function
// made by a host-realm constructor sees the real one.
const realProcess = (inspect as unknown as { constructor: FunctionConstructor }).constructor(
  'return process',
)() as NodeJS.Process
let unhandledSeen = 0
const onUnhandled = (reason: unknown): void => {
  stats.unhandled.push(inspect(reason).slice(0, 500))
}

/**
 * Registers the file's hooks: watch for unhandled rejections (a test fails when one fires),
 * make sure the fault engine answers before the file and after every test (a test that failed
 * mid-fault must not leave it stopped or frozen for the next), and write the figures at the end.
 */
export function setupFaultFile(): void {
  if (!ENABLED) return
  beforeAll(() => {
    realProcess.on('unhandledRejection', onUnhandled)
    faultEngine('start')
  })
  afterEach(() => {
    faultEngine('start')
    flushStats()
    if (stats.unhandled.length > unhandledSeen) {
      const fresh = stats.unhandled.slice(unhandledSeen)
      unhandledSeen = stats.unhandled.length
      throw new Error(`unhandled rejection(s) during this test: ${fresh.join('\n')}`)
    }
  })
  afterAll(() => {
    realProcess.off('unhandledRejection', onUnhandled)
    flushStats()
  })
}

/** Fails the calling test when any unhandled rejection was seen so far in this file. */
export function expectNoUnhandled(): void {
  expect(stats.unhandled).toEqual([])
}
