'use strict'

// The floor: the fewest raw Engine API requests that do each job, over the unix socket with
// Node's `http` module and nothing else. No version negotiation, no inspect-before-use, no
// layout, no stat before a download.
//   create   = POST /containers/create + POST /containers/{id}/start
//   exec     = POST /containers/{id}/exec + POST /exec/{id}/start (Detach:false, raw stream to
//              EOF) + GET /exec/{id}/json (exit code)
//   upload   = one PUT /containers/{id}/archive
//   download = one GET /containers/{id}/archive
// `createExecStream` is the same floor with its files moved through an exec's streams instead
// (`cat > path` fed on the hijacked stdin; `cat path` read from the output): the most any
// transport over the engine's exec stream (the in-sandbox agent's) can move.

const http = require('node:http')
const net = require('node:net')

const {
  SOCKET,
  IMAGE,
  NETWORK,
  KEEPALIVE_ENTRYPOINT,
  benchLabels,
  BENCH_LABEL,
  tarHeader,
  tarTrailer,
  tarLength,
  SingleFileReader,
  splitPath,
  layoutTar,
  fewAtATime,
} = require('./common')

/** A tiny HTTP-over-unix-socket client: `send` (response body unread) and `json`. */
function client(socketPath = SOCKET) {
  // Control requests reuse connections (as any real client would); the hijacked exec stream
  // gets its own connection because the engine closes it at the end.
  const agent = new http.Agent({ keepAlive: true, maxSockets: 256 })

  function send(method, path, { body, headers = {}, ag = agent } = {}) {
    return new Promise((resolve, reject) => {
      const req = http.request({ socketPath, method, path, headers, agent: ag }, resolve)
      req.on('error', reject)
      if (body === undefined) req.end()
      else if (typeof body === 'function')
        body(req) // the caller streams the body
      else req.end(body)
    })
  }

  /** A JSON request; throws with the engine's message on an unexpected status. */
  async function json(method, path, payload, ok = [200, 201, 204]) {
    const body = payload === undefined ? undefined : Buffer.from(JSON.stringify(payload))
    const headers = body ? { 'Content-Type': 'application/json', 'Content-Length': body.length } : {}
    const res = await send(method, path, { body, headers })
    const text = (await readAll(res)).toString('utf8')
    if (!ok.includes(res.statusCode)) throw new Error(`${method} ${path}: ${res.statusCode} ${text.trim()}`)
    return { status: res.statusCode, data: text ? JSON.parse(text) : null }
  }

  return { send, json, agent }
}

function readAll(res) {
  return new Promise((resolve, reject) => {
    const chunks = []
    res.on('data', (c) => chunks.push(c))
    res.on('end', () => resolve(Buffer.concat(chunks)))
    res.on('error', reject)
  })
}

/**
 * Parses the engine's multiplexed stream (8-byte frame headers) without copying payloads:
 * stdout and stderr frames are kept in arrival order as slices of the received chunks.
 */
class Demux {
  constructor() {
    this.head = Buffer.alloc(0)
    this.left = 0
    this.parts = []
  }

  push(chunk) {
    let off = 0
    while (off < chunk.length) {
      if (this.left > 0) {
        const n = Math.min(this.left, chunk.length - off)
        this.parts.push(chunk.subarray(off, off + n))
        this.left -= n
        off += n
        continue
      }
      const take = chunk.subarray(off, off + 8 - this.head.length)
      this.head = this.head.length ? Buffer.concat([this.head, take]) : take
      off += take.length
      if (this.head.length === 8) {
        this.left = this.head.readUInt32BE(4)
        this.head = Buffer.alloc(0)
      }
    }
  }

  text() {
    return Buffer.concat(this.parts).toString('utf8')
  }
}

function create({ socket = SOCKET } = {}) {
  const { send, json } = client(socket)
  const made = new Set()

  async function createSandbox() {
    const { data } = await json('POST', '/containers/create', {
      Image: IMAGE,
      Entrypoint: KEEPALIVE_ENTRYPOINT,
      Labels: benchLabels('floor'),
      AttachStdout: false,
      AttachStderr: false,
      HostConfig: { Init: true, ...(NETWORK ? { NetworkMode: NETWORK } : {}) },
    })
    made.add(data.Id)
    const layout = layoutTar()
    const res = await send('PUT', `/containers/${data.Id}/archive?path=%2F`, {
      headers: { 'Content-Type': 'application/x-tar', 'Content-Length': layout.length },
      body: (req) => req.end(layout),
    })
    const text = (await readAll(res)).toString()
    if (res.statusCode !== 200) throw new Error(`layout: ${res.statusCode} ${text.trim()}`)
    await json('POST', `/containers/${data.Id}/start`)
    return data.Id
  }

  async function exec(id, command) {
    const { data } = await json('POST', `/containers/${id}/exec`, {
      Cmd: ['sh', '-c', command],
      AttachStdout: true,
      AttachStderr: true,
    })
    // Without an Upgrade header the engine answers 200 and streams until it closes the
    // connection when the command's output ends.
    const body = Buffer.from('{"Detach":false,"Tty":false}')
    const res = await send('POST', `/exec/${data.Id}/start`, {
      body,
      headers: { 'Content-Type': 'application/json', 'Content-Length': body.length },
      ag: false,
    })
    if (res.statusCode !== 200) {
      throw new Error(`exec start: ${res.statusCode} ${(await readAll(res)).toString().trim()}`)
    }
    const demux = new Demux()
    await new Promise((resolve, reject) => {
      res.on('data', (c) => demux.push(c))
      res.on('end', resolve)
      res.on('error', reject)
      res.on('aborted', resolve) // the engine may close without a clean end
    })
    return { exitCode: await exitCode(json, data.Id), output: demux.text() }
  }

  async function upload(id, remotePath, content) {
    const { dir, name } = splitPath(remotePath)
    const res = await send('PUT', `/containers/${id}/archive?path=${encodeURIComponent(dir)}`, {
      headers: { 'Content-Type': 'application/x-tar', 'Content-Length': tarLength(content.length) },
      body: (req) => {
        // Header, the caller's buffer as is (no copy), then padding and the end blocks.
        req.write(tarHeader(name, content.length))
        req.write(content)
        req.end(tarTrailer(content.length))
      },
    })
    const text = (await readAll(res)).toString()
    if (res.statusCode !== 200) throw new Error(`upload: ${res.statusCode} ${text.trim()}`)
  }

  async function download(id, remotePath) {
    const res = await send('GET', `/containers/${id}/archive?path=${encodeURIComponent(remotePath)}`)
    if (res.statusCode !== 200) {
      throw new Error(`download: ${res.statusCode} ${(await readAll(res)).toString().trim()}`)
    }
    const reader = new SingleFileReader()
    await new Promise((resolve, reject) => {
      res.on('data', (c) => {
        try {
          reader.push(c)
        } catch (e) {
          res.destroy()
          reject(e)
        }
      })
      res.on('end', resolve)
      res.on('error', reject)
    })
    return reader.result()
  }

  async function remove(id) {
    await removeContainer(json, id)
    made.delete(id)
  }

  async function cleanup() {
    await fewAtATime(made, (id) => remove(id))
  }

  return { name: 'floor', createSandbox, exec, upload, download, remove, cleanup }
}

/** Files through an exec's streams; only transfers are measured with it. */
function createExecStream({ socket = SOCKET } = {}) {
  const base = create({ socket })
  const { json } = client(socket)

  async function start(id, cmd, stdin) {
    const { data } = await json('POST', `/containers/${id}/exec`, {
      Cmd: ['sh', '-c', cmd],
      AttachStdin: stdin,
      AttachStdout: true,
      AttachStderr: true,
    })
    // A hijacked connection of its own (the engine closes it when the command ends).
    const sock = net.connect(socket)
    await new Promise((resolve, reject) => {
      sock.once('connect', resolve)
      sock.once('error', reject)
    })
    const body = '{"Detach":false,"Tty":false}'
    sock.write(
      `POST /exec/${data.Id}/start HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\n` +
        `Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    )
    const demux = new Demux()
    const ended = new Promise((resolve, reject) => {
      let head = Buffer.alloc(0)
      let upgraded = false
      sock.on('data', (c) => {
        if (upgraded) return demux.push(c)
        head = Buffer.concat([head, c])
        const at = head.indexOf('\r\n\r\n')
        if (at < 0) return
        const status = head.subarray(0, head.indexOf('\r\n')).toString('latin1')
        if (!/ 101 /.test(status)) return reject(new Error(`exec start: ${status}`))
        upgraded = true
        demux.push(head.subarray(at + 4))
      })
      sock.on('end', resolve)
      sock.on('close', resolve)
      sock.on('error', reject)
    })
    return { sock, demux, ended, execId: data.Id }
  }

  async function finish({ ended, execId }, what) {
    await ended
    const code = await exitCode(json, execId)
    if (code !== 0) throw new Error(`${what}: exit code ${code}`)
  }

  async function upload(id, remotePath, content) {
    const run = await start(id, `cat > '${remotePath}'`, true)
    // The caller's buffer as is, then a half-close: the command's stdin ends.
    if (!run.sock.write(content)) await new Promise((r) => run.sock.once('drain', r))
    run.sock.end()
    await finish(run, 'upload')
  }

  async function download(id, remotePath) {
    const run = await start(id, `cat '${remotePath}'`, false)
    await finish(run, 'download')
    return Buffer.concat(run.demux.parts)
  }

  // Files a download reads are placed through the archive endpoint (`seed`): a raw exec's stdin
  // has been seen to lose its last bytes when the connection closes (the engine's race, which a
  // framed protocol reports rather than suffers), and a download must start from a whole file.
  return { ...base, name: 'floor (exec stream)', upload, download, seed: base.upload, only: /^(upload|download)_/ }
}

/** The exec's exit code; the engine may still be recording it when the stream ends. */
async function exitCode(json, execId) {
  for (let i = 0; i < 200; i++) {
    const { data } = await json('GET', `/exec/${execId}/json`)
    if (!data.Running) return data.ExitCode
    await new Promise((r) => setTimeout(r, 5))
  }
  throw new Error('exec output ended but the engine still reports it running')
}

async function removeContainer(json, id) {
  await json('DELETE', `/containers/${id}?force=true&v=true`, undefined, [200, 204, 404, 409])
}

// Helpers run.js uses for setup and cleanup (they are not part of any measurement).
const admin = client()

/** Force-removes every container carrying `label` (`key=value`); returns how many. */
async function sweep(label) {
  const filters = encodeURIComponent(JSON.stringify({ label: [label] }))
  const { data } = await admin.json('GET', `/containers/json?all=true&filters=${filters}`)
  await fewAtATime(data, (c) => removeContainer(admin.json, c.Id))
  return data.length
}

async function engineVersion() {
  return (await admin.json('GET', '/version')).data
}

async function imageExists(image) {
  const res = await admin.json('GET', `/images/${encodeURIComponent(image)}/json`, undefined, [200, 404])
  return res.status === 200
}

/** Makes a bridge network `name` (labelled for cleanup) unless it exists; true when made. */
async function ensureNetwork(name) {
  const res = await admin.json('GET', `/networks/${encodeURIComponent(name)}`, undefined, [200, 404])
  if (res.status === 200) return false
  await admin.json('POST', '/networks/create', {
    Name: name,
    Driver: 'bridge',
    CheckDuplicate: true,
    Labels: { [BENCH_LABEL]: '1' },
  })
  return true
}

/** Removes the bench's networks (those carrying the bench label). */
async function sweepNetworks() {
  const filters = encodeURIComponent(JSON.stringify({ label: [`${BENCH_LABEL}=1`] }))
  const { data } = await admin.json('GET', `/networks?filters=${filters}`)
  await Promise.allSettled(data.map((n) => admin.json('DELETE', `/networks/${n.Id}`, undefined, [200, 204, 404])))
  return data.length
}

module.exports = { client, create, createExecStream, sweep, engineVersion, imageExists, ensureNetwork, sweepNetworks }
