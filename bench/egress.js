#!/usr/bin/env node
'use strict'

// Egress under a policy: what the proxy costs. In one sandbox (the TrueForge-ready image, for
// curl and Python) under a policy allowing one name that `hosts` maps to the host's loopback:
//   - a 100 MiB download through the proxy (curl, plain HTTP, timed by curl itself) against the
//     agent's own `downloadFile` of a 100 MiB file (the same stream, the other way);
//   - connection set-up: a CONNECT through the proxy answered `200` (timed inside the sandbox, in
//     Python) against a direct loopback connect to the same origin from the host.
// Nothing leaves the host's loopback.
//
//   node bench/egress.js [rounds]        rounds of each measurement, default 5 (set-ups: 40 each)
//
// Prints one JSON object.

const net = require('node:net')

const { DockerSandboxProvider } = require('..')
const origins = require('../__test__/fixtures/origins.js')

const MiB = 1024 * 1024
const IMAGE = process.env.BENCH_EGRESS_IMAGE || 'trueforge-sandbox:2'
const NAMESPACE = `bench-egress-${process.pid}`
const NAME = 'origin.bench.test'

const p50 = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.floor((s.length - 1) / 2)]
}
const round2 = (x) => Math.round(x * 100) / 100

async function ok(provider, sandboxId, command, timeoutSeconds = 300) {
  const r = await provider.exec({ sandboxId, command, timeoutSeconds })
  if (!r.success || r.response.exitCode !== 0) throw new Error(`${command}: ${JSON.stringify(r).slice(0, 400)}`)
  return r.response.result
}

/** Milliseconds to a connected socket, from the host, `n` times. */
async function directConnects(port, n) {
  const out = []
  for (let i = 0; i < n; i++) {
    const t = performance.now()
    await new Promise((resolve, reject) => {
      const s = net.connect(port, '127.0.0.1', () => {
        out.push(performance.now() - t)
        s.destroy()
        resolve()
      })
      s.once('error', reject)
    })
  }
  return out
}

const SETUP = `
import socket, sys, time, json
port, n = int(sys.argv[1]), int(sys.argv[2])
out = []
for _ in range(n):
    t = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(b"CONNECT ${NAME}:%d HTTP/1.1\\r\\nHost: ${NAME}:%d\\r\\n\\r\\n" % (port, port))
    line = s.recv(4096)
    out.append((time.perf_counter() - t) * 1000)
    assert line.startswith(b"HTTP/1.1 200"), line
    s.close()
print(json.dumps(out))
`

async function main() {
  const rounds = Number(process.argv[2] || 5)
  const origin = await origins.startOrigin({ name: 'bench' })
  const provider = new DockerSandboxProvider({
    image: IMAGE,
    namespace: NAMESPACE,
    egress: { allow: [NAME], hosts: { [NAME]: '127.0.0.1' } },
    fileMaxBytes: 200 * MiB,
  })
  let sandboxId
  try {
    ;({ sandboxId } = await provider.createSandbox())
    await ok(provider, sandboxId, 'head -c 104857600 /dev/urandom > /tmp/bench.bin')
    const url = `http://${NAME}:${origin.port}/bytes?n=${100 * MiB}`
    const proxied = []
    const downloaded = []
    for (let r = 0; r < rounds; r++) {
      const [secs, size] = (
        await ok(provider, sandboxId, `curl -sS -o /dev/null -w '%{time_total} %{size_download}' '${url}'`)
      )
        .trim()
        .split(' ')
        .map(Number)
      if (size !== 100 * MiB) throw new Error(`the proxied download got ${size} bytes`)
      proxied.push(size / secs / 1e6)
      const t = performance.now()
      const buf = await provider.downloadFile({ sandboxId, path: '/tmp/bench.bin' })
      downloaded.push(buf.length / ((performance.now() - t) / 1000) / 1e6)
    }
    const setups = []
    for (let r = 0; r < rounds; r++) {
      const out = await ok(provider, sandboxId, `python3 -c '${SETUP}' ${origin.port} 40`)
      setups.push(...JSON.parse(out).slice(5))
    }
    const direct = (await directConnects(origin.port, rounds * 40)).slice(5)
    const proxiedMBps = p50(proxied)
    const downloadMBps = p50(downloaded)
    return {
      image: IMAGE,
      rounds,
      download_100mib_mbps: {
        proxy: round2(proxiedMBps),
        download_file: round2(downloadMBps),
        ratio: round2(proxiedMBps / downloadMBps),
      },
      setup_ms: {
        proxy_p50: round2(p50(setups)),
        direct_p50: round2(p50(direct)),
        overhead_p50: round2(p50(setups) - p50(direct)),
      },
      stats: await provider.egressStats(sandboxId),
    }
  } finally {
    if (sandboxId) await provider.removeSandbox(sandboxId).catch(() => {})
    await provider.dispose()
    await origin.close()
  }
}

main().then(
  (r) => process.stdout.write(`${JSON.stringify(r)}\n`),
  (e) => {
    process.stderr.write(`${(e && e.stack) || e}\n`)
    process.exit(1)
  },
)
