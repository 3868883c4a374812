// What the process keeps per engine: background work ends when the engine's last provider is
// disposed, and per-container entries (start locks, cached targets) go with their containers.
// These tests reach the engine through `unix:///run/docker.sock`, the same engine under an
// address no other test file uses, so the counts are this file's alone even when jest runs
// other files in the same worker process.

import { DockerSandboxProvider, engineStats } from '..'
import { BUSYBOX, cleanupNamespace, containerNameFor, docker, sleep, uniqueNamespace } from './helpers'

const HOST = 'unix:///run/docker.sock'
const LABEL_POOL = 'trueforge.sandbox.pool'

jest.setTimeout(300_000)

function poolMembers(namespace: string): string[] {
  return docker([
    'ps',
    '-a',
    '--filter',
    `label=trueforge.sandbox.namespace=${namespace}`,
    '--filter',
    `label=${LABEL_POOL}`,
    '--format',
    '{{.Names}}',
  ])
    .split('\n')
    .filter(Boolean)
}

/** Runs `task` over `items`, `width` at a time. */
async function inBatches<T>(items: T[], width: number, task: (item: T) => Promise<void>): Promise<void> {
  let next = 0
  const worker = async () => {
    while (next < items.length) {
      const item = items[next++]
      await task(item)
    }
  }
  await Promise.all(Array.from({ length: width }, worker))
}

const namespaces: string[] = []
const providers: InstanceType<typeof DockerSandboxProvider>[] = []

afterAll(async () => {
  for (const p of providers) await p.dispose()
  for (const ns of namespaces) cleanupNamespace(ns)
})

test('disposing the last provider of an engine stops its background work', async () => {
  const namespace = uniqueNamespace('engst')
  namespaces.push(namespace)
  const opts = { image: BUSYBOX, namespace, dockerHost: HOST, warmPool: { size: 2 }, autoDeleteIntervalInMinutes: 60 }
  const first = new DockerSandboxProvider(opts)
  const second = new DockerSandboxProvider(opts)
  providers.push(first, second)
  // A refill (it waits a moment before its first create) and the reaper are in the background.
  await first.warmUp()
  await second.warmUp()
  const before = engineStats(HOST)!
  expect(before.providers).toBe(2)
  expect(before.backgroundTasks).toBeGreaterThanOrEqual(1)

  // Disposed while the refill is making members: the create in progress is finished, not cut
  // halfway, and nothing starts after it.
  const deadline = Date.now() + 30_000
  while (poolMembers(namespace).length === 0 && Date.now() < deadline) await sleep(100)
  expect(poolMembers(namespace).length).toBeGreaterThan(0)

  await first.dispose()
  expect(engineStats(HOST)!.providers).toBe(1)
  expect(engineStats(HOST)!.backgroundTasks).toBeGreaterThanOrEqual(1)

  await second.dispose()
  const after = engineStats(HOST)!
  expect(after.providers).toBe(0)
  expect(after.backgroundTasks).toBe(0)
  expect(after.poolRefills).toBe(0)
  expect(after.reaperLeases).toBe(0)
  // Whatever the refill finished before the stop stays as it was: nothing is created later.
  const members = poolMembers(namespace).sort()
  expect(members.length).toBeLessThanOrEqual(2)
  await sleep(4000)
  expect(poolMembers(namespace).sort()).toEqual(members)
  for (const name of members) expect(docker(['inspect', '-f', '{{.State.Status}}', name])).toBe('running')
  expect(engineStats(HOST)!.backgroundTasks).toBe(0)
})

test('per-container entries go with their containers after 1,000 execs over 50 sandboxes', async () => {
  const namespace = uniqueNamespace('engst')
  namespaces.push(namespace)
  const p = new DockerSandboxProvider({ image: BUSYBOX, namespace, dockerHost: HOST })
  providers.push(p)
  const ids: string[] = []
  try {
    await inBatches(
      Array.from({ length: 50 }, (_, i) => i),
      4,
      async () => {
        ids.push((await p.createSandbox()).sandboxId)
      },
    )
    expect(ids).toHaveLength(50)
    // Stopped sandboxes make the execs go through the start lock.
    docker(['stop', '-t', '0', ...ids.slice(0, 10).map((id) => containerNameFor(namespace, id))])
    const calls = Array.from({ length: 1000 }, (_, i) => ids[i % ids.length])
    let failed = 0
    await inBatches(calls, 8, async (sandboxId) => {
      const r = await p.exec({ sandboxId, command: 'echo hi' })
      if (!r.success || r.response.result.trim() !== 'hi') failed++
    })
    expect(failed).toBe(0)
    const busy = engineStats(HOST)!
    expect(busy.cachedTargets).toBeGreaterThanOrEqual(50)
    expect(busy.startLocks).toBe(0)
    // One agent per sandbox, however many execs went through it.
    expect(busy.agentConnections).toBe(50)

    await inBatches(ids, 8, async (id) => {
      expect(await p.removeSandbox(id)).toBe(true)
    })
    const done = engineStats(HOST)!
    expect(done.startLocks).toBe(0)
    expect(done.probeLocks).toBe(0)
    expect(done.cachedTargets).toBe(0)
    // Each agent's connection ends with its container.
    const deadline = Date.now() + 10_000
    while (engineStats(HOST)!.agentConnections > 0 && Date.now() < deadline) await sleep(100)
    expect(engineStats(HOST)!.agentConnections).toBe(0)
  } finally {
    await p.dispose()
    cleanupNamespace(namespace)
  }
  expect(engineStats(HOST)!.backgroundTasks).toBe(0)
})
