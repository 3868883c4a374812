// Compiled by `npm run typecheck` with `exactOptionalPropertyTypes: true` (tsconfig.exact.json),
// as TrueForge compiles its server: every call here is one a consumer with that flag makes, with
// values that may be `undefined` (zod's `.optional()` infers `?: T | undefined`, `process.env`
// reads are `string | undefined`). Nothing runs; `tsc` fails if index.d.ts refuses one of them.

import { DockerSandboxProvider, fromTrueForgeManifest, reapSandboxes, engineStats } from '../..'
import type { DockerSandboxProviderOptions, TrueForgeContext, TrueForgeDockerManifest } from '../..'

/** What `z.infer` gives for a docker manifest schema whose optional fields are `.optional()`. */
interface InferredDockerManifest {
  type: 'docker'
  image: string
  exec_timeout_ms?: number | undefined
  auto_stop_interval_in_minutes?: number | undefined
  auto_delete_interval_in_minutes?: number | undefined
  gpus?: 'all' | number | string[] | undefined
  namespace?: string | undefined
}

/** winston's LeveledLogMethod (overloads), restated. */
interface LeveledLogMethod {
  (message: string, callback: () => void): unknown
  (message: string, meta: unknown, callback: () => void): unknown
  (message: string, ...meta: unknown[]): unknown
  (message: unknown): unknown
  (infoObject: object): unknown
}
interface WinstonLikeLogger {
  debug: LeveledLogMethod
  info: LeveledLogMethod
  warn: LeveledLogMethod
  error: LeveledLogMethod
  silly: LeveledLogMethod
}

/** A host's error module, imported as a namespace (classes plus unrelated exports). */
declare const hostErrors: {
  SandboxError: abstract new (message?: string) => Error
  SandboxNotAvailableError: new (sandboxId: string) => Error
  SandboxFileNotFoundError: new (path: string) => Error
  SandboxPathIsDirectoryError: new (path: string) => Error
  SandboxFileTooLargeError: new (path: string, fileSize: number, maxSize: number) => Error
  SandboxPathTraversalError: new (path: string) => Error
  validateNoPathTraversal(path: string): void
}

/** TrueForge's SandboxProvider and Code Mode shapes, restated with its optional fields. */
interface HostExecParams {
  sandboxId: string
  command: string
  cwd?: string | undefined
  env?: Record<string, string> | undefined
  timeoutSeconds?: number | undefined
}
type HostExecResult =
  { success: true; response: { exitCode: number; result: string } } | { success: false; error: string }
interface HostCodeModeTransport {
  getClientInstall(params: { sandboxId: string }): {
    content: string
    remotePath: string
    pathBinSymlink?: string | undefined
  }
  start(params: {
    codeModeDispatcher: {
      close(): void
      dispatch(params: {
        request:
          | { op: 'list_tools'; server: string }
          | { op: 'call_tool'; server: string; tool: string; arguments?: Record<string, unknown> | undefined }
        traceCarrier: Readonly<Record<string, string>>
      }): Promise<
        { ok: true; result: unknown } | { ok: false; error: string; source: 'internal' | 'caller' | 'transport' }
      >
    }
    sandboxId: string
    requestTimeoutSeconds: number
  }): Promise<{ env: Record<string, string> }>
  stop(): Promise<void>
}
interface HostSandboxProvider {
  readonly type: string
  buildImage(): Promise<{
    status: 'pending' | 'ready' | 'failed'
    reason: string | null
    metadata: Record<string, string> | null
  }>
  createSandbox(): Promise<{ sandboxId: string }>
  exec(params: HostExecParams): Promise<HostExecResult>
  getAdditionalInstructions(): string | undefined
  getGitCredentialsPath(sandboxId: string): string
  downloadFile(params: { sandboxId: string; path: string }): Promise<Buffer>
  uploadFile(params: { sandboxId: string; remotePath: string; content: Buffer }): Promise<void>
  createCodeModeTransport(): HostCodeModeTransport
}

declare const manifest: InferredDockerManifest
declare const logger: WinstonLikeLogger
declare const maxDownload: number | undefined
declare const params: HostExecParams

export function build(tenantId: string): HostSandboxProvider {
  const context: TrueForgeContext = {
    tenantName: tenantId,
    errors: hostErrors,
    logger,
    fileMaxBytesForDownload: maxDownload,
    dockerHost: process.env['TRUEFORGE_DOCKER_HOST'],
  }
  const narrowed: TrueForgeDockerManifest = manifest
  const options: DockerSandboxProviderOptions = {
    ...fromTrueForgeManifest(narrowed, context),
    uploadMaxBytes: maxDownload,
    gpus: manifest.gpus === undefined ? undefined : { count: 1, exclusive: undefined },
    resources: { memoryBytes: undefined, nanoCpus: null, pidsLimit: undefined },
    tls: process.env['DOCKER_CERT_PATH'] ? { ca: process.env['DOCKER_CERT_PATH'], verify: undefined } : undefined,
    build: { context: '.', dockerfile: process.env['DOCKERFILE'], args: undefined },
    errors: { SandboxNotAvailableError: hostErrors.SandboxNotAvailableError, SandboxError: undefined },
    logger: { debug: undefined, info: logger.info },
  }
  const provider = new DockerSandboxProvider(options)
  void provider.exec({ ...params, cwd: params.cwd, timeoutSeconds: params.timeoutSeconds })
  void reapSandboxes({
    namespace: manifest.namespace,
    dockerHost: undefined,
    olderThanMinutes: undefined,
    dryRun: undefined,
  })
  void engineStats(process.env['DOCKER_HOST'])
  void fromTrueForgeManifest(manifest, undefined)
  return provider
}
