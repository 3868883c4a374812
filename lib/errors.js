'use strict'

// The error classes of the SandboxProvider contract. The host server checks `instanceof`
// against its own classes, so the provider throws the host's constructors when given them
// (option `errors`) and these otherwise: same names, status codes and messages. `fromNative` is
// the one place the binding's errors (a stable `code`, the message, and the contract's fields on
// the object) become them, for the provider, Code Mode, `reapSandboxes` and the commands alike.

// An error made on the host's base class (see `onHostBase`) records which class of ours it
// stands for, so `instanceof` that class (and our `SandboxError`) still holds for it.
const STANDS_FOR = Symbol.for('trueforge-docker-sandbox.standsFor')

class SandboxError extends Error {
  constructor(message, statusCode) {
    super(message)
    this.name = new.target.name
    this.statusCode = statusCode
  }

  static [Symbol.hasInstance](value) {
    if (Function.prototype[Symbol.hasInstance].call(this, value)) return true
    const ours = value !== null && typeof value === 'object' ? value[STANDS_FOR] : undefined
    return typeof ours === 'function' && (ours === this || ours.prototype instanceof this)
  }
}

class SandboxNotAvailableError extends SandboxError {
  constructor(sandboxId) {
    super(`Sandbox '${sandboxId}' no longer exists — it may have been auto-deleted`, 410)
    this.sandboxId = sandboxId
  }
}

class SandboxFileNotFoundError extends SandboxError {
  constructor(path) {
    super(`File not found: ${path}`, 404)
    this.path = path
  }
}

class SandboxPathIsDirectoryError extends SandboxError {
  constructor(path) {
    super(`Path is a directory, not a file: ${path}`, 400)
    this.path = path
  }
}

class SandboxFileTooLargeError extends SandboxError {
  constructor(path, fileSize, maxSize) {
    super(`File too large: ${path} (${String(fileSize)} bytes, max ${String(maxSize)})`, 413)
    this.path = path
    this.fileSize = fileSize
    this.maxSize = maxSize
  }
}

class SandboxPathTraversalError extends SandboxError {
  constructor(path) {
    super(`Path must not contain ".." segments: ${path}`, 400)
    this.path = path
  }
}

// Errors of ours that the contract has no class for. They carry a stable `code` too.
class SandboxInvalidPathError extends SandboxError {
  constructor(message, path) {
    super(message, 400)
    this.path = path
  }
}

class SandboxNotRegularFileError extends SandboxError {
  constructor(message, path) {
    super(message, 400)
    this.path = path
  }
}

// A download of a file that was rewritten while it was read, every time it was tried: a
// conflict with whatever writes it (409), which a later download may not meet.
class SandboxFileChangedError extends SandboxError {
  constructor(message, path) {
    super(message, 409)
    this.path = path
  }
}

class SandboxEngineError extends SandboxError {
  constructor(message) {
    super(message, 503)
  }
}

// The engine cannot give the GPUs asked for (`code` GPU_UNSUPPORTED, 500: the engine host lacks
// the NVIDIA container toolkit or a CDI spec), or none is free for an exclusive sandbox
// (`code` GPUS_UNAVAILABLE, 503; `holders` are the ids of the sandboxes holding them).
class SandboxGpuError extends SandboxError {
  constructor(message, code, holders) {
    super(message, code === 'GPUS_UNAVAILABLE' ? 503 : 500)
    this.code = code
    this.holders = holders ?? []
  }
}

// The classes whose failures are the request's fault (a host answers with their statusCode),
// with how each builds its message from the constructor's arguments. Engine failures are not
// among them: they are never the request's fault.
const REQUEST_ERRORS = {
  SandboxNotAvailableError: {
    statusCode: 410,
    fields: ['sandboxId'],
    message: (id) => new SandboxNotAvailableError(id).message,
  },
  SandboxFileNotFoundError: {
    statusCode: 404,
    fields: ['path'],
    message: (p) => new SandboxFileNotFoundError(p).message,
  },
  SandboxPathIsDirectoryError: {
    statusCode: 400,
    fields: ['path'],
    message: (p) => new SandboxPathIsDirectoryError(p).message,
  },
  SandboxFileTooLargeError: {
    statusCode: 413,
    fields: ['path', 'fileSize', 'maxSize'],
    message: (p, size, max) => new SandboxFileTooLargeError(p, size, max).message,
  },
  SandboxPathTraversalError: {
    statusCode: 400,
    fields: ['path'],
    message: (p) => new SandboxPathTraversalError(p).message,
  },
  SandboxInvalidPathError: { statusCode: 400, fields: ['message', 'path'], message: (m) => m },
  SandboxNotRegularFileError: { statusCode: 400, fields: ['message', 'path'], message: (m) => m },
  SandboxFileChangedError: { statusCode: 409, fields: ['message', 'path'], message: (m) => m },
}

/**
 * Our request-error classes rebuilt on the host's base class (its abstract `SandboxError`,
 * whose constructor takes the message only), so that a host that maps `instanceof` its base to
 * `statusCode` answers with ours. Same names, constructor arguments, messages and status codes;
 * `instanceof` our own classes holds for them too.
 */
function onHostBase(HostBase) {
  const ours = module.exports
  const out = {}
  for (const [name, spec] of Object.entries(REQUEST_ERRORS)) {
    const Ours = ours[name]
    const Derived = class extends HostBase {
      constructor(...args) {
        super(spec.message(...args))
        Object.defineProperty(this, 'statusCode', {
          value: spec.statusCode,
          enumerable: true,
          writable: true,
          configurable: true,
        })
        this.name = name
        spec.fields.forEach((field, i) => {
          if (field !== 'message') this[field] = args[i]
        })
        Object.defineProperty(this, STANDS_FOR, { value: Ours })
      }
    }
    Object.defineProperty(Derived, 'name', { value: name })
    out[name] = Derived
  }
  return out
}

const CONTRACT_ERROR_NAMES = [
  'SandboxNotAvailableError',
  'SandboxFileNotFoundError',
  'SandboxPathIsDirectoryError',
  'SandboxFileTooLargeError',
  'SandboxPathTraversalError',
]

// Bad options and arguments are the caller's bug, not a sandbox failure: plain TypeErrors, as
// Node's own APIs throw, told apart by `code`.
/**
 * @param {string} option
 * @param {string} reason
 */
function optionError(option, reason) {
  return Object.assign(new TypeError(`invalid option \`${option}\`: ${reason}`), { code: 'INVALID_OPTION', option })
}

/** @param {string} message */
function argumentError(message) {
  return Object.assign(new TypeError(message), { code: 'INVALID_ARGUMENT' })
}

/** @typedef {new (...args: any[]) => Error} ErrorClass */

// How each code the binding sets turns into the error to throw. `make(name, Fallback)` picks
// the host's constructor of that name when it gave one. Codes not listed here (INTERNAL,
// IMAGE_NOT_AVAILABLE, CREATE_FAILED, CODE_MODE_UNAVAILABLE, CODE_MODE_START_FAILED, and any
// added later) are a plain
// `SandboxError` with status 500, as the README's error table says: the provider failed, and
// neither the request nor the engine's availability is to blame.
const FROM_CODE = {
  SANDBOX_NOT_AVAILABLE: (e, make) => make('SandboxNotAvailableError', SandboxNotAvailableError, e.sandboxId),
  FILE_NOT_FOUND: (e, make) => make('SandboxFileNotFoundError', SandboxFileNotFoundError, e.path),
  PATH_IS_DIRECTORY: (e, make) => make('SandboxPathIsDirectoryError', SandboxPathIsDirectoryError, e.path),
  FILE_TOO_LARGE: (e, make) =>
    make('SandboxFileTooLargeError', SandboxFileTooLargeError, e.path, e.fileSize, e.maxSize),
  PATH_TRAVERSAL: (e, make) => make('SandboxPathTraversalError', SandboxPathTraversalError, e.path),
  INVALID_PATH: (e, make) => make('SandboxInvalidPathError', SandboxInvalidPathError, e.message, e.path),
  NOT_REGULAR_FILE: (e, make) => make('SandboxNotRegularFileError', SandboxNotRegularFileError, e.message, e.path),
  FILE_CHANGED: (e, make) => make('SandboxFileChangedError', SandboxFileChangedError, e.message, e.path),
  INVALID_OPTION: (e) => optionError(e.option, e.reason),
  INVALID_ARGUMENT: (e) => argumentError(e.message),
  ENGINE_UNREACHABLE: (e) => new SandboxEngineError(e.message),
  ENGINE_TIMEOUT: (e) => new SandboxEngineError(e.message),
  ENGINE_ERROR: (e) => new SandboxEngineError(e.message),
  ENGINE_TLS: (e) => new SandboxEngineError(e.message),
  ENGINE_SSH: (e) => new SandboxEngineError(e.message),
  ENGINE_REPLY_TOO_LARGE: (e) => new SandboxEngineError(e.message),
  GPUS_UNAVAILABLE: (e) => new SandboxGpuError(e.message, 'GPUS_UNAVAILABLE', e.holders),
  GPU_UNSUPPORTED: (e) => new SandboxGpuError(e.message, 'GPU_UNSUPPORTED', e.holders),
}

// Codes napi itself sets (`InvalidArg`, `Closing`) and Node's (`ERR_…`) are not ours: only an
// error whose code is all capitals and underscores otherwise came from `SandboxError`.
const OUR_CODE = /^(?!ERR_)[A-Z][A-Z_]*$/

/**
 * The error to throw for one the binding threw or rejected with: the contract's class (the
 * host's own when `injected` has it, see `pickErrors`) with the binding's `code`. Anything else
 * is returned as it is.
 *
 * @param {unknown} e
 * @param {Record<string, ErrorClass>} [injected]
 * @returns {unknown}
 */
function fromNative(e, injected = {}) {
  // Not `instanceof Error`: the binding builds its errors in the main realm, which is not the
  // caller's under a vm context (jest runs every test file in one).
  if (e === null || typeof e !== 'object' || e instanceof SandboxError) return e
  const { code, message } = /** @type {{ code?: unknown, message?: unknown }} */ (e)
  if (typeof code !== 'string' || !OUR_CODE.test(code) || typeof message !== 'string') return e
  /** @type {(name: string, Fallback: ErrorClass, ...args: unknown[]) => Error} */
  const make = (name, Fallback, ...args) => new (injected[name] ?? Fallback)(...args)
  const build = FROM_CODE[code]
  const out = build ? build(e, make) : new SandboxError(message, 500)
  if (out.code === undefined) out.code = code
  return out
}

/**
 * `fn`'s result, with what it throws or rejects with passed through `fromNative`.
 *
 * @template T
 * @param {() => T} fn
 * @param {Record<string, ErrorClass>} [injected]
 * @returns {T}
 */
function translated(fn, injected) {
  let out
  try {
    out = fn()
  } catch (e) {
    throw fromNative(e, injected)
  }
  // A thenable, not `instanceof Promise`: the binding's promises are of the main realm too.
  const then = out !== null && typeof out === 'object' ? /** @type {any} */ (out).then : undefined
  if (typeof then !== 'function') return out
  return /** @type {T} */ (
    then.call(out, undefined, (/** @type {unknown} */ e) => {
      throw fromNative(e, injected)
    })
  )
}

module.exports = {
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
  REQUEST_ERRORS,
  onHostBase,
  optionError,
  argumentError,
  fromNative,
  translated,
}
