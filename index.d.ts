/// <reference types="node" />

/** The outcome of one command: it ran (any exit code), or it never ran. */
export type ExecResult =
  | { success: true; response: { exitCode: number; result: string } }
  | { success: false; error: string }

export interface SandboxExecParams {
  sandboxId: string
  /** A shell command line, run with `bash -c` when the image has bash, else `sh -c`. */
  command: string
  /** Relative to the sandbox root, or absolute. Default: the sandbox root. */
  cwd?: string
  /** Added to the process environment (never spliced into the command). */
  env?: Record<string, string>
  /** Overrides `execTimeoutMs` for this call. */
  timeoutSeconds?: number
}

export type SandboxBuildStatus = 'pending' | 'ready' | 'failed'

export interface SandboxBuild {
  status: SandboxBuildStatus
  /** Human-readable; null when ready. */
  reason: string | null
  metadata: Record<string, string> | null
}

/** Constructors the provider throws instead of its own classes (the host's, for `instanceof`). */
export interface InjectedErrors {
  SandboxNotAvailableError?: new (sandboxId: string) => Error
  SandboxFileNotFoundError?: new (path: string) => Error
  SandboxPathIsDirectoryError?: new (path: string) => Error
  SandboxFileTooLargeError?: new (path: string, fileSize: number, maxSize: number) => Error
  SandboxPathTraversalError?: new (path: string) => Error
}

/** A winston-shaped logger; every method is optional. */
export interface SandboxLogger {
  debug?(message: string, meta?: Record<string, unknown>): void
  info?(message: string, meta?: Record<string, unknown>): void
  warn?(message: string, meta?: Record<string, unknown>): void
  error?(message: string, meta?: Record<string, unknown>): void
}

export interface DockerSandboxProviderOptions {
  /** The image every sandbox runs. Required. */
  image: string
  /** `unix:///path` or `tcp://host:port`. Default: `$DOCKER_HOST`, else `unix:///var/run/docker.sock`. */
  dockerHost?: string
  /** Scopes container names and labels; `[a-z0-9-]{1,32}`. Default `'default'`. */
  namespace?: string
  /** Default exec timeout in milliseconds. Default 60000. */
  execTimeoutMs?: number
  /** Cap for `uploadFile` and `downloadFile`, in bytes. Default 10 MiB. */
  fileMaxBytes?: number
  /** Cap on one exec's combined output (head and tail kept), in bytes. Default 10 MiB. */
  maxOutputBytes?: number
  /** Like `docker run --gpus`: `'all'`, a count, or device indexes/UUIDs. Default: no GPU. */
  gpus?: 'all' | number | string[]
  /** Container environment. Default none. */
  env?: Record<string, string>
  /** Extra container labels (the `trueforge.sandbox.` prefix is reserved). Default none. */
  labels?: Record<string, string>
  /** Error constructors to throw instead of this package's classes. */
  errors?: InjectedErrors
  /** Receives the provider's log events. Default: none. */
  logger?: SandboxLogger
}

/** A drop-in `SandboxProvider`: one Docker container per sandbox. */
export declare class DockerSandboxProvider {
  constructor(options: DockerSandboxProviderOptions)
  readonly type: 'docker'
  readonly supportsCodeMode: false
  /** The namespace this provider's sandboxes live in. */
  readonly namespace: string
  /** The Docker engine address in use. */
  readonly dockerHost: string
  buildImage(): Promise<SandboxBuild>
  getImageBuildStatus(): Promise<SandboxBuild>
  createSandbox(): Promise<{ sandboxId: string }>
  exec(params: SandboxExecParams): Promise<ExecResult>
  getAdditionalInstructions(): string | undefined
  getToolResultDumpDir(sandboxId: string): string
  getGitCredentialsPath(sandboxId: string): string
  getFileUploadsDir(sandboxId: string): string
  getSkillsDir(sandboxId: string): string
  getGitDownloaderPath(sandboxId: string): string
  downloadFile(p: { sandboxId: string; path: string }): Promise<Buffer>
  uploadFile(p: { sandboxId: string; remotePath: string; content: Buffer }): Promise<void>
  /** Deletes a sandbox now; resolves true when something was removed. Idempotent. */
  removeSandbox(sandboxId: string): Promise<boolean>
  /** Always throws: Code Mode is not supported by the docker provider. */
  createCodeModeTransport(): never
}

export declare class SandboxError extends Error {
  readonly statusCode: number
  code?: string
}
export declare class SandboxNotAvailableError extends SandboxError {
  constructor(sandboxId: string)
  readonly statusCode: 410
  readonly sandboxId: string
}
export declare class SandboxFileNotFoundError extends SandboxError {
  constructor(path: string)
  readonly statusCode: 404
  readonly path: string
}
export declare class SandboxPathIsDirectoryError extends SandboxError {
  constructor(path: string)
  readonly statusCode: 400
  readonly path: string
}
export declare class SandboxFileTooLargeError extends SandboxError {
  constructor(path: string, fileSize: number, maxSize: number)
  readonly statusCode: 413
  readonly path: string
  readonly fileSize: number
  readonly maxSize: number
}
export declare class SandboxPathTraversalError extends SandboxError {
  constructor(path: string)
  readonly statusCode: 400
  readonly path: string
}
/** A path with a NUL byte, over 4096 bytes, or whose parent is a file. */
export declare class SandboxInvalidPathError extends SandboxError {
  readonly path: string
}
/** Download of a device, FIFO, socket or other non-regular file. */
export declare class SandboxNotRegularFileError extends SandboxError {
  readonly path: string
}
/** The Docker engine could not be reached, timed out, or refused the request. */
export declare class SandboxEngineError extends SandboxError {}
export declare const CONTRACT_ERROR_NAMES: readonly string[]
