// Fault 1: the engine restarts (dockerd stopped and started again, which stops every
// container) between two calls of a session. The next exec on the same id succeeds, the
// container having been started again, with the session's files intact.

import {
  describeFaults,
  execCall,
  faultEngine,
  faultNamespace,
  faultProvider,
  injectFault,
  isRunning,
  must,
  mustRun,
  nameOf,
  setupFaultFile,
  Tracker,
} from './harness'

setupFaultFile()

describeFaults('fault 1: the engine restarts between two calls', () => {
  const namespace = faultNamespace('f1')
  const provider = faultProvider(namespace)
  const tracker = new Tracker(namespace, provider)

  afterAll(async () => {
    await tracker.cleanup()
  })

  test('the next exec on the same id succeeds with the files intact', async () => {
    const sandboxId = await tracker.create()
    await mustRun(provider, sandboxId, 'echo written-by-exec > made.txt && mkdir -p sub && echo nested > sub/n.txt')
    await must('uploadFile', () =>
      provider.uploadFile({ sandboxId, remotePath: 'uploaded.bin', content: Buffer.from([0, 1, 2, 255, 10]) }),
    )

    injectFault('engine-restart')
    faultEngine('restart')
    // dockerd stopped every container on its way down (no live restore).
    expect(isRunning(nameOf(namespace, sandboxId))).toBe(false)

    const o = await execCall(
      provider,
      { sandboxId, command: 'cat made.txt sub/n.txt && pwd', timeoutSeconds: 30 },
      45_000,
    )
    expect(o.status).toBe('ok')
    expect(o.value).toEqual({
      success: true,
      response: { exitCode: 0, result: `written-by-exec\nnested\n${sandboxId}\n` },
    })
    expect(isRunning(nameOf(namespace, sandboxId))).toBe(true)

    const bytes = await must('downloadFile', () => provider.downloadFile({ sandboxId, path: 'uploaded.bin' }))
    expect([...bytes]).toEqual([0, 1, 2, 255, 10])
  })

  test('a second restart, then a fresh provider instance finds the session too', async () => {
    const sandboxId = await tracker.create()
    await mustRun(provider, sandboxId, 'echo before > state.txt')
    injectFault('engine-restart')
    faultEngine('restart')
    // A new instance, as the server builds every turn (the engine client is shared per process).
    const fresh = faultProvider(namespace)
    await must('uploadFile', () =>
      fresh.uploadFile({ sandboxId, remotePath: 'after.txt', content: Buffer.from('after\n') }),
    )
    expect(await mustRun(fresh, sandboxId, 'cat state.txt after.txt')).toBe('before\nafter\n')
  })
})
