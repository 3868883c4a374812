// Shared pieces of the image tests: the loopback registries (scripts/engines/ensure-registry.sh), pushing
// uniquely named images to them, counting pull attempts (engine events and the registry's
// access log), polling build status, asking a fresh Node process for a status, and removing
// every image reference a test file made, even when it fails. The docker CLI here is setup and
// inspection only; the addon is the thing under test.

import { ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'

import { type SandboxBuild } from '../..'
import { docker, dockerTry, LABEL_TEST_NAMESPACE, type Provider, removeImageWorkLeases, sleep } from '../helpers'

export const ROOT = path.resolve(__dirname, '..', '..')
export const PLAIN = '127.0.0.1:5000'
export const AUTH = '127.0.0.1:5001'

export type { Provider } from '../helpers'
export type Build = SandboxBuild

export interface Registries {
  plain: string
  plainLog: string
  auth: string
  authLog: string
  user: string
  password: string
}

/** Runs scripts/engines/ensure-registry.sh (idempotent, safe in parallel) and parses what it prints. */
export function ensureRegistries(): Registries {
  const out = execFileSync('bash', [path.join(ROOT, 'scripts', 'engines', 'ensure-registry.sh')], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: 180_000,
  })
  const kv: Record<string, string> = {}
  for (const line of out.split('\n')) {
    const i = line.indexOf('=')
    if (i > 0) kv[line.slice(0, i)] = line.slice(i + 1)
  }
  return {
    plain: kv.PLAIN_REGISTRY,
    plainLog: kv.PLAIN_LOG,
    auth: kv.AUTH_REGISTRY,
    authLog: kv.AUTH_LOG,
    user: kv.AUTH_USER,
    password: kv.AUTH_PASSWORD,
  }
}

/**
 * Every image reference a test file creates (tags it pushes or pulls, tags the addon builds) and
 * every temp dir; `cleanup()` removes them by reference only, so other agents' images and the
 * shared base images are never touched (removing a tag of a shared image only untags it).
 */
export class ImageTracker {
  readonly refs = new Set<string>()
  readonly dirs = new Set<string>()
  readonly repos = new Set<string>()

  constructor(readonly namespace: string) {}

  ref(r: string): string {
    this.refs.add(r)
    return r
  }

  tempDir(prefix: string): string {
    const d = mkdtempSync(path.join(tmpdir(), `${prefix}-`))
    this.dirs.add(d)
    return d
  }

  cleanup(registries?: Registries): void {
    // Containers first (ours and the CLI's), so no image is held.
    try {
      const ids = docker(['ps', '-aq', '--filter', `label=${LABEL_TEST_NAMESPACE}=${this.namespace}`])
        .split('\n')
        .filter(Boolean)
      const ours = docker(['ps', '-aq', '--filter', `label=trueforge.sandbox.namespace=${this.namespace}`])
        .split('\n')
        .filter(Boolean)
      if (ids.length + ours.length > 0) dockerTry(['rm', '-f', '-v', ...ids, ...ours])
    } catch (e) {
      console.warn(`container cleanup of ${this.namespace} failed: ${(e as Error).message}`)
    }
    removeImageWorkLeases((image) => this.refs.has(image) || image.includes(this.namespace))
    for (const r of this.refs) {
      if (dockerTry(['image', 'inspect', r]).status === 0) {
        const res = dockerTry(['rmi', r])
        if (res.status !== 0) {
          // Untags only: a reference by name never deletes an image that has other tags.
          const forced = dockerTry(['rmi', '-f', r])
          if (forced.status !== 0) console.warn(`could not remove image ${r}: ${forced.stderr}`)
        }
      }
    }
    for (const d of this.dirs) rmSync(d, { recursive: true, force: true })
    // Registry side: this file's repositories (their manifests and links), under its namespace.
    if (registries) {
      for (const log of [registries.plainLog, registries.authLog]) {
        const store = path.join(
          path.dirname(log),
          'data',
          'docker',
          'registry',
          'v2',
          'repositories',
          'tf-test',
          this.namespace,
        )
        if (existsSync(store)) rmSync(store, { recursive: true, force: true })
      }
    }
  }
}

/** The layer digests of a manifest in the plain registry (schema 2). */
export function layerDigests(registry: string, repoPath: string, tag: string): string[] {
  const out = execFileSync(
    'curl',
    [
      '-sf',
      '-H',
      'Accept: application/vnd.docker.distribution.manifest.v2+json',
      `http://${registry}/v2/${repoPath}/manifests/${tag}`,
    ],
    { encoding: 'utf8', timeout: 30_000 },
  )
  return (JSON.parse(out).layers as Array<{ digest: string }>).map((l) => l.digest)
}

/** Deletes blob files from a registry's storage (only for blobs a test made: random data). */
export function removeBlobs(log: string, digests: string[]): void {
  for (const d of digests) {
    const hex = d.replace(/^sha256:/, '')
    if (!/^[0-9a-f]{64}$/.test(hex)) continue
    const dir = path.join(
      path.dirname(log),
      'data',
      'docker',
      'registry',
      'v2',
      'blobs',
      'sha256',
      hex.slice(0, 2),
      hex,
    )
    rmSync(dir, { recursive: true, force: true })
  }
}

/** `127.0.0.1:5000/tf-test/<namespace>/<name>` — unique per test file run. */
export function repoName(registry: string, namespace: string, name: string): string {
  return `${registry}/tf-test/${namespace}/${name}`
}

/**
 * Pushes `source` (a local image) as `ref`, then removes the local tag, so the engine has to
 * pull it back. With `dockerConfig`, the push logs in with a throwaway client config (no
 * credentials are left in the user's ~/.docker).
 */
export function pushAndForget(source: string, ref: string, login?: { user: string; password: string }): void {
  const env = { ...process.env }
  let cfg: string | undefined
  if (login) {
    cfg = mkdtempSync(path.join(tmpdir(), 'tf-docker-config-'))
    env.DOCKER_CONFIG = cfg
    const registry = ref.split('/')[0]
    const r = spawnSync('docker', ['login', '-u', login.user, '--password-stdin', registry], {
      input: login.password,
      env,
      encoding: 'utf8',
      timeout: 60_000,
    })
    if (r.status !== 0) throw new Error(`docker login ${registry} failed: ${r.stderr}`)
  }
  try {
    docker(['tag', source, ref])
    const r = spawnSync('docker', ['push', ref], { env, encoding: 'utf8', timeout: 120_000 })
    if (r.status !== 0) throw new Error(`docker push ${ref} failed: ${r.stderr || r.stdout}`)
    docker(['rmi', ref])
  } finally {
    if (cfg) rmSync(cfg, { recursive: true, force: true })
  }
  if (dockerTry(['image', 'inspect', ref]).status === 0) throw new Error(`${ref} still present after rmi`)
}

/**
 * Makes an image with a layer of `mb` MiB of random (incompressible) data on top of `base`,
 * tagged `ref`, so a pull of it really downloads something. Uses run + commit (no builder, no
 * network: `--network none`).
 */
export function makeRandomLayerImage(base: string, ref: string, mb: number, namespace: string): void {
  const name = `tf-mk-${namespace}-${Math.random().toString(16).slice(2, 8)}`
  docker([
    'run',
    '--name',
    name,
    '--network',
    'none',
    '--label',
    `${LABEL_TEST_NAMESPACE}=${namespace}`,
    base,
    'sh',
    '-c',
    `head -c ${mb * 1024 * 1024} /dev/urandom > /random.bin`,
  ])
  try {
    docker(['commit', name, ref])
  } finally {
    dockerTry(['rm', '-f', name])
  }
}

/** Engine `pull` events for one reference, collected while `stop()` has not been called. */
export class PullEvents {
  private proc: ChildProcess
  private buf = ''
  readonly events: any[] = []

  constructor(readonly ref: string) {
    // --since replays from a moment before now, so nothing between spawn and subscribe is lost.
    const since = (Date.now() / 1000 - 1).toFixed(3)
    this.proc = spawn(
      'docker',
      ['events', '--since', since, '--filter', 'type=image', '--filter', 'event=pull', '--format', '{{json .}}'],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    )
    this.proc.stdout!.on('data', (d: Buffer) => {
      this.buf += d.toString('utf8')
      let i
      while ((i = this.buf.indexOf('\n')) >= 0) {
        const line = this.buf.slice(0, i)
        this.buf = this.buf.slice(i + 1)
        try {
          const ev = JSON.parse(line)
          const id = ev?.Actor?.ID ?? ev?.id
          if (id === this.ref) this.events.push(ev)
        } catch {
          /* not JSON */
        }
      }
    })
  }

  get count(): number {
    return this.events.length
  }

  /** Waits a little for late events, then ends the subscription. */
  async stop(graceMs = 1000): Promise<number> {
    await sleep(graceMs)
    this.proc.kill('SIGTERM')
    return this.count
  }
}

/**
 * Pull attempts for `repo:tag` the registry saw: dockerd starts each pull of a tag with one
 * `HEAD /v2/<repo>/manifests/<tag>` (access log, Combined Log Format).
 */
export function manifestHeads(log: string, repoPath: string, tag: string): number {
  const needle = `"HEAD /v2/${repoPath}/manifests/${tag} HTTP/`
  if (!existsSync(log)) return 0
  return readFileSync(log, 'utf8')
    .split('\n')
    .filter((l) => l.includes(needle)).length
}

/** Polls getImageBuildStatus until `done`, recording each status seen. */
export async function pollUntil(
  provider: Provider,
  done: (b: Build) => boolean,
  timeoutMs = 60_000,
  intervalMs = 20,
): Promise<{ last: Build; seen: Build[] }> {
  const seen: Build[] = []
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const b = (await provider.getImageBuildStatus()) as Build
    seen.push(b)
    if (done(b)) return { last: b, seen }
    if (Date.now() > deadline) {
      throw new Error(`status did not settle within ${timeoutMs} ms; last: ${JSON.stringify(b)}`)
    }
    await sleep(intervalMs)
  }
}

/** getImageBuildStatus from a brand-new Node process (a server restart, as far as the addon knows). */
export function statusInFreshProcess(options: Record<string, unknown>): Build {
  const script = `
    const { DockerSandboxProvider } = require(${JSON.stringify(ROOT)});
    const p = new DockerSandboxProvider(JSON.parse(process.argv[1]));
    p.getImageBuildStatus().then(
      (b) => { process.stdout.write(JSON.stringify(b)); p.dispose(); },
      (e) => { process.stderr.write(String(e && e.stack || e)); process.exit(3); },
    );`
  const r = spawnSync(process.execPath, ['-e', script, JSON.stringify(options)], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: 60_000,
  })
  if (r.status !== 0) throw new Error(`child node exited ${r.status}: ${r.stderr}`)
  return JSON.parse(r.stdout) as Build
}

/** Writes files into a directory (paths relative to it). */
export function writeFiles(dir: string, files: Record<string, string>): void {
  for (const [name, content] of Object.entries(files)) writeFileSync(path.join(dir, name), content)
}

/** Whether the engine can start containers on its default bridge (RUN steps of the classic builder need it). */
export function bridgeWorks(): { ok: boolean; detail: string } {
  const r = dockerTry([
    'run',
    '--rm',
    '--label',
    `${LABEL_TEST_NAMESPACE}=bridge-check`,
    'trueforge-sandbox-busybox:1',
    'true',
  ])
  return { ok: r.status === 0, detail: r.stderr }
}

export const PULL_REASON =
  /^pulling \S+: (resolving the manifest|\d+\/\d+ layers done, \d+\.\d (MiB|GiB) of \d+\.\d (MiB|GiB) downloaded)$/
export const BUILD_REASON = /^building trueforge-sandbox-build:[0-9a-f]{16}: (sending the context|Step \d+\/\d+)$/
export const SAVE_AGAIN = /save the sandbox settings again/
