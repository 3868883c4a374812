'use strict'
// A real sandbox round trip on the TrueForge-ready image: create, run commands, upload and download
// a file, print what happened with timings, remove the sandbox.
const { DockerSandboxProvider } = require('..')

const image = process.env.TF_DEMO_IMAGE || 'trueforge-sandbox:2'

function ms(t0) {
  return `${(Number(process.hrtime.bigint() - t0) / 1e6).toFixed(1)} ms`
}

async function timed(label, fn) {
  const t0 = process.hrtime.bigint()
  const v = await fn()
  console.log(`  ${label.padEnd(44)} ${ms(t0).padStart(10)}`)
  return v
}

async function main() {
  const provider = new DockerSandboxProvider({ image, namespace: 'demo' })
  console.log(`trueforge-docker-sandbox demo: image ${image}, engine ${provider.dockerHost}\n`)
  const build = await timed('getImageBuildStatus()', () => provider.getImageBuildStatus())
  if (build.status !== 'ready') throw new Error(`image not ready: ${build.reason}`)
  const { sandboxId } = await timed('createSandbox()', () => provider.createSandbox())
  console.log(`  -> sandbox ${sandboxId}`)
  const served = await provider.agentStatus(sandboxId)
  console.log(
    served.mode === 'agent'
      ? `  -> served by the in-sandbox agent ${served.version} (${served.arch})\n`
      : `  -> served by the engine's exec and archive endpoints (slower): ${served.reason}\n`,
  )
  try {
    const run = async (command, opts = {}) => {
      const r = await timed(`exec: ${command.length > 38 ? command.slice(0, 35) + '...' : command}`, () =>
        provider.exec({ sandboxId, command, ...opts }),
      )
      if (!r.success) throw new Error(`exec failed: ${r.error}`)
      const out = r.response.result.trimEnd()
      console.log(`    exit ${r.response.exitCode}${out ? ': ' + out.split('\n').join('\n      ') : ''}`)
      return r.response
    }
    await run('pwd')
    await run(
      'python3 -c "import sys, pydantic; from pydantic import field_validator, ConfigDict; print(sys.version.split()[0], pydantic.VERSION)"',
    )
    await run('git --version')
    await run('echo "$GREETING from $(hostname)"', { env: { GREETING: 'hello' } })
    await run('mkdir -p skills && echo data > skills/note.txt && ls skills')
    await run('sleep 5', { timeoutSeconds: 1 })

    console.log()
    const payload = Buffer.alloc(1024 * 1024, 0)
    for (let i = 0; i < payload.length; i++) payload[i] = (i * 31) & 0xff
    const remote = `${provider.getFileUploadsDir(sandboxId)}/demo.bin`
    await timed(`uploadFile(${remote}, 1 MiB)`, () =>
      provider.uploadFile({ sandboxId, remotePath: remote, content: payload }),
    )
    await run(`sha256sum ${remote} | cut -c1-16`)
    const back = await timed('downloadFile(1 MiB)', () => provider.downloadFile({ sandboxId, path: remote }))
    if (!back.equals(payload)) throw new Error('downloaded bytes differ from the uploaded ones')
    console.log('    round trip: the same 1048576 bytes came back')
  } finally {
    console.log()
    await timed('removeSandbox()', () => provider.removeSandbox(sandboxId))
  }
  console.log('\ndone')
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
