'use strict'

// `trueforge-docker-sandbox doctor`: checks that the engine the provider would use is there and
// fit for sandboxes, one line per check with ok / warn / fail and the fix. Exit code 0 only when
// nothing fails; `--json` for machines.

const fs = require('node:fs')
const path = require('node:path')

const { native, UsageError, parseArgs, adminOptions, colour, ago, short, bytes, tty } = require('./common')

const USAGE = `usage: trueforge-docker-sandbox doctor [--docker-host H] [--image I] [--network N] [--egress E] [--runtime R] [--namespace N] [--json]

Checks, one line each (ok / warn / fail, with the fix): how the engine is reached (socket, TLS,
SSH, context) and that it answers, its version and API, rootless or not, cgroup version and
driver, storage driver and free space on its data root, the default seccomp profile, the OCI
runtimes (runsc …), GPU support (nvidia runtime, CDI specs and their devices), the image-work
leases failed or interrupted pulls and builds left on the engine, the image
(default trueforge-sandbox:2) and what its probe found, a test sandbox created, exec'd,
transferred and removed, with timings (under --runtime, e.g. runsc, when given), whether its
calls went through the in-sandbox agent (and why not), and the egress policy in force (--egress:
open, none or a policy as JSON, as the provider's egress option). Exit code 0 only when nothing
fails.`

/** @type {Record<string, 'string' | 'number' | 'boolean'>} */
const SPEC = {
  '--docker-host': 'string',
  '--image': 'string',
  '--network': 'string',
  '--egress': 'string',
  '--runtime': 'string',
  '--namespace': 'string',
  '--json': 'boolean',
  '--timeout-ms': 'number',
}

const MIN_FREE = 10 * 1024 ** 3
// Where CDI specs live (as Podman and the NVIDIA toolkit look); TRUEFORGE_CDI_DIRS (colon-separated)
// replaces the list.
const CDI_DIRS = process.env.TRUEFORGE_CDI_DIRS
  ? process.env.TRUEFORGE_CDI_DIRS.split(':').filter(Boolean)
  : ['/etc/cdi', '/var/run/cdi']

function cdiDevices() {
  const found = []
  for (const dir of CDI_DIRS) {
    let names = []
    try {
      names = fs.readdirSync(dir)
    } catch {
      continue
    }
    for (const n of names.filter((f) => /\.(json|ya?ml)$/.test(f))) {
      const file = path.join(dir, n)
      let devices = []
      try {
        const text = fs.readFileSync(file, 'utf8')
        if (n.endsWith('.json')) {
          const spec = JSON.parse(text)
          devices = (spec.devices || []).map((d) => `${spec.kind}=${d.name}`)
        } else {
          const kind = /^kind:\s*["']?([^"'\s]+)/m.exec(text)?.[1] ?? '?'
          devices = [...text.matchAll(/^\s*-\s*name:\s*["']?([^"'\s]+)/gm)].map((m) => `${kind}=${m[1]}`)
        }
      } catch {}
      found.push({ file, devices })
    }
  }
  return found
}

async function run(argv, out) {
  const opts = parseArgs(argv, SPEC)
  const egress = egressOption(opts.egress)
  if (opts.help) return (out.log(USAGE), 0)
  const checks = []
  const add = (name, status, detail, fix) => {
    const c = { name, status, detail }
    if (fix) c.fix = fix
    checks.push(c)
    if (!opts.json) {
      const mark = { ok: colour.green('ok  '), warn: colour.yellow('warn'), fail: colour.red('fail') }[status]
      out.log(`${mark}  ${name}: ${detail}${fix ? `${tty ? '\n        ' : ' — '}fix: ${fix}` : ''}`)
    }
  }

  // How the engine is reached.
  let endpoint
  try {
    endpoint = native.describeEndpoint(opts.dockerHost)
    const how = endpoint.host.startsWith('ssh://')
      ? 'SSH'
      : endpoint.tls
        ? 'TLS'
        : endpoint.host.startsWith('unix://')
          ? 'socket'
          : 'plain TCP'
    add(
      'endpoint',
      !endpoint.tls && endpoint.host.startsWith('tcp://') ? 'warn' : 'ok',
      `${how}: ${endpoint.describe}`,
      !endpoint.tls && endpoint.host.startsWith('tcp://')
        ? 'plain TCP is unauthenticated: use TLS (DOCKER_TLS_VERIFY, a context with TLS, or the tls option) or SSH'
        : undefined,
    )
  } catch (e) {
    add('endpoint', 'fail', e.message, 'fix DOCKER_HOST / DOCKER_CONTEXT / the Docker config, or pass --docker-host')
    return finish(opts, out, checks)
  }

  let report
  const t0 = Date.now()
  try {
    report = await native.engineReport(adminOptions({ ...opts, timeoutMs: opts.timeoutMs ?? 10_000 }))
    add('engine reachable', 'ok', `${endpoint.host} answered in ${Date.now() - t0} ms`)
  } catch (e) {
    add(
      'engine reachable',
      'fail',
      `${e.code}: ${e.message}`,
      e.code === 'ENGINE_TLS'
        ? 'see the message: it names the TLS fix'
        : `start the engine or point --docker-host / DOCKER_HOST / the context at it (${endpoint.host})`,
    )
    return finish(opts, out, checks)
  }
  const v = report.version || {}
  const info = report.info || {}
  const podman = (v.Components || []).some((c) => /podman/i.test(c.Name || ''))
  add(
    'version',
    'ok',
    `${podman ? 'Podman' : 'Docker Engine'} ${v.Version ?? '?'}, API ${v.ApiVersion ?? '?'} (negotiated ${report.apiVersion}), ${v.Os ?? '?'}/${v.Arch ?? '?'}`,
  )

  imageWork(report, add)

  const sec = info.SecurityOptions || []
  const rootless = sec.some((s) => s.includes('name=rootless'))
  add('rootless', 'ok', rootless ? 'rootless engine (containers cannot gain host root)' : 'rootful engine')
  const cg = info.CgroupVersion ? `cgroup v${info.CgroupVersion}` : 'cgroup version unknown'
  add('cgroups', 'ok', `${cg}, driver ${info.CgroupDriver ?? '?'}`)

  let free = null
  if (endpoint.host.startsWith('unix://') && info.DockerRootDir) {
    try {
      const s = fs.statfsSync(info.DockerRootDir)
      free = s.bavail * s.bsize
    } catch {}
  }
  const storage = `driver ${info.Driver ?? '?'}, data root ${info.DockerRootDir ?? '?'}`
  if (free === null) add('storage', 'ok', `${storage}, free space not visible from here (remote or rootless data root)`)
  else if (free < MIN_FREE)
    add(
      'storage',
      'warn',
      `${storage}, ${bytes(free)} free`,
      `free space on ${info.DockerRootDir}: images and sandboxes need several GiB`,
    )
  else add('storage', 'ok', `${storage}, ${bytes(free)} free`)

  const seccomp = sec.find((s) => s.includes('name=seccomp'))
  if (seccomp) add('seccomp', 'ok', `on (${seccomp.replace(/^name=seccomp,?/, '') || 'default profile'})`)
  else
    add(
      'seccomp',
      'warn',
      'the engine runs containers without seccomp',
      'run the engine with its default seccomp profile (no --seccomp-profile=unconfined)',
    )

  const runtimes = Object.keys(info.Runtimes || {})
  add(
    'runtimes',
    'ok',
    `${runtimes.join(', ') || 'none listed'} (default ${info.DefaultRuntime ?? '?'})${runtimes.includes('runsc') ? '' : '; gVisor (runsc) not installed — optional, for runtime: "runsc"'}`,
  )

  const [major, minor, patch] = String(v.Version ?? '')
    .split(/[.+~-]/)
    .map(Number)
  const safeDocker = major >= 23 || (major === 20 && minor === 10 && patch >= 27)
  const ownNetwork = egress === 'open' || (egress === undefined && opts.network !== undefined)
  if (!ownNetwork)
    add(
      'network',
      'ok',
      'sandboxes join no engine network (an egress policy or none): nothing to share, nothing to race',
    )
  else if (opts.network) add('network', 'ok', `sandboxes join ${opts.network} (--network)`)
  else if (podman)
    add(
      'network',
      'warn',
      'sandboxes join a network per namespace and tenant, isolated from every other network; Podman 4 cannot turn off traffic inside one, so sandboxes of one tenant can reach each other',
      'give each tenant its own tenantName (or namespace)',
    )
  else if (!safeDocker)
    add(
      'network',
      'warn',
      `Docker ${v.Version ?? '?'} can deadlock with many containers coming and going on one user-defined network (moby issue 46661, fixed in 20.10.27 and 23), so sandboxes join the default bridge, where they can reach each other`,
      "upgrade the engine to 20.10.27, or 23 or later; or set network: 'isolated' to take the risk",
    )
  else add('network', 'ok', 'sandboxes join a network per namespace and tenant with inter-container communication off')

  const nvidia = runtimes.includes('nvidia')
  const cdi = endpoint.host.startsWith('unix://') ? cdiDevices() : []
  const cdiDevs = cdi.flatMap((c) => c.devices)
  if (nvidia || cdiDevs.length) {
    add(
      'gpu',
      'ok',
      [
        nvidia ? 'nvidia runtime registered' : null,
        cdi.length ? `CDI specs ${cdi.map((c) => c.file).join(', ')}: ${cdiDevs.join(', ') || 'no devices'}` : null,
      ]
        .filter(Boolean)
        .join('; '),
    )
  } else {
    add(
      'gpu',
      'warn',
      `no nvidia runtime and no CDI specs (in ${CDI_DIRS.join(', ')})`,
      'for `gpus`, install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure` (or generate CDI specs); ignore without GPUs',
    )
  }

  // The image and a real sandbox, through the provider itself.
  const { DockerSandboxProvider } = require('../index.js')
  const image = opts.image || 'trueforge-sandbox:2'
  const provider = new DockerSandboxProvider({
    image,
    dockerHost: opts.dockerHost,
    namespace: opts.namespace || 'doctor',
    network: opts.network,
    egress,
    runtime: opts.runtime,
    engineTimeoutMs: opts.timeoutMs ?? 30_000,
  })
  add('egress', 'ok', provider.egressPolicy.replace(/\n/g, '; '))
  try {
    const st = await provider.getImageBuildStatus()
    if (st.status !== 'ready') {
      add(
        'image',
        'fail',
        `${image}: ${st.status}${st.reason ? ` — ${st.reason}` : ''}`,
        `pull or build it (docker pull ${image}, or the provider's buildImage()), or pass --image`,
      )
      return finish(opts, out, checks)
    }
    const md = st.metadata || {}
    const found = Object.entries(md)
      .filter(([k]) => !['image', 'imageId', 'warning'].includes(k))
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([k, val]) => `${k} ${val}`)
      .join(', ')
    // What the image lacks for TrueForge is the probe's warning (older probes: the reason).
    const lacks = md.warning || st.reason
    add('image', lacks ? 'warn' : 'ok', `${image} present; probe: ${found || 'nothing recorded'}`, lacks || undefined)

    const times = {}
    const step = async (name, fn) => {
      const t = Date.now()
      const r = await fn()
      times[name] = Date.now() - t
      return r
    }
    let sandboxId
    try {
      ;({ sandboxId } = await step('create', () => provider.createSandbox()))
      const r = await step('exec', () => provider.exec({ sandboxId, command: 'echo doctor' }))
      if (!r.success || r.response.exitCode !== 0 || r.response.result !== 'doctor\n')
        throw new Error(`exec answered ${JSON.stringify(r)}`)
      agentCheck(add, await provider.agentStatus(sandboxId))
      const payload = Buffer.from('doctor transfer check\n'.repeat(64))
      await step('upload', () =>
        provider.uploadFile({ sandboxId, remotePath: `${sandboxId}/doctor.txt`, content: payload }),
      )
      const back = await step('download', () => provider.downloadFile({ sandboxId, path: `${sandboxId}/doctor.txt` }))
      if (!Buffer.from(back).equals(payload)) throw new Error('the downloaded file differs from the uploaded one')
      await step('remove', () => provider.removeSandbox(sandboxId))
      sandboxId = undefined
      add(
        'test sandbox',
        'ok',
        Object.entries(times)
          .map(([k, ms]) => `${k} ${ms} ms`)
          .join(', '),
      )
    } catch (e) {
      add('test sandbox', 'fail', e.message, 'see the message; `--network none` helps on engines without a bridge')
    } finally {
      if (sandboxId) await provider.removeSandbox(sandboxId).catch(() => {})
    }
  } catch (e) {
    add('image', 'fail', e.message, 'check --image and the engine')
  } finally {
    provider.dispose()
  }
  return finish(opts, out, checks)
}

/** `--egress`: `open`, `none` or a policy as JSON (a usage error otherwise). */
function egressOption(text) {
  if (text === undefined || text === 'open' || text === 'none') return text
  try {
    return JSON.parse(text)
  } catch {
    throw new UsageError(`--egress: expected open, none or a policy as JSON such as '{"allow":["*"]}', got ${text}`)
  }
}

/** What serves the test sandbox's calls: the in-sandbox agent, or the engine's endpoints and why. */
function agentCheck(add, st) {
  if (st.mode === 'agent') {
    const who = st.uid === 0 ? 'as root, commands and files as the sandbox user' : `as uid ${st.uid} (the sandbox user)`
    // What this kernel or runtime (gVisor lacks the first of each) made the agent use.
    const how = [
      st.subreaper ? 'timeouts: subreaper' : st.sessionGuard ? 'timeouts: session guard' : 'timeouts: NOT verified',
      st.fsIds ? 'files: fs ids' : 'files: thread ids',
      st.openat2 ? 'paths: openat2' : 'paths: one component at a time',
      st.linked ? 'stream: linked socket' : 'stream: engine exec',
    ].join(', ')
    const contained = st.subreaper || st.sessionGuard
    add(
      'agent',
      st.asUser || !contained ? 'warn' : 'ok',
      `in-sandbox agent ${st.version} (${st.arch}) at ${st.path}, ${who}; ${how}`,
      st.asUser
        ? 'the sandbox gives no capability to switch users (Podman with a non-root user), so the agent runs as that user and the workload can signal it; nothing to do unless that matters'
        : !contained
          ? 'this system has no child subreaper and refused the session guard (seccomp): a timed-out command may leave processes running, and the call says so'
          : undefined,
    )
  } else if (st.reason === 'the `agent` option is false') {
    add('agent', 'ok', `commands and files use the engine's exec and archive endpoints: ${st.reason}`)
  } else {
    add(
      'agent',
      'warn',
      `commands and files use the engine's exec and archive endpoints: ${st.reason}`,
      'the sandbox works without the agent, with slower calls; the provider tries the agent again a minute later (doubling up to 30 minutes) and when it restarts the container. For a missing binary, build the agent (npm run build:agent) or install a package that carries agent-bin/; see docs/agent.md, "When it cannot run"',
    )
  }
}

/** The image-work leases: work in progress is fine; a failed or dead one is left behind. */
function imageWork(report, add) {
  const name = 'image-work leases'
  const leases = report.imageWork
  if (!leases) return add(name, 'warn', `could not list them: ${report.imageWorkError}`)
  const running = leases.filter((l) => l.state === 'running')
  const left = leases.filter((l) => l.state !== 'running')
  const busy = running.length
    ? `${running.length} pull(s) or build(s) in progress (${running.map((l) => `${l.image} in ${l.holder}`).join(', ')})`
    : ''
  if (!left.length) return add(name, 'ok', busy || 'none left by failed or interrupted pulls and builds')
  const each = left.map(
    (l) =>
      `${l.container} (${l.work} of ${l.image}, ${l.state === 'failed' ? 'failed' : 'its server process died'}, last heard ${ago(l.ageSeconds)} ago${l.reason ? `: ${short(l.reason, 160)}` : ''})`,
  )
  add(
    name,
    'warn',
    `${left.length} left by failed or interrupted pulls and builds: ${each.join('; ')}${busy ? `; ${busy}` : ''}`,
    '`trueforge-docker-sandbox rm --image-work` removes them (the reaper does once they are an hour old); fix what made the work fail, then save the sandbox settings again (buildImage() retries)',
  )
}

function finish(opts, out, checks) {
  const failed = checks.filter((c) => c.status === 'fail').length
  const warned = checks.filter((c) => c.status === 'warn').length
  if (opts.json) out.log(JSON.stringify({ ok: failed === 0, checks }, null, 2))
  else out.log(`${failed ? colour.red(`${failed} failed`) : colour.green('nothing failed')}, ${warned} warning(s)`)
  return failed ? 1 : 0
}

module.exports = { run, USAGE }
