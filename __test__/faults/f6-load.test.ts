// Fault 6: load. 20 sandboxes at once, each with 10 concurrent execs plus uploads and
// downloads in flight together. Every call succeeds with its own result; afterwards no exec
// process is left in any container (`ps` from the CLI shows nothing whose arguments mention
// `trueforge-exec`), and after cleanup no container is left.

import { randomBytes } from 'node:crypto'

import {
  call,
  containersOf,
  describeFaults,
  execCall,
  execLeftovers,
  ExecResultOk,
  faultNamespace,
  faultProvider,
  must,
  nameOf,
  Outcome,
  setupFaultFile,
  Tracker,
} from './harness'
import { sleep } from '../helpers'

setupFaultFile()

const SANDBOXES = 20
const EXECS = 10
const UPLOADS = 3
const TIMEOUT_S = 120
const DEADLINE_MS = (TIMEOUT_S + 10) * 1000

describeFaults('fault 6: 20 sandboxes under load', () => {
  const namespace = faultNamespace('f6')
  const provider = faultProvider(namespace)
  const tracker = new Tracker(namespace, provider)

  afterAll(async () => {
    await tracker.cleanup()
  })

  test('every call succeeds, no exec process is left, no container is left after cleanup', async () => {
    const ids = await Promise.all(Array.from({ length: SANDBOXES }, () => tracker.create(provider, DEADLINE_MS)))
    expect(new Set(ids).size).toBe(SANDBOXES)
    const seeds = ids.map(() => randomBytes(4096))
    await Promise.all(
      ids.map((sandboxId, s) =>
        must(
          'uploadFile',
          () => provider.uploadFile({ sandboxId, remotePath: 'seed.bin', content: seeds[s] }),
          DEADLINE_MS,
        ),
      ),
    )

    // Everything at once: per sandbox 10 execs, 3 uploads and a download of the seed.
    const payload = (s: number, u: number) => Buffer.from(`sandbox ${s} upload ${u} ${'x'.repeat(1000 * (u + 1))}\n`)
    const work: Promise<Outcome<unknown>>[] = []
    const checks: Array<(o: Outcome<unknown>) => void> = []
    ids.forEach((sandboxId, s) => {
      for (let i = 0; i < EXECS; i++) {
        work.push(
          execCall(
            provider,
            {
              sandboxId,
              command: `wc -c < seed.bin | tr -d ' '; echo ${s}-${i} > out-${i}.txt; cat out-${i}.txt`,
              timeoutSeconds: TIMEOUT_S,
            },
            DEADLINE_MS,
          ),
        )
        checks.push((o) =>
          expect((o.value as ExecResultOk).response).toEqual({ exitCode: 0, result: `4096\n${s}-${i}\n` }),
        )
      }
      for (let u = 0; u < UPLOADS; u++) {
        work.push(
          call('uploadFile', DEADLINE_MS, () =>
            provider.uploadFile({ sandboxId, remotePath: `up/u-${u}.txt`, content: payload(s, u) }),
          ),
        )
        checks.push(() => undefined)
      }
      work.push(call('downloadFile', DEADLINE_MS, () => provider.downloadFile({ sandboxId, path: 'seed.bin' })))
      checks.push((o) => expect(Buffer.compare(o.value as Buffer, seeds[s])).toBe(0))
    })
    const outcomes = await Promise.all(work)
    const failed = outcomes.filter((o) => o.status !== 'ok').map((o) => `${o.kind} ${o.status}: ${o.error ?? o.reason}`)
    expect(failed).toEqual([])
    outcomes.forEach((o, k) => checks[k](o))

    // Then read back what was written concurrently.
    const reads = await Promise.all(
      ids.flatMap((sandboxId, s) => [
        ...Array.from({ length: UPLOADS }, (_, u) =>
          must('downloadFile', () => provider.downloadFile({ sandboxId, path: `up/u-${u}.txt` }), DEADLINE_MS).then(
            (b) => expect(b.toString()).toBe(payload(s, u).toString()),
          ),
        ),
        must(
          'downloadFile',
          () => provider.downloadFile({ sandboxId, path: `out-${EXECS - 1}.txt` }),
          DEADLINE_MS,
        ).then((b) => expect(b.toString()).toBe(`${s}-${EXECS - 1}\n`)),
      ]),
    )
    expect(reads).toHaveLength(SANDBOXES * (UPLOADS + 1))

    // No exec process left behind in any container. A wrapper may still be exiting right after
    // its call returned, so look again for up to 3 s before calling it left over.
    let left: string[] = []
    for (let attempt = 0; attempt < 4; attempt++) {
      left = ids.flatMap((id) => execLeftovers(nameOf(namespace, id)).map((l) => `${nameOf(namespace, id)}: ${l}`))
      if (left.length === 0) break
      await sleep(1000)
    }
    expect(left).toEqual([])

    // Removal through the provider leaves nothing.
    const removed = await Promise.all(
      ids.map((id) => must('removeSandbox', () => provider.removeSandbox(id), DEADLINE_MS)),
    )
    expect(removed).toEqual(ids.map(() => true))
    ids.forEach((id) => tracker.ids.delete(id))
    expect(containersOf(namespace)).toEqual([])
  })
})
