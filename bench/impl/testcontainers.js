'use strict'

// The same sandbox through the `testcontainers` package, written the way its users write it:
//   create   = new GenericContainer(image)…withCopyArchivesToContainer(layout)…start() (its
//              default wait strategy; the same keep-alive command, Init: true)
//   exec     = container.exec(['sh', '-c', command]) (exit code from its own exec inspect)
//   upload   = container.copyContentToContainer([{ content, target }])
//   download = container.copyArchiveFromContainer(path), untarred with tar-stream
//   remove   = container.stop() (which removes it)
// Its Ryuk reaper is turned off: it would be one more container, outliving the run; every
// container here carries the bench labels and is stopped by the bench instead.

process.env.TESTCONTAINERS_RYUK_DISABLED = 'true'

const { SOCKET, IMAGE, NETWORK, KEEPALIVE_ENTRYPOINT, benchLabels, layoutTar, firstFile } = require('./common')

const { GenericContainer } = require('testcontainers')

/** The library has no option for the engine's init process; a subclass may set its host config. */
class SandboxContainer extends GenericContainer {
  constructor(image) {
    super(image)
    this.hostConfig.Init = true
  }
}

// The library's engine client is one per process, made on first use from DOCKER_HOST (else the
// usual socket). Setting DOCKER_HOST here would reach the bench's child processes, and the gVisor
// one picks its engine from it.
const ENGINE_SOCKET = (process.env.DOCKER_HOST || 'unix:///var/run/docker.sock').replace(/^unix:\/\//, '')

function create({ socket = SOCKET } = {}) {
  if (socket !== ENGINE_SOCKET) {
    throw new Error(
      `testcontainers reads its engine from DOCKER_HOST once per process (${ENGINE_SOCKET} here), so it cannot be pointed at ${socket}`,
    )
  }
  const started = new Map()

  async function createSandbox() {
    let c = new SandboxContainer(IMAGE)
      .withEntrypoint(KEEPALIVE_ENTRYPOINT)
      .withLabels(benchLabels('testcontainers'))
      .withCopyArchivesToContainer([{ tar: layoutTar(), target: '/' }])
    if (NETWORK) c = c.withNetworkMode(NETWORK)
    const s = await c.start()
    started.set(s.getId(), s)
    return s.getId()
  }

  function get(id) {
    const s = started.get(id)
    // A started container's handle cannot be rebuilt from an id (in another process, say).
    if (!s) throw new Error(`testcontainers: no started container ${id} in this process`)
    return s
  }

  async function exec(id, command) {
    const r = await get(id).exec(['sh', '-c', command])
    return { exitCode: r.exitCode, output: r.output }
  }

  async function upload(id, remotePath, content) {
    await get(id).copyContentToContainer([{ content, target: remotePath, mode: 0o644 }])
  }

  async function download(id, remotePath) {
    const stream = await get(id).copyArchiveFromContainer(remotePath)
    return firstFile(stream, remotePath)
  }

  async function remove(id) {
    const s = started.get(id)
    if (!s) return
    try {
      await s.stop()
    } catch (e) {
      if (e.statusCode !== 404 && e.statusCode !== 409) throw e
    }
    started.delete(id)
  }

  async function cleanup() {
    await Promise.allSettled([...started.keys()].map((id) => remove(id)))
  }

  return {
    name: 'testcontainers',
    createSandbox,
    exec,
    upload,
    download,
    remove,
    cleanup,
    // Why the memory probe leaves it out: the probe's child process gets a container id only.
    noProbe: "a started container (StartedTestContainer) cannot be rebuilt from an id in the probe's child process",
  }
}

module.exports = { create }
