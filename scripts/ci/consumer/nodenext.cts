// Type-checked (never run) in a consumer project with `module: nodenext`: the same from CommonJS.
import { DockerSandboxProvider, SandboxFileTooLargeError, fromTrueForgeManifest } from 'trueforge-docker-sandbox'
import type { SandboxExecParams } from 'trueforge-docker-sandbox'

const params: SandboxExecParams = { sandboxId: '/workspace/x', command: 'true', timeoutSeconds: 5 }
export const made = [
  fromTrueForgeManifest({ type: 'docker', image: 'x' }, {}),
  new DockerSandboxProvider({ image: 'x' }),
  new SandboxFileTooLargeError('p', 2, 1).maxSize,
  params,
]
