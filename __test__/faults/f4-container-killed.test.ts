// Fault 4: the container is killed (`docker kill`) while a command runs. The exec settles
// (exit 137, or a clear failure) well before its timeout, and the next exec starts the
// container again with the session's files intact.

import {
  describeFaults,
  dk,
  execCall,
  execLeftovers,
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
import { poll } from '../helpers'

setupFaultFile()

describeFaults('fault 4: the container is killed during an exec', () => {
  const namespace = faultNamespace('f4')
  const provider = faultProvider(namespace)
  const tracker = new Tracker(namespace, provider)

  afterAll(async () => {
    await tracker.cleanup()
  })

  test('the exec settles, and the next exec restarts the container with files intact', async () => {
    const sandboxId = await tracker.create()
    const container = nameOf(namespace, sandboxId)
    await mustRun(provider, sandboxId, 'echo from-exec > e.txt')
    await must('uploadFile', () =>
      provider.uploadFile({ sandboxId, remotePath: 'u.txt', content: Buffer.from('from-upload\n') }),
    )

    const timeoutSeconds = 30
    const inFlight = execCall(
      provider,
      { sandboxId, command: 'echo started; sleep 120; echo finished', timeoutSeconds },
      (timeoutSeconds + 5) * 1000,
    )
    expect(await poll(() => execLeftovers(container).some((l) => l.includes('sleep 120')), 10_000, 100)).not.toBeNull()
    injectFault('container-kill')
    dk(['kill', container])

    const o = await inFlight
    // It ends with the container, not with its own timeout.
    expect(o.status).not.toBe('lost')
    expect(o.ms).toBeLessThan(timeoutSeconds * 1000)
    if (o.status === 'ok') {
      const r = o.value as { success: true; response: { exitCode: number; result: string } }
      expect(r.response.exitCode).toBe(137)
      expect(r.response.result).toContain('started')
      expect(r.response.result).not.toContain('finished')
    } else {
      expect(o.error).toMatch(/\S/)
    }
    expect(isRunning(container)).toBe(false)

    expect(await mustRun(provider, sandboxId, 'cat e.txt u.txt')).toBe('from-exec\nfrom-upload\n')
    expect(isRunning(container)).toBe(true)
    // And the container is whole again: uploads and downloads work too.
    await must('uploadFile', () => provider.uploadFile({ sandboxId, remotePath: 'v.txt', content: Buffer.from('v\n') }))
    expect((await must('downloadFile', () => provider.downloadFile({ sandboxId, path: 'e.txt' }))).toString()).toBe(
      'from-exec\n',
    )
  })
})
