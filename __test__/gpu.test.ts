// The GPU smoke test, `npm run test:gpu` (jest --selectProjects gpu). Needs a GPU on this host
// and an engine that gives GPUs (the NVIDIA runtime or toolkit, or CDI); skips, saying why,
// everywhere else. It checks that a sandbox sees exactly its GPUs, that two exclusive sandboxes
// see disjoint GPUs (or, on a one-GPU host, that the second is refused naming the first), and
// measures memory bandwidth with one program (bench/gpu/bandwidth.c) inside a sandbox and on
// the host, printing both and their ratio, which must be at least 0.97.
//
// Settings (scripts/ci/gpu-check.sh sets them for its Podman service):
//   TRUEFORGE_GPU_TEST_HOST     the engine (default: $DOCKER_HOST or the local socket)
//   TRUEFORGE_GPU_TEST_IMAGE    a glibc image (default: the debian test image)
//   TRUEFORGE_GPU_TEST_ALL      the `gpus` value meaning every GPU (default 'all'; CDI: 'nvidia.com/gpu=all')
//   TRUEFORGE_GPU_TEST_DEVICES  comma-separated `gpuDevices` for exclusive sandboxes (default: discovered)
//   TRUEFORGE_GPU_TEST_NETWORK  the sandboxes' network (default: the provider's own for the namespace)
//   TRUEFORGE_GPU_TEST_REPORT   a file to write the figures to, as JSON

import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import { DockerSandboxProvider, SandboxGpuError } from '..'
import { DEBIAN, dockerTry, ok, rejection, run, SandboxTracker, uniqueNamespace } from './helpers'

const env = process.env
const host = env.TRUEFORGE_GPU_TEST_HOST || undefined
const image = env.TRUEFORGE_GPU_TEST_IMAGE || DEBIAN
const allGpus = env.TRUEFORGE_GPU_TEST_ALL || 'all'
const devices = env.TRUEFORGE_GPU_TEST_DEVICES ? env.TRUEFORGE_GPU_TEST_DEVICES.split(',') : undefined
const network = env.TRUEFORGE_GPU_TEST_NETWORK || undefined

function hostHasGpu(): { ok: boolean; why: string } {
  if (!existsSync('/dev/nvidiactl'))
    return { ok: false, why: 'this host has no /dev/nvidiactl (no NVIDIA GPU or driver)' }
  const r = spawnSync('sh', [
    '-c',
    'ldconfig -p 2>/dev/null | grep -q "libcuda.so.1 " || ls /usr/lib*/*/libcuda.so.1 /usr/lib*/libcuda.so.1 2>/dev/null | grep -q .',
  ])
  if (r.status !== 0) return { ok: false, why: 'this host has no libcuda.so.1 (the CUDA driver library)' }
  return { ok: true, why: 'an NVIDIA GPU and driver on this host' }
}

function engineGivesGpus(): { ok: boolean; why: string } {
  if (host) return { ok: true, why: `the engine at ${host} (TRUEFORGE_GPU_TEST_HOST)` }
  const runtimes = dockerTry(['info', '--format', '{{json .Runtimes}}'])
  if (runtimes.status !== 0) return { ok: false, why: `docker info failed: ${runtimes.stderr}` }
  if (/"nvidia"/.test(runtimes.stdout)) return { ok: true, why: 'the engine has the nvidia runtime' }
  const cdi = dockerTry(['info', '--format', '{{json .CDISpecDirs}}'])
  let dirs: string[] = []
  try {
    if (cdi.status === 0 && cdi.stdout.startsWith('[')) dirs = JSON.parse(cdi.stdout) as string[]
  } catch {
    dirs = []
  }
  if (dirs.length === 0) dirs = ['/etc/cdi', '/var/run/cdi']
  for (const dir of dirs) {
    if (!existsSync(dir)) continue
    for (const f of readdirSync(dir)) {
      try {
        if (readFileSync(join(dir, f), 'utf8').includes('nvidia.com/gpu'))
          return { ok: true, why: `NVIDIA CDI spec ${join(dir, f)}` }
      } catch {
        // unreadable: not a spec we can use
      }
    }
  }
  return {
    ok: false,
    why: `runtimes ${runtimes.stdout} have no 'nvidia' and no NVIDIA CDI spec was found in ${dirs.join(', ')}`,
  }
}

const onHost = hostHasGpu()
const onEngine = onHost.ok ? engineGivesGpus() : { ok: false, why: 'not asked' }
const gpu = { ok: onHost.ok && onEngine.ok, why: onHost.ok ? onEngine.why : onHost.why }
const maybe = gpu.ok ? test : test.skip
if (!gpu.ok) console.warn(`gpu.test.ts: SKIPPED, no GPU to test with (${gpu.why}).`)

const namespace = uniqueNamespace('t-gpu')
const tracker = new SandboxTracker(namespace)
const base = { image, namespace, dockerHost: host, network, autoStopIntervalInMinutes: 0 }
const all = new DockerSandboxProvider({ ...base, gpus: allGpus as any })
const exclusive = new DockerSandboxProvider({ ...base, gpus: { count: 1, exclusive: true }, gpuDevices: devices })
const figures: Record<string, unknown> = { gpus: allGpus }

afterAll(async () => {
  await tracker.cleanup(exclusive)
  await tracker.cleanup(all)
  if (env.TRUEFORGE_GPU_TEST_REPORT)
    writeFileSync(env.TRUEFORGE_GPU_TEST_REPORT, `${JSON.stringify(figures, null, 2)}\n`)
})

/** `GPU i: name (UUID: GPU-…)` lines → UUIDs, in order. */
function uuids(list: string): string[] {
  return [...list.matchAll(/^GPU \d+: .*\(UUID: (GPU-[0-9a-fA-F-]+)\)/gm)].map((m) => m[1])
}

function hostList(): string {
  const r = spawnSync('nvidia-smi', ['-L'], { encoding: 'utf8' })
  return r.status === 0 ? r.stdout : ''
}

maybe(
  `a sandbox with gpus: ${JSON.stringify(allGpus)} runs nvidia-smi (${gpu.why})`,
  async () => {
    const id = await tracker.create(all)
    const r = await run(all, id, 'nvidia-smi -L', { timeoutSeconds: 60 })
    expect(r.exitCode).toBe(0)
    expect(r.result).toMatch(/^GPU \d+:/m)
    figures.allList = r.result.trim()
    const fromHost = uuids(hostList())
    if (fromHost.length > 0) expect(uuids(r.result).sort()).toEqual([...fromHost].sort())
    expect(all.getAdditionalInstructions()).toMatch(/nvidia-smi/)
  },
  120_000,
)

let first: { id: string; uuid: string } | undefined

maybe(
  'nvidia-smi -L in an exclusive sandbox lists exactly its GPU; a second one gets another or is refused',
  async () => {
    const a = await tracker.create(exclusive)
    const list = await ok(exclusive, a, 'nvidia-smi -L; echo "gpus=$TRUEFORGE_GPUS"', { timeoutSeconds: 60 })
    const seen = uuids(list)
    const named = /gpus=(.*)/.exec(list)?.[1]?.trim() ?? ''
    figures.exclusiveA = { sandbox: a, gpus: named, list: list.trim() }
    expect(seen.length).toBe(1)
    const fromHost = uuids(hostList())
    // The GPU it names is the GPU it sees: by UUID, or by the host's index.
    const index = /(?:^|=)(\d+)$/.exec(named)?.[1]
    if (/GPU-[0-9a-fA-F-]+/.test(named)) expect(named).toContain(seen[0])
    else if (index !== undefined && fromHost.length > 0) expect(seen[0]).toBe(fromHost[Number(index)])
    first = { id: a, uuid: seen[0] }

    const gpuCount = fromHost.length || uuids(String(figures.allList ?? '')).length
    if (gpuCount >= 2) {
      const b = await tracker.create(exclusive)
      const other = uuids(await ok(exclusive, b, 'nvidia-smi -L', { timeoutSeconds: 60 }))
      figures.exclusiveB = { sandbox: b, list: other }
      expect(other.length).toBe(1)
      expect(other[0]).not.toBe(seen[0])
      await exclusive.removeSandbox(b)
    } else {
      const e = await rejection(exclusive.createSandbox())
      figures.exclusiveB = { refused: e.message }
      expect(e).toBeInstanceOf(SandboxGpuError)
      expect(e.code).toBe('GPUS_UNAVAILABLE')
      expect(e.holders).toEqual([a])
    }
  },
  180_000,
)

maybe(
  'memory bandwidth in the sandbox is at least 0.97 of the same program on the host',
  async () => {
    expect(first).toBeDefined()
    const { id, uuid } = first!
    const dir = mkdtempSync(join(tmpdir(), 'gpu-bw-'))
    try {
      const bin = join(dir, 'bandwidth')
      execFileSync('cc', ['-O2', '-std=c11', '-o', bin, join(__dirname, '..', 'bench', 'gpu', 'bandwidth.c'), '-ldl'])
      // The host run uses the sandbox's GPU: the host's index of that UUID, in PCI order like nvidia-smi.
      const ordinal = Math.max(0, uuids(hostList()).indexOf(uuid))
      const onHost = () => {
        const r = spawnSync(bin, ['--device', String(ordinal)], {
          encoding: 'utf8',
          env: { ...env, CUDA_DEVICE_ORDER: 'PCI_BUS_ID' },
          timeout: 300_000,
        })
        if (r.status !== 0) throw new Error(`bandwidth on the host exited ${r.status}: ${r.stdout} ${r.stderr}`)
        return JSON.parse(r.stdout.trim())
      }
      await exclusive.uploadFile({ sandboxId: id, remotePath: 'bandwidth', content: readFileSync(bin) })
      const inSandbox = async () => {
        const out = await ok(exclusive, id, 'chmod +x ./bandwidth && ./bandwidth', { timeoutSeconds: 300 })
        return JSON.parse(out.trim().split('\n').pop() as string)
      }
      // Interleaved, best of two each, so a clock ramp or a neighbour hits both sides alike.
      const h1 = onHost()
      const s1 = await inSandbox()
      const h2 = onHost()
      const s2 = await inSandbox()
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
        `GPU memory bandwidth on ${h1.device}: sandbox ${sandboxGbps.toFixed(1)} GB/s, host ${hostGbps.toFixed(1)} GB/s, ratio ${ratio.toFixed(4)}`,
      )
      expect(ratio).toBeGreaterThanOrEqual(0.97)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  },
  600_000,
)

test('without `gpus` no GPU is requested, and the instructions say so', () => {
  const plain = new DockerSandboxProvider({ image, namespace })
  expect(plain.getAdditionalInstructions()).toMatch(/No GPU is attached/)
})
