// Fault 7: a command writes 1 GiB of output. The call returns the capped output (default
// maxOutputBytes 10 MiB: head and tail with one line saying how much was left out) and the
// process's resident memory grows by less than 64 MiB plus the cap. Measured in a child node
// process that samples process.memoryUsage().rss every few ms, so jest's own heap does not
// pollute the figure.

import {
  describeFaults,
  FAULT_HOST,
  faultNamespace,
  faultProvider,
  injectFault,
  MiB,
  recordChildCalls,
  recordMemoryGrowth,
  runChild,
  setupFaultFile,
  Tracker,
} from './harness'

setupFaultFile()

const CAP = 10 * MiB
const GIB = 1024 * MiB
const TIMEOUT_S = 150

describeFaults('fault 7: an exec writes 1 GiB of output', () => {
  const namespace = faultNamespace('f7')
  const provider = faultProvider(namespace)
  const tracker = new Tracker(namespace, provider)

  afterAll(async () => {
    await tracker.cleanup()
  })

  test('the output is capped and memory grows by less than 64 MiB plus the cap', async () => {
    const sandboxId = await tracker.create()
    injectFault('output-flood-1GiB')
    const r = await runChild(
      {
        mode: 'rss',
        options: { image: 'trueforge-sandbox-busybox:1', dockerHost: FAULT_HOST, namespace, network: 'none' },
        sandboxId,
        command: `head -c ${GIB} /dev/zero`,
        timeoutSeconds: TIMEOUT_S,
        sampleMs: 5,
      },
      (TIMEOUT_S + 30) * 1000,
    )
    recordChildCalls(r.calls, (TIMEOUT_S + 10) * 1000)
    const growthMiB = (r.peak - r.baseline) / MiB
    recordMemoryGrowth(growthMiB)
    console.log(
      `1 GiB exec: ${r.ms} ms, rss baseline ${(r.baseline / MiB).toFixed(1)} MiB, peak ${(r.peak / MiB).toFixed(1)} MiB, ` +
        `growth ${growthMiB.toFixed(1)} MiB over ${r.samples} samples; result ${r.resultBytes} bytes, ${r.omissionLine}`,
    )
    expect(r.unhandled).toEqual([])
    expect({ success: r.success, exitCode: r.exitCode, error: r.error }).toEqual({
      success: true,
      exitCode: 0,
      error: undefined,
    })
    // The cap plus one omission line, which accounts for everything else.
    expect(r.resultBytes).toBeGreaterThanOrEqual(CAP)
    expect(r.resultBytes).toBeLessThan(CAP + 200)
    expect(r.omittedBytes).toBe(GIB - CAP)
    expect(r.samples).toBeGreaterThan(100)
    expect(growthMiB).toBeLessThan(64 + CAP / MiB)
  })
})
