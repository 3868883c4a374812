// What a sandbox can make the host hold through Code Mode is bounded (issue 20, item 2): request
// bytes in flight per sandbox and per provider. The relay, the engine and the sockets are real;
// the dispatcher is a stub. Host memory is measured in a child process
// (fixtures/codemode-host.js) so that jest's own heap does not count.
//
// Before the bounds: 12 concurrent ~60 MiB requests with an 8 s dispatcher grew the host process
// by 1.27 GiB here (1.6 GiB in the issue), nine of them in the dispatcher at once.

import { spawn } from 'node:child_process'
import { join } from 'node:path'
import { createInterface } from 'node:readline'

import { DockerSandboxProvider, type CodeModeReply as Reply, type CodeModeRequest as Request } from '..'
import { DEBIAN, SandboxTracker, ok, relayPid, sleep, uniqueNamespace, waitFor, type Provider } from './helpers'

jest.setTimeout(240_000)

const MiB = 1024 * 1024
const namespace = uniqueNamespace('cmbounds')
const tracker = new SandboxTracker(namespace)

// Requests from inside the sandbox, each on its own connection and thread: `after` seconds in,
// a call_tool of `tool` whose arguments carry a blob of `size` bytes (one blob shared by all, so
// the client itself stays small). Prints, per request, the reply and when it came, or the error
// (a relay that died closes the connection unanswered).
const CLIENT = `
import json, os, socket, sys, threading, time
spec = json.loads(sys.argv[1])
blob = b"x" * max([r["size"] for r in spec] + [0])
t0 = time.time()
out = [None] * len(spec)
def one(i, r):
    try:
        out[i] = ask(i, r)
    except Exception as e:
        out[i] = {"error": repr(e)}
def ask(i, r):
    time.sleep(r.get("after", 0))
    head = json.dumps({"op": "call_tool", "server": "demo", "tool": r["tool"], "arguments": {"n": i, "blob": ""}})
    pre, post = head.encode().split(b'"blob": ""')
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["TFY_CM_SOCK"])
    sent = time.time() - t0
    s.sendall(pre + b'"blob": "')
    s.sendall(memoryview(blob)[: r["size"]])
    s.sendall(b'"' + post)
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        b = s.recv(1 << 16)
        if not b:
            break
        data += b
    return {"reply": json.loads(data), "sent": sent, "answered": time.time() - t0}
threads = [threading.Thread(target=one, args=(i, r)) for i, r in enumerate(spec)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(out))
`

interface Answer {
  /** Set when the connection failed instead (the relay died). */
  error?: string
  reply: Reply & { result?: { structuredContent?: { n?: number } } }
  sent: number
  answered: number
}

interface ClientRequest {
  tool: string
  size: number
  after?: number
}

async function requests(
  provider: Provider,
  sandboxId: string,
  env: Record<string, string>,
  spec: ClientRequest[],
  timeoutSeconds = 200,
): Promise<Answer[]> {
  const out = await ok(provider, sandboxId, `python3 -c "$CLIENT" "$SPEC"`, {
    env: { ...env, CLIENT, SPEC: JSON.stringify(spec) },
    timeoutSeconds,
  })
  return JSON.parse(out) as Answer[]
}

/** A dispatcher shaped as TrueForge's: `hangs` never answers, anything else echoes `n`. */
class Dispatcher {
  seen: { tool: string; n: number; at: number }[] = []

  async dispatch(p: { request: Request }): Promise<Reply> {
    const r = p.request
    const tool = r.op === 'call_tool' ? r.tool : 'list_tools'
    const n = r.op === 'call_tool' ? Number((r.arguments as { n?: number } | undefined)?.n) : -1
    this.seen.push({ tool, n, at: Date.now() })
    if (tool === 'hangs') return new Promise<Reply>(() => {})
    return { ok: true, result: { structuredContent: { n } } }
  }
}

const providers: Provider[] = []
function provider(options: Record<string, unknown> = {}): Provider {
  const p = new DockerSandboxProvider({ image: DEBIAN, namespace, ...options } as any)
  providers.push(p)
  return p
}

let main: Provider
let sb: string

beforeAll(async () => {
  main = provider()
  sb = await tracker.create(main)
})

afterAll(async () => {
  await tracker.cleanup(main)
  for (const p of providers) await p.dispose()
})

test('12 concurrent ~60 MiB requests with an 8 s dispatcher: one at a time, all answered, host RSS growth ≤ 300 MiB', async () => {
  const child = spawn(
    process.execPath,
    [
      '--expose-gc',
      join(__dirname, 'fixtures', 'codemode-host.js'),
      JSON.stringify({
        options: { image: DEBIAN, namespace },
        sandboxId: sb,
        delayMs: 8000,
        sampleMs: 5,
        requestTimeoutSeconds: 600,
      }),
    ],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  )
  try {
    const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]()
    const started = JSON.parse((await lines.next()).value as string)
    expect(started.failed).toBeUndefined()
    const size = 60 * MiB
    const answers = await requests(
      main,
      sb,
      started.env,
      Array.from({ length: 12 }, () => ({ tool: 'big', size })),
    )
    child.stdin.write('done\n')
    const stats = JSON.parse((await lines.next()).value as string)
    const growthMiB = (stats.peak - stats.baseline) / MiB
    console.log(
      `12 x 60 MiB, 8 s dispatcher: rss baseline ${(stats.baseline / MiB).toFixed(0)} MiB, peak ${(stats.peak / MiB).toFixed(0)} MiB, ` +
        `growth ${growthMiB.toFixed(0)} MiB over ${stats.samples} samples; at most ${stats.maxInFlight} in the dispatcher; ` +
        `answered after ${answers
          .map((a) => a.answered.toFixed(0))
          .sort((a, b) => Number(a) - Number(b))
          .join(', ')} s`,
    )
    // Every request got through, whole, and was answered.
    expect(answers.map((a) => a.reply)).toEqual(
      answers.map((_, n) => ({ ok: true, result: { structuredContent: { n } } })),
    )
    expect(stats.dispatched).toBe(12)
    expect(stats.argumentBytes).toEqual(Array(12).fill(size))
    // The default bound (64 MiB per sandbox) holds one such request: the rest waited for room.
    expect(stats.maxInFlight).toBe(1)
    expect(Math.max(...answers.map((a) => a.answered))).toBeGreaterThan(12 * 8 - 2)
    expect(growthMiB).toBeLessThanOrEqual(300)
  } finally {
    child.kill('SIGKILL')
  }
})

describe('small bounds', () => {
  const transports: ReturnType<Provider['createCodeModeTransport']>[] = []
  afterEach(async () => {
    for (const t of transports.splice(0)) await t.stop()
  })

  async function started(
    p: Provider,
    dispatcher: Dispatcher,
    requestTimeoutSeconds = 300,
  ): Promise<Record<string, string>> {
    const t = p.createCodeModeTransport()
    transports.push(t)
    const { env } = await t.start({ codeModeDispatcher: dispatcher as any, sandboxId: sb, requestTimeoutSeconds })
    return env
  }

  test('a request larger than the sandbox bound gets a clear error, and the relay keeps serving', async () => {
    const d = new Dispatcher()
    const env = await started(provider({ codeModeSandboxInflightBytes: MiB }), d)
    const [big, small] = await requests(main, sb, env, [
      { tool: 'big', size: 2 * MiB },
      { tool: 'small', size: 10, after: 1 },
    ])
    expect(big.reply).toEqual({
      ok: false,
      error: expect.stringMatching(
        /^Code Mode request of \d+ bytes exceeds the host's in-flight limit of 1048576 bytes \(option `codeModeSandboxInflightBytes`\)/,
      ),
      source: 'caller',
    })
    expect(small.reply).toEqual({ ok: true, result: { structuredContent: { n: 1 } } })
    expect(d.seen.map((s) => s.tool)).toEqual(['small'])
  })

  test('the provider bound is refused by its own name', async () => {
    const env = await started(provider({ codeModeProviderInflightBytes: MiB }), new Dispatcher())
    const [big] = await requests(main, sb, env, [{ tool: 'big', size: 2 * MiB }])
    expect(big.reply.ok).toBe(false)
    expect((big.reply as { error: string }).error).toContain('`codeModeProviderInflightBytes`')
  })

  test('a request that times out gives its bytes back: the next one, which waited, goes through', async () => {
    const d = new Dispatcher()
    const env = await started(provider({ codeModeSandboxInflightBytes: MiB }), d, 3)
    const [hung, next] = await requests(main, sb, env, [
      { tool: 'hangs', size: 600 * 1024 },
      { tool: 'echo', size: 600 * 1024, after: 1 },
    ])
    expect(hung.reply).toEqual({
      ok: false,
      error: 'Code Mode request got no reply from the host within 3 s',
      source: 'transport',
    })
    expect(hung.answered).toBeGreaterThanOrEqual(2.9)
    expect(next.reply).toEqual({ ok: true, result: { structuredContent: { n: 1 } } })
    // It waited (unread) for the first one's bytes: dispatched only once that one timed out.
    const [first, second] = d.seen
    expect(second.at - first.at).toBeGreaterThanOrEqual(2500)
    expect(next.answered).toBeGreaterThanOrEqual(hung.answered - 0.5)
  })

  test('a turn that shortens the timeout has it applied at once, and the relay keeps serving', async () => {
    const d = new Dispatcher()
    const p = provider({})
    const t = p.createCodeModeTransport()
    transports.push(t)
    // The first turn allows five minutes: once its call is answered, nothing waits, and the
    // relay's timer sleeps for those five minutes.
    const first5 = await t.start({ codeModeDispatcher: d as any, sandboxId: sb, requestTimeoutSeconds: 300 })
    const [first] = await requests(main, sb, first5.env, [{ tool: 'echo', size: 10 }])
    expect(first.reply).toEqual({ ok: true, result: { structuredContent: { n: 0 } } })
    // The next turn on the same transport (the same relay) allows 2 s.
    const { env } = await t.start({ codeModeDispatcher: d as any, sandboxId: sb, requestTimeoutSeconds: 2 })
    const [hung, after] = await requests(main, sb, env, [
      { tool: 'hangs', size: 10 },
      { tool: 'echo', size: 10, after: 1 },
    ])
    expect(hung.reply).toEqual({
      ok: false,
      error: 'Code Mode request got no reply from the host within 2 s',
      source: 'transport',
    })
    expect(hung.answered).toBeGreaterThanOrEqual(1.9)
    expect(hung.answered).toBeLessThan(60)
    expect(after.reply).toEqual({ ok: true, result: { structuredContent: { n: 1 } } })
  })

  test('the sandbox bound is shared by its transports; a relay that dies gives its bytes back', async () => {
    const d = new Dispatcher()
    // The Python relay (agent: false), one process per transport, so that one can die alone.
    const p = provider({ codeModeSandboxInflightBytes: MiB, agent: false })
    const envA = await started(p, d)
    const envB = await started(p, d)
    // A request that holds 600 KiB of the sandbox's 1 MiB until its relay ends.
    const hung = requests(main, sb, envA, [{ tool: 'hangs', size: 600 * 1024 }], 60)
    await waitFor(() => d.seen.length === 1, 30_000, 'the hanging request')
    // Another transport (another sub-agent) on the same sandbox: its request waits for room.
    const t0 = Date.now()
    const next = requests(main, sb, envB, [{ tool: 'echo', size: 600 * 1024 }], 60)
    await sleep(2000)
    expect(d.seen).toHaveLength(1)
    await ok(main, sb, `kill -9 ${await relayPid(main, sb, envA.TFY_CM_SOCK)}`)
    const killed = Date.now()
    expect((await hung)[0].error).toMatch(/JSONDecodeError|Connection/)
    const [answer] = await next
    expect(answer.reply).toEqual({ ok: true, result: { structuredContent: { n: 0 } } })
    expect(d.seen.map((s) => s.tool)).toEqual(['hangs', 'echo'])
    expect(d.seen[1].at).toBeGreaterThanOrEqual(killed - 1000)
    expect(Date.now() - t0).toBeLessThan(30_000)
  })
})
