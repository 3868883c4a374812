// Shared by the tests that `npm run test:trueforge` copies into a TrueForge checkout
// (packages/trueforge-core/tests/<temp folder>/). They run there, under TrueForge's own jest
// config, against TrueForge's own classes (imported by relative path from inside that checkout) and
// this package as installed from its packed tarball. Nothing here is TrueForge's code.

import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import winston from 'winston'
import { Sandbox } from '../../src/core/sandbox/Sandbox'
import { NOOP_AGENT_TRACING } from '../../src/core/tracing/NoopAgentTracing'

// eslint-disable-next-line @typescript-eslint/no-require-imports
const pkg = require('trueforge-docker-sandbox')

export const DockerSandboxProvider = pkg.DockerSandboxProvider
export const fromTrueForgeManifest = pkg.fromTrueForgeManifest
export type DockerProvider = InstanceType<typeof pkg.DockerSandboxProvider>

/** The image the TrueForge-side tests run; `TRUEFORGE_SANDBOX_IMAGE` overrides it. */
export const IMAGE = process.env['TRUEFORGE_SANDBOX_IMAGE'] || 'trueforge-sandbox:2'

const NAMESPACE_LABEL = 'trueforge.sandbox.namespace'

/**
 * A namespace of this run only, so cleanup can sweep exactly what this run made. It carries the
 * harness's run tag (`TRUEFORGE_TEST_RUN_TAG`), so the harness can sweep too when jest is killed
 * before its afterAll hooks run.
 */
export function runNamespace(prefix: string): string {
  const tag = (process.env['TRUEFORGE_TEST_RUN_TAG'] || '').replace(/[^a-z0-9]/g, '').slice(0, 8)
  return [prefix, tag, randomBytes(4).toString('hex')].filter(Boolean).join('-')
}

/**
 * Remembers every sandbox the providers it wraps create, and removes them all at the end:
 * through a provider first, then with the docker CLI for anything left in the namespace.
 */
export class Tracker {
  readonly created: string[] = []
  readonly providers: DockerProvider[] = []

  constructor(readonly namespace: string) {}

  /**
   * A provider of this namespace whose createSandbox() is recorded, built the way the server's
   * factory builds one: from a `type: 'docker'` manifest and the server's context.
   */
  provider(context: Record<string, unknown> = {}, extra: Record<string, unknown> = {}): DockerProvider {
    const manifest = { type: 'docker', image: IMAGE, namespace: this.namespace, exec_timeout_ms: 120_000 }
    const provider: DockerProvider = new DockerSandboxProvider({
      ...fromTrueForgeManifest(manifest, context),
      ...extra,
    })
    const create = provider.createSandbox.bind(provider)
    provider.createSandbox = async () => {
      const r = await create()
      this.created.push(r.sandboxId)
      return r
    }
    this.providers.push(provider)
    return provider
  }

  /** How many sandboxes were created since `mark` (a previous `created.length`). */
  createdSince(mark: number): string[] {
    return this.created.slice(mark)
  }

  async cleanup(): Promise<void> {
    const remover: DockerProvider = new DockerSandboxProvider({ image: IMAGE, namespace: this.namespace })
    for (const id of this.created) {
      try {
        await remover.removeSandbox(id)
      } catch {
        // The sweep below catches what this missed.
      }
    }
    for (const p of [...this.providers, remover]) p.dispose()
    sweepNamespace(this.namespace)
  }
}

/** Force-removes every container (and its volumes) labelled with a namespace. Never throws. */
export function sweepNamespace(namespace: string): void {
  try {
    const ids = execFileSync('docker', ['ps', '-aq', '--filter', `label=${NAMESPACE_LABEL}=${namespace}`], {
      encoding: 'utf8',
    })
      .split('\n')
      .map((s) => s.trim())
      .filter(Boolean)
    if (ids.length > 0) execFileSync('docker', ['rm', '-f', '-v', ...ids], { stdio: 'ignore' })
  } catch {
    // best effort: it runs in afterAll
  }
}

/** Containers left in a namespace (for the tests' own cleanup assertion). */
export function containersLeft(namespace: string): number {
  return execFileSync('docker', ['ps', '-aq', '--filter', `label=${NAMESPACE_LABEL}=${namespace}`], {
    encoding: 'utf8',
  })
    .split('\n')
    .filter((s) => s.trim()).length
}

/** A winston logger that writes nothing, as the Sandbox and its dispatcher want one. */
export function silentLogger(): winston.Logger {
  const logger = winston.createLogger({ silent: true, transports: [] })
  logger.child = () => logger
  return logger
}

/** One turn's Sandbox, as the server builds it. */
export function turnSandbox(
  provider: DockerProvider,
  extra: Partial<ConstructorParameters<typeof Sandbox>[0]> = {},
): Sandbox {
  return new Sandbox({
    provider,
    blockDestructiveToolsInCodeMode: true,
    mcpRequestTimeoutMs: 60_000,
    mcpConnectTimeoutMs: 5_000,
    tracing: NOOP_AGENT_TRACING,
    logger: silentLogger(),
    ...extra,
  })
}
