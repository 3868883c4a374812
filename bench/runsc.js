'use strict'

// gVisor (runsc) beside runc, on the same private engine (scripts/engines/gvisor-engine.sh, which
// registers runsc through its own config file), through the provider with the agent and with
// `agent: false`: exec `true` p50, create → first exec, and 1 KiB and 100 MiB upload and download
// (the 100 MiB upload is staged through the engine's archive endpoint where the agent can), and
// with the agent a Code Mode round trip (`mcp-client call-tool` in the sandbox).
// Prints one JSON object. Run:
//
//   bash scripts/engines/gvisor-engine.sh start && node bench/runsc.js
//
// BENCH_RUNS (default 20) and BENCH_ROUNDS (default 3) set the exec samples; DOCKER_HOST defaults
// to the gVisor engine.

process.env.DOCKER_HOST ??= 'unix:///var/run/docker-gvisor.sock'

const { randomBytes } = require('node:crypto')

const { DockerSandboxProvider } = require('..')
const floor = require('./impl/floor')
const { ECHO_DISPATCHER, ECHO_SERVERS, shellSpawnMs } = require('./impl/common')

const RUNS = Number(process.env.BENCH_RUNS || 20)
// Rounds of RUNS execs one after another, then RUNS floors each followed by one of ours.
const ROUNDS = Number(process.env.BENCH_ROUNDS || 3)
const IMAGE = process.env.BENCH_IMAGE || 'trueforge-sandbox-busybox:1'
const SIZES = { '1KiB': 1024, '100MiB': 100 << 20 }

const ms = (t0) => Number(process.hrtime.bigint() - t0) / 1e6
const p50 = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const round = (x) => Math.round(x * 10) / 10

async function measure(runtime, agent) {
  const p = new DockerSandboxProvider({
    image: IMAGE,
    namespace: `bench-runsc-${runtime}-${agent ? 'agent' : 'engine'}`,
    network: 'none',
    runtime,
    agent,
    uploadMaxBytes: 256 << 20,
    fileMaxBytes: 256 << 20,
  })
  const ids = []
  try {
    const creates = []
    for (let i = 0; i < 3; i++) {
      const t0 = process.hrtime.bigint()
      const { sandboxId } = await p.createSandbox()
      ids.push(sandboxId)
      const r = await p.exec({ sandboxId, command: 'true' })
      if (!r.success) throw new Error(`exec failed: ${r.error}`)
      creates.push(ms(t0))
    }
    const id = ids[0]
    // The creates' agents settle first (their spares start, the engine's exec of each ends).
    await new Promise((r) => setTimeout(r, 1000))
    const floorExec = await floorIn(id)
    const execs = []
    const alternating = []
    const floors = []
    for (let r = 0; r < ROUNDS; r++) {
      // One call after another, as a loop of commands makes them.
      for (let i = 0; i < RUNS; i++) {
        const t0 = process.hrtime.bigint()
        await p.exec({ sandboxId: id, command: 'true' })
        execs.push(ms(t0))
      }
      // The engine's floor in the same sandbox and the same minutes, each followed by one of
      // ours (which then comes after a quiet spell, as a model's turn leaves it).
      for (let i = 0; i < RUNS; i++) {
        floors.push(await floorExec())
        const t0 = process.hrtime.bigint()
        await p.exec({ sandboxId: id, command: 'true' })
        alternating.push(ms(t0))
      }
    }
    const files = {}
    for (const [name, size] of Object.entries(SIZES)) {
      const up = []
      const down = []
      for (let i = 0; i < (size > 1 << 20 ? 3 : RUNS); i++) {
        const content = randomBytes(size)
        let t0 = process.hrtime.bigint()
        await p.uploadFile({ sandboxId: id, remotePath: `bench-${name}.bin`, content })
        up.push(ms(t0))
        t0 = process.hrtime.bigint()
        const back = await p.downloadFile({ sandboxId: id, path: `bench-${name}.bin` })
        down.push(ms(t0))
        if (!Buffer.from(back).equals(content)) throw new Error(`${name}: the download differs`)
      }
      files[name] = { uploadP50Ms: round(p50(up)), downloadP50Ms: round(p50(down)) }
      if (size > 1 << 20) {
        files[name].uploadMBps = round(size / 1e6 / (p50(up) / 1000))
        files[name].downloadMBps = round(size / 1e6 / (p50(down) / 1000))
      }
    }
    const status = await p.agentStatus(id)
    // What a command's shell costs inside the sandbox on this runtime: the limit for any exec.
    const { ms: spawnMs } = await shellSpawnMs(
      async (command) => (await p.exec({ sandboxId: id, command })).response?.result ?? '',
      RUNS,
    )
    return {
      ...(agent ? { codeModeCallMs: round(await codeModeCall(p, id)) } : {}),
      shellSpawnMs: round(spawnMs),
      served: status.mode === 'agent' ? 'agent' : `engine (${status.reason})`,
      execTrueP50Ms: round(p50(execs)),
      execAlternatingP50Ms: round(p50(alternating)),
      // The engine's exec floor on this runtime: create + start + inspect of `true`, raw requests.
      floorExecTrueP50Ms: round(p50(floors)),
      createToFirstExecP50Ms: round(p50(creates)),
      files,
    }
  } finally {
    for (const id of ids) await p.removeSandbox(id).catch(() => {})
    await p.dispose()
  }
}

/**
 * A Code Mode round trip from inside the sandbox: `mcp-client call-tool` (the agent's static
 * client, installed as TrueForge installs it) to a dispatcher here, per call, timed as a loop of
 * RUNS calls less an empty loop (the best of three).
 */
async function codeModeCall(p, id) {
  const transport = p.createCodeModeTransport()
  const install = transport.getClientInstall({ sandboxId: id })
  const sh = async (command, env) => {
    const r = await p.exec({ sandboxId: id, command, env, timeoutSeconds: 300 })
    if (!r.success || r.response.exitCode !== 0) throw new Error(`${command}: ${JSON.stringify(r).slice(0, 300)}`)
  }
  await sh('mkdir -p /trueforge/codemode/bin')
  await p.uploadFile({ sandboxId: id, remotePath: install.remotePath, content: Buffer.from(install.content) })
  const link = install.pathBinSymlink ? `ln -sf ${install.remotePath} ${install.pathBinSymlink}` : 'true'
  await sh(`chmod 0555 ${install.remotePath} && ${link}`)
  const { env } = await transport.start({
    codeModeDispatcher: ECHO_DISPATCHER,
    sandboxId: id,
    requestTimeoutSeconds: 60,
  })
  const full = { ...env, TFY_MCP_SERVERS: ECHO_SERVERS, TFY_ENABLE_AGENT_APPROVALS: 'true' }
  try {
    await sh("mcp-client call-tool demo echo '{}' >/dev/null", full)
    const loop = async (n) => {
      let best = Infinity
      for (let i = 0; i < 3; i++) {
        const t0 = process.hrtime.bigint()
        await sh(`for i in $(seq ${n}); do mcp-client call-tool demo echo '{}' >/dev/null; done`, full)
        best = Math.min(best, ms(t0))
      }
      return best
    }
    return ((await loop(RUNS)) - (await loop(0))) / RUNS
  } finally {
    await transport.stop()
  }
}

/** One raw exec floor (bench/impl/floor.js) of `true` in sandbox `id`'s container, per call. */
async function floorIn(id) {
  const socket = process.env.DOCKER_HOST.replace(/^unix:\/\//, '')
  const filters = encodeURIComponent(JSON.stringify({ label: [`trueforge.sandbox.id=${id}`] }))
  const { data } = await floor.client(socket).json('GET', `/containers/json?filters=${filters}`)
  const f = floor.create({ socket })
  return async () => {
    const t0 = process.hrtime.bigint()
    const r = await f.exec(data[0].Id, 'true')
    if (r.exitCode !== 0) throw new Error(`the floor's exec exited ${r.exitCode}`)
    return ms(t0)
  }
}

async function main() {
  const out = { engine: process.env.DOCKER_HOST, image: IMAGE, runs: RUNS, rounds: ROUNDS }
  for (const runtime of ['runc', 'runsc']) {
    out[runtime] = {}
    for (const agent of [true, false]) {
      try {
        out[runtime][agent ? 'agent' : 'agentFalse'] = await measure(runtime, agent)
      } catch (e) {
        out[runtime][agent ? 'agent' : 'agentFalse'] = { error: e.message }
      }
    }
  }
  console.log(JSON.stringify(out, null, 2))
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
