// Options and arguments that cannot work are refused at once (issue 20, item 7): an engine
// address with a bad port, no port, a NUL byte or an unbalanced bracket; an image whose
// repository has upper case; a uid out of Linux's range; a build context that is not a readable
// directory; an upload or download path holding a lone UTF-16 surrogate (which would reach the
// sandbox as U+FFFD, naming another file). Each names the option (or is the path error) and the
// rule; what is valid next to each still works.

import { DockerSandboxProvider, SandboxError, SandboxInvalidPathError, SandboxNotAvailableError } from '..'
import { BUSYBOX, ok, rejection, SandboxTracker, uniqueNamespace } from './helpers'

const namespace = uniqueNamespace('t-optrules')
const sandboxes = new SandboxTracker(namespace)
const p = new DockerSandboxProvider({ image: BUSYBOX, namespace })

afterAll(async () => {
  await sandboxes.cleanup(p)
  p.dispose()
})

/** What the constructor throws for these options; null when it constructs. */
function refusal(options: Record<string, unknown>): any {
  try {
    new DockerSandboxProvider({ image: BUSYBOX, namespace, ...options } as any).dispose()
  } catch (e) {
    return e
  }
  return null
}

test.each([
  ['dockerHost', 'tcp://h:99999', /"tcp:\/\/h:99999": port "99999" is not a number from 1 to 65535/],
  ['dockerHost', 'tcp://host', /"tcp:\/\/host": no port; give one, as tcp:\/\/host:2375/],
  ['dockerHost', 'unix:///var/run/docker.sock\0', /contains a NUL byte/],
  ['dockerHost', 'tcp://[::1', /the IPv6 address has no closing bracket/],
  ['image', 'UPPER:tag', /"UPPER:tag": the repository "UPPER" must be lowercase/],
  ['image', 'localhost:5000/Team/app', /the repository "Team\/app" must be lowercase/],
  ['user', '4294967295', /uid 4294967295 is out of range: Linux ids go from 0 to 4294967294/],
  ['user', '1000:4294967295', /gid 4294967295 is out of range/],
])('%s %j is refused at construction, naming the option and the rule', (option, value, rule) => {
  const e = refusal({ [option]: value })
  expect(e).toBeInstanceOf(TypeError)
  expect({ code: e.code, option: e.option }).toEqual({ code: 'INVALID_OPTION', option })
  expect(e.message).toMatch(rule)
})

test('a build context that is not a readable directory is refused at construction', () => {
  for (const [context, rule] of [
    ['/nonexistent', /\/nonexistent: not a readable directory \(No such file or directory/],
    ['/etc/hostname', /\/etc\/hostname: not a directory/],
  ] as const) {
    const e = refusal({ image: 'unused-when-building:1', build: { context } })
    expect({ context, type: e?.constructor?.name, code: e?.code, option: e?.option }).toEqual({
      context,
      type: 'TypeError',
      code: 'INVALID_OPTION',
      option: 'build.context',
    })
    expect(e.message).toMatch(rule)
  }
})

test('what is valid beside each rule still constructs', () => {
  for (const options of [
    { dockerHost: 'tcp://127.0.0.1:65535' },
    { dockerHost: 'tcp://[::1]:2375' },
    { image: 'localhost:5000/team/app:Tag_1' },
    { image: `reg.example:5000/a/b@sha256:${'0123456789abcdef'.repeat(4)}` },
    { image: 'Registry/app' },
    { user: '4294967294:4294967294' },
    { image: 'unused-when-building:1', build: { context: __dirname } },
  ]) {
    expect({ options, refused: refusal(options)?.message ?? null }).toEqual({ options, refused: null })
  }
})

describe('paths with a lone UTF-16 surrogate', () => {
  let id: string
  beforeAll(async () => {
    id = await sandboxes.create(p)
  }, 60_000)

  test.each([
    ['a lone high half', '/trueforge/uploads/a\uD800b.txt'],
    ['a lone low half', '/trueforge/uploads/\uDC00.txt'],
    ['halves in the wrong order', 'sub/\uDE00\uD83D.txt'],
  ])('upload with %s is the path error at once, and writes nothing', async (_l, remotePath) => {
    const e = await rejection(p.uploadFile({ sandboxId: id, remotePath, content: Buffer.from('x') }))
    expect(e).toBeInstanceOf(SandboxInvalidPathError)
    expect({ statusCode: e.statusCode, code: e.code, path: e.path }).toEqual({
      statusCode: 400,
      code: 'INVALID_PATH',
      path: remotePath,
    })
    expect(e.message).toContain('lone UTF-16 surrogate')
    // Not stored under U+FFFD (the replacement character) or any other name.
    expect(await ok(p, id, 'ls -A /trueforge/uploads; ls -A sub 2>/dev/null; echo end')).toBe('end\n')
  })

  test('a download with one is the path error too, and so is an upload to a sandbox that does not exist (no engine call first)', async () => {
    const e = await rejection(p.downloadFile({ sandboxId: id, path: '/etc/\uD800passwd' }))
    expect(e).toBeInstanceOf(SandboxInvalidPathError)
    expect(e.path).toBe('/etc/\uD800passwd')
    // Refused before any engine call: no lookup of the (missing) sandbox happens.
    const gone = await rejection(
      p.uploadFile({
        sandboxId: '/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV',
        remotePath: '\uDBFF',
        content: Buffer.from(''),
      }),
    )
    expect(gone).toBeInstanceOf(SandboxInvalidPathError)
    // As for every call, an id outside the grammar is refused first.
    const bad = await rejection(p.downloadFile({ sandboxId: 'not-an-id', path: '\uD800' }))
    expect(bad).toBeInstanceOf(SandboxNotAvailableError)
    expect(bad.sandboxId).toBe('not-an-id')
  })

  test('with the host base class given, the error is built on it (a route answers 400)', async () => {
    class HostBase extends Error {}
    const q = new DockerSandboxProvider({ image: BUSYBOX, namespace, errors: { SandboxError: HostBase } })
    try {
      const e = await rejection(
        q.uploadFile({ sandboxId: id, remotePath: '/trueforge/uploads/\uD800', content: Buffer.from('x') }),
      )
      expect(e).toBeInstanceOf(HostBase)
      expect(e).toBeInstanceOf(SandboxError)
      expect(e.statusCode).toBe(400)
    } finally {
      q.dispose()
    }
  })

  test('well-formed pairs (an emoji) still round-trip', async () => {
    const remotePath = '/trueforge/uploads/\u{1F600}.txt'
    await p.uploadFile({ sandboxId: id, remotePath, content: Buffer.from('smile') })
    expect((await p.downloadFile({ sandboxId: id, path: '/trueforge/uploads/\u{1F600}.txt' })).toString()).toBe('smile')
    await ok(p, id, 'rm -f /trueforge/uploads/*')
  })
})
