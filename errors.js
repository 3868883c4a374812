'use strict'

// The error classes of the SandboxProvider contract. The host server checks `instanceof`
// against its own classes, so the provider throws the host's constructors when given them
// (option `errors`) and these otherwise: same names, status codes and messages.

class SandboxError extends Error {
  constructor(message, statusCode) {
    super(message)
    this.name = new.target.name
    this.statusCode = statusCode
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
  CONTRACT_ERROR_NAMES,
}
