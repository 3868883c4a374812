// Wrong or late errors (issue 20, item 6), each reproduced on the real engine: an exec right
// after the workload killed the container's init starts the sandbox again; calls racing
// removeSandbox are SandboxNotAvailableError, whatever the engine said meanwhile; an upload onto
// a file the engine mounts (/etc/hosts) is the caller's path error; Code Mode's start() says
// CODE_MODE_UNAVAILABLE only for an image without python3, and names any other failure of its
// relay (a full disk) as CODE_MODE_START_FAILED; downloads of a file rewritten in place are
// never INTERNAL "archive stream ended early".

import {
  DockerSandboxProvider,
  SandboxError,
  SandboxFileChangedError,
  SandboxInvalidPathError,
  SandboxNotAvailableError,
} from '..'
import { BUSYBOX, DEBIAN, ok, rejection, SandboxTracker, TRUEFORGE, uniqueNamespace } from './helpers'

jest.setTimeout(120_000)

const namespace = uniqueNamespace('t-lateerr')
const sandboxes = new SandboxTracker(namespace)
const providers: InstanceType<typeof DockerSandboxProvider>[] = []

function provider(options: Record<string, unknown> = {}) {
  const p = new DockerSandboxProvider({ image: BUSYBOX, namespace, ...options })
  providers.push(p)
  return p
}

afterAll(async () => {
  const p = provider()
  await sandboxes.cleanup(p)
  for (const q of providers) q.dispose()
})

/** What a call came to, as one comparable string. */
async function outcome(call: Promise<unknown>): Promise<string> {
  try {
    const v: any = await call
    if (v && v.success === false) return `success: false (${v.error})`
    return 'ok'
  } catch (e: any) {
    return e instanceof SandboxNotAvailableError ? 'SandboxNotAvailableError' : `${e?.name} ${e?.code}: ${e?.message}`
  }
}

test.each([
  ['busybox, root', BUSYBOX, {}],
  ['trueforge image, as root', TRUEFORGE, { user: '0:0' }],
])(
  '%s: an exec right after `kill -9 -1` (the init killed) starts the sandbox again, files kept',
  async (_l, image, extra) => {
    const p = provider({ image, ...extra })
    const id = await sandboxes.create(p)
    await ok(p, id, 'echo kept > marker')
    const seen: string[] = []
    for (let round = 0; round < 8; round++) {
      const killed = await p.exec({ sandboxId: id, command: 'kill -9 -1', timeoutSeconds: 20 })
      // As root the command also kills the sandbox's agent that runs it: its result is then lost,
      // and the call says so rather than make one up. Either way the next call must work.
      if (!killed.success) expect(killed.error).toMatch(/agent ended while the call was in flight/)
      const next = await p.exec({ sandboxId: id, command: 'cat marker', timeoutSeconds: 20 })
      seen.push(next.success ? next.response.result : `success: false (${next.error})`)
    }
    expect(seen).toEqual(Array(8).fill('kept\n'))
  },
)

test('calls racing removeSandbox are SandboxNotAvailableError, never the engine text or "resolve the image user"', async () => {
  // The trueforge image runs as the user `agent`: resolving a sandbox reads its /etc/passwd.
  const p = provider({ image: TRUEFORGE })
  const bad: string[] = []
  let raced = 0
  for (let round = 0; round < 8; round++) {
    const id = await sandboxes.create(p)
    // A fresh provider: nothing cached, so each call resolves the container (and its user).
    const q = provider({ image: TRUEFORGE })
    const after = (ms: number) => new Promise((r) => setTimeout(r, ms))
    const delay = (round % 4) * 15
    const calls = [
      ...[0, 10, 20, 30].map((ms) =>
        after(ms).then(() => q.exec({ sandboxId: id, command: 'echo hi', timeoutSeconds: 20 })),
      ),
      after(delay + 5).then(() => q.uploadFile({ sandboxId: id, remotePath: 'f', content: Buffer.from('x') })),
      after(delay + 5).then(() => q.downloadFile({ sandboxId: id, path: '/etc/hostname' })),
    ]
    const removed = after(delay).then(() => p.removeSandbox(id))
    const results = await Promise.all(calls.map(outcome))
    expect(await removed).toBe(true)
    raced += results.filter((r) => r === 'SandboxNotAvailableError').length
    bad.push(...results.filter((r) => r !== 'ok' && r !== 'SandboxNotAvailableError'))
    // Once removed, every call says so.
    expect(await outcome(q.exec({ sandboxId: id, command: 'true' }))).toBe('SandboxNotAvailableError')
  }
  expect(bad).toEqual([])
  // The race was met: some calls lost it.
  expect(raced).toBeGreaterThan(0)
})

test('an upload onto /etc/hosts (a file the engine mounts) is the path error, not an engine failure', async () => {
  const p = provider()
  const id = await sandboxes.create(p)
  for (const path of ['/etc/hosts', '/etc/hostname', '/etc/resolv.conf']) {
    const e = await rejection(p.uploadFile({ sandboxId: id, remotePath: path, content: Buffer.from('1.2.3.4 x\n') }))
    expect({ path, name: e.constructor.name, code: e.code, statusCode: e.statusCode }).toEqual({
      path,
      name: 'SandboxInvalidPathError',
      code: 'INVALID_PATH',
      statusCode: 400,
    })
    expect(e).toBeInstanceOf(SandboxInvalidPathError)
    expect(e.message).toContain('the engine mounts a file or volume of its own there')
  }
  // As the message says, a command can still change it.
  expect(await ok(p, id, 'echo "1.2.3.4 tf-test" >> /etc/hosts && grep -c tf-test /etc/hosts')).toBe('1\n')
})

describe("Code Mode's start() failures", () => {
  const dispatcher = { dispatch: async () => ({ ok: true, result: null }), close: () => undefined }
  async function startFailure(p: InstanceType<typeof DockerSandboxProvider>, sandboxId: string) {
    const transport = p.createCodeModeTransport()
    try {
      return await rejection(
        transport.start({ codeModeDispatcher: dispatcher as any, sandboxId, requestTimeoutSeconds: 30 }),
      )
    } finally {
      await transport.stop()
    }
  }

  // The Python relay's failures (agent: false); through the agent no python3 is needed.
  test('an image without python3 is CODE_MODE_UNAVAILABLE', async () => {
    const p = provider({ agent: false })
    const e = await startFailure(p, await sandboxes.create(p))
    expect(e).toBeInstanceOf(SandboxError)
    expect({ code: e.code, statusCode: e.statusCode }).toEqual({ code: 'CODE_MODE_UNAVAILABLE', statusCode: 500 })
    expect(e.message).toContain('python3 is not on PATH')
  })

  test('a python3 that fails as under a full disk is CODE_MODE_START_FAILED with its words', async () => {
    // The engine's disk is shared: instead of filling it, a python3 that fails the way the relay
    // does when it cannot create its socket directory on a full disk.
    const p = provider({ agent: false })
    const id = await sandboxes.create(p)
    const stub = [
      '#!/bin/sh',
      'echo "Traceback (most recent call last):" >&2',
      `echo "OSError: [Errno 28] No space left on device: '/trueforge/codemode/run'" >&2`,
      'exit 1',
    ].join('\n')
    await p.uploadFile({ sandboxId: id, remotePath: '/bin/python3', content: Buffer.from(stub) })
    await ok(p, id, 'chmod 755 /bin/python3')
    const e = await startFailure(p, id)
    expect({ code: e.code, statusCode: e.statusCode }).toEqual({ code: 'CODE_MODE_START_FAILED', statusCode: 500 })
    expect(e.message).toContain('status 1')
    expect(e.message).toContain('No space left on device')
    expect(e.message).toContain('free disk space')
  })

  test.each([
    ['the Python relay', { agent: false }, /FileExistsError|NotADirectoryError/],
    ['the agent', {}, /could not open the Code Mode socket .*Not a directory/i],
  ])('%s failing (its socket directory taken by a file) is CODE_MODE_START_FAILED', async (_l, extra, words) => {
    const p = provider({ image: DEBIAN, ...extra })
    const id = await sandboxes.create(p)
    await ok(p, id, 'mkdir -p /trueforge/codemode && rm -rf /trueforge/codemode/run && : > /trueforge/codemode/run')
    const e = await startFailure(p, id)
    expect({ code: e.code, statusCode: e.statusCode }).toEqual({ code: 'CODE_MODE_START_FAILED', statusCode: 500 })
    expect(e.message).toMatch(words)
  })

  test('through the agent, an image without python3 starts Code Mode', async () => {
    const p = provider()
    const id = await sandboxes.create(p)
    const transport = p.createCodeModeTransport()
    try {
      const { env } = await transport.start({
        codeModeDispatcher: dispatcher as any,
        sandboxId: id,
        requestTimeoutSeconds: 30,
      })
      expect(env.TFY_CM_SOCK).toMatch(/^\//)
    } finally {
      await transport.stop()
    }
  })
})

test('60 downloads of a file rewritten in place are never INTERNAL: its content or a typed error', async () => {
  const p = provider()
  const id = await sandboxes.create(p)
  // Four writers rewrite the file as fast as they can, until `stop` exists.
  const writer = '(while [ ! -e stop ]; do echo $RANDOM > f; done) >/dev/null 2>&1 </dev/null &'
  await ok(p, id, Array(4).fill(writer).join(' '))
  const seen: Record<string, number> = {}
  for (let i = 0; i < 60; i++) {
    let key: string
    try {
      const body = (await p.downloadFile({ sandboxId: id, path: `${id}/f` })).toString()
      // Writers that truncate and write concurrently can leave any overlay of their lines
      // ("8613\n\n" is one), so the file only ever holds digits and newlines.
      key = /^[\d\n]*$/.test(body) ? 'content' : `torn: ${JSON.stringify(body)}`
    } catch (e: any) {
      key =
        e.code === 'FILE_CHANGED' && e.statusCode === 409 && /changed while being read/.test(e.message)
          ? 'FILE_CHANGED'
          : `${e.name} ${e.code}: ${e.message}`
    }
    seen[key] = (seen[key] ?? 0) + 1
  }
  const unexpected = Object.keys(seen).filter((k) => k !== 'content' && k !== 'FILE_CHANGED')
  expect({ unexpected, seen }).toEqual({ unexpected: [], seen })
  // How many came back whole depends on the machine's load (every write during a read is a
  // FILE_CHANGED); once the writers stop, the download is the file as the sandbox reads it.
  await ok(p, id, 'touch stop; sleep 0.5')
  const settled = await ok(p, id, 'cat f')
  expect(settled).toMatch(/^[\d\n]+$/)
  expect((await p.downloadFile({ sandboxId: id, path: `${id}/f` })).toString()).toBe(settled)
}, 120_000)

test('FILE_CHANGED from the binding is SandboxFileChangedError (409), built on the host base class when given', () => {
  const { fromNative, onHostBase } = require('../lib/errors.js') as {
    fromNative: (e: unknown, injected?: object) => any
    onHostBase: (base: new (message?: string) => Error) => object
  }
  const message =
    'File changed while being read: /f (it was rewritten during each of 4 tries); download it again once nothing writes to it'
  const native = Object.assign(new Error(message), { code: 'FILE_CHANGED', path: '/f' })
  const e = fromNative(native)
  expect(e).toBeInstanceOf(SandboxFileChangedError)
  expect(e).toBeInstanceOf(SandboxError)
  expect({ name: e.name, statusCode: e.statusCode, code: e.code, path: e.path, message: e.message }).toEqual({
    name: 'SandboxFileChangedError',
    statusCode: 409,
    code: 'FILE_CHANGED',
    path: '/f',
    message,
  })
  class HostBase extends Error {}
  const hosted = fromNative(native, onHostBase(HostBase))
  expect(hosted).toBeInstanceOf(HostBase)
  expect(hosted).toBeInstanceOf(SandboxFileChangedError)
  expect(hosted.statusCode).toBe(409)
})
