// Engines reached the way the Docker CLI reaches them: a second dockerd that only speaks TLS on
// 127.0.0.1 (scripts/engines/tls-engine.sh: its own namespace, certificates made by openssl there), found
// by the `tls` option, by DOCKER_HOST/DOCKER_TLS_VERIFY/DOCKER_CERT_PATH, and by a Docker context
// that the real `docker context create` wrote; and every way it can go wrong, as typed errors
// within engineTimeoutMs.

import { execFileSync, spawnSync } from 'node:child_process'
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'

import { DockerSandboxProvider, SandboxEngineError } from '../..'
import { BUSYBOX, cleanupNamespace, rejection, uniqueNamespace } from '../helpers'

const ROOT = path.resolve(__dirname, '..', '..')
const SCRIPT = path.join(ROOT, 'scripts', 'engines', 'tls-engine.sh')
const namespace = uniqueNamespace('t-tls')
const CHILD = path.join(__dirname, 'child.js')
const ENV_KEYS = [
  'DOCKER_HOST',
  'DOCKER_TLS_VERIFY',
  'DOCKER_TLS',
  'DOCKER_CERT_PATH',
  'DOCKER_CONTEXT',
  'DOCKER_CONFIG',
]

let host = ''
let certs = ''
let socket = ''
let configDir = ''

beforeAll(() => {
  const out = execFileSync('bash', [SCRIPT, 'start'], { encoding: 'utf8', timeout: 120_000 })
  const kv = Object.fromEntries(
    out
      .split('\n')
      .filter((l) => l.includes('='))
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  )
  host = kv.TLS_HOST
  certs = kv.CERTS
  socket = kv.SOCKET
  configDir = mkdtempSync(path.join(tmpdir(), 'tf-docker-config-'))
}, 150_000)

afterAll(() => {
  cleanupNamespace(namespace)
  if (configDir) rmSync(configDir, { recursive: true, force: true })
  execFileSync('bash', [SCRIPT, 'teardown'], { stdio: 'ignore', timeout: 120_000 })
}, 150_000)

const cert = (name: string) => path.join(certs, name)

function provider(extra: Record<string, unknown>) {
  return new DockerSandboxProvider({ image: BUSYBOX, namespace, network: 'none', engineTimeoutMs: 5000, ...extra })
}

interface ChildResult {
  dockerHost?: string
  sandboxId?: string
  exec?: unknown
  downloaded?: string
  error?: { code: string; message: string; name: string }
  ms: number
}

/** The round trip in a fresh process with exactly `env`'s DOCKER_* variables. */
function inChild(env: Record<string, string>, options: Record<string, unknown> = {}): ChildResult {
  const base = { ...process.env }
  for (const k of ENV_KEYS) delete base[k]
  const opts = { image: BUSYBOX, namespace, network: 'none', engineTimeoutMs: 5000, ...options }
  const out = execFileSync(process.execPath, [CHILD, JSON.stringify(opts)], {
    env: { ...base, ...env },
    encoding: 'utf8',
    timeout: 60_000,
  })
  return JSON.parse(out.trim().split('\n').pop()!)
}

function expectRoundTrip(r: ChildResult) {
  expect(r.error).toBeUndefined()
  expect(r.dockerHost).toBe(host)
  expect(r.exec).toEqual({ success: true, response: { exitCode: 0, result: `over-tls\n${r.sandboxId}\n` } })
  expect(r.downloaded).toBe('tls bytes')
}

/** The contract's round trip on the TLS engine: create, exec, upload, download, remove. */
async function roundTrip(p: InstanceType<typeof DockerSandboxProvider>) {
  const { sandboxId } = await p.createSandbox()
  try {
    const r = await p.exec({ sandboxId, command: 'echo over-tls; pwd' })
    expect(r).toEqual({ success: true, response: { exitCode: 0, result: `over-tls\n${sandboxId}\n` } })
    // Through the in-sandbox agent, whose stream is the engine's attached exec over TLS.
    expect(await p.agentStatus(sandboxId)).toMatchObject({ mode: 'agent', uid: 0 })
    await p.uploadFile({ sandboxId, remotePath: `${sandboxId}/a.txt`, content: Buffer.from('tls bytes') })
    const got = await p.downloadFile({ sandboxId, path: `${sandboxId}/a.txt` })
    expect(Buffer.from(got).toString()).toBe('tls bytes')
    // The container is on the TLS engine, not on the main one.
    const onTls = execFileSync(
      'docker',
      ['-H', socket, 'ps', '-q', '--filter', `label=trueforge.sandbox.namespace=${namespace}`],
      { encoding: 'utf8' },
    )
    expect(onTls.trim()).not.toBe('')
  } finally {
    await p.removeSandbox(sandboxId)
    p.dispose()
  }
}

test('TLS by the `tls` option: file paths, and PEM text', async () => {
  await roundTrip(
    provider({ dockerHost: host, tls: { ca: cert('ca.pem'), cert: cert('cert.pem'), key: cert('key.pem') } }),
  )
  await roundTrip(
    provider({
      dockerHost: host,
      tls: {
        ca: readFileSync(cert('ca.pem'), 'utf8'),
        cert: readFileSync(cert('cert.pem'), 'utf8'),
        key: readFileSync(cert('key.pem'), 'utf8'),
      },
    }),
  )
}, 60_000)

test('TLS by DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH, as the CLI reads them', async () => {
  expectRoundTrip(inChild({ DOCKER_HOST: host, DOCKER_TLS_VERIFY: '1', DOCKER_CERT_PATH: certs }))
  // The explicit option with the same variables: the CLI's `-H` also takes TLS from them.
  expectRoundTrip(inChild({ DOCKER_TLS_VERIFY: '1', DOCKER_CERT_PATH: certs }, { dockerHost: host }))
  // DOCKER_TLS without verification (encrypted, engine not authenticated): the CA is not needed.
  const noCa = mkdtempSync(path.join(tmpdir(), 'tf-certs-'))
  try {
    copyFileSync(cert('cert.pem'), path.join(noCa, 'cert.pem'))
    copyFileSync(cert('key.pem'), path.join(noCa, 'key.pem'))
    expectRoundTrip(inChild({ DOCKER_HOST: host, DOCKER_TLS: '1', DOCKER_CERT_PATH: noCa }))
  } finally {
    rmSync(noCa, { recursive: true, force: true })
  }
}, 60_000)

test('TLS by a Docker context: DOCKER_CONTEXT, then the config’s current context', async () => {
  const cli = (...args: string[]) => execFileSync('docker', ['--config', configDir, ...args], { encoding: 'utf8' })
  cli(
    'context',
    'create',
    'tf-tls',
    '--docker',
    `host=${host},ca=${cert('ca.pem')},cert=${cert('cert.pem')},key=${cert('key.pem')}`,
  )
  expectRoundTrip(inChild({ DOCKER_CONFIG: configDir, DOCKER_CONTEXT: 'tf-tls' }))
  cli('context', 'use', 'tf-tls')
  expectRoundTrip(inChild({ DOCKER_CONFIG: configDir }))
  // DOCKER_HOST wins over the context, as in the CLI (the main engine's socket here).
  const viaHost = inChild(
    { DOCKER_CONFIG: configDir, DOCKER_HOST: 'unix:///var/run/docker.sock' },
    { network: 'bridge', engineTimeoutMs: 30_000 },
  )
  expect(viaHost.error).toBeUndefined()
  expect(viaHost.dockerHost).toBe('unix:///var/run/docker.sock')
  // An unknown context is a clear option error naming it.
  const unknown = inChild({ DOCKER_CONFIG: configDir, DOCKER_CONTEXT: 'no-such-context' })
  expect(unknown.error?.code).toBe('INVALID_OPTION')
  expect(unknown.error?.message).toMatch(/no-such-context.*not found.*docker context ls/)
}, 90_000)

/** Creating a sandbox fails with ENGINE_TLS naming the host and `fix`, well within engineTimeoutMs. */
async function refused(extra: Record<string, unknown>, message: RegExp) {
  const p = provider(extra)
  const started = Date.now()
  const e = await rejection(p.createSandbox())
  const ms = Date.now() - started
  p.dispose()
  expect(e).toBeInstanceOf(SandboxEngineError)
  expect(e.code).toBe('ENGINE_TLS')
  expect(e.message).toContain(host)
  expect(e.message).toMatch(message)
  expect(e.message).toContain('Fix:')
  expect(ms).toBeLessThan(5000)
  return e
}

test('egress under a policy on a remote engine: the bytes ride the agent stream and leave from this host', async () => {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const origins = require('../fixtures/origins.js')
  const origin = await origins.startOrigin({ name: 'remote' })
  const p = new DockerSandboxProvider({
    image: BUSYBOX,
    namespace,
    dockerHost: host,
    tls: { ca: cert('ca.pem'), cert: cert('cert.pem'), key: cert('key.pem') },
    egress: { allow: ['origin.test'], hosts: { 'origin.test': '127.0.0.1' } },
  })
  const { sandboxId } = await p.createSandbox()
  try {
    // The engine runs in a network namespace of its own: 127.0.0.1 here is this process's host.
    const r = await p.exec({ sandboxId, command: `wget -q -O- http://origin.test:${origin.port}/hello` })
    expect(r).toEqual({ success: true, response: { exitCode: 0, result: 'hello from remote\n' } })
    const refused = await p.exec({ sandboxId, command: `wget -q -O- http://other.test:${origin.port}/hello 2>&1` })
    expect(refused.success && refused.response.exitCode).not.toBe(0)
    expect(await p.egressStats(sandboxId)).toMatchObject({ mode: 'policy', allowed: 1, refused: 1 })
  } finally {
    await p.removeSandbox(sandboxId)
    p.dispose()
    await origin.close()
  }
}, 60_000)

test('plain tcp to the TLS port, a wrong CA, no client certificate, an expired or foreign one: typed errors, fast', async () => {
  await refused({ dockerHost: host }, /speaks TLS and this client sent plain HTTP.*DOCKER_TLS_VERIFY/)
  await refused(
    { dockerHost: host, tls: { ca: cert('other-ca/ca.pem'), cert: cert('cert.pem'), key: cert('key.pem') } },
    /not signed by the CA given/,
  )
  await refused({ dockerHost: host, tls: { ca: cert('ca.pem') } }, /wants a client certificate and none was given/)
  await refused(
    { dockerHost: host, tls: { ca: cert('ca.pem'), cert: cert('expired/cert.pem'), key: cert('expired/key.pem') } },
    /client certificate .* expired/,
  )
  await refused(
    { dockerHost: host, tls: { ca: cert('ca.pem'), cert: cert('other-ca/cert.pem'), key: cert('other-ca/key.pem') } },
    /refused the client certificate/,
  )
  // The same through the environment: the CA alone in DOCKER_CERT_PATH.
  const viaEnv = inChild({ DOCKER_HOST: host, DOCKER_TLS_VERIFY: '1', DOCKER_CERT_PATH: cert('no-client') })
  expect(viaEnv.error?.code).toBe('ENGINE_TLS')
  expect(viaEnv.error?.name).toBe('SandboxEngineError')
  expect(viaEnv.error?.message).toMatch(/wants a client certificate/)
  expect(viaEnv.ms).toBeLessThan(5000)
  // A bad `tls` option is refused at construction, naming it.
  expect(() => provider({ dockerHost: host, tls: { cert: cert('cert.pem') } })).toThrow(/tls/)
  expect(() => provider({ dockerHost: host, tls: { ca: '/nonexistent/ca.pem' } })).toThrow(/tls\.ca/)
}, 60_000)

test('an engine is its own world: a sandbox on the TLS engine is not reachable through the main one with the same namespace', async () => {
  const tlsProvider = provider({
    dockerHost: host,
    tls: { ca: cert('ca.pem'), cert: cert('cert.pem'), key: cert('key.pem') },
  })
  const main = new DockerSandboxProvider({ image: BUSYBOX, namespace, dockerHost: 'unix:///var/run/docker.sock' })
  const { sandboxId } = await tlsProvider.createSandbox()
  try {
    expect((await rejection(main.exec({ sandboxId, command: 'true' }))).code).toBe('SANDBOX_NOT_AVAILABLE')
    const e = await rejection(main.downloadFile({ sandboxId, path: `${sandboxId}/x` }))
    expect(e.code).toBe('SANDBOX_NOT_AVAILABLE')
    // Same address, another TLS identity (no verification): still works, as another client.
    const other = provider({ dockerHost: host, tls: { verify: false, cert: cert('cert.pem'), key: cert('key.pem') } })
    const r2 = await other.exec({ sandboxId, command: 'echo same-engine' })
    expect(r2).toEqual({ success: true, response: { exitCode: 0, result: 'same-engine\n' } })
    other.dispose()
  } finally {
    await tlsProvider.removeSandbox(sandboxId)
    tlsProvider.dispose()
    main.dispose()
  }
}, 60_000)

test('doctor, ls and rm through TLS (DOCKER_* variables and a context), and doctor on plain tcp to the TLS port', () => {
  const CLI = path.join(ROOT, 'cli', 'index.js')
  const run = (args: string[], env: Record<string, string>) => {
    const base = { ...process.env }
    for (const k of ENV_KEYS) delete base[k]
    const r = spawnSync(process.execPath, [CLI, ...args], {
      env: { ...base, ...env },
      encoding: 'utf8',
      timeout: 60_000,
    })
    return { code: r.status, stdout: r.stdout, stderr: r.stderr }
  }
  const tlsEnv = { DOCKER_HOST: host, DOCKER_TLS_VERIFY: '1', DOCKER_CERT_PATH: certs }
  const d = run(['doctor', '--image', BUSYBOX, '--network', 'none', '--namespace', namespace], tlsEnv)
  expect(d.stdout).toMatch(
    /^ok {4}endpoint: TLS: tcp:\/\/127\.0\.0\.1:\d+ \(TLS, engine verified, client certificate; DOCKER_CERT_PATH=.*from DOCKER_HOST\)$/m,
  )
  expect(d.stdout).toMatch(/^ok {4}test sandbox: create \d+ ms/m)
  expect(d.code).toBe(0)

  const plain = run(['doctor', '--docker-host', host], {})
  expect(plain.code).toBe(1)
  expect(plain.stdout).toMatch(/^warn {2}endpoint: plain TCP/m)
  expect(plain.stdout).toMatch(/^fail {2}engine reachable: ENGINE_TLS: .*speaks TLS.*DOCKER_TLS_VERIFY/m)

  // ls and rm through the context made by the CLI in the context test above.
  const p = provider({ dockerHost: host, tls: { ca: cert('ca.pem'), cert: cert('cert.pem'), key: cert('key.pem') } })
  return p.createSandbox().then(({ sandboxId }) => {
    p.dispose()
    const ctxEnv = { DOCKER_CONFIG: configDir, DOCKER_CONTEXT: 'tf-tls' }
    const ls = run(['ls', '--namespace', namespace, '--json'], ctxEnv)
    expect(ls.code).toBe(0)
    expect(JSON.parse(ls.stdout).map((s: any) => s.sandboxId)).toEqual([sandboxId])
    const rm = run(['rm', '--namespace', namespace, sandboxId], ctxEnv)
    expect(rm.stdout).toContain(`removed ${sandboxId}`)
    expect(JSON.parse(run(['ls', '--namespace', namespace, '--json'], ctxEnv).stdout)).toEqual([])
  })
}, 90_000)
