// Fault 5: a stopped sandbox gets many first calls at once. It is started exactly once (one
// `start` event in the engine's event log) and every call succeeds: 10 concurrent execs from
// the provider that made it, from a fresh instance in the same process, and from two fresh
// processes racing each other (their only common ground is the engine).

import {
  describeFaults,
  dk,
  execCall,
  ExecResultOk,
  faultNamespace,
  faultProvider,
  FAULT_HOST,
  injectFault,
  isRunning,
  mustRun,
  nameOf,
  recordChildCalls,
  runChild,
  setupFaultFile,
  Tracker,
} from './harness'

setupFaultFile()

const BURST = 10
const TIMEOUT_S = 60

describeFaults('fault 5: concurrent first calls on a stopped sandbox', () => {
  const namespace = faultNamespace('f5')
  const provider = faultProvider(namespace, { autoDeleteIntervalInMinutes: 0 })
  const tracker = new Tracker(namespace, provider)
  let sandboxId: string
  let container: string
  let containerId: string

  beforeAll(async () => {
    sandboxId = await tracker.create()
    container = nameOf(namespace, sandboxId)
    containerId = dk(['inspect', '--format', '{{.Id}}', container])
    await mustRun(provider, sandboxId, 'echo kept > kept.txt')
  })

  afterAll(async () => {
    await tracker.cleanup()
  })

  /** Stops the sandbox; returns the engine-clock second to look for start events from. */
  function stopSandbox(): number {
    injectFault('container-stop')
    dk(['stop', '-t', '5', container])
    expect(isRunning(container)).toBe(false)
    return Date.now() / 1000
  }

  /** The `start` events of the sandbox's container between two instants. */
  function startEvents(since: number, until: number): string[] {
    const out = dk([
      'events',
      '--since',
      since.toFixed(3),
      '--until',
      until.toFixed(3),
      '--filter',
      `container=${containerId}`,
      '--filter',
      'event=start',
      '--format',
      '{{.Time}} {{.Action}} {{.Actor.Attributes.name}}',
    ])
    return out.split('\n').filter((l) => l.trim())
  }

  function expectAllRan(results: ExecResultOk[], tag: (i: number) => string): void {
    expect(results.map((r) => r.response)).toEqual(results.map((_, i) => ({ exitCode: 0, result: `${tag(i)}\n` })))
  }

  async function burst(p: typeof provider): Promise<void> {
    const outcomes = await Promise.all(
      Array.from({ length: BURST }, (_, i) =>
        execCall(
          p,
          { sandboxId, command: `cat kept.txt >/dev/null && echo call-${i}`, timeoutSeconds: TIMEOUT_S },
          (TIMEOUT_S + 5) * 1000,
        ),
      ),
    )
    expect(outcomes.map((o) => [o.status, o.error])).toEqual(outcomes.map(() => ['ok', undefined]))
    expectAllRan(
      outcomes.map((o) => o.value as ExecResultOk),
      (i) => `call-${i}`,
    )
  }

  test('10 concurrent execs from the provider that made it start it once', async () => {
    const since = stopSandbox()
    await burst(provider)
    expect(startEvents(since, Date.now() / 1000 + 0.5)).toHaveLength(1)
  })

  test('10 concurrent execs from a fresh provider instance start it once', async () => {
    const since = stopSandbox()
    await burst(faultProvider(namespace, { autoDeleteIntervalInMinutes: 0 }))
    expect(startEvents(since, Date.now() / 1000 + 0.5)).toHaveLength(1)
  })

  test('two fresh processes, 5 concurrent execs each, racing: started once, all succeed', async () => {
    const since = stopSandbox()
    const startAt = Date.now() + 2500
    const job = {
      mode: 'exec-burst',
      options: {
        image: 'trueforge-sandbox-busybox:1',
        dockerHost: FAULT_HOST,
        namespace,
        network: 'none',
        autoDeleteIntervalInMinutes: 0,
      },
      sandboxId,
      count: 5,
      startAt,
      timeoutSeconds: TIMEOUT_S,
    }
    const children = await Promise.all([runChild(job), runChild(job)])
    for (const c of children) recordChildCalls(c.calls, (TIMEOUT_S + 5) * 1000)
    for (const c of children) {
      expect(c.unhandled).toEqual([])
      expect(c.results.map((r: { success: boolean; error?: string }) => [r.success, r.error])).toEqual(
        c.results.map(() => [true, undefined]),
      )
      expectAllRan(c.results, (i) => `burst-${i}`)
    }
    expect(startEvents(since, Date.now() / 1000 + 0.5)).toHaveLength(1)
    expect(await mustRun(provider, sandboxId, 'cat kept.txt')).toBe('kept\n')
  })
})
