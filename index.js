'use strict'

// The package entry: a thin class over the native binding that speaks the SandboxProvider
// contract. It shapes results and forwards log events to the host's logger; what callers hand
// it is checked in lib/validate.js, and the binding's coded errors become the contract's classes
// (the host's own when injected) in lib/errors.js.

const path = require('node:path')

const { NativeProvider } = require('./lib/loader.js')
const {
  SandboxError,
  SandboxNotAvailableError,
  SandboxFileNotFoundError,
  SandboxPathIsDirectoryError,
  SandboxFileTooLargeError,
  SandboxPathTraversalError,
  SandboxInvalidPathError,
  SandboxNotRegularFileError,
  SandboxFileChangedError,
  SandboxEngineError,
  SandboxGpuError,
  CONTRACT_ERROR_NAMES,
  optionError,
  argumentError,
  fromNative,
  translated,
} = require('./lib/errors.js')
const {
  unrepresentable,
  pickErrors,
  pickLogger,
  execParamsError,
  requireStrings,
  malformedPathError,
} = require('./lib/validate.js')
const { DockerCodeModeTransport } = require('./lib/transport.js')
const { fromTrueForgeManifest } = require('./lib/trueforge.js')
const { reapSandboxes, engineStats, shapeBuild, forward } = require('./lib/standalone.js')

/** @typedef {import('./index.d.ts').ExecResult} ExecResult */
/** @typedef {import('./index.d.ts').SandboxBuild} SandboxBuild */

const AGENT_DIR = path.join(__dirname, 'agent-bin')

/** The agent binaries a new provider uses: `TRUEFORGE_AGENT_BIN_DIR` replaces the package's own
 * (for the tests, which give it agents that fail on purpose, and for builds kept elsewhere). */
function agentDir() {
  return process.env.TRUEFORGE_AGENT_BIN_DIR || AGENT_DIR
}

/** The contract's SandboxProvider backed by one Docker container per sandbox. */
class DockerSandboxProvider {
  #native
  #errors
  #layout

  /** @param {import('./index.d.ts').DockerSandboxProviderOptions} options */
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
      // The agent binaries ship in this package (Linux binaries for the sandbox, the same on
      // every host platform).
      this.#native = new NativeProvider(rest, sink, agentDir())
    } catch (e) {
      const out = fromNative(e, this.#errors)
      // Anything the binding refused before our own validation ran is still a bad option.
      throw out === e ? optionError('options', /** @type {Error} */ (e).message) : out
    }
    this.#layout = this.#native.layout()
    this.type = /** @type {const} */ ('docker')
    this.supportsCodeMode = /** @type {const} */ (true)
  }

  /** The namespace this provider's sandboxes live in. */
  get namespace() {
    return this.#native.namespace
  }

  /** The Docker engine address in use. */
  get dockerHost() {
    return this.#native.dockerHost
  }

  /** What this provider's sandboxes may reach, in a few lines (the `egress` option). */
  get egressPolicy() {
    return this.#native.egress
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

  /**
   * @param {import('./index.d.ts').SandboxExecParams} params
   * @returns {Promise<ExecResult>}
   */
  async exec(params) {
    const bad = execParamsError(params)
    if (bad) return { success: false, error: bad }
    const { sandboxId, command, cwd, env, timeoutSeconds } = params
    const r = await this.#call(() =>
      this.#native.exec(sandboxId, command, cwd ?? undefined, env ?? undefined, timeoutSeconds ?? undefined),
    )
    return typeof r === 'string'
      ? { success: false, error: r }
      : { success: true, response: { exitCode: r[0], result: r[1] } }
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
    requireStrings({ sandboxId, path })
    this.#refuseMalformedPath(sandboxId, path)
    return this.#call(() => this.#native.downloadFile(sandboxId, path))
  }

  async uploadFile(p) {
    const { sandboxId, remotePath, content } = p ?? {}
    requireStrings({ sandboxId, remotePath })
    this.#refuseMalformedPath(sandboxId, remotePath)
    if (!(content instanceof Uint8Array)) {
      throw argumentError('uploadFile: `content` must be a Buffer or Uint8Array')
    }
    const buf = Buffer.isBuffer(content) ? content : Buffer.from(content.buffer, content.byteOffset, content.byteLength)
    await this.#call(() => this.#native.uploadFile(sandboxId, remotePath, buf))
  }

  /** Removes a sandbox now (idempotent). Resolves true when something was removed. */
  async removeSandbox(sandboxId) {
    requireStrings({ sandboxId })
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
    return new DockerCodeModeTransport(this.#native, this.#errors)
  }

  /**
   * What serves a sandbox's calls: the in-sandbox agent, or the engine's endpoints and why.
   *
   * @param {string} sandboxId
   * @returns {Promise<import('./index.d.ts').AgentStatus>}
   */
  async agentStatus(sandboxId) {
    requireStrings({ sandboxId })
    return /** @type {any} */ (await this.#call(() => this.#native.agentStatus(sandboxId)))
  }

  /**
   * What a sandbox may reach (`mode`), and under a policy what its connections through this
   * process did: `allowed`, `refused`, `failed` (allowed, then the outbound connection failed),
   * `open` now, `bytesOut` and `bytesIn`.
   *
   * @param {string} sandboxId
   * @returns {Promise<import('./index.d.ts').EgressStats>}
   */
  async egressStats(sandboxId) {
    requireStrings({ sandboxId })
    return /** @type {any} */ (await this.#call(() => this.#native.egressStats(sandboxId)))
  }

  // A path the binding would receive altered (a lone surrogate) is refused here, after the id:
  // every call refuses an id outside the grammar first.
  #refuseMalformedPath(sandboxId, path) {
    const malformed = malformedPathError(path, this.#errors)
    if (!malformed) return
    this.#call(() => this.#native.checkSandboxId(sandboxId))
    throw malformed
  }

  #call(fn) {
    return translated(fn, this.#errors)
  }
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
  SandboxFileChangedError,
  SandboxEngineError,
  SandboxGpuError,
  CONTRACT_ERROR_NAMES,
}

// `npm run typecheck` (tsconfig.js.json) holds the exports to what index.d.ts declares.
/** @type {typeof import('./index.d.ts')} */
const declared = module.exports
void declared
