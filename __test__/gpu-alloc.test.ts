// GPUs without a GPU: exclusive allocation, device requests, the environment and the typed
// errors, end to end on a real engine. scripts/engines/gpu-engine.sh runs a second dockerd with a
// do-nothing `nvidia-container-runtime-hook` on its PATH, so it accepts NVIDIA device requests
// and hands containers fake GPU ids; the allocation (labels, lock, held set) is all real.
// The main engine (no hook) shows the refusals: no NVIDIA driver, no CDI.

import { execFileSync, spawn } from 'node:child_process'
import { writeFileSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import { DockerSandboxProvider, SandboxGpuError } from '..'
import { BUSYBOX, containersInNamespace, LABEL_NAMESPACE, ok, rejection, sleep, uniqueNamespace } from './helpers'

const ROOT = join(__dirname, '..')
const ENGINE = join(ROOT, 'scripts', 'engines', 'gpu-engine.sh')
const HOST = 'unix:///var/run/docker-gpu.sock'
const LABEL_GPUS = 'trueforge.sandbox.gpus'
const FAKE_SMI_IMAGE = 'trueforge-test-fake-nvidia-smi:1'

let startedHere = false

function engineCli(args: string[], input?: string): string {
  return execFileSync('docker', ['-H', HOST, ...args], {
    input,
    encoding: 'utf8',
    stdio: ['pipe', 'pipe', 'pipe'],
    timeout: 60_000,
  }).trim()
}

function inspect(nameOrId: string): any {
  return JSON.parse(engineCli(['inspect', '--type', 'container', nameOrId]))[0]
}

function containerOf(ns: string, sandboxId: string): any {
  const id = engineCli([
    'ps',
    '-aq',
    '--filter',
    `label=${LABEL_NAMESPACE}=${ns}`,
    '--filter',
    `label=trueforge.sandbox.id=${sandboxId}`,
  ])
  expect(id).not.toBe('')
  return inspect(id)
}

function gpusOf(ns: string, sandboxId: string): string[] {
  return containerOf(ns, sandboxId).Config.Labels[LABEL_GPUS].split(',')
}

function cleanup(ns: string): void {
  try {
    const ids = engineCli(['ps', '-aq', '--filter', `label=${LABEL_NAMESPACE}=${ns}`])
      .split('\n')
      .filter(Boolean)
    if (ids.length > 0) engineCli(['rm', '-f', '-v', ...ids])
  } catch (e) {
    console.warn(`cleanup of ${ns} on the GPU test engine failed: ${(e as Error).message}`)
  }
}

const namespaces: string[] = []
function ns(prefix: string): string {
  const n = uniqueNamespace(prefix)
  namespaces.push(n)
  return n
}

function provider(namespace: string, extra: Record<string, unknown>) {
  return new DockerSandboxProvider({
    image: BUSYBOX,
    dockerHost: HOST,
    namespace,
    network: 'none',
    autoStopIntervalInMinutes: 0,
    ...extra,
  })
}

const exclusive = (count: number) => ({ count, exclusive: true })

beforeAll(() => {
  startedHere = (() => {
    try {
      execFileSync('bash', [ENGINE, 'status'], { stdio: 'pipe' })
      return false
    } catch {
      return true
    }
  })()
  execFileSync('bash', [ENGINE, 'start'], { stdio: 'inherit', timeout: 120_000 })
}, 180_000)

afterAll(() => {
  for (const n of namespaces) cleanup(n)
  try {
    engineCli(['rm', '-f', 'trueforge-test-fake-smi-build'])
  } catch {
    // not there
  }
  // No allocation lock may be left behind by a finished create.
  const locks = engineCli(['ps', '-aq', '--filter', 'name=trueforge-gpu-lock'])
  if (startedHere) execFileSync('bash', [ENGINE, 'teardown'], { stdio: 'inherit', timeout: 120_000 })
  expect(locks).toBe('')
}, 180_000)

describe('exclusive GPUs on an engine with the NVIDIA device driver (stand-in hook)', () => {
  test('a sandbox gets its GPUs as device requests, a label, NVIDIA_* and TRUEFORGE_GPUS', async () => {
    const n = ns('t-gpu-req')
    const p = provider(n, { gpus: exclusive(2), gpuDevices: ['0', '1', '2'] })
    const { sandboxId } = await p.createSandbox()
    const info = containerOf(n, sandboxId)
    const gpus = info.Config.Labels[LABEL_GPUS].split(',')
    expect(gpus).toEqual(['0', '1'])
    expect(info.HostConfig.DeviceRequests).toEqual([
      expect.objectContaining({ DeviceIDs: ['0', '1'], Capabilities: [['gpu']] }),
    ])
    expect(info.Config.Env).toEqual(
      expect.arrayContaining([
        'NVIDIA_VISIBLE_DEVICES=0,1',
        'NVIDIA_DRIVER_CAPABILITIES=compute,utility',
        'TRUEFORGE_GPUS=0,1',
      ]),
    )
    // Commands see them; so does PID 1, where the engine's NVIDIA driver put its own value.
    const seen = await ok(
      p,
      sandboxId,
      `echo "$NVIDIA_VISIBLE_DEVICES|$TRUEFORGE_GPUS|$NVIDIA_DRIVER_CAPABILITIES"; tr '\\0' '\\n' < /proc/1/environ | grep '^NVIDIA_VISIBLE_DEVICES=' | tail -n 1`,
    )
    expect(seen.trim().split('\n')).toEqual(['0,1|0,1|compute,utility', 'NVIDIA_VISIBLE_DEVICES=0,1'])
    expect(p.getAdditionalInstructions()).toMatch(/yours alone.*\$TRUEFORGE_GPUS/s)
    // A second sandbox gets the one GPU left only if it asks for one: two are not free.
    const e = await rejection(p.createSandbox())
    expect(e).toBeInstanceOf(SandboxGpuError)
    expect(e.code).toBe('GPUS_UNAVAILABLE')
    expect(e.holders).toEqual([sandboxId])
    await p.removeSandbox(sandboxId)
    p.dispose()
  })

  test('20 concurrent creates from two processes on 16 GPUs: 16 disjoint sandboxes, 4 typed 503s naming the holders', async () => {
    const n = ns('t-gpu-race')
    const devices = Array.from({ length: 16 }, (_, i) => `GPU-fake-${String(i).padStart(2, '0')}`)
    const options = {
      image: BUSYBOX,
      dockerHost: HOST,
      namespace: n,
      network: 'none',
      autoStopIntervalInMinutes: 0,
      gpus: exclusive(1),
      gpuDevices: devices,
    }
    const startAt = Date.now() + 2500
    const child = spawn(
      process.execPath,
      [join(__dirname, 'gpu-child.js'), JSON.stringify({ options, count: 10, startAt })],
      {
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    )
    let childOut = ''
    child.stdout.on('data', (d) => (childOut += d))
    const childDone = new Promise<number>((r) => child.on('exit', (code) => r(code ?? -1)))
    const p = provider(n, { gpus: exclusive(1), gpuDevices: devices })
    await sleep(Math.max(0, startAt - Date.now()))
    const mine = await Promise.all(
      Array.from({ length: 10 }, () =>
        p.createSandbox().then(
          ({ sandboxId }) => ({ sandboxId }) as any,
          (e: any) => ({
            name: e.name,
            code: e.code,
            statusCode: e.statusCode,
            holders: e.holders,
            message: e.message,
            isGpuError: e instanceof SandboxGpuError,
          }),
        ),
      ),
    )
    expect(await childDone).toBe(0)
    const theirs = JSON.parse(childOut.trim().split('\n').pop() as string)
    const all = [...mine, ...theirs]
    const created = all.filter((r) => r.sandboxId).map((r) => r.sandboxId as string)
    const failed = all.filter((r) => !r.sandboxId)
    console.log(
      `gpu race: ${created.length} created (${mine.filter((r) => r.sandboxId).length} here, ${theirs.filter((r: any) => r.sandboxId).length} in the child), ${failed.length} refused`,
    )
    expect(created.length).toBe(16)
    expect(failed.length).toBe(4)
    for (const f of failed) {
      expect(f).toEqual(expect.objectContaining({ name: 'SandboxGpuError', code: 'GPUS_UNAVAILABLE', statusCode: 503 }))
      expect(f.holders.length).toBe(16)
      for (const h of f.holders) expect(created).toContain(h)
      expect(f.message).toMatch(/needs 1 of 16/)
    }
    expect(mine.filter((r) => !r.sandboxId).every((r) => r.isGpuError)).toBe(true)
    const held = created.map((id) => gpusOf(n, id))
    for (const g of held) expect(g.length).toBe(1)
    expect(new Set(held.flat()).size).toBe(16)
    expect(new Set(held.flat())).toEqual(new Set(devices))
    // Each container was given exactly the GPU its label records.
    for (const id of created) {
      const info = containerOf(n, id)
      expect(info.HostConfig.DeviceRequests[0].DeviceIDs).toEqual(info.Config.Labels[LABEL_GPUS].split(','))
      expect(info.State.Running).toBe(true)
    }
    p.dispose()
    cleanup(n)
  }, 180_000)

  test('a stopped sandbox releases its GPU; restarting re-claims it, or says who holds it', async () => {
    const n = ns('t-gpu-stop')
    const p = provider(n, { gpus: exclusive(1), gpuDevices: ['0', '1'] })
    const a = (await p.createSandbox()).sandboxId
    const b = (await p.createSandbox()).sandboxId
    expect(gpusOf(n, a)).toEqual(['0'])
    expect(gpusOf(n, b)).toEqual(['1'])
    const none = await rejection(p.createSandbox())
    expect(none.code).toBe('GPUS_UNAVAILABLE')
    expect(none.statusCode).toBe(503)
    expect([...none.holders].sort()).toEqual([a, b].sort())
    expect(none.message).toContain(`GPU 0 is held by ${a}`)
    expect(none.message).toContain(`GPU 1 is held by ${b}`)

    engineCli(['stop', '-t', '1', containerOf(n, a).Id])
    const c = (await p.createSandbox()).sandboxId
    expect(gpusOf(n, c)).toEqual(['0'])

    // A's GPU is C's now: A does not start, and the caller is told who holds it.
    const r = (await p.exec({ sandboxId: a, command: 'echo up' })) as any
    expect(r.success).toBe(false)
    expect(r.error).toContain(`GPU 0 is held by ${c}`)
    expect(containerOf(n, a).State.Running).toBe(false)

    // Once C stops, A starts again with its GPU.
    engineCli(['stop', '-t', '1', containerOf(n, c).Id])
    expect((await ok(p, a, 'echo "$NVIDIA_VISIBLE_DEVICES"')).trim()).toBe('0')
    expect(containerOf(n, a).State.Running).toBe(true)
    // And C, stopped, cannot come back while A runs.
    const rc = (await p.exec({ sandboxId: c, command: 'true' })) as any
    expect(rc.success).toBe(false)
    expect(rc.error).toContain(`GPU 0 is held by ${a}`)
    p.dispose()
    cleanup(n)
  }, 120_000)

  function containersOf(n: string, sandboxId: string): string[] {
    return engineCli([
      'ps',
      '-aq',
      '--filter',
      `label=${LABEL_NAMESPACE}=${n}`,
      '--filter',
      `label=trueforge.sandbox.id=${sandboxId}`,
    ])
      .split('\n')
      .filter(Boolean)
  }

  function engineHas(kind: 'image' | 'volume', name: string): boolean {
    try {
      engineCli([kind, 'inspect', name])
      return true
    } catch {
      return false
    }
  }

  function execInChild(options: Record<string, unknown>, exec: Record<string, unknown>): any {
    const out = execFileSync(process.execPath, [join(__dirname, 'gpu-child.js'), JSON.stringify({ options, exec })], {
      encoding: 'utf8',
      timeout: 120_000,
    })
    return JSON.parse(out.trim().split('\n').pop() as string)
  }

  test('a restart whose GPU was taken moves the sandbox to a free one with its files; a process holding the old container follows; removal leaves nothing', async () => {
    const n = ns('t-gpu-move')
    // GPU ids of its own: the allocation is engine-wide, and another test's leftovers must not count.
    const extra = { gpus: exclusive(1), gpuDevices: ['m0', 'm1'] }
    const p = provider(n, extra)
    const a = (await p.createSandbox()).sandboxId
    expect(gpusOf(n, a)).toEqual(['m0'])
    await ok(p, a, 'echo kept > a.txt && mkdir -p deep/er && echo deeper > deep/er/b.txt')
    await p.uploadFile({ sandboxId: a, remotePath: 'up.txt', content: Buffer.from('uploaded\n') })
    const before = containerOf(n, a)
    engineCli(['stop', '-t', '1', before.Id])
    const c = (await p.createSandbox()).sandboxId
    expect(gpusOf(n, c)).toEqual(['m0'])

    // Another server process runs A's next command: GPU m0 is C's, so A moves to GPU m1.
    const options = {
      image: BUSYBOX,
      dockerHost: HOST,
      namespace: n,
      network: 'none',
      autoStopIntervalInMinutes: 0,
      ...extra,
    }
    const r = execInChild(options, {
      sandboxId: a,
      command: 'cat a.txt deep/er/b.txt up.txt; echo "$NVIDIA_VISIBLE_DEVICES $TRUEFORGE_GPUS"',
    })
    expect(r).toEqual({ success: true, response: { exitCode: 0, result: 'kept\ndeeper\nuploaded\nm1 m1\n' } })
    expect(containersOf(n, a)).toHaveLength(1)
    const after = containerOf(n, a)
    expect(after.Id).not.toBe(before.Id)
    expect(after.Name).toBe(before.Name)
    expect(after.State.Running).toBe(true)
    expect(after.Config.Labels[LABEL_GPUS]).toBe('m1')
    expect(after.HostConfig.DeviceRequests[0].DeviceIDs).toEqual(['m1'])
    const saved = after.Config.Labels['trueforge.sandbox.saved-image']
    expect(after.Image).toBe(saved)
    // The rest of the definition is A's own.
    expect(after.HostConfig.PidsLimit).toBe(before.HostConfig.PidsLimit)
    expect(after.HostConfig.CapDrop).toEqual(before.HostConfig.CapDrop)
    expect(after.Config.WorkingDir).toBe(before.Config.WorkingDir)
    expect(after.Config.Entrypoint).toEqual(before.Config.Entrypoint)

    // This process still has the old container cached: a write, a read and a command follow.
    await p.uploadFile({ sandboxId: a, remotePath: 'later.txt', content: Buffer.from('later\n') })
    expect((await p.downloadFile({ sandboxId: a, path: 'a.txt' })).toString()).toBe('kept\n')
    expect(await ok(p, a, 'cat later.txt')).toBe('later\n')

    // With both GPUs held, a stopped sandbox has nowhere to go: a typed error naming the holders.
    engineCli(['stop', '-t', '1', containerOf(n, c).Id])
    const d = (await p.createSandbox()).sandboxId
    expect(gpusOf(n, d)).toEqual(['m0'])
    const rc = (await p.exec({ sandboxId: c, command: 'true' })) as any
    expect(rc.success).toBe(false)
    expect(rc.error).toContain(`GPU m0 is held by ${d}`)
    expect(rc.error).toContain(`GPU m1 is held by ${a}`)
    expect(containersOf(n, c)).toHaveLength(1)

    expect(await p.removeSandbox(a)).toBe(true)
    expect(containersOf(n, a)).toEqual([])
    expect(engineHas('image', saved)).toBe(false)
    expect(engineCli(['ps', '-aq', '--filter', `name=${before.Name.slice(1)}`])).toBe('')
    p.dispose()
    cleanup(n)
  }, 180_000)

  test('a read-only-root sandbox moves with its volumes (sandbox root and layout), and its volumes go with it', async () => {
    const n = ns('t-gpu-move-ro')
    const p = provider(n, { gpus: exclusive(1), gpuDevices: ['r0', 'r1'], readOnlyRootfs: true })
    const a = (await p.createSandbox()).sandboxId
    await ok(p, a, 'echo kept > a.txt')
    await p.uploadFile({ sandboxId: a, remotePath: `${p.getFileUploadsDir(a)}/u.txt`, content: Buffer.from('up\n') })
    const before = containerOf(n, a)
    const mounted = (before.Mounts as any[]).filter((m) => m.Type === 'volume').map((m) => m.Name as string)
    // The sandbox's own volumes; the agent's volume is every sandbox's, mounted but never carried.
    const agentVolume = mounted.filter((v) => v.startsWith('trueforge-agent-'))
    const volumes = mounted.filter((v) => !v.startsWith('trueforge-agent-'))
    expect(volumes.length).toBeGreaterThanOrEqual(2)
    expect(agentVolume).toHaveLength(1)
    engineCli(['stop', '-t', '1', before.Id])
    const b = (await p.createSandbox()).sandboxId
    expect(gpusOf(n, b)).toEqual(['r0'])
    expect(await ok(p, a, `cat a.txt ${p.getFileUploadsDir(a)}/u.txt; echo $NVIDIA_VISIBLE_DEVICES`)).toBe(
      'kept\nup\nr1\n',
    )
    const after = containerOf(n, a)
    expect(after.Id).not.toBe(before.Id)
    expect(after.HostConfig.ReadonlyRootfs).toBe(true)
    // The same volumes, and no new ones.
    const volumesOf = (c: any) =>
      (c.Mounts as any[])
        .filter((m) => m.Type === 'volume')
        .map((m) => m.Name as string)
        .sort()
    expect(volumesOf(after)).toEqual([...mounted].sort())
    // A second move carries them again (and still names them all for removal).
    engineCli(['stop', '-t', '1', after.Id])
    const c = (await p.createSandbox()).sandboxId
    expect(gpusOf(n, c)).toEqual(['r1'])
    engineCli(['stop', '-t', '1', containerOf(n, b).Id])
    expect(await ok(p, a, `cat a.txt; echo $NVIDIA_VISIBLE_DEVICES`)).toBe('kept\nr0\n')
    const again = containerOf(n, a)
    expect(again.Id).not.toBe(after.Id)
    expect(volumesOf(again)).toEqual([...mounted].sort())
    expect(again.Config.Labels['trueforge.sandbox.carried-volumes'].split(',').sort()).toEqual([...volumes].sort())
    expect(await p.removeSandbox(a)).toBe(true)
    for (const v of volumes) expect(engineHas('volume', v)).toBe(false)
    expect(engineHas('volume', agentVolume[0])).toBe(true)
    p.dispose()
    cleanup(n)
  }, 180_000)

  test('three processes restarting one sandbox whose GPU was taken at once: one move, every command runs, one container and one saved image', async () => {
    const n = ns('t-gpu-move-race')
    const extra = { gpus: exclusive(1), gpuDevices: ['k0', 'k1'] }
    const p = provider(n, extra)
    const a = (await p.createSandbox()).sandboxId
    await ok(p, a, 'echo kept > a.txt')
    const before = containerOf(n, a)
    engineCli(['stop', '-t', '1', before.Id])
    expect(gpusOf(n, (await p.createSandbox()).sandboxId)).toEqual(['k0'])
    const options = {
      image: BUSYBOX,
      dockerHost: HOST,
      namespace: n,
      network: 'none',
      autoStopIntervalInMinutes: 0,
      ...extra,
    }
    const child = () =>
      new Promise<any>((resolve, reject) => {
        const c = spawn(
          process.execPath,
          [
            join(__dirname, 'gpu-child.js'),
            JSON.stringify({ options, exec: { sandboxId: a, command: 'cat a.txt; echo $TRUEFORGE_GPUS' } }),
          ],
          {
            stdio: ['ignore', 'pipe', 'inherit'],
          },
        )
        let out = ''
        c.stdout.on('data', (d) => (out += d))
        c.on('exit', (code) =>
          code === 0
            ? resolve(JSON.parse(out.trim().split('\n').pop() as string))
            : reject(new Error(`child exited ${code}: ${out}`)),
        )
      })
    const results = await Promise.all([
      child(),
      child(),
      p.exec({ sandboxId: a, command: 'cat a.txt; echo $TRUEFORGE_GPUS' }),
    ])
    for (const r of results) expect(r).toEqual({ success: true, response: { exitCode: 0, result: 'kept\nk1\n' } })
    expect(containersOf(n, a)).toHaveLength(1)
    expect(containerOf(n, a).Id).not.toBe(before.Id)
    expect(engineCli(['ps', '-aq', '--filter', `name=${before.Name.slice(1)}.`])).toBe('')
    // Only the save in use is left: a process that lost the race removed its own.
    const saves = engineCli(['images', '-q', '--no-trunc', '--filter', `label=trueforge.sandbox.saved-from=${a}`])
      .split('\n')
      .filter(Boolean)
    expect(saves).toEqual([containerOf(n, a).Image])
    p.dispose()
    cleanup(n)
  }, 180_000)

  test('a move that died between its renames is repaired by the next lookup: the set-aside container gets its name back', async () => {
    const n = ns('t-gpu-move-died')
    const p = provider(n, { gpus: exclusive(1), gpuDevices: ['x0'] })
    const a = (await p.createSandbox()).sandboxId
    await ok(p, a, 'echo kept > a.txt')
    const before = containerOf(n, a)
    engineCli(['stop', '-t', '1', before.Id])
    // What a process killed after setting the old container aside leaves behind.
    engineCli(['rename', before.Id, `${before.Name.slice(1)}.gpu-moved`])
    // A process that has not seen the sandbox looks it up by name (this one has it cached by id).
    const options = {
      image: BUSYBOX,
      dockerHost: HOST,
      namespace: n,
      network: 'none',
      autoStopIntervalInMinutes: 0,
      gpus: exclusive(1),
      gpuDevices: ['x0'],
    }
    const r = execInChild(options, { sandboxId: a, command: 'cat a.txt' })
    expect(r).toEqual({ success: true, response: { exitCode: 0, result: 'kept\n' } })
    expect(containerOf(n, a).Id).toBe(before.Id)
    expect(containerOf(n, a).Name).toBe(before.Name)
    p.dispose()
    cleanup(n)
  }, 120_000)

  test('removing an exclusive sandbox also removes what a move left under its name, so no lookup brings it back', async () => {
    const n = ns('t-gpu-move-left')
    const p = provider(n, { gpus: exclusive(1), gpuDevices: ['l0'] })
    const a = (await p.createSandbox()).sandboxId
    const info = containerOf(n, a)
    const name = info.Name.slice(1)
    // What a move whose old container could not be removed leaves: a stopped copy set aside.
    const labels = Object.entries(info.Config.Labels as Record<string, string>).flatMap(([k, v]) => [
      '--label',
      `${k}=${v}`,
    ])
    engineCli(['create', '--name', `${name}.gpu-moved`, ...labels, BUSYBOX, 'true'])
    expect(containersOf(n, a)).toHaveLength(2)
    expect(await p.removeSandbox(a)).toBe(true)
    expect(containersOf(n, a)).toEqual([])
    expect(await p.removeSandbox(a)).toBe(false)
    p.dispose()
    cleanup(n)
  }, 120_000)

  test('gpuWaitMs: a create waits for a GPU to free up', async () => {
    const n = ns('t-gpu-wait')
    const p = provider(n, { gpus: exclusive(1), gpuDevices: ['7'], gpuWaitMs: 30_000 })
    const a = (await p.createSandbox()).sandboxId
    const started = Date.now()
    const pending = p.createSandbox()
    await sleep(2000)
    engineCli(['stop', '-t', '1', containerOf(n, a).Id])
    const b = (await pending).sandboxId
    const waited = Date.now() - started
    expect(waited).toBeGreaterThanOrEqual(2000)
    expect(gpusOf(n, b)).toEqual(['7'])
    // Without a wait, the refusal is immediate.
    const quick = provider(n, { gpus: exclusive(1), gpuDevices: ['7'] })
    const t = Date.now()
    expect((await rejection(quick.createSandbox())).holders).toEqual([b])
    expect(Date.now() - t).toBeLessThan(10_000)
    p.dispose()
    quick.dispose()
    cleanup(n)
  }, 120_000)

  test('a foreign container holding the lock name is never removed: creates fail saying so', async () => {
    const n = ns('t-gpu-foreign')
    engineCli(['create', '--name', 'trueforge-gpu-lock', '--label', `${LABEL_NAMESPACE}=${n}`, BUSYBOX, 'true'])
    try {
      const p = provider(n, { gpus: exclusive(1), gpuDevices: ['0'] })
      const e = await rejection(p.createSandbox())
      expect(e.message).toMatch(/trueforge-gpu-lock that is not our GPU allocation lock/)
      expect(engineCli(['ps', '-aq', '--filter', 'name=trueforge-gpu-lock'])).not.toBe('')
      p.dispose()
    } finally {
      engineCli(['rm', '-f', 'trueforge-gpu-lock'])
    }
  })

  test("the allocation lock: a dead holder's is broken, a live holder's is waited for", async () => {
    const n = ns('t-gpu-lock')
    // GPU ids of its own: GPUs held are engine-wide, and other tests' sandboxes still run.
    const p = provider(n, { gpus: exclusive(1), gpuDevices: ['lock-0', 'lock-1'] })
    const fakeLock = (atMs: number) =>
      engineCli([
        'create',
        '--name',
        'trueforge-gpu-lock',
        '--label',
        'trueforge.sandbox.managed-by=trueforge-docker-sandbox',
        '--label',
        'trueforge.sandbox.gpu-lock=test:1',
        '--label',
        `trueforge.sandbox.gpu-lock-at=${atMs}`,
        '--label',
        `${LABEL_NAMESPACE}=${n}`,
        BUSYBOX,
        'true',
      ])
    try {
      // Taken a minute ago by a process that died: broken at once.
      const dead = fakeLock(Date.now() - 60_000)
      const t0 = Date.now()
      const a = (await p.createSandbox()).sandboxId
      expect(Date.now() - t0).toBeLessThan(10_000)
      expect(gpusOf(n, a)).toEqual(['lock-0'])
      expect(engineCli(['ps', '-aq', '--no-trunc', '--filter', 'name=trueforge-gpu-lock'])).not.toContain(dead)
      // Held now: the create waits until the holder lets go.
      fakeLock(Date.now())
      const t1 = Date.now()
      const pending = p.createSandbox()
      await sleep(1500)
      engineCli(['rm', '-f', 'trueforge-gpu-lock'])
      const b = (await pending).sandboxId
      expect(Date.now() - t1).toBeGreaterThanOrEqual(1500)
      expect(gpusOf(n, b)).toEqual(['lock-1'])
    } finally {
      dockerTryGpu(['rm', '-f', 'trueforge-gpu-lock'])
      p.dispose()
    }
  })

  test('with no gpuDevices, GPUs are discovered with nvidia-smi -L; none found is a typed error naming the option', async () => {
    const n = ns('t-gpu-disc')
    // busybox has no nvidia-smi: nothing is found.
    const bare = provider(n, { gpus: exclusive(1) })
    const e = await rejection(bare.createSandbox())
    expect(e).toBeInstanceOf(SandboxGpuError)
    expect(e.code).toBe('GPU_UNSUPPORTED')
    expect(e.message).toContain('gpuDevices')
    expect(containersInNamespaceOnGpuEngine(n)).toEqual([])
    // An image whose nvidia-smi lists two GPUs: those are handed out.
    const dir = mkdtempSync(join(tmpdir(), 'fake-smi-'))
    try {
      writeFileSync(
        join(dir, 'nvidia-smi'),
        '#!/bin/sh\necho "GPU 0: Fake GPU (UUID: GPU-11111111-0000-0000-0000-000000000000)"\necho "GPU 1: Fake GPU (UUID: GPU-22222222-0000-0000-0000-000000000000)"\n',
        { mode: 0o755 },
      )
      engineCli(['create', '--name', 'trueforge-test-fake-smi-build', BUSYBOX, 'true'])
      engineCli(['cp', join(dir, 'nvidia-smi'), 'trueforge-test-fake-smi-build:/bin/nvidia-smi'])
      engineCli(['commit', 'trueforge-test-fake-smi-build', FAKE_SMI_IMAGE])
      engineCli(['rm', '-f', 'trueforge-test-fake-smi-build'])
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
    const found = provider(n, { image: FAKE_SMI_IMAGE, gpus: exclusive(1) })
    const a = (await found.createSandbox()).sandboxId
    const b = (await found.createSandbox()).sandboxId
    expect([gpusOf(n, a), gpusOf(n, b)]).toEqual([
      ['GPU-11111111-0000-0000-0000-000000000000'],
      ['GPU-22222222-0000-0000-0000-000000000000'],
    ])
    expect((await rejection(found.createSandbox())).code).toBe('GPUS_UNAVAILABLE')
    bare.dispose()
    found.dispose()
  }, 120_000)
})

function dockerTryGpu(args: string[]): void {
  try {
    engineCli(args)
  } catch {
    // already gone
  }
}

function containersInNamespaceOnGpuEngine(n: string): string[] {
  return engineCli(['ps', '-aq', '--filter', `label=${LABEL_NAMESPACE}=${n}`])
    .split('\n')
    .filter(Boolean)
}

describe('an engine that cannot give GPUs (the main engine: no NVIDIA driver, no CDI)', () => {
  const main = uniqueNamespace('t-gpu-none')
  afterAll(() => {
    for (const id of containersInNamespace(main)) execFileSync('docker', ['rm', '-f', '-v', id])
  })

  test.each([
    ["gpus: 'all'", 'all', /NVIDIA container toolkit/],
    ['a CDI name', 'nvidia.com/gpu=all', /CDI device\(s\) nvidia\.com\/gpu=all\. .*CDI enabled/s],
    ['CDI names', ['nvidia.com/gpu=0', 'nvidia.com/gpu=1'], /CDI.*nvidia\.com\/gpu=0, nvidia\.com\/gpu=1/s],
  ])(
    '%s: createSandbox() fails with GPU_UNSUPPORTED saying what to install, and leaves nothing',
    async (_, gpus, hint) => {
      const p = new DockerSandboxProvider({ image: BUSYBOX, namespace: main, gpus: gpus as any })
      const e = await rejection(p.createSandbox())
      expect(e).toBeInstanceOf(SandboxGpuError)
      expect(e.code).toBe('GPU_UNSUPPORTED')
      expect(e.statusCode).toBe(500)
      expect(e.message).toMatch(hint)
      expect(e.message).toMatch(/could not select device driver/)
      expect(containersInNamespace(main)).toEqual([])
      p.dispose()
    },
  )
})
