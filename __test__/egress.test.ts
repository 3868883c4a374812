// Egress under a policy: a sandbox has no network interface but loopback, and reaches only the
// hosts its policy allows, through the proxy its agent carries to the host. "The outside world"
// is servers on the host's loopback (fixtures/origins.js) under names the policy maps to
// 127.0.0.1 (`hosts`); nothing here sends a byte to any other address.

import { spawn } from 'node:child_process'
import { rmSync } from 'node:fs'
import { join } from 'node:path'
import { createInterface } from 'node:readline'

import { DockerSandboxProvider } from '..'
import {
  BUSYBOX,
  SandboxTracker,
  TRUEFORGE,
  cleanupNamespace,
  containerNameFor,
  inspectContainer,
  ok,
  rejection,
  run,
  sleep,
  uniqueNamespace,
  waitFor,
  type Provider,
} from './helpers'

// eslint-disable-next-line @typescript-eslint/no-require-imports
const origins = require('./fixtures/origins.js')

jest.setTimeout(180_000)

const MiB = 1024 * 1024
const namespace = uniqueNamespace('egress')
const tracker = new SandboxTracker(namespace)
const PROXY = '127.0.0.1:3128'
const CA_PATH = '/tmp/egress-test-ca.pem'
// What the tools in the sandbox need to trust the test CA, at `path` in the sandbox.
const trust = (path: string) => ({
  SSL_CERT_FILE: path,
  REQUESTS_CA_BUNDLE: path,
  GIT_SSL_CAINFO: path,
  PIP_CERT: path,
  CURL_CA_BUNDLE: path,
})
const TRUST = trust(CA_PATH)
// The interfaces a sandbox has, from /proc (gVisor's old release refuses GNU ls on /sys).
const INTERFACES = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"

let ca: { dir: string; ca: string; key: string; cert: string }
let git: { dir: string; files: Record<string, string> }
let pip: { dir: string; files: Record<string, string> }
let tlsOrigin: { port: number; requests: any[]; close: () => Promise<void> }
let plainOrigin: { port: number; requests: any[]; close: () => Promise<void> }
const providers: Provider[] = []
const logs: { level: string; message: string; meta: any }[] = []

function provider(options: Record<string, unknown>): Provider {
  const logger = {
    warn: (message: string, meta: any) => logs.push({ level: 'warn', message, meta }),
    info: (message: string, meta: any) => logs.push({ level: 'info', message, meta }),
  }
  const p = new DockerSandboxProvider({ image: TRUEFORGE, namespace, logger, ...options } as any)
  providers.push(p)
  return p
}

const hosts = {
  'pkg.test': '127.0.0.1',
  'a.files.test': '127.0.0.1',
  'deny.files.test': '127.0.0.1',
}
const policy = {
  allow: ['pkg.test', '*.files.test', 'localhost'],
  deny: ['deny.files.test'],
  hosts,
}

let main: Provider
let sb: string

beforeAll(async () => {
  ca = origins.makeCa([...Object.keys(hosts), 'unlisted.test'])
  git = origins.makeGitRepo('hello from git\n')
  pip = origins.makePackageIndex()
  tlsOrigin = await origins.startOrigin({ name: 'tls', tls: ca, files: { ...git.files, ...pip.files } })
  plainOrigin = await origins.startOrigin({ name: 'plain' })
  main = provider({ egress: policy })
  sb = await tracker.create(main)
  await main.uploadFile({ sandboxId: sb, remotePath: CA_PATH, content: Buffer.from(ca.ca) })
})

afterAll(async () => {
  await tracker.cleanup(main)
  for (const p of providers) await p.dispose()
  // A warm-pool refill that was creating when its provider was disposed finishes that create
  // (a disposed provider never deletes sandboxes): its member is removed once it is there.
  await sleep(3000)
  cleanupNamespace(namespace)
  await tlsOrigin?.close()
  await plainOrigin?.close()
  for (const d of [ca?.dir, git?.dir, pip?.dir]) if (d) rmSync(d, { recursive: true, force: true })
})

const tls = () => `pkg.test:${tlsOrigin.port}`
const plain = () => `pkg.test:${plainOrigin.port}`

describe('a sandbox under a policy', () => {
  test('has no network but loopback, and its commands see the proxy in both cases', async () => {
    expect(await ok(main, sb, INTERFACES)).toBe('lo\n')
    const env = await ok(main, sb, 'env | grep -i _proxy= | sort')
    expect(env.split('\n').filter(Boolean)).toEqual([
      `ALL_PROXY=socks5h://${PROXY}`,
      `HTTPS_PROXY=http://${PROXY}`,
      `HTTP_PROXY=http://${PROXY}`,
      'NO_PROXY=localhost,127.0.0.1,::1',
      `all_proxy=socks5h://${PROXY}`,
      `http_proxy=http://${PROXY}`,
      `https_proxy=http://${PROXY}`,
      'no_proxy=localhost,127.0.0.1,::1',
    ])
  })

  test('HTTPS through CONNECT: curl, Python urllib and requests, git clone and pip install work unchanged', async () => {
    const opts = { env: TRUST, timeoutSeconds: 120 }
    expect(await ok(main, sb, `curl -sS https://${tls()}/hello`, opts)).toBe('hello from tls\n')
    const py = `import urllib.request, requests; print(urllib.request.urlopen("https://${tls()}/hello").read().decode(), end=""); print(requests.get("https://a.files.test:${tlsOrigin.port}/hello").text, end="")`
    expect(await ok(main, sb, `python3 -c '${py}'`, opts)).toBe('hello from tls\nhello from tls\n')
    expect(
      await ok(
        main,
        sb,
        `rm -rf /tmp/clone && git clone -q https://${tls()}/git/repo.git /tmp/clone && cat /tmp/clone/README`,
        opts,
      ),
    ).toBe('hello from git\n')
    const pipOut = await ok(
      main,
      sb,
      `pip install -q --no-cache-dir --break-system-packages --target /tmp/site --index-url https://${tls()}/simple/ tfprobe && PYTHONPATH=/tmp/site python3 -c 'import tfprobe; print(tfprobe.VALUE)'`,
      opts,
    )
    expect(pipOut.trim().split('\n').pop()).toBe('42')
  })

  test('plain HTTP: the origin gets the request in origin form, closed after it, without proxy headers', async () => {
    const before = plainOrigin.requests.length
    const out = await ok(main, sb, `curl -sS -H 'Proxy-Authorization: Basic eDp5' http://${plain()}/echo?q=1`)
    const seen = JSON.parse(out)
    expect(seen.url).toBe('/echo?q=1')
    expect(seen.headers.connection).toBe('close')
    expect(seen.headers['proxy-authorization']).toBeUndefined()
    expect(seen.headers['proxy-connection']).toBeUndefined()
    expect(plainOrigin.requests.length).toBe(before + 1)
  })

  test('SOCKS5, the name resolved by the host', async () => {
    const out = await ok(main, sb, `curl -sS --proxy socks5h://${PROXY} http://${plain()}/hello`)
    expect(out).toBe('hello from plain\n')
  })

  test('a name no rule allows is refused, saying which host and why; SOCKS says "not allowed by ruleset"', async () => {
    const stats = await main.egressStats(sb)
    const before = logs.length
    const http = await run(main, sb, `curl -sS -w '\\n%{http_code}' http://unlisted.test:${plainOrigin.port}/hello`)
    const lines = http.result.trim().split('\n')
    const [body, code] = [lines[0], lines[lines.length - 1]]
    expect(code).toBe('403')
    expect(body).toMatch(
      new RegExp(
        `^egress to unlisted\\.test:${plainOrigin.port} refused by the sandbox's egress policy: no allow rule matches`,
      ),
    )
    const connect = await run(main, sb, `curl -sS https://unlisted.test:${tlsOrigin.port}/hello`, { env: TRUST })
    expect(connect.exitCode).toBe(56)
    expect(connect.result).toMatch(/CONNECT tunnel failed, response 403/)
    const socks = await run(
      main,
      sb,
      `curl -sS --proxy socks5h://${PROXY} http://unlisted.test:${plainOrigin.port}/hello`,
    )
    expect(socks.exitCode).toBe(97)
    expect(socks.result).toMatch(/not allowed by ruleset|\(2\)/)
    expect((await main.egressStats(sb)).refused).toBe(stats.refused + 3)
    // The origin saw none of them.
    expect(plainOrigin.requests.filter((r) => r.headers.host?.startsWith('unlisted.test'))).toEqual([])
    await waitFor(() => logs.length > before, 10_000, 'a logger line for the refusal')
    const line = logs.slice(before).find((l) => /egress/i.test(l.message))
    expect(line?.level).toBe('warn')
    expect(JSON.stringify(line?.meta)).toContain('unlisted.test')
  })

  test('deny wins over allow', async () => {
    const r = await run(main, sb, `curl -sS http://deny.files.test:${plainOrigin.port}/hello`)
    expect(r.result).toMatch(
      /^egress to deny\.files\.test:\d+ refused by the sandbox's egress policy: denied by rule 'deny\.files\.test'/,
    )
  })

  test('a name that resolves to loopback is refused (DNS rebinding); a rule naming the address lets it through', async () => {
    // `localhost` is allowed by name, but resolves to 127.0.0.1: refused all the same.
    const r = await run(
      main,
      sb,
      `curl -sS --noproxy '' --proxy http://${PROXY} http://localhost:${plainOrigin.port}/hello`,
    )
    expect(r.result).toMatch(/^egress to localhost:\d+ refused by the sandbox's egress policy: .*loopback/)
    const p = provider({ egress: { allow: ['localhost', `127.0.0.1/32:${plainOrigin.port}`] } })
    const other = await tracker.create(p)
    const allowed = await ok(
      p,
      other,
      `curl -sS --noproxy '' --proxy http://${PROXY} http://localhost:${plainOrigin.port}/hello`,
    )
    expect(allowed).toBe('hello from plain\n')
  })

  test('IP literals pass only by an IP rule; the metadata address is refused without a byte sent', async () => {
    const literal = await run(
      main,
      sb,
      `curl -sS --noproxy '' --proxy http://${PROXY} http://127.0.0.1:${plainOrigin.port}/hello`,
    )
    expect(literal.result).toMatch(/^egress to 127\.0\.0\.1:\d+ refused/)
    const metadata = await run(main, sb, `curl -sS http://169.254.169.254/latest/meta-data/`)
    expect(metadata.result).toMatch(/^egress to 169\.254\.169\.254:80 refused/)
    const p = provider({ egress: { allow: [`127.0.0.1:${plainOrigin.port}`] } })
    const other = await tracker.create(p)
    expect(
      await ok(p, other, `curl -sS --noproxy '' --proxy http://${PROXY} http://127.0.0.1:${plainOrigin.port}/hello`),
    ).toBe('hello from plain\n')
    // Another port of the same address: no rule.
    const port = await run(
      p,
      other,
      `curl -sS --noproxy '' --proxy http://${PROXY} http://127.0.0.1:${tlsOrigin.port}/hello`,
    )
    expect(port.result).toMatch(/refused/)
  })

  test('without the proxy there is no route: curl --noproxy and a raw socket fail', async () => {
    const direct = await run(main, sb, `curl -sS --noproxy '*' --max-time 10 https://${tls()}/hello`, { env: TRUST })
    expect(direct.exitCode).toBe(6) // the name does not resolve: the sandbox has no DNS
    // TEST-NET-1: nothing leaves the sandbox, which has no route anywhere.
    const raw = await run(
      main,
      sb,
      `python3 -c 'import socket; socket.create_connection(("192.0.2.1", 80), timeout=5)' 2>&1`,
    )
    expect(raw.exitCode).not.toBe(0)
    expect(raw.result).toMatch(/Network is unreachable|No route to host/)
  })

  test('two sandboxes cannot reach each other', async () => {
    const other = await tracker.create(main)
    await ok(
      main,
      other,
      `sh -c 'nohup python3 -m http.server 8931 --bind 127.0.0.1 >/dev/null 2>&1 &' && sleep 1 && curl -sS http://127.0.0.1:8931/ >/dev/null`,
    )
    // Its own loopback, the proxy to the host's loopback, or its container name: none reach it.
    const direct = await run(main, sb, `curl -sS --max-time 5 http://127.0.0.1:8931/`)
    expect(direct.exitCode).toBe(7)
    const viaProxy = await run(
      main,
      sb,
      `curl -sS --noproxy '' --proxy http://${PROXY} --max-time 5 http://127.0.0.1:8931/`,
    )
    expect(viaProxy.result).toMatch(/refused/)
    const hostname = inspectContainer(containerNameFor(namespace, other))?.Config?.Hostname
    expect(hostname).toBeTruthy()
    const byName = await run(main, sb, `curl -fsS --max-time 5 http://${hostname}:8931/`)
    expect(byName.exitCode).not.toBe(0)
    expect(byName.result).not.toMatch(/Directory listing/)
  })

  test('counters per sandbox: allowed, refused, bytes each way', async () => {
    const before = await main.egressStats(sb)
    await ok(main, sb, `curl -sS -o /dev/null https://${tls()}/bytes?n=1000000`, { env: TRUST })
    await ok(main, sb, `head -c 300000 /dev/zero | curl -sS --data-binary @- https://${tls()}/sink`, { env: TRUST })
    const after = await main.egressStats(sb)
    expect(after.allowed).toBe(before.allowed + 2)
    expect(after.refused).toBe(before.refused)
    expect(after.bytesIn - before.bytesIn).toBeGreaterThan(1_000_000)
    expect(after.bytesOut - before.bytesOut).toBeGreaterThan(300_000)
    // A connection counts as open until its close has come through the agent's stream, which
    // can be a moment after curl, and so its exec, ended.
    await waitFor(async () => (await main.egressStats(sb)).open === 0, 5_000, 'the connections to close')
  })
})

describe('bounds', () => {
  test('500 concurrent connections: at most egressMaxConnections are open; the rest are refused', async () => {
    const script = `
import asyncio, json
async def one():
    try:
        r, w = await asyncio.open_connection("127.0.0.1", 3128)
        w.write(b"CONNECT ${tls()} HTTP/1.1\\r\\nHost: ${tls()}\\r\\n\\r\\n")
        await w.drain()
        line = await asyncio.wait_for(r.readline(), 30)
        return (line.decode().strip() or "closed"), w
    except Exception as e:
        return "error " + type(e).__name__, None
async def main():
    got = await asyncio.gather(*[one() for _ in range(500)])
    counts = {}
    for status, _ in got:
        key = status.split(" ")[1] if status.startswith("HTTP/") else status
        counts[key] = counts.get(key, 0) + 1
    open("/tmp/conns.json", "w").write(json.dumps(counts))
    await asyncio.sleep(6)
    for _, w in got:
        if w: w.close()
asyncio.run(main())
`
    const held = run(main, sb, `rm -f /tmp/conns.json; python3 -c '${script}'`, { timeoutSeconds: 120 })
    await waitFor(async () => (await run(main, sb, 'test -s /tmp/conns.json')).exitCode === 0, 60_000, 'the counts')
    const stats = await main.egressStats(sb)
    const counts = JSON.parse(await ok(main, sb, 'cat /tmp/conns.json'))
    await held
    console.log(`500 concurrent CONNECTs: ${JSON.stringify(counts)}; open at once: ${stats.open}`)
    expect(counts['200']).toBe(256)
    expect(stats.open).toBeLessThanOrEqual(256)
    // Every other one was told no (503 naming the limit) or reset: none waits forever.
    const others = Object.entries(counts).filter(([k]) => k !== '200')
    expect(others.reduce((n, [, v]) => n + Number(v), 0)).toBe(244)
    for (const [k] of others) expect(k).toMatch(/^(503|closed|error ConnectionResetError)$/)
    await waitFor(async () => (await main.egressStats(sb)).open === 0, 30_000, 'every connection closed')
    expect(await ok(main, sb, `curl -sS https://${tls()}/hello`, { env: TRUST })).toBe('hello from tls\n')
  })

  test('a sandbox that stops reading does not grow the host: the proxy holds at most its buffers', async () => {
    // 256 MiB offered by the origin to a client that reads 1 MiB, then nothing for 10 s.
    const command = `python3 -c 'import socket, time; s = socket.create_connection(("127.0.0.1", 3128)); s.sendall(b"GET http://${plain()}/bytes?n=${256 * MiB} HTTP/1.1\\r\\nHost: ${plain()}\\r\\n\\r\\n"); got = 0
while got < ${MiB}:
    got += len(s.recv(65536))
time.sleep(10); print(got)'`
    const child = spawn(
      process.execPath,
      [
        '--expose-gc',
        join(__dirname, 'fixtures', 'egress-host.js'),
        JSON.stringify({
          options: { image: TRUEFORGE, namespace, egress: policy },
          command,
          timeoutSeconds: 60,
          sampleMs: 20,
        }),
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    )
    const line = await createInterface({ input: child.stdout })[Symbol.asyncIterator]().next()
    const r = JSON.parse(line.value as string)
    expect(r.failed).toBeUndefined()
    expect(r.exec.success).toBe(true)
    const growth = (r.peak - r.baseline) / MiB
    console.log(
      `a client that stops reading a 256 MiB download: host RSS growth ${growth.toFixed(1)} MiB; bytes in ${r.stats.bytesIn}`,
    )
    expect(growth).toBeLessThan(32)
    // The origin was not drained into the host: what came in is bounded by the windows.
    expect(r.stats.bytesIn).toBeLessThan(32 * MiB)
  })
})

describe('lifecycle', () => {
  test('the policy survives an idle stop and a restart', async () => {
    const p = provider({ egress: policy, autoStopIntervalInMinutes: 0.05 })
    const id = await tracker.create(p)
    // In the sandbox root, which outlives the stop (a runtime may start /tmp afresh).
    await p.uploadFile({ sandboxId: id, remotePath: `${id}/ca.pem`, content: Buffer.from(ca.ca) })
    const name = containerNameFor(namespace, id)
    await waitFor(() => inspectContainer(name)?.State?.Running === false, 90_000, 'the idle stop')
    expect(await ok(p, id, `curl -sS https://${tls()}/hello`, { env: trust(`${id}/ca.pem`) })).toBe('hello from tls\n')
    const refused = await run(p, id, `curl -sS http://unlisted.test:${plainOrigin.port}/hello`)
    expect(refused.result).toMatch(/refused by the sandbox's egress policy/)
  })

  test("a warm pool's sandbox has the policy", async () => {
    const p = provider({ egress: policy, warmPool: { size: 1 } })
    await p.warmUp()
    await sleep(2000)
    const id = await tracker.create(p)
    await p.uploadFile({ sandboxId: id, remotePath: CA_PATH, content: Buffer.from(ca.ca) })
    expect(await ok(p, id, `curl -sS https://${tls()}/hello`, { env: TRUST })).toBe('hello from tls\n')
    expect((await run(p, id, `curl -sS http://unlisted.test:${plainOrigin.port}/`)).result).toMatch(/refused/)
  })

  test("'none': no network at all, no proxy", async () => {
    const p = provider({ egress: 'none', image: BUSYBOX })
    const id = await tracker.create(p)
    expect(await ok(p, id, INTERFACES)).toBe('lo\n')
    expect(await ok(p, id, 'env | grep -ci _proxy || true')).toBe('0\n')
  })
})

describe('options', () => {
  test.each([
    [{ egress: { allow: ['*'] }, agent: false }, /egress.*agent/i],
    [{ egress: { allow: ['*'] }, network: 'bridge' }, /egress.*network/i],
    [{ egress: 'none', network: 'bridge' }, /egress.*network/i],
    [{ egress: { allow: ['foo bar'] } }, /egress\.allow\[0\]/],
    [{ egress: { allow: [] } }, /egress\.allow/],
    [{ egress: { allow: ['*'], hosts: { 'a.test': 'not-an-ip' } } }, /egress\.hosts/],
    [{ egress: 'closed' }, /egress/],
    [{ egressMaxConnections: 0 }, /egressMaxConnections/],
  ])('%j is INVALID_OPTION', async (options, message) => {
    const e = await rejection(
      Promise.resolve().then(() => new DockerSandboxProvider({ image: TRUEFORGE, namespace, ...options } as any)),
    )
    expect(e.code).toBe('INVALID_OPTION')
    expect(e.message).toMatch(message)
  })
})
