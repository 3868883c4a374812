// Code Mode: MCP tools called from inside a sandbox, served by the in-sandbox agent (its socket,
// and its static `mcp-client`) and, without it (`agent: false`), by the Python relay on the
// engine's attached exec stream: every test runs against both. A stub dispatcher (shaped as
// TrueForge's: dispatch() and close()) stands in for the MCP servers; everything else is real:
// the engine, the agent or the relay, the clients, the sockets.

import { spawn } from 'node:child_process'
import { createHash } from 'node:crypto'
import { createConnection, createServer, type Server } from 'node:net'
import { dirname } from 'node:path'
import * as http from 'node:http'

import { DockerSandboxProvider, type CodeModeReply as Reply, type CodeModeRequest as Request } from '..'
import {
  BUSYBOX,
  DEBIAN,
  cleanupNamespace,
  containerNameFor,
  docker,
  ok,
  rejection,
  run,
  sleep,
  waitFor,
  uniqueNamespace,
  type Provider,
  engineSocket,
} from './helpers'

jest.setTimeout(90_000)

const RELAY_CMDLINE = 'python3 -I -S /trueforge/codemode/relay.py'

const TOOLS = [
  { name: 'echo', annotations: { readOnlyHint: true } },
  { name: 'text' },
  { name: 'fails' },
  { name: 'slow', annotations: { readOnlyHint: true } },
  { name: 'throws' },
  { name: 'hangs' },
  { name: 'rm', annotations: { destructiveHint: true } },
  { name: 'write', annotations: { readOnlyHint: false } },
]

/** A dispatcher shaped as TrueForge's CodeModeDispatcher, recording what reached it. */
class StubDispatcher {
  closed = false
  requests: Request[] = []
  carriers: Record<string, string>[] = []
  inFlight = 0
  maxInFlight = 0

  close(): void {
    this.closed = true
  }

  async dispatch(p: { request: Request; traceCarrier: Readonly<Record<string, string>> }): Promise<Reply> {
    if (this.closed) return { ok: false, error: 'Code Mode dispatcher is closed', source: 'transport' }
    this.requests.push(p.request)
    this.carriers.push({ ...p.traceCarrier })
    const r = p.request
    if (r.server !== 'demo')
      return { ok: false, error: `MCP server '${r.server}' is not available for this agent`, source: 'caller' }
    if (r.op === 'list_tools') return { ok: true, result: { tools: TOOLS } }
    const args = r.arguments ?? {}
    switch (r.tool) {
      case 'echo':
        return { ok: true, result: { content: [], structuredContent: { echoed: args } } }
      case 'text':
        return { ok: true, result: { content: [{ type: 'text', text: '{"parsed":true}' }] } }
      case 'fails':
        return { ok: true, result: { isError: true, content: [{ type: 'text', text: 'boom' }] } }
      case 'throws':
        throw new Error('the dispatcher broke')
      case 'hangs':
        return new Promise<Reply>(() => {})
      case 'slow': {
        this.inFlight++
        this.maxInFlight = Math.max(this.maxInFlight, this.inFlight)
        await sleep(400)
        this.inFlight--
        return { ok: true, result: { structuredContent: { n: args.n } } }
      }
      default:
        return { ok: true, result: { structuredContent: { called: r.tool } } }
    }
  }

  calls(tool?: string): Request[] {
    return this.requests.filter((r) => r.op === 'call_tool' && (tool === undefined || r.tool === tool))
  }
}

const SERVERS_ALL = Buffer.from(JSON.stringify({ demo: { allowed_tools: [] } })).toString('base64')

/**
 * What TrueForge's Sandbox does with getClientInstall() when it initialises a sandbox: with a
 * `pathBinSymlink` (the agent's static `mcp-client` is in the bin directory) it links the Python
 * CLI there, else it makes the bin directory and links `mcp-client` to the Python client.
 */
async function installClient(provider: Provider, sandboxId: string): Promise<string> {
  const install = provider.createCodeModeTransport().getClientInstall({ sandboxId })
  expect(install.remotePath).toMatch(/\/mcp_client\.py$/)
  const dir = dirname(install.remotePath)
  await ok(provider, sandboxId, `mkdir -p ${dir}${install.pathBinSymlink === undefined ? ` ${dir}/bin` : ''}`)
  await provider.uploadFile({
    sandboxId,
    remotePath: install.remotePath,
    content: Buffer.from(install.content, 'utf8'),
  })
  const link =
    install.pathBinSymlink === undefined
      ? `ln -sf ../mcp_client.py ${dir}/bin/mcp-client`
      : `ln -sf ${install.remotePath} ${install.pathBinSymlink}`
  await ok(provider, sandboxId, `chmod 0555 ${install.remotePath} && ${link}`)
  return dir
}

/** The env TrueForge's Sandbox sets per exec, around the transport's own. */
function execEnv(env: Record<string, string>, servers = SERVERS_ALL): Record<string, string> {
  return { ...env, PYTHONPATH: '/trueforge/codemode', TFY_MCP_SERVERS: servers, TFY_ENABLE_AGENT_APPROVALS: 'true' }
}

// A bare socket client: sends bytes, half-closes, reads the reply to EOF.
const RAW_CLIENT = `
import base64, os, socket, sys
def send(data):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["TFY_CM_SOCK"])
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    out = b""
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        out += b
    return out
mode = sys.argv[1]
if mode == "b64":
    data = base64.b64decode(os.environ["REQ"])
elif mode == "huge":
    data = b'{"op":"list_tools","server":"' + b"x" * (64 * 1024 * 1024) + b'"}'
sys.stdout.write(send(data).decode())
`

async function sendRaw(
  provider: Provider,
  sandboxId: string,
  env: Record<string, string>,
  data: Buffer | 'huge',
): Promise<any> {
  const mode = data === 'huge' ? 'huge' : 'b64'
  const extra: Record<string, string> = { RAW: RAW_CLIENT }
  if (data !== 'huge') extra.REQ = data.toString('base64')
  const out = await ok(provider, sandboxId, `python3 -c "$RAW" ${mode}`, {
    env: { ...env, ...extra },
    timeoutSeconds: 60,
  })
  return JSON.parse(out)
}

function sendRequest(
  provider: Provider,
  sandboxId: string,
  env: Record<string, string>,
  request: Request,
): Promise<Reply> {
  return sendRaw(provider, sandboxId, env, Buffer.from(JSON.stringify(request)))
}

/** Pids of Python relay processes in a sandbox (read from /proc, so the probe never counts itself). */
async function pythonRelayPids(provider: Provider, sandboxId: string): Promise<number[]> {
  const out = await ok(
    provider,
    sandboxId,
    `for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' 2>/dev/null < $d/cmdline); case "$c" in "${RELAY_CMDLINE}"*) echo \${d#/proc/};; esac; done`,
  )
  return out
    .split('\n')
    .filter(Boolean)
    .map((s) => Number(s))
}

/** Engine API GET over the unix socket (the CLI has no `exec inspect`). */
function engineGet(path: string): Promise<any> {
  return new Promise((resolve, reject) => {
    const req = http.get({ socketPath: engineSocket(), path }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => (body += c))
      res.on('end', () =>
        res.statusCode === 200 ? resolve(JSON.parse(body)) : reject(new Error(`${path}: ${res.statusCode} ${body}`)),
      )
    })
    req.on('error', reject)
  })
}

/** Exec sessions of a container still running the relay launcher. */
async function runningRelayExecs(container: string): Promise<number> {
  const info = await engineGet(`/containers/${container}/json`)
  let n = 0
  for (const id of info.ExecIDs ?? []) {
    try {
      const e = await engineGet(`/exec/${id}/json`)
      const args: string[] = e.ProcessConfig?.arguments ?? []
      if (e.Running && (args.includes('trueforge-codemode') || args.includes('codemode-lane'))) n++
    } catch {
      // An exec that ended between the two requests.
    }
  }
  return n
}

/** The sockets served in a sandbox (the agent serves them all; the relays, one each). */
async function sockets(provider: Provider, sandboxId: string): Promise<string[]> {
  // find, not ls: gVisor (runsc 20221219) answers GNU coreutils' statx with EINVAL.
  const out = await ok(
    provider,
    sandboxId,
    `find /trueforge/codemode/run -maxdepth 1 -name '*.sock' -printf '%f\\n' 2>/dev/null || true`,
  )
  return out.split('\n').filter(Boolean).sort()
}

/** The agent's lanes in a sandbox (`trueforge-agent codemode-lane <socket>`), by pid. */
async function lanePids(p: Provider, id: string): Promise<number[]> {
  const out = await ok(
    p,
    id,
    `for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' 2>/dev/null < $d/cmdline); case "$c" in *" codemode"-lane" "*) echo \${d#/proc/};; esac; done`,
  )
  return out.split('\n').filter(Boolean).map(Number)
}

// 'agent': the agent serves each socket on a lane of its own, which this process reads (a local
// engine); 'agent connection': the agent's own connection carries the calls (remote engines).
describe.each([['agent'], ['agent connection'], ['python']] as const)('Code Mode through the %s', (mode) => {
  const agent = mode !== 'python'
  const codeModeLane = mode === 'agent'
  const namespace = uniqueNamespace(`codemode-${mode === 'agent' ? 'ag' : mode === 'python' ? 'py' : 'ac'}`)
  /** What serves Code Mode in a sandbox: the relay processes, or the agent's sockets. */
  const relayPids = (p: Provider, id: string): Promise<(number | string)[]> =>
    mode === 'python' ? pythonRelayPids(p, id) : sockets(p, id)
  /** The pid of the process serving a sandbox's sockets (the relay, or the agent). */
  const servingPid = async (p: Provider, id: string): Promise<number> => {
    if (mode === 'python') return (await pythonRelayPids(p, id))[0]
    if (mode === 'agent') {
      const pids = await lanePids(p, id)
      if (pids.length !== 1) throw new Error(`expected one lane, found ${JSON.stringify(pids)}`)
      return pids[0]
    }
    const st = await p.agentStatus(id)
    if (st.mode !== 'agent') throw new Error(`no agent: ${st.reason}`)
    return st.pid
  }
  const pythonOnly = mode === 'python' ? test : test.skip
  const agentOnly = agent ? test : test.skip
  /** Where each socket has a process of its own (the Python relay, or a lane). */
  const ownProcess = mode === 'agent connection' ? test.skip : test

  const providers: Provider[] = []
  function provider(options: Record<string, unknown> = {}): Provider {
    const p = new DockerSandboxProvider({ image: DEBIAN, namespace, agent, codeModeLane, ...options } as any)
    providers.push(p)
    return p
  }

  let main: Provider
  let sb: string

  beforeAll(async () => {
    main = provider()
    ;({ sandboxId: sb } = await main.createSandbox())
    await installClient(main, sb)
  })

  afterAll(async () => {
    for (const p of providers) await p.dispose()
    cleanupNamespace(namespace)
    // The warm-pool test's refill may still be creating: a disposed provider lets that create
    // finish (it never deletes sandboxes), so its member is removed once it is there.
    await sleep(3000)
    cleanupNamespace(namespace)
  }, 30_000)

  describe('CodeModeTransport contract (TrueForge behaviours)', () => {
    let transport: ReturnType<Provider['createCodeModeTransport']>
    let dispatcher: StubDispatcher
    const start = () =>
      transport.start({ codeModeDispatcher: dispatcher as any, sandboxId: sb, requestTimeoutSeconds: 30 })

    beforeEach(() => {
      transport = main.createCodeModeTransport()
      dispatcher = new StubDispatcher()
    })
    afterEach(async () => {
      await transport.stop()
    })

    test('the provider says it supports Code Mode', () => {
      expect(main.supportsCodeMode).toBe(true)
    })

    test('start succeeds and is idempotent: one relay, the same env', async () => {
      const first = await start()
      expect(first.env.TFY_CM_SOCK).toMatch(/^\/trueforge\/codemode\/run\/[0-9a-f]{32}\.sock$/)
      expect(first.env.TFY_CM_REQUEST_TIMEOUT_SECONDS).toBe('30')
      const pids = await relayPids(main, sb)
      expect(pids).toHaveLength(1)
      const second = await start()
      expect(second.env).toEqual(first.env)
      expect(await relayPids(main, sb)).toEqual(pids)
    })

    test('round-trips a list_tools request', async () => {
      const { env } = await start()
      const reply = await sendRequest(main, sb, env, { op: 'list_tools', server: 'demo' })
      expect(reply).toEqual({ ok: true, result: { tools: TOOLS } })
      expect(dispatcher.requests).toEqual([{ op: 'list_tools', server: 'demo' }])
    })

    test('a closed dispatcher answers source transport, exactly', async () => {
      const { env } = await start()
      dispatcher.close()
      const reply = await sendRequest(main, sb, env, { op: 'list_tools', server: 'demo' })
      expect(reply).toEqual({ ok: false, error: 'Code Mode dispatcher is closed', source: 'transport' })
    })

    test('stop before start and after start is safe; start after stop round-trips', async () => {
      await transport.stop()
      await start()
      await transport.stop()
      expect(await relayPids(main, sb)).toEqual([])
      const { env } = await start()
      const reply = await sendRequest(main, sb, env, { op: 'list_tools', server: 'demo' })
      expect(reply.ok).toBe(true)
    })

    test('malformed JSON and wrong shapes get "Malformed Code Mode request" from caller; nothing reaches the dispatcher', async () => {
      const { env } = await start()
      const malformed = { ok: false, error: 'Malformed Code Mode request', source: 'caller' }
      for (const bytes of [
        Buffer.from([0xff, 0x00, 0x13, 0x37]),
        Buffer.from('{"op":'),
        Buffer.from(''),
        Buffer.from('[1,2]'),
        Buffer.from('{"op":"call_tool","server":"demo"}'),
        Buffer.from('{"op":"call_tool","server":"demo","tool":"echo","arguments":[1]}'),
        Buffer.from('{"op":"list_tools","server":""}'),
        Buffer.from('{"op":"delete_everything","server":"demo"}'),
      ]) {
        expect(await sendRaw(main, sb, env, bytes)).toEqual(malformed)
      }
      expect(dispatcher.requests).toEqual([])
      // The relay survived all of it.
      expect((await sendRequest(main, sb, env, { op: 'list_tools', server: 'demo' })).ok).toBe(true)
    })
  })

  describe('end to end inside a sandbox', () => {
    let transport: ReturnType<Provider['createCodeModeTransport']>
    let dispatcher: StubDispatcher
    let env: Record<string, string>

    beforeAll(async () => {
      transport = main.createCodeModeTransport()
      dispatcher = new StubDispatcher()
      ;({ env } = await transport.start({
        codeModeDispatcher: dispatcher as any,
        sandboxId: sb,
        requestTimeoutSeconds: 30,
      }))
    })
    afterAll(async () => {
      await transport.stop()
    })

    test('the CLI from any directory, on PATH, returns the dispatcher result', async () => {
      const out = await ok(main, sb, `cd / && command -v mcp-client && mcp-client call-tool demo echo '{"x":1}'`, {
        env: execEnv(env),
      })
      const [where, json] = out.trim().split('\n')
      expect(where).toBe('/trueforge/codemode/bin/mcp-client')
      expect(JSON.parse(json)).toEqual({ echoed: { x: 1 } })
      expect(dispatcher.calls('echo').at(-1)).toEqual({
        op: 'call_tool',
        server: 'demo',
        tool: 'echo',
        arguments: { x: 1 },
      })
    })

    test('the Python API returns the projected result; a tool error is an exception', async () => {
      const py = [
        'import asyncio, json',
        'from mcp_client import call_tool',
        'async def main():',
        '    a = await call_tool("demo", "echo", body={"y": [1, 2]})',
        '    b = await call_tool("demo", "text", body={})',
        '    try:',
        '        await call_tool("demo", "fails", body={})',
        '        c = "no error"',
        '    except RuntimeError as e:',
        '        c = str(e)',
        '    print(json.dumps([a, b, c]))',
        'asyncio.run(main())',
      ].join('\n')
      const out = await ok(main, sb, `cd /tmp && python3 -c "$PY"`, { env: { ...execEnv(env), PY: py } })
      expect(JSON.parse(out)).toEqual([
        { echoed: { y: [1, 2] } },
        { parsed: true },
        'MCP tool error (server=demo, tool=fails): boom',
      ])
    })

    test('the trace context of the exec reaches the dispatcher', async () => {
      const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'
      await ok(main, sb, `mcp-client call-tool demo echo '{}'`, {
        env: { ...execEnv(env), TFY_TRACEPARENT: traceparent },
      })
      expect(dispatcher.carriers.at(-1)).toEqual({ traceparent })
    })

    test('tools not allowed and destructive tools are refused before they reach the dispatcher', async () => {
      const onlyEcho = Buffer.from(JSON.stringify({ demo: { allowed_tools: ['echo', 'rm', 'write'] } })).toString(
        'base64',
      )
      const before = dispatcher.calls().length
      const cases: [string, string, RegExp][] = [
        ['demo', 'text', /Access denied: tool 'text' is not enabled on server 'demo'/],
        ['other', 'echo', /Access denied: MCP server 'other' is not available/],
        ['demo', 'rm', /'rm' on MCP server 'demo' is destructive/],
        ['demo', 'write', /'write' on MCP server 'demo' is destructive/],
      ]
      for (const [server, tool, message] of cases) {
        const r = await run(main, sb, `mcp-client call-tool ${server} ${tool} '{}'`, { env: execEnv(env, onlyEcho) })
        expect(r.exitCode).not.toBe(0)
        expect(r.result).toMatch(message)
      }
      expect(dispatcher.calls().length).toBe(before)
      // With approvals off (never the case under TrueForge) a destructive tool goes through.
      const off = await ok(main, sb, `mcp-client call-tool demo rm '{}'`, {
        env: { ...execEnv(env, onlyEcho), TFY_ENABLE_AGENT_APPROVALS: 'false' },
      })
      expect(JSON.parse(off)).toEqual({ called: 'rm' })
    })

    test('a bad argument and a CLI without the transport env fail with clear messages', async () => {
      const bad = await run(main, sb, `mcp-client call-tool demo echo 'not json'`, { env: execEnv(env) })
      expect(bad.exitCode).not.toBe(0)
      expect(bad.result).toMatch(/not JSON/)
      const bare = await run(main, sb, `mcp-client call-tool demo echo '{}'`, { env: { TFY_MCP_SERVERS: SERVERS_ALL } })
      expect(bare.exitCode).not.toBe(0)
      expect(bare.result).toMatch(/TFY_CM_SOCK is not set/)
    })

    test('a dispatcher that throws is an internal error; one that never answers times out at the client', async () => {
      const thrown = await run(main, sb, `mcp-client call-tool demo throws '{}'`, { env: execEnv(env) })
      expect(thrown.exitCode).not.toBe(0)
      expect(thrown.result).toMatch(/Internal MCP error: the dispatcher broke/)
      const t0 = Date.now()
      const hung = await run(main, sb, `mcp-client call-tool demo hangs '{}'`, {
        env: { ...execEnv(env), TFY_CM_REQUEST_TIMEOUT_SECONDS: '1' },
      })
      expect(hung.exitCode).not.toBe(0)
      expect(hung.result).toMatch(/timed out after 1 s/)
      expect(Date.now() - t0).toBeLessThan(5_000)
    })

    test('a client that never finishes its request does not hold up the others', async () => {
      const stall = [
        'import os, socket, time',
        's = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)',
        's.connect(os.environ["TFY_CM_SOCK"])',
        's.sendall(b\'{"op":"list_\')',
        'time.sleep(3)',
      ].join('\n')
      const out = await ok(
        main,
        sb,
        `python3 -c "$STALL" & sleep 0.3; t0=$(date +%s%N); mcp-client call-tool demo echo '{"past":1}'; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); wait`,
        { env: { ...execEnv(env), STALL: stall } },
      )
      const [json, ms] = out.trim().split('\n')
      expect(JSON.parse(json)).toEqual({ echoed: { past: 1 } })
      // The stalled connection stays open for 3 s; the call must not have waited for it.
      expect(Number(ms)).toBeLessThan(2_000)
    })

    test('20 concurrent calls all run at once and each gets its own reply', async () => {
      const py = [
        'import asyncio, json',
        'from mcp_client import call_tool',
        'async def main():',
        '    r = await asyncio.gather(*[call_tool("demo", "slow", body={"n": i}) for i in range(20)])',
        '    print(json.dumps(r))',
        'asyncio.run(main())',
      ].join('\n')
      dispatcher.maxInFlight = 0
      const t0 = Date.now()
      const out = await ok(main, sb, `python3 -c "$PY"`, { env: { ...execEnv(env), PY: py } })
      const ms = Date.now() - t0
      expect(JSON.parse(out)).toEqual(Array.from({ length: 20 }, (_, n) => ({ n })))
      expect(dispatcher.maxInFlight).toBe(20)
      expect(ms).toBeLessThan(20 * 400)
    })

    test('a 10 MiB argument and a 10 MiB reply', async () => {
      const py = [
        'import asyncio, hashlib, json',
        'from mcp_client import call_tool',
        'blob = "ab" * (5 * 1024 * 1024)',
        'r = asyncio.run(call_tool("demo", "echo", body={"blob": blob}))',
        'print(len(r["echoed"]["blob"]), hashlib.sha256(r["echoed"]["blob"].encode()).hexdigest())',
      ].join('\n')
      const out = await ok(main, sb, `python3 -c "$PY"`, { env: { ...execEnv(env), PY: py }, timeoutSeconds: 60 })
      const expected = createHash('sha256')
        .update('ab'.repeat(5 * 1024 * 1024))
        .digest('hex')
      expect(out.trim()).toBe(`${10 * 1024 * 1024} ${expected}`)
      const last = dispatcher.calls('echo').at(-1) as any
      expect(last.arguments.blob.length).toBe(10 * 1024 * 1024)
    })

    test('a request over 64 MiB is refused without killing the relay', async () => {
      const [pid] = await relayPids(main, sb)
      const before = dispatcher.requests.length
      const reply = await sendRaw(main, sb, env, 'huge')
      expect(reply).toEqual({
        ok: false,
        error: expect.stringMatching(/exceeds the limit of 67108864 bytes/),
        source: 'caller',
      })
      expect(dispatcher.requests.length).toBe(before)
      expect(await relayPids(main, sb)).toEqual([pid])
      expect(
        JSON.parse(await ok(main, sb, `mcp-client call-tool demo echo '{"after":1}'`, { env: execEnv(env) })),
      ).toEqual({
        echoed: { after: 1 },
      })
      // The client refuses one before sending it.
      const py =
        'import asyncio\nfrom mcp_client import call_tool\nasyncio.run(call_tool("demo", "echo", body={"b": "x" * (64 * 1024 * 1024)}))'
      const r = await run(main, sb, `python3 -c "$PY"`, { env: { ...execEnv(env), PY: py }, timeoutSeconds: 60 })
      expect(r.exitCode).not.toBe(0)
      expect(r.result).toMatch(/exceeds the limit/)
    })

    // gVisor reports a client's half-close that lands with its last bytes as readable only: a
    // reader that waits for another event after a short read never sees the request end (about
    // one request in ten of this size hung there until the agent read to "would block").
    test('requests that end as their last bytes arrive are all answered', async () => {
      for (let n = 0; n < 8; n++) {
        const reply = await sendRaw(main, sb, env, 'huge')
        expect([n, reply.error]).toEqual([n, expect.stringMatching(/exceeds the limit of 67108864 bytes/)])
      }
    })

    test('the socket and its directory are owner-only', async () => {
      const out = await ok(main, sb, `find /trueforge/codemode/run "$TFY_CM_SOCK" -maxdepth 0 -printf '%m %u\\n'`, {
        env,
      })
      const [dirMode, sockMode] = out.trim().split('\n')
      expect(dirMode).toBe('700 root')
      expect(sockMode).toBe('600 root')
    })
  })

  describe('recovery', () => {
    test('a relay killed by the agent is relaunched by the next start', async () => {
      const transport = main.createCodeModeTransport()
      const dispatcher = new StubDispatcher()
      const start = () =>
        transport.start({ codeModeDispatcher: dispatcher as any, sandboxId: sb, requestTimeoutSeconds: 30 })
      try {
        const { env } = await start()
        const pid = await servingPid(main, sb)
        // From outside: in the agent's case a command run by the agent would kill its own agent.
        docker(['exec', containerNameFor(namespace, sb), 'sh', '-c', `kill -9 ${pid}`])
        await sleep(300) // the engine closes the stream
        const dead = await run(main, sb, `mcp-client call-tool demo echo '{}'`, { env: execEnv(env) })
        expect(dead.exitCode).not.toBe(0)
        expect(dead.result).toMatch(/cannot reach the Code Mode relay/)
        const again = await start()
        expect(again.env).toEqual(env)
        expect(await relayPids(main, sb)).toHaveLength(1)
        expect(await servingPid(main, sb)).not.toBe(pid)
        expect(
          JSON.parse(await ok(main, sb, `mcp-client call-tool demo echo '{"back":1}'`, { env: execEnv(env) })),
        ).toEqual({
          echoed: { back: 1 },
        })
      } finally {
        await transport.stop()
      }
    })

    test('a sandbox stopped, or restarted, recovers at the next start', async () => {
      const p = provider()
      const { sandboxId } = await p.createSandbox()
      await installClient(p, sandboxId)
      const transport = p.createCodeModeTransport()
      const dispatcher = new StubDispatcher()
      const start = () =>
        transport.start({ codeModeDispatcher: dispatcher as any, sandboxId, requestTimeoutSeconds: 30 })
      const call = async (env: Record<string, string>) =>
        JSON.parse(await ok(p, sandboxId, `mcp-client call-tool demo echo '{"k":1}'`, { env: execEnv(env) }))
      const name = containerNameFor(namespace, sandboxId)
      try {
        let { env } = await start()
        expect(await call(env)).toEqual({ echoed: { k: 1 } })
        docker(['stop', '-t', '1', name])
        ;({ env } = await start()) // starts the container again, then the relay
        expect(await call(env)).toEqual({ echoed: { k: 1 } })
        docker(['restart', '-t', '1', name])
        await sleep(300)
        ;({ env } = await start())
        expect(await call(env)).toEqual({ echoed: { k: 1 } })
        expect(await relayPids(p, sandboxId)).toHaveLength(1)
      } finally {
        await transport.stop()
      }
    })

    test('a running relay is not activity: an idle sandbox still stops itself, and start brings it back', async () => {
      const p = provider({ autoStopIntervalInMinutes: 0.05 })
      const { sandboxId } = await p.createSandbox()
      await installClient(p, sandboxId)
      const transport = p.createCodeModeTransport()
      const start = () =>
        transport.start({ codeModeDispatcher: new StubDispatcher() as any, sandboxId, requestTimeoutSeconds: 30 })
      const name = containerNameFor(namespace, sandboxId)
      const running = () => docker(['inspect', '-f', '{{.State.Running}}', name]) === 'true'
      try {
        await start()
        expect(running()).toBe(true)
        await waitFor(async () => !running(), 15_000, 'the idle sandbox to stop with its relay running')
        const { env } = await start()
        expect(running()).toBe(true)
        expect(
          JSON.parse(await ok(p, sandboxId, `mcp-client call-tool demo echo '{"woke":1}'`, { env: execEnv(env) })),
        ).toEqual({
          echoed: { woke: 1 },
        })
      } finally {
        await transport.stop()
      }
    })

    test('start with a new sandbox id moves the relay there', async () => {
      const p = provider()
      const { sandboxId: other } = await p.createSandbox()
      await installClient(p, other)
      const transport = p.createCodeModeTransport()
      const dispatcher = new StubDispatcher()
      try {
        const first = await transport.start({
          codeModeDispatcher: dispatcher as any,
          sandboxId: sb,
          requestTimeoutSeconds: 30,
        })
        const before = await relayPids(p, sb)
        expect(before.length).toBeGreaterThanOrEqual(1)
        const second = await transport.start({
          codeModeDispatcher: dispatcher as any,
          sandboxId: other,
          requestTimeoutSeconds: 30,
        })
        expect(second.env).toEqual(first.env)
        expect((await relayPids(p, sb)).length).toBe(before.length - 1)
        expect(
          JSON.parse(await ok(p, other, `mcp-client call-tool demo echo '{"moved":1}'`, { env: execEnv(second.env) })),
        ).toEqual({
          echoed: { moved: 1 },
        })
      } finally {
        await transport.stop()
      }
      expect(await relayPids(p, other)).toEqual([])
    })

    test('stop() leaves no relay process and no exec session', async () => {
      const transport = main.createCodeModeTransport()
      const container = containerNameFor(namespace, sb)
      await transport.start({
        codeModeDispatcher: new StubDispatcher() as any,
        sandboxId: sb,
        requestTimeoutSeconds: 30,
      })
      expect(await relayPids(main, sb)).toHaveLength(1)
      // The agent's connection needs no exec of its own per transport; a lane is one.
      expect(await runningRelayExecs(container)).toBe(mode === 'agent connection' ? 0 : 1)
      await transport.stop()
      expect(await relayPids(main, sb)).toEqual([])
      expect(await runningRelayExecs(container)).toBe(0)
      expect(await ok(main, sb, "find /trueforge/codemode/run -mindepth 1 -maxdepth 1 -printf '%f\\n'")).toBe('')
    })

    ownProcess('stop() kills a relay that does not end when its stream closes (stopped with SIGSTOP)', async () => {
      const transport = main.createCodeModeTransport()
      const container = containerNameFor(namespace, sb)
      await transport.start({
        codeModeDispatcher: new StubDispatcher() as any,
        sandboxId: sb,
        requestTimeoutSeconds: 30,
      })
      const pid = await servingPid(main, sb)
      await ok(main, sb, `kill -STOP ${pid}`)
      try {
        await transport.stop()
        expect(await relayPids(main, sb)).toEqual([])
        expect(await runningRelayExecs(container)).toBe(0)
        expect(await ok(main, sb, "find /trueforge/codemode/run -mindepth 1 -maxdepth 1 -printf '%f\\n'")).toBe('')
      } finally {
        await run(main, sb, `kill -KILL ${pid} 2>/dev/null; true`)
      }
    })

    test('a transport nobody stopped is collected, and its relay ends with it', async () => {
      const script = `
      const { DockerSandboxProvider } = require(${JSON.stringify(require.resolve('..'))})
      const p = new DockerSandboxProvider({ image: ${JSON.stringify(DEBIAN)}, namespace: ${JSON.stringify(namespace)}, agent: ${agent}, codeModeLane: ${codeModeLane} })
      ;(async () => {
        await (async () => {
          const t = p.createCodeModeTransport()
          await t.start({ codeModeDispatcher: { dispatch: async () => ({ ok: true, result: null }) }, sandboxId: ${JSON.stringify(sb)}, requestTimeoutSeconds: 5 })
        })()
        console.log('started')
        await new Promise((r) => process.stdin.once('data', r))
        for (let i = 0; i < 10; i++) { global.gc(); await new Promise((r) => setTimeout(r, 100)) }
        setInterval(() => {}, 1000)
        console.log('collected')
      })().catch((e) => { console.error(e); process.exit(1) })
    `
      const child = spawn(process.execPath, ['--expose-gc', '-e', script], { stdio: ['pipe', 'pipe', 'inherit'] })
      const said = (word: string) =>
        new Promise<void>((resolve, reject) => {
          child.stdout.on('data', (d) => String(d).includes(word) && resolve())
          child.on('exit', (code) => reject(new Error(`the server process exited early (${code})`)))
        })
      try {
        await said('started')
        expect(await relayPids(main, sb)).toHaveLength(1)
        child.stdin.write('go\n')
        await said('collected')
        // The server process is still alive: only the collection ended the relay.
        await waitFor(
          async () => (await relayPids(main, sb)).length === 0,
          10_000,
          'the relay of a collected transport to end',
        )
        expect(child.exitCode).toBeNull()
      } finally {
        child.kill('SIGKILL')
      }
    })

    test('a server process that dies leaves nothing running in the sandbox once the stream closes', async () => {
      const script = `
      const { DockerSandboxProvider } = require(${JSON.stringify(require.resolve('..'))})
      const p = new DockerSandboxProvider({ image: ${JSON.stringify(DEBIAN)}, namespace: ${JSON.stringify(namespace)}, agent: ${agent}, codeModeLane: ${codeModeLane} })
      const t = p.createCodeModeTransport()
      t.start({ codeModeDispatcher: { dispatch: async () => ({ ok: true, result: null }) }, sandboxId: ${JSON.stringify(sb)}, requestTimeoutSeconds: 5 })
        .then(() => { console.log('started'); setInterval(() => {}, 1000) }, (e) => { console.error(e); process.exit(1) })
    `
      const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] })
      try {
        await new Promise<void>((resolve, reject) => {
          child.stdout.on('data', (d) => String(d).includes('started') && resolve())
          child.on('exit', (code) => reject(new Error(`the server process exited early (${code})`)))
        })
        expect(await relayPids(main, sb)).toHaveLength(1)
      } finally {
        child.kill('SIGKILL')
      }
      await waitFor(async () => (await relayPids(main, sb)).length === 0, 10_000, 'the orphaned relay to end')
      expect(await ok(main, sb, "find /trueforge/codemode/run -mindepth 1 -maxdepth 1 -printf '%f\\n'")).toBe('')
    })
  })

  describe('every kind of sandbox', () => {
    async function roundTrip(p: Provider, sandboxId: string): Promise<void> {
      await installClient(p, sandboxId)
      const transport = p.createCodeModeTransport()
      try {
        const { env } = await transport.start({
          codeModeDispatcher: new StubDispatcher() as any,
          sandboxId,
          requestTimeoutSeconds: 30,
        })
        const out = await ok(p, sandboxId, `mcp-client call-tool demo echo '{"kind":1}'`, { env: execEnv(env) })
        expect(JSON.parse(out)).toEqual({ echoed: { kind: 1 } })
      } finally {
        await transport.stop()
      }
      expect(await relayPids(p, sandboxId)).toEqual([])
    }

    test("network 'none' with a read-only root filesystem", async () => {
      const p = provider({ network: 'none', readOnlyRootfs: true })
      const { sandboxId } = await p.createSandbox()
      expect((await run(p, sandboxId, 'touch /etc/x')).exitCode).not.toBe(0)
      await roundTrip(p, sandboxId)
    })

    test("a non-root user (the image's own)", async () => {
      const p = provider({ image: 'trueforge-sandbox:2' })
      const { sandboxId } = await p.createSandbox()
      expect((await ok(p, sandboxId, 'id -u')).trim()).not.toBe('0')
      await roundTrip(p, sandboxId)
    })

    test('a warm-pool sandbox', async () => {
      const p = provider({ warmPool: { size: 1 } })
      await p.warmUp()
      await waitFor(
        async () =>
          docker([
            'ps',
            '-q',
            '--filter',
            `label=trueforge.sandbox.namespace=${namespace}`,
            '--filter',
            'label=trueforge.sandbox.pool',
          ]) !== '',
        30_000,
        'a pool member',
      )
      await sleep(500)
      const { sandboxId } = await p.createSandbox()
      await roundTrip(p, sandboxId)
    })

    test('a remote engine over TCP on loopback', async () => {
      // A TCP front for the local engine, so the provider talks to it exactly as to a remote one.
      const server: Server = createServer((client) => {
        const upstream = createConnection(engineSocket())
        client.pipe(upstream).pipe(client)
        client.on('error', () => upstream.destroy())
        upstream.on('error', () => client.destroy())
      })
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
      const port = (server.address() as any).port
      try {
        const p = provider({ dockerHost: `tcp://127.0.0.1:${port}` })
        const { sandboxId } = await p.createSandbox()
        await roundTrip(p, sandboxId)
      } finally {
        server.close()
      }
    })

    agentOnly('busybox (no bash, no Python): the static mcp-client through the agent', async () => {
      const p = provider({ image: BUSYBOX })
      const { sandboxId } = await p.createSandbox()
      expect((await run(p, sandboxId, 'command -v python3 bash')).result).toBe('')
      await roundTrip(p, sandboxId)
      // The CLI is the agent binary under another name, first on PATH.
      expect(await ok(p, sandboxId, 'readlink /trueforge/codemode/bin/mcp-client')).toMatch(
        /^\/\.trueforge-agent\/[0-9.]+-[0-9a-f]{12}\/trueforge-agent-(x86_64|aarch64)\n$/,
      )
    })

    pythonOnly('an image without python3 fails start with a clear typed error, quickly', async () => {
      const p = provider({ image: BUSYBOX })
      const { sandboxId } = await p.createSandbox()
      const transport = p.createCodeModeTransport()
      const t0 = Date.now()
      const err = await rejection(
        transport.start({ codeModeDispatcher: new StubDispatcher() as any, sandboxId, requestTimeoutSeconds: 30 }),
      )
      expect(Date.now() - t0).toBeLessThan(10_000)
      expect(err.code).toBe('CODE_MODE_UNAVAILABLE')
      expect(err.message).toMatch(/python3 is not on PATH/)
      await transport.stop()
    })
  })
})
