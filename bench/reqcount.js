'use strict'

// A counting proxy for the engine socket: every implementation can be pointed at it (the addon
// through `dockerHost`, dockerode through `socketPath`, the CLI through DOCKER_HOST), and it
// records each HTTP request line the client sends. Used only in an untimed pass, to show how
// many engine round trips each operation costs and which ones.

const net = require('node:net')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const { SOCKET } = require('./impl/common')

const REQUEST_LINE = /(?:^|\n)(GET|HEAD|POST|PUT|DELETE) (\S+) HTTP\/1\.[01]\r\n/g

/** Starts the proxy; resolves { socket, take(), close() }. `take()` returns and resets the log. */
async function startProxy() {
  const socket = path.join(os.tmpdir(), `trueforge-bench-proxy-${process.pid}.sock`)
  try {
    fs.unlinkSync(socket)
  } catch {
    // not there
  }
  let log = []
  const conns = new Set()
  const server = net.createServer((client) => {
    const upstream = net.connect(SOCKET)
    conns.add(client).add(upstream)
    client.on('data', (chunk) => {
      // Clients write a request head in one piece, so a head starts a chunk or follows a
      // newline in it; only the first bytes are scanned so large payloads cost nothing.
      const text = chunk.subarray(0, 4096).toString('latin1')
      REQUEST_LINE.lastIndex = 0
      let m
      while ((m = REQUEST_LINE.exec(text))) log.push(`${m[1]} ${normalize(m[2])}`)
    })
    client.pipe(upstream)
    upstream.pipe(client)
    const close = () => {
      client.destroy()
      upstream.destroy()
      conns.delete(client)
      conns.delete(upstream)
    }
    client.on('error', close).on('close', close)
    upstream.on('error', close).on('close', close)
  })
  await new Promise((resolve, reject) => server.listen(socket, resolve).on('error', reject))
  return {
    socket,
    take() {
      const out = log
      log = []
      return out
    },
    async close() {
      for (const c of conns) c.destroy()
      await new Promise((r) => server.close(r))
      try {
        fs.unlinkSync(socket)
      } catch {
        // gone
      }
    },
  }
}

/** `POST /v1.41/containers/3f…/start?x=1` → `POST /containers/{id}/start` */
function normalize(p) {
  return p
    .replace(/\?.*$/, '')
    .replace(/^\/v\d+\.\d+/, '')
    .replace(/^\/(containers|exec)\/(?!create$|json$)[^/]+/, '/$1/{id}')
}

module.exports = { startProxy }
