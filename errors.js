'use strict'

// The error classes of the SandboxProvider contract. The host server checks `instanceof`
// against its own classes, so the provider throws the host's constructors when given them
// (option `errors`) and these otherwise: same names, status codes and messages.

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
  SandboxNotAvailableError: { statusCode: 410, fields: ['sandboxId'], message: (id) => new SandboxNotAvailableError(id).message },
  SandboxFileNotFoundError: { statusCode: 404, fields: ['path'], message: (p) => new SandboxFileNotFoundError(p).message },
  SandboxPathIsDirectoryError: { statusCode: 400, fields: ['path'], message: (p) => new SandboxPathIsDirectoryError(p).message },
  SandboxFileTooLargeError: {
    statusCode: 413,
    fields: ['path', 'fileSize', 'maxSize'],
    message: (p, size, max) => new SandboxFileTooLargeError(p, size, max).message,
  },
  SandboxPathTraversalError: { statusCode: 400, fields: ['path'], message: (p) => new SandboxPathTraversalError(p).message },
  SandboxInvalidPathError: { statusCode: 400, fields: ['message', 'path'], message: (m) => m },
  SandboxNotRegularFileError: { statusCode: 400, fields: ['message', 'path'], message: (m) => m },
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
        Object.defineProperty(this, 'statusCode', { value: spec.statusCode, enumerable: true, writable: true, configurable: true })
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

module.exports = {
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
  REQUEST_ERRORS,
  onHostBase,
}
