// GPU passthrough (`gpus: 'all'`), run with `jest -c jest.gpu.config.js`. Skipped, saying why,
// when the Docker engine offers no GPU (no `nvidia` runtime and no NVIDIA CDI spec).
// TRUEFORGE_GPU_TEST_IMAGE picks the image (default: the debian test image; nvidia-smi is
// injected by the NVIDIA runtime and needs a glibc image, so not busybox).

import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'

import { DockerSandboxProvider } from '..'
import { DEBIAN, dockerTry, run, SandboxTracker, uniqueNamespace } from './helpers'

function detectGpu(): { ok: boolean; why: string } {
  const runtimes = dockerTry(['info', '--format', '{{json .Runtimes}}'])
  if (runtimes.status !== 0) return { ok: false, why: `docker info failed: ${runtimes.stderr}` }
  if (/"nvidia"/.test(runtimes.stdout)) return { ok: true, why: 'the engine has the nvidia runtime' }
  // CDI: newer engines list their spec dirs; fall back to the standard ones.
  const cdi = dockerTry(['info', '--format', '{{json .CDISpecDirs}}'])
  let dirs: string[] = []
  if (cdi.status === 0 && cdi.stdout.startsWith('[')) {
    try {
      dirs = JSON.parse(cdi.stdout) as string[]
    } catch {
      dirs = []
    }
  }
  if (dirs.length === 0) dirs = ['/etc/cdi', '/var/run/cdi']
  for (const dir of dirs) {
    if (!existsSync(dir)) continue
    for (const f of readdirSync(dir)) {
      try {
        if (readFileSync(join(dir, f), 'utf8').includes('nvidia.com/gpu')) {
          return { ok: true, why: `NVIDIA CDI spec ${join(dir, f)}` }
        }
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

const gpu = detectGpu()
const maybe = gpu.ok ? test : test.skip
if (!gpu.ok) {
  console.warn(`gpu.test.ts: SKIPPED, this Docker engine offers no GPU (${gpu.why}).`)
}

const namespace = uniqueNamespace('t-gpu')
const tracker = new SandboxTracker(namespace)
const image = process.env.TRUEFORGE_GPU_TEST_IMAGE || DEBIAN
const provider = new DockerSandboxProvider({ image, namespace, gpus: 'all' })

afterAll(async () => {
  await tracker.cleanup(provider)
})

maybe(`a sandbox with gpus: 'all' runs nvidia-smi (${gpu.why})`, async () => {
  const id = await tracker.create(provider)
  const r = await run(provider, id, 'nvidia-smi -L', { timeoutSeconds: 60 })
  expect(r.exitCode).toBe(0)
  expect(r.result).toMatch(/^GPU \d+:/m)
  expect(provider.getAdditionalInstructions()).toMatch(/nvidia-smi/)
})

test('without `gpus` no GPU is requested, and the instructions say so', () => {
  const plain = new DockerSandboxProvider({ image, namespace })
  expect(plain.getAdditionalInstructions()).toMatch(/No GPU is attached/)
})
