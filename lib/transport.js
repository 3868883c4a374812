'use strict'

// Code Mode: the relay in the sandbox hands each request to the native session, which calls
// #onRequest here; the reply goes back through the session. The transport checks the request's
// shape and reports its own failures as TrueForge's transports do; the dispatcher does the rest.

const { Socket } = require('node:net')

const { CODE_MODE_MAX_MESSAGE_BYTES, codeModeClient, codeModePlanOps } = require('./loader.js')
const { argumentError, fromNative } = require('./errors.js')
const { parseCodeModeRequest } = require('./validate.js')

// Where TrueForge links the Python CLI when the agent's static `mcp-client` is in place.
const PYTHON_CLI_LINK = '/trueforge/codemode/bin/mcp-client-python'
const MALFORMED_REQUEST = { ok: false, error: 'Malformed Code Mode request', source: 'caller' }

// Each request's values live in V8's heap, where V8 collects them under its own heap limit,
// far above what one sandbox may hold: a token per large request reports their size to V8 as
// external memory until they are collected, so that they are collected promptly instead of
// piling up.
const COSTS = new WeakMap()
// A large request's room in the host's budget comes back once its values are collected, not
// when its dispatcher returns (which may keep them), nor when its caller stops waiting.
const COLLECTED = new FinalizationRegistry(({ session, generation, id }) => {
  session.deref()?.collected(generation, id)
})
// After its dispatcher returned, a large request's room comes back this late at the latest: a
// collector that has not run by then (the room is asked for one) must not stall the sandbox.
const COLLECTION_WAIT_MS = 1000

function traceCarrierOf(v) {
  const out = {}
  const t = v && typeof v === 'object' ? v.trace : undefined
  if (t && typeof t === 'object' && !Array.isArray(t)) {
    for (const k of ['traceparent', 'tracestate']) if (typeof t[k] === 'string') out[k] = t[k]
  }
  return out
}

class DockerCodeModeTransport {
  #native
  #errors
  #session
  #dispatcher

  /** `errors`: the host's classes, as `fromNative` takes them. */
  constructor(native, errors) {
    this.#native = native
    this.#errors = errors
  }

  getClientInstall(_params) {
    const { content, remotePath } = codeModeClient()
    // With the agent, `mcp-client` in the bin directory is the static client the agent links
    // there: TrueForge then links the Python client under another name instead of over it.
    return this.#native.agent ? { content, remotePath, pathBinSymlink: PYTHON_CLI_LINK } : { content, remotePath }
  }

  async start(params) {
    const { codeModeDispatcher, sandboxId, requestTimeoutSeconds } = params ?? {}
    if (typeof sandboxId !== 'string') throw argumentError('start: `sandboxId` must be a string')
    if (!codeModeDispatcher || typeof codeModeDispatcher.dispatch !== 'function') {
      throw argumentError('start: `codeModeDispatcher` must have a dispatch() method')
    }
    this.#dispatcher = codeModeDispatcher
    let session = this.#session
    if (session === undefined) {
      // The native session holds this callback strongly; weak links back to the transport and
      // the session let a transport nobody stopped be collected, and its relay end with it.
      const self = new WeakRef(this)
      /** @type {{ session?: WeakRef<any> }} */
      const link = {}
      session = this.#native.codeModeSession((cost, generation, id, payload, plan) => {
        const transport = self.deref()
        const from = link.session?.deref()
        if (transport === undefined || from === undefined) return
        void transport.#take(from, generation, { id, payload, plan, cost })
      })
      link.session = new WeakRef(session)
      this.#session = session
    }
    const timeout =
      typeof requestTimeoutSeconds === 'number' && Number.isFinite(requestTimeoutSeconds) && requestTimeoutSeconds > 0
        ? requestTimeoutSeconds
        : undefined
    try {
      // A request not answered within the timeout is answered with an error by the session (its
      // room stays held while the dispatcher has it).
      await session.start(sandboxId, timeout)
    } catch (e) {
      throw fromNative(e, this.#errors)
    }
    readLane(session, new WeakRef(this))
    const env = { TFY_CM_SOCK: session.socketPath }
    if (timeout !== undefined) env.TFY_CM_REQUEST_TIMEOUT_SECONDS = String(timeout)
    return { env }
  }

  async stop() {
    const session = this.#session
    this.#session = undefined
    if (session !== undefined) await session.stop()
  }

  /** A request read from a lane of `session` (see `readLane`). */
  static onLaneRequest(transport, session, generation, call) {
    void transport.#take(session, generation, call)
  }

  /**
   * Parses a request `from` a session and dispatches it. A small one is parsed here, at once, so
   * its text is garbage while the dispatcher works; a large one is built by its plan in slices.
   */
  async #take(from, generation, { id, payload, plan, cost }) {
    const parsed = plan ? await parsePlanned(payload, plan) : parseRequest(payload)
    // A large request's values are told to V8 (COSTS) and watched until collected (COLLECTED).
    let watched = false
    if (parsed !== null && cost) {
      const r = parsed.request
      const values = r.op === 'call_tool' && r.arguments !== undefined ? r.arguments : r
      COSTS.set(values, cost)
      COLLECTED.register(values, { session: new WeakRef(from), generation, id })
      watched = true
    }
    return this.#onRequest(from, generation, id, parsed, watched)
  }

  /** Dispatches a request and answers it through the session it came `from`. */
  async #onRequest(from, generation, id, parsed, watched) {
    let reply
    try {
      reply = await this.#dispatch(parsed)
    } catch (e) {
      reply = { ok: false, error: e instanceof Error ? e.message : String(e), source: 'internal' }
    }
    let bytes
    try {
      bytes = Buffer.from(JSON.stringify(reply) ?? 'null', 'utf8')
    } catch (e) {
      bytes = Buffer.from(
        JSON.stringify({
          ok: false,
          error: `Code Mode reply is not JSON: ${/** @type {Error} */ (e).message}`,
          source: 'transport',
        }),
      )
    }
    if (bytes.length > CODE_MODE_MAX_MESSAGE_BYTES) {
      const error = `Code Mode reply of ${bytes.length} bytes exceeds the limit of ${CODE_MODE_MAX_MESSAGE_BYTES} bytes`
      bytes = Buffer.from(JSON.stringify({ ok: false, error, source: 'transport' }))
    }
    // A reply for a relay that has since been replaced or stopped is dropped by the session.
    from.reply(generation, id, bytes, watched)
    if (watched) {
      // Once this call's frames are gone, nothing of ours holds the values: a collection
      // started then can free them.
      setImmediate(() => from.letGo(generation, id))
      setTimeout(() => from.collected(generation, id), COLLECTION_WAIT_MS).unref()
    }
  }

  // Not async: the dispatcher's own promise is awaited as it is (an async wrapper would add
  // turns of the microtask queue to every round trip).
  #dispatch(parsed) {
    if (parsed === null) return MALFORMED_REQUEST
    const dispatcher = this.#dispatcher
    if (dispatcher === undefined) {
      return { ok: false, error: 'Code Mode dispatcher is not configured', source: 'internal' }
    }
    return dispatcher.dispatch(parsed)
  }
}

const NOTHING = Buffer.alloc(0)
const LANE_READ_BYTES = 256 * 1024

/**
 * Reads the session's lane, when its relay has one: the sandbox agent's stream for this socket,
 * read here on the JavaScript thread, so that a request reaches the dispatcher with no native
 * thread in between. The session decodes what is read and keeps the budget and timeouts; it
 * says when to stop reading until there is room. Neither the session nor the transport is held
 * by the stream: one collected ends it.
 */
function readLane(session, transport) {
  const lane = session.takeLane()
  if (lane === null) return
  const { generation, fd } = lane
  const weakSession = new WeakRef(session)
  /** Hands `chunk` to the session and dispatches what it completes; false to stop reading. */
  const take = (chunk) => {
    const s = weakSession.deref()
    const fed = s === undefined ? null : s.feed(generation, chunk)
    if (fed === null) {
      socket.destroy()
      return false
    }
    const t = transport.deref()
    if (t !== undefined) {
      for (const call of fed.calls) DockerCodeModeTransport.onLaneRequest(t, s, generation, call)
    }
    if (!fed.paused) return true
    s.room(generation).then(
      () => {
        if (take(NOTHING)) socket.resume()
      },
      () => socket.destroy(),
    )
    return false
  }
  // Every read lands in this one buffer, which the session copies from at once: a large request
  // then leaves no trail of read buffers for the collector.
  const buffer = Buffer.allocUnsafe(LANE_READ_BYTES)
  const socket = new Socket(
    /** @type {import('node:net').SocketConstructorOpts} */ ({
      fd,
      readable: true,
      writable: false,
      allowHalfOpen: true,
      onread: { buffer, callback: (n, buf) => take(buf.subarray(0, n)) },
    }),
  )
  // The session's relays never keep the process alive.
  socket.unref()
  // What came with the lane's start is taken first; it may already leave no room.
  if (!take(NOTHING)) socket.pause()
  socket.on('end', () => socket.destroy())
  socket.on('error', () => socket.destroy())
  socket.on('close', () => weakSession.deref()?.laneEnded(generation))
}

/** The dispatcher's parameters for one request's text, or null when it is malformed. */
function parseRequest(payload) {
  let value
  try {
    value = JSON.parse(payload)
  } catch {
    return null
  }
  return toDispatch(value)
}

function toDispatch(value) {
  const request = parseCodeModeRequest(value)
  return request === null ? null : { request, traceCarrier: traceCarrierOf(value) }
}

/** As `parseRequest`, for a large request: built from its bytes by its plan, in slices. */
async function parsePlanned(bytes, plan) {
  try {
    return toDispatch(await buildByPlan(bytes, plan))
  } catch {
    return null
  }
}

const OP = codeModePlanOps()
/** The longest the builder holds the event loop before giving it back. */
const SLICE_MS = 8

/**
 * Builds the value of a large request from its bytes by the plan the native side made while it
 * checked and measured them (src/codemode/meter.rs): runs of small values are parsed by
 * `JSON.parse` (each a few milliseconds at most), objects and arrays too large for that are put
 * together here, and long strings decoded in pieces. Between steps, once a slice's time is up,
 * the event loop runs: no request holds it for long, whatever its size.
 */
async function buildByPlan(bytes, plan) {
  const open = []
  // The key each open object or array goes under in its parent.
  const keys = []
  // How many elements each open array has so far (it is made as long as it will be).
  const filled = []
  let key
  let root
  let until = performance.now() + SLICE_MS
  const yieldIfDue = async () => {
    if (performance.now() < until) return
    await new Promise((resolve) => setImmediate(resolve))
    until = performance.now() + SLICE_MS
  }
  const put = (value, under) => {
    const top = open.length - 1
    if (top < 0) root = value
    else if (Array.isArray(open[top])) open[top][filled[top]++] = value
    else setMember(open[top], under, value)
  }
  const text = (from, to) => bytes.toString('utf8', from, to)
  for (let i = 0; i < plan.length;) {
    const op = plan[i] & 0xff
    if (op === OP.object) {
      open.push({})
      keys.push(key)
      filled.push(0)
      i += 1
    } else if (op === OP.array) {
      const array = []
      array.length = plan[i + 1]
      open.push(array)
      keys.push(key)
      filled.push(0)
      i += 2
    } else if (op === OP.end) {
      filled.pop()
      put(open.pop(), keys.pop())
      i += 1
    } else if (op === OP.key) {
      key = JSON.parse(text(plan[i + 1], plan[i + 2]))
      i += 3
    } else if (op === OP.run) {
      const top = open.length - 1
      filled[top] = addRun(open[top], filled[top], text(plan[i + 1], plan[i + 2]))
      i += 3
    } else if (op === OP.string) {
      const escaped = (plan[i] & OP.escaped) !== 0
      const cuts = plan[i + 3]
      let value = ''
      let from = plan[i + 1]
      for (let c = 0; c <= cuts; c++) {
        const to = c < cuts ? plan[i + 4 + c] : plan[i + 2]
        value += escaped ? JSON.parse(`"${text(from, to)}"`) : text(from, to)
        from = to
        await yieldIfDue()
      }
      put(value, key)
      i += 4 + cuts
    } else {
      throw new Error(`unknown Code Mode plan step ${op}`)
    }
    await yieldIfDue()
  }
  return root
}

/**
 * Adds the members or elements `text` holds (a run, without its brackets) to `into`, an array
 * filled up to `at` or an object. Returns how far the array is filled now.
 */
function addRun(into, at, text) {
  if (Array.isArray(into)) {
    const part = JSON.parse(`[${text}]`)
    for (let j = 0; j < part.length; j++) into[at + j] = part[j]
    return at + part.length
  }
  const part = JSON.parse(`{${text}}`)
  for (const k of Object.keys(part)) setMember(into, k, part[k])
  return at
}

/** As `JSON.parse` makes members: `__proto__` is a key like any other, not the prototype. */
function setMember(object, key, value) {
  if (key === '__proto__') {
    Object.defineProperty(object, key, { value, writable: true, enumerable: true, configurable: true })
  } else {
    object[key] = value
  }
}

// `buildByPlan` for the tests of the builder only.
module.exports = { DockerCodeModeTransport, buildByPlan }
