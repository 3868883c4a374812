'use strict'

// A second server process for __test__/gpu-alloc.test.ts: one provider, `count` concurrent
// createSandbox() calls released at `startAt`, or (with `exec`) one command in a sandbox. Prints
// one JSON line: each call's sandbox id, or its error's class, code, statusCode, holders and
// message; or the command's result.
const path = require('node:path')

const { DockerSandboxProvider } = require(path.resolve(__dirname, '..'))

async function main() {
  const job = JSON.parse(process.argv[2])
  const provider = new DockerSandboxProvider(job.options)
  if (job.exec) {
    const result = await provider.exec(job.exec)
    provider.dispose()
    process.stdout.write(`${JSON.stringify(result)}\n`)
    return
  }
  const wait = job.startAt - Date.now()
  if (wait > 0) await new Promise((r) => setTimeout(r, wait))
  const results = await Promise.all(
    Array.from({ length: job.count }, () =>
      provider.createSandbox().then(
        ({ sandboxId }) => ({ sandboxId }),
        (e) => ({ name: e.name, code: e.code, statusCode: e.statusCode, holders: e.holders, message: e.message }),
      ),
    ),
  )
  provider.dispose()
  process.stdout.write(`${JSON.stringify(results)}\n`)
}

main().catch((e) => {
  process.stdout.write(`${JSON.stringify({ fatal: String((e && e.stack) || e) })}\n`)
  process.exit(1)
})
