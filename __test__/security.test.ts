// Security: what code inside a sandbox can and cannot do, against the real engine. Least
// privilege from the inside (capabilities, no-new-privileges, seccomp, no mounts, no Docker
// socket, no other processes, no network with `network: 'none'`), resource limits (a fork bomb
// and a memory bomb are contained), non-root users, a read-only root filesystem, an unknown
// runtime, tenants that cannot see each other, and the container definition the engine holds.

import { createHash, randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'

import { DockerSandboxProvider, SandboxError, SandboxNotAvailableError } from '..'
import {
  BUSYBOX,
  cleanupNamespace,
  containerNameFor,
  containersInNamespace,
  DEBIAN,
  docker,
  dockerTry,
  inspectContainer,
  ok,
  Provider,
  randomUlid,
  rejection,
  run,
  sleep,
  timed,
  uniqueNamespace,
  onRunsc,
  TEST_RUNTIME,
} from './helpers'

// Also run against Podman (the podman jest project). There the in-sandbox checks are the same; the
// `docker inspect` spellings differ (docs/podman.md; __test__/engines/podman.test.ts checks the
// effective result instead), and a rootless Podman on cgroup v1 enforces no resource limit.
const onPodman = (process.env.DOCKER_HOST ?? '').endsWith('podman.sock')
const limitsIgnored =
  onPodman &&
  (process.env.DOCKER_HOST ?? '').startsWith('unix:///run/user/') &&
  dockerTry(['info', '--format', '{{.CgroupVersion}}']).stdout === '1'
const INIT = onPodman ? 'podman-init' : 'docker-init'
/** Docker's inspect spellings only: skipped on Podman, saying why. */
const dockerSpellings = onPodman ? describe.skip : describe
// Under gVisor's ptrace platform the engine's pids limit counts the sandbox's own host threads
// and stub processes (a low one stops the sandbox as it starts), and the sandbox sees no cgroup
// files: the limits hold on the host, around the whole sandbox, not as these tests check them.
const withLimits = limitsIgnored || onRunsc ? test.skip : test

const namespace = uniqueNamespace('t-sec')
/** Only the unknown-runtime test uses it: it must stay empty. */
const runtimeNamespace = `${namespace}-rt`
const providers: Provider[] = []

function provider(options: Record<string, unknown>): Provider {
  const p = new DockerSandboxProvider({ namespace, ...options } as any)
  providers.push(p)
  return p
}

async function create(p: Provider): Promise<string> {
  return (await p.createSandbox()).sandboxId
}

afterAll(() => {
  for (const p of providers) p.dispose()
  cleanupNamespace(namespace)
  cleanupNamespace(runtimeNamespace)
})

// The documented default capabilities and their numbers (linux/capability.h).
const CAP_NUMBERS: Record<string, number> = {
  CHOWN: 0,
  DAC_OVERRIDE: 1,
  DAC_READ_SEARCH: 2,
  FOWNER: 3,
  FSETID: 4,
  KILL: 5,
  SETGID: 6,
  SETUID: 7,
  SETPCAP: 8,
  NET_BIND_SERVICE: 10,
  NET_ADMIN: 12,
  NET_RAW: 13,
  SYS_MODULE: 16,
  SYS_RAWIO: 17,
  SYS_CHROOT: 18,
  SYS_PTRACE: 19,
  SYS_ADMIN: 21,
  SYS_BOOT: 22,
  MKNOD: 27,
  AUDIT_WRITE: 29,
  SETFCAP: 31,
}
const DOCUMENTED_CAPS = ['CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'SETGID', 'SETUID', 'NET_BIND_SERVICE']
const EXPECTED_MASK = DOCUMENTED_CAPS.reduce((m, c) => m | (1n << BigInt(CAP_NUMBERS[c])), 0n)
const GIB = 1024 * 1024 * 1024

/** A sandbox's link directory as its definition mounts it (docs/agent.md#linked-agents). */
const LINK_MOUNT = {
  Type: 'bind',
  Source: expect.stringMatching(/\/trueforge-link-\d+\/[0-9a-f]{16}\/[0-9A-Z]{26}$/),
  Target: '/.trueforge-link',
  ReadOnly: true,
}

/** Whether an inspected mount is a sandbox's link directory, read-only. */
function isLinkMount(m: any): boolean {
  return (
    m.Destination === '/.trueforge-link' &&
    m.RW === false &&
    /\/trueforge-link-\d+\/[0-9a-f]{16}\/[0-9A-Z]{26}$/.test(m.Source)
  )
}

function partition<T>(items: T[], pred: (t: T) => boolean): [T[], T[]] {
  return [items.filter(pred), items.filter((t) => !pred(t))]
}

/** The `Name:\tvalue` lines of /proc/self/status as seen by a command in the sandbox. */
async function procStatus(p: Provider, id: string): Promise<Record<string, string>> {
  const out = await ok(p, id, 'cat /proc/self/status')
  const fields: Record<string, string> = {}
  for (const line of out.split('\n')) {
    const m = /^([A-Za-z_]+):\s*(.*)$/.exec(line)
    if (m) fields[m[1]] = m[2].trim()
  }
  return fields
}

function capNames(mask: bigint): string[] {
  return Object.entries(CAP_NUMBERS)
    .filter(([, n]) => (mask >> BigInt(n)) & 1n)
    .map(([name]) => name)
    .sort()
}

/** The host's view of a container's pid count (cgroup v1, cgroupfs driver); null if unreadable. */
function hostPidsCurrent(containerId: string): number | null {
  try {
    return Number(readFileSync(`/sys/fs/cgroup/pids/docker/${containerId}/pids.current`, 'utf8').trim())
  } catch {
    return null
  }
}

/** Runs `echo ok` until it answers (the sandbox may need a moment after a bomb). */
async function answersOk(p: Provider, id: string, withinMs: number): Promise<string> {
  const deadline = Date.now() + withinMs
  let last = ''
  for (;;) {
    const r = await p.exec({ sandboxId: id, command: 'echo ok', timeoutSeconds: 10 })
    if (r.success && r.response.exitCode === 0 && r.response.result === 'ok\n') return r.response.result
    last = JSON.stringify(r)
    if (Date.now() > deadline) return last
    await sleep(500)
  }
}

// Default configuration (an egress policy: no network but loopback): one debian and one busybox
// sandbox; one with `egress: 'open'` (the engine network: ours for the namespace) and one with
// `network: 'none'`.
const deb = provider({ image: DEBIAN })
const bb = provider({ image: BUSYBOX })
const openBb = provider({ image: BUSYBOX, egress: 'open' })
const isolated = provider({ image: BUSYBOX, network: 'none' })
let debId: string
let bbId: string
let openId: string
let isolatedId: string

beforeAll(async () => {
  ;[debId, bbId, openId, isolatedId] = await Promise.all([create(deb), create(bb), create(openBb), create(isolated)])
}, 90_000)

describe('from inside a default sandbox', () => {
  test.each([
    ['debian', () => [deb, debId] as const],
    ['busybox', () => [bb, bbId] as const],
  ])('%s: effective, permitted and bounding capabilities are exactly the documented set', async (_l, get) => {
    const [p, id] = get()
    const s = await procStatus(p, id)
    expect(EXPECTED_MASK).toBe(0x4fbn)
    for (const field of ['CapEff', 'CapPrm', 'CapBnd']) {
      const mask = BigInt(`0x${s[field]}`)
      expect({ field, caps: capNames(mask) }).toEqual({ field, caps: [...DOCUMENTED_CAPS].sort() })
      expect({ field, mask: mask.toString(16) }).toEqual({ field, mask: EXPECTED_MASK.toString(16) })
    }
    // gVisor's /proc/<pid>/status has no CapAmb line (nor NoNewPrivs, Seccomp).
    if (onRunsc) expect(s.CapAmb).toBeUndefined()
    else expect(BigInt(`0x${s.CapAmb}`)).toBe(0n)
    // What Docker grants by default but the provider drops.
    const bnd = BigInt(`0x${s.CapBnd}`)
    for (const dropped of [
      'NET_RAW',
      'MKNOD',
      'AUDIT_WRITE',
      'SETFCAP',
      'SETPCAP',
      'SYS_CHROOT',
      'SYS_ADMIN',
      'SYS_PTRACE',
    ]) {
      expect({ dropped, present: Boolean((bnd >> BigInt(CAP_NUMBERS[dropped])) & 1n) }).toEqual({
        dropped,
        present: false,
      })
    }
  })

  // Under gVisor no-new-privileges is still set (the container definition test checks it), but
  // /proc/<pid>/status shows neither line, and runsc does not apply the engine's seccomp profile
  // (gVisor is itself the system call boundary; runsc --oci-seccomp is off by default).
  ;(onRunsc ? test.skip : test).each([
    ['debian', () => [deb, debId] as const],
    ['busybox', () => [bb, bbId] as const],
  ])(
    '%s: NoNewPrivs is 1 and the engine seccomp filter is on (Seccomp: 2) (skipped on runsc: gVisor shows neither line and does not apply the profile)',
    async (_l, get) => {
      const [p, id] = get()
      const s = await procStatus(p, id)
      expect(s.NoNewPrivs).toBe('1')
      expect(s.Seccomp).toBe('2')
    },
  )

  test('mounting a file system and making namespaces fail', async () => {
    const d = await run(deb, debId, 'mount -t tmpfs none /mnt')
    expect(d.exitCode).not.toBe(0)
    const b = await run(bb, bbId, 'mkdir -p /tmp/m && mount -t tmpfs none /tmp/m')
    expect(b.exitCode).not.toBe(0)
    // Nothing got mounted anyway.
    expect(await ok(deb, debId, 'cat /proc/self/mounts')).not.toMatch(/ \/mnt /)
    expect(await ok(bb, bbId, 'cat /proc/self/mounts')).not.toMatch(/ \/tmp\/m /)
    // Nor can it make a user or mount namespace (a common step towards mounting).
    expect((await run(deb, debId, 'unshare -Urm true')).exitCode).not.toBe(0)
    expect((await run(deb, debId, 'unshare -m true')).exitCode).not.toBe(0)
  })

  test('no Docker socket is reachable: no socket file anywhere, no engine TCP port', async () => {
    for (const [p, id] of [
      [deb, debId],
      [bb, bbId],
    ] as const) {
      expect((await run(p, id, 'test -e /var/run/docker.sock')).exitCode).not.toBe(0)
      expect((await run(p, id, 'test -e /run/docker.sock')).exitCode).not.toBe(0)
      // No unix socket of any kind in the file system (kernel trees aside).
      const sockets = await ok(
        p,
        id,
        'find / \\( -path /proc -o -path /sys \\) -prune -o -type s -print 2>/dev/null || true',
      )
      expect(sockets.trim()).toBe('')
    }
    // With egress open, the engine's TCP ports on the bridge gateway (the host) do not answer.
    // Under runsc on the gVisor test engine (--network=none: sandboxes have loopback only) there
    // is no gateway.
    if (onRunsc) return
    const networks = inspectContainer(containerNameFor(namespace, openId)).NetworkSettings.Networks
    // The sandbox's one network: ours for the namespace (network.test.ts checks which).
    const gw = (Object.values(networks)[0] as { Gateway: string }).Gateway
    expect(gw).toMatch(/^\d+\.\d+\.\d+\.\d+$/)
    for (const port of [2375, 2376]) {
      const r = await run(openBb, openId, `nc -w 2 ${gw} ${port} </dev/null`, { timeoutSeconds: 10 })
      expect({ port, exitCode: r.exitCode === 0 ? 0 : 'failed' }).toEqual({ port, exitCode: 'failed' })
    }
    // Under the default policy the host's own addresses are refused by the proxy, unsent.
    for (const port of [2375, 2376]) {
      const r = await run(bb, bbId, `wget -q -O- http://${gw}:${port}/version 2>&1`, { timeoutSeconds: 10 })
      expect(r.exitCode).not.toBe(0)
      expect(r.result).toMatch(/403/)
    }
  })

  test('processes of other sandboxes and of the host are invisible', async () => {
    // Sandbox B runs a marker process in the background; B itself sees it.
    await ok(bb, bbId, 'sleep 777 >/dev/null 2>&1 &')
    expect(await ok(bb, bbId, 'ps -o args')).toMatch(/sleep 777/)
    await ok(deb, debId, 'sleep 778 >/dev/null 2>&1 &')

    const rows = (await ok(deb, debId, 'ps -eo pid=,comm=,args='))
      .split('\n')
      .filter((l) => l.trim())
      .map((l) => {
        const m = /^\s*(\d+)\s+(\S+)\s*(.*)$/.exec(l)
        if (!m) throw new Error(`unparsed ps line ${JSON.stringify(l)}`)
        return { pid: Number(m[1]), comm: m[2], args: m[3] }
      })
    expect(rows.find((r) => r.pid === 1)?.comm).toBe(INIT)
    expect(rows.filter((r) => /sleep 777/.test(r.args))).toEqual([])
    // Only its own: the init, the init script and its sleep, our own marker, the agent (with the
    // shepherd of this command and the spare it keeps for the next), the shell and ps itself. Nothing of the host (dockerd,
    // containerd, node) or of B. The init script's idle check runs `date` and `stat` (in a
    // subshell) for a moment every interval: a `ps` may catch them, and they are its own.
    const idleCheck = (r: { comm: string }) => r.comm === 'date' || r.comm === 'stat'
    for (const r of rows) {
      const allowed = [INIT, 'sh', 'bash', 'sleep', 'ps', 'trueforge-agent'].includes(r.comm) || idleCheck(r)
      expect({ comm: r.comm, allowed }).toEqual({ comm: r.comm, allowed: true })
      if (r.comm === 'sleep') expect(r.args).toMatch(/^sleep (30|3600|778)$/)
      if (idleCheck(r))
        expect(r.args).toMatch(/^(date \+%s|stat -c (%Y|%u:%h:%Y) \S+|find \S+ -maxdepth 0 -printf (%T@|%U:%n:%T@))$/)
      expect(r.args).not.toMatch(/dockerd|containerd|jest|node /)
    }
    // The idle check's subshell and its command come and go.
    expect(rows.filter((r) => !idleCheck(r)).length).toBeLessThanOrEqual(10)
    expect(rows.some((r) => /sleep 778/.test(r.args))).toBe(true)

    // And the other way round, with busybox's ps.
    const bbRows = (await ok(bb, bbId, 'ps -o pid,args'))
      .split('\n')
      .slice(1)
      .filter((l) => l.trim())
    expect(bbRows.filter((l) => /sleep 778/.test(l))).toEqual([])
    expect(bbRows.length).toBeLessThanOrEqual(10)
    // The host's pid 1 is not the sandbox's.
    expect(await ok(bb, bbId, 'cat /proc/1/comm')).toBe(`${INIT}\n`)
  })

  test("with network: 'none' the only interface is loopback", async () => {
    expect(await ok(isolated, isolatedId, 'ls /sys/class/net')).toBe('lo\n')
    const dev = await ok(isolated, isolatedId, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    expect(dev).toBe('lo\n')
    expect(inspectContainer(containerNameFor(namespace, isolatedId)).HostConfig.NetworkMode).toBe('none')
  })

  // The gVisor test engine runs runsc with --network=none (its network namespace has no
  // interfaces, where runsc refuses a network stack of its own): loopback only.
  ;(onRunsc ? test.skip : test)(
    'under the default egress policy the only interface is loopback; with egress open there is an eth0 besides it (skipped on runsc: the gVisor test engine gives sandboxes loopback only)',
    async () => {
      for (const [p, id] of [
        [deb, debId],
        [bb, bbId],
      ] as const) {
        expect(await ok(p, id, 'ls /sys/class/net')).toBe('lo\n')
      }
      const ifaces = (await ok(openBb, openId, 'ls /sys/class/net')).split('\n').filter(Boolean).sort()
      expect(ifaces).toEqual(['eth0', 'lo'])
    },
  )
})

dockerSpellings('the container definition (docker inspect; Docker spellings, skipped on Podman)', () => {
  test('a default sandbox: unprivileged, no host mounts or namespaces, caps dropped, limits set', () => {
    for (const id of [debId, bbId]) {
      const info = inspectContainer(containerNameFor(namespace, id))
      const h = info.HostConfig
      expect(h.Privileged).toBe(false)
      expect(h.Binds ?? []).toEqual([])
      // The agent's volume, read-only, never seeded from the image; and, where links are had, the
      // sandbox's own link directory, read-only: no other host path.
      const [links, others] = partition(h.Mounts ?? [], (m: any) => m.Target === '/.trueforge-link')
      expect(others).toEqual([
        {
          Type: 'volume',
          Source: expect.stringMatching(/^trueforge-agent-[0-9.]+-[0-9a-f]{12}$/),
          Target: expect.stringMatching(/^\/\.trueforge-agent\/[0-9.]+-[0-9a-f]{12}$/),
          ReadOnly: true,
          VolumeOptions: { NoCopy: true },
        },
      ])
      expect(links).toEqual(links.map(() => LINK_MOUNT))
      expect(
        (info.Mounts ?? [])
          .filter((m: any) => m.Destination !== '/.trueforge-link')
          .map((m: any) => ({ type: m.Type, rw: m.RW, name: m.Name })),
      ).toEqual([{ type: 'volume', rw: false, name: others[0].Source }])
      expect(h.VolumesFrom ?? []).toEqual([])
      expect(h.Devices ?? []).toEqual([])
      expect(h.DeviceRequests ?? []).toEqual([])
      // The default egress policy: no network but loopback.
      expect(Object.keys(info.NetworkSettings.Networks)).toEqual(['none'])
      for (const mode of ['NetworkMode', 'PidMode', 'IpcMode', 'UTSMode', 'UsernsMode']) {
        expect({ mode, value: h[mode] }).not.toEqual({ mode, value: 'host' })
        expect(String(h[mode] ?? '')).not.toMatch(/^(host|container:)/)
      }
      expect(h.PidMode ?? '').toBe('')
      const sec: string[] = h.SecurityOpt ?? []
      expect(sec.some((o) => /^no-new-privileges(:true|=true)?$/.test(o))).toBe(true)
      expect(sec.filter((o) => /unconfined|seccomp|apparmor|label[:=]disable/.test(o))).toEqual([])
      expect(h.CapDrop).toEqual(['ALL'])
      expect([...(h.CapAdd ?? [])].sort()).toEqual([...DOCUMENTED_CAPS].sort())
      expect(h.PidsLimit).toBe(4096)
      expect(h.Memory).toBe(8 * GIB)
      expect(h.MemorySwap).toBe(h.Memory)
      expect(h.OomKillDisable).not.toBe(true)
      expect(h.ReadonlyRootfs).toBe(false)
      expect(h.Init).toBe(true)
      // The engine's masked and read-only kernel paths are left in place.
      expect((h.MaskedPaths ?? []).length).toBeGreaterThan(0)
      expect((h.ReadonlyPaths ?? []).length).toBeGreaterThan(0)
      expect(h.Runtime).toBe(TEST_RUNTIME ?? 'runc')
    }
  })
})

describe('resource limits', () => {
  const bomber = provider({ image: DEBIAN, network: 'none', resources: { pidsLimit: 64 } })

  withLimits(
    'a fork bomb that holds the call is stopped by the pids limit and the timeout; the sandbox lives on (skipped where the engine ignores limits: rootless Podman on cgroup v1; and on runsc, where gVisor holds them around the whole sandbox)',
    async () => {
      const id = await create(bomber)
      const name = containerNameFor(namespace, id)
      const info = inspectContainer(name)
      expect(info.HostConfig.PidsLimit).toBe(64)
      const containerId = info.Id as string
      // What the sandbox holds at rest: docker-init, the init script and its sleep, and the agent
      // (with its threads) and the spare shepherd it starts once a call's answer is sent.
      await ok(bomber, id, 'true')
      await sleep(1000)
      const atRest = hostPidsCurrent(containerId) ?? 5
      const rounds = []
      for (let round = 1; round <= 2; round++) {
        // `sleep` first (the bomb leaves no pid to fork it later), then the classic bomb, then
        // wait on the sleep so the call runs into its timeout.
        const { value, ms } = await timed(() =>
          run(bomber, id, 'sleep 30 & s=$!; :(){ :|:& };:; wait $s', { timeoutSeconds: 5 }),
        )
        // The result says "the command and every process it started were killed": the host's
        // count of the container's pids must drop back to what it holds at rest within moments.
        // Read from the host: nothing can fork inside.
        let pids = hostPidsCurrent(containerId)
        for (let i = 0; i < 30 && pids !== null && pids > atRest; i++) {
          await sleep(100)
          pids = hostPidsCurrent(containerId)
        }
        const left =
          pids !== null && pids > atRest ? docker(['top', name, '-o', 'pid,pgid,args']).split('\n').length - 1 : 0
        rounds.push({
          round,
          exitCode: value.exitCode,
          fast: ms < 20_000,
          pidsSoonAfter:
            pids === null ? 'unreadable' : pids <= atRest ? 'init only' : `${pids} pids, ${left} processes`,
          // The same sandbox, and another one, still answer.
          sameSandbox: await answersOk(bomber, id, 10_000),
          otherSandbox: (await run(deb, debId, 'echo ok')).result,
        })
      }
      expect(rounds).toEqual(
        [1, 2].map((round) => ({
          round,
          exitCode: 124,
          fast: true,
          pidsSoonAfter: expect.stringMatching(/^(init only|unreadable)$/),
          sameSandbox: 'ok\n',
          otherSandbox: 'ok\n',
        })),
      )
    },
    90_000,
  )

  // Never run without a pids cap: the bomb would take the host's process table with it.
  withLimits(
    'the classic backgrounded fork bomb: the call ends, the pids cap holds, other sandboxes answer, removal works (skipped where the engine ignores limits: rootless Podman on cgroup v1; and on runsc, where gVisor holds them around the whole sandbox)',
    async () => {
      const id = await create(bomber)
      const name = containerNameFor(namespace, id)
      const containerId = inspectContainer(name).Id as string
      const { value, ms } = await timed(() =>
        bomber.exec({ sandboxId: id, command: ':(){ :|:& };:', timeoutSeconds: 5 }),
      )
      // It ran (any exit code: the shell returns at once, leaving the bomb in the background).
      expect(value.success).toBe(true)
      expect(ms).toBeLessThan(15_000)
      await sleep(1000)
      const pids = hostPidsCurrent(containerId)
      if (pids !== null) expect(pids).toBeLessThanOrEqual(64)
      // Other sandboxes are unaffected while the bomb rages.
      expect(await ok(deb, debId, 'echo ok')).toBe('ok\n')
      expect(await ok(bb, bbId, 'echo ok')).toBe('ok\n')
      // The bombed sandbox can always be removed.
      expect(await bomber.removeSandbox(id)).toBe(true)
      expect(inspectContainer(name)).toBeNull()
    },
    60_000,
  )

  withLimits(
    'a memory bomb past memoryBytes is killed (137) and the sandbox still answers (skipped where the engine ignores limits: rootless Podman on cgroup v1; and on runsc, where gVisor holds them around the whole sandbox)',
    async () => {
      const mem = 64 * 1024 * 1024
      const debMem = provider({ image: DEBIAN, network: 'none', resources: { memoryBytes: mem } })
      const bbMem = provider({ image: BUSYBOX, network: 'none', resources: { memoryBytes: mem } })
      const [d, b] = await Promise.all([create(debMem), create(bbMem)])
      for (const id of [d, b]) {
        const h = inspectContainer(containerNameFor(namespace, id)).HostConfig
        expect(h.Memory).toBe(mem)
        expect(h.MemorySwap).toBe(mem)
      }
      expect((await ok(debMem, d, 'cat /sys/fs/cgroup/memory/memory.limit_in_bytes')).trim()).toBe(String(mem))

      const py = await run(debMem, d, 'python3 -c "b = bytearray(512*1024*1024)"', { timeoutSeconds: 30 })
      expect(py.exitCode).toBe(137)
      expect(await ok(debMem, d, 'echo ok')).toBe('ok\n')

      const sh = await run(bbMem, b, 'head -c 300m /dev/zero | tail', { timeoutSeconds: 30 })
      expect(sh.exitCode).toBe(137)
      expect(await ok(bbMem, b, 'echo ok')).toBe('ok\n')
    },
    60_000,
  )
})

describe('a non-root user', () => {
  test.each([
    ['debian, user 1000:1000', DEBIAN, '1000:1000', '1000', '1000'],
    ['busybox, user nobody', BUSYBOX, 'nobody', '65534', '65534'],
  ])(
    '%s: uploads, layout and pwd work as that user; it cannot write outside what it owns',
    async (_l, image, user, uid, gid) => {
      const p = provider({ image, user, network: 'none' })
      const id = await create(p)
      // On Docker the sandbox's user is a label and its main process runs as root, so that the
      // agent (an exec as root) keeps the capabilities it needs to run things as that user.
      const config = inspectContainer(containerNameFor(namespace, id)).Config
      expect(config.Labels['trueforge.sandbox.user'] ?? config.User).toBe(user)
      expect(await ok(p, id, 'id -u; id -g; pwd')).toBe(`${uid}\n${gid}\n${id}\n`)

      await p.uploadFile({ sandboxId: id, remotePath: 'up.txt', content: Buffer.from('hello') })
      await p.uploadFile({
        sandboxId: id,
        remotePath: `${p.getFileUploadsDir(id)}/in-uploads.txt`,
        content: Buffer.from('u'),
      })
      // find where stat fails: gVisor (runsc 20221219) answers GNU coreutils' statx with EINVAL
      // (busybox's stat uses fstatat; its find has no -printf).
      const files = `up.txt ${p.getFileUploadsDir(id)}/in-uploads.txt`
      expect(await ok(p, id, `stat -c %u:%g ${files} 2>/dev/null || find ${files} -printf '%U:%G\\n'`)).toBe(
        `${uid}:${gid}\n${uid}:${gid}\n`,
      )
      expect(await ok(p, id, 'echo more >> up.txt && cat up.txt')).toBe('hellomore\n')
      expect(
        await ok(
          p,
          id,
          "mkdir -p skills && test -d skills && (stat -c %u skills 2>/dev/null || find skills -maxdepth 0 -printf '%U\\n')",
        ),
      ).toBe(`${uid}\n`)
      for (const dir of [
        '/trueforge',
        p.getFileUploadsDir(id),
        p.getSkillsDir(id),
        p.getToolResultDumpDir(id),
        '/trueforge/bin',
      ]) {
        const r = await run(p, id, `touch ${dir}/probe && test -w ${dir}`)
        expect({ dir, exitCode: r.exitCode }).toEqual({ dir, exitCode: 0 })
      }
      for (const path of ['/etc/x', '/root/x', '/usr/x', '/x']) {
        const r = await run(p, id, `touch ${path}`)
        expect({ path, exitCode: r.exitCode === 0 ? 0 : 'refused' }).toEqual({ path, exitCode: 'refused' })
      }
      // A non-root user holds no capabilities at all, and cannot regain them.
      const s = await procStatus(p, id)
      expect(s.CapEff).toBe('0000000000000000')
      // gVisor's /proc/<pid>/status has no NoNewPrivs line (the container definition has it set).
      if (!onRunsc) expect(s.NoNewPrivs).toBe('1')
    },
    60_000,
  )
})

describe('readOnlyRootfs: true', () => {
  const ro = provider({ image: BUSYBOX, network: 'none', readOnlyRootfs: true })

  test('the contract behaviours still hold, and the files survive a stop', async () => {
    const id = await create(ro)
    const name = containerNameFor(namespace, id)
    const info = inspectContainer(name)
    expect(info.HostConfig.ReadonlyRootfs).toBe(true)
    // Podman lists the sandbox's volumes under Binds too: none may name a host path.
    expect((info.HostConfig.Binds ?? []).filter((b: string) => !onPodman || b.startsWith('/'))).toEqual([])
    const mounts = (info.Mounts as any[])
      .map((m) => ({ type: m.Type, dest: m.Destination, rw: m.RW }))
      .sort((a, b) => a.dest.localeCompare(b.dest))
    expect(mounts.filter((m) => m.dest !== '/.trueforge-link')).toEqual([
      { type: 'volume', dest: expect.stringMatching(/^\/\.trueforge-agent\//), rw: false },
      { type: 'volume', dest: '/trueforge', rw: true },
      { type: 'volume', dest: '/workspace', rw: true },
    ])
    // A link directory, if any, is read-only too.
    for (const m of mounts.filter((m) => m.dest === '/.trueforge-link'))
      expect(m).toEqual({ type: 'bind', dest: '/.trueforge-link', rw: false })
    // Podman adds its own tmpfs on /run and /var/tmp to a read-only root (`read_only_tmpfs`).
    expect(Object.keys(info.HostConfig.Tmpfs ?? {}).sort()).toEqual(onPodman ? ['/run', '/tmp', '/var/tmp'] : ['/tmp'])

    expect(await ok(ro, id, 'pwd')).toBe(`${id}\n`)
    await ok(ro, id, 'mkdir -p skills && echo written > skills/f.txt')
    expect(await ok(ro, id, 'cat skills/f.txt')).toBe('written\n')

    const bytes = randomBytes(4096)
    bytes[0] = 0
    bytes[1] = 255
    const targets = [`${ro.getFileUploadsDir(id)}/blob.bin`, 'root.bin', `${id}/abs.bin`]
    for (const t of targets) {
      await ro.uploadFile({ sandboxId: id, remotePath: t, content: bytes })
      expect((await ro.downloadFile({ sandboxId: id, path: t })).equals(bytes)).toBe(true)
    }
    // The sandbox reads the same bytes too.
    const md5 = createHash('md5').update(bytes).digest('hex')
    expect(await ok(ro, id, `md5sum root.bin ${ro.getFileUploadsDir(id)}/blob.bin | cut -d' ' -f1`)).toBe(
      `${md5}\n${md5}\n`,
    )

    expect((await run(ro, id, 'touch /etc/x')).exitCode).not.toBe(0)
    expect((await run(ro, id, 'echo x > /x')).exitCode).not.toBe(0)
    expect(await ok(ro, id, 'echo scratch > /tmp/s && cat /tmp/s')).toBe('scratch\n')
    // An upload to the read-only part is a typed refusal, not a crash.
    const e = await rejection(ro.uploadFile({ sandboxId: id, remotePath: '/etc/x', content: Buffer.from('x') }))
    expect(e).toBeInstanceOf(SandboxError)
    expect(typeof e.code).toBe('string')

    docker(['stop', '-t', '1', name])
    expect(inspectContainer(name).State.Running).toBe(false)
    expect(await ok(ro, id, 'cat skills/f.txt && pwd')).toBe(`written\n${id}\n`)
    expect((await ro.downloadFile({ sandboxId: id, path: 'root.bin' })).equals(bytes)).toBe(true)
    expect((await ro.downloadFile({ sandboxId: id, path: `${ro.getFileUploadsDir(id)}/blob.bin` })).equals(bytes)).toBe(
      true,
    )
  }, 60_000)
})

;(onRunsc ? test.skip : test)(
  "runtime: 'runsc' (not installed) fails creation clearly and leaves no container (skipped on runsc: this engine has it)",
  async () => {
    const p = new DockerSandboxProvider({
      image: BUSYBOX,
      namespace: runtimeNamespace,
      network: 'none',
      runtime: 'runsc',
    })
    providers.push(p)
    const e = await rejection(p.createSandbox())
    expect(e).toBeInstanceOf(SandboxError)
    expect(e.code).toBe('CREATE_FAILED')
    expect(e.message).toMatch(/runsc/)
    expect(e.message).toMatch(/runtime/)
    expect(containersInNamespace(runtimeNamespace)).toEqual([])
    expect(docker(['ps', '-aq', '--filter', `name=trueforge-${runtimeNamespace}-`])).toBe('')
  },
)

describe('tenants', () => {
  const tenantA = provider({ image: BUSYBOX, network: 'none', tenantName: 'tenant-a' })
  const tenantB = provider({ image: BUSYBOX, network: 'none', tenantName: 'tenant-b' })
  const noTenant = provider({ image: BUSYBOX, network: 'none' })

  /** What each call says for an id: the error's shape with the id blanked out. */
  async function shapes(p: Provider, sandboxId: string) {
    const calls: Array<[string, () => Promise<unknown>]> = [
      ['exec', () => p.exec({ sandboxId, command: 'echo intruder > /tmp/intruder' })],
      ['upload', () => p.uploadFile({ sandboxId, remotePath: 'intruder.txt', content: Buffer.from('x') })],
      ['download', () => p.downloadFile({ sandboxId, path: '/etc/hostname' })],
    ]
    const out = []
    for (const [call, f] of calls) {
      const e = await rejection(f())
      expect(e).toBeInstanceOf(SandboxNotAvailableError)
      expect(e.sandboxId).toBe(sandboxId)
      out.push({
        call,
        name: e.name,
        statusCode: e.statusCode,
        code: e.code,
        message: String(e.message).split(sandboxId).join('<id>'),
      })
    }
    out.push({ call: 'remove', removed: await p.removeSandbox(sandboxId) } as any)
    return out
  }

  test("a tenant's sandbox is SandboxNotAvailableError for another tenant and for no tenant, exactly like a missing one", async () => {
    const [a, plain] = await Promise.all([create(tenantA), create(noTenant)])
    const nameA = containerNameFor(namespace, a)
    expect(inspectContainer(nameA).Config.Labels['trueforge.sandbox.tenant']).toBe('tenant-a')
    await ok(tenantA, a, 'echo mine > mine.txt')
    const before = inspectContainer(nameA)

    const missing = `/workspace/${randomUlid()}`
    const expected = await shapes(tenantB, missing)
    expect(await shapes(tenantB, a)).toEqual(expected)
    expect(await shapes(noTenant, a)).toEqual(await shapes(noTenant, missing))
    // And the other way: a sandbox without a tenant is not reachable from a tenant's provider.
    expect(await shapes(tenantA, plain)).toEqual(await shapes(tenantA, missing))

    // Untouched: still running, same start, nothing written; its owner still works.
    const after = inspectContainer(nameA)
    expect(after.State.Running).toBe(true)
    expect(after.State.StartedAt).toBe(before.State.StartedAt)
    expect(after.State.Pid).toBe(before.State.Pid)
    expect(await ok(tenantA, a, 'cat mine.txt; ls; test -e /tmp/intruder || echo no-intruder')).toBe(
      'mine\nmine.txt\nno-intruder\n',
    )
    expect(await ok(noTenant, plain, 'test -e /tmp/intruder || echo no-intruder; ls')).toBe('no-intruder\n')
  }, 60_000)

  test.each([
    ['network', { network: 'host' }],
    ['network', { network: 'container:abc' }],
    ['capabilities', { capabilities: ['SYS_ADMIN'] }],
    ['capabilities', { capabilities: ['cap_sys_admin'] }],
    ['capabilities', { capabilities: ['CHOWN', 'SYS_PTRACE'] }],
    ['capabilities', { capabilities: ['SYS_MODULE'] }],
    ['capabilities', { capabilities: ['NET_ADMIN'] }],
    ['capabilities', { capabilities: ['DAC_READ_SEARCH'] }],
    ['capabilities', { capabilities: ['SYS_RAWIO'] }],
    ['capabilities', { capabilities: ['ALL'] }],
  ])('%s %j is refused at construction with INVALID_OPTION', (option, extra) => {
    let e: any
    try {
      new DockerSandboxProvider({ image: BUSYBOX, namespace, tenantName: 'tenant-a', ...(extra as any) })
    } catch (err) {
      e = err
    }
    expect(e).toBeInstanceOf(TypeError)
    expect(e.code).toBe('INVALID_OPTION')
    expect(e.option).toBe(option)
  })
})

;(onPodman ? test.skip : test)(
  'every container this file made keeps the least-privilege baseline (Docker spellings, skipped on Podman)',
  () => {
    const ids = containersInNamespace(namespace)
    expect(ids.length).toBeGreaterThan(5)
    for (const cid of ids) {
      const info = inspectContainer(cid)
      if (!info) continue // removed meanwhile
      const h = info.HostConfig
      const summary = {
        name: info.Name,
        privileged: h.Privileged,
        capDrop: h.CapDrop,
        nnp: (h.SecurityOpt ?? []).includes('no-new-privileges:true'),
        pidsLimit: typeof h.PidsLimit === 'number' && h.PidsLimit > 0,
        memoryIsSwap: h.Memory > 0 && h.Memory === h.MemorySwap,
        // The sandbox's own link directory, read-only, is the one host path allowed.
        hostMounts: (info.Mounts ?? []).filter((m: any) => m.Type === 'bind' && !isLinkMount(m)).length,
        network: h.NetworkMode === 'host',
      }
      expect(summary).toEqual({
        name: info.Name,
        privileged: false,
        capDrop: ['ALL'],
        nnp: true,
        pidsLimit: true,
        memoryIsSwap: true,
        hostMounts: 0,
        network: false,
      })
    }
    // Nothing to clean up by the CLI except ours.
    expect(dockerTry(['ps', '-aq', '--filter', `label=trueforge.sandbox.namespace=${namespace}`]).status).toBe(0)
  },
)
