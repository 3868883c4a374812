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

/**
 * A unix-socket proxy in front of the engine. `watch(client, upstream)` sees each connection's two
 * sides before they are piped (to listen to their data) and may return what to do when the
 * connection closes. Resolves { socket, close() }.
 */
async function proxyEngine(tag, watch) {
  const socket = path.join(os.tmpdir(), `trueforge-bench-${tag}-${process.pid}.sock`)
  fs.rmSync(socket, { force: true })
  const conns = new Set()
  const server = net.createServer((client) => {
    const upstream = net.connect(SOCKET)
    conns.add(client).add(upstream)
    const closing = watch(client, upstream)
    client.pipe(upstream)
    upstream.pipe(client)
    const close = () => {
      if (closing) closing()
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
    async close() {
      for (const c of conns) c.destroy()
      await new Promise((r) => server.close(r))
      fs.rmSync(socket, { force: true })
    },
  }
}

/** Starts the counting proxy; resolves { socket, take(), close() }. `take()` returns and resets the log. */
async function startProxy() {
  let log = []
  const proxy = await proxyEngine('proxy', (client) => {
    client.on('data', (chunk) => {
      // Clients write a request head in one piece, so a head starts a chunk or follows a
      // newline in it; only the first bytes are scanned so large payloads cost nothing.
      const text = chunk.subarray(0, 4096).toString('latin1')
      REQUEST_LINE.lastIndex = 0
      let m
      while ((m = REQUEST_LINE.exec(text))) log.push(`${m[1]} ${normalize(m[2])}`)
    })
  })
  return {
    socket: proxy.socket,
    take() {
      const out = log
      log = []
      return out
    },
    close: proxy.close,
  }
}

/** `POST /v1.41/containers/3f…/start?x=1` → `POST /containers/{id}/start` */
function normalize(p) {
  return p
    .replace(/\?.*$/, '')
    .replace(/^\/v\d+\.\d+/, '')
    .replace(/^\/(containers|exec|volumes|networks|images)\/(?!create$|json$|prune$)[^/]+/, '/$1/{id}')
}

module.exports = { startProxy, proxyEngine, normalize }
