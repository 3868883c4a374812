// The bandwidth program of the GPU smoke test (bench/gpu/bandwidth.c), checked where there is no
// GPU: it compiles warning-free with `cc`; without a CUDA driver it says so, cleanly, in JSON and
// with its own exit code (with a driver it must measure); its PTX assembles for the GPU
// architectures we care about with NVIDIA's ptxas (scripts/ci/ensure-gpu-tools.sh fetches it; the
// driver checks the same PTX again on a GPU machine).

import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

const SOURCE = join(__dirname, '..', 'bench', 'gpu', 'bandwidth.c')
const PTXAS = process.env.PTXAS || '/opt/trueforge-ptxas/nvidia/cuda_nvcc/bin/ptxas'
const dir = mkdtempSync(join(tmpdir(), 'bandwidth-'))
const bin = join(dir, 'bandwidth')

afterAll(() => rmSync(dir, { recursive: true, force: true }))

function hasCudaDriver(): boolean {
  const r = spawnSync('sh', ['-c', 'ldconfig -p 2>/dev/null | grep -q "libcuda.so.1 "'])
  return r.status === 0
}

test('compiles with cc, no warnings, no CUDA headers', () => {
  execFileSync('cc', ['-O2', '-std=c11', '-Wall', '-Wextra', '-Werror', '-o', bin, SOURCE, '-ldl'], { stdio: 'pipe' })
  expect(existsSync(bin)).toBe(true)
})

test('without a CUDA driver it reports "no CUDA driver" and exits 2; with one it measures', () => {
  const r = spawnSync(bin, ['--iters', '2', '--reps', '2'], { encoding: 'utf8', timeout: 120_000 })
  const out = JSON.parse(r.stdout.trim())
  if (hasCudaDriver()) {
    expect(r.status).toBe(0)
    expect(out.gbps).toBeGreaterThan(0)
    console.log(`bandwidth here: ${out.gbps} GB/s on ${out.device}`)
  } else {
    expect(r.status).toBe(2)
    expect(out.error).toBe('no CUDA driver')
    expect(out.detail).toMatch(/libcuda\.so\.1/)
    expect(r.stderr).toMatch(/^bandwidth: no CUDA driver: /)
  }
})

test('bad arguments exit 64 with a usage line', () => {
  const r = spawnSync(bin, ['--frobnicate'], { encoding: 'utf8' })
  expect(r.status).toBe(64)
  expect(JSON.parse(r.stdout).detail).toMatch(/^usage: bandwidth/)
})

const ptxasThere = existsSync(PTXAS)
if (!ptxasThere)
  console.warn(`gpu-bandwidth.test.ts: ptxas check SKIPPED: no ${PTXAS} (run scripts/ci/ensure-gpu-tools.sh)`)
;(ptxasThere ? test : test.skip).each(['sm_50', 'sm_80', 'sm_89', 'sm_90'])(
  'its PTX assembles with ptxas for %s',
  (arch) => {
    const ptx = join(dir, 'copy.ptx')
    writeFileSync(ptx, execFileSync(bin, ['--ptx']))
    const r = spawnSync(PTXAS, [`-arch=${arch}`, '-v', ptx, '-o', join(dir, `copy-${arch}.cubin`)], {
      encoding: 'utf8',
    })
    expect(r.stderr).toMatch(/Function properties for copy16|Compiling entry function 'copy16'/)
    expect(r.status).toBe(0)
  },
)
