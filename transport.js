'use strict'

// Code Mode: the relay in the sandbox hands each request to the native session, which calls
// #onRequest here; the reply goes back through the session. The transport checks the request's
// shape and reports its own failures as TrueForge's transports do; the dispatcher does the rest.

const { Socket } = require('node:net')

const { codeModeClient } = require('./loader.js')
const { argumentError, fromNative } = require('./errors.js')
const { parseCodeModeRequest } = require('./validate.js')

const CODE_MODE_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
// Where TrueForge links the Python CLI when the agent's static `mcp-client` is in place.
const PYTHON_CLI_LINK = '/trueforge/codemode/bin/mcp-client-python'
const MALFORMED_REQUEST = { ok: false, error: 'Malformed Code Mode request', source: 'caller' }

// Each request's values live in V8's heap, where V8 collects them under its own heap limit,
// far above what one sandbox may hold: a token per request reports their size to V8 as external
// memory until they are collected, so that large requests are collected promptly instead of
// piling up.
const COSTS = new WeakMap()

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
      // The native session holds this callback strongly; a weak link back to the transport lets
      // a transport nobody stopped be collected, and its relay end with it.
      const self = new WeakRef(this)
      session = this.#native.codeModeSession((cost, generation, id, payload) => {
        const transport = self.deref()
        if (transport === undefined) return
        // Parsed here, at once, so the text is garbage while the dispatcher works.
        const parsed = parseRequest(payload)
        // `cost` tells V8 what a large request's values hold while they live (see COSTS).
        if (parsed !== null && cost !== null) COSTS.set(parsed.request, cost)
        void transport.#onRequest(generation, id, parsed)
      })
      this.#session = session
    }
    const timeout =
      typeof requestTimeoutSeconds === 'number' && Number.isFinite(requestTimeoutSeconds) && requestTimeoutSeconds > 0
        ? requestTimeoutSeconds
        : undefined
    try {
      // A request not answered within the timeout is answered with an error by the session,
      // which then gives its bytes back (the client has stopped waiting by then).
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

  /** A request read from a lane (see `readLane`). */
  static onLaneRequest(transport, generation, call) {
    const parsed = parseRequest(call.payload)
    if (parsed !== null && call.cost !== null) COSTS.set(parsed.request, call.cost)
    void transport.#onRequest(generation, call.id, parsed)
  }

  async #onRequest(generation, id, parsed) {
    const session = this.#session
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
    ;(this.#session ?? session)?.reply(generation, id, bytes)
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
      for (const call of fed.calls) DockerCodeModeTransport.onLaneRequest(t, generation, call)
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
  const request = parseCodeModeRequest(value)
  return request === null ? null : { request, traceCarrier: traceCarrierOf(value) }
}

module.exports = { DockerCodeModeTransport }
