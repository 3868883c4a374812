'use strict'
// Runs one exec through the package as a consumer installed it (from the packed tarball),
// resolving `trueforge-docker-sandbox` from the current directory's node_modules, and checks it
// went through the in-sandbox agent the tarball carries.
const { createRequire } = require('node:module')
const path = require('node:path')

// Resolved as a file in the current directory would: this script sits inside the package's own
// folder, where its name would resolve to the package itself (self-reference through `exports`).
const installed = createRequire(path.join(process.cwd(), 'consumer.js'))
const entry = installed.resolve('trueforge-docker-sandbox')
if (!entry.startsWith(path.join(process.cwd(), 'node_modules') + path.sep)) {
  throw new Error(`trueforge-docker-sandbox resolved to ${entry}, not to the package installed here`)
}
const { DockerSandboxProvider } = installed(entry)

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
      `installed package ran an exec in ${sandboxId} through its agent ${agent.version} (${agent.arch}) (${path.relative(process.cwd(), entry)})`,
    )
  } finally {
    await provider.removeSandbox(sandboxId)
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
