// Image work seen from every server process on one engine: while one process pulls, a status
// poll from another process reports `pending` with the puller's progress (not `failed`), does
// not start a second pull, and once the puller is SIGKILLed the poll turns `failed` with the
// save-again advice within a bounded time; saving again then takes the work over.
//
// The pull targets a loopback "registry" that answers the version check and then never answers
// the manifest request, so the pull stays in flight for as long as the test needs.

import { ChildProcess, spawn } from 'node:child_process'
import { createServer, Server, Socket } from 'node:net'
import path from 'node:path'

import { DockerSandboxProvider } from '../..'
import { docker, sleep, uniqueNamespace, waitFor } from '../helpers'
import { Build, ImageTracker, SAVE_AGAIN } from './support'

jest.setTimeout(120_000)

const namespace = uniqueNamespace('t-img-shared')
const images = new ImageTracker(namespace)
/**
 * The lease's silence limit (src/images/work.rs STALE_AFTER) plus room for polling and load (a
 * CI run on a loaded two-core machine took 25 s once, so the room is 20 s).
 */
const DEAD_WITHIN_MS = 12_000 + 20_000

let server: Server
let port: number
const sockets = new Set<Socket>()
let manifestRequests = 0
/** Once set, manifest requests are answered "unknown" instead of left hanging. */
let refuse = false
let child: ChildProcess | undefined

beforeAll(async () => {
  server = createServer((socket) => {
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    socket.on('error', () => {})
    socket.on('data', (chunk) => {
      const line = chunk.toString('latin1').split('\r\n')[0]
      if (/^(GET|HEAD) \/v2\/ HTTP/.test(line)) {
        socket.write(
          'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nDocker-Distribution-API-Version: registry/2.0\r\nContent-Length: 2\r\n\r\n{}',
        )
      } else if (/\/manifests\//.test(line) && refuse) {
        const body = '{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}'
        socket.end(
          `HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
        )
      } else if (/\/manifests\//.test(line)) {
        manifestRequests++ // and never answered
      } else if (/^[A-Z]+ /.test(line)) {
        socket.end('HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n')
      }
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  port = (server.address() as { port: number }).port
})

afterAll(async () => {
  if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
  for (const s of sockets) s.destroy()
  await new Promise<void>((resolve) => server.close(() => resolve()))
  images.cleanup()
})

function startPuller(image: string): Promise<{ proc: ChildProcess; first: Build }> {
  const proc = spawn(process.execPath, [path.join(__dirname, '..', 'fixtures', 'image-puller.js'), image, namespace], {
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  return new Promise((resolve, reject) => {
    let out = ''
    let err = ''
    proc.stdout!.on('data', (d) => {
      out += d
      const m = out.match(/^STARTED (.*)$/m)
      if (m) resolve({ proc, first: JSON.parse(m[1]) })
    })
    proc.stderr!.on('data', (d) => (err += d))
    proc.on('exit', (code) => reject(new Error(`puller exited (${code}) before starting: ${err}`)))
  })
}

async function pollStatus(
  p: InstanceType<typeof DockerSandboxProvider>,
  until: (b: Build) => boolean,
  limitMs: number,
) {
  const started = Date.now()
  let last = (await p.getImageBuildStatus()) as Build
  while (!until(last)) {
    if (Date.now() - started > limitMs) throw new Error(`status still ${JSON.stringify(last)} after ${limitMs} ms`)
    await sleep(250)
    last = (await p.getImageBuildStatus()) as Build
  }
  return { last, ms: Date.now() - started }
}

test('another process sees the pull as pending, does not pull again, and sees a killed puller as failed', async () => {
  const image = images.ref(`127.0.0.1:${port}/tf-test/${namespace}/stalls:1`)
  const { proc, first } = await startPuller(image)
  child = proc
  expect(first.status).toBe('pending')

  // This process (another server replica) has nothing in flight itself.
  const poller = new DockerSandboxProvider({ image, namespace })
  const { last: seen } = await pollStatus(
    poller,
    (b) => b.status === 'pending' && /in server process/.test(b.reason ?? ''),
    20_000,
  )
  expect(seen.reason).toContain(`:${proc.pid}`)
  expect(seen.reason).toMatch(/^pulling \S+: resolving the manifest \(in server process \S+:\d+\)$/)
  expect(seen.metadata).toEqual({ image })
  // The lease is one container on the engine, created and never started.
  const lease = docker([
    'ps',
    '-a',
    '--filter',
    `label=trueforge.sandbox.imagework=${image}`,
    '--format',
    '{{.ID}} {{.Status}}',
  ])
  expect(lease.split('\n')).toHaveLength(1)
  const [firstLease, state] = lease.split(' ')
  expect(state).toBe('Created')

  // Saving the settings on this replica joins the pull instead of starting a second one.
  await waitFor(() => manifestRequests >= 1, 20_000, 'the engine asking for the manifest', 25)
  const requestsBefore = manifestRequests
  const joined = (await poller.buildImage()) as Build
  expect(['pending']).toContain(joined.status)
  await sleep(3_000)
  const still = (await poller.getImageBuildStatus()) as Build
  expect(still.status).toBe('pending')
  expect(still.reason).toContain(`:${proc.pid}`)
  expect(manifestRequests).toBe(requestsBefore)

  // The puller dies without a word.
  proc.kill('SIGKILL')
  await new Promise((r) => proc.once('exit', r))
  const { last: dead, ms } = await pollStatus(poller, (b) => b.status !== 'pending', DEAD_WITHIN_MS)
  expect(dead.status).toBe('failed')
  expect(dead.reason).toMatch(SAVE_AGAIN)
  expect(dead.reason).toMatch(/has not been heard from for \d+ s/)
  expect(dead.reason).toContain(`:${proc.pid}`)
  expect(ms).toBeLessThan(DEAD_WITHIN_MS)
  // A fresh provider object says the same.
  expect(((await new DockerSandboxProvider({ image, namespace }).getImageBuildStatus()) as Build).status).toBe('failed')

  // Saving again on the surviving replica takes the work over.
  const retried = (await poller.buildImage()) as Build
  expect(retried.status).toBe('pending')
  const { last: own } = await pollStatus(
    poller,
    (b) => b.status === 'pending' && !/in server process/.test(b.reason ?? ''),
    10_000,
  )
  expect(own.reason).toMatch(/^pulling \S+: resolving the manifest$/)
  // The dead lease was replaced by this process's own.
  const leases = () =>
    docker(['ps', '-a', '--filter', `label=trueforge.sandbox.imagework=${image}`, '--format', '{{.ID}}'])
  await waitFor(() => ![firstLease, ''].includes(leases()), 10_000, 'a new lease', 25)
  expect(leases().split('\n')).toHaveLength(1)

  // End the stalled pull: the registry now says the manifest is unknown, the pull fails, and the
  // failure is recorded in the lease for every process to read.
  refuse = true
  for (const s of sockets) s.destroy()
  const { last: failed } = await pollStatus(poller, (b) => b.status === 'failed', 60_000)
  expect(failed.reason).toContain(image)
  expect(failed.reason).toMatch(/manifest unknown/)
  expect(failed.reason).not.toMatch(/has not been heard from/)
  const elsewhere = (await new DockerSandboxProvider({ image, namespace }).getImageBuildStatus()) as Build
  expect(elsewhere).toEqual(failed)
})
