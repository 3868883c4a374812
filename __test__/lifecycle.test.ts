// Sandbox lifecycle: ids that outlive provider objects, stopped and removed containers,
// malformed ids, containers that are not ours, namespaces, and idempotent removal.

import { DockerSandboxProvider, SandboxNotAvailableError } from '..'
import {
  BUSYBOX,
  containerNameFor,
  docker,
  dockerTry,
  inspectContainer,
  LABEL_CREATED_AT,
  LABEL_ID,
  LABEL_MANAGED_BY,
  LABEL_NAMESPACE,
  LABEL_TEST_NAMESPACE,
  MANAGED_BY,
  ok,
  randomUlid,
  rejection,
  SandboxTracker,
  sleep,
  uniqueNamespace,
} from './helpers'

const namespace = uniqueNamespace('t-lifecycle')
const otherNamespace = uniqueNamespace('t-lifecycle-other')
const tracker = new SandboxTracker(namespace)
const otherTracker = new SandboxTracker(otherNamespace)
const provider = new DockerSandboxProvider({ image: BUSYBOX, namespace })
const otherProvider = new DockerSandboxProvider({ image: BUSYBOX, namespace: otherNamespace })

afterAll(async () => {
  await tracker.cleanup(provider)
  await otherTracker.cleanup(otherProvider)
})

/** The three calls the server retries on SandboxNotAvailableError, each asserted to reject so. */
async function expectNotAvailable(p: InstanceType<typeof DockerSandboxProvider>, sandboxId: string) {
  const calls: Array<[string, () => Promise<unknown>]> = [
    ['exec', () => p.exec({ sandboxId, command: 'echo ran > /tmp/ran' })],
    ['uploadFile', () => p.uploadFile({ sandboxId, remotePath: '/tmp/uploaded.txt', content: Buffer.from('x') })],
    ['downloadFile', () => p.downloadFile({ sandboxId, path: '/etc/hostname' })],
  ]
  for (const [name, call] of calls) {
    const e = await rejection(call())
    expect({ call: name, error: e?.name, id: e?.sandboxId }).toEqual({
      call: name,
      error: 'SandboxNotAvailableError',
      id: sandboxId,
    })
    expect(e).toBeInstanceOf(SandboxNotAvailableError)
    expect(e.statusCode).toBe(410)
    expect(e.code).toBe('SANDBOX_NOT_AVAILABLE')
  }
}

test('a new container carries our name and labels, and runs with an init', async () => {
  const before = Math.floor(Date.now() / 1000) - 2
  const id = await tracker.create(provider)
  const info = inspectContainer(containerNameFor(namespace, id))
  expect(info).not.toBeNull()
  expect(info.Name).toBe(`/${containerNameFor(namespace, id)}`)
  expect(info.State.Running).toBe(true)
  expect(info.HostConfig.Init).toBe(true)
  const labels = info.Config.Labels as Record<string, string>
  expect(labels[LABEL_MANAGED_BY]).toBe(MANAGED_BY)
  expect(labels[LABEL_NAMESPACE]).toBe(namespace)
  expect(labels[LABEL_ID]).toBe(id)
  expect(labels[LABEL_CREATED_AT]).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/)
  const created = Date.parse(labels[LABEL_CREATED_AT]) / 1000
  expect(created).toBeGreaterThanOrEqual(before)
  expect(created).toBeLessThanOrEqual(Date.now() / 1000 + 2)
})

test('concurrent createSandbox calls give distinct, working sandboxes', async () => {
  const ids = await Promise.all(Array.from({ length: 4 }, () => tracker.create(provider)))
  expect(new Set(ids).size).toBe(ids.length)
  const pwds = await Promise.all(ids.map((id) => ok(provider, id, 'pwd')))
  expect(pwds).toEqual(ids.map((id) => `${id}\n`))
  // Ids sort by creation time (ULIDs): a later one sorts after.
  const later = await tracker.create(provider)
  for (const id of ids) expect(later > id).toBe(true)
})

test('a sandbox created by one provider object works from a fresh one', async () => {
  const id = await tracker.create(provider)
  await ok(provider, id, 'echo from-first > f.txt')
  const fresh = new DockerSandboxProvider({ image: BUSYBOX, namespace })
  expect(await ok(fresh, id, 'cat f.txt')).toBe('from-first\n')
  const down = await fresh.downloadFile({ sandboxId: id, path: 'f.txt' })
  expect(down.toString()).toBe('from-first\n')
  await fresh.uploadFile({ sandboxId: id, remotePath: 'g.txt', content: Buffer.from('from-fresh') })
  expect(await ok(provider, id, 'cat g.txt')).toBe('from-fresh')
})

test('a stopped container is restarted transparently with its files kept', async () => {
  const id = await tracker.create(provider)
  const name = containerNameFor(namespace, id)
  await ok(provider, id, 'echo kept > kept.txt')
  docker(['stop', '-t', '1', name])
  expect(inspectContainer(name).State.Running).toBe(false)

  const out = await ok(provider, id, 'cat kept.txt && pwd')
  expect(out).toBe(`kept\n${id}\n`)
  expect(inspectContainer(name).State.Running).toBe(true)

  // Stopped again, then a download and an upload (not exec) as the first calls.
  docker(['stop', '-t', '1', name])
  const fresh = new DockerSandboxProvider({ image: BUSYBOX, namespace })
  expect((await fresh.downloadFile({ sandboxId: id, path: 'kept.txt' })).toString()).toBe('kept\n')
  await fresh.uploadFile({ sandboxId: id, remotePath: 'up.txt', content: Buffer.from('while stopped') })
  expect(await ok(fresh, id, 'cat up.txt kept.txt')).toBe('while stoppedkept\n')
})

// A rootless engine on cgroup v1 (scripts/engines/podman-rootless-engine.sh here) gives containers no
// cgroup, so nothing can pause them and there is nothing to unpause.
const rootlessOnCgroupV1 =
  (process.env.DOCKER_HOST ?? '').startsWith('unix:///run/user/') &&
  dockerTry(['info', '--format', '{{.CgroupVersion}}']).stdout === '1'

;(rootlessOnCgroupV1 ? test.skip : test)('a paused container is unpaused transparently', async () => {
  const id = await tracker.create(provider)
  const name = containerNameFor(namespace, id)
  await ok(provider, id, 'echo before-pause > p.txt')
  docker(['pause', name])
  expect(inspectContainer(name).State.Paused).toBe(true)
  expect(await ok(provider, id, 'cat p.txt')).toBe('before-pause\n')
  expect(inspectContainer(name).State.Paused).toBe(false)
})

test('concurrent execs on a stopped container all succeed (one start)', async () => {
  const id = await tracker.create(provider)
  const name = containerNameFor(namespace, id)
  docker(['stop', '-t', '1', name])
  const outs = await Promise.all(Array.from({ length: 6 }, (_, i) => ok(provider, id, `echo n${i}`)))
  expect(outs).toEqual(Array.from({ length: 6 }, (_, i) => `n${i}\n`))
})

test('a removed container is SandboxNotAvailableError for exec, upload and download', async () => {
  const id = await tracker.create(provider)
  await ok(provider, id, 'true') // warm the provider's cache for this id
  docker(['rm', '-f', containerNameFor(namespace, id)])
  await expectNotAvailable(provider, id)
  // A fresh provider (no cache) says the same.
  await expectNotAvailable(new DockerSandboxProvider({ image: BUSYBOX, namespace }), id)
})

test.each([
  '',
  'abc',
  '/workspace/xyz',
  '../etc',
  '/workspace/01arz3ndektsv4rrffq69g5fav',
  '/tmp/01ARZ3NDEKTSV4RRFFQ69G5FAV',
])('malformed id %j is SandboxNotAvailableError for exec, upload and download', async (id) => {
  await expectNotAvailable(provider, id)
})

describe('containers that are not ours', () => {
  const runningUlid = randomUlid()
  const stoppedUlid = randomUlid()
  const wrongIdUlid = randomUlid()
  const runningId = `/workspace/${runningUlid}`
  const stoppedId = `/workspace/${stoppedUlid}`
  const wrongIdId = `/workspace/${wrongIdUlid}`
  const runningName = containerNameFor(namespace, runningId)
  const stoppedName = containerNameFor(namespace, stoppedId)
  const wrongIdName = containerNameFor(namespace, wrongIdId)
  const snapshot = (name: string) => {
    const i = inspectContainer(name)
    return {
      id: i.Id,
      status: i.State.Status,
      running: i.State.Running,
      startedAt: i.State.StartedAt,
      finishedAt: i.State.FinishedAt,
      restartCount: i.RestartCount,
      execIds: i.ExecIDs ?? [],
    }
  }
  let before: Record<string, ReturnType<typeof snapshot>>

  beforeAll(() => {
    const common = ['--label', `${LABEL_TEST_NAMESPACE}=${namespace}`, '--init']
    // Named exactly as ours would be, but without our labels: one running, one stopped.
    docker(['run', '-d', '--name', runningName, ...common, BUSYBOX, 'sh', '-c', 'sleep 3600'])
    docker(['run', '-d', '--name', stoppedName, ...common, BUSYBOX, 'sh', '-c', 'sleep 3600'])
    docker(['stop', '-t', '1', stoppedName])
    // Ours in every label but the id: still not ours for this id.
    docker([
      'run',
      '-d',
      '--name',
      wrongIdName,
      ...common,
      '--label',
      `${LABEL_MANAGED_BY}=${MANAGED_BY}`,
      '--label',
      `${LABEL_NAMESPACE}=${namespace}`,
      '--label',
      `${LABEL_ID}=/workspace/${randomUlid()}`,
      BUSYBOX,
      'sh',
      '-c',
      'sleep 3600',
    ])
    before = {
      [runningName]: snapshot(runningName),
      [stoppedName]: snapshot(stoppedName),
      [wrongIdName]: snapshot(wrongIdName),
    }
  })

  afterAll(() => {
    dockerTry(['rm', '-f', runningName, stoppedName, wrongIdName])
  })

  test('every call into them is SandboxNotAvailableError', async () => {
    for (const id of [runningId, stoppedId, wrongIdId]) await expectNotAvailable(provider, id)
  })

  test('and they are left untouched: no exec, no start, no file, not removed', async () => {
    await expectNotAvailable(provider, runningId)
    await expectNotAvailable(provider, stoppedId)
    await expectNotAvailable(provider, wrongIdId)
    expect(await provider.removeSandbox(runningId)).toBe(false)
    expect(await provider.removeSandbox(stoppedId)).toBe(false)
    expect(await provider.removeSandbox(wrongIdId)).toBe(false)
    await sleep(200)
    for (const name of [runningName, stoppedName, wrongIdName]) {
      const now = snapshot(name)
      expect({ name, ...now }).toEqual({ name, ...before[name] })
      expect(now.execIds).toEqual([])
    }
    expect(before[stoppedName].running).toBe(false)
    expect(before[runningName].running).toBe(true)
    // Nothing was written into the running one's file system.
    const diff = docker(['diff', runningName])
    expect(diff).not.toContain('uploaded.txt')
    expect(diff).not.toContain('/workspace')
    expect(diff).not.toContain('/trueforge')
  })
})

test('a sandbox of another namespace is not reachable, nor removable, from this one', async () => {
  const id = await otherTracker.create(otherProvider)
  await ok(otherProvider, id, 'echo mine > mine.txt')
  await expectNotAvailable(provider, id)
  expect(await provider.removeSandbox(id)).toBe(false)
  const info = inspectContainer(containerNameFor(otherNamespace, id))
  expect(info?.State.Running).toBe(true)
  expect(await ok(otherProvider, id, 'cat mine.txt')).toBe('mine\n')
})

test('removeSandbox is idempotent: true, then false; the container is gone', async () => {
  const id = await tracker.create(provider)
  const name = containerNameFor(namespace, id)
  expect(inspectContainer(name)).not.toBeNull()
  expect(await provider.removeSandbox(id)).toBe(true)
  expect(inspectContainer(name)).toBeNull()
  expect(await provider.removeSandbox(id)).toBe(false)
  expect(await new DockerSandboxProvider({ image: BUSYBOX, namespace }).removeSandbox(id)).toBe(false)
  await expectNotAvailable(provider, id)
  // Malformed ids are simply not there.
  expect(await provider.removeSandbox('')).toBe(false)
  expect(await provider.removeSandbox('../etc')).toBe(false)
})

test('a stopped sandbox can be removed', async () => {
  const id = await tracker.create(provider)
  const name = containerNameFor(namespace, id)
  docker(['stop', '-t', '1', name])
  expect(await provider.removeSandbox(id)).toBe(true)
  expect(inspectContainer(name)).toBeNull()
})

test('the logger hears about creation and removal', async () => {
  const events: Array<{ level: string; message: string; meta: any }> = []
  const rec = (level: string) => (message: string, meta: unknown) => events.push({ level, message, meta })
  const logged = new DockerSandboxProvider({
    image: BUSYBOX,
    namespace,
    logger: { debug: rec('debug'), info: rec('info'), warn: rec('warn'), error: rec('error') },
  })
  const id = await tracker.create(logged)
  expect(await logged.removeSandbox(id)).toBe(true)
  for (let i = 0; i < 50 && events.length < 2; i++) await sleep(20)
  expect(events).toEqual(
    expect.arrayContaining([
      expect.objectContaining({
        level: 'info',
        message: 'sandbox created',
        meta: expect.objectContaining({ sandboxId: id }),
      }),
      expect.objectContaining({
        level: 'info',
        message: 'sandbox removed',
        meta: expect.objectContaining({ sandboxId: id }),
      }),
    ]),
  )
})
