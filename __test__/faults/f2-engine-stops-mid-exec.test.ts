// Fault 2: the engine stops while a long command runs. The call settles within its timeout
// plus a few seconds as { success: false } with an error naming the engine (its address), no
// promise is left unhandled, the process carries on, and once the engine is back a later call
// on the same sandbox works (the container is started again, files intact).

import {
  describeFaults,
  execCall,
  expectNoUnhandled,
  FAULT_HOST,
  faultEngine,
  faultEngineAsync,
  faultNamespace,
  faultProvider,
  injectFault,
  call,
  mustRun,
  setupFaultFile,
  Tracker,
} from './harness'
import { sleep } from '../helpers'

setupFaultFile()

describeFaults('fault 2: the engine stops during a long exec', () => {
  const namespace = faultNamespace('f2')
  const provider = faultProvider(namespace)
  const tracker = new Tracker(namespace, provider)

  afterAll(async () => {
    await tracker.cleanup()
  })

  test('the exec settles as a failure naming the engine; a later call works', async () => {
    const sandboxId = await tracker.create()
    await mustRun(provider, sandboxId, 'echo kept > kept.txt')

    const timeoutSeconds = 20
    const inFlight = execCall(
      provider,
      { sandboxId, command: 'echo started; sleep 60; echo finished', timeoutSeconds },
      (timeoutSeconds + 5) * 1000,
    )
    await sleep(2000)
    injectFault('engine-stop')
    const stopping = faultEngineAsync('stop')

    const o = await inFlight
    await stopping
    expect(o.status).toBe('error')
    expect(o.ms).toBeLessThan((timeoutSeconds + 5) * 1000)
    expect(o.value).toMatchObject({ success: false })
    expect(o.error).toContain(FAULT_HOST)

    // While it is down every call fails fast and says where it looked.
    const down = await execCall(provider, { sandboxId, command: 'true', timeoutSeconds: 5 }, 10_000)
    expect(down.status).toBe('error')
    expect(down.error).toContain(FAULT_HOST)
    const dl = await call('downloadFile', 10_000, () => provider.downloadFile({ sandboxId, path: 'kept.txt' }))
    expect(dl.status).toBe('error')
    expect(dl.code).toMatch(/^ENGINE_/)
    expect(dl.error).toContain(FAULT_HOST)

    // The process is alive and nothing was left unhandled.
    expect(process.exitCode ?? 0).toBe(0)
    expectNoUnhandled()

    faultEngine('start')
    expect(await mustRun(provider, sandboxId, 'cat kept.txt')).toBe('kept\n')
  })
})
