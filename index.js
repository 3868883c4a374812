'use strict'

// The package entry: a thin class over the native binding that speaks the SandboxProvider
// contract. It shapes results, turns the binding's coded errors into the contract's error
// classes (the host's own when injected) and forwards log events to the host's logger.

const { NativeProvider, reapSandboxes: nativeReap, engineStats: nativeEngineStats, codeModeClient } = require('./loader.js')
const errors = require('./errors.js')
const { fromTrueForgeManifest } = require('./trueforge.js')

const {
  SandboxError,
  SandboxNotAvailableError,
  SandboxFileNotFoundError,
  SandboxPathIsDirectoryError,
  SandboxFileTooLargeError,
  SandboxPathTraversalError,
  SandboxInvalidPathError,
  SandboxNotRegularFileError,
  SandboxEngineError,
  SandboxGpuError,
  CONTRACT_ERROR_NAMES,
  onHostBase,
} = errors

const LOG_LEVELS = ['debug', 'info', 'warn', 'error']

function optionError(option, reason) {
  const e = new TypeError(`invalid option \`${option}\`: ${reason}`)
  e.code = 'INVALID_OPTION'
  e.option = option
  return e
}

function argumentError(message) {
  const e = new TypeError(message)
  e.code = 'INVALID_ARGUMENT'
  return e
}

// The first value JSON cannot carry (NaN, ±Infinity, undefined or a hole in an array, a symbol,
// a function, a bigint), as [path, description]; null when there is none.
function unrepresentable(value, path) {
  switch (typeof value) {
    case 'number':
      return Number.isFinite(value) ? null : [path, String(value)]
    case 'symbol':
    case 'function':
    case 'bigint':
      return [path, `a ${typeof value}`]
    case 'object': {
      if (value === null) return null
      if (Array.isArray(value)) {
        for (let i = 0; i < value.length; i++) {
          if (!(i in value) || value[i] === undefined) return [`${path}[${i}]`, 'undefined']
          const bad = unrepresentable(value[i], `${path}[${i}]`)
          if (bad) return bad
        }
        return null
      }
      for (const [k, v] of Object.entries(value)) {
        if (v === undefined) continue
        const bad = unrepresentable(v, path ? `${path}.${k}` : k)
        if (bad) return bad
      }
      return null
    }
    default:
      return null
  }
}

// The classes to throw, by name. `injected` may be an object of constructors or a whole module
// namespace (`import * as sandboxErrors from …`): the names we know are taken, other keys
// ignored. A `SandboxError` in it is the host's base class: our request-error classes that the
// host did not give are then rebuilt on it, so they are `instanceof` the host's base too.
function pickErrors(injected) {
  if (injected === undefined || injected === null) return {}
  if (typeof injected !== 'object' && typeof injected !== 'function') {
    throw optionError('errors', 'expected an object of error constructors, or the module that exports them')
  }
  const known = [...CONTRACT_ERROR_NAMES, 'SandboxError']
  const out = {}
  for (const name of known) {
    const ctor = injected[name]
    if (ctor === undefined) continue
    if (typeof ctor !== 'function') throw optionError(`errors.${name}`, 'expected a constructor')
    out[name] = ctor
  }
  if (Object.keys(out).length === 0) {
    const first = Object.keys(injected)[0]
    if (first !== undefined) {
      throw optionError(`errors.${first}`, `unknown error class; known ones are ${known.join(', ')}`)
    }
  }
  const { SandboxError: HostBase, ...given } = out
  return HostBase ? { ...onHostBase(HostBase), ...given } : given
}

function pickLogger(logger) {
  if (logger === undefined || logger === null) return undefined
  if (typeof logger !== 'object' && typeof logger !== 'function') {
    throw optionError('logger', 'expected an object with debug/info/warn/error methods')
  }
  for (const level of LOG_LEVELS) {
    if (logger[level] !== undefined && typeof logger[level] !== 'function') {
      throw optionError(`logger.${level}`, 'expected a function')
    }
  }
  return logger
}

/** The contract's SandboxProvider backed by one Docker container per sandbox. */
class DockerSandboxProvider {
  #native
  #errors
  #layout

  constructor(options) {
    if (options === null || typeof options !== 'object' || Array.isArray(options)) {
      throw optionError('options', "expected an object such as { image: 'python:3.12' }")
    }
    const { errors: injected, logger, ...rest } = options
    this.#errors = pickErrors(injected)
    const log = pickLogger(logger)
    const bad = unrepresentable(rest, '')
    if (bad) throw optionError(bad[0], `${bad[1]} is not a valid value`)
    const sink = log ? (line) => forward(log, line) : undefined
    try {
      this.#native = new NativeProvider(rest, sink)
    } catch (e) {
      const translated = this.#translate(e)
      // Anything the binding refused before our own validation ran is still a bad option.
      throw translated === e ? optionError('options', e.message) : translated
    }
    this.#layout = this.#native.layout()
    this.type = 'docker'
    this.supportsCodeMode = true
  }

  /** The namespace this provider's sandboxes live in. */
  get namespace() {
    return this.#native.namespace
  }

  /** The Docker engine address in use. */
  get dockerHost() {
    return this.#native.dockerHost
  }

  async buildImage() {
    return shapeBuild(await this.#call(() => this.#native.buildImage()))
  }

  async getImageBuildStatus() {
    return shapeBuild(await this.#call(() => this.#native.getImageBuildStatus()))
  }

  async createSandbox() {
    const sandboxId = await this.#call(() => this.#native.createSandbox())
    return { sandboxId }
  }

  async exec(params) {
    if (params === null || typeof params !== 'object') {
      return { success: false, error: 'exec: expected { sandboxId, command, cwd?, env?, timeoutSeconds? }' }
    }
    const { sandboxId, command, cwd, env, timeoutSeconds } = params
    const bad = checkExecParams(sandboxId, command, cwd, env, timeoutSeconds)
    if (bad) return { success: false, error: bad }
    const r = await this.#call(() =>
      this.#native.exec({
        sandboxId,
        command,
        cwd: cwd ?? undefined,
        env: env ?? undefined,
        timeoutSeconds: timeoutSeconds ?? undefined,
      }),
    )
    return r.success
      ? { success: true, response: { exitCode: r.exitCode, result: r.result } }
      : { success: false, error: r.error }
  }

  getAdditionalInstructions() {
    return this.#native.additionalInstructions()
  }

  // The layout is fixed and absolute: the same for '' (asked before any sandbox exists) and
  // for every real id.
  getToolResultDumpDir(_sandboxId) {
    return this.#layout.toolResultsDir
  }

  getGitCredentialsPath(_sandboxId) {
    return this.#layout.gitCredentialsPath
  }

  getFileUploadsDir(_sandboxId) {
    return this.#layout.uploadsDir
  }

  getSkillsDir(_sandboxId) {
    return this.#layout.skillsDir
  }

  getGitDownloaderPath(_sandboxId) {
    return this.#layout.gitDownloaderPath
  }

  async downloadFile(p) {
    const { sandboxId, path } = p ?? {}
    this.#requireStrings({ sandboxId, path })
    return this.#call(() => this.#native.downloadFile(sandboxId, path))
  }

  async uploadFile(p) {
    const { sandboxId, remotePath, content } = p ?? {}
    this.#requireStrings({ sandboxId, remotePath })
    if (!(content instanceof Uint8Array)) {
      throw argumentError('uploadFile: `content` must be a Buffer or Uint8Array')
    }
    const buf = Buffer.isBuffer(content) ? content : Buffer.from(content.buffer, content.byteOffset, content.byteLength)
    await this.#call(() => this.#native.uploadFile(sandboxId, remotePath, buf))
  }

  /** Removes a sandbox now (idempotent). Resolves true when something was removed. */
  async removeSandbox(sandboxId) {
    this.#requireStrings({ sandboxId })
    return this.#call(() => this.#native.removeSandbox(sandboxId))
  }

  /** Removes this namespace's sandboxes stopped longer than `autoDeleteIntervalInMinutes`. */
  async reapStale() {
    const removed = await this.#call(() => this.#native.reapStale())
    return { removed }
  }

  /** Starts filling the warm pool now instead of on the first createSandbox(). */
  async warmUp() {
    await this.#call(() => this.#native.warmUp())
  }

  /**
   * Ends this instance's background work (the reaper it keeps alive; every background task on
   * the engine when it is the engine's last provider). The promise resolves once that work has
   * stopped; awaiting it is optional. Never deletes sandboxes.
   */
  dispose() {
    return this.#native.dispose()
  }

  /** A Code Mode transport for one turn: MCP tools callable from inside the sandbox. */
  createCodeModeTransport() {
    return new DockerCodeModeTransport(this.#native, (e) => this.#translate(e))
  }

  #requireStrings(fields) {
    for (const [k, v] of Object.entries(fields)) {
      if (typeof v !== 'string') throw argumentError(`\`${k}\` must be a string, got ${typeof v}`)
    }
  }

  async #call(fn) {
    try {
      return await fn()
    } catch (e) {
      throw this.#translate(e)
    }
  }

  #translate(e) {
    const payload = parsePayload(e)
    if (!payload) return e
    const pick = (name, fallback) => this.#errors[name] ?? fallback
    let out
    switch (payload.code) {
      case 'SANDBOX_NOT_AVAILABLE':
        out = new (pick('SandboxNotAvailableError', SandboxNotAvailableError))(payload.sandboxId)
        break
      case 'FILE_NOT_FOUND':
        out = new (pick('SandboxFileNotFoundError', SandboxFileNotFoundError))(payload.path)
        break
      case 'PATH_IS_DIRECTORY':
        out = new (pick('SandboxPathIsDirectoryError', SandboxPathIsDirectoryError))(payload.path)
        break
      case 'FILE_TOO_LARGE':
        out = new (pick('SandboxFileTooLargeError', SandboxFileTooLargeError))(
          payload.path,
          payload.fileSize,
          payload.maxSize,
        )
        break
      case 'PATH_TRAVERSAL':
        out = new (pick('SandboxPathTraversalError', SandboxPathTraversalError))(payload.path)
        break
      case 'INVALID_PATH':
        out = new (pick('SandboxInvalidPathError', SandboxInvalidPathError))(payload.message, payload.path)
        break
      case 'NOT_REGULAR_FILE':
        out = new (pick('SandboxNotRegularFileError', SandboxNotRegularFileError))(payload.message, payload.path)
        break
      case 'INVALID_OPTION':
        return optionError(payload.option, payload.message.replace(/^invalid option `[^`]*`: /, ''))
      case 'INVALID_ARGUMENT':
        return argumentError(payload.message)
      case 'ENGINE_UNREACHABLE':
      case 'ENGINE_TIMEOUT':
      case 'ENGINE_ERROR':
      case 'ENGINE_TLS':
      case 'ENGINE_SSH':
        out = new SandboxEngineError(payload.message)
        break
      case 'GPUS_UNAVAILABLE':
      case 'GPU_UNSUPPORTED':
        out = new SandboxGpuError(payload.message, payload.code, payload.holders)
        break
      default:
        out = new SandboxError(payload.message, 500)
    }
    if (out.code === undefined) out.code = payload.code
    return out
  }
}

// Code Mode: the relay in the sandbox hands each request to the native session, which calls
// #onRequest here; the reply goes back through the session. The transport checks the request's
// shape and reports its own failures as TrueForge's transports do; the dispatcher does the rest.

const CODE_MODE_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
const MALFORMED_REQUEST = { ok: false, error: 'Malformed Code Mode request', source: 'caller' }

function isNonEmptyString(v) {
  return typeof v === 'string' && v.length > 0
}

/** TrueForge's request shapes; null when the value is not one of them. */
function parseCodeModeRequest(v) {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return null
  if (v.op === 'list_tools') {
    return isNonEmptyString(v.server) ? { op: 'list_tools', server: v.server } : null
  }
  if (v.op === 'call_tool') {
    if (!isNonEmptyString(v.server) || !isNonEmptyString(v.tool)) return null
    const args = v.arguments
    if (args === undefined) return { op: 'call_tool', server: v.server, tool: v.tool }
    if (args === null || typeof args !== 'object' || Array.isArray(args)) return null
    return { op: 'call_tool', server: v.server, tool: v.tool, arguments: args }
  }
  return null
}

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
  #translate
  #session
  #dispatcher

  constructor(native, translate) {
    this.#native = native
    this.#translate = translate
  }

  getClientInstall(_params) {
    const { content, remotePath } = codeModeClient()
    return { content, remotePath }
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
      session = this.#native.codeModeSession((generation, id, payload) => {
        void self.deref()?.#onRequest(generation, id, payload)
      })
      this.#session = session
    }
    try {
      await session.start(sandboxId)
    } catch (e) {
      throw this.#translate(e)
    }
    const env = { TFY_CM_SOCK: session.socketPath }
    if (typeof requestTimeoutSeconds === 'number' && Number.isFinite(requestTimeoutSeconds) && requestTimeoutSeconds > 0) {
      env.TFY_CM_REQUEST_TIMEOUT_SECONDS = String(requestTimeoutSeconds)
    }
    return { env }
  }

  async stop() {
    const session = this.#session
    this.#session = undefined
    if (session !== undefined) await session.stop()
  }

  async #onRequest(generation, id, payload) {
    const session = this.#session
    let reply
    try {
      reply = await this.#dispatch(payload)
    } catch (e) {
      reply = { ok: false, error: e instanceof Error ? e.message : String(e), source: 'internal' }
    }
    let bytes
    try {
      bytes = Buffer.from(JSON.stringify(reply) ?? 'null', 'utf8')
    } catch (e) {
      bytes = Buffer.from(JSON.stringify({ ok: false, error: `Code Mode reply is not JSON: ${e.message}`, source: 'transport' }))
    }
    if (bytes.length > CODE_MODE_MAX_MESSAGE_BYTES) {
      const error = `Code Mode reply of ${bytes.length} bytes exceeds the limit of ${CODE_MODE_MAX_MESSAGE_BYTES} bytes`
      bytes = Buffer.from(JSON.stringify({ ok: false, error, source: 'transport' }))
    }
    // A reply for a relay that has since been replaced or stopped is dropped by the session.
    ;(this.#session ?? session)?.reply(generation, id, bytes)
  }

  async #dispatch(payload) {
    let value
    try {
      value = JSON.parse(payload.toString('utf8'))
    } catch {
      return MALFORMED_REQUEST
    }
    const request = parseCodeModeRequest(value)
    if (request === null) return MALFORMED_REQUEST
    const dispatcher = this.#dispatcher
    if (dispatcher === undefined) {
      return { ok: false, error: 'Code Mode dispatcher is not configured', source: 'internal' }
    }
    return dispatcher.dispatch({ request, traceCarrier: traceCarrierOf(value) })
  }
}

function parsePayload(e) {
  const msg = e && typeof e.message === 'string' ? e.message : ''
  if (!msg.startsWith('{"code"')) return null
  try {
    return JSON.parse(msg)
  } catch {
    return null
  }
}

function checkExecParams(sandboxId, command, cwd, env, timeoutSeconds) {
  if (typeof sandboxId !== 'string') return 'exec: `sandboxId` must be a string'
  if (typeof command !== 'string') return 'exec: `command` must be a string'
  if (cwd !== undefined && cwd !== null && typeof cwd !== 'string') return 'exec: `cwd` must be a string'
  if (env !== undefined && env !== null) {
    if (typeof env !== 'object' || Array.isArray(env)) return 'exec: `env` must be an object of strings'
    for (const [k, v] of Object.entries(env)) {
      if (typeof v !== 'string') return `exec: env value of ${JSON.stringify(k)} must be a string`
    }
  }
  if (timeoutSeconds !== undefined && timeoutSeconds !== null) {
    if (typeof timeoutSeconds !== 'number' || !Number.isFinite(timeoutSeconds) || timeoutSeconds <= 0) {
      return 'exec: `timeoutSeconds` must be a positive number'
    }
  }
  return null
}

function shapeBuild(b) {
  return { status: b.status, reason: b.reason ?? null, metadata: b.metadata ?? null }
}

function forward(logger, line) {
  let ev
  try {
    ev = JSON.parse(line)
  } catch {
    return
  }
  const fn = logger[ev.level] ?? logger.info
  if (typeof fn !== 'function') return
  try {
    fn.call(logger, ev.message, ev.meta)
  } catch {
    // A throwing logger must not break the provider.
  }
}

/**
 * Removes sandboxes of one namespace that have been stopped for longer than `olderThanMinutes`
 * (default 7200), without a provider: what the `reap` command runs.
 */
async function reapSandboxes(options = {}) {
  try {
    const removed = await nativeReap({
      namespace: options.namespace,
      dockerHost: options.dockerHost,
      olderThanMinutes: options.olderThanMinutes,
      dryRun: options.dryRun,
    })
    return { removed }
  } catch (e) {
    const payload = parsePayload(e)
    if (!payload) throw e
    const err = payload.code === 'INVALID_OPTION' ? new TypeError(payload.message) : new SandboxEngineError(payload.message)
    err.code = payload.code
    throw err
  }
}

/**
 * Counts of what this process holds for one engine (background tasks, lock and cache entries),
 * for tests and diagnostics; null when the process has not connected to that engine.
 */
function engineStats(dockerHost) {
  return nativeEngineStats(dockerHost ?? null)
}

// Listed name by name (not spread) so that ESM importers see every export statically.
module.exports = {
  DockerSandboxProvider,
  reapSandboxes,
  engineStats,
  fromTrueForgeManifest,
  SandboxError,
  SandboxNotAvailableError,
  SandboxFileNotFoundError,
  SandboxPathIsDirectoryError,
  SandboxFileTooLargeError,
  SandboxPathTraversalError,
  SandboxInvalidPathError,
  SandboxNotRegularFileError,
  SandboxEngineError,
  SandboxGpuError,
  CONTRACT_ERROR_NAMES,
}
