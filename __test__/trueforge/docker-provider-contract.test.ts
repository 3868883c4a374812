// TrueForge's own SandboxProvider contract suite, run against DockerSandboxProvider as installed
// from our packed tarball. The suite is TrueForge's (imported from the checkout); only the
// factory is ours.

import * as sandboxErrors from '../../src/core/sandbox/SandboxErrors'
import { runSandboxProviderContractSuite } from '../core/sandbox/provider/sandboxProviderContractSuite'
import { containersLeft, runNamespace, Tracker } from './support'

const namespace = runNamespace('tfc')
const all = new Tracker(namespace)

// The host's error module as a whole, as the server passes it.
const errors = sandboxErrors

runSandboxProviderContractSuite(() => {
  const mark = all.created.length
  const provider = all.provider({ errors, tenantName: 'contract' }) // through fromTrueForgeManifest
  return {
    provider,
    dispose: async () => {
      for (const id of all.createdSince(mark)) await provider.removeSandbox(id)
      provider.dispose()
    },
  }
})

afterAll(async () => {
  await all.cleanup()
  expect(containersLeft(namespace)).toBe(0)
}, 120_000)
