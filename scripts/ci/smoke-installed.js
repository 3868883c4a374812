'use strict'
// Runs one exec through the package as a consumer installed it (from the packed tarball),
// resolving `trueforge-docker-sandbox` from the current directory's node_modules, and checks it
// went through the in-sandbox agent the tarball carries.
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
    // The packed tarball carries the agent binaries: the exec went through the agent.
    const agent = await provider.agentStatus(sandboxId)
    if (agent.mode !== 'agent') throw new Error(`the installed package's agent did not run: ${JSON.stringify(agent)}`)
    console.log(
      `installed package ran an exec in ${sandboxId} through its agent ${agent.version} (${agent.arch}) (${path.basename(require.resolve('trueforge-docker-sandbox', { paths: [process.cwd()] }))})`,
    )
  } finally {
    await provider.removeSandbox(sandboxId)
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
