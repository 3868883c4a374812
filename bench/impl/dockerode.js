'use strict'

// A minimal dockerode equivalent of the addon, written the way a Node user of dockerode would:
//   create   = createContainer + start (same keep-alive command, Init: true)
//   exec     = exec create + start with hijack, demuxed by docker-modem, wait for the end of
//              the stream, then exec inspect for the exit code
//   upload   = putArchive with a tar-stream pack
//   download = getArchive, untar the single file with tar-stream

const Docker = require('dockerode')
const tar = require('tar-stream')
const { Writable } = require('node:stream')

const {
  SOCKET,
  IMAGE,
  NETWORK,
  KEEPALIVE_ENTRYPOINT,
  benchLabels,
  splitPath,
  layoutTar,
  firstFile,
} = require('./common')

function create({ socket = SOCKET } = {}) {
  const docker = new Docker({ socketPath: socket })
  const made = new Set()

  async function createSandbox() {
    const c = await docker.createContainer({
      Image: IMAGE,
      Entrypoint: KEEPALIVE_ENTRYPOINT,
      Labels: benchLabels('dockerode'),
      HostConfig: { Init: true, ...(NETWORK ? { NetworkMode: NETWORK } : {}) },
    })
    made.add(c.id)
    await c.putArchive(layoutTar(), { path: '/' })
    await c.start()
    return c.id
  }

  async function exec(id, command) {
    const e = await docker.getContainer(id).exec({
      Cmd: ['sh', '-c', command],
      AttachStdout: true,
      AttachStderr: true,
    })
    const stream = await e.start({ hijack: true, stdin: false })
    const chunks = []
    const sink = new Writable({
      write(chunk, _enc, cb) {
        chunks.push(chunk)
        cb()
      },
    })
    await new Promise((resolve, reject) => {
      stream.on('end', resolve)
      stream.on('close', resolve)
      stream.on('error', reject)
      docker.modem.demuxStream(stream, sink, sink)
    })
    // The engine may still be recording the exit code when the stream ends.
    for (let i = 0; i < 200; i++) {
      const info = await e.inspect()
      if (!info.Running) return { exitCode: info.ExitCode, output: Buffer.concat(chunks).toString('utf8') }
      await new Promise((r) => setTimeout(r, 5))
    }
    throw new Error('exec output ended but the engine still reports it running')
  }

  async function upload(id, remotePath, content) {
    const { dir, name } = splitPath(remotePath)
    const pack = tar.pack()
    pack.entry({ name, size: content.length, mode: 0o644 }, content)
    pack.finalize()
    await docker.getContainer(id).putArchive(pack, { path: dir })
  }

  async function download(id, remotePath) {
    const stream = await docker.getContainer(id).getArchive({ path: remotePath })
    return firstFile(stream, remotePath)
  }

  async function remove(id) {
    try {
      await docker.getContainer(id).remove({ force: true, v: true })
    } catch (e) {
      if (e.statusCode !== 404 && e.statusCode !== 409) throw e
    }
    made.delete(id)
  }

  async function cleanup() {
    await Promise.allSettled([...made].map((id) => remove(id)))
  }

  return { name: 'dockerode', createSandbox, exec, upload, download, remove, cleanup }
}

module.exports = { create }
