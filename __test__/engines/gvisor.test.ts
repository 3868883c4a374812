// gVisor (runsc) with the in-sandbox agent, on the engine of scripts/engines/gvisor-engine.sh (run by
// the runsc jest project; skipped elsewhere). Issue 32: the agent starts and serves there (its
// createSandbox failed with AGENT_LOST before), with the same guarantees as under runc: commands
// and files as the sandbox user, timeouts that kill everything a command started (gVisor has no
// child subreaper: the session guard keeps them in reach), exit codes from waitpid, and large
// uploads staged through the engine's archive endpoint.

import { createHash, randomBytes } from 'node:crypto'

import { DockerSandboxProvider } from '../..'
import {
  BUSYBOX,
  SandboxTracker,
  containerNameFor,
  docker,
  inspectContainer,
  ok,
  run,
  timed,
  uniqueNamespace,
  type Provider,
} from '../helpers'

const onRunsc = process.env.TRUEFORGE_TEST_RUNTIME === 'runsc'
const describeRunsc = onRunsc ? describe : describe.skip

jest.setTimeout(180_000)

const namespace = uniqueNamespace('t-gvisor')
const tracker = new SandboxTracker(namespace)
const providers: Provider[] = []

function provider(options: Record<string, unknown> = {}): Provider {
  const p = new DockerSandboxProvider({
    image: BUSYBOX,
    namespace,
    network: 'none',
    runtime: 'runsc',
    uploadMaxBytes: 256 << 20,
    fileMaxBytes: 256 << 20,
    ...options,
  } as any)
  providers.push(p)
  return p
}

afterAll(async () => {
  if (providers.length) await tracker.cleanup(providers[0])
  for (const p of providers) await p.dispose()
})

describeRunsc('gVisor with the agent', () => {
  const warnings: unknown[] = []
  let p: Provider
  let id: string

  beforeAll(async () => {
    const logger = { debug() {}, info() {}, error() {}, warn: (m: string, meta: unknown) => warnings.push({ m, meta }) }
    p = provider({ user: '1000:1000', logger })
    id = await tracker.create(p)
    // Root's own, as a root workload or the image would leave them.
    docker([
      'exec',
      '-u',
      '0',
      containerNameFor(namespace, id),
      'sh',
      '-c',
      'echo secret > /secret; chmod 600 /secret; mkdir -p /rootdir; chmod 700 /rootdir',
    ])
  })

  test('the sandbox runs under gVisor and the agent serves it, saying which paths it takes', async () => {
    expect(inspectContainer(containerNameFor(namespace, id)).HostConfig.Runtime).toBe('runsc')
    expect(await ok(p, id, 'dmesg | head -n 1')).toMatch(/gVisor/)
    expect(await p.agentStatus(id)).toEqual(
      expect.objectContaining({ mode: 'agent', subreaper: false, sessionGuard: true, fsIds: false, openat2: false }),
    )
    expect(warnings).toEqual([])
  })

  test('commands and files act as the sandbox user', async () => {
    expect(await ok(p, id, 'id -u; id -g')).toBe('1000\n1000\n')
    await p.uploadFile({ sandboxId: id, remotePath: 'mine.txt', content: Buffer.from('mine') })
    expect(await ok(p, id, 'stat -c "%u %g %a" mine.txt')).toBe('1000 1000 644\n')
    // root's own: neither readable nor writable through the user's calls.
    await expect(p.downloadFile({ sandboxId: id, path: '/secret' })).rejects.toThrow(/permission|denied/i)
    await expect(
      p.uploadFile({ sandboxId: id, remotePath: '/etc/planted', content: Buffer.from('x') }),
    ).rejects.toThrow(/permission|denied/i)
    expect(
      docker([
        'exec',
        containerNameFor(namespace, id),
        'sh',
        '-c',
        'test -e /etc/planted && echo there || echo absent',
      ]),
    ).toBe('absent')
  })

  test('no link is followed out of what the user may reach', async () => {
    await ok(
      p,
      id,
      'ln -sf /secret secret-link; mkdir -p d; ln -sfn /rootdir d/root-link; ln -sfn /proc/1/root d/magic',
    )
    await expect(p.downloadFile({ sandboxId: id, path: 'secret-link' })).rejects.toThrow(/permission|denied/i)
    await expect(
      p.uploadFile({ sandboxId: id, remotePath: 'd/root-link/x', content: Buffer.from('x') }),
    ).rejects.toThrow(/permission|denied/i)
    await expect(p.downloadFile({ sandboxId: id, path: 'd/magic/secret' })).rejects.toThrow()
    expect(docker(['exec', containerNameFor(namespace, id), 'ls', '-A', '/rootdir'])).toBe('')
  })

  test('exit codes come from waitpid: a printed marker cannot fake one, a signal is 128 + its number', async () => {
    expect((await run(p, id, 'echo "__TF_EXIT__:0"; exit 7')).exitCode).toBe(7)
    expect((await run(p, id, 'kill -9 $$')).exitCode).toBe(137)
  })

  test('a timeout kills everything the command started, escapes included, and says so once it is gone', async () => {
    const r = await run(
      p,
      id,
      'setsid sleep 3011 & (setsid sleep 3012 &); env -i /bin/sleep 3013 & sh -c "sleep 3014 & exit"; sleep 60',
      { timeoutSeconds: 2 } as any,
    )
    expect(r.exitCode).toBe(124)
    expect(r.result).toMatch(/timed out after 2 s: the command and every process it started were killed/)
    // (The container's init sleeps too, as `sleep 30`.)
    expect(await ok(p, id, "ps -o args | grep -c '[s]leep 301[1-4]' || true")).toBe('0\n')
  })

  test('background processes do not hold the call', async () => {
    const { ms } = await timed(() => ok(p, id, 'sleep 30 & echo bg'))
    expect(ms).toBeLessThan(1500)
  })

  test('a 100 MiB upload is staged through the engine and replaces what the sandbox had read', async () => {
    for (const round of [1, 2]) {
      const bytes = randomBytes((100 << 20) + round)
      const { ms } = await timed(() => p.uploadFile({ sandboxId: id, remotePath: 'big.bin', content: bytes }))
      const inside = await ok(p, id, 'md5sum big.bin; stat -c "%u %s" big.bin')
      expect(inside).toBe(`${createHash('md5').update(bytes).digest('hex')}  big.bin\n1000 ${bytes.length}\n`)
      // Streamed, it took 1.2 s here; staged, about 0.2 s.
      expect(ms).toBeLessThan(900)
      expect(Buffer.from(await p.downloadFile({ sandboxId: id, path: 'big.bin' })).equals(bytes)).toBe(true)
    }
    expect(docker(['exec', containerNameFor(namespace, id), 'sh', '-c', 'ls -A /.trueforge-staging | wc -l'])).toBe('0')
  })
})

describeRunsc('gVisor and GPUs', () => {
  // This engine registers Debian's runsc with no arguments: no nvproxy, so no GPU could reach
  // the sandbox. Refused before anything is made, saying what to change.
  test('gpus on runsc without nvproxy: INVALID_OPTION naming the missing piece, no container made', async () => {
    const mine = () => docker(['ps', '-aq', '--filter', `label=trueforge.sandbox.namespace=${namespace}`])
    const before = mine()
    const p = provider({ gpus: 'all' })
    await expect(p.createSandbox()).rejects.toMatchObject({
      name: 'TypeError',
      code: 'INVALID_OPTION',
      option: 'gpus',
      message: expect.stringMatching(/runsc.*nvproxy.*--nvproxy.*runtimeArgs/s),
    })
    expect(mine()).toBe(before)
  })
})
