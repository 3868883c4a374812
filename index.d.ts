/// <reference types="node" />

/** The outcome of one command: it ran (any exit code), or it never ran. */
export type ExecResult =
  { success: true; response: { exitCode: number; result: string } } | { success: false; error: string }

export interface SandboxExecParams {
  sandboxId: string
  /** A shell command line, run with `bash -c` when the image has bash, else `sh -c`. */
  command: string
  /** Relative to the sandbox root, or absolute. Default: the sandbox root. */
  cwd?: string | undefined
  /** Added to the process environment (never spliced into the command). */
  env?: Record<string, string> | undefined
  /** Overrides `execTimeoutMs` for this call. */
  timeoutSeconds?: number | undefined
}

export type SandboxBuildStatus = 'pending' | 'ready' | 'failed'

export interface SandboxBuild {
  status: SandboxBuildStatus
  /** Human-readable; null when ready. */
  reason: string | null
  metadata: Record<string, string> | null
}

/**
 * Constructors the provider throws instead of its own classes (the host's, for `instanceof`).
 * A whole module namespace (`import * as sandboxErrors from …`) may be given: these names are
 * taken from it and other keys ignored.
 */
export interface InjectedErrors {
  /**
   * The host's base class (its constructor takes the message). Request errors the host gives no
   * class for (invalid path, not a regular file, path traversal, …) are then built on it, with
   * their `statusCode`, so they are `instanceof` it too. Engine failures never are.
   */
  SandboxError?: (abstract new (message?: string) => Error) | undefined
  SandboxNotAvailableError?: (new (sandboxId: string) => Error) | undefined
  SandboxFileNotFoundError?: (new (path: string) => Error) | undefined
  SandboxPathIsDirectoryError?: (new (path: string) => Error) | undefined
  SandboxFileTooLargeError?: (new (path: string, fileSize: number, maxSize: number) => Error) | undefined
  SandboxPathTraversalError?: (new (path: string) => Error) | undefined
}

/** A winston-shaped logger; every method is optional. */
export interface SandboxLogger {
  debug?: ((message: string, meta?: Record<string, unknown>) => void) | undefined
  info?: ((message: string, meta?: Record<string, unknown>) => void) | undefined
  warn?: ((message: string, meta?: Record<string, unknown>) => void) | undefined
  error?: ((message: string, meta?: Record<string, unknown>) => void) | undefined
}

export interface DockerSandboxProviderOptions {
  /** The image every sandbox runs: `[registry[:port]/]repository[:tag][@digest]`, the repository lowercase. Required. */
  image: string
  /** `unix:///path` or `tcp://host:port` (port 1 to 65535, IPv6 in brackets). Default: `$DOCKER_HOST`, else `$DOCKER_CONTEXT`, else the Docker config's current context, else `unix:///var/run/docker.sock`. */
  dockerHost?: string | undefined
  /**
   * TLS for a `tcp://` engine: `{ ca, cert, key }` (each a file path or PEM text) and `verify`
   * (default true; verification needs `ca`); `true` = the files in `$DOCKER_CERT_PATH`; `false` =
   * never TLS. Default: as `DOCKER_TLS_VERIFY`/`DOCKER_TLS`/`DOCKER_CERT_PATH` or the context say.
   */
  tls?:
    | boolean
    | { ca?: string | undefined; cert?: string | undefined; key?: string | undefined; verify?: boolean | undefined }
    | undefined
  /** Scopes container names and labels; `[a-z0-9-]{1,32}`. Default `'default'`. */
  namespace?: string | undefined
  /** Default exec timeout in milliseconds. Default 60000. */
  execTimeoutMs?: number | undefined
  /** Cap for `downloadFile`, in bytes (at most 1 GiB). Default 20 MiB, TrueForge's own download limit. */
  fileMaxBytes?: number | undefined
  /** Cap for `uploadFile`, in bytes (uploads are streamed). Default: none beyond what the engine accepts. */
  uploadMaxBytes?: number | undefined
  /** Cap on one exec's combined output (head and tail kept), in bytes. Default 10 MiB. */
  maxOutputBytes?: number | undefined
  /**
   * GPUs. Like `docker run --gpus`: `'all'`, a count, or device indexes/UUIDs; or CDI device names
   * (`'nvidia.com/gpu=all'`, `['nvidia.com/gpu=0']`; Docker 25+ with CDI enabled, Podman 5+); or
   * `{ count, exclusive: true }`: GPUs no other running sandbox on the engine holds (see docs/gpus.md).
   * Default: no GPU.
   */
  gpus?: 'all' | number | string[] | { count: number; exclusive?: boolean | undefined } | undefined
  /** The GPUs (indexes, UUIDs or CDI names) exclusive allocation hands out. Default: discovered on the engine host (CDI specs, else `nvidia-smi -L` in a throwaway container). */
  gpuDevices?: string[] | undefined
  /** How long `createSandbox()` waits for exclusive GPUs to free up before `GPUS_UNAVAILABLE`, in ms (at most an hour). Default 0. */
  gpuWaitMs?: number | undefined
  /** Container environment. Default none. */
  env?: Record<string, string> | undefined
  /** Extra container labels (the `trueforge.sandbox.` prefix is reserved). Default none. */
  labels?: Record<string, string> | undefined
  /** Minutes without activity (exec, upload, download, a running command) before a sandbox stops itself, even with no server running; 0 = never. Fractions allowed. Default 15. */
  autoStopIntervalInMinutes?: number | undefined
  /** Minutes a sandbox may stay stopped before the reaper removes it; 0 = never. Fractions allowed. Default 7200. */
  autoDeleteIntervalInMinutes?: number | undefined
  /** Linux capabilities kept (all others are dropped). Default CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, NET_BIND_SERVICE. Only Docker's default set may be kept (those and AUDIT_WRITE, MKNOD, NET_RAW, SETFCAP, SETPCAP, SYS_CHROOT); any other capability, `ALL` or an unknown name is refused with INVALID_OPTION. */
  capabilities?: string[] | undefined
  /** Set `no-new-privileges` (setuid binaries cannot gain privileges). Default true. */
  noNewPrivileges?: boolean | undefined
  /** Resource limits. Defaults: memoryBytes 8 GiB (swap never above it; null = unlimited), nanoCpus unlimited, pidsLimit 4096. */
  resources?:
    | { memoryBytes?: number | null | undefined; nanoCpus?: number | null | undefined; pidsLimit?: number | undefined }
    | undefined
  /** With `egress: 'open'`: `'bridge'`, `'none'` or a user-defined network name (never `host`); `'isolated'`: the provider's own even where the engine is not safe with it. Default: a network the provider makes per namespace and tenant (`trueforge-<namespace>`), inter-container communication off (the default bridge on Docker before 20.10.27, which can deadlock with it). Given alone, it implies `egress: 'open'`. */
  network?: string | undefined
  /**
   * What sandboxes may reach. A policy: the sandbox has no network interface but loopback; its
   * commands get `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY` (and lower case) pointing at the agent's
   * port `127.0.0.1:3128`, and the host's proxy allows a connection only when the name asked for
   * passes `allow` and not `deny`, and every address it resolves to is public (or named by an IP
   * or CIDR rule, or a `hosts` entry). Entries: host names (`pkgs.example`, `*.pkgs.example`,
   * which does not match the apex, `*` for every public name), IP addresses and CIDRs, each with
   * an optional `:port` (`[v6]:port`). `'open'`: the engine network, no policy. `'none'`: no
   * network at all. Default `{ allow: ['*'] }`, or `'open'` when `network` is given or the agent
   * is off (a policy needs the agent: INVALID_OPTION otherwise).
   */
  egress?: 'open' | 'none' | EgressPolicy | undefined
  /** Connections a sandbox under a policy has open at once; more are refused (503). 1 to 65536. Default 256. */
  egressMaxConnections?: number | undefined
  /** Bytes the host holds in flight per connection and direction. 4 KiB to 16 MiB. Default 64 KiB. */
  egressBufferBytes?: number | undefined
  /** A connection idle this long (ms) is closed. 1 s to 24 h. Default 300000. */
  egressIdleTimeoutMs?: number | undefined
  /** Resolving a name and connecting (ms). 100 ms to 5 min. Default 10000. */
  egressConnectTimeoutMs?: number | undefined
  /** Run commands as this `uid[:gid]` (each 0 to 4294967294) or user name; uploads and the layout then belong to it. Default: the image's user. */
  user?: string | undefined
  /** Make the root filesystem read-only; /workspace and /trueforge (volumes) and /tmp (tmpfs) stay writable. Default false. */
  readOnlyRootfs?: boolean | undefined
  /** OCI runtime, e.g. `'runsc'` (gVisor) or a Kata runtime. Default: the engine's default. */
  runtime?: string | undefined
  /** Recorded as a label; sandboxes of another tenant are not reachable from this provider. Default none. */
  tenantName?: string | undefined
  /** Build the image from a local context (a readable directory when the provider is built) through the Engine build API (tag derived from a hash of the context and args). */
  build?: { context: string; dockerfile?: string | undefined; args?: Record<string, string> | undefined } | undefined
  /** Credentials per registry host, e.g. `{ 'registry.example:5000': { username, password } }` or `{ identityToken }`. */
  registryAuth?: Record<string, { username: string; password: string } | { identityToken: string }> | undefined
  /** Deadline for one engine request that is not a command or a transfer (a hung engine then fails the call). Default 30000. */
  engineTimeoutMs?: number | undefined
  /**
   * Code Mode request bytes this process holds at once for one sandbox (all its transports), 64 KiB
   * to 1 GiB. Further requests wait, unread, until replies free room; one larger than this is
   * answered with an error to its caller in the sandbox. Default 64 MiB.
   */
  codeModeSandboxInflightBytes?: number | undefined
  /** The same bound for all of this provider's sandboxes together, 64 KiB to 16 GiB. Default 256 MiB. */
  codeModeProviderInflightBytes?: number | undefined
  /** Keep this many ready sandboxes per configuration (shared in the process). Default: no pool. */
  warmPool?: { size: number } | undefined
  /**
   * Run commands, files and Code Mode through the in-sandbox agent (a static binary this package
   * ships, started in each sandbox through the engine's exec API); `false` uses the engine's exec
   * and archive endpoints for everything. Default true.
   */
  agent?: boolean | undefined
  /**
   * With the agent and a local Docker engine, each new sandbox mounts a directory of this
   * machine's (read-only, its own) through which its agent links to this process, bypassing the
   * engine's exec stream (see docs/agent.md); `false` makes sandboxes without one. Default true.
   */
  agentLink?: boolean | undefined
  /**
   * With the agent and an engine on a local Unix socket, serve each Code Mode socket on a stream
   * of its own that this process's JavaScript thread reads (the fastest round trip); `false`
   * carries Code Mode calls on the agent's own connection. Default true.
   */
  codeModeLane?: boolean | undefined
  /**
   * With the agent, uploads of 32 MiB and over have the engine write their bytes into the
   * agent's root-only staging directory, from where the agent places them as the sandbox's user
   * (about twice the throughput of its stream); `false` sends every byte on the agent's stream.
   * Default true.
   */
  stagedUploads?: boolean | undefined
  /** Error constructors to throw instead of this package's classes. */
  errors?: InjectedErrors | undefined
  /** Receives the provider's log events. Default: none. */
  logger?: SandboxLogger | undefined
}

/** A Code Mode request from the sandbox (TrueForge's shapes). */
export type CodeModeRequest =
  | { op: 'list_tools'; server: string }
  | { op: 'call_tool'; server: string; tool: string; arguments?: Record<string, unknown> | undefined }

/** The answer to a Code Mode request; `source` says who is at fault. */
export type CodeModeReply =
  { ok: true; result: unknown } | { ok: false; error: string; source: 'internal' | 'caller' | 'transport' }

/** Does the MCP work for Code Mode requests (TrueForge's `CodeModeDispatcher`). */
export interface CodeModeDispatcher {
  dispatch(params: { request: CodeModeRequest; traceCarrier: Readonly<Record<string, string>> }): Promise<CodeModeReply>
  close?(): void
}

/** Where TrueForge installs the client module in the sandbox. */
export interface CodeModeClientInstall {
  /** Python source of `mcp_client` (3.9+, standard library only). */
  content: string
  /** `/trueforge/codemode/mcp_client.py`; `mcp-client` is linked in `/trueforge/codemode/bin`, first on every exec's `PATH`. */
  remotePath: string
  /**
   * With the agent: `/trueforge/codemode/bin/mcp-client-python`, where TrueForge links the
   * Python CLI, since `mcp-client` there is the agent's static client.
   */
  pathBinSymlink?: string | undefined
}

/**
 * Carries Code Mode requests between the sandbox and the dispatcher over a relay on the
 * engine's attached exec stream. One per turn; keyed on the sandbox id given to `start`.
 */
export interface CodeModeTransport {
  getClientInstall(params: { sandboxId: string }): CodeModeClientInstall
  /** Makes sure a relay serves this sandbox (relaunching a dead one); cheap when one does. Rejects with `code` `CODE_MODE_UNAVAILABLE` when the image has no python3, `CODE_MODE_START_FAILED` when python3 is there but the relay did not start (a full disk, say). */
  start(params: {
    codeModeDispatcher: CodeModeDispatcher
    sandboxId: string
    requestTimeoutSeconds: number
  }): Promise<{ env: Record<string, string> }>
  /** Ends the relay and waits for it; safe before or after start. */
  stop(): Promise<void>
}

/** A drop-in `SandboxProvider`: one Docker container per sandbox. */
export declare class DockerSandboxProvider {
  constructor(options: DockerSandboxProviderOptions)
  readonly type: 'docker'
  readonly supportsCodeMode: true
  /** The namespace this provider's sandboxes live in. */
  readonly namespace: string
  /** The Docker engine address in use. */
  readonly dockerHost: string
  /** What this provider's sandboxes may reach, in a few lines (the `egress` option). */
  readonly egressPolicy: string
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
  /** Removes this namespace's sandboxes stopped for longer than `autoDeleteIntervalInMinutes`. */
  reapStale(): Promise<{ removed: string[] }>
  /** Starts filling the warm pool now (a no-op without `warmPool`). */
  warmUp(): Promise<void>
  /**
   * Ends this instance's background work (every background task on the engine when it is the
   * engine's last provider); resolves once it has stopped. Never deletes sandboxes.
   */
  dispose(): Promise<void>
  /** A Code Mode transport for one turn: MCP tools callable from inside the sandbox. */
  createCodeModeTransport(): CodeModeTransport
  /**
   * What serves a sandbox's calls (for `doctor` and diagnostics): the in-sandbox agent, or the
   * engine's exec and archive endpoints and why.
   */
  agentStatus(sandboxId: string): Promise<AgentStatus>
  /** What a sandbox may reach, and what its connections through this process did. */
  egressStats(sandboxId: string): Promise<EgressStats>
}

/** An egress policy (see `egress`). */
export interface EgressPolicy {
  allow: string[]
  deny?: string[] | undefined
  /** Names mapped to addresses of the operator's choosing (a mirror inside the network, say). */
  hosts?: Record<string, string | string[]> | undefined
}

/** What a sandbox may reach, and what its connections through this process did (`egressStats`). */
export interface EgressStats {
  mode: 'policy' | 'open' | 'none'
  allowed: number
  refused: number
  /** Allowed, then the outbound connection failed. */
  failed: number
  open: number
  bytesOut: number
  bytesIn: number
}

/** What serves a sandbox's calls (`agentStatus`). */
export type AgentStatus =
  | {
      mode: 'agent'
      /** The agent's package version and platform. */
      version: string
      arch: string
      /** The agent's uid in the sandbox: 0, or the sandbox user's where it may not switch users. */
      uid: number
      pid: number
      /** The binary's path in the sandbox. */
      path: string
      asUser: boolean
      /** How paths are resolved: `openat2`, or one component at a time (gVisor, old kernels). */
      openat2: boolean
      /** How timeouts reach every process a command started: a child subreaper, or (gVisor,
       * which has none) a seccomp filter keeping them in the command's session. */
      subreaper: boolean
      sessionGuard: boolean
      /** File work as the sandbox user switches filesystem ids, or (gVisor) a thread's effective ids. */
      fsIds: boolean
      /** The agent's frames travel over a socket of this process's, not the engine's exec stream
       * (a sandbox made on a local Docker engine whose agent could reach it; see docs/operations.md). */
      linked: boolean
    }
  /** The agent is off, cannot start in this sandbox, or was given up for dying repeatedly
   * (tried again after a minute, doubling up to 30 minutes, and when the provider restarts the
   * sandbox's container); `reason` says which. */
  | { mode: 'engine-exec'; reason: string }

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
/** A path with a NUL byte or a lone UTF-16 surrogate, over 3800 bytes, whose parent is a file, or (for uploads) under /dev, /proc or /sys or onto a file the engine mounts (/etc/hosts). */
export declare class SandboxInvalidPathError extends SandboxError {
  constructor(message: string, path: string)
  readonly path: string
}
/** Download of a device, FIFO, socket or other non-regular file. */
export declare class SandboxNotRegularFileError extends SandboxError {
  constructor(message: string, path: string)
  readonly path: string
}
/** Download of a file that was rewritten while it was read, on every try (`code` `'FILE_CHANGED'`). */
export declare class SandboxFileChangedError extends SandboxError {
  constructor(message: string, path: string)
  readonly statusCode: 409
  readonly path: string
}
/** The Docker engine could not be reached, timed out, or refused the request. */
export declare class SandboxEngineError extends SandboxError {}
/** The engine cannot give GPUs (`code` `'GPU_UNSUPPORTED'`, statusCode 500), or no GPU is free for an exclusive sandbox (`'GPUS_UNAVAILABLE'`, 503). */
export declare class SandboxGpuError extends SandboxError {
  constructor(message: string, code: 'GPUS_UNAVAILABLE' | 'GPU_UNSUPPORTED', holders?: string[])
  readonly code: 'GPUS_UNAVAILABLE' | 'GPU_UNSUPPORTED'
  /** Ids of the sandboxes holding the GPUs this one could have used. */
  readonly holders: string[]
}
export declare const CONTRACT_ERROR_NAMES: readonly string[]

/** Counts of what this process holds for one engine; for tests and diagnostics. */
export interface EngineStats {
  /** Providers that made a call on the engine and are not disposed. */
  providers: number
  /** Background tasks running (pool refills, image work, reapers, clean-ups …). */
  backgroundTasks: number
  /** Containers with a start in progress or waited for. */
  startLocks: number
  /** Images with a probe in progress or waited for. */
  probeLocks: number
  /** Containers cached as ours. */
  cachedTargets: number
  /** Images probed. */
  probes: number
  /** Pulls and builds remembered (running or failed). */
  imageWorks: number
  /** Warm-pool refills in flight. */
  poolRefills: number
  /** Namespaces with a live background reaper. */
  reaperLeases: number
  /** Containers with a live in-sandbox agent connection (or one starting). */
  agentConnections: number
  /** Of those, the agents linked to this process through a socket (their traffic bypasses the engine). */
  linkedAgents: number
}

/**
 * What this process holds for the engine at `dockerHost` (default: as a provider without one
 * picks it; an engine reached with `tls` options is not found this way); null when the process
 * has not connected to that engine.
 */
export declare function engineStats(dockerHost?: string | undefined): EngineStats | null

/** Removes sandboxes of one namespace stopped for at least `olderThanMinutes` (default 7200), without a provider. */
export declare function reapSandboxes(options?: {
  namespace?: string | undefined
  dockerHost?: string | undefined
  olderThanMinutes?: number | undefined
  dryRun?: boolean | undefined
}): Promise<{ removed: string[] }>

/** A TrueForge sandbox-provider manifest of `type: 'docker'`, as the server stores it (snake_case). */
export interface TrueForgeDockerManifest {
  type: 'docker'
  /** The image every sandbox runs, e.g. `'trueforge-sandbox:2'`. */
  image: string
  /** Default exec timeout in milliseconds (`execTimeoutMs`). */
  exec_timeout_ms?: number | undefined
  /** Idle minutes before a sandbox stops itself; 0 = never (`autoStopIntervalInMinutes`). */
  auto_stop_interval_in_minutes?: number | undefined
  /** Minutes stopped before the reaper removes a sandbox; 0 = never (`autoDeleteIntervalInMinutes`). */
  auto_delete_interval_in_minutes?: number | undefined
  /** Like `docker run --gpus`. */
  gpus?: 'all' | number | string[] | undefined
  /** `[a-z0-9-]{1,32}`; scopes container names and labels. */
  namespace?: string | undefined
  /**
   * The sandboxes' outbound network (`egress`), passed through as given: `'open'`, `'none'`, or a
   * policy of host names, IP addresses or CIDRs (each with an optional `:port`) to allow and deny,
   * with `hosts` mapping names to addresses. The provider checks it.
   */
  egress?: TrueForgeDockerEgress | undefined
}

/** A TrueForge docker manifest's `egress`, in the provider option's shape. */
export type TrueForgeDockerEgress =
  | 'open'
  | 'none'
  | {
      allow: string[]
      deny?: string[] | undefined
      hosts?: Record<string, string | string[]> | undefined
    }

/** What the TrueForge server supplies when it builds a provider. */
export interface TrueForgeContext {
  /** The tenant (TrueForge's `tenant_id`); recorded on every sandbox. */
  tenantName?: string | undefined
  /** The server's sandbox error classes, or its whole errors module, so its `instanceof` checks hold. */
  errors?: InjectedErrors | undefined
  /** The server's (winston) logger. */
  logger?: SandboxLogger | undefined
  /** The server's download limit in bytes (`fileMaxBytes`). */
  fileMaxBytesForDownload?: number | undefined
  /** The Docker engine address, when not `$DOCKER_HOST` or the local socket. */
  dockerHost?: string | undefined
}

/** Maps a TrueForge docker manifest and the server's context to provider options; refuses bad fields with `INVALID_OPTION` naming the manifest field. Reaches no engine. */
export declare function fromTrueForgeManifest(
  manifest: TrueForgeDockerManifest,
  context?: TrueForgeContext | undefined,
): DockerSandboxProviderOptions
