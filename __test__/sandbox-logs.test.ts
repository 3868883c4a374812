// Text a sandbox writes that reaches the host's logger is throttled per sandbox (issue 20,
// item 3): at most 100 logger calls and 1 MiB of its text per minute, then one line saying how
// much was dropped. The relay's stderr is the widest such path (the "exec failed" warning's
// error, which can carry a command's early output, goes through the same throttle). Before the
// throttle, 100 MiB written to the relay's stderr became 3,263 logger calls carrying all 100 MiB
// here (4,557 calls and 105 MB in the issue).

import { DockerSandboxProvider } from '..'
import { DEBIAN, SandboxTracker, ok, relayPid, run, sleep, uniqueNamespace, waitFor, type Provider } from './helpers'

jest.setTimeout(120_000)

const MiB = 1024 * 1024
const namespace = uniqueNamespace('sblogs')
const tracker = new SandboxTracker(namespace)
const providers: Provider[] = []

afterAll(async () => {
  if (providers[0]) await tracker.cleanup(providers[0])
  for (const p of providers) await p.dispose()
})

const dispatcher = {
  dispatch: async () => ({ ok: true as const, result: { tools: [] } }),
}

// One list_tools request over the Code Mode socket; prints the reply.
const ASK = `
import os, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["TFY_CM_SOCK"])
s.sendall(b'{"op": "list_tools", "server": "demo"}')
s.shutdown(socket.SHUT_WR)
data = b""
while True:
    b = s.recv(1 << 16)
    if not b:
        break
    data += b
print(data.decode())
`

test('100 MiB on the relay stderr: at most 100 logger calls and 1 MiB, then one line saying what was dropped', async () => {
  const calls: { level: string; message: string; meta: Record<string, any> }[] = []
  const record = (level: string) => (message: string, meta?: Record<string, any>) => {
    calls.push({ level, message, meta: meta ?? {} })
  }
  const logger = { debug: record('debug'), info: record('info'), warn: record('warn'), error: record('error') }
  // The Python relay's transport (agent: false): the agent's is the next test.
  const p = new DockerSandboxProvider({ image: DEBIAN, namespace, logger, agent: false })
  providers.push(p)
  const own = await tracker.create(p)
  const t = p.createCodeModeTransport()
  const { env } = await t.start({ codeModeDispatcher: dispatcher as any, sandboxId: own, requestTimeoutSeconds: 30 })
  const pid = await relayPid(p, own, env.TFY_CM_SOCK)
  const started = Date.now()
  await ok(p, own, `head -c ${100 * MiB} /dev/zero | tr '\\0' x > /proc/${pid}/fd/2`, { timeoutSeconds: 120 })
  const wrote = Date.now() - started
  // The relay still serves.
  const reply = await ok(p, own, `python3 -c "$ASK"`, { env: { ...env, ASK } })
  expect(JSON.parse(reply)).toEqual({ ok: true, result: { tools: [] } })
  // Its end says what was dropped (the minute's end would too).
  await t.stop()
  await waitFor(
    () => calls.some((c) => c.message.startsWith('sandbox log output over the limit')),
    10_000,
    'the dropped line',
  )
  await sleep(200)
  const stderr = calls.filter((c) => c.message === 'Code Mode relay stderr')
  const textBytes = stderr.reduce((n, c) => n + Buffer.byteLength(String(c.meta.text)), 0)
  const dropped = calls.filter((c) => c.message.startsWith('sandbox log output over the limit'))
  console.log(
    `100 MiB on the relay's stderr in ${wrote} ms: ${stderr.length} logger calls carrying ${(textBytes / 1024).toFixed(0)} KiB; ` +
      `dropped line: ${JSON.stringify(dropped.map((c) => c.meta))}`,
  )
  expect(stderr.length).toBeGreaterThan(0)
  expect(stderr.length).toBeLessThanOrEqual(100)
  // 1 MiB of the sandbox's text, plus the few words each cut event adds saying how much was cut.
  expect(textBytes).toBeLessThanOrEqual(MiB + 100 * 64)
  expect(stderr.every((c) => c.level === 'warn' && c.meta.sandboxId === own)).toBe(true)
  expect(dropped).toHaveLength(1)
  expect(dropped[0].level).toBe('warn')
  expect(dropped[0].meta).toMatchObject({ sandboxId: own, droppedEvents: expect.any(Number) })
  // Everything the sandbox wrote was either logged or counted as dropped.
  const logged = stderr.reduce((n, c) => n + Number(/^x*/.exec(String(c.meta.text))![0].length), 0)
  const cut = stderr.reduce(
    (n, c) => n + Number(/\[(\d+) more bytes not logged\]$/.exec(String(c.meta.text))?.[1] ?? 0),
    0,
  )
  expect(logged + cut + dropped[0].meta.droppedBytes).toBe(100 * MiB)
  // Nothing else reached the logger in bulk.
  const others = calls.filter(
    (c) =>
      c.level === 'warn' &&
      c.message !== 'Code Mode relay stderr' &&
      !c.message.startsWith('sandbox log output over the limit'),
  )
  // (The provider's own one-time warnings, such as the network's, may be among them.)
  expect(others.length).toBeLessThanOrEqual(3)
  expect(others.filter((c) => JSON.stringify(c).includes('xxxx'))).toEqual([])
})

test("the sandbox agent's stderr cannot be written by the workload, even as root, and nothing reaches the logger from it", async () => {
  const calls: { level: string; message: string; meta: Record<string, any> }[] = []
  const record = (level: string) => (message: string, meta?: Record<string, any>) => {
    calls.push({ level, message, meta: meta ?? {} })
  }
  const logger = { debug: record('debug'), info: record('info'), warn: record('warn'), error: record('error') }
  const p = new DockerSandboxProvider({ image: DEBIAN, namespace, logger, user: '0:0' })
  providers.push(p)
  const own = await tracker.create(p)
  const status = await p.agentStatus(own)
  if (status.mode !== 'agent') throw new Error(`expected the agent, got ${JSON.stringify(status)}`)
  const t = p.createCodeModeTransport()
  const { env } = await t.start({ codeModeDispatcher: dispatcher as any, sandboxId: own, requestTimeoutSeconds: 30 })
  const before = calls.length
  // The agent is not dumpable: its /proc entries are closed to a root workload without
  // CAP_SYS_PTRACE, so the relay's stderr path has no counterpart here.
  const tried = await run(p, own, `head -c ${MiB} /dev/zero | tr '\\0' x > /proc/${status.pid}/fd/2`)
  expect(tried.exitCode).not.toBe(0)
  expect(tried.result).toContain('Permission denied')
  // The agent still serves commands and Code Mode.
  const reply = await ok(p, own, `python3 -c "$ASK"`, { env: { ...env, ASK } })
  expect(JSON.parse(reply)).toEqual({ ok: true, result: { tools: [] } })
  await t.stop()
  await sleep(200)
  expect(calls.slice(before).filter((c) => c.level === 'warn' || c.level === 'error')).toEqual([])
})
