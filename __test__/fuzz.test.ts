// Property-based fuzzing of the TypeScript API with fast-check, against the real engine. Every
// call either succeeds or fails with one of the typed errors (a SandboxError subclass with a
// documented `code`, a TypeError with code INVALID_ARGUMENT / INVALID_OPTION, or exec's
// `{ success: false, error }`), the process never crashes, and containers that are not ours
// (canaries made with the docker CLI, named and labelled as ours would be) are never started,
// stopped, exec'd into, written to or removed.

import fc from 'fast-check'

import { DockerSandboxProvider, SandboxError, SandboxNotAvailableError } from '..'
import {
  BUSYBOX,
  cleanupNamespace,
  containerNameFor,
  docker,
  dockerTry,
  inspectContainer,
  LABEL_ID,
  LABEL_MANAGED_BY,
  LABEL_NAMESPACE,
  LABEL_TEST_NAMESPACE,
  MANAGED_BY,
  ok,
  Provider,
  randomUlid,
  uniqueNamespace,
} from './helpers'

const namespace = uniqueNamespace('t-fuzz')
const otherNamespace = uniqueNamespace('t-fuzzo')
const FILE_MAX = 1024
const provider = new DockerSandboxProvider({
  image: BUSYBOX,
  namespace,
  network: 'none',
  fileMaxBytes: FILE_MAX,
  uploadMaxBytes: FILE_MAX,
})

/** Calls made into the provider (and constructor calls), reported at the end. */
const cases = new Map<string, number>()
function count(kind: string, n = 1) {
  cases.set(kind, (cases.get(kind) ?? 0) + n)
}

/** A value for failure messages: long strings and buffers shortened. */
function short(v: unknown): unknown {
  if (typeof v === 'string') return v.length > 80 ? `${v.slice(0, 60)}…(${v.length} chars)` : v
  if (v instanceof Uint8Array) return `<${v.length} bytes>`
  if (Array.isArray(v)) return v.map(short)
  if (v && typeof v === 'object')
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [short(k) as string, short(x)]))
  return v
}

const ID_GRAMMAR = /^\/workspace\/[0-7][0-9A-HJKMNP-TV-Z]{25}$/
const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ'
const DOCUMENTED_CODES = new Set([
  'SANDBOX_NOT_AVAILABLE',
  'FILE_NOT_FOUND',
  'PATH_IS_DIRECTORY',
  'FILE_TOO_LARGE',
  'PATH_TRAVERSAL',
  'INVALID_PATH',
  'NOT_REGULAR_FILE',
  'FILE_CHANGED',
  'ENGINE_UNREACHABLE',
  'ENGINE_TIMEOUT',
  'ENGINE_ERROR',
])

// ---------------------------------------------------------------------------------------------
// Canaries: containers that are not ours, made with the CLI, running `sleep 3600`.

interface Canary {
  label: string
  name: string
  /** The sandbox id that a provider of `namespace` derives this container's name from. */
  id: string
  containerId: string
}
const canaries: Canary[] = []
let realId: string
let before: Record<string, ReturnType<typeof snapshot>>

function snapshot(name: string) {
  const i = inspectContainer(name)
  if (!i) return { gone: true }
  return {
    id: i.Id,
    running: i.State.Running,
    paused: i.State.Paused,
    startedAt: i.State.StartedAt,
    finishedAt: i.State.FinishedAt,
    pid: i.State.Pid,
    restartCount: i.RestartCount,
    execIds: i.ExecIDs ?? [],
  }
}

beforeAll(async () => {
  const mk = (label: string, ns: string, labels: string[]) => {
    const ulid = randomUlid()
    const id = `/workspace/${ulid}`
    const name = `trueforge-${ns}-${ulid.toLowerCase()}`
    const containerId = docker([
      'run',
      '-d',
      '--init',
      '--network',
      'none',
      '--name',
      name,
      '--label',
      `${LABEL_TEST_NAMESPACE}=${namespace}`,
      ...labels.flatMap((l) => ['--label', l.replace('<id>', id)]),
      BUSYBOX,
      'sh',
      '-c',
      'sleep 3600',
    ])
    canaries.push({ label, name, id, containerId })
  }
  const ours = [`${LABEL_MANAGED_BY}=${MANAGED_BY}`, `${LABEL_ID}=<id>`]
  // Named exactly as ours would be for a valid id, with no labels of ours.
  mk('named like ours, unlabelled', namespace, [])
  // Named like ours, with our labels, but another namespace's.
  mk('named like ours, labelled for another namespace', namespace, [...ours, `${LABEL_NAMESPACE}=${otherNamespace}`])
  // A sandbox of another namespace in every respect.
  mk('another namespace', otherNamespace, [...ours, `${LABEL_NAMESPACE}=${otherNamespace}`])
  // Ours in every label, but of a tenant (this provider has none).
  mk('ours but another tenant', namespace, [
    ...ours,
    `${LABEL_NAMESPACE}=${namespace}`,
    'trueforge.sandbox.tenant=someone-else',
  ])
  realId = (await provider.createSandbox()).sandboxId
  await ok(provider, realId, 'true')
  before = Object.fromEntries(canaries.map((c) => [c.name, snapshot(c.name)]))
}, 90_000)

afterAll(() => {
  provider.dispose()
  cleanupNamespace(namespace)
  cleanupNamespace(otherNamespace)
  const total = [...cases.values()].reduce((a, b) => a + b, 0)
  console.log(`fuzz cases run: ${total} ${JSON.stringify(Object.fromEntries(cases))}`)
})

// ---------------------------------------------------------------------------------------------
// Generators.

const ulidArb = fc
  .tuple(fc.constantFrom(...'01234567'), fc.array(fc.constantFrom(...CROCKFORD), { minLength: 25, maxLength: 25 }))
  .map(([a, rest]) => a + rest.join(''))

/** Ids that look nearly right but are not in the grammar (or anything at all). */
const nearMissId = fc.oneof(
  ulidArb.map((u) => `/workspace/${u.toLowerCase()}`),
  ulidArb.map((u) => `/workspace/${u.slice(1)}`),
  ulidArb.map((u) => `/workspace/${u}0`),
  ulidArb.map((u) => `/workspace/8${u.slice(1)}`),
  ulidArb.map((u) => `/workspace/Z${u.slice(1)}`),
  fc
    .tuple(
      ulidArb,
      fc.constantFrom('I', 'L', 'O', 'U', 'i', '-', '_', ' ', '\0', '\n', '/', '.', 'é', '０'),
      fc.nat(25),
    )
    .map(([u, c, i]) => `/workspace/${u.slice(0, i)}${c}${u.slice(i + 1)}`),
  fc
    .tuple(
      ulidArb,
      fc.constantFrom(
        'workspace/',
        '/workspace//',
        '//workspace/',
        '/workspace/./',
        '/workspace/../workspace/',
        ' /workspace/',
        '/WORKSPACE/',
        '\\workspace\\',
        '/tmp/',
        '/',
        '',
        '/workspace/x/../',
      ),
    )
    .map(([u, prefix]) => `${prefix}${u}`),
  fc
    .tuple(ulidArb, fc.constantFrom('/', '\n', '\0', ' ', '/.', '/..', '/x', '\r\n'))
    .map(([u, suffix]) => `/workspace/${u}${suffix}`),
  ulidArb.map((u) => `trueforge-${namespace}-${u.toLowerCase()}`),
  ulidArb.map((u) => `trueforge-${otherNamespace}-${u.toLowerCase()}`),
  fc.constantFrom('', '/workspace', '/workspace/', '..', '../etc', '/etc/passwd', 'default', '*', '%', '$(id)', '`id`'),
)

/** Names and ids of the canaries, as the fuzz might pass them. */
const canaryNameLike = fc.integer({ min: 0, max: 3 }).chain((i) =>
  fc.constantFrom(
    () => canaries[i].name,
    () => `/${canaries[i].name}`,
    () => canaries[i].containerId,
    () => canaries[i].containerId.slice(0, 12),
    () => canaries[i].id.toLowerCase(),
    () => `${canaries[i].id}/`,
    () => canaries[i].id.replace('/workspace/', ''),
  ),
)

const arbitraryString = fc.oneof(
  fc.string({ maxLength: 40 }),
  fc.string({ unit: 'binary', maxLength: 40 }),
  fc.string({ unit: 'grapheme', maxLength: 20 }),
)

const malformedId = fc
  .oneof(
    { weight: 3, arbitrary: nearMissId },
    { weight: 2, arbitrary: arbitraryString },
    { weight: 1, arbitrary: canaryNameLike.map((f) => f()) },
  )
  .filter((id) => !ID_GRAMMAR.test(id))

const segment = fc.oneof(
  { weight: 5, arbitrary: fc.stringMatching(/^[A-Za-z0-9_.-]{1,12}$/) },
  {
    weight: 2,
    arbitrary: fc.string({ unit: 'grapheme', minLength: 1, maxLength: 8 }).map((s) => s.replace(/\//g, '_')),
  },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      '..',
      '.',
      '',
      '...',
      '.. ',
      ' ..',
      'a..b',
      '..a',
      '~',
      '$HOME',
      '*',
      ' ',
      '\ud800',
      '🎉',
      'ü',
      'x'.repeat(255),
      'y'.repeat(256),
    ),
  },
)

/** Paths: relative and absolute, `..`, NUL, very long, unicode, kernel trees. */
const pathArb = fc.oneof(
  { weight: 6, arbitrary: fc.array(segment, { minLength: 1, maxLength: 5 }).map((s) => s.join('/')) },
  {
    weight: 3,
    arbitrary: fc
      .tuple(
        fc.constantFrom(
          '/',
          '/tmp/',
          '/workspace/',
          '/trueforge/',
          '/trueforge/uploads/',
          '/etc/',
          '/dev/',
          '/proc/',
          '/sys/',
          '/proc/self/',
          '/dev/shm/',
        ),
        fc.array(segment, { maxLength: 3 }),
      )
      .map(([p, s]) => p + s.join('/')),
  },
  {
    weight: 1,
    arbitrary: fc.tuple(segment, fc.constantFrom('\0', '/\0', '\0/x'), segment).map(([a, n, b]) => a + n + b),
  },
  {
    weight: 1,
    arbitrary: fc
      .tuple(segment, fc.integer({ min: 4000, max: 4200 }))
      .map(([s, n]) => (s + '/').repeat(Math.ceil(n / (s.length + 1))).slice(0, n)),
  },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      '',
      '/',
      '.',
      './',
      'dir/',
      '/.',
      '..',
      '../..',
      '/..',
      'a/../b',
      '/dev/null',
      '/dev/zero',
      '/dev/random',
      '/proc/self/environ',
      '/proc/1/mem',
      '/proc/kcore',
      '/sys/kernel',
      '/etc/shadow',
      '/etc/hostname',
    ),
  },
  { weight: 2, arbitrary: arbitraryString },
)

const envName = fc.oneof(
  { weight: 4, arbitrary: fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_]{0,10}$/) },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      'TRUEFORGE_EXEC_ID',
      'A=B',
      '=',
      '',
      '1A',
      'A-B',
      'A B',
      'A\0',
      'É',
      'PATH',
      'LD_PRELOAD',
      'BASH_ENV',
      'ENV',
      'IFS',
      'A'.repeat(1025),
    ),
  },
  { weight: 1, arbitrary: fc.string({ maxLength: 8 }) },
)
const envValue = fc.oneof(
  fc.string({ maxLength: 20 }),
  fc.constantFrom('', '=', 'a=b', 'a\0b', '\0', '\n', '$(id)', '\ud800', '🎉'.repeat(10)),
)
const envArb = fc.option(fc.dictionary(envName, envValue, { maxKeys: 4 }), { nil: undefined })

const commandArb = fc.oneof(
  { weight: 4, arbitrary: arbitraryString },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      '',
      ' ',
      ';',
      '&&',
      '|',
      '$(',
      '`',
      '"',
      "'",
      '\\',
      '\0',
      'exit 3',
      'echo $TRUEFORGE_EXEC_ID',
      'cat /proc/self/status',
      "printf '\\036TFX'",
      'true & false',
      'echo x >&2',
    ),
  },
)

const cwdArb = fc.option(fc.oneof(pathArb, fc.constantFrom('', '/', '..', '/proc', '/dev', '\0')), { nil: undefined })
const timeoutArb = fc.option(
  fc.constantFrom(3, 0.5, 0, -1, Number.NaN, Number.POSITIVE_INFINITY, 1e12, 7 * 86400 + 1),
  { nil: undefined },
)
const contentArb = fc.oneof(
  { weight: 5, arbitrary: fc.uint8Array({ maxLength: 64 }) },
  {
    weight: 1,
    arbitrary: fc.integer({ min: FILE_MAX - 2, max: FILE_MAX + 2 }).map((n) => new Uint8Array(n).fill(0x61)),
  },
)

// ---------------------------------------------------------------------------------------------
// Oracles: what the documented rules say each call must do before it reaches any sandbox.

const bytes = (s: string) => Buffer.byteLength(s, 'utf8')
/** The README's path limit: PATH_MAX less room for the engine's own prefix on the host. */
const MAX_PATH = 3800

/** The path refusal the README documents for `path` (null: the path is acceptable). */
function pathRefusal(sandboxId: string, path: string, forUpload: boolean): string | null {
  // A lone UTF-16 surrogate would reach the sandbox as U+FFFD, naming another file.
  if (/\p{Cs}/u.test(path)) return 'INVALID_PATH'
  if (path === '' || path.includes('\0') || bytes(path) > MAX_PATH) return 'INVALID_PATH'
  if (path.split('/').includes('..')) return 'PATH_TRAVERSAL'
  const full = path.startsWith('/') ? path : `${sandboxId}/${path}`
  const segs = full.split('/').filter((s) => s !== '' && s !== '.')
  if (segs.some((s) => bytes(s) > 255)) return 'INVALID_PATH'
  const resolved = `/${segs.join('/')}`
  if (bytes(resolved) > MAX_PATH) return 'INVALID_PATH'
  if (forUpload && (resolved === '/' || path.endsWith('/') || path.endsWith('/.'))) return 'PATH_IS_DIRECTORY'
  // A file written under a kernel tree would be hidden by the kernel's mount: refused.
  if (forUpload && /^\/(dev|proc|sys)(\/|$)/.test(resolved)) return 'INVALID_PATH'
  return null
}

/** Why exec must return `{ success: false }` without running (null: the parameters are fine). */
function execRefusal(p: {
  command?: string
  cwd?: string
  env?: Record<string, string>
  timeoutSeconds?: number
}): string | null {
  const t = p.timeoutSeconds
  if (t !== undefined && !(Number.isFinite(t) && t > 0 && t <= 7 * 86400)) return 'timeoutSeconds'
  // A command the kernel could never start: a NUL byte, or over one argument's limit.
  if (p.command !== undefined && (p.command.includes('\0') || bytes(p.command) >= 128 * 1024)) return 'command'
  for (const [k, v] of Object.entries(p.env ?? {})) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k) || bytes(k) > 1024) return `env name ${JSON.stringify(k)}`
    if (k === 'TRUEFORGE_EXEC_ID') return 'reserved env name'
    if (v.includes('\0')) return 'env value with NUL'
  }
  if (p.cwd !== undefined && (p.cwd.includes('\0') || bytes(p.cwd) > MAX_PATH)) return 'cwd'
  return null
}

/** Asserts `e` is one of the typed errors; returns its code. */
function typedCode(e: any, context: unknown): string {
  if (e instanceof SandboxError) {
    const code = (e as any).code
    if (typeof code !== 'string' || !DOCUMENTED_CODES.has(code) || e.constructor === SandboxError) {
      throw new Error(
        `untyped SandboxError ${e.constructor?.name} code=${code}: ${e.message} for ${JSON.stringify(context)}`,
      )
    }
    return code
  }
  if (e instanceof TypeError && ['INVALID_ARGUMENT', 'INVALID_OPTION'].includes((e as any).code)) return (e as any).code
  throw new Error(
    `not a typed error: ${e?.constructor?.name} ${JSON.stringify(e?.code)} ${e?.message} for ${JSON.stringify(context)}`,
  )
}

async function outcome<T>(p: Promise<T>): Promise<{ ok: true; value: T } | { ok: false; error: any }> {
  try {
    return { ok: true, value: await p }
  } catch (error) {
    return { ok: false, error }
  }
}

/** Runs the four id-taking calls for an id that names no sandbox of ours and checks each outcome. */
async function probeForeignId(
  p: Provider,
  id: string,
  path: string,
  content: Uint8Array,
  command: string,
  cwd: string | undefined,
  env: Record<string, string> | undefined,
  timeoutSeconds: number | undefined,
) {
  const ctx = short({ id, path, command, cwd, env, timeoutSeconds })
  // exec: a refusal of the parameters, else SandboxNotAvailableError; it never runs.
  count('exec')
  const ex = await outcome(p.exec({ sandboxId: id, command, cwd, env, timeoutSeconds }))
  const refusal = execRefusal({ command, cwd, env, timeoutSeconds })
  if (ex.ok) {
    expect({ ctx, result: ex.value }).toEqual({ ctx, result: { success: false, error: expect.any(String) } })
    expect({ ctx, refusal }).toEqual({ ctx, refusal: expect.any(String) })
  } else {
    expect({ ctx, code: typedCode(ex.error, ctx), refusal }).toEqual({
      ctx,
      code: 'SANDBOX_NOT_AVAILABLE',
      refusal: null,
    })
    expect(ex.error).toBeInstanceOf(SandboxNotAvailableError)
    expect(ex.error.sandboxId).toBe(id)
  }
  // An id outside the grammar is refused before anything else is looked at.
  const wellFormed = /^\/workspace\/[0-7][0-9A-HJKMNP-TV-Z]{25}$/.test(id)
  // upload: the path's refusal, the size's, else SandboxNotAvailableError.
  count('uploadFile')
  const up = await outcome(p.uploadFile({ sandboxId: id, remotePath: path, content: Buffer.from(content) }))
  const upWant = !wellFormed
    ? 'SANDBOX_NOT_AVAILABLE'
    : (pathRefusal(id, path, true) ?? (content.length > FILE_MAX ? 'FILE_TOO_LARGE' : 'SANDBOX_NOT_AVAILABLE'))
  expect({ ctx, upload: up.ok ? 'resolved' : typedCode(up.error, ctx) }).toEqual({ ctx, upload: upWant })
  // download: the path's refusal, else SandboxNotAvailableError.
  count('downloadFile')
  const down = await outcome(p.downloadFile({ sandboxId: id, path }))
  const downWant = !wellFormed ? 'SANDBOX_NOT_AVAILABLE' : (pathRefusal(id, path, false) ?? 'SANDBOX_NOT_AVAILABLE')
  expect({ ctx, download: down.ok ? 'resolved' : typedCode(down.error, ctx) }).toEqual({ ctx, download: downWant })
  if (!down.ok && downWant === 'SANDBOX_NOT_AVAILABLE') expect(down.error.sandboxId).toBe(id)
  // removeSandbox: nothing of ours to remove.
  count('removeSandbox')
  expect({ ctx, removed: await p.removeSandbox(id) }).toEqual({ ctx, removed: false })
}

// ---------------------------------------------------------------------------------------------
// Properties.

test('malformed ids: every call is a typed refusal before any engine request (thousands of cases)', async () => {
  await fc.assert(
    fc.asyncProperty(
      malformedId,
      pathArb,
      contentArb,
      commandArb,
      cwdArb,
      envArb,
      timeoutArb,
      async (id, path, content, command, cwd, env, t) => {
        await probeForeignId(provider, id, path, content, command, cwd, env, t)
      },
    ),
    { numRuns: 4000, interruptAfterTimeLimit: 15_000, markInterruptAsFailure: false },
  )
}, 60_000)

test('valid-looking ids of canaries and of nobody: SandboxNotAvailableError, never touched', async () => {
  const ids = fc.oneof(
    fc.constantFrom(...canaries.map((c) => c.id)),
    ulidArb.map((u) => `/workspace/${u}`),
  )
  await fc.assert(
    fc.asyncProperty(
      ids,
      pathArb,
      contentArb,
      commandArb,
      cwdArb,
      envArb,
      timeoutArb,
      async (id, path, content, command, cwd, env, t) => {
        await probeForeignId(provider, id, path, content, command, cwd, env, t)
      },
    ),
    { numRuns: 400, interruptAfterTimeLimit: 15_000, markInterruptAsFailure: false },
  )
  // A provider of the other namespace and one with a tenant see the same about ours.
  const tenantProvider = new DockerSandboxProvider({
    image: BUSYBOX,
    namespace,
    network: 'none',
    fileMaxBytes: FILE_MAX,
    uploadMaxBytes: FILE_MAX,
    tenantName: 'fuzz-tenant',
  })
  try {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(realId, ...canaries.map((c) => c.id)),
        pathArb,
        contentArb,
        commandArb,
        async (id, path, content, command) => {
          await probeForeignId(tenantProvider, id, path, content, command, undefined, undefined, 3)
        },
      ),
      { numRuns: 60 },
    )
  } finally {
    tenantProvider.dispose()
  }
}, 90_000)

test('our own sandbox: arbitrary commands, paths, env and cwd give results or typed errors', async () => {
  const resolvedOf = (path: string) =>
    `/${(path.startsWith('/') ? path : `${realId}/${path}`)
      .split('/')
      .filter((x) => x !== '' && x !== '.')
      .join('/')}`
  // Round trips are checked where the engine can stat the file (see the long-path test below).
  const noRoundTrip = (path: string) =>
    /^\/(dev|proc|sys)(\/|$)/.test(resolvedOf(path)) || bytes(resolvedOf(path)) > 3900
  await fc.assert(
    fc.asyncProperty(commandArb, cwdArb, envArb, pathArb, contentArb, async (command, cwd, env, path, content) => {
      const ctx = short({ command, cwd, env, path })
      // exec with a short timeout: it ran (any exit code) or its parameters were refused.
      count('exec')
      const ex = await outcome(provider.exec({ sandboxId: realId, command, cwd, env, timeoutSeconds: 3 }))
      if (!ex.ok) throw new Error(`exec threw ${ex.error?.name} ${ex.error?.message} for ${JSON.stringify(ctx)}`)
      const refusal = execRefusal({ cwd, env, timeoutSeconds: 3 })
      if (refusal) {
        expect({ ctx, r: ex.value }).toEqual({ ctx, r: { success: false, error: expect.any(String) } })
      } else if (ex.value.success) {
        expect(Number.isInteger(ex.value.response.exitCode)).toBe(true)
        expect(typeof ex.value.response.result).toBe('string')
      } else {
        // Only a command the kernel cannot take may fail to run (see the dedicated test below).
        expect({ ctx, error: ex.value.error }).toEqual({ ctx, error: expect.any(String) })
        expect(command.includes('\0')).toBe(true)
      }
      // upload: resolves (and the same bytes come back) or a typed refusal.
      count('uploadFile')
      const buf = Buffer.from(content)
      const up = await outcome(provider.uploadFile({ sandboxId: realId, remotePath: path, content: buf }))
      const want = pathRefusal(realId, path, true) ?? (buf.length > FILE_MAX ? 'FILE_TOO_LARGE' : null)
      if (want) expect({ ctx, upload: up.ok ? 'resolved' : typedCode(up.error, ctx) }).toEqual({ ctx, upload: want })
      else if (!up.ok)
        expect({ ctx, code: typedCode(up.error, ctx) }).not.toEqual({ ctx, code: 'SANDBOX_NOT_AVAILABLE' })
      // download of the same path.
      count('downloadFile')
      const down = await outcome(provider.downloadFile({ sandboxId: realId, path }))
      if (down.ok) {
        expect(Buffer.isBuffer(down.value)).toBe(true)
        if (up.ok && !noRoundTrip(path)) expect({ ctx, same: down.value.equals(buf) }).toEqual({ ctx, same: true })
      } else {
        const code = typedCode(down.error, ctx)
        expect({ ctx, code }).not.toEqual({ ctx, code: 'SANDBOX_NOT_AVAILABLE' })
        const refused = pathRefusal(realId, path, false)
        if (refused) expect({ ctx, code }).toEqual({ ctx, code: refused })
        else if (up.ok && !noRoundTrip(path)) {
          throw new Error(
            `uploaded ${JSON.stringify(short(path))} but its download failed: ${code} ${short(down.error.message)}`,
          )
        }
      }
    }),
    { numRuns: 180, interruptAfterTimeLimit: 35_000, markInterruptAsFailure: false },
  )
  // Still a working sandbox afterwards.
  expect(await ok(provider, realId, 'echo alive; pwd')).toBe(`alive\n${realId}\n`)
}, 120_000)

test('non-object and non-string arguments: exec says success: false, the others throw TypeError', async () => {
  const junk = fc.oneof(
    fc.constantFrom(undefined, null, 0, 1, NaN, true, [], {}, () => 1, Symbol('s'), 10n, new Date(0)),
    fc.anything(),
  )
  await fc.assert(
    fc.asyncProperty(junk, async (v) => {
      count('exec')
      const r = await provider.exec(v as any)
      expect(r).toEqual({ success: false, error: expect.any(String) })
      for (const params of [
        { sandboxId: v, command: 'true' },
        { sandboxId: realId, command: v },
      ]) {
        if (typeof v === 'string') continue
        count('exec')
        expect(await provider.exec(params as any)).toEqual({ success: false, error: expect.any(String) })
      }
      if (typeof v !== 'string') {
        const calls: Array<() => Promise<unknown>> = [
          () => provider.downloadFile({ sandboxId: v, path: 'x' } as any),
          () => provider.downloadFile({ sandboxId: realId, path: v } as any),
          () => provider.uploadFile({ sandboxId: v, remotePath: 'x', content: Buffer.from('x') } as any),
          () => provider.uploadFile({ sandboxId: realId, remotePath: v, content: Buffer.from('x') } as any),
          () => provider.removeSandbox(v as any),
        ]
        for (const call of calls) {
          count('typecheck')
          const e = await outcome(call())
          expect(e.ok).toBe(false)
          if (!e.ok) expect(e.error).toBeInstanceOf(TypeError)
        }
      }
      if (!(v instanceof Uint8Array)) {
        count('typecheck')
        const e = await outcome(provider.uploadFile({ sandboxId: realId, remotePath: 'x', content: v } as any))
        expect(e.ok).toBe(false)
        if (!e.ok) expect(e.error).toBeInstanceOf(TypeError)
      }
    }),
    { numRuns: 300 },
  )
})

test('README: a bad call argument is a TypeError with code INVALID_ARGUMENT', async () => {
  const calls: Array<[string, () => Promise<unknown>]> = [
    ['downloadFile({ sandboxId: 5 })', () => provider.downloadFile({ sandboxId: 5, path: 'x' } as any)],
    ['downloadFile({ path: null })', () => provider.downloadFile({ sandboxId: realId, path: null } as any)],
    [
      'uploadFile({ remotePath: 1 })',
      () => provider.uploadFile({ sandboxId: realId, remotePath: 1, content: Buffer.from('x') } as any),
    ],
    [
      "uploadFile({ content: 'text' })",
      () => provider.uploadFile({ sandboxId: realId, remotePath: 'x', content: 'text' } as any),
    ],
    ['removeSandbox(undefined)', () => provider.removeSandbox(undefined as any)],
  ]
  const got = []
  for (const [label, call] of calls) {
    count('typecheck')
    const e = await outcome(call())
    got.push({ label, type: e.ok ? 'resolved' : e.error?.constructor?.name, code: e.ok ? undefined : e.error?.code })
  }
  expect(got).toEqual(calls.map(([label]) => ({ label, type: 'TypeError', code: 'INVALID_ARGUMENT' })))
})

test('a command that cannot be started (NUL byte, over the kernel argument limit) is success: false', async () => {
  // ExecResult: success true means the command ran; a command the kernel refused never did.
  const results = []
  for (const [label, command] of [
    ['NUL byte', 'echo a\0b'],
    ['200 KiB command', `echo ${'x'.repeat(200 * 1024)} | wc -c`],
  ] as const) {
    count('exec')
    const r = await provider.exec({ sandboxId: realId, command })
    results.push({ label, success: r.success, detail: r.success ? r.response : r.error })
  }
  expect(results).toEqual([
    { label: 'NUL byte', success: false, detail: expect.any(String) },
    { label: '200 KiB command', success: false, detail: expect.any(String) },
  ])
})

test('an upload either lands where the sandbox reads it or is refused (kernel trees: /dev, /proc, /sys)', async () => {
  const got = []
  for (const path of ['/dev/fuzz-up', '/dev/shm/fuzz-up', '/proc/fuzz-up', '/sys/fuzz-up']) {
    count('uploadFile')
    const up = await outcome(
      provider.uploadFile({ sandboxId: realId, remotePath: path, content: Buffer.from('landed') }),
    )
    if (!up.ok) {
      got.push({ path, outcome: `refused ${typedCode(up.error, path)}` })
      continue
    }
    count('exec')
    const seen = await provider.exec({ sandboxId: realId, command: `cat ${path}` })
    got.push({
      path,
      outcome: seen.success && seen.response.result === 'landed' ? 'readable' : 'resolved but not in the sandbox',
    })
  }
  expect(got.filter((g) => !/^(readable|refused [A-Z_]+)$/.test(g.outcome))).toEqual([])
})

test('a file uploaded at a long path within the documented 3800-byte limit downloads back', async () => {
  // 3790 bytes resolved: under the README's limit; the upload and the sandbox's own `cat` work.
  const rel = `${'d'.repeat(99)}/`.repeat(41).slice(0, 3790 - realId.length - 1 - 2) + '/f'
  const full = `${realId}/${rel}`
  expect(bytes(full)).toBe(3790)
  count('uploadFile')
  await provider.uploadFile({ sandboxId: realId, remotePath: rel, content: Buffer.from('long') })
  expect(await ok(provider, realId, 'cat "$F"', { env: { F: full } })).toBe('long')
  count('downloadFile')
  const down = await outcome(provider.downloadFile({ sandboxId: realId, path: rel }))
  expect(down.ok ? down.value.toString() : `${down.error.code}: ${short(down.error.message)}`).toBe('long')
})

// ---------------------------------------------------------------------------------------------
// Constructor options.

const junkValue: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', maxDepth: 3 },
    fc.constant(null),
    fc.boolean(),
    fc.integer(),
    fc.double({ noNaN: true, noDefaultInfinity: true }),
    fc.bigInt({ min: -(2n ** 70n), max: 2n ** 70n }),
    arbitraryString,
    fc.array(tie('value'), { maxLength: 4 }),
    fc.dictionary(arbitraryString, tie('value'), { maxKeys: 4 }),
  ),
})).value

const ALLOWED_CAPS = [
  'AUDIT_WRITE',
  'CHOWN',
  'DAC_OVERRIDE',
  'FOWNER',
  'FSETID',
  'KILL',
  'MKNOD',
  'NET_BIND_SERVICE',
  'NET_RAW',
  'SETFCAP',
  'SETGID',
  'SETPCAP',
  'SETUID',
  'SYS_CHROOT',
]
const FORBIDDEN_CAPS = [
  'SYS_ADMIN',
  'SYS_MODULE',
  'SYS_PTRACE',
  'SYS_RAWIO',
  'SYS_BOOT',
  'NET_ADMIN',
  'DAC_READ_SEARCH',
  'SYS_TIME',
  'MAC_ADMIN',
]
const capName = fc.oneof(
  fc.constantFrom(
    'CHOWN',
    'KILL',
    'NET_RAW',
    'MKNOD',
    'SYSLOG',
    'BPF',
    'BOGUS',
    'ALL',
    'all',
    '',
    ' CHOWN',
    ...FORBIDDEN_CAPS,
  ),
  fc
    .constantFrom(...FORBIDDEN_CAPS)
    .chain((c) => fc.constantFrom(c.toLowerCase(), `CAP_${c}`, `cap_${c.toLowerCase()}`, `Cap_${c}`)),
  arbitraryString,
)
const optionValues: Record<string, fc.Arbitrary<unknown>> = {
  image: fc.constantFrom(
    BUSYBOX,
    'python:3.12',
    'a',
    '',
    ' x',
    'a b',
    '-x',
    'x'.repeat(600),
    'reg.example:5000/a/b@sha256:00',
  ),
  dockerHost: fc.constantFrom(
    'unix:///var/run/docker.sock',
    'unix://rel',
    'tcp://127.0.0.1:1',
    'http://h:1',
    'ssh://h',
    'tcp://',
    '',
    'npipe:////./pipe/docker',
  ),
  namespace: fc.oneof(
    fc.stringMatching(/^[a-z0-9-]{0,34}$/),
    fc.constantFrom('default', 'A', '-a', namespace, otherNamespace),
  ),
  execTimeoutMs: fc.oneof(fc.integer(), fc.constantFrom(0, 1, 1.5, 60000, 7 * 24 * 3600 * 1000 + 1, -0)),
  fileMaxBytes: fc.oneof(fc.integer(), fc.constantFrom(1, 2 ** 30, 2 ** 30 + 1, 2 ** 53)),
  maxOutputBytes: fc.oneof(fc.integer(), fc.constantFrom(1023, 1024)),
  gpus: fc.oneof(fc.constantFrom('all', 'some', 0, 1, 64, 65, [], ['0'], ['0;rm -rf /'], ['GPU-abc'])),
  env: fc.dictionary(envName, envValue, { maxKeys: 3 }),
  labels: fc.dictionary(
    fc.oneof(arbitraryString, fc.constantFrom('trueforge.sandbox.id', 'trueforge.sandbox.namespace', 'team', '')),
    arbitraryString,
    { maxKeys: 3 },
  ),
  autoStopIntervalInMinutes: fc.oneof(
    fc.double({ noNaN: true, noDefaultInfinity: true }),
    fc.constantFrom(0, 0.05, -1, 5_256_001),
  ),
  autoDeleteIntervalInMinutes: fc.oneof(fc.double({ noNaN: true, noDefaultInfinity: true }), fc.constantFrom(0, 7200)),
  capabilities: fc.array(capName, { maxLength: 3 }),
  noNewPrivileges: fc.constantFrom(true, false, 'true', 0),
  resources: fc.record(
    {
      memoryBytes: fc.oneof(
        fc.constant(null),
        fc.integer(),
        fc.constantFrom(6 << 20, (6 << 20) - 1, 2 ** 44, 2 ** 44 + 1),
      ),
      nanoCpus: fc.oneof(fc.constant(null), fc.integer(), fc.constantFrom(10_000_000, 9_999_999)),
      pidsLimit: fc.oneof(fc.constant(null), fc.integer(), fc.constantFrom(15, 16, 64, 4_194_305)),
      swap: fc.integer(),
    },
    { requiredKeys: [] },
  ),
  network: fc.oneof(
    fc.constantFrom('bridge', 'none', 'host', 'container:x', 'container:', 'HOST', 'my-net', '', 'a b', 'default'),
    arbitraryString,
  ),
  user: fc.oneof(
    fc.constantFrom('1000', '1000:1000', 'nobody', 'root', '0:0', 'a:b:c', 'a;b', '', ':'),
    arbitraryString,
  ),
  readOnlyRootfs: fc.constantFrom(true, false, 1, 'yes'),
  runtime: fc.oneof(fc.constantFrom('runsc', 'runc', 'kata-runtime', '', '../x', 'a b'), arbitraryString),
  tenantName: fc.oneof(fc.constantFrom('acme', '', 'a\nb', 'a\0b', 'x'.repeat(128), 'x'.repeat(129)), arbitraryString),
  build: fc.oneof(
    fc.constant({}),
    fc.record(
      {
        context: fc.constantFrom('/nonexistent', '', '.'),
        dockerfile: fc.constantFrom('Dockerfile', '../D', '/abs', ''),
        args: fc.dictionary(arbitraryString, arbitraryString, { maxKeys: 2 }),
      },
      { requiredKeys: [] },
    ),
  ),
  registryAuth: fc.dictionary(
    arbitraryString,
    fc.oneof(
      fc.record({ username: arbitraryString, password: arbitraryString }),
      fc.record({ identityToken: arbitraryString }),
      junkValue,
    ),
    { maxKeys: 2 },
  ),
  engineTimeoutMs: fc.oneof(fc.integer(), fc.constantFrom(1, 600_000, 600_001)),
  codeModeSandboxInflightBytes: fc.oneof(fc.integer(), fc.constantFrom(65_535, 65_536, 2 ** 30, 2 ** 30 + 1)),
  codeModeProviderInflightBytes: fc.oneof(fc.integer(), fc.constantFrom(65_535, 2 ** 34, 2 ** 34 + 1)),
  warmPool: fc.oneof(fc.record({ size: fc.oneof(fc.integer({ min: -2, max: 70 }), fc.constant(2.5)) }), junkValue),
  errors: fc.oneof(
    fc.constant({}),
    fc.constant({ SandboxNotAvailableError: class extends Error {} }),
    fc.constant({ Unknown: class extends Error {} }),
    fc.constant({ SandboxFileNotFoundError: 5 }),
  ),
  logger: fc.oneof(fc.constant({}), fc.constant({ info: () => undefined }), fc.constant({ info: 3 }), fc.constant(5)),
}

const optionsArb = fc.oneof(
  {
    weight: 6,
    arbitrary: fc
      .tuple(
        fc.record(
          Object.fromEntries(
            Object.entries(optionValues).map(([k, v]) => [
              k,
              fc.oneof({ weight: 3, arbitrary: v }, { weight: 1, arbitrary: junkValue }),
            ]),
          ),
          { requiredKeys: [] },
        ),
        fc.dictionary(
          fc.oneof(arbitraryString, fc.constantFrom('imgae', 'Image', 'tenant', 'privileged', 'binds')),
          junkValue,
          { maxKeys: 1 },
        ),
        fc.boolean(),
        fc.boolean(),
      )
      .map(([known, unknown, withImage, withUnknown]) => ({
        ...(withImage ? { image: BUSYBOX } : {}),
        ...known,
        ...(withUnknown ? unknown : {}),
      })),
  },
  { weight: 1, arbitrary: junkValue },
)

test('constructor options: constructs, or throws TypeError INVALID_OPTION; escape hatches never construct', () => {
  fc.assert(
    fc.property(optionsArb, (options) => {
      count('constructor')
      let p: Provider | undefined
      try {
        p = new DockerSandboxProvider(options as any)
      } catch (e: any) {
        expect({ options, type: e?.constructor?.name, code: e?.code }).toEqual({
          options,
          type: 'TypeError',
          code: 'INVALID_OPTION',
        })
        expect(typeof e.option).toBe('string')
        expect(e.message.startsWith('invalid option `')).toBe(true)
        return
      }
      try {
        expect(p.type).toBe('docker')
        expect(p.namespace).toMatch(/^[a-z0-9-]{1,32}$/)
        const o = options as Record<string, any>
        // Documented refusals must never construct.
        expect({ options, network: o.network === 'host' || String(o.network ?? '').startsWith('container:') }).toEqual({
          options,
          network: false,
        })
        const caps: unknown[] = Array.isArray(o.capabilities) ? o.capabilities : []
        // Only Docker's default set may be kept (docs/security.md).
        const escalating = caps.filter(
          (c) => typeof c === 'string' && !ALLOWED_CAPS.includes(c.toUpperCase().replace(/^CAP_/, '')),
        )
        expect({ options, escalating }).toEqual({ options, escalating: [] })
        expect(o.labels && Object.keys(o.labels).some((k) => k.startsWith('trueforge.sandbox.'))).toBeFalsy()
      } finally {
        p.dispose()
      }
    }),
    { numRuns: 3000 },
  )
}, 60_000)

test.each([
  ['execTimeoutMs: NaN', { execTimeoutMs: Number.NaN }],
  ['execTimeoutMs: Infinity', { execTimeoutMs: Number.POSITIVE_INFINITY }],
  ['resources.memoryBytes: -Infinity', { resources: { memoryBytes: Number.NEGATIVE_INFINITY } }],
  ['autoStopIntervalInMinutes: NaN', { autoStopIntervalInMinutes: Number.NaN }],
  ['capabilities: [undefined]', { capabilities: [undefined] }],
  ['capabilities: [, "CHOWN"] (a hole)', { capabilities: [, 'CHOWN'] }], // eslint-disable-line no-sparse-arrays
  ['labels: { a: Symbol() }', { labels: { a: Symbol('a') } }],
  ['env: { A: function }', { env: { A: () => 'x' } }],
])('constructor option %s (not representable as JSON) throws TypeError INVALID_OPTION', (_label, extra) => {
  count('constructor')
  let e: any
  try {
    new DockerSandboxProvider({ image: BUSYBOX, namespace, ...(extra as any) }).dispose()
  } catch (err) {
    e = err
  }
  expect({ type: e?.constructor?.name, code: e?.code }).toEqual({ type: 'TypeError', code: 'INVALID_OPTION' })
})

// ---------------------------------------------------------------------------------------------
// Last: the canaries were never touched.

test("the canaries were never started, stopped, exec'd into, written to or removed", () => {
  expect(canaries).toHaveLength(4)
  for (const c of canaries) {
    const now = snapshot(c.name)
    expect({ canary: c.label, ...now }).toEqual({ canary: c.label, ...before[c.name] })
    expect({ canary: c.label, running: (now as any).running, execIds: (now as any).execIds }).toEqual({
      canary: c.label,
      running: true,
      execIds: [],
    })
    expect(docker(['inspect', '-f', '{{len .ExecIDs}}', c.name])).toBe('0')
    // Nothing written into them either.
    const diff = dockerTry(['diff', c.name]).stdout
    expect({
      canary: c.label,
      diff: diff.split('\n').filter((l) => /workspace|trueforge|fuzz|intruder/.test(l)),
    }).toEqual({ canary: c.label, diff: [] })
  }
  // Our own sandbox is still ours and alive; its container name is what the helpers derive.
  expect(inspectContainer(containerNameFor(namespace, realId))?.State.Running).toBe(true)
})
