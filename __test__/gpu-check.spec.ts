// scripts/build/gpu-bundle.sh and scripts/ci/gpu-check.sh, up to the point where a GPU is needed
// (`npm run test:gpu-check`, apart from the default suite: see jest.config.js).
// The Podman 5 bundle (what a GPU machine runs) must build under the 64 MiB a device call
// carries; the Podman 4 bundle (whose Podman runs on this machine's glibc) must build too, and
// its gpu-check.sh must start Podman's service from the folder, run a sandbox round trip
// through the provider, have the provider refuse CDI devices on Podman 4 with GPU_UNSUPPORTED
// (found from a fake CDI spec, exclusive allocation included), and stop before the GPU step
// with exit code 3, leaving no sandbox and no CDI spec behind.

import { spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

const ROOT = join(__dirname, '..')
const LIMIT = 64 * 1024 * 1024
const work = mkdtempSync(join(tmpdir(), 'gpu-check-'))
const bundles: string[] = []

afterAll(() => {
  rmSync(work, { recursive: true, force: true })
  for (const b of bundles) rmSync(b, { recursive: true, force: true })
})

function bundle(podman: '4' | '5'): { dir: string; size: number } {
  const dir = join(ROOT, 'target', `gpu-bundle-test-${podman}`)
  bundles.push(dir)
  const r = spawnSync('bash', [join(ROOT, 'scripts', 'build', 'gpu-bundle.sh'), '--podman', podman, dir], {
    encoding: 'utf8',
    timeout: 240_000,
  })
  if (r.status !== 0) throw new Error(`gpu-bundle.sh --podman ${podman} exited ${r.status}: ${r.stderr}`)
  const size = Number(r.stdout.trim().split('\n').pop())
  console.log(`gpu bundle with Podman ${podman}: ${(size / 1024 / 1024).toFixed(1)} MiB`)
  return { dir, size }
}

test('the Podman 5 bundle (for GPU machines) holds everything and stays under 64 MiB', () => {
  const { dir, size } = bundle('5')
  expect(size).toBeGreaterThan(10 * 1024 * 1024)
  expect(size).toBeLessThan(LIMIT)
  const debs = readdirSync(join(dir, 'debs'))
  expect(debs.some((d) => d.startsWith('podman_5.'))).toBe(true)
  for (const f of [
    'gpu-check.sh',
    'gpu-smoke.js',
    'rootfs.tar.gz',
    'bench/bandwidth',
    'bench/bandwidth.c',
    'pkg/index.js',
    'pkg/package.json',
  ]) {
    expect(existsSync(join(dir, f))).toBe(true)
  }
  expect(readdirSync(join(dir, 'pkg')).some((f) => f.endsWith('.node'))).toBe(true)
})

test('--node-only: node for a machine without one, in a folder of its own under 64 MiB, that unpacks and runs', () => {
  const dir = join(ROOT, 'target', 'gpu-node-test')
  bundles.push(dir)
  const r = spawnSync('bash', [join(ROOT, 'scripts', 'build', 'gpu-bundle.sh'), '--node-only', dir], {
    encoding: 'utf8',
    timeout: 240_000,
  })
  expect(r.status).toBe(0)
  const size = Number(r.stdout.trim().split('\n').pop())
  console.log(`node folder: ${(size / 1024 / 1024).toFixed(1)} MiB`)
  expect(size).toBeLessThan(LIMIT)
  const u = spawnSync('bash', [join(dir, 'unpack.sh')], { encoding: 'utf8', timeout: 120_000 })
  expect(u.status).toBe(0)
  expect(u.stdout.trim()).toBe(process.version)
  rmSync('/tmp/trueforge-gpu-node', { recursive: true, force: true })
})

const noGpu = !existsSync('/dev/nvidiactl')
;(noGpu ? test : test.skip)(
  'the Podman 4 bundle: gpu-check.sh runs Podman from the folder and the provider through it, then stops before the GPU step',
  () => {
    const { dir, size } = bundle('4')
    expect(size).toBeLessThan(LIMIT)
    const r = spawnSync('bash', [join(dir, 'gpu-check.sh')], {
      encoding: 'utf8',
      timeout: 240_000,
      env: { ...process.env, GPU_CHECK_WORK: join(work, 'podman4') },
    })
    const out = `${r.stdout}\n${r.stderr}`
    if (r.status !== 3) console.log(out)
    expect(out).toMatch(/podman 4\.3\.\d+; importing the image/)
    expect(out).toMatch(/^ok {3}exec in a sandbox: "hello from Linux/m)
    expect(out).toMatch(/^ok {3}upload then download returns the same bytes/m)
    expect(out).toMatch(/^ok {3}Podman 4\.3\.\d+: gpus "trueforge\.test\/gpu=all" is refused with GPU_UNSUPPORTED/m)
    expect(out).toMatch(
      /^ok {3}Podman 4\.3\.\d+: gpus \{"count":1,"exclusive":true\} is refused with GPU_UNSUPPORTED .*trueforge\.test\/gpu=0/m,
    )
    expect(out).not.toMatch(/^FAIL/m)
    expect(out).toMatch(/no NVIDIA GPU here: stopping before the GPU step/)
    expect(r.status).toBe(3)
    // Nothing left: no CDI spec, no sandbox in the bundle's Podman.
    expect(existsSync('/var/run/cdi/trueforge-gpu-check-fake.json')).toBe(false)
    const w = join(work, 'podman4')
    const ps = spawnSync(
      join(w, 'podman', 'usr', 'bin', 'podman'),
      [
        '--root',
        join(w, 'storage'),
        '--runroot',
        join(w, 'run'),
        'ps',
        '-aq',
        '--filter',
        'label=trueforge.sandbox.namespace=gpu-check',
      ],
      {
        encoding: 'utf8',
        env: {
          ...process.env,
          LD_LIBRARY_PATH: `${join(w, 'podman', 'usr', 'lib', 'x86_64-linux-gnu')}:${join(w, 'podman', 'lib', 'x86_64-linux-gnu')}`,
          CONTAINERS_CONF: join(w, 'containers.conf'),
          CONTAINERS_STORAGE_CONF: join(w, 'storage.conf'),
        },
      },
    )
    expect(ps.status).toBe(0)
    expect(ps.stdout.trim()).toBe('')
  },
)
