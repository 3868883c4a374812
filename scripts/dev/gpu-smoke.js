'use strict'

// The GPU smoke test without jest, for scripts/ci/gpu-check.sh (a bundle has no node_modules). The
// same checks as __test__/gpu.test.ts, through this package's provider:
//   node gpu-smoke.js round-trip   a sandbox without GPUs: create, exec, upload, download, remove
//   node gpu-smoke.js gpu          nvidia-smi in a sandbox with every GPU (CDI); an exclusive
//                                  sandbox sees exactly its GPU, a second one another GPU or a
//                                  GPUS_UNAVAILABLE naming the first; bandwidth in the sandbox vs
//                                  on the host (bench/bandwidth), ratio >= 0.97
//   node gpu-smoke.js cdi-fake     without a GPU: the CDI path and exclusive allocation on this
//                                  engine, with two fake CDI "GPUs" (trueforge.test/gpu=0 and =1)
//                                  that gpu-check.sh describes in a spec as one file mounted each
// Settings: SMOKE_PKG (the package folder), SMOKE_HOST, SMOKE_IMAGE, SMOKE_ALL (default
// 'nvidia.com/gpu=all'), SMOKE_BANDWIDTH (the host's bandwidth binary). Prints what it sees, then
// one JSON line of figures; exits 0 when every check held, 1 otherwise.
const { spawnSync } = require('node:child_process')
const { readFileSync } = require('node:fs')
const path = require('node:path')

const { DockerSandboxProvider } = require(process.env.SMOKE_PKG || path.join(__dirname, 'pkg'))

const mode = process.argv[2] || 'gpu'
const base = {
  image: process.env.SMOKE_IMAGE || 'trueforge-gpu-check:1',
  dockerHost: process.env.SMOKE_HOST,
  namespace: 'gpu-check',
  network: 'none',
  autoStopIntervalInMinutes: 0,
}
const figures = { mode }
const failures = []
const made = []

function check(ok, what) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`)
  if (!ok) failures.push(what)
}

async function sh(p, id, command, timeoutSeconds = 120) {
  const r = await p.exec({ sandboxId: id, command, timeoutSeconds })
  if (!r.success) throw new Error(`exec ${command}: ${r.error}`)
  return r.response
}

const uuids = (list) => [...list.matchAll(/^GPU \d+: .*\(UUID: (GPU-[0-9a-fA-F-]+)\)/gm)].map((m) => m[1])

async function create(p) {
  const { sandboxId } = await p.createSandbox()
  made.push([p, sandboxId])
  return sandboxId
}

async function roundTrip() {
  const p = new DockerSandboxProvider(base)
  const id = await create(p)
  const r = await sh(p, id, 'echo hello from $(uname -s); ls /workspace')
  check(
    r.exitCode === 0 && r.result.startsWith('hello from Linux'),
    `exec in a sandbox: ${JSON.stringify(r.result.trim())}`,
  )
  await p.uploadFile({ sandboxId: id, remotePath: 'probe.txt', content: Buffer.from('round trip\n') })
  const back = (await p.downloadFile({ sandboxId: id, path: 'probe.txt' })).toString()
  check(back === 'round trip\n', 'upload then download returns the same bytes')
  check((await p.removeSandbox(id)) === true, 'removeSandbox')
  made.length = 0
}

async function gpu() {
  const all = new DockerSandboxProvider({ ...base, gpus: process.env.SMOKE_ALL || 'nvidia.com/gpu=all' })
  const a0 = await create(all)
  const list = (await sh(all, a0, 'nvidia-smi -L')).result
  console.log(`nvidia-smi -L in a sandbox with every GPU:\n${list.trim()}`)
  const every = uuids(list)
  figures.gpus = every
  check(every.length >= 1, `nvidia-smi -L lists ${every.length} GPU(s)`)
  const hostList = spawnSync('nvidia-smi', ['-L'], { encoding: 'utf8' }).stdout || ''
  const onHost = uuids(hostList)
  if (onHost.length > 0)
    check(JSON.stringify([...onHost].sort()) === JSON.stringify([...every].sort()), 'the sandbox sees the host GPUs')
  await all.removeSandbox(a0)

  const ex = new DockerSandboxProvider({ ...base, gpus: { count: 1, exclusive: true } })
  const a = await create(ex)
  const mine = (await sh(ex, a, 'nvidia-smi -L; echo "gpus=$TRUEFORGE_GPUS"')).result
  console.log(`nvidia-smi -L in an exclusive sandbox:\n${mine.trim()}`)
  const seen = uuids(mine)
  figures.exclusive = { gpus: /gpus=(.*)/.exec(mine)?.[1], list: seen }
  check(seen.length === 1, 'an exclusive sandbox sees exactly one GPU')
  if (every.length >= 2) {
    const b = await create(ex)
    const other = uuids((await sh(ex, b, 'nvidia-smi -L')).result)
    check(
      other.length === 1 && other[0] !== seen[0],
      `a second exclusive sandbox sees another GPU (${other[0]} vs ${seen[0]})`,
    )
  } else {
    const e = await ex.createSandbox().then(
      () => null,
      (err) => err,
    )
    check(
      e !== null && e.code === 'GPUS_UNAVAILABLE' && (e.holders || []).includes(a),
      `one GPU: a second exclusive sandbox is refused naming the first (${e && e.message})`,
    )
  }

  const bin = process.env.SMOKE_BANDWIDTH || path.join(__dirname, 'bench', 'bandwidth')
  const ordinal = Math.max(0, onHost.indexOf(seen[0]))
  const host = () => {
    const r = spawnSync(bin, ['--device', String(ordinal)], {
      encoding: 'utf8',
      env: { ...process.env, CUDA_DEVICE_ORDER: 'PCI_BUS_ID' },
    })
    if (r.status !== 0) throw new Error(`bandwidth on the host exited ${r.status}: ${r.stdout}${r.stderr}`)
    return JSON.parse(r.stdout.trim())
  }
  await ex.uploadFile({ sandboxId: a, remotePath: 'bandwidth', content: readFileSync(bin) })
  const inside = async () => {
    const r = await sh(ex, a, 'chmod +x ./bandwidth && ./bandwidth', 600)
    if (r.exitCode !== 0) throw new Error(`bandwidth in the sandbox exited ${r.exitCode}: ${r.result}`)
    return JSON.parse(r.result.trim().split('\n').pop())
  }
  const h1 = host()
  const s1 = await inside()
  const h2 = host()
  const s2 = await inside()
  const hostGbps = Math.max(h1.gbps, h2.gbps)
  const sandboxGbps = Math.max(s1.gbps, s2.gbps)
  const ratio = sandboxGbps / hostGbps
  Object.assign(figures, {
    device: h1.device,
    sandboxGbps,
    hostGbps,
    ratio: Number(ratio.toFixed(4)),
    runs: { host: [h1, h2], sandbox: [s1, s2] },
  })
  console.log(
    `bandwidth on ${h1.device}: sandbox ${sandboxGbps.toFixed(1)} GB/s, host ${hostGbps.toFixed(1)} GB/s, ratio ${ratio.toFixed(4)}`,
  )
  check(ratio >= 0.97, `bandwidth ratio ${ratio.toFixed(4)} >= 0.97`)
}

/** The engine's Podman version as [major, minor], or null when it is not Podman. */
function podmanVersion() {
  const http = require('node:http')
  const socketPath = (base.dockerHost || '').replace(/^unix:\/\//, '')
  return new Promise((resolve, reject) => {
    http
      .get({ socketPath, path: '/version' }, (res) => {
        let body = ''
        res.on('data', (d) => (body += d))
        res.on('end', () => {
          const c = (JSON.parse(body).Components || []).find((x) => /podman/i.test(x.Name))
          resolve(c ? c.Version.split('.').map(Number) : null)
        })
      })
      .on('error', reject)
  })
}

async function cdiFake() {
  const podman = await podmanVersion()
  figures.podman = podman
  if (podman && podman[0] < 5) {
    // Podman 4 would drop CDI devices given through the Docker API: the provider must refuse.
    for (const gpus of ['trueforge.test/gpu=all', { count: 1, exclusive: true }]) {
      const p = new DockerSandboxProvider({ ...base, gpus })
      const e = await p.createSandbox().then(
        ({ sandboxId }) => {
          made.push([p, sandboxId])
          return null
        },
        (err) => err,
      )
      check(
        e !== null &&
          e.name === 'SandboxGpuError' &&
          e.code === 'GPU_UNSUPPORTED' &&
          /Podman 5 or later/.test(e.message) &&
          /trueforge\.test\/gpu=/.test(e.message),
        `Podman ${podman.join('.')}: gpus ${JSON.stringify(gpus)} is refused with GPU_UNSUPPORTED (${e && e.message})`,
      )
    }
    return
  }
  const all = new DockerSandboxProvider({ ...base, gpus: 'trueforge.test/gpu=all' })
  const a0 = await create(all)
  const both = (await sh(all, a0, 'cat /run/trueforge-fake-gpu/*; echo "gpus=$TRUEFORGE_GPUS"')).result
  check(
    /fake gpu 0/.test(both) && /fake gpu 1/.test(both) && /gpus=trueforge.test\/gpu=all/.test(both),
    `a CDI name gives the sandbox its devices: ${JSON.stringify(both)}`,
  )
  await all.removeSandbox(a0)

  // No gpuDevices: the two are found in the local CDI spec.
  const ex = new DockerSandboxProvider({ ...base, gpus: { count: 1, exclusive: true } })
  const a = await create(ex)
  const b = await create(ex)
  const seenA = (await sh(ex, a, 'cat /run/trueforge-fake-gpu/*; echo "gpus=$TRUEFORGE_GPUS"')).result
  const seenB = (await sh(ex, b, 'cat /run/trueforge-fake-gpu/*; echo "gpus=$TRUEFORGE_GPUS"')).result
  figures.exclusive = { a: seenA.trim(), b: seenB.trim() }
  const one = (t) => (t.match(/fake gpu \d/g) || []).length === 1
  check(one(seenA) && one(seenB), 'each exclusive sandbox sees exactly one device')
  check(
    seenA.match(/fake gpu \d/)[0] !== seenB.match(/fake gpu \d/)[0],
    `they see different devices (${seenA.trim()} / ${seenB.trim()})`,
  )
  const e = await ex.createSandbox().then(
    () => null,
    (err) => err,
  )
  check(
    e !== null && e.code === 'GPUS_UNAVAILABLE' && [a, b].every((id) => (e.holders || []).includes(id)),
    `a third is refused naming both holders (${e && e.message})`,
  )
}

async function main() {
  try {
    if (mode === 'round-trip') await roundTrip()
    else if (mode === 'cdi-fake') await cdiFake()
    else await gpu()
  } catch (e) {
    failures.push(String((e && e.stack) || e))
    console.log(`FAIL ${(e && e.message) || e}`)
  } finally {
    for (const [p, id] of made) await p.removeSandbox(id).catch(() => {})
  }
  figures.failures = failures
  console.log(JSON.stringify(figures))
  process.exit(failures.length === 0 ? 0 : 1)
}

main()
