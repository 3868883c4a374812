// Fault 8: idle stop and reaping, with intervals short enough to watch.
// - An idle sandbox stops by itself with no provider alive (made by a child process that then
//   exits; autoStopIntervalInMinutes 0.1 = 6 s).
// - A busy one (a command running past the interval) keeps running until the command ends.
// - A sandbox stopped for longer than the delete interval (0.05 min = 3 s) is removed (a) by a
//   fresh provider's background reaper after one call, (b) by reapStale(), (c) by the `reap`
//   command. Containers of another namespace, and containers without our labels, all stopped
//   and just as old, are untouched by all three.

import { execFileSync } from 'node:child_process'
import * as path from 'node:path'

import {
  call,
  cliName,
  describeFaults,
  dk,
  execCall,
  ExecResultOk,
  FAULT_HOST,
  faultNamespace,
  faultProvider,
  inspectOn,
  isRunning,
  must,
  nameOf,
  recordChildCalls,
  runChild,
  setupFaultFile,
  Tracker,
} from './harness'
import {
  BUSYBOX,
  LABEL_ID,
  LABEL_MANAGED_BY,
  LABEL_NAMESPACE,
  LABEL_TEST_NAMESPACE,
  MANAGED_BY,
  poll,
  randomUlid,
  sleep,
} from '../helpers'

setupFaultFile()

const IDLE_MIN = 0.1 // 6 s
const DELETE_MIN = 0.05 // 3 s
const CLI = path.resolve(__dirname, '..', '..', 'cli', 'index.js')

describeFaults('fault 8: idle stop and reaping', () => {
  const nsIdle = faultNamespace('f8-idle')
  const nsBusy = faultNamespace('f8-busy')
  const nsStale = faultNamespace('f8-stale')
  const nsCli = faultNamespace('f8-cli')
  const nsOther = faultNamespace('f8-other')
  // Providers that never reap (autoDelete 0) make and inspect the sandboxes; the reapers under
  // test are made fresh in each test.
  const quiet = (ns: string, extra: Record<string, unknown> = {}) =>
    faultProvider(ns, { autoDeleteIntervalInMinutes: 0, ...extra })
  const trackers = [nsIdle, nsBusy, nsStale, nsCli, nsOther].map((ns) => new Tracker(ns, quiet(ns)))
  const [idleT, busyT, staleT, cliT, otherT] = trackers
  /** Containers no reaper of ours may touch: name → what it is. */
  const decoys = new Map<string, string>()

  afterAll(async () => {
    for (const t of trackers) await t.cleanup()
  })

  /** A stopped container made with the CLI (exits at once). */
  function decoy(what: string, labels: Record<string, string>, testNs: string): void {
    const name = what.startsWith('trueforge-') ? what : cliName('f8-decoy')
    const args = ['run', '--network', 'none', '--name', name, '--label', `${LABEL_TEST_NAMESPACE}=${testNs}`]
    for (const [k, v] of Object.entries(labels)) args.push('--label', `${k}=${v}`)
    dk([...args, BUSYBOX, 'true'])
    expect(isRunning(name)).toBe(false)
    decoys.set(name, what)
    otherT.cliMade.add(name)
  }

  function decoysLeft(): string[] {
    return [...decoys.keys()].filter((n) => inspectOn(n) !== null)
  }

  beforeAll(() => {
    // Ours in every respect but the namespace (name, labels and id as a provider would make them).
    const id = `/workspace/${randomUlid()}`
    decoy(nameOf(nsOther, id), { [LABEL_MANAGED_BY]: MANAGED_BY, [LABEL_NAMESPACE]: nsOther, [LABEL_ID]: id }, nsOther)
    // In the reaped namespaces but without the managed-by label, and with no labels of ours at all.
    for (const ns of [nsIdle, nsStale, nsCli]) decoy(`unmanaged in ${ns}`, { [LABEL_NAMESPACE]: ns }, ns)
    decoy('unlabelled', {}, nsOther)
  })

  test('an idle sandbox stops by itself with no provider alive; a busy one keeps running', async () => {
    // Idle: made in a child process that exits right away.
    const created = Date.now()
    const child = await runChild({
      mode: 'create',
      options: {
        image: BUSYBOX,
        dockerHost: FAULT_HOST,
        namespace: nsIdle,
        network: 'none',
        autoStopIntervalInMinutes: IDLE_MIN,
        autoDeleteIntervalInMinutes: 0,
      },
    })
    recordChildCalls(child.calls, 60_000)
    expect(child.unhandled).toEqual([])
    const idleId = idleT.add(child.sandboxId as string)
    const idleName = nameOf(nsIdle, idleId)

    // Busy: a command that runs well past the interval.
    const busy = quiet(nsBusy, { autoStopIntervalInMinutes: IDLE_MIN })
    const busyId = await busyT.create(busy)
    const busyName = nameOf(nsBusy, busyId)
    const running = execCall(busy, { sandboxId: busyId, command: 'sleep 20; echo done', timeoutSeconds: 40 }, 50_000)
    let settled = false
    void running.then(() => (settled = true))
    const busySeen: boolean[] = []
    let idleStoppedAfter: number | null = null
    while (!settled) {
      busySeen.push(isRunning(busyName) === true)
      if (idleStoppedAfter === null && isRunning(idleName) === false) idleStoppedAfter = Date.now() - created
      await sleep(1000)
    }
    const o = await running
    expect(o.status).toBe('ok')
    expect((o.value as ExecResultOk).response).toEqual({ exitCode: 0, result: 'done\n' })
    expect(busySeen.length).toBeGreaterThan(10)
    expect(busySeen.every(Boolean)).toBe(true)

    if (idleStoppedAfter === null) {
      const waited = await poll(() => isRunning(idleName) === false, Math.max(0, 25_000 - (Date.now() - created)))
      if (waited !== null) idleStoppedAfter = Date.now() - created
    }
    expect(idleStoppedAfter).not.toBeNull()
    expect(idleStoppedAfter!).toBeLessThan(25_000)
    // Stopped by its own idle timer (the init exits 0), not killed.
    expect(inspectOn(idleName).State.ExitCode).toBe(0)

    // Once the command is over, the busy one goes idle and stops too.
    expect(await poll(() => isRunning(busyName) === false, 25_000)).not.toBeNull()
  })

  test('(a) a fresh provider’s background reaper removes a sandbox stopped past the delete interval', async () => {
    const idleId = [...idleT.ids][0]
    const idleName = nameOf(nsIdle, idleId)
    expect(isRunning(idleName)).toBe(false)
    await sleep(DELETE_MIN * 60_000 + 1500)
    const reaper = faultProvider(nsIdle, { autoDeleteIntervalInMinutes: DELETE_MIN })
    try {
      expect((await must('getImageBuildStatus', () => reaper.getImageBuildStatus())).status).toBe('ready')
      expect(await poll(() => inspectOn(idleName) === null, 15_000)).not.toBeNull()
      idleT.ids.delete(idleId)
    } finally {
      reaper.dispose()
    }
    expect(decoysLeft()).toEqual([...decoys.keys()])
  })

  test('(b) reapStale() removes a sandbox stopped past the delete interval, and only it', async () => {
    const reaper = faultProvider(nsStale, { autoDeleteIntervalInMinutes: DELETE_MIN })
    try {
      // Its first call starts its background reaper, while nothing is stale yet.
      const staleId = await staleT.create(reaper)
      const keepId = await staleT.create(reaper)
      dk(['stop', '-t', '5', nameOf(nsStale, staleId)])
      await sleep(DELETE_MIN * 60_000 + 1500)
      const o = await call('reapStale', 30_000, () => reaper.reapStale())
      expect(o.status).toBe('ok')
      expect(o.value).toEqual({ removed: [staleId] })
      expect(inspectOn(nameOf(nsStale, staleId))).toBeNull()
      staleT.ids.delete(staleId)
      // The running one stays.
      expect(isRunning(nameOf(nsStale, keepId))).toBe(true)
    } finally {
      reaper.dispose()
    }
    expect(decoysLeft()).toEqual([...decoys.keys()])
  })

  test('(c) the `reap` command removes a sandbox stopped past the delete interval', async () => {
    const staleId = await cliT.create()
    dk(['stop', '-t', '5', nameOf(nsCli, staleId)])
    await sleep(DELETE_MIN * 60_000 + 1500)
    const started = performance.now()
    const out = execFileSync(
      process.execPath,
      [CLI, 'reap', '--namespace', nsCli, '--docker-host', FAULT_HOST, '--older-than-minutes', String(DELETE_MIN)],
      { encoding: 'utf8', timeout: 60_000 },
    )
    recordChildCalls([{ kind: 'cli reap', status: 'ok', ms: performance.now() - started }], 60_000)
    expect(out).toContain(`removed 1 sandbox(es) in namespace '${nsCli}'`)
    expect(out).toContain(staleId)
    expect(inspectOn(nameOf(nsCli, staleId))).toBeNull()
    cliT.ids.delete(staleId)
    expect(decoysLeft()).toEqual([...decoys.keys()])
  })
})
