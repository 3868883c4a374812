// Shared helpers for the integration tests: a thin docker CLI wrapper (setup, inspection and
// cleanup only; the CLI is never the thing under test), unique namespaces so test files running
// in parallel never see each other's containers, and small assertion helpers.

import { execFileSync, spawnSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'

import type { DockerSandboxProvider, ExecResult, SandboxExecParams } from '..'

export type { ExecResult }

export const BUSYBOX = 'trueforge-sandbox-busybox:1'
export const DEBIAN = 'trueforge-sandbox-debian:12'
/** The TrueForge-ready image (images/trueforge/Dockerfile; made offline by scripts/images/ensure-images.sh). */
export const TRUEFORGE = 'trueforge-sandbox:2'

/** The OCI runtime the suites run under: the runsc jest project sets runsc (gVisor); unset, the
 * engine's default. */
export const TEST_RUNTIME = process.env.TRUEFORGE_TEST_RUNTIME
/** Under gVisor (runsc, release 20221219 from Debian 12): what it cannot do is skipped where the
 * tests check it, saying why in the test's name. */
export const onRunsc = TEST_RUNTIME === 'runsc'

/** The engine's unix socket, as DOCKER_HOST names it (the main engine's when unset). */
export function engineSocket(): string {
  const host = process.env.DOCKER_HOST ?? ''
  return host.startsWith('unix://') ? host.slice('unix://'.length) : '/var/run/docker.sock'
}

export const LABEL_MANAGED_BY = 'trueforge.sandbox.managed-by'
export const LABEL_NAMESPACE = 'trueforge.sandbox.namespace'
export const LABEL_ID = 'trueforge.sandbox.id'
export const LABEL_CREATED_AT = 'trueforge.sandbox.created-at'
export const MANAGED_BY = 'trueforge-docker-sandbox'
/** Put on containers the tests make with the CLI (not ours), so cleanup finds them too. */
export const LABEL_TEST_NAMESPACE = 'trueforge-test.namespace'

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ'

export type ExecParams = SandboxExecParams
export type Provider = DockerSandboxProvider

/** Runs the docker CLI; throws (with stderr in the message) on a non-zero exit. */
export function docker(args: string[], input?: string | Buffer): string {
  try {
    return execFileSync('docker', args, {
      input,
      encoding: 'utf8',
      stdio: ['pipe', 'pipe', 'pipe'],
      timeout: 60_000,
      maxBuffer: 64 * 1024 * 1024,
    }).trim()
  } catch (e) {
    const err = e as { stderr?: string; message: string }
    throw new Error(`docker ${args.join(' ')} failed: ${err.stderr || err.message}`)
  }
}

/** Runs the docker CLI and reports the outcome instead of throwing. */
export function dockerTry(args: string[]): { status: number; stdout: string; stderr: string } {
  const r = spawnSync('docker', args, { encoding: 'utf8', timeout: 60_000 })
  return { status: r.status ?? -1, stdout: (r.stdout ?? '').trim(), stderr: (r.stderr ?? '').trim() }
}

/** `docker inspect` of one container, parsed; null when it does not exist. */
export function inspectContainer(nameOrId: string): any | null {
  const r = dockerTry(['inspect', '--type', 'container', nameOrId])
  if (r.status !== 0) return null
  const parsed = JSON.parse(r.stdout) as any[]
  return parsed[0] ?? null
}

/** A namespace no other test file (or earlier run) uses: `<prefix>-<8 hex>`, at most 32 long. */
export function uniqueNamespace(prefix: string): string {
  const ns = `${prefix}-${randomBytes(4).toString('hex')}`
  if (!/^[a-z0-9-]{1,32}$/.test(ns)) throw new Error(`bad test namespace ${ns}`)
  return ns
}

/** A random, well-formed ULID (as our ids carry) that no provider ever made. */
export function randomUlid(): string {
  const bytes = randomBytes(26)
  let s = '0'
  for (let i = 1; i < 26; i++) s += CROCKFORD[bytes[i] % 32]
  return s
}

/** The ULID at the end of a sandbox id. */
export function ulidOf(sandboxId: string): string {
  const m = /^\/workspace\/([0-9A-Z]{26})$/.exec(sandboxId)
  if (!m) throw new Error(`not a sandbox id: ${sandboxId}`)
  return m[1]
}

/** The container name the provider derives for an id in a namespace. */
export function containerNameFor(namespace: string, sandboxId: string): string {
  return `trueforge-${namespace}-${ulidOf(sandboxId).toLowerCase()}`
}

/** Ids of every container (running or not) labelled with this namespace, ours or the tests'. */
export function containersInNamespace(namespace: string): string[] {
  const ids = new Set<string>()
  for (const label of [LABEL_NAMESPACE, LABEL_TEST_NAMESPACE]) {
    const out = docker(['ps', '-aq', '--filter', `label=${label}=${namespace}`])
    for (const id of out.split('\n')) if (id.trim()) ids.add(id.trim())
  }
  return [...ids]
}

/** Force-removes every container of a namespace. Never throws: it runs in afterAll. */
export function cleanupNamespace(namespace: string): void {
  try {
    const ids = containersInNamespace(namespace)
    if (ids.length > 0) dockerTry(['rm', '-f', '-v', ...ids])
  } catch (e) {
    console.warn(`cleanup of namespace ${namespace} failed: ${(e as Error).message}`)
  }
  // Test image names carry the namespace; a failed pull of one leaves its lease on purpose.
  removeImageWorkLeases((image) => image.includes(namespace))
  removeNetworks(namespace)
}

/**
 * Removes the networks the provider made for `namespace` (one per namespace and tenant; they
 * outlive their sandboxes on purpose). One still in use is left.
 */
export function removeNetworks(namespace: string): void {
  try {
    const ids = docker(['network', 'ls', '-q', '--filter', `label=trueforge.sandbox.namespace=${namespace}`])
      .split('\n')
      .filter(Boolean)
    for (const id of ids) dockerTry(['network', 'rm', id])
  } catch (e) {
    console.warn(`network cleanup of namespace ${namespace} failed: ${(e as Error).message}`)
  }
}

/**
 * Removes the image-work leases (containers named after an image, see src/images/work.rs) of the
 * images `which` selects: a failed pull leaves one on purpose, so other server processes see why.
 */
export function removeImageWorkLeases(which: (image: string) => boolean): void {
  try {
    const leases = docker([
      'ps',
      '-a',
      '--filter',
      'label=trueforge.sandbox.imagework',
      '--format',
      '{{.ID}} {{.Label "trueforge.sandbox.imagework"}}',
    ])
      .split('\n')
      .filter(Boolean)
      .map((line) => line.split(' '))
      .filter(([, image]) => image !== undefined && which(image))
      .map(([id]) => id)
    if (leases.length > 0) dockerTry(['rm', '-f', ...leases])
  } catch (e) {
    console.warn(`image-work lease cleanup failed: ${(e as Error).message}`)
  }
}

/**
 * Tracks the sandboxes a test file creates and removes them all at the end, through the
 * provider and then with the CLI for anything left in the namespace.
 */
export class SandboxTracker {
  readonly ids = new Set<string>()

  constructor(readonly namespace: string) {}

  async create(provider: Provider): Promise<string> {
    const { sandboxId } = await provider.createSandbox()
    this.ids.add(sandboxId)
    return sandboxId
  }

  async cleanup(provider: Provider): Promise<void> {
    for (const id of this.ids) {
      try {
        await provider.removeSandbox(id)
      } catch (e) {
        console.warn(`removeSandbox(${id}) failed during cleanup: ${(e as Error).message}`)
      }
    }
    this.ids.clear()
    cleanupNamespace(this.namespace)
  }
}

/** Runs a command and asserts that it ran (success: true); returns exit code and output. */
export async function run(
  provider: Provider,
  sandboxId: string,
  command: string,
  extra: Partial<ExecParams> = {},
): Promise<{ exitCode: number; result: string }> {
  const r = (await provider.exec({ sandboxId, command, ...extra })) as ExecResult
  if (!r.success) throw new Error(`exec of ${JSON.stringify(command)} did not run: ${r.error}`)
  return r.response
}

/** Runs a command that must exit 0; returns its output. */
export async function ok(
  provider: Provider,
  sandboxId: string,
  command: string,
  extra: Partial<ExecParams> = {},
): Promise<string> {
  const r = await run(provider, sandboxId, command, extra)
  if (r.exitCode !== 0) {
    throw new Error(`${JSON.stringify(command)} exited ${r.exitCode}: ${r.result}`)
  }
  return r.result
}

/** The pid of the Python relay serving Code Mode `socket` in the sandbox, read from /proc (never
 * the probe's own); exactly one must be there. */
export async function relayPid(provider: Provider, sandboxId: string, socket: string): Promise<number> {
  const out = await ok(
    provider,
    sandboxId,
    `for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' 2>/dev/null < $d/cmdline); case "$c" in "python3 -I -S /trueforge/codemode/relay.py ${socket} ") echo \${d#/proc/};; esac; done`,
  )
  const pids = out.split('\n').filter(Boolean).map(Number)
  if (pids.length !== 1) throw new Error(`expected one relay on ${socket}, found ${JSON.stringify(pids)}`)
  return pids[0]
}

/** Awaits a promise that must reject; returns the rejection for further assertions. */
export async function rejection(p: Promise<unknown>): Promise<any> {
  try {
    await p
  } catch (e) {
    return e
  }
  throw new Error('expected the call to reject, but it resolved')
}

/** Milliseconds a promise took, with its value. */
export async function timed<T>(p: () => Promise<T>): Promise<{ value: T; ms: number }> {
  const start = performance.now()
  const value = await p()
  return { value, ms: performance.now() - start }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms))
}

/**
 * Checks `cond` every `everyMs` until it holds: the milliseconds that took, or null once
 * `timeoutMs` has passed (for tests that assert on the wait itself).
 */
export async function poll(
  cond: () => boolean | Promise<boolean>,
  timeoutMs: number,
  everyMs = 100,
): Promise<number | null> {
  const start = Date.now()
  for (;;) {
    if (await cond()) return Date.now() - start
    if (Date.now() - start > timeoutMs) return null
    await sleep(everyMs)
  }
}

/** Waits until `cond` holds; after `timeoutMs`, throws naming `what` it waited for. */
export async function waitFor(
  cond: () => boolean | Promise<boolean>,
  timeoutMs: number,
  what: string,
  everyMs = 100,
): Promise<void> {
  if ((await poll(cond, timeoutMs, everyMs)) === null) throw new Error(`timed out waiting for ${what}`)
}
