// Type-checked (never run) in a consumer project with `module: nodenext`: named imports from ESM.
import { DockerSandboxProvider, reapSandboxes, SandboxNotAvailableError, SandboxError } from 'trueforge-docker-sandbox'
import type { DockerSandboxProviderOptions, ExecResult, SandboxBuild } from 'trueforge-docker-sandbox'

const options: DockerSandboxProviderOptions = { image: 'trueforge-sandbox:2', uploadMaxBytes: 1 << 30 }
const provider = new DockerSandboxProvider(options)
export async function check(): Promise<[ExecResult, SandboxBuild, boolean]> {
  const r = await provider.exec({ sandboxId: '/workspace/x', command: 'true' })
  const b = await provider.getImageBuildStatus()
  await reapSandboxes({ dryRun: true })
  return [r, b, new SandboxNotAvailableError('x') instanceof SandboxError]
}
