'use strict'

// What every implementation shares so they do the same work: the image, the keep-alive command
// (the addon's own, so the containers under test are identical), the bench labels used for
// cleanup, and a minimal tar writer/reader for the implementations that may not use tar-stream
// (the floor is Node's `http` only; the CLI one reuses the same helpers).

const fs = require('node:fs')
const path = require('node:path')

const SOCKET = process.env.BENCH_DOCKER_SOCKET || '/var/run/docker.sock'
const IMAGE = process.env.BENCH_IMAGE || 'trueforge-sandbox-busybox:1'
// Empty: the engine's default bridge, as the addon uses by default. A name: every
// implementation joins that network instead (run.js creates it when missing), for engines
// whose default bridge is unusable.
const NETWORK = process.env.BENCH_NETWORK || ''

// The addon's own container main process, INIT_SCRIPT in src/sandbox/body.rs, read from there so a
// change to it reaches the other implementations too (a copy here once went stale). It exits at
// once on SIGTERM, so removals are fast. Its arguments are the idle stop in seconds and the check
// interval: 0, never, because the others have no activity file to keep them alive. The addon
// mounts a volume at /trueforge; without that directory the script's first write to it would end
// the shell, so the others make it first.
const KEEPALIVE_SCRIPT = `mkdir -p /trueforge\n${initScript(path.resolve(__dirname, '..', '..', 'src', 'sandbox', 'body.rs'))}`
const KEEPALIVE_ARGS = ['trueforge-init', '0', '1']
const KEEPALIVE_ENTRYPOINT = ['/bin/sh', '-c', KEEPALIVE_SCRIPT, ...KEEPALIVE_ARGS]

function initScript(file) {
  const m = /pub const INIT_SCRIPT: &str = r#"([\s\S]*?)"#;/.exec(fs.readFileSync(file, 'utf8'))
  if (!m) throw new Error(`no INIT_SCRIPT in ${file}: update bench/impl/common.js to the container's main process`)
  return m[1]
}

// Every container the bench makes carries BENCH_LABEL (the addon's too, via its `labels`
// option), so one label filter finds everything an earlier crashed run left behind.
const BENCH_LABEL = 'trueforge.bench'
const IMPL_LABEL = 'trueforge.bench.impl'
const NAMESPACE_LABEL = 'trueforge.sandbox.namespace'
const ADDON_NAMESPACE = process.env.BENCH_NAMESPACE || 'bench'
const ADDON_WARM_NAMESPACE = `${ADDON_NAMESPACE}-warm`
// The addon with `agent: false`: the engine's exec and archive endpoints, the agent's fallback.
const ADDON_ENGINE_NAMESPACE = `${ADDON_NAMESPACE}-engine`
const ENGINE_PATH = 'addon (engine exec)'

function benchLabels(impl) {
  return { [BENCH_LABEL]: '1', [IMPL_LABEL]: impl }
}

const BLOCK = 512

/** A ustar header for one entry (name relative to the extraction directory); type '0' is a
 * regular file, '5' a directory. */
function tarHeader(name, size, mode = 0o644, type = '0') {
  const h = Buffer.alloc(BLOCK)
  if (Buffer.byteLength(name) > 100) throw new Error(`tar name too long for this helper: ${name}`)
  h.write(name, 0, 100, 'utf8')
  h.write(octal(mode, 8), 100)
  h.write(octal(0, 8), 108) // uid
  h.write(octal(0, 8), 116) // gid
  h.write(octal(size, 12), 124)
  h.write(octal(Math.floor(Date.now() / 1000), 12), 136)
  h.fill(' ', 148, 156) // checksum is computed with its own field as spaces
  h.write(type, 156)
  h.write('ustar\0', 257)
  h.write('00', 263)
  let sum = 0
  for (let i = 0; i < BLOCK; i++) sum += h[i]
  h.write(octal(sum, 7), 148)
  h[155] = 0x20
  return h
}

function octal(n, width) {
  return n.toString(8).padStart(width - 1, '0') + '\0'
}

/** Padding to the next block after `size` bytes of data, plus the two zero blocks ending an archive. */
function tarTrailer(size) {
  const pad = (BLOCK - (size % BLOCK)) % BLOCK
  return Buffer.alloc(pad + 2 * BLOCK)
}

/** Total archive length for one file, for Content-Length. */
function tarLength(size) {
  return BLOCK + size + tarTrailer(size).length
}

/**
 * Streaming reader for an archive holding one regular file (what the engine's GET archive and
 * `docker cp CONTAINER:FILE -` produce). Holds only the file's bytes: the output buffer is
 * allocated once from the header size and chunks are copied straight into it.
 */
class SingleFileReader {
  constructor() {
    this.pending = Buffer.alloc(0) // header bytes not yet complete
    this.skip = 0 // bytes of an extension record (PAX / GNU long name) still to skip
    this.out = null
    this.filled = 0
    this.done = false
  }

  /** Feeds a chunk; returns true once the file is complete. */
  push(chunk) {
    let off = 0
    while (off < chunk.length && !this.done) {
      if (this.out) {
        const n = Math.min(chunk.length - off, this.out.length - this.filled)
        chunk.copy(this.out, this.filled, off, off + n)
        this.filled += n
        off += n
        if (this.filled === this.out.length) this.done = true
        continue
      }
      if (this.skip > 0) {
        const n = Math.min(chunk.length - off, this.skip)
        this.skip -= n
        off += n
        continue
      }
      const need = BLOCK - this.pending.length
      const take = chunk.subarray(off, off + need)
      this.pending = this.pending.length ? Buffer.concat([this.pending, take]) : Buffer.from(take)
      off += take.length
      if (this.pending.length < BLOCK) break
      this.header(this.pending)
      this.pending = Buffer.alloc(0)
    }
    return this.done
  }

  header(h) {
    if (h.every((b) => b === 0)) throw new Error('archive ended before a file entry')
    const size = parseOctal(h.subarray(124, 136))
    const type = String.fromCharCode(h[156] || 0x30)
    if (type === '0' || type === '7') {
      this.out = Buffer.allocUnsafe(size)
      if (size === 0) this.done = true
    } else if (type === 'x' || type === 'g' || type === 'L' || type === 'K') {
      // Extension records describe the next entry: skip their padded bodies.
      this.skip = Math.ceil(size / BLOCK) * BLOCK
    } else {
      throw new Error(`archive entry is not a regular file (type ${JSON.stringify(type)})`)
    }
  }

  result() {
    if (!this.done) throw new Error('archive ended before the file was complete')
    return this.out
  }
}

function parseOctal(field) {
  // GNU base-256 encoding for sizes over 8 GiB is not needed here.
  const s = field.toString('ascii').replace(/\0.*$/s, '').trim()
  return s ? parseInt(s, 8) : 0
}

/**
 * The same work the addon does at create: the sandbox root, TrueForge's layout dirs and the
 * activity file, as one archive extracted at `/` before the container starts. Every
 * alternative makes it, so all of them create the same sandbox.
 */
function layoutTar() {
  const root = `workspace/${Math.random().toString(36).slice(2, 12).toUpperCase()}/`
  const dirs = [
    'trueforge/',
    'trueforge/uploads/',
    'trueforge/skills/',
    'trueforge/tool-results/',
    'trueforge/bin/',
    'workspace/',
    root,
  ]
  const parts = dirs.map((d) => tarHeader(d, 0, 0o755, '5'))
  parts.push(tarHeader('trueforge/.activity', 0))
  parts.push(Buffer.alloc(2 * BLOCK))
  return Buffer.concat(parts)
}

/** `/tmp/a.bin` → { dir: '/tmp', name: 'a.bin' } */
function splitPath(p) {
  return { dir: path.posix.dirname(p), name: path.posix.basename(p) }
}

/**
 * The Code Mode dispatcher the benches call: one MCP server `demo` with one tool, `echo`, which
 * gives back its arguments. The client lists the server's tools before it calls one.
 */
const ECHO_DISPATCHER = {
  close() {},
  async dispatch({ request }) {
    if (request.op === 'list_tools')
      return { ok: true, result: { tools: [{ name: 'echo', annotations: { readOnlyHint: true } }] } }
    return { ok: true, result: { content: [], structuredContent: { echoed: request.arguments ?? {} } } }
  },
}

/** `TFY_MCP_SERVERS` for it: every tool of `demo` allowed. */
const ECHO_SERVERS = Buffer.from(JSON.stringify({ demo: { allowed_tools: [] } })).toString('base64')

/**
 * p50 and p99 of `n` round trips of a 128-byte frame through `cat` on an attached exec stream of
 * container `containerId` (the engine's own hop, which any transport over that stream adds).
 * `socketPath` unset: dockerode's default (DOCKER_HOST, else the usual socket).
 */
async function engineEcho(containerId, n, socketPath) {
  // Required here, not at the top: the floor loads this file and uses Node's `http` only.
  const Docker = require('dockerode')
  const docker = new Docker(socketPath ? { socketPath } : undefined)
  const exec = await docker.getContainer(containerId).exec({ Cmd: ['cat'], AttachStdin: true, AttachStdout: true })
  const stream = await exec.start({ hijack: true, stdin: true })
  const frame = Buffer.alloc(120, 0x61)
  // Each reply is the 120 bytes behind the engine's 8-byte stream header.
  let pending = 0
  let wake = null
  stream.on('data', (b) => {
    pending += b.length
    if (pending >= 128 && wake) {
      pending -= 128
      const w = wake
      wake = null
      w()
    }
  })
  const times = []
  for (let i = 0; i < n + 20; i++) {
    const back = new Promise((r) => (wake = r))
    const t = process.hrtime.bigint()
    stream.write(frame)
    await back
    if (i >= 20) times.push(Number(process.hrtime.bigint() - t) / 1e6)
  }
  stream.end()
  const samples = [...times]
  times.sort((a, b) => a - b)
  const pct = (p) => +times[Math.min(times.length - 1, Math.floor(times.length * p))].toFixed(3)
  return { p50: pct(0.5), p99: pct(0.99), samples }
}

/**
 * What spawning the command's shell costs inside a sandbox, in ms per spawn: a loop of `n`
 * `<shell> -c true` less an empty loop, each the best of three, so the exec carrying the loop
 * cancels out. `exec(command)` runs a command there the way the sandbox's commands run (its user,
 * its shell) and resolves with its output; the shell is the one that runs them, bash where the
 * image has it (as the addon does), else sh.
 */
async function shellSpawnMs(exec, n) {
  const shell = String(await exec('command -v bash >/dev/null && echo bash || echo sh')).trim() || 'sh'
  const loop = async (k) => {
    let best = Infinity
    for (let i = 0; i < 3; i++) {
      const t0 = process.hrtime.bigint()
      await exec(`for i in $(seq ${k}); do ${shell} -c true; done`)
      best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e6)
    }
    return best
  }
  return { shell, ms: ((await loop(n)) - (await loop(0))) / n }
}

/**
 * The first regular file of the tar `stream` (the engine's archive of one path), read with
 * tar-stream as dockerode's and testcontainers' users read it (the floor has `SingleFileReader`).
 */
async function firstFile(stream, remotePath) {
  const extract = require('tar-stream').extract()
  stream.pipe(extract)
  for await (const entry of extract) {
    if (entry.header.type !== 'file') {
      entry.resume()
      continue
    }
    const chunks = []
    for await (const c of entry) chunks.push(c)
    stream.destroy() // one file is all we asked for
    return Buffer.concat(chunks)
  }
  throw new Error(`no file in the archive for ${remotePath}`)
}

/** Runs `fn` over `items` eight at a time, ignoring failures: for removals, which are never
 * timed. Docker 20.10 can deadlock in libnetwork when many containers leave their networks at
 * once (moby issue 46661); 200 removals at once hung the bench. */
async function fewAtATime(items, fn) {
  const list = [...items]
  let next = 0
  const worker = async () => {
    while (next < list.length) await fn(list[next++]).catch(() => {})
  }
  await Promise.all(Array.from({ length: 8 }, worker))
}

module.exports = {
  fewAtATime,
  firstFile,
  ECHO_DISPATCHER,
  ECHO_SERVERS,
  engineEcho,
  shellSpawnMs,
  ADDON_ENGINE_NAMESPACE,
  ENGINE_PATH,
  SOCKET,
  IMAGE,
  NETWORK,
  KEEPALIVE_SCRIPT,
  KEEPALIVE_ARGS,
  KEEPALIVE_ENTRYPOINT,
  BENCH_LABEL,
  IMPL_LABEL,
  NAMESPACE_LABEL,
  ADDON_NAMESPACE,
  ADDON_WARM_NAMESPACE,
  benchLabels,
  tarHeader,
  tarTrailer,
  tarLength,
  layoutTar,
  SingleFileReader,
  splitPath,
}
