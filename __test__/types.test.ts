// The class must type-check as the consumer's SandboxProvider (restated from
// shared/spec/sandbox-provider.md): `tsc` (run by .ci/run) fails if a name or a shape drifts.
// The runtime test checks the same surface on a constructed object.

import { DockerSandboxProvider } from '..'
import type * as pkg from '..'
import type { DockerSandboxProviderOptions } from '..'
import type { NativeProviderOptions } from '../binding'

type ExecResult = { success: true; response: { exitCode: number; result: string } } | { success: false; error: string }

interface SandboxExecParams {
  sandboxId: string
  command: string
  cwd?: string
  env?: Record<string, string>
  timeoutSeconds?: number
}

type SandboxBuildStatus = 'pending' | 'ready' | 'failed'
interface SandboxBuild {
  status: SandboxBuildStatus
  reason: string | null
  metadata: Record<string, string> | null
}

/** TrueForge's Code Mode shapes, restated (CodeModeTransport.ts, types.ts). */
type CodeModeRequest =
  | { op: 'list_tools'; server: string }
  | { op: 'call_tool'; server: string; tool: string; arguments?: Record<string, unknown> }
type CodeModeReply =
  { ok: true; result: unknown } | { ok: false; error: string; source: 'internal' | 'caller' | 'transport' }
interface CodeModeDispatcher {
  close(): void
  dispatch(params: { request: CodeModeRequest; traceCarrier: Readonly<Record<string, string>> }): Promise<CodeModeReply>
}
interface CodeModeTransport {
  getClientInstall(params: { sandboxId: string }): {
    content: string
    remotePath: string
    pathBinSymlink?: string | undefined
  }
  start(params: {
    codeModeDispatcher: CodeModeDispatcher
    sandboxId: string
    requestTimeoutSeconds: number
  }): Promise<{ env: Record<string, string> }>
  stop(): Promise<void>
}

interface SandboxProvider {
  readonly type: string
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
  createCodeModeTransport(): CodeModeTransport
}

// The package's own declarations of the shared shapes are the consumer's, both ways.
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false
const sameShapes: [
  Same<pkg.ExecResult, ExecResult>,
  Same<pkg.SandboxExecParams, SandboxExecParams>,
  Same<pkg.SandboxBuild, SandboxBuild>,
  Same<pkg.CodeModeRequest, CodeModeRequest>,
  Same<pkg.CodeModeReply, CodeModeReply>,
] = [true, true, true, true, true]

test('a DockerSandboxProvider is a SandboxProvider', () => {
  const provider: SandboxProvider = new DockerSandboxProvider({ image: 'trueforge-sandbox-busybox:1' })
  expect(provider.type).toBe('docker')
  expect(sameShapes.every(Boolean)).toBe(true)
  const methods: (keyof SandboxProvider)[] = [
    'buildImage',
    'getImageBuildStatus',
    'createSandbox',
    'exec',
    'getAdditionalInstructions',
    'getToolResultDumpDir',
    'getGitCredentialsPath',
    'getFileUploadsDir',
    'getSkillsDir',
    'getGitDownloaderPath',
    'downloadFile',
    'uploadFile',
    'createCodeModeTransport',
  ]
  for (const m of methods) expect(typeof provider[m]).toBe('function')
  expect(typeof provider.getAdditionalInstructions()).toBe('string')
  const transport: CodeModeTransport = provider.createCodeModeTransport()
  for (const m of ['getClientInstall', 'start', 'stop'] as const) expect(typeof transport[m]).toBe('function')
  expect(transport.getClientInstall({ sandboxId: '' }).remotePath).toMatch(/\/mcp_client\.py$/)
})

// index.d.ts states the options by hand; binding.d.ts has them generated from the Rust struct.
// `tsc` fails here if an option is added to, dropped from or retyped in one and not the other.
type PublicOptions = Omit<DockerSandboxProviderOptions, 'errors' | 'logger'>
type SameKeys<A, B> = [keyof A] extends [keyof B] ? ([keyof B] extends [keyof A] ? true : false) : false
const sameOptionNames: SameKeys<PublicOptions, NativeProviderOptions> = true
const publicIsNative = (o: PublicOptions): NativeProviderOptions => o
const nativeIsPublic = (o: NativeProviderOptions & { image: string }): PublicOptions => o

test('the public options and the generated native options agree', () => {
  expect(sameOptionNames).toBe(true)
  const o: PublicOptions = { image: 'x', gpus: { count: 1, exclusive: true }, resources: { memoryBytes: null } }
  expect(nativeIsPublic({ ...publicIsNative(o), image: o.image })).toEqual(o)
})
