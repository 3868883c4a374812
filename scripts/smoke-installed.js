'use strict'
// Runs one exec through the package as a consumer installed it (from the packed tarball),
// resolving `trueforge-docker-sandbox` from the current directory's node_modules.
const path = require('node:path')
const { DockerSandboxProvider } = require(require.resolve('trueforge-docker-sandbox', { paths: [process.cwd()] }))

async function main() {
  const provider = new DockerSandboxProvider({ image: 'trueforge-sandbox-busybox:1', namespace: 'ci-smoke' })
  const { sandboxId } = await provider.createSandbox()
  try {
    const r = await provider.exec({ sandboxId, command: 'echo installed-ok' })
    if (!r.success || r.response.exitCode !== 0 || r.response.result.trim() !== 'installed-ok') {
      throw new Error(`unexpected exec result: ${JSON.stringify(r)}`)
    }
    console.log(
      `installed package ran an exec in ${sandboxId} (${path.basename(require.resolve('trueforge-docker-sandbox', { paths: [process.cwd()] }))})`,
    )
  } finally {
    await provider.removeSandbox(sandboxId)
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
