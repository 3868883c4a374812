#!/usr/bin/env node
'use strict'

// A byte-for-byte TCP/unix-socket forwarder, so a port inside a test engine's own network
// namespace can be reached on the host's loopback: one copy runs inside the namespace
// (`unix:PATH` → `tcp:127.0.0.1:PORT`), one on the host (`tcp:127.0.0.1:PORT` → `unix:PATH`).
// A unix socket is a file, so it crosses namespaces. Usage:
//   node netns-forward.js LISTEN TARGET      (each `tcp:HOST:PORT` or `unix:PATH`)

const net = require('node:net')
const fs = require('node:fs')

function parse(spec) {
  if (spec.startsWith('unix:')) return { path: spec.slice(5) }
  const m = /^tcp:([^:]+):(\d+)$/.exec(spec)
  if (!m) throw new Error(`bad address ${spec}`)
  return { host: m[1], port: Number(m[2]) }
}

const [listen, target] = process.argv.slice(2).map(parse)
if (listen.path) fs.rmSync(listen.path, { force: true })
const server = net.createServer((inbound) => {
  const outbound = net.connect(target)
  inbound.pipe(outbound).pipe(inbound)
  const close = () => {
    inbound.destroy()
    outbound.destroy()
  }
  inbound.on('error', close)
  outbound.on('error', close)
})
server.listen(listen.path ? { path: listen.path } : { host: listen.host, port: listen.port })
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0))
