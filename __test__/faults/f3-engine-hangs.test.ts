// Fault 3: the engine hangs (dockerd frozen with SIGSTOP). Every call settles by its deadline
// with a clear error naming the engine instead of hanging, and works again after SIGCONT.
// Deadlines: `engineTimeoutMs: 3000` bounds control requests (inspect, create, stat, exec
// create); exec `timeoutSeconds: 3`; an upload is a transfer, bounded (as documented for
// `engineTimeoutMs`) by the transfer deadline of 30 s plus 1 s per 8 MiB instead. The last test
// keeps `engineTimeoutMs` at its default: there an exec's own timeout is its deadline. Their agents
// are not linked (`agentLink: false`): a linked agent's calls never reach the engine, and the last
// test checks that it keeps serving while the engine is frozen.

import {
  call,
  containersOf,
  describeFaults,
  dk,
  dkTry,
  execCall,
  FAULT_HOST,
  faultEngine,
  faultNamespace,
  faultProvider,
  injectFault,
  must,
  mustRun,
  nameOf,
  Outcome,
  setupFaultFile,
  Tracker,
} from './harness'
import { poll, sleep } from '../helpers'

setupFaultFile()

const ENGINE_TIMEOUT_MS = 3000
const EXEC_TIMEOUT_S = 3
const TRANSFER_DEADLINE_MS = 30_000
/** Slack on top of each deadline before a call counts as hanging (lost). */
const SLACK_MS = 8000
const by = (deadlineMs: number): number => deadlineMs + SLACK_MS

describeFaults('fault 3: the engine hangs (SIGSTOP)', () => {
  const namespace = faultNamespace('f3')
  const provider = faultProvider(namespace, { engineTimeoutMs: ENGINE_TIMEOUT_MS, agentLink: false })
  const tracker = new Tracker(namespace, provider)

  afterAll(async () => {
    faultEngine('resume')
    await tracker.cleanup()
  })

  /** `run`'s calls, made while the engine is frozen; it is resumed once they have settled. */
  async function whileFrozen(run: () => Promise<Outcome<unknown>>[]): Promise<Outcome<unknown>[]> {
    injectFault('engine-freeze')
    faultEngine('pause')
    try {
      return await Promise.all(run())
    } finally {
      faultEngine('resume')
    }
  }

  /** Settled by its deadline (plus the slack) with a clear error naming the engine. */
  function expectClearEngineError(o: Outcome<unknown>, deadlineMs: number): void {
    expect({ kind: o.kind, status: o.status, reason: o.reason }).toEqual({
      kind: o.kind,
      status: 'error',
      reason: undefined,
    })
    expect(o.ms).toBeLessThan(by(deadlineMs))
    expect(o.error).toContain(FAULT_HOST)
  }

  test('exec, upload, download, createSandbox and getImageBuildStatus settle by their deadlines, then work again', async () => {
    const sandboxId = await tracker.create()
    await must('uploadFile', () =>
      provider.uploadFile({ sandboxId, remotePath: 'a.txt', content: Buffer.from('alpha\n') }),
    )
    // A second instance that has never seen the sandbox: its exec must look the container up.
    const fresh = faultProvider(namespace, { engineTimeoutMs: ENGINE_TIMEOUT_MS, agentLink: false })

    const outcomes = await whileFrozen(() => [
      execCall(provider, { sandboxId, command: 'echo hi', timeoutSeconds: EXEC_TIMEOUT_S }, by(EXEC_TIMEOUT_S * 1000)),
      execCall(
        fresh,
        { sandboxId, command: 'echo hi', timeoutSeconds: EXEC_TIMEOUT_S },
        by(EXEC_TIMEOUT_S * 1000),
        'exec (uncached)',
      ),
      call('uploadFile', by(TRANSFER_DEADLINE_MS), () =>
        provider.uploadFile({ sandboxId, remotePath: 'b.txt', content: Buffer.from('beta\n') }),
      ),
      call('downloadFile', by(ENGINE_TIMEOUT_MS), () => provider.downloadFile({ sandboxId, path: 'a.txt' })),
      call('createSandbox', by(ENGINE_TIMEOUT_MS), () => provider.createSandbox()),
      call('getImageBuildStatus', by(ENGINE_TIMEOUT_MS), () => provider.getImageBuildStatus()),
    ])
    const [exec1, exec2, upload, download, create, status] = outcomes
    expectClearEngineError(exec1, EXEC_TIMEOUT_S * 1000)
    expect(exec1.value).toMatchObject({ success: false })
    expectClearEngineError(exec2, EXEC_TIMEOUT_S * 1000)
    expectClearEngineError(upload, TRANSFER_DEADLINE_MS)
    expectClearEngineError(download, ENGINE_TIMEOUT_MS)
    expectClearEngineError(create, ENGINE_TIMEOUT_MS)
    expectClearEngineError(status, ENGINE_TIMEOUT_MS)
    for (const o of [upload, download, create, status]) {
      expect({ kind: o.kind, name: o.errorName, code: o.code }).toEqual({
        kind: o.kind,
        name: 'SandboxEngineError',
        code: 'ENGINE_TIMEOUT',
      })
    }

    // After SIGCONT everything works again.
    expect(await mustRun(provider, sandboxId, 'cat a.txt')).toBe('alpha\n')
    expect(await mustRun(fresh, sandboxId, 'echo fresh')).toBe('fresh\n')
    await must('uploadFile', () =>
      provider.uploadFile({ sandboxId, remotePath: 'c.txt', content: Buffer.from('gamma\n') }),
    )
    expect((await must('downloadFile', () => provider.downloadFile({ sandboxId, path: 'c.txt' }))).toString()).toBe(
      'gamma\n',
    )
    expect((await must('getImageBuildStatus', () => provider.getImageBuildStatus())).status).toBe('ready')
    const second = await tracker.create()
    expect(await mustRun(provider, second, 'echo new')).toBe('new\n')
  })

  test('a createSandbox that timed out on the frozen engine leaves no container once it recovers', async () => {
    const before = new Set(containersOf(namespace))
    injectFault('engine-freeze')
    faultEngine('pause')
    let create: Outcome<unknown>
    try {
      create = await call('createSandbox', by(ENGINE_TIMEOUT_MS), () => provider.createSandbox())
    } finally {
      faultEngine('resume')
    }
    expectClearEngineError(create, ENGINE_TIMEOUT_MS)
    // The caller was told creation failed, so nothing may be left behind: give the provider a
    // few seconds after the engine answers again to clean up what the frozen engine did late.
    await sleep(8000)
    const stray = containersOf(namespace)
      .filter((id) => !before.has(id))
      .map((id) =>
        dk(['inspect', '--format', '{{.Name}} {{.State.Status}} {{index .Config.Labels "trueforge.sandbox.id"}}', id]),
      )
    expect(stray).toEqual([])
  })

  test('an exec in flight when the engine freezes settles by its deadline, and a "killed" command is gone after SIGCONT', async () => {
    const sandboxId = await tracker.create()
    const container = nameOf(namespace, sandboxId)
    const marker = 'sleep 173'
    const inFlight = execCall(
      provider,
      { sandboxId, command: `echo started; ${marker}`, timeoutSeconds: EXEC_TIMEOUT_S },
      by(EXEC_TIMEOUT_S * 1000),
    )
    // Freeze once the command runs.
    // (Any process: under the agent a shell's last command may replace the shell.)
    const running = () =>
      dk(['exec', container, 'ps', '-o', 'pid,args'])
        .split('\n')
        .some((l) => l.includes(marker))
    expect(await poll(running, 10_000, 100)).not.toBeNull()
    injectFault('engine-freeze')
    faultEngine('pause')
    let o: Outcome<unknown>
    try {
      o = await inFlight
    } finally {
      faultEngine('resume')
    }
    // It settles by its timeout plus the kill's grace (5 s), within the slack.
    expect(o.status).not.toBe('lost')
    expect(o.ms).toBeLessThan(EXEC_TIMEOUT_S * 1000 + SLACK_MS)
    const r = o.value as { success: boolean; response?: { exitCode: number; result: string } }
    if (r.success && r.response?.result.includes('were killed')) {
      // The result says the command and everything it started were killed: then, with the
      // engine answering again, it must not still be running.
      await sleep(1000)
      const still = dk(['exec', container, 'ps', '-o', 'pid,args'])
        .split('\n')
        .filter((l) => l.includes(marker))
      expect({ result: r.response.result, stillRunning: still }).toEqual({
        result: r.response.result,
        stillRunning: [],
      })
    } else {
      // Otherwise it must be a clear failure naming the engine.
      expect(o.status).toBe('error')
      expect(o.error).toContain(FAULT_HOST)
    }
  })

  test('with engineTimeoutMs at its default (30 s), an exec on the frozen engine returns by its own timeout plus a few seconds, through the agent and on the engine path; nothing sent late runs; both work after SIGCONT', async () => {
    const viaAgent = faultProvider(namespace, { agentLink: false })
    const viaEngine = faultProvider(namespace, { agent: false })
    const a = await tracker.create(viaAgent)
    const b = await tracker.create(viaEngine)
    await mustRun(viaAgent, a, 'true')
    await mustRun(viaEngine, b, 'true')
    const bound = by(EXEC_TIMEOUT_S * 1000)
    const exec = (p: typeof viaAgent, sandboxId: string, command: string, kind: string) =>
      execCall(p, { sandboxId, command, timeoutSeconds: EXEC_TIMEOUT_S }, bound, kind)
    const inFlight = [
      exec(viaAgent, a, 'sleep 1831', 'exec in flight (agent)'),
      exec(viaEngine, b, 'sleep 1832', 'exec in flight (engine exec)'),
    ]
    const running = (sandboxId: string, marker: string) =>
      dk(['exec', nameOf(namespace, sandboxId), 'ps', '-o', 'pid,args']).includes(marker)
    expect(await poll(() => running(a, 'sleep 1831') && running(b, 'sleep 1832'), 10_000, 100)).not.toBeNull()
    injectFault('engine-freeze')
    faultEngine('pause')
    let outcomes: Outcome<unknown>[]
    try {
      outcomes = await Promise.all([
        ...inFlight,
        exec(viaAgent, a, 'echo late > late.txt', 'exec sent to the frozen engine (agent)'),
        exec(viaEngine, b, 'true', 'exec sent to the frozen engine (engine exec)'),
      ])
    } finally {
      faultEngine('resume')
    }
    for (const o of outcomes) {
      expect({ kind: o.kind, status: o.status, reason: o.reason }).toEqual({
        kind: o.kind,
        status: 'error',
        reason: undefined,
      })
      expect(o.ms).toBeLessThan(bound)
      expect(o.error).toContain(FAULT_HOST)
    }
    // What ran when the engine froze is not claimed killed: the result says what is not verified.
    for (const o of outcomes.slice(0, 3)) {
      expect({ kind: o.kind, error: o.error }).toEqual({
        kind: o.kind,
        error: expect.stringMatching(/not verified.*may still be running/),
      })
    }

    // After SIGCONT both work, the timed-out commands are gone (the agent's supervisor killed its
    // command at the timeout; the engine path kills its own once the engine answers again), and
    // the command sent to the frozen engine through the agent never ran: its cancel came with it.
    expect(await mustRun(viaAgent, a, 'echo back')).toBe('back\n')
    expect(await mustRun(viaEngine, b, 'echo back')).toBe('back\n')
    const gone = await poll(() => !running(a, 'sleep 1831') && !running(b, 'sleep 1832'), 15_000, 200)
    expect(gone).not.toBeNull()
    await sleep(1000)
    expect(dkTry(['exec', nameOf(namespace, a), 'test', '-e', `${a}/late.txt`]).status).toBe(1)
  })

  test('a linked agent serves commands and files while the engine is frozen: its calls never reach the engine', async () => {
    const linked = faultProvider(namespace, { engineTimeoutMs: ENGINE_TIMEOUT_MS })
    const sandboxId = await tracker.create(linked)
    const status = await linked.agentStatus(sandboxId)
    expect(status).toMatchObject({ mode: 'agent', linked: true })
    await mustRun(linked, sandboxId, 'true')
    const outcomes = await whileFrozen(() => [
      execCall(
        linked,
        { sandboxId, command: 'echo frozen', timeoutSeconds: EXEC_TIMEOUT_S },
        by(EXEC_TIMEOUT_S * 1000),
      ),
      call('uploadFile', by(ENGINE_TIMEOUT_MS), () =>
        linked.uploadFile({ sandboxId, remotePath: 'f.txt', content: Buffer.from('frozen\n') }),
      ),
    ])
    for (const o of outcomes) expect({ kind: o.kind, status: o.status }).toEqual({ kind: o.kind, status: 'ok' })
    expect(outcomes[0].value).toMatchObject({ success: true, response: { exitCode: 0, result: 'frozen\n' } })
    expect(await mustRun(linked, sandboxId, 'cat f.txt')).toBe('frozen\n')
  })
})
