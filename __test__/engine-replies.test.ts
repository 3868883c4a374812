// Engine replies read whole into memory are capped (issue 20, item 8). A fake engine of our own,
// on a unix socket and on a loopback TCP port, answers the version negotiation normally and then
// sends a body that never ends to one inspect or list: the call fails with ENGINE_REPLY_TOO_LARGE
// well within its deadline, and the calling process (a child, so that its memory is its own)
// grows by less than 50 MiB. Before the cap the same call ran into its 3 s deadline
// (ENGINE_TIMEOUT) with hundreds of MiB read. A real engine keeps working through the same
// connector (the rest of the suite runs on it too).

import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import { DockerSandboxProvider, SandboxEngineError } from '..'
import { BUSYBOX, SandboxTracker, containerNameFor, ok, randomUlid, uniqueNamespace } from './helpers'

jest.setTimeout(60_000)

const MiB = 1024 * 1024
const DEADLINE_MS = 3000

/** Which requests get a reply that never ends, and with what status. */
type Endless = { path: RegExp; status: number } | null

class FakeEngine {
  endless: Endless = null
  /** Bytes written into endless replies (to show the client stopped reading them). */
  sent = 0
  readonly requests: string[] = []
  private readonly servers: http.Server[] = []

  handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    const url = req.url ?? ''
    this.requests.push(`${req.method} ${url}`)
    const path = url.split('?')[0]
    if (path.endsWith('/version')) {
      res.writeHead(200, { 'Content-Type': 'application/json' })
      res.end(
        JSON.stringify({ ApiVersion: '1.41', MinAPIVersion: '1.12', Version: '20.10.24', Os: 'linux', Arch: 'amd64' }),
      )
      return
    }
    const e = this.endless
    if (e && e.path.test(path)) {
      this.pour(res, e.status, path.endsWith('/containers/json') ? '[' : '{"Id":"')
      return
    }
    res.writeHead(404, { 'Content-Type': 'application/json' })
    res.end(JSON.stringify({ message: `No such container: ${path}` }))
  }

  /** Writes a JSON-looking body forever, respecting backpressure, until the client goes away. */
  private pour(res: http.ServerResponse, status: number, opening: string): void {
    res.writeHead(status, { 'Content-Type': 'application/json' })
    res.write(opening)
    const chunk = Buffer.alloc(256 * 1024, 'a')
    const more = (): void => {
      while (!res.destroyed) {
        this.sent += chunk.length
        if (!res.write(chunk)) {
          res.once('drain', more)
          return
        }
      }
    }
    res.on('error', () => {})
    more()
  }

  async listen(where: string | number): Promise<string> {
    const server = http.createServer((req, res) => this.handle(req, res))
    this.servers.push(server)
    await new Promise<void>((resolve) => {
      if (typeof where === 'string') server.listen(where, resolve)
      else server.listen(where, '127.0.0.1', resolve)
    })
    return typeof where === 'string' ? `unix://${where}` : `tcp://127.0.0.1:${(server.address() as AddressInfo).port}`
  }

  async close(): Promise<void> {
    for (const s of this.servers) {
      s.closeAllConnections()
      await new Promise((r) => s.close(r))
    }
  }
}

interface Outcome {
  resolved?: boolean
  failed?: string
  code?: string
  name?: string
  statusCode?: number
  message?: string
  engineError?: boolean
  ms: number
  baseline: number
  peak: number
  samples: number
}

/** Runs one call in a fresh node process against `dockerHost`. */
function callInChild(dockerHost: string, call: 'download' | 'reap', sandboxId: string): Promise<Outcome> {
  const job = {
    options: {
      image: BUSYBOX,
      dockerHost,
      namespace: 'replies',
      engineTimeoutMs: DEADLINE_MS,
      // No background reaper: only the call under test reads from the engine.
      autoDeleteIntervalInMinutes: call === 'reap' ? 1 : 0,
    },
    warmUpId: `/workspace/${randomUlid()}`,
    sandboxId,
    call,
    sampleMs: 2,
  }
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      ['--expose-gc', join(__dirname, 'fixtures', 'engine-call.js'), JSON.stringify(job)],
      {
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    )
    let out = ''
    child.stdout.on('data', (d) => (out += d))
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000)
    child.on('close', () => {
      clearTimeout(timer)
      const last = out.trim().split('\n').pop() ?? ''
      try {
        resolve(JSON.parse(last) as Outcome)
      } catch {
        reject(new Error(`the child printed no result: ${out}`))
      }
    })
  })
}

const fake = new FakeEngine()
let dir: string
let unixHost: string
let tcpHost: string

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'tf-fake-engine-'))
  unixHost = await fake.listen(join(dir, 'engine.sock'))
  tcpHost = await fake.listen(0)
})

afterAll(async () => {
  await fake.close()
  rmSync(dir, { recursive: true, force: true })
})

/** The inspect path of `sandboxId`'s container (the warm-up's other id gets a plain 404). */
function inspectOf(sandboxId: string): RegExp {
  return new RegExp(`^(/v[\\d.]+)?/containers/${containerNameFor('replies', sandboxId)}/json$`)
}

function expectCapped(r: Outcome, limit: number): void {
  expect(r.failed).toBeUndefined()
  const growthMiB = (r.peak - r.baseline) / MiB
  console.log(
    `${r.code} after ${r.ms.toFixed(0)} ms; rss growth ${growthMiB.toFixed(1)} MiB over ${r.samples} samples; fake engine sent ${(fake.sent / MiB).toFixed(0)} MiB`,
  )
  expect({ code: r.code, name: r.name, statusCode: r.statusCode, engineError: r.engineError }).toEqual({
    code: 'ENGINE_REPLY_TOO_LARGE',
    name: 'SandboxEngineError',
    statusCode: 503,
    engineError: true,
  })
  expect(r.message).toContain(`sent more than ${limit} bytes in reply to`)
  expect(r.message).toContain('`dockerHost`')
  expect(r.ms).toBeLessThan(DEADLINE_MS)
  expect(growthMiB).toBeLessThan(50)
}

test('an inspect whose body never ends fails with ENGINE_REPLY_TOO_LARGE (unix socket)', async () => {
  const sandboxId = `/workspace/${randomUlid()}`
  fake.endless = { path: inspectOf(sandboxId), status: 200 }
  fake.sent = 0
  const r = await callInChild(unixHost, 'download', sandboxId)
  expectCapped(r, 8 * MiB)
  expect(r.message).toContain('inspect the sandbox container')
  // The client stopped reading: the fake could only write its cap plus what the buffers hold.
  expect(fake.sent).toBeLessThan(64 * MiB)
})

test('a list whose body never ends fails the same way (loopback TCP)', async () => {
  fake.endless = { path: /^(\/v[\d.]+)?\/containers\/json$/, status: 200 }
  fake.sent = 0
  const r = await callInChild(tcpHost, 'reap', `/workspace/${randomUlid()}`)
  expectCapped(r, 8 * MiB)
  expect(fake.requests.some((q) => /^GET (\/v[\d.]+)?\/containers\/json\?/.test(q))).toBe(true)
})

test('an error reply is capped at 1 MiB', async () => {
  const sandboxId = `/workspace/${randomUlid()}`
  fake.endless = { path: inspectOf(sandboxId), status: 500 }
  fake.sent = 0
  const r = await callInChild(unixHost, 'download', sandboxId)
  expectCapped(r, MiB)
})

test('a real engine works through the same connector: inspect, exec, transfer, list', async () => {
  const namespace = uniqueNamespace('replies')
  const provider = new DockerSandboxProvider({ image: BUSYBOX, namespace })
  const tracker = new SandboxTracker(namespace)
  try {
    const id = await tracker.create(provider)
    expect(await ok(provider, id, 'echo hello')).toBe('hello\n')
    // A download streams (not capped by count): 12 MiB, past the 8 MiB cap of a JSON reply.
    await ok(provider, id, 'head -c 12582912 /dev/zero > big')
    const got = await provider.downloadFile({ sandboxId: id, path: 'big' })
    expect(got.length).toBe(12 * MiB)
    expect(await provider.reapStale()).toEqual({ removed: [] })
    const e = await provider.downloadFile({ sandboxId: id, path: '/nope' }).catch((x: unknown) => x)
    expect(e).not.toBeInstanceOf(SandboxEngineError)
    expect((e as { code?: string }).code).toBe('FILE_NOT_FOUND')
  } finally {
    await tracker.cleanup(provider)
    await provider.dispose()
  }
})
