// fromTrueForgeManifest: the mapping of a TrueForge docker manifest and the server's context to our
// options (no engine), and one provider built from it on the real engine.

import {
  DockerSandboxProvider,
  fromTrueForgeManifest,
  SandboxNotAvailableError,
  type TrueForgeDockerManifest,
} from '..'
import { BUSYBOX, ok, SandboxTracker, uniqueNamespace } from './helpers'

function refusal(fn: () => unknown): { option: string; code: string; message: string } {
  try {
    fn()
  } catch (e) {
    expect(e).toBeInstanceOf(TypeError)
    return e as any
  }
  throw new Error('expected a refusal, got none')
}

const base: TrueForgeDockerManifest = { type: 'docker', image: 'trueforge-sandbox:2' }

describe('mapping (no engine)', () => {
  test('every manifest field and context key lands on its option', () => {
    class HostGone extends Error {
      constructor(id: string) {
        super(id)
      }
    }
    const logger = { info: () => {} }
    const opts = fromTrueForgeManifest(
      {
        type: 'docker',
        image: 'trueforge-sandbox:2',
        exec_timeout_ms: 90_000,
        auto_stop_interval_in_minutes: 5,
        auto_delete_interval_in_minutes: 0,
        gpus: ['0', 'GPU-abc'],
        namespace: 'acme-prod',
      },
      {
        tenantName: 'acme',
        errors: { SandboxNotAvailableError: HostGone },
        logger,
        fileMaxBytesForDownload: 20 * 1024 * 1024,
        dockerHost: 'unix:///var/run/docker.sock',
      },
    )
    expect(opts).toEqual({
      image: 'trueforge-sandbox:2',
      execTimeoutMs: 90_000,
      autoStopIntervalInMinutes: 5,
      autoDeleteIntervalInMinutes: 0,
      gpus: ['0', 'GPU-abc'],
      namespace: 'acme-prod',
      tenantName: 'acme',
      errors: { SandboxNotAvailableError: HostGone },
      logger,
      fileMaxBytes: 20 * 1024 * 1024,
      dockerHost: 'unix:///var/run/docker.sock',
    })
    expect(opts.logger).toBe(logger)
  })

  test('a minimal manifest without context gives only the image; absent and null fields are left to defaults', () => {
    expect(fromTrueForgeManifest(base)).toEqual({ image: 'trueforge-sandbox:2' })
    expect(
      fromTrueForgeManifest(
        { ...base, exec_timeout_ms: undefined, gpus: null as any, namespace: undefined },
        { tenantName: undefined, logger: null as any },
      ),
    ).toEqual({ image: 'trueforge-sandbox:2' })
    expect(fromTrueForgeManifest({ ...base, gpus: 'all' }).gpus).toBe('all')
    expect(fromTrueForgeManifest({ ...base, gpus: 2 }).gpus).toBe(2)
    expect(fromTrueForgeManifest({ ...base, auto_stop_interval_in_minutes: 0.5 }).autoStopIntervalInMinutes).toBe(0.5)
  })

  test('egress passes through as given: open, none, or a policy with deny entries and host mappings', () => {
    expect(fromTrueForgeManifest({ ...base, egress: 'open' })).toEqual({ image: base.image, egress: 'open' })
    expect(fromTrueForgeManifest({ ...base, egress: 'none' })).toEqual({ image: base.image, egress: 'none' })
    const egress = {
      allow: ['example.org', '*.example.org:443', '10.0.0.0/8', '[2001:db8::1]:443'],
      deny: ['169.254.169.254'],
      hosts: { 'pkg.internal': ['10.1.2.3', 'fd00::3'], 'mirror.internal': '10.1.2.4' },
    }
    const m: TrueForgeDockerManifest = { ...base, egress }
    const frozen = JSON.stringify(m)
    const opts = fromTrueForgeManifest(m)
    expect(opts).toEqual({ image: base.image, egress })
    // A copy: the options share no array or object with the stored manifest.
    const copied = (opts as { egress?: typeof egress }).egress
    expect(copied).not.toBe(egress)
    expect(copied?.allow).not.toBe(egress.allow)
    expect(copied?.hosts?.['pkg.internal']).not.toBe(egress.hosts['pkg.internal'])
    expect(JSON.stringify(m)).toBe(frozen)
    // Its rules are the constructor's (a pass-through, not a second set of checks here).
    expect(fromTrueForgeManifest({ ...base, egress: { allow: 'example.org' } as any })).toEqual({
      image: base.image,
      egress: { allow: 'example.org' },
    })
  })

  test('the manifest is not mutated and the gpu list is copied', () => {
    const gpus = ['1']
    const m: TrueForgeDockerManifest = { ...base, gpus }
    const frozen = JSON.stringify(m)
    const opts = fromTrueForgeManifest(m)
    expect(JSON.stringify(m)).toBe(frozen)
    expect(opts.gpus).toEqual(['1'])
    expect(opts.gpus).not.toBe(gpus)
  })

  test("the server's whole errors module passes through, and the constructor takes it", () => {
    abstract class HostBase extends Error {
      abstract readonly statusCode: number
    }
    class HostGone extends HostBase {
      readonly statusCode = 410
    }
    const errorsModule = {
      SandboxError: HostBase,
      SandboxNotAvailableError: HostGone,
      validateNoPathTraversal: () => {},
    }
    const opts = fromTrueForgeManifest(base, { errors: errorsModule as any })
    expect(opts.errors).toBe(errorsModule)
    expect(() => new DockerSandboxProvider(opts).dispose()).not.toThrow()
  })

  test.each([
    ['not an object', null, 'manifest'],
    ['an array', [], 'manifest'],
    ['wrong type', { type: 'daytona', image: 'x' }, 'type'],
    ['missing type', { image: 'x' }, 'type'],
    ['missing image', { type: 'docker' }, 'image'],
    ['image not a string', { type: 'docker', image: 3 }, 'image'],
    ['daytona auth block', { ...base, auth: { api_key: 'k' } }, 'auth'],
    ['daytona archive interval', { ...base, auto_archive_interval_in_minutes: 60 }, 'auto_archive_interval_in_minutes'],
    ['camelCase spelling', { ...base, execTimeoutMs: 1000 }, 'execTimeoutMs'],
    ['timeout zero', { ...base, exec_timeout_ms: 0 }, 'exec_timeout_ms'],
    ['timeout fractional', { ...base, exec_timeout_ms: 1.5 }, 'exec_timeout_ms'],
    ['timeout as string', { ...base, exec_timeout_ms: '60000' }, 'exec_timeout_ms'],
    ['timeout above a week', { ...base, exec_timeout_ms: 8 * 24 * 3600 * 1000 }, 'exec_timeout_ms'],
    ['negative idle stop', { ...base, auto_stop_interval_in_minutes: -1 }, 'auto_stop_interval_in_minutes'],
    ['NaN delete', { ...base, auto_delete_interval_in_minutes: NaN }, 'auto_delete_interval_in_minutes'],
    ['delete as string', { ...base, auto_delete_interval_in_minutes: '5' }, 'auto_delete_interval_in_minutes'],
    ['gpus as object', { ...base, gpus: { count: 1 } }, 'gpus'],
    ['gpus list of numbers', { ...base, gpus: [0] }, 'gpus'],
    ['namespace not a string', { ...base, namespace: 7 }, 'namespace'],
  ])('refuses %s, naming the field', (_what, manifest, option) => {
    const e = refusal(() => fromTrueForgeManifest(manifest as any))
    expect(e.code).toBe('INVALID_OPTION')
    expect(e.option).toBe(option)
    expect(e.message).toContain(`\`${option}\``)
  })

  test.each([
    ['not an object', 'acme', 'context'],
    ['unknown key', { tenant_id: 'acme' }, 'context.tenant_id'],
    ['tenant not a string', { tenantName: 5 }, 'context.tenantName'],
    ['zero download cap', { fileMaxBytesForDownload: 0 }, 'context.fileMaxBytesForDownload'],
    ['download cap above 1 GiB', { fileMaxBytesForDownload: 2 ** 31 }, 'context.fileMaxBytesForDownload'],
    ['docker host not a string', { dockerHost: 1 }, 'context.dockerHost'],
  ])('refuses a context that is %s', (_what, context, option) => {
    const e = refusal(() => fromTrueForgeManifest(base, context as any))
    expect(e.code).toBe('INVALID_OPTION')
    expect(e.option).toBe(option)
  })

  // Deep rules of fields whose name is the same in both spellings stay the constructor's; the
  // refusal then still names the manifest's field. Construction reaches no engine.
  test.each([
    ['image', { ...base, image: 'has space' }],
    ['namespace', { ...base, namespace: 'Upper' }],
    ['egress', { ...base, egress: { allow: 'example.org' } as any }],
    ['egress', { ...base, egress: 'closed' as any }],
    ['gpus', { ...base, gpus: 0 }],
    ['gpus', { ...base, gpus: [] as string[] }],
  ])('the constructor refuses a bad %s under the same name', (option, manifest) => {
    const opts = fromTrueForgeManifest(manifest)
    const e = refusal(() => new DockerSandboxProvider(opts))
    expect(e.code).toBe('INVALID_OPTION')
    expect(e.option).toBe(option)
  })
})

describe('a provider built from a manifest (real engine)', () => {
  const namespace = uniqueNamespace('t-tfman')
  const tracker = new SandboxTracker(namespace)
  class HostNotAvailable extends Error {
    readonly statusCode = 410
    constructor(readonly sandboxId: string) {
      super(`host: ${sandboxId} is gone`)
    }
  }
  const events: string[] = []
  const provider = new DockerSandboxProvider(
    fromTrueForgeManifest(
      { type: 'docker', image: BUSYBOX, exec_timeout_ms: 30_000, auto_stop_interval_in_minutes: 5, namespace },
      {
        tenantName: 'acme',
        errors: { SandboxNotAvailableError: HostNotAvailable },
        logger: { info: (m: string) => events.push(m), debug: () => {}, warn: () => {}, error: () => {} },
        fileMaxBytesForDownload: 1024,
      },
    ),
  )

  afterAll(async () => {
    await tracker.cleanup(provider)
    provider.dispose()
  })

  test('creates a sandbox, execs, honours the download cap and throws the host class', async () => {
    expect(provider.namespace).toBe(namespace)
    const id = await tracker.create(provider)
    expect(await ok(provider, id, 'echo "$((6 * 7))"')).toBe('42\n')
    await ok(provider, id, 'head -c 2048 /dev/zero > big.bin && head -c 10 /dev/zero > small.bin')
    expect((await provider.downloadFile({ sandboxId: id, path: 'small.bin' })).length).toBe(10)
    await expect(provider.downloadFile({ sandboxId: id, path: 'big.bin' })).rejects.toMatchObject({
      statusCode: 413,
      maxSize: 1024,
    })
    await provider.removeSandbox(id)
    const gone = provider.exec({ sandboxId: id, command: 'true' })
    await expect(gone).rejects.toBeInstanceOf(HostNotAvailable)
    await expect(gone).rejects.not.toBeInstanceOf(SandboxNotAvailableError)
  })
})
