'use strict'

// A fresh provider in a fresh process, for the fault suite. One JSON job in argv[2]; the last
// line of stdout is a JSON result with the calls it made. Modes:
//   create      create a sandbox and exit (its provider dies with the process)
//   exec-burst  wait until `startAt`, then `count` concurrent execs on `sandboxId`
//   rss         one exec while sampling process.memoryUsage().rss every `sampleMs`
const path = require('node:path')

const { DockerSandboxProvider } = require(path.resolve(__dirname, '..', '..'))

const unhandled = []
process.on('unhandledRejection', (e) => unhandled.push(String((e && e.stack) || e)))

const job = JSON.parse(process.argv[2])
const calls = []

async function timed(kind, fn, judge) {
  const t = performance.now()
  try {
    const v = await fn()
    const err = judge ? judge(v) : null
    calls.push({
      kind,
      status: err === null ? 'ok' : err ? 'error' : 'lost',
      ms: performance.now() - t,
      reason: err || undefined,
    })
    return v
  } catch (e) {
    const clear = e && typeof e.message === 'string' && e.message && typeof e.code === 'string'
    calls.push({
      kind,
      status: clear ? 'error' : 'lost',
      ms: performance.now() - t,
      reason: String((e && e.message) || e),
    })
    throw e
  }
}

const execJudge = (r) => (r.success ? null : r.error || '')

async function main() {
  const provider = new DockerSandboxProvider(job.options)
  switch (job.mode) {
    case 'create': {
      const { sandboxId } = await timed('createSandbox', () => provider.createSandbox())
      return { sandboxId }
    }
    case 'exec-burst': {
      const wait = job.startAt - Date.now()
      if (wait > 0) await new Promise((r) => setTimeout(r, wait))
      const results = await Promise.all(
        Array.from({ length: job.count }, (_, i) =>
          timed(
            'exec',
            () =>
              provider.exec({
                sandboxId: job.sandboxId,
                command: `echo burst-${i}`,
                timeoutSeconds: job.timeoutSeconds,
              }),
            execJudge,
          ),
        ),
      )
      return { results }
    }
    case 'rss': {
      // Baseline: the provider connected and one small exec done, so the engine client and the
      // runtime are part of it and only the big exec's own cost shows as growth.
      await timed(
        'exec',
        () => provider.exec({ sandboxId: job.sandboxId, command: 'echo warm', timeoutSeconds: 30 }),
        execJudge,
      )
      if (global.gc) global.gc()
      const baseline = process.memoryUsage().rss
      let peak = baseline
      let samples = 0
      const sample = () => {
        const r = process.memoryUsage().rss
        samples++
        if (r > peak) peak = r
      }
      const iv = setInterval(sample, job.sampleMs)
      const started = Date.now()
      const r = await timed(
        'exec',
        () => provider.exec({ sandboxId: job.sandboxId, command: job.command, timeoutSeconds: job.timeoutSeconds }),
        execJudge,
      )
      sample()
      clearInterval(iv)
      const result = r.success ? r.response.result : ''
      const omitted = /\[\.\.\. (\d+) bytes of output omitted \.\.\.\]/.exec(result)
      return {
        success: r.success,
        error: r.success ? undefined : r.error,
        exitCode: r.success ? r.response.exitCode : undefined,
        resultLength: result.length,
        resultBytes: Buffer.byteLength(result),
        omissionLine: omitted ? omitted[0] : null,
        omittedBytes: omitted ? Number(omitted[1]) : null,
        baseline,
        peak,
        samples,
        ms: Date.now() - started,
      }
    }
    default:
      throw new Error(`unknown mode ${job.mode}`)
  }
}

main().then(
  (result) => {
    process.stdout.write(`${JSON.stringify({ ...result, calls, unhandled })}\n`)
    process.exitCode = unhandled.length ? 3 : 0
  },
  (e) => {
    process.stdout.write(`${JSON.stringify({ fatal: String((e && e.stack) || e), calls, unhandled })}\n`)
    process.exitCode = 1
  },
)
