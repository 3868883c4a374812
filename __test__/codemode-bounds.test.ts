// What a sandbox can make the host hold through Code Mode is bounded: per sandbox and per
// provider, each request holding its bytes or what its values take in V8's heap, whichever is
// more, until the dispatcher is done with it. The relay, the engine and the sockets are real;
// the dispatcher is a stub. Host memory is measured in a child process
// (fixtures/codemode-host.js) so that jest's own heap does not count.

import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { createInterface } from 'node:readline'

import { DockerSandboxProvider, type CodeModeReply as Reply, type CodeModeRequest as Request } from '..'
import { DEBIAN, SandboxTracker, ok, relayPid, sleep, uniqueNamespace, waitFor, type Provider } from './helpers'

jest.setTimeout(240_000)

const MiB = 1024 * 1024
const namespace = uniqueNamespace('cmbounds')
const tracker = new SandboxTracker(namespace)

// Requests from inside the sandbox (fixtures/codemode-client.py): each on its own connection
// and thread, a blob of text or that many empty objects; per request, the reply and when it came.
const CLIENT = readFileSync(join(__dirname, 'fixtures', 'codemode-client.py'), 'utf8')

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
  /** Send that many empty objects instead of a blob. */
  dense?: number
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

/**
 * A dispatcher shaped as TrueForge's: `hangs` never answers, `slow` answers after `slowMs` (and
 * notes when), anything else echoes `n`.
 */
class Dispatcher {
  seen: { tool: string; n: number; at: number; items?: number }[] = []
  /** When each `slow` call was done. */
  settled: number[] = []

  constructor(readonly slowMs = 5000) {}

  async dispatch(p: { request: Request }): Promise<Reply> {
    const r = p.request
    const tool = r.op === 'call_tool' ? r.tool : 'list_tools'
    const args = r.op === 'call_tool' ? (r.arguments as { n?: number; items?: unknown[] } | undefined) : undefined
    const n = r.op === 'call_tool' ? Number(args?.n) : -1
    this.seen.push({ tool, n, at: Date.now(), items: args?.items?.length })
    if (tool === 'hangs') return new Promise<Reply>(() => {})
    if (tool === 'slow') {
      await sleep(this.slowMs)
      this.settled.push(Date.now())
    }
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

interface HostStats {
  failed?: string
  baseline: number
  peak: number
  heapBaseline: number
  heapPeak: number
  maxStallMs: number
  gcMs: Record<string, number>
  samples: number
  dispatched: number
  maxInFlight: number
  argumentBytes: number[]
  argumentItems: number[]
}

/**
 * Starts the host side in a process of its own (one transport per sandbox), runs `spec[i]`'s
 * requests from sandbox `i`, all sandboxes at once, and returns their answers with what the host
 * process held meanwhile.
 */
async function onHost(
  sandboxIds: string[],
  job: { delayMs: number; requestTimeoutSeconds: number },
  spec: ClientRequest[][],
): Promise<{ answers: Answer[][]; stats: HostStats }> {
  const child = spawn(
    process.execPath,
    [
      '--expose-gc',
      join(__dirname, 'fixtures', 'codemode-host.js'),
      JSON.stringify({ options: { image: DEBIAN, namespace }, sandboxIds, sampleMs: 5, ...job }),
    ],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  )
  try {
    const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]()
    const started = JSON.parse((await lines.next()).value as string)
    expect(started.failed).toBeUndefined()
    const answers = await Promise.all(sandboxIds.map((id, i) => requests(main, id, started.envs[i], spec[i], 400)))
    child.stdin.write('done\n')
    const stats = JSON.parse((await lines.next()).value as string) as HostStats
    expect(stats.failed).toBeUndefined()
    return { answers, stats }
  } finally {
    child.kill('SIGKILL')
  }
}

function describeHost(what: string, stats: HostStats): string {
  const mib = (n: number) => (n / MiB).toFixed(0)
  return (
    `${what}: rss baseline ${mib(stats.baseline)} MiB, peak ${mib(stats.peak)} MiB (growth ${mib(stats.peak - stats.baseline)} MiB); ` +
    `heap baseline ${mib(stats.heapBaseline)} MiB, peak ${mib(stats.heapPeak)} MiB; longest event-loop stall ${stats.maxStallMs.toFixed(0)} ms (collections: ${JSON.stringify(stats.gcMs)}); ` +
    `${stats.dispatched} dispatched, at most ${stats.maxInFlight} at once`
  )
}

test('12 concurrent ~60 MiB requests with an 8 s dispatcher: one at a time, all answered, host RSS growth ≤ 300 MiB', async () => {
  const size = 60 * MiB
  const spec = Array.from({ length: 12 }, () => ({ tool: 'big', size }))
  const { answers: all, stats } = await onHost([sb], { delayMs: 8000, requestTimeoutSeconds: 600 }, [spec])
  const answers = all[0]
  const growthMiB = (stats.peak - stats.baseline) / MiB
  console.log(
    `${describeHost('12 x 60 MiB of text, 8 s dispatcher', stats)}; answered after ${answers
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
})

describe('requests dense in values, several sandboxes', () => {
  // 950,000 empty objects: 2.7 MiB of text that takes about 61 MiB of V8 heap, just under the
  // sandbox's 64 MiB; 20 Mi of them (60 MiB of text) would take 1.3 GiB.
  const FITS = 950_000
  const others: string[] = []

  beforeAll(async () => {
    for (let i = 0; i < 3; i++) others.push(await tracker.create(main))
  })

  test('four sandboxes: refused or held within twice the provider bound, and the host survives', async () => {
    const ids = [sb, ...others]
    const spec: ClientRequest[] = [
      { tool: 'dense', size: 0, dense: 20 * MiB },
      { tool: 'dense', size: 0, dense: FITS },
      { tool: 'dense', size: 0, dense: FITS, after: 1 },
    ]
    const { answers, stats } = await onHost(
      ids,
      { delayMs: 3000, requestTimeoutSeconds: 600 },
      ids.map(() => spec),
    )
    console.log(describeHost(`4 sandboxes, each 60 MiB and 2 x 2.7 MiB of empty objects, 3 s dispatcher`, stats))
    for (const a of answers) {
      expect(a[0].reply).toMatchObject({ ok: false, source: 'caller' })
      expect((a[0].reply as { error: string }).error).toContain('JavaScript values')
      expect(a.slice(1).map((x) => x.reply)).toEqual(
        [1, 2].map((n) => ({ ok: true, result: { structuredContent: { n } } })),
      )
    }
    expect(stats.dispatched).toBe(8)
    expect(stats.argumentItems).toEqual(Array(8).fill(FITS))
    // The provider's 256 MiB holds four of them at once, and the process at most twice that.
    expect(stats.maxInFlight).toBeLessThanOrEqual(4)
    expect(stats.peak - stats.baseline).toBeLessThanOrEqual(2 * 256 * MiB)
  })

  test('a tool that outlives its callers: repeated timeouts never let a sandbox hold more than its bound', async () => {
    // Each request times out for its caller after 1 s while the tool keeps it for 4 s; the
    // caller sends the next at once. Before, every timeout gave the room back and the parsed
    // requests piled up in the tool until the heap ran out.
    const spec = Array.from({ length: 6 }, (_, i) => ({ tool: 'dense', size: 0, dense: FITS, after: i * 1.2 }))
    const { answers, stats } = await onHost([sb], { delayMs: 4000, requestTimeoutSeconds: 1 }, [spec])
    console.log(describeHost('1 sandbox, 6 x 2.7 MiB of empty objects, 1 s timeout, 4 s tool', stats))
    // Each caller hears why: its request was dispatched and outlived its timeout, or found no
    // room for its values within it (the tool still held the one before).
    const errors = answers[0].map((a) => (a.reply as { error?: string }).error)
    for (const a of answers[0]) expect(a.reply).toMatchObject({ ok: false, source: 'transport' })
    const late = errors.filter((e) => e === 'Code Mode request got no reply from the host within 1 s')
    const unroomed = errors.filter(
      (e) =>
        e ===
        "Code Mode request found no room in the host's in-flight limit within 1 s (other requests hold it); try again",
    )
    expect(late.length + unroomed.length).toBe(6)
    expect(late.length).toBe(stats.dispatched)
    expect(stats.dispatched).toBeGreaterThanOrEqual(2)
    expect(stats.maxInFlight).toBe(1)
    expect(stats.peak - stats.baseline).toBeLessThanOrEqual(2 * 64 * MiB)
  })
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

  test('a request that times out holds its room until the dispatcher is done with it; the next one goes through then', async () => {
    const d = new Dispatcher(6000)
    const env = await started(provider({ codeModeSandboxInflightBytes: MiB }), d, 3)
    const [slow, next] = await requests(main, sb, env, [
      { tool: 'slow', size: 600 * 1024 },
      { tool: 'echo', size: 600 * 1024, after: 1 },
    ])
    expect(slow.reply).toEqual({
      ok: false,
      error: 'Code Mode request got no reply from the host within 3 s',
      source: 'transport',
    })
    expect(slow.answered).toBeGreaterThanOrEqual(2.9)
    expect(next.reply).toEqual({ ok: true, result: { structuredContent: { n: 1 } } })
    // The caller stopped waiting at 3 s, but the dispatcher still held the request's values:
    // the next one waited (unread) until the dispatcher was done with them.
    expect(d.seen.map((s) => s.tool)).toEqual(['slow', 'echo'])
    expect(d.seen[1].at).toBeGreaterThanOrEqual(d.settled[0])
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

  test('the sandbox bound is shared by its transports; a request outlives its relay until the dispatcher is done', async () => {
    const d = new Dispatcher(8000)
    // The Python relay (agent: false), one process per transport, so that one can die alone.
    const p = provider({ codeModeSandboxInflightBytes: MiB, agent: false })
    const envA = await started(p, d)
    const envB = await started(p, d)
    // A request that holds 600 KiB of the sandbox's 1 MiB while the dispatcher has it.
    const slow = requests(main, sb, envA, [{ tool: 'slow', size: 600 * 1024 }], 60)
    await waitFor(() => d.seen.length === 1, 30_000, 'the slow request')
    // Another transport (another sub-agent) on the same sandbox: its request waits for room.
    const next = requests(main, sb, envB, [{ tool: 'echo', size: 600 * 1024 }], 60)
    await sleep(2000)
    expect(d.seen).toHaveLength(1)
    // Its relay dies: the caller hears nothing more, but the dispatcher still has the request.
    await ok(main, sb, `kill -9 ${await relayPid(main, sb, envA.TFY_CM_SOCK)}`)
    expect((await slow)[0].error).toMatch(/JSONDecodeError|Connection/)
    const [answer] = await next
    expect(answer.reply).toEqual({ ok: true, result: { structuredContent: { n: 0 } } })
    expect(d.seen.map((s) => s.tool)).toEqual(['slow', 'echo'])
    expect(d.seen[1].at).toBeGreaterThanOrEqual(d.settled[0])
  })
})

// Each way a socket is served: the agent's own lane (the default on a local engine), the agent's
// connection (remote engines), the Python relay (no agent).
describe.each([
  ['lane', {}],
  ['agent connection', { codeModeLane: false }],
  ['Python relay', { agent: false }],
])('requests dense in values (%s)', (_way, way) => {
  const transports: ReturnType<Provider['createCodeModeTransport']>[] = []
  afterEach(async () => {
    for (const t of transports.splice(0)) await t.stop()
  })

  async function started(options: Record<string, unknown>, dispatcher: Dispatcher): Promise<Record<string, string>> {
    const t = provider({ ...way, ...options }).createCodeModeTransport()
    transports.push(t)
    const { env } = await t.start({ codeModeDispatcher: dispatcher as any, sandboxId: sb, requestTimeoutSeconds: 60 })
    return env
  }

  test('are refused by what they would become on the host, and nothing reaches the dispatcher', async () => {
    const d = new Dispatcher()
    const env = await started({}, d)
    // 60 MiB of `{},`: about 1.3 GiB of V8 heap; well within the 64 MiB of bytes allowed.
    const [dense, small] = await requests(main, sb, env, [
      { tool: 'dense', size: 0, dense: 20 * MiB },
      { tool: 'small', size: 10, after: 1 },
    ])
    expect(dense.reply).toEqual({
      ok: false,
      error: expect.stringMatching(
        /^Code Mode request of \d+ bytes would take about \d+ bytes of the host's memory as 20971527 JavaScript values, over the host's in-flight limit of 67108864 bytes \(option `codeModeSandboxInflightBytes`\)/,
      ),
      source: 'caller',
    })
    expect(small.reply).toEqual({ ok: true, result: { structuredContent: { n: 1 } } })
    expect(d.seen.map((s) => s.tool)).toEqual(['small'])
  })

  test('that fit wait for room for their values, then arrive whole', async () => {
    const d = new Dispatcher(5000)
    const env = await started({ codeModeSandboxInflightBytes: MiB }, d)
    // 600 KiB of text held by a slow tool; then 13,000 empty objects (40 KiB of text, about
    // 830 KiB of values): more than the room left, so it waits for the slow one.
    const [slow, dense] = await requests(main, sb, env, [
      { tool: 'slow', size: 600 * 1024 },
      { tool: 'dense', size: 0, dense: 13_000, after: 1 },
    ])
    expect(slow.reply).toEqual({ ok: true, result: { structuredContent: { n: 0 } } })
    expect(dense.reply).toEqual({ ok: true, result: { structuredContent: { n: 1 } } })
    expect(d.seen.map((s) => [s.tool, s.items])).toEqual([
      ['slow', undefined],
      ['dense', 13_000],
    ])
    expect(d.seen[1].at).toBeGreaterThanOrEqual(d.settled[0])
  })

  test('several at once that each need most of the room are served one after another', async () => {
    const d = new Dispatcher(300)
    const env = await started({ codeModeSandboxInflightBytes: 4 * MiB }, d)
    // Each text is read under room for its bytes, then needs a little more for its values: one
    // call holding its bytes while the next holds the rest would leave both waiting.
    const answers = await requests(
      main,
      sb,
      env,
      Array.from({ length: 3 }, () => ({ tool: 'slow', size: 3.5 * MiB })),
    )
    expect(answers.map((a) => a.reply.ok)).toEqual([true, true, true])
    expect(answers.map((a) => a.reply.result?.structuredContent?.n).sort()).toEqual([0, 1, 2])
    expect(d.seen.map((s) => s.tool)).toEqual(['slow', 'slow', 'slow'])
    // One at a time: each reached the dispatcher after the one before was done with its room.
    expect(d.seen[1].at).toBeGreaterThanOrEqual(d.settled[0])
    expect(d.seen[2].at).toBeGreaterThanOrEqual(d.settled[1])
  })
})

test('malformed, too deep or oversized keys: refused natively with what is wrong', async () => {
  const d = new Dispatcher()
  const t = provider({}).createCodeModeTransport()
  try {
    const { env } = await t.start({ codeModeDispatcher: d as any, sandboxId: sb, requestTimeoutSeconds: 60 })
    const script = `
import json, os, socket
def ask(body):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["TFY_CM_SOCK"])
    s.sendall(body)
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    return json.loads(data)
call = b'{"op":"call_tool","server":"s","tool":"t","arguments":%s}'
print(json.dumps([
    ask(b'{"op":"call_tool",'),
    ask(call % (b'[' * 300 + b']' * 300)),
    ask(call % (b'{"' + b'k' * 70000 + b'":1}')),
    ask(call % b'{"ok":true}'),
]))
`
    const replies = JSON.parse(await ok(main, sb, 'python3 -c "$S"', { env: { ...env, S: script } }))
    expect(replies).toEqual([
      { ok: false, error: 'Malformed Code Mode request', source: 'caller' },
      { ok: false, error: 'Code Mode request nests deeper than 256 levels; send flatter arguments', source: 'caller' },
      {
        ok: false,
        error: 'Code Mode request has an object key longer than 65536 bytes; put long text in values, not keys',
        source: 'caller',
      },
      { ok: true, result: { structuredContent: { n: null } } },
    ])
    expect(d.seen.map((s) => s.tool)).toEqual(['t'])
  } finally {
    await t.stop()
  }
})
