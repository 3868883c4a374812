// Run from a consumer project that installed the packed tarball: every public name imports by
// name from an ES module (as TrueForge's ESM server build does), and one exec runs through it.
import {
  CONTRACT_ERROR_NAMES,
  DockerSandboxProvider,
  engineStats,
  fromTrueForgeManifest,
  reapSandboxes,
  SandboxEngineError,
  SandboxError,
  SandboxFileChangedError,
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxGpuError,
  SandboxInvalidPathError,
  SandboxNotAvailableError,
  SandboxNotRegularFileError,
  SandboxPathIsDirectoryError,
  SandboxPathTraversalError,
} from 'trueforge-docker-sandbox'
import { createRequire } from 'node:module'

const named = {
  CONTRACT_ERROR_NAMES,
  DockerSandboxProvider,
  engineStats,
  fromTrueForgeManifest,
  reapSandboxes,
  SandboxEngineError,
  SandboxError,
  SandboxFileChangedError,
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxGpuError,
  SandboxInvalidPathError,
  SandboxNotAvailableError,
  SandboxNotRegularFileError,
  SandboxPathIsDirectoryError,
  SandboxPathTraversalError,
}
const cjs = createRequire(import.meta.url)('trueforge-docker-sandbox')
const missing = Object.keys(cjs).filter((k) => !(k in named))
if (missing.length > 0) throw new Error(`exports not checked here: ${missing.join(', ')}`)
for (const [k, v] of Object.entries(named)) {
  if (v === undefined || v !== cjs[k]) throw new Error(`ESM export ${k} differs from the CommonJS one`)
}

const provider = new DockerSandboxProvider({ image: 'trueforge-sandbox-busybox:1', namespace: 'ci-smoke-esm' })
const { sandboxId } = await provider.createSandbox()
try {
  const r = await provider.exec({ sandboxId, command: 'echo esm-ok' })
  if (!r.success || r.response.result.trim() !== 'esm-ok')
    throw new Error(`unexpected exec result: ${JSON.stringify(r)}`)
  const e = await provider.downloadFile({ sandboxId, path: 'missing' }).catch((err) => err)
  if (!(e instanceof SandboxFileNotFoundError)) throw new Error(`expected SandboxFileNotFoundError, got ${e}`)
  console.log(`ESM import of ${Object.keys(named).length} names ok; exec ran in ${sandboxId}`)
} finally {
  await provider.removeSandbox(sandboxId)
}
