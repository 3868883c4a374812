'use strict'

// The timeline of one create and its first exec, as the engine sees it: a unix-socket proxy in
// front of the engine (like reqcount.js) logs each request's method, path, start (the request
// head's first byte) and end (the last response byte before the next request on that connection,
// or its close), relative to the start of the create call; a hijacked exec stream (a 101
// answer) is logged with its span and the first few chunks each way (the agent's hello, the
// host's first frames), so the agent's start and the first exec show on it.
//
//   node timeline.js [runs=5]            the addon (the bench's settings: default bridge)
//   BENCH_NETWORK=none node timeline.js  another network (the floor joins it too)
//   TIMELINE_BYTES=1 node timeline.js 1  also the first bytes of the stream's chunks from the engine
//
// Each run makes a sandbox with the addon and runs `true` in it, then makes the floor's (raw
// create + layout + start, then a raw exec), and removes both. One untimed addon create first
// warms what the process keeps (the engine connection, image readiness). Prints each run's
// timeline, then medians per phase over the runs.

const os = require('node:os')

const { NETWORK } = require('./impl/common')
const { proxyEngine, normalize } = require('./reqcount')
const addon = require('./impl/addon')
const floor = require('./impl/floor')

const REQUEST_LINE = /^(GET|HEAD|POST|PUT|DELETE) (\S+) HTTP\/1\.[01]\r\n/
const CHUNKS_KEPT = 16
// TIMELINE_BYTES=1: show each kept chunk's first bytes from the engine.
const SHOW_BYTES = process.env.TIMELINE_BYTES === '1'
const now = () => Number(process.hrtime.bigint()) / 1e6

/** Starts the timing proxy; resolves { socket, take(), close() }. `take()` returns and resets the log. */
async function startTimingProxy() {
  let log = []
  const proxy = await proxyEngine('timeline', (client, upstream) => {
    let current = null // the request whose answer is being read on this connection
    const finish = (closing = false) => {
      if (!current || current.hijacked) return
      // An exec start without an upgrade streams until the engine closes the connection.
      current.end = closing && current.streamsToClose ? now() : (current.lastByte ?? now())
    }
    client.on('data', (chunk) => {
      const t = now()
      if (current && current.hijacked) {
        if (current.up.length < CHUNKS_KEPT) current.up.push([t, chunk.length])
        return
      }
      // Clients write a request head in one piece, at the start of a chunk; a body's later
      // chunks do not match.
      const m = REQUEST_LINE.exec(chunk.subarray(0, 4096).toString('latin1'))
      if (!m) return
      finish()
      current = { method: m[1], path: normalize(m[2]), start: t, end: null, lastByte: null }
      current.upgrade = /\r\nUpgrade:/i.test(chunk.subarray(0, 4096).toString('latin1'))
      current.streamsToClose = !current.upgrade && current.path === '/exec/{id}/start'
      log.push(current)
    })
    upstream.on('data', (chunk) => {
      const t = now()
      if (!current) return
      if (current.hijacked && current.inHead) return scanHead(chunk, t)
      if (current.hijacked) {
        if (current.down.length < CHUNKS_KEPT) current.down.push([t, chunk.length, chunk.subarray(0, 24)])
        current.lastByte = t
        return
      }
      current.lastByte = t
      if (current.upgrade && chunk.subarray(0, 12).toString('latin1') === 'HTTP/1.1 101') {
        Object.assign(current, { hijacked: true, inHead: true, headTail: Buffer.alloc(0), up: [], down: [] })
        scanHead(chunk, t)
      }
    })
    // The 101 answer's head may come in several chunks; the stream starts after its blank line.
    const scanHead = (chunk, t) => {
      const seen = Buffer.concat([current.headTail, chunk])
      const at = seen.indexOf('\r\n\r\n')
      if (at < 0) {
        current.headTail = seen.subarray(-3)
        return
      }
      current.inHead = false
      current.end = t
      if (at + 4 < seen.length) current.down.push([t, seen.length - at - 4, seen.subarray(at + 4, at + 28)])
    }
    return () => {
      finish(true)
      if (current && current.hijacked && current.closed === undefined) current.closed = now()
    }
  })
  return {
    socket: proxy.socket,
    take() {
      const out = log
      log = []
      // A keep-alive connection's last answer has no next request to end it yet.
      for (const e of out) if (e.end === null && !e.hijacked && !e.streamsToClose) e.end = e.lastByte ?? now()
      return out
    },
    close: proxy.close,
  }
}

const ms = (x) => (x === null || x === undefined ? '     -' : x.toFixed(1).padStart(6))

/** One run's lines, times relative to `t0`; marks (create/exec calls) interleaved. */
function render(entries, t0, marks) {
  const rows = []
  for (const e of entries) {
    let line = `${ms(e.start - t0)} ${ms(e.end === null ? null : e.end - t0)}  ${(e.end - e.start).toFixed(1).padStart(6)} ms  ${e.method} ${e.path}`
    if (e.hijacked) {
      const fmt = (xs) =>
        xs
          .map(
            ([t, n, head]) =>
              `${(t - t0).toFixed(1)}(${n}B${head && SHOW_BYTES ? ` ${JSON.stringify(head.toString('latin1'))}` : ''})`,
          )
          .join(' ')
      line += `  [stream: down ${fmt(e.down)}; up ${fmt(e.up)}${e.closed ? `; closed ${(e.closed - t0).toFixed(1)}` : ''}]`
    }
    rows.push([e.start, line])
  }
  for (const [t, text] of marks) rows.push([t, `${ms(t - t0)}         ${''.padStart(9)}  -- ${text}`])
  return rows.sort((a, b) => a[0] - b[0]).map((r) => r[1])
}

/** Named phases of one addon run, in ms. */
function addonPhases(entries, t0, created, execd) {
  const first = (pred) => entries.find(pred)
  const ph = {}
  const put = (name, e) => {
    if (e) ph[name] = e.end - e.start
  }
  put(
    'container create',
    first((e) => e.method === 'POST' && e.path === '/containers/create'),
  )
  put(
    'container start',
    first((e) => e.method === 'POST' && e.path === '/containers/{id}/start'),
  )
  const inspects = entries.filter((e) => e.method === 'GET' && /^\/containers\/\{id\}\/json$/.test(e.path))
  ph['inspects (sum)'] = inspects.reduce((s, e) => s + (e.end - e.start), 0)
  ph['inspects (count)'] = inspects.length
  put(
    'agent exec create',
    first((e) => e.method === 'POST' && e.path === '/containers/{id}/exec'),
  )
  const stream = first((e) => e.hijacked)
  if (stream) {
    ph['agent exec start (101)'] = stream.end - stream.start
    // The hello: the agent's last chunk before the host's first frame (a launcher's output
    // may come before it).
    const firstUp = stream.up[0]
    const hello = firstUp ? stream.down.filter(([t]) => t <= firstUp[0]).pop() : stream.down[0]
    if (hello) {
      ph['exec start → hello'] = hello[0] - stream.start
      if (firstUp) ph['hello → first host frame'] = firstUp[0] - hello[0]
      ph['hello → createSandbox() resolved'] = created - hello[0]
    }
    ph['round trips on the stream before resolved'] = stream.up.filter(([t]) => t < created).length
    // The first exec: its request frame going up, the agent's answer coming down.
    const req = stream.up.find(([t]) => t >= created)
    const res = req && stream.down.find(([t]) => t > req[0])
    if (res) {
      ph['exec: call → request frame on the socket'] = req[0] - created
      ph['exec: request frame → answer (engine + agent)'] = res[0] - req[0]
      ph['exec: answer → promise resolved'] = execd - res[0]
    }
  }
  ph['requests (count)'] = entries.length
  ph['engine busy (sum of request spans)'] = entries
    .filter((e) => !e.hijacked)
    .reduce((s, e) => s + (e.end - e.start), 0)
  ph['createSandbox() total'] = created - t0
  ph['first exec true'] = execd - created
  ph['create + first exec'] = execd - t0
  return ph
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2
}

async function main() {
  const runs = Number(process.argv[2] || 5)
  const proxy = await startTimingProxy()
  await addon.load()
  const im = addon.create({ name: 'addon (timeline)', namespace: 'bench-timeline', socket: proxy.socket })
  const fl = floor.create({ socket: proxy.socket })
  const all = { addon: [], floor: [] }
  console.log(`network: ${NETWORK || 'the default bridge'}; load average ${os.loadavg()[0].toFixed(2)}`)
  try {
    // Warm what the process keeps; not counted.
    const warm = await im.createSandbox()
    await im.exec(warm, 'true')
    await im.remove(warm)
    proxy.take()
    for (let i = 0; i < runs; i++) {
      const t0 = now()
      const id = await im.createSandbox()
      const created = now()
      await im.exec(id, 'true')
      const execd = now()
      const entries = proxy.take()
      console.log(`\naddon run ${i + 1} (start ms, end ms, span; load ${os.loadavg()[0].toFixed(2)})`)
      const marks = [
        [created, `createSandbox() resolved (${(created - t0).toFixed(1)} ms)`],
        [execd, `exec('true') resolved (${(execd - created).toFixed(1)} ms)`],
      ]
      for (const line of render(entries, t0, marks)) console.log(`  ${line}`)
      all.addon.push(addonPhases(entries, t0, created, execd))
      await im.remove(id)
      proxy.take()

      const f0 = now()
      const fid = await fl.createSandbox()
      const fcreated = now()
      await fl.exec(fid, 'true')
      const fexecd = now()
      const fentries = proxy.take()
      console.log(`floor run ${i + 1}`)
      const fmarks = [
        [fcreated, `create resolved (${(fcreated - f0).toFixed(1)} ms)`],
        [fexecd, `exec resolved (${(fexecd - fcreated).toFixed(1)} ms)`],
      ]
      for (const line of render(fentries, f0, fmarks)) console.log(`  ${line}`)
      const fph = {}
      for (const e of fentries) {
        const k = `${e.method} ${e.path}`
        fph[k] = (fph[k] || 0) + (e.end - e.start)
      }
      fph['create total'] = fcreated - f0
      fph['exec total'] = fexecd - fcreated
      fph['create + first exec'] = fexecd - f0
      all.floor.push(fph)
      await fl.remove(fid)
      proxy.take()
    }
  } finally {
    await im.cleanup()
    await fl.cleanup()
    await proxy.close()
  }
  for (const [name, list] of Object.entries(all)) {
    console.log(`\n${name}: medians over ${list.length} runs (ms; load ${os.loadavg()[0].toFixed(2)})`)
    const keys = [...new Set(list.flatMap((p) => Object.keys(p)))]
    for (const k of keys) {
      const vals = list.map((p) => p[k]).filter((v) => v !== undefined)
      console.log(
        `  ${k.padEnd(40)} ${median(vals).toFixed(1).padStart(7)}   [${vals.map((v) => v.toFixed(1)).join(', ')}]`,
      )
    }
  }
}

main().catch((e) => {
  console.error(e)
  process.exitCode = 1
})
