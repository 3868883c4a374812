'use strict'

// This package's addon, used through its public JS entry exactly as a host would use it.

const path = require('node:path')

const { IMAGE, NETWORK, ADDON_NAMESPACE, benchLabels } = require('./common')

const PACKAGE_DIR = path.resolve(__dirname, '..', '..')
let mod = null

/**
 * Loads the package, retrying for a while: another process may be rebuilding the .node file,
 * and a require caught half-way through that fails transiently.
 */
async function load({ tries = 20, delayMs = 1500 } = {}) {
  if (mod) return mod
  let last
  for (let i = 0; i < tries; i++) {
    try {
      mod = require(PACKAGE_DIR)
      return mod
    } catch (e) {
      last = e
      for (const k of Object.keys(require.cache))
        if (k.startsWith(PACKAGE_DIR + path.sep) && !k.includes('node_modules')) delete require.cache[k]
      await new Promise((r) => setTimeout(r, delayMs))
    }
  }
  throw new Error(`could not load the addon from ${PACKAGE_DIR}: ${last && last.message}`)
}

/**
 * An implementation over one provider. `extra` is passed to the constructor as is (e.g.
 * `{ warmPool: { size } }`), so a variant is one more call; the constructor's error (an unknown
 * option, say) is thrown to the caller.
 */
function create({ namespace = ADDON_NAMESPACE, name = 'addon', extra = {}, socket } = {}) {
  if (!mod) throw new Error('call load() first')
  const provider = new mod.DockerSandboxProvider({
    image: IMAGE,
    namespace,
    labels: benchLabels(name),
    // Large enough for the 100 MiB transfers and the 1 MiB exec output.
    fileMaxBytes: 200 * 1024 * 1024,
    maxOutputBytes: 4 * 1024 * 1024,
    execTimeoutMs: 120_000,
    ...(socket ? { dockerHost: `unix://${socket}` } : {}),
    ...(NETWORK ? { network: NETWORK } : {}),
    ...extra,
  })
  const made = new Set()

  async function createSandbox() {
    const { sandboxId } = await provider.createSandbox()
    made.add(sandboxId)
    return sandboxId
  }

  async function exec(sandboxId, command) {
    const r = await provider.exec({ sandboxId, command })
    if (!r.success) throw new Error(`exec failed: ${r.error}`)
    return { exitCode: r.response.exitCode, output: r.response.result }
  }

  async function upload(sandboxId, remotePath, content) {
    await provider.uploadFile({ sandboxId, remotePath, content })
  }

  async function download(sandboxId, remotePath) {
    return provider.downloadFile({ sandboxId, path: remotePath })
  }

  async function remove(sandboxId) {
    await provider.removeSandbox(sandboxId)
    made.delete(sandboxId)
  }

  async function cleanup() {
    await Promise.allSettled([...made].map((id) => remove(id)))
    // A provider with a warm pool may offer a way to stop it; the label sweep catches the rest.
    for (const m of ['close', 'dispose', 'shutdown']) {
      if (typeof provider[m] === 'function') {
        try {
          await provider[m]()
        } catch {
          // best effort
        }
        break
      }
    }
  }

  return { name, createSandbox, exec, upload, download, remove, cleanup, provider }
}

module.exports = { load, create }
