'use strict'

// One provider in a fresh process whose environment the test chose (jest gives test files a
// copy of process.env, which the addon never sees). argv[2]: the provider options as JSON. It
// creates a sandbox, runs `echo over-tls; pwd`, uploads and downloads a file, removes the
// sandbox, and prints one JSON line: { dockerHost, sandboxId, exec, downloaded, ms } or
// { dockerHost?, error: { code, message, name }, ms }, plus `logs` (every line the provider
// logged, with its meta) so a test can check that no secret was ever logged.
const path = require('node:path')

const { DockerSandboxProvider } = require(path.resolve(__dirname, '..', '..'))

async function main() {
  const started = Date.now()
  const out = {}
  let provider
  let sandboxId
  try {
    out.logs = []
    const log = (level) => (message, meta) => out.logs.push({ level, message, meta })
    const logger = { debug: log('debug'), info: log('info'), warn: log('warn'), error: log('error') }
    provider = new DockerSandboxProvider({ logger, ...JSON.parse(process.argv[2]) })
    out.dockerHost = provider.dockerHost
    ;({ sandboxId } = await provider.createSandbox())
    out.sandboxId = sandboxId
    out.exec = await provider.exec({ sandboxId, command: 'echo over-tls; pwd' })
    await provider.uploadFile({ sandboxId, remotePath: `${sandboxId}/a.txt`, content: Buffer.from('tls bytes') })
    out.downloaded = (await provider.downloadFile({ sandboxId, path: `${sandboxId}/a.txt` })).toString()
  } catch (e) {
    out.error = { code: e.code, message: e.message, name: e.constructor && e.constructor.name }
  } finally {
    if (provider && sandboxId) await provider.removeSandbox(sandboxId).catch(() => {})
    if (provider) provider.dispose()
  }
  out.ms = Date.now() - started
  process.stdout.write(`${JSON.stringify(out)}\n`)
}

main()
