// exec: timeouts and process cleanup, background processes, the output cap, bytes and env
// passed verbatim, ordering, exit codes, working directories, concurrency and the shell used.

import { DockerSandboxProvider } from '..'
import { BUSYBOX, DEBIAN, ExecResult, ok, run, SandboxTracker, timed, uniqueNamespace } from './helpers'

const namespace = uniqueNamespace('t-exec')
const tracker = new SandboxTracker(namespace)
const busybox = new DockerSandboxProvider({ image: BUSYBOX, namespace })
const debian = new DockerSandboxProvider({ image: DEBIAN, namespace })
let bb: string // a busybox sandbox
let deb: string // a debian sandbox

beforeAll(async () => {
  ;[bb, deb] = await Promise.all([tracker.create(busybox), tracker.create(debian)])
  // First calls warm the caches so that timings below measure the command, not the lookup.
  await Promise.all([ok(busybox, bb, 'true'), ok(debian, deb, 'true')])
})

afterAll(async () => {
  await tracker.cleanup(busybox)
})

/** Process command lines in the sandbox (the `ps` call's own processes mention only `ps`). */
async function processes(p: typeof busybox, id: string, debianPs = false): Promise<string[]> {
  const out = await ok(p, id, debianPs ? 'ps -eo pid=,args=' : 'ps -o pid,args')
  return out.split('\n').filter((l) => l.trim())
}

describe('timeouts', () => {
  // Odd durations: the container's own idle check sleeps a round number of seconds.
  test('timeoutSeconds: 1 returns promptly with 124 and kills everything it started', async () => {
    const { value, ms } = await timed(() => run(busybox, bb, 'echo before; sleep 37 & sleep 47', { timeoutSeconds: 1 }))
    expect(ms).toBeLessThan(5000)
    expect(ms).toBeGreaterThanOrEqual(900)
    expect(value.exitCode).toBe(124)
    expect(value.result).toMatch(/timed out/)
    expect(value.result).toContain('before\n')
    const ps = await processes(busybox, bb)
    expect(ps.filter((l) => /sleep (37|47)\b/.test(l))).toEqual([])
  })

  test('processes that left the group (setsid) but inherited the call are killed too', async () => {
    const { value, ms } = await timed(() =>
      run(debian, deb, 'setsid sleep 41 >/dev/null 2>&1 & (setsid sh -c "sleep 42" &) ; sleep 43', {
        timeoutSeconds: 1,
      }),
    )
    expect(ms).toBeLessThan(5000)
    expect(value.exitCode).toBe(124)
    const ps = await processes(debian, deb, true)
    expect(ps.filter((l) => /sleep 4[123]\b/.test(l))).toEqual([])
  })

  test('the provider default (execTimeoutMs) applies when the call gives none', async () => {
    const quick = new DockerSandboxProvider({ image: BUSYBOX, namespace, execTimeoutMs: 1000 })
    const { value, ms } = await timed(() => run(quick, bb, 'sleep 44'))
    expect(ms).toBeLessThan(5000)
    expect(value.exitCode).toBe(124)
    expect(value.result).toMatch(/timed out after 1 s/)
    // A per-call timeout overrides it.
    expect(await ok(quick, bb, 'sleep 1.5; echo done', { timeoutSeconds: 10 })).toBe('done\n')
  })

  test('invalid timeoutSeconds is refused without running anything', async () => {
    for (const timeoutSeconds of [0, -1, Number.NaN]) {
      const r = (await busybox.exec({ sandboxId: bb, command: 'touch should-not-exist', timeoutSeconds })) as ExecResult
      expect(r.success).toBe(false)
    }
    expect((await run(busybox, bb, 'test -e should-not-exist')).exitCode).toBe(1)
  })
})

describe('background processes', () => {
  test('`sleep 60 & echo started` returns at once and the sleep keeps running', async () => {
    const { value, ms } = await timed(() => run(busybox, bb, 'sleep 61 & echo started'))
    expect(ms).toBeLessThan(1500)
    expect(value).toEqual({ exitCode: 0, result: 'started\n' })
    const ps = await processes(busybox, bb)
    // The listing comes with a failure, to tell what else was running.
    expect({ found: ps.some((l) => /sleep 61\b/.test(l)), ps }).toEqual({ found: true, ps })
  })

  test('a background process that keeps writing to stdout does not hold the call', async () => {
    const { value, ms } = await timed(() => run(busybox, bb, '(sleep 32; echo late) & echo now'))
    expect(ms).toBeLessThan(1500)
    expect(value).toEqual({ exitCode: 0, result: 'now\n' })
    const ps = await processes(busybox, bb)
    expect(ps.some((l) => /sleep 32\b/.test(l))).toBe(true)
  })

  test('a nohup server on debian starts, returns at once and keeps serving', async () => {
    const { value, ms } = await timed(() =>
      run(debian, deb, 'nohup python3 -m http.server 8765 >/dev/null 2>&1 & echo launched'),
    )
    expect(ms).toBeLessThan(1500)
    expect(value).toEqual({ exitCode: 0, result: 'launched\n' })
    const fetch = await run(
      debian,
      deb,
      `for i in $(seq 50); do python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8765/").status)' 2>/dev/null && exit 0; sleep 0.1; done; exit 1`,
    )
    expect(fetch).toEqual({ exitCode: 0, result: '200\n' })
    const ps = await processes(debian, deb, true)
    expect(ps.some((l) => l.includes('http.server 8765'))).toBe(true)
  })

  test('the same with stdout still attached (no redirection) on debian', async () => {
    const { value, ms } = await timed(() => run(debian, deb, 'python3 -m http.server 8766 & echo launched'))
    expect(ms).toBeLessThan(1500)
    expect(value.exitCode).toBe(0)
    expect(value.result).toContain('launched')
    const ps = await processes(debian, deb, true)
    expect(ps.some((l) => l.includes('http.server 8766'))).toBe(true)
  })
})

describe('output', () => {
  test('over maxOutputBytes the head and the tail are kept and the cut is counted', async () => {
    const capped = new DockerSandboxProvider({ image: BUSYBOX, namespace, maxOutputBytes: 4096 })
    const cmd = "echo HEAD-MARKER; head -c 100000 /dev/zero | tr '\\0' x; echo; echo TAIL-MARKER"
    const { exitCode, result } = await run(capped, bb, cmd)
    expect(exitCode).toBe(0)
    expect(result.startsWith('HEAD-MARKER\n')).toBe(true)
    expect(result.endsWith('TAIL-MARKER\n')).toBe(true)
    const m = /\[\.\.\. (\d+) bytes of output omitted \.\.\.\]/.exec(result)
    expect(m).not.toBeNull()
    const total = 'HEAD-MARKER\n'.length + 100000 + 1 + 'TAIL-MARKER\n'.length
    expect(Number(m![1])).toBe(total - 4096)
    expect(result.length).toBeLessThan(4096 + 200)
    // The same command under the default cap comes back whole.
    const whole = await ok(busybox, bb, cmd)
    expect(whole.length).toBe(total)
    expect(whole).not.toMatch(/omitted/)
  })

  test('non-UTF-8 bytes become U+FFFD', async () => {
    expect(await ok(busybox, bb, "printf '\\377\\376abc'")).toBe('\uFFFD\uFFFDabc')
    expect(await ok(busybox, bb, "printf 'caf\\303\\251 \\342\\202\\254'")).toBe('café €')
  })

  test('stdout and stderr interleave in order', async () => {
    expect(await ok(busybox, bb, 'echo a; echo b >&2; echo c')).toBe('a\nb\nc\n')
    expect(await ok(debian, deb, 'echo a; echo b >&2; echo c; echo d >&2')).toBe('a\nb\nc\nd\n')
  })

  test('output that looks like a marker is passed through', async () => {
    const out = await ok(busybox, bb, "printf '\\036TFX0000000000000000:x:7\\036 after\\n'")
    expect(out).toBe('\u001eTFX0000000000000000:x:7\u001e after\n')
    // A trailing fragment that could start a marker is kept too.
    expect(await ok(busybox, bb, "printf 'end\\036TFX'")).toBe('end\u001eTFX')
    expect(await ok(busybox, bb, "printf '\\036'")).toBe('\u001e')
  })

  test('stdin is closed: a command reading it sees end of file at once', async () => {
    const { value, ms } = await timed(() => run(busybox, bb, 'cat; echo after-stdin', { timeoutSeconds: 10 }))
    expect(value).toEqual({ exitCode: 0, result: 'after-stdin\n' })
    expect(ms).toBeLessThan(3000)
  })

  test('a command spewing output until its timeout still returns promptly, capped', async () => {
    const capped = new DockerSandboxProvider({ image: BUSYBOX, namespace, maxOutputBytes: 4096 })
    const { value, ms } = await timed(() => run(capped, bb, 'yes spew', { timeoutSeconds: 1 }))
    // ~1.1-1.4 s alone; the engine is busy shovelling output, so allow for a loaded machine.
    expect(ms).toBeLessThan(10000)
    expect(value.exitCode).toBe(124)
    expect(value.result).toMatch(/bytes of output omitted/)
    expect(value.result).toMatch(/timed out/)
    expect(value.result.length).toBeLessThan(4096 + 400)
    const ps = await processes(busybox, bb)
    expect(ps.filter((l) => /yes spew/.test(l))).toEqual([])
  })

  test('empty output is an empty string', async () => {
    expect(await run(busybox, bb, 'true')).toEqual({ exitCode: 0, result: '' })
  })
})

describe('environment', () => {
  const tricky = `it's "quoted" $(echo EVALUATED) \`echo TICKED\` $HOME \\n \\$x\nsecond line\n\tünïcødé 日本語 🚀 ;&|<>*?`

  test.each([
    ['busybox', () => [busybox, bb] as const],
    ['debian', () => [debian, deb] as const],
  ])('values arrive verbatim and are not evaluated (%s)', async (_name, pick) => {
    const [p, id] = pick()
    const out = await ok(p, id, 'printf %s "$VAR"', { env: { VAR: tricky, OTHER: '' } })
    expect(out).toBe(tricky)
    expect(await ok(p, id, 'printf %s "${OTHER-unset}"', { env: { OTHER: '' } })).toBe('')
    expect(await ok(p, id, 'test -e EVALUATED || echo clean', { env: { VAR: '$(touch EVALUATED)' } })).toBe('clean\n')
  })

  test('env is per call: a variable given once is gone on the next call', async () => {
    await ok(busybox, bb, 'true', { env: { ONLY_ONCE: 'x' } })
    expect(await ok(busybox, bb, 'printf %s "${ONLY_ONCE-unset}"')).toBe('unset')
  })

  test('the provider env option reaches every command; per-call env adds to it', async () => {
    const withEnv = new DockerSandboxProvider({ image: BUSYBOX, namespace, env: { TEAM_VAR: 'from-provider' } })
    const id = await tracker.create(withEnv)
    expect(await ok(withEnv, id, 'printf %s "$TEAM_VAR"')).toBe('from-provider')
    expect(await ok(withEnv, id, 'printf %s-%s "$TEAM_VAR" "$EXTRA"', { env: { EXTRA: 'call' } })).toBe(
      'from-provider-call',
    )
  })

  test('a bad variable name is refused (success: false) and nothing runs', async () => {
    const r = (await busybox.exec({ sandboxId: bb, command: 'touch bad-env-ran', env: { '1BAD': 'x' } })) as ExecResult
    expect(r.success).toBe(false)
    if (!r.success) expect(r.error).toMatch(/1BAD/)
    const r2 = (await busybox.exec({
      sandboxId: bb,
      command: 'touch bad-env-ran',
      env: { GOOD: 3 as unknown as string },
    })) as ExecResult
    expect(r2.success).toBe(false)
    expect((await run(busybox, bb, 'test -e bad-env-ran')).exitCode).toBe(1)
  })
})

describe('exit codes and working directories', () => {
  test.each([
    ['true', 0],
    ['false', 1],
    ['exit 3', 3],
    ['exit 255', 255],
    ['no-such-command-xyz', 127],
    ['sh -c "kill -9 \\$\\$"', 137],
    ['kill -9 0', 137],
  ])('%s exits %i', async (command, code) => {
    expect((await run(busybox, bb, command)).exitCode).toBe(code)
  })

  test('cwd relative to the sandbox root, and absolute', async () => {
    await ok(busybox, bb, 'mkdir -p sub/dir')
    expect(await ok(busybox, bb, 'pwd', { cwd: 'sub/dir' })).toBe(`${bb}/sub/dir\n`)
    expect(await ok(busybox, bb, 'pwd', { cwd: '/tmp' })).toBe('/tmp\n')
    expect(await ok(busybox, bb, 'pwd', { cwd: `${bb}/sub` })).toBe(`${bb}/sub\n`)
    expect(await ok(busybox, bb, 'pwd', { cwd: '' })).toBe(`${bb}\n`)
  })

  test('a missing cwd ran (success: true) with a non-zero exit and says why', async () => {
    const r = await run(busybox, bb, 'touch ran-anyway', { cwd: 'does/not/exist' })
    expect(r.exitCode).not.toBe(0)
    expect(r.result).toMatch(/does\/not\/exist/)
    expect((await run(busybox, bb, 'test -e ran-anyway')).exitCode).toBe(1)
  })

  test('a cwd that is a file, or that the user may not enter, says which (not "no such directory")', async () => {
    await ok(busybox, bb, 'touch a-file')
    const file = await run(busybox, bb, 'touch ran-anyway', { cwd: 'a-file' })
    expect(file).toEqual({
      exitCode: 1,
      result: `cannot change directory to ${bb}/a-file: not a directory (it, or a parent, is a file)\n`,
    })
    const asUser = new DockerSandboxProvider({ image: BUSYBOX, namespace, user: '1000:1000' })
    try {
      const id = await tracker.create(asUser)
      // Its own directory, with no permission bits: the user may not enter it (root could).
      await ok(asUser, id, 'mkdir closed && chmod 000 closed')
      const closed = await run(asUser, id, 'touch ran-anyway', { cwd: 'closed' })
      expect(closed).toEqual({
        exitCode: 1,
        result: `cannot change directory to ${id}/closed: permission denied (the user may not enter it)\n`,
      })
    } finally {
      await asUser.dispose()
    }
    expect((await run(busybox, bb, 'test -e ran-anyway')).exitCode).toBe(1)
  })

  test('a command that kills its own supervisor: it ran, and the error says it may or may not have finished', async () => {
    // As root the command may kill its parent, the agent's shepherd, which would have reported
    // how it ended.
    const r = await busybox.exec({ sandboxId: bb, command: 'echo ran > lost.txt; kill -9 $PPID; sleep 1' })
    expect(r).toEqual({
      success: false,
      error: expect.stringMatching(/^the command started, then its supervisor died .* may or may not have run/),
    })
    expect(await ok(busybox, bb, 'cat lost.txt')).toBe('ran\n')
  })

  test('a cwd with spaces and shell characters is taken literally', async () => {
    await ok(busybox, bb, "mkdir -p 'we ird/$(x)'")
    expect(await ok(busybox, bb, 'pwd', { cwd: 'we ird/$(x)' })).toBe(`${bb}/we ird/$(x)\n`)
  })
})

describe('concurrency and shells', () => {
  test('10 concurrent execs on one sandbox all succeed with their own output', async () => {
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) =>
        run(busybox, bb, `sleep 0.$((${i} % 3)); echo job-${i}; echo err-${i} >&2; exit ${i}`),
      ),
    )
    results.forEach((r, i) => {
      expect(r).toEqual({ exitCode: i, result: `job-${i}\nerr-${i}\n` })
    })
  })

  test('bash runs commands on debian, sh on busybox', async () => {
    expect((await ok(debian, deb, 'echo "$BASH_VERSION"')).trim()).not.toBe('')
    expect(await ok(debian, deb, 'a=(x y z); echo ${#a[@]}')).toBe('3\n')
    expect(await ok(busybox, bb, 'echo "${BASH_VERSION:-none}"')).toBe('none\n')
    expect((await run(busybox, bb, 'command -v bash')).exitCode).not.toBe(0)
  })
})
