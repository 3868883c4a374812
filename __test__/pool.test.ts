// The warm pool: members are ready sandboxes that nobody owns until a createSandbox() claims
// one; claims are atomic across processes; the pool refills; a pool sandbox is a full sandbox.

import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import { DockerSandboxProvider, SandboxNotAvailableError } from '..'
import {
  BUSYBOX,
  cleanupNamespace,
  containerNameFor,
  docker,
  inspectContainer,
  ok,
  rejection,
  sleep,
  uniqueNamespace,
  waitFor,
} from './helpers'

const LABEL_POOL = 'trueforge.sandbox.pool'

/** Running and not-yet-running pool members of a namespace, by name. */
function members(namespace: string): { running: string[]; other: string[] } {
  const out = docker([
    'ps',
    '-a',
    '--filter',
    `label=trueforge.sandbox.namespace=${namespace}`,
    '--filter',
    `label=${LABEL_POOL}`,
    '--format',
    '{{.Names}} {{.State}}',
  ])
  const running: string[] = []
  const other: string[] = []
  for (const line of out.split('\n').filter(Boolean)) {
    const [name, state] = line.split(' ')
    if (!name.endsWith('-pool')) continue
    ;(state === 'running' ? running : other).push(name)
  }
  return { running, other }
}

/**
 * Waits (up to `waitMs`) until this process's refills are done (the pool is full and nothing is
 * half-made), then removes everything in the namespace.
 */
async function settleAndClean(namespace: string, size: number, waitMs: number): Promise<void> {
  try {
    await waitFor(
      () => {
        const m = members(namespace)
        return m.running.length >= size && m.other.length === 0
      },
      waitMs,
      'the pool to settle',
    )
  } catch {
    // Clean up regardless.
  }
  await sleep(500)
  cleanupNamespace(namespace)
}

describe('one process', () => {
  const namespace = uniqueNamespace('t-pool')
  const provider = new DockerSandboxProvider({ image: BUSYBOX, namespace, warmPool: { size: 2 } })

  afterAll(async () => {
    await settleAndClean(namespace, 2, 45_000)
  }, 90_000)

  test('warmUp fills the pool with running members nobody owns', async () => {
    await provider.warmUp()
    await waitFor(() => members(namespace).running.length === 2, 60_000, 'two running members')
    const name = members(namespace).running[0]
    const info = inspectContainer(name)
    const id = info.Config.Labels['trueforge.sandbox.id']
    expect(id).toMatch(/^\/workspace\/[0-9A-Z]{26}$/)
    expect(info.Config.Labels[LABEL_POOL]).toMatch(/^[0-9a-f]{16}$/)
    // Its id resolves to nothing until it is claimed: it is nobody's session, and untouched.
    const e = await rejection(provider.exec({ sandboxId: id, command: 'true' }))
    expect(e).toBeInstanceOf(SandboxNotAvailableError)
    const after = inspectContainer(name)
    expect(after.Name).toBe(`/${name}`)
    expect(after.State.Running).toBe(true)
    // The one exec it has is its agent, started when it was made so that the first call to it
    // finds it running; nothing ran a command in it.
    expect(after.ExecIDs ?? []).toHaveLength(1)
    expect(docker(['top', name, '-o', 'pid,args'])).toMatch(
      /\/\.trueforge-agent\/[^ ]+\/trueforge-agent-(x86_64|aarch64)/,
    )
  })

  test('createSandbox claims a member, the pool refills, and the sandbox passes the contract behaviours', async () => {
    const before = members(namespace).running
    expect(before.length).toBe(2)
    const { sandboxId: a } = await provider.createSandbox()
    const { sandboxId: b } = await provider.createSandbox()
    // Both came from the pool: their containers are the members that existed before, renamed.
    const claimed = [containerNameFor(namespace, a), containerNameFor(namespace, b)]
    expect(before.map((n) => n.replace(/-pool$/, '')).sort()).toEqual([...claimed].sort())
    for (const name of claimed) expect(inspectContainer(name).Config.Labels[LABEL_POOL]).toBeDefined()

    // The contract behaviours.
    expect((await ok(provider, a, 'pwd')).trim()).toBe(a)
    await ok(provider, a, 'mkdir -p skills && echo kept > skills/note')
    expect(await ok(provider, a, 'cat skills/note')).toBe('kept\n')
    expect(a).not.toBe(b)
    const fromB = await provider.exec({ sandboxId: b, command: `cat ${a}/skills/note` })
    expect(fromB.success && fromB.response.exitCode).not.toBe(0)
    const bytes = Buffer.from(Array.from({ length: 4096 }, (_, i) => i % 256))
    await provider.uploadFile({ sandboxId: a, remotePath: 'up.bin', content: bytes })
    expect((await provider.downloadFile({ sandboxId: a, path: `${a}/up.bin` })).equals(bytes)).toBe(true)

    // A fresh provider instance (same configuration) sees it like any sandbox.
    const fresh = new DockerSandboxProvider({ image: BUSYBOX, namespace, warmPool: { size: 2 } })
    expect((await ok(fresh, b, 'pwd')).trim()).toBe(b)

    await waitFor(() => members(namespace).running.length === 2, 60_000, 'the pool to refill')
    const refilled = members(namespace).running
    expect(refilled.some((n) => before.includes(n))).toBe(false)

    expect(await provider.removeSandbox(a)).toBe(true)
    expect(await provider.removeSandbox(b)).toBe(true)
  })

  test('a stopped member is not handed out; the refill replaces it', async () => {
    await waitFor(() => members(namespace).running.length === 2, 60_000, 'a full pool')
    const [victim] = members(namespace).running
    docker(['stop', '-t', '1', victim])
    const { sandboxId } = await provider.createSandbox()
    expect(containerNameFor(namespace, sandboxId)).not.toBe(victim.replace(/-pool$/, ''))
    expect((await ok(provider, sandboxId, 'echo alive')).trim()).toBe('alive')
    await waitFor(() => inspectContainer(victim) === null, 60_000, 'the stopped member to be removed')
    await provider.removeSandbox(sandboxId)
  })
})

describe('two processes', () => {
  const namespace = uniqueNamespace('t-pool2')
  const dir = mkdtempSync(join(tmpdir(), 'tf-pool-'))
  const go = join(dir, 'go')
  const SIZE = 6
  const PER_PROCESS = 10

  afterAll(async () => {
    // The children have exited, so nobody refills: no waiting for a full pool.
    await settleAndClean(namespace, SIZE, 0)
    rmSync(dir, { recursive: true, force: true })
  }, 90_000)

  test('20 concurrent creates from two processes never get the same sandbox', async () => {
    const script = join(__dirname, 'fixtures', 'pool-claimer.js')
    const children = [0, 1].map(() =>
      spawn(process.execPath, [script, namespace, String(SIZE), String(PER_PROCESS), go], {
        stdio: ['ignore', 'pipe', 'pipe'],
      }),
    )
    const outputs = children.map(
      (c) =>
        new Promise<string>((resolve, reject) => {
          let out = ''
          let err = ''
          c.stdout.on('data', (d) => (out += d))
          c.stderr.on('data', (d) => (err += d))
          c.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`child exited ${code}: ${err}`))))
        }),
    )
    // Both have filled (the same) pool; then both claim at once.
    await waitFor(() => members(namespace).running.length >= SIZE, 90_000, 'the shared pool to fill')
    await sleep(300)
    writeFileSync(go, '')
    const lists = (await Promise.all(outputs)).map((o) => JSON.parse(o.trim().split('\n').pop()!) as string[])
    const all = lists.flat()
    expect(all).toHaveLength(2 * PER_PROCESS)
    expect(new Set(all).size).toBe(all.length)
    // Every id names exactly one container of ours, under its final name.
    for (const id of all) {
      const info = inspectContainer(containerNameFor(namespace, id))
      expect(info).not.toBeNull()
      expect(info.Config.Labels['trueforge.sandbox.id']).toBe(id)
    }
    // Some of them really came from the pool (and so were raced for).
    const fromPool = all.filter((id) => inspectContainer(containerNameFor(namespace, id)).Config.Labels[LABEL_POOL])
    expect(fromPool.length).toBeGreaterThan(0)
  }, 180_000)
})
