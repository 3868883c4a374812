// The agent under pressure from its own workload: a file rewritten in place while it is
// downloaded (whole or FILE_CHANGED, never a mix), and more concurrent commands than the pids
// limit holds (each finishes or says why; no command of the caller's is killed to make room).

import { DockerSandboxProvider, SandboxFileChangedError } from '..'
import { BUSYBOX, DEBIAN, ok, SandboxTracker, uniqueNamespace, waitFor } from './helpers'

const namespace = uniqueNamespace('t-pressure')
const tracker = new SandboxTracker(namespace)
const provider = new DockerSandboxProvider({ image: BUSYBOX, namespace })

afterAll(async () => {
  await tracker.cleanup(provider)
})

describe('downloads of a file rewritten in place are whole or FILE_CHANGED', () => {
  let id: string

  beforeAll(async () => {
    id = await tracker.create(provider)
  })

  // 4 MiB takes the splicing path, 256 KiB the copying one; /workspace is a volume, /tmp the
  // container's own overlay.
  const cases: [string, number, string][] = [
    ['4 MiB in /workspace', 4 << 20, 'torn-4m.bin'],
    ['4 MiB in /tmp', 4 << 20, '/tmp/torn-4m.bin'],
    ['256 KiB in /workspace', 256 << 10, 'torn-256k.bin'],
    ['256 KiB in /tmp', 256 << 10, '/tmp/torn-256k.bin'],
  ]
  const counts: Record<string, { writes: number; wholeA: number; wholeB: number; changed: number; mixed: number }> = {}

  afterAll(() => {
    console.log(
      `downloads while a writer rewrote the file in place, 10 s per case:\n${JSON.stringify(counts, null, 1)}`,
    )
  })

  test.each(cases)(
    '%s, for 10 s: never a mix of the two versions',
    async (label, size, path) => {
      const a = Buffer.alloc(size, 'A')
      const b = Buffer.alloc(size, 'B')
      // Two versions of the same size; `dd conv=notrunc` writes one over the other in place, in
      // one write(2) each (bs is the whole file).
      await provider.uploadFile({ sandboxId: id, remotePath: '/tmp/pattern-a', content: a })
      await provider.uploadFile({ sandboxId: id, remotePath: '/tmp/pattern-b', content: b })
      await provider.uploadFile({ sandboxId: id, remotePath: path, content: a })
      const stop = `/tmp/stop-${size}-${path.startsWith('/') ? 'tmp' : 'ws'}`
      const dd = (from: string) => `dd if=${from} of=${path} bs=${size} conv=notrunc 2>/dev/null`
      const writer = provider.exec({
        sandboxId: id,
        command: `n=0; while [ ! -e ${stop} ]; do ${dd('/tmp/pattern-b')}; ${dd('/tmp/pattern-a')}; n=$((n+2)); done; echo $n`,
        timeoutSeconds: 60,
      })
      const c = { writes: 0, wholeA: 0, wholeB: 0, changed: 0, mixed: 0 }
      counts[label] = c
      const end = Date.now() + 10_000
      try {
        while (Date.now() < end) {
          try {
            const got = await provider.downloadFile({ sandboxId: id, path })
            if (got.equals(a)) c.wholeA++
            else if (got.equals(b)) c.wholeB++
            else c.mixed++
          } catch (e) {
            if (!(e instanceof SandboxFileChangedError)) throw e
            c.changed++
          }
        }
      } finally {
        await ok(provider, id, `touch ${stop}`)
      }
      const w = await writer
      if (!w.success) throw new Error(`the writer did not run: ${w.error}`)
      c.writes = Number(w.response.result.trim())
      // The writer really raced the downloads, and they were many.
      expect(c.writes).toBeGreaterThan(20)
      expect(c.wholeA + c.wholeB + c.changed).toBeGreaterThanOrEqual(10)
      expect(c.mixed).toBe(0)
    },
    60_000,
  )

  test('across the cases, downloads also came back whole: the check does not refuse everything', () => {
    const whole = Object.values(counts).reduce((n, c) => n + c.wholeA + c.wholeB, 0)
    expect(Object.keys(counts)).toHaveLength(cases.length)
    expect(whole).toBeGreaterThan(0)
  })
})

describe('more concurrent commands than the pids limit holds', () => {
  // bash forks `sleep`: each command needs its shepherd, its shell and the sleep, so 200 of them
  // want 600 pids of 300.
  const crowded = new DockerSandboxProvider({ image: DEBIAN, namespace, resources: { pidsLimit: 300 } })

  afterAll(async () => {
    await crowded.dispose()
  })

  test('200 at once over pidsLimit 300: each finishes or says why, none is killed to make room', async () => {
    const id = await tracker.create(crowded)
    const results = await Promise.all(
      Array.from({ length: 200 }, () =>
        crowded.exec({ sandboxId: id, command: 'sleep 3; echo done', timeoutSeconds: 120 }),
      ),
    )
    const outcomes: Record<string, number> = {}
    const silent: unknown[] = []
    for (const r of results) {
      let what: string
      if (r.success && r.response.exitCode === 0 && r.response.result.endsWith('done\n')) {
        // bash's own retries of a fork it could not make show in the output; it then finished.
        what = /fork: retry/.test(r.response.result) ? 'finished after fork retries' : 'finished'
      } else if (!r.success && /out of processes/.test(r.error)) {
        what = 'error: out of processes'
      } else if (r.success && /fork: .*(Resource temporarily unavailable|retry)/.test(r.response.result)) {
        what = `exit ${r.response.exitCode}: the shell could not fork`
      } else {
        what = 'silent'
        silent.push(r)
      }
      outcomes[what] = (outcomes[what] ?? 0) + 1
    }
    console.log(`200 concurrent \`sleep 3; echo done\` with pidsLimit 300:\n${JSON.stringify(outcomes, null, 1)}`)
    expect(silent).toEqual([])
    // The agent killed none of them: no 137 with the agent's recovery note or without a word.
    expect(results.filter((r) => r.success && r.response.exitCode === 137)).toEqual([])
    expect(outcomes.finished ?? 0).toBeGreaterThan(0)
    // The sandbox still runs commands.
    expect(await ok(crowded, id, 'echo fine')).toBe('fine\n')
  }, 180_000)

  test('a command finding every pid held by a running one fails saying so; the running one is not killed', async () => {
    const tight = new DockerSandboxProvider({ image: DEBIAN, namespace, resources: { pidsLimit: 48 } })
    try {
      const id = await tracker.create(tight)
      // More sleeps than the limit holds, all the call's own while it runs.
      const holder = tight.exec({
        sandboxId: id,
        command: 'for i in $(seq 60); do sleep 12 & done; wait; echo held',
        timeoutSeconds: 90,
      })
      await waitFor(
        async () => !(await tight.exec({ sandboxId: id, command: 'true', timeoutSeconds: 1 })).success,
        20_000,
        'the sandbox to fill up',
      )
      const late = await tight.exec({ sandboxId: id, command: 'echo late', timeoutSeconds: 2 })
      expect(late).toEqual({
        success: false,
        error: expect.stringMatching(
          /^the sandbox is out of processes: \d+ of them belong to commands still running, .* raise resources\.pidsLimit$/,
        ),
      })
      // It ran to its end: all its sleeps, or until bash itself gave up a fork (and said why).
      const held = await holder
      if (!held.success) throw new Error(`the holder did not run: ${held.error}`)
      expect(held.response.exitCode).not.toBe(137)
      expect(held.response.result).toMatch(/held\n$|bash: fork: (?!retry)/)
      expect(await ok(tight, id, 'echo fine')).toBe('fine\n')
    } finally {
      await tight.dispose()
    }
  }, 120_000)
})
