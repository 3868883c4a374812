'use strict'

// Code Mode round trip from inside a sandbox: `call_tool` through the in-sandbox agent (the
// default) and through the Python relay (`agent: false`), both on the engine's attached exec
// stream, against the floor, the same client and the same dispatcher over a Unix socket
// bind-mounted from the host (what a host-local transport does). Each side measures inside its
// container: the Python API (one process, sequential calls) and the CLI (a fresh `mcp-client`
// process per call, so its own start-up included: the agent's static client where the agent
// serves, `mcp-client-python` beside it). Prints p50/p99 as JSON.
// Also measured: the engine's own round trip on an attached exec stream (a small write to `cat`
// in a container and back), the hop the relay's design adds to the floor and cannot avoid.
// Usage: node bench/codemode.js [apiCalls=300] [cliCalls=60] [rounds=5]

const { execFile, execFileSync } = require('node:child_process')
const { promisify } = require('node:util')
const { mkdtempSync, rmSync, chmodSync } = require('node:fs')
const { createServer } = require('node:net')
const { tmpdir } = require('node:os')
const { join } = require('node:path')

const { DockerSandboxProvider } = require('..')
const { ECHO_DISPATCHER: dispatcher, ECHO_SERVERS: SERVERS, engineEcho } = require('./impl/common')

const IMAGE = process.env.BENCH_IMAGE || 'trueforge-sandbox-debian:12'
const API_CALLS = Number(process.argv[2] || 300)
const CLI_CALLS = Number(process.argv[3] || 60)
const ROUNDS = Number(process.argv[4] || 5)
const ENGINE_SOCKET = process.env.DOCKER_HOST?.startsWith('unix://') ? process.env.DOCKER_HOST.slice(7) : undefined

const MEASURE = `
import asyncio, json, subprocess, sys, time
from mcp_client import call_tool
api_n, cli_n = int(sys.argv[1]), int(sys.argv[2])
def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(len(xs) * p))], 3)
async def api():
    out = []
    for i in range(10):
        await call_tool("demo", "echo", {"i": i})
    for i in range(api_n):
        t = time.perf_counter()
        await call_tool("demo", "echo", {"i": i})
        out.append((time.perf_counter() - t) * 1000)
    return out
a = asyncio.run(api())
def cli(name):
    out = []
    for i in range(cli_n):
        t = time.perf_counter()
        subprocess.run([name, "call-tool", "demo", "echo", '{"i": 1}'], check=True, stdout=subprocess.DEVNULL)
        out.append((time.perf_counter() - t) * 1000)
    return out
import shutil
c = cli("mcp-client")
py = cli("mcp-client-python") if shutil.which("mcp-client-python") else []
s = []
for i in range(cli_n):
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import mcp_client"], check=True)
    s.append((time.perf_counter() - t) * 1000)
print(json.dumps({"api_p50": pct(a, .5), "api_p99": pct(a, .99), "cli_p50": pct(c, .5), "cli_p99": pct(c, .99),
                  "pycli_p50": pct(py, .5), "startup_p50": pct(s, .5)}))
`

function docker(args) {
  return execFileSync('docker', args, { encoding: 'utf8', maxBuffer: 16 << 20 }).trim()
}

// The floor's server runs in this process: its measurement must not block the event loop.
async function dockerAsync(args) {
  const { stdout } = await promisify(execFile)('docker', args, { encoding: 'utf8', maxBuffer: 16 << 20 })
  return stdout.trim()
}

/**
 * A sandbox of `provider` with the client installed as TrueForge's Sandbox installs it, and a
 * started transport; returns how to run the measurement there and how to stop it.
 */
async function side(provider) {
  const { sandboxId } = await provider.createSandbox()
  const transport = provider.createCodeModeTransport()
  const install = transport.getClientInstall({ sandboxId })
  const ex = async (command, env) => {
    const r = await provider.exec({ sandboxId, command, env, timeoutSeconds: 600 })
    if (!r.success || r.response.exitCode !== 0) throw new Error(`${command}: ${JSON.stringify(r)}`)
    return r.response.result
  }
  await ex('mkdir -p /trueforge/codemode/bin')
  await provider.uploadFile({ sandboxId, remotePath: install.remotePath, content: Buffer.from(install.content) })
  const link = install.pathBinSymlink
    ? `ln -sf ${install.remotePath} ${install.pathBinSymlink}`
    : 'ln -sf ../mcp_client.py /trueforge/codemode/bin/mcp-client'
  await ex(`chmod 0555 ${install.remotePath} && ${link}`)
  const { env } = await transport.start({ codeModeDispatcher: dispatcher, sandboxId, requestTimeoutSeconds: 60 })
  const sideEnv = {
    ...env,
    PYTHONPATH: '/trueforge/codemode',
    TFY_MCP_SERVERS: SERVERS,
    TFY_ENABLE_AGENT_APPROVALS: 'true',
    M: MEASURE,
  }
  return {
    install,
    measure: async () => JSON.parse(await ex(`python3 -c "$M" ${API_CALLS} ${CLI_CALLS}`, sideEnv)),
    stop: async () => {
      await transport.stop()
      await provider.removeSandbox(sandboxId).catch(() => {})
      await provider.dispose()
    },
  }
}

async function main() {
  const namespace = `cm-bench-${process.pid}`
  const agent = await side(new DockerSandboxProvider({ image: IMAGE, namespace }))
  // The agent with its connection carrying the calls (no lane), as on a remote engine.
  const connSide = await side(new DockerSandboxProvider({ image: IMAGE, namespace, codeModeLane: false }))
  const relaySide = await side(new DockerSandboxProvider({ image: IMAGE, namespace, agent: false }))
  const dir = mkdtempSync(join(tmpdir(), 'cm-floor-'))
  chmodSync(dir, 0o755)
  const floorName = `cm-bench-floor-${process.pid}`
  let server
  try {
    // Floor side: the same client and dispatcher over a bind-mounted socket.
    server = createServer({ allowHalfOpen: true }, (sock) => {
      const chunks = []
      sock.on('data', (c) => chunks.push(c))
      sock.on('end', async () => {
        const reply = await dispatcher.dispatch({
          request: JSON.parse(Buffer.concat(chunks).toString('utf8')),
          traceCarrier: {},
        })
        sock.end(JSON.stringify(reply))
      })
      sock.on('error', () => {})
    })
    await new Promise((r) => server.listen(join(dir, 's.sock'), r))
    chmodSync(join(dir, 's.sock'), 0o666)
    docker(['run', '-d', '--name', floorName, '-v', `${dir}:/floor`, IMAGE, 'sleep', 'infinity'])
    const floorEnv = [
      '-e',
      'TFY_CM_SOCK=/floor/s.sock',
      '-e',
      'PYTHONPATH=/cm',
      '-e',
      `TFY_MCP_SERVERS=${SERVERS}`,
      '-e',
      'PATH=/cm/bin:/usr/local/bin:/usr/bin:/bin',
    ]
    docker(['exec', floorName, 'mkdir', '-p', '/cm/bin'])
    execFileSync(
      'docker',
      [
        'exec',
        '-i',
        floorName,
        'sh',
        '-c',
        'cat > /cm/mcp_client.py && chmod 0555 /cm/mcp_client.py && ln -sf ../mcp_client.py /cm/bin/mcp-client',
      ],
      { input: agent.install.content },
    )
    // Rounds alternate between the sides, and each figure is the best round's, so that other
    // work on the machine weighs on all alike.
    const rounds = []
    for (let round = 0; round < ROUNDS; round++) {
      const a = await agent.measure()
      const conn = await connSide.measure()
      const relay = await relaySide.measure()
      const floor = JSON.parse(
        await dockerAsync([
          'exec',
          ...floorEnv,
          floorName,
          'python3',
          '-c',
          MEASURE,
          String(API_CALLS),
          String(CLI_CALLS),
        ]),
      )
      const echo = await engineEcho(floorName, API_CALLS, ENGINE_SOCKET)
      rounds.push({ agent: a, conn, relay, floor, echo })
    }
    const best = (which) => {
      const keys = Object.keys(rounds[0][which])
      return Object.fromEntries(
        keys.map((k) => {
          const best = Math.min(...rounds.map((r) => (Number.isFinite(r[which][k]) ? r[which][k] : Infinity)))
          return [k, Number.isFinite(best) ? best : null]
        }),
      )
    }
    const [a, conn, relay, floor, echo] = ['agent', 'conn', 'relay', 'floor', 'echo'].map(best)
    // Where the design itself puts the floor: the bind-mounted socket's round trip plus one round
    // trip on the engine's exec stream, which a transport over that stream adds by construction.
    const designFloor = +(floor.api_p50 + echo.p50).toFixed(3)
    const out = {
      image: IMAGE,
      apiCalls: API_CALLS,
      cliCalls: CLI_CALLS,
      rounds: ROUNDS,
      agent: a,
      agent_connection: conn,
      relay,
      floor,
      engine_exec_echo: echo,
      design_floor_api_p50_ms: designFloor,
      // Each round's API p50s, in the order run: how much the machine moved between rounds.
      api_p50_by_round: rounds.map((r) => ({
        agent: r.agent.api_p50,
        agent_connection: r.conn.api_p50,
        relay: r.relay.api_p50,
        floor: r.floor.api_p50,
        echo: r.echo.p50,
      })),
      ratio: {
        agent_api_p50_vs_design_floor: +(a.api_p50 / designFloor).toFixed(2),
        agent_connection_api_p50_vs_design_floor: +(conn.api_p50 / designFloor).toFixed(2),
        relay_api_p50_vs_design_floor: +(relay.api_p50 / designFloor).toFixed(2),
      },
      // The targets: the Python API within 1.2 × that floor; the static CLI within 10 ms.
      target_api_p50_ms: +(1.2 * designFloor).toFixed(3),
      target_cli_p50_ms: 10,
    }
    console.log(JSON.stringify(out, null, 2))
  } finally {
    await agent.stop()
    await connSide.stop()
    await relaySide.stop()
    try {
      docker(['rm', '-f', floorName])
    } catch {}
    server?.close()
    rmSync(dir, { recursive: true, force: true })
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
