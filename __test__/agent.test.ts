// The in-sandbox agent, against a real engine: the hostile cases the issue lists (a workload
// running as a non-root user that plants links, swaps a file for a FIFO, forges markers, escapes
// timeouts, fork-bombs, fakes activity) are each refused or contained, the agent's own lifecycle
// (killed or stopped mid-command, a second server process, sandboxes made without it, the
// fallback), and the kinds of sandbox it must serve. Network traffic stays on loopback.

import { spawn } from 'node:child_process'
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs'
import { createConnection, createServer, type Server } from 'node:net'

import { DockerSandboxProvider, type AgentStatus } from '..'
import {
  BUSYBOX,
  DEBIAN,
  TRUEFORGE,
  SandboxTracker,
  cleanupNamespace,
  containerNameFor,
  docker,
  dockerTry,
  inspectContainer,
  ok,
  rejection,
  run,
  sleep,
  timed,
  uniqueNamespace,
  waitFor,
  type Provider,
  engineSocket,
  onRunsc,
} from './helpers'

jest.setTimeout(120_000)

const namespace = uniqueNamespace('t-agent')
const tracker = new SandboxTracker(namespace)
const providers: Provider[] = []

function provider(options: Record<string, unknown> = {}): Provider {
  const p = new DockerSandboxProvider({ image: TRUEFORGE, namespace, network: 'none', ...options } as any)
  providers.push(p)
  return p
}

afterAll(async () => {
  for (const p of providers) await p.dispose()
  cleanupNamespace(namespace)
  // A warm-pool refill that was creating when its provider was disposed finishes that create.
  await sleep(3000)
  cleanupNamespace(namespace)
}, 30_000)

/** Runs a command as root in the container from outside (setup and inspection only). */
function asRoot(sandboxId: string, command: string): { status: number; stdout: string; stderr: string } {
  return dockerTry(['exec', '-u', '0', containerNameFor(namespace, sandboxId), 'sh', '-c', command])
}

async function agentOf(p: Provider, sandboxId: string): Promise<Extract<AgentStatus, { mode: 'agent' }>> {
  const st = await p.agentStatus(sandboxId)
  if (st.mode !== 'agent') throw new Error(`the agent does not serve ${sandboxId}: ${st.reason}`)
  return st
}

/** The container's processes whose command line matches, as `pid args` (read from its /proc
 * as root: `docker top` lists the host's processes for a gVisor sandbox). */
function processes(sandboxId: string, re: RegExp): string[] {
  const out = docker([
    'exec',
    '-u',
    '0',
    containerNameFor(namespace, sandboxId),
    'sh',
    '-c',
    // A process may exit between the glob and the read; the loop must not end on its status.
    'for d in /proc/[0-9]*; do a=$(tr "\\0" " " 2>/dev/null < $d/cmdline); if [ -n "$a" ]; then echo "${d#/proc/} $a"; fi; done; true',
  ])
  return out
    .split('\n')
    .filter((l) => !l.includes('for d in /proc/'))
    .filter((l) => re.test(l))
}

describe('hostile workloads (the image user agent, not root)', () => {
  const p = provider()
  let id: string

  beforeAll(async () => {
    id = await tracker.create(p)
    expect((await ok(p, id, 'id -un')).trim()).toBe('agent')
    expect(await agentOf(p, id)).toEqual(expect.objectContaining({ uid: 0, asUser: false }))
  })

  test('a download of a planted link to /etc/shadow is refused: files are read as the sandbox user', async () => {
    expect((await run(p, id, 'cat /etc/shadow')).exitCode).not.toBe(0)
    await ok(p, id, 'ln -sf /etc/shadow shadow-link')
    const e = await rejection(p.downloadFile({ sandboxId: id, path: 'shadow-link' }))
    expect(e.name).toBe('SandboxInvalidPathError')
    expect(e.message).toMatch(/permission denied/)
    expect(e.message).not.toMatch(/root:/)
    // A link to a file the user may read is followed as before.
    await ok(p, id, 'echo mine > own.txt && ln -sf own.txt own-link')
    expect(String(await p.downloadFile({ sandboxId: id, path: 'own-link' }))).toBe('mine\n')
  })

  test('uploads through planted parent links into /etc and /root create nothing there', async () => {
    await ok(p, id, 'ln -sfn /etc d_etc && ln -sfn /root d_root && ln -sf /etc/debian_version dv')
    const version = asRoot(id, 'cat /etc/debian_version').stdout
    // Small uploads go on the agent's stream; large ones (32 MiB and over) through the engine
    // into the agent's root-only staging directory: the target is resolved as the user either way.
    for (const content of [Buffer.from('x'), Buffer.alloc(33 << 20, 1)]) {
      for (const path of ['d_etc/evil', 'd_root/evil']) {
        const e = await rejection(p.uploadFile({ sandboxId: id, remotePath: path, content }))
        expect({ path, size: content.length, name: e.name }).toEqual({
          path,
          size: content.length,
          name: 'SandboxInvalidPathError',
        })
      }
    }
    expect(asRoot(id, 'ls /etc/evil /root/evil 2>&1').status).not.toBe(0)
    expect(asRoot(id, 'ls -A /.trueforge-staging 2>/dev/null | wc -l').stdout).toBe('0')
    // A link to a root file in the user's own directory: the link is replaced, not the file.
    await p.uploadFile({ sandboxId: id, remotePath: 'dv', content: Buffer.from('replaced') })
    expect(asRoot(id, 'cat /etc/debian_version').stdout).toBe(version)
    expect(await ok(p, id, 'test -L dv || cat dv')).toBe('replaced')
  })

  test('/trueforge/uploads replaced by a link to /usr/local/bin: the next upload lands nowhere', async () => {
    await ok(p, id, 'rm -rf /trueforge/uploads && ln -s /usr/local/bin /trueforge/uploads')
    const e = await rejection(
      p.uploadFile({ sandboxId: id, remotePath: '/trueforge/uploads/evil', content: Buffer.from('#!/bin/sh\n') }),
    )
    expect(e.name).toBe('SandboxInvalidPathError')
    expect(asRoot(id, 'ls /usr/local/bin/evil 2>&1').status).not.toBe(0)
    await ok(p, id, 'rm /trueforge/uploads && mkdir /trueforge/uploads')
  })

  test('a FIFO, a device and a socket are refused before any read', async () => {
    await ok(p, id, 'mkfifo fifo && python3 -c "import socket; socket.socket(socket.AF_UNIX).bind(\'sock\')"')
    for (const [path, kind] of [
      ['fifo', 'named pipe'],
      ['sock', 'socket'],
      ['/dev/zero', 'a file under /dev'],
    ]) {
      const { value: e, ms } = await timed(() => rejection(p.downloadFile({ sandboxId: id, path })))
      expect({ path, name: e.name, kind: e.message.includes(kind) }).toEqual({
        path,
        name: 'SandboxNotRegularFileError',
        kind: true,
      })
      expect(ms).toBeLessThan(5000)
    }
  })

  test('a file swapped for a FIFO while 100 downloads race leaves every call answered and the sandbox usable', async () => {
    // The workload flips `swap` between a regular file and a FIFO as fast as it can.
    await ok(
      p,
      id,
      `nohup sh -c 'while :; do echo data > f.tmp && mv -f f.tmp swap; mkfifo p.tmp && mv -f p.tmp swap; done' >/dev/null 2>&1 & echo $! > swapper.pid`,
    )
    const { value: outcomes, ms } = await timed(() =>
      Promise.all(
        Array.from({ length: 100 }, () =>
          p.downloadFile({ sandboxId: id, path: 'swap' }).then(
            (b) => `bytes:${String(b)}`,
            (e) => e.name as string,
          ),
        ),
      ),
    )
    await ok(p, id, 'kill $(cat swapper.pid)')
    // Each one got the file, or a typed refusal: never a hang. A file replaced while it was read
    // (its link count, and so its change time, moved) is FILE_CHANGED.
    const typed = [
      'bytes:data\n',
      'SandboxNotRegularFileError',
      'SandboxFileNotFoundError',
      'SandboxFileChangedError',
      'SandboxError',
    ]
    for (const o of new Set(outcomes)) {
      expect(typed).toContain(o)
    }
    expect(ms).toBeLessThan(30_000)
    expect(await ok(p, id, 'echo alive')).toBe('alive\n')
    await p.uploadFile({ sandboxId: id, remotePath: 'after.txt', content: Buffer.from('after') })
    expect(String(await p.downloadFile({ sandboxId: id, path: 'after.txt' }))).toBe('after')
    // The engine itself answers for this container.
    expect(inspectContainer(containerNameFor(namespace, id)).State.Running).toBe(true)
  })

  test("a forged end-of-command marker is only output: the exit code is the command's own", async () => {
    // The marker the engine-exec wrapper looks for, with the token it puts in the environment.
    const { value, ms } = await timed(() =>
      run(p, id, `printf '\\036TFX%s:x:0\\036\\n' "$TRUEFORGE_EXEC_ID"; sleep 1; echo after; exit 3`),
    )
    expect(value.exitCode).toBe(3)
    expect(value.result).toMatch(/TFX.*:x:0/)
    expect(value.result).toMatch(/after\n$/)
    expect(ms).toBeGreaterThanOrEqual(1000)
  })

  // Each one leaves the command's process group and hides from a search by environment.
  test.each([
    ['setsid', 'setsid sleep 3001 >/dev/null 2>&1 &', /sleep 3001/],
    ['setsid and env -i', 'setsid env -i /bin/sleep 3002 >/dev/null 2>&1 &', /sleep 3002/],
    ['setsid and env -u', 'setsid env -u TRUEFORGE_EXEC_ID sleep 3003 >/dev/null 2>&1 &', /sleep 3003/],
    ['a double fork, (cmd &)', "(setsid sh -c 'exec env -i sleep 3004' >/dev/null 2>&1 &)", /sleep 3004/],
    [
      'a non-dumpable process',
      `setsid python3 -c 'import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); time.sleep(3005)' >/dev/null 2>&1 &`,
      /time\.sleep\(3005\)/,
    ],
  ])('a timeout kills what escaped with %s, and says so only once it is gone', async (_what, escape, re) => {
    const r = await run(p, id, `${escape}\nsleep 60`, { timeoutSeconds: 1.5 })
    expect(r.exitCode).toBe(124)
    expect(r.result).toMatch(/\[timed out after 1\.5 s: the command and every process it started were killed\]$/)
    expect(processes(id, re)).toEqual([])
  })

  test('idle stop cannot be faked by touching /trueforge/.activity or naming a process trueforge-exec', async () => {
    const q = provider({ autoStopIntervalInMinutes: 0.05 })
    const sb = await tracker.create(q)
    const name = containerNameFor(namespace, sb)
    // Every trick a non-root workload has, kept up in the background.
    await ok(
      q,
      sb,
      `nohup bash -c 'exec -a trueforge-exec bash -c "while :; do touch /trueforge/.activity /tmp/.trueforge-agent-activity 2>/dev/null; sleep 0.3; done"' >/dev/null 2>&1 &`,
    )
    expect(processes(sb, /trueforge-exec/).length).toBeGreaterThan(0)
    await waitFor(async () => inspectContainer(name).State.Running === false, 20_000, 'the idle sandbox to stop')
    // A command through the agent is activity: it runs longer than the idle interval.
    expect(await ok(q, sb, 'sleep 6 && echo kept', { timeoutSeconds: 30 })).toBe('kept\n')
    expect(inspectContainer(name).State.Running).toBe(true)
  })
})

// gVisor's ptrace platform counts its own host threads and stub processes against the pids
// limit: at 64 the sandbox dies before it starts.
;(onRunsc ? test.skip : test)(
  'a fork bomb that outlives its exec: the next command runs (the agent killed the workload) and says so (skipped on runsc: a pids limit of 64 stops the gVisor sandbox itself)',
  async () => {
    const p = provider({ image: DEBIAN, resources: { pidsLimit: 64 } })
    const id = await tracker.create(p)
    await ok(p, id, 'echo kept > before.txt')
    const containerId = inspectContainer(containerNameFor(namespace, id)).Id as string
    // A bomb that keeps every process it makes: once it has them all, nothing else can fork.
    // bash, not dash: dash exits at its first failed fork and leaves a pid free, while bash
    // tries again, so no pid stays free (the next command, under the spare shepherd the agent
    // keeps, needs only one).
    await ok(p, id, "nohup bash -c 'while :; do sleep 1000 & done' >/dev/null 2>&1 &")
    // The host's count of the container's pids reaches the limit.
    const pids = () => Number(readFileSync(`/sys/fs/cgroup/pids/docker/${containerId}/pids.current`, 'utf8').trim())
    await waitFor(async () => pids() >= 64, 20_000, 'the bomb to fill the pids cgroup')
    await sleep(500)
    const r = await run(p, id, 'cat before.txt', { timeoutSeconds: 30 })
    expect(r.exitCode).toBe(0)
    expect(r.result).toMatch(/^kept\n\[the sandbox had run out of processes: the agent killed \d+ processes .+\]$/)
    expect(await ok(p, id, 'echo fine')).toBe('fine\n')
  },
)

describe('the agent itself', () => {
  const p = provider({ image: BUSYBOX })
  let id: string

  beforeAll(async () => {
    id = await tracker.create(p)
  })

  test('killed mid-command: that call fails with a typed error, the next starts a new agent', async () => {
    const before = await agentOf(p, id)
    const call = p.exec({ sandboxId: id, command: 'sleep 5; echo done > finished.txt; echo done', timeoutSeconds: 30 })
    await sleep(500)
    expect(asRoot(id, `kill -9 ${before.pid}`).status).toBe(0)
    const r = await call
    expect(r).toEqual({ success: false, error: expect.stringMatching(/agent ended while the call was in flight/) })
    // The command died with its agent: it never finished.
    await sleep(5000)
    expect(asRoot(id, 'cat /workspace/*/finished.txt 2>&1').status).not.toBe(0)
    expect(await ok(p, id, 'echo back')).toBe('back\n')
    expect((await agentOf(p, id)).pid).not.toBe(before.pid)
  })

  test('stopped (SIGSTOP) by a root workload: an exec returns by its timeout plus a few seconds and says what it could not verify; the next call gets a new agent; the stopped ones, continued, run nothing late', async () => {
    const first = await agentOf(p, id)
    // Busybox sandboxes run commands as root, so a command can stop the agent serving it.
    const inFlight = await timed(() =>
      p.exec({ sandboxId: id, command: `kill -STOP ${first.pid}; sleep 3011`, timeoutSeconds: 3 }),
    )
    expect(inFlight.ms).toBeLessThan(3000 + 8000)
    expect(inFlight.value).toEqual({
      success: false,
      error: expect.stringMatching(/agent ended while the call was in flight/),
    })
    const error = (inFlight.value as { error: string }).error
    expect(error).toMatch(/answered nothing .* past the command's 3 s timeout/)
    expect(error).toMatch(/not verified.*may still be running/)
    expect(asRoot(id, `cat /proc/${first.pid}/stat`).stdout).toMatch(/^\d+ \(.*\) T /)
    // The command's supervisor is not the agent: it killed the command at its timeout.
    await waitFor(() => processes(id, /sleep 3011/).length === 0, 10_000, 'the timed-out command to be killed')
    expect(await ok(p, id, 'echo back')).toBe('back\n')
    const second = await agentOf(p, id)
    expect(second.pid).not.toBe(first.pid)

    // Stopped between calls: the call sent to it fails by its deadline too.
    expect(asRoot(id, `kill -STOP ${second.pid}`).status).toBe(0)
    const sent = await timed(() => p.exec({ sandboxId: id, command: 'echo late > late.txt', timeoutSeconds: 3 }))
    expect(sent.ms).toBeLessThan(3000 + 8000)
    expect(sent.value).toEqual({ success: false, error: expect.stringMatching(/not verified/) })
    expect(await ok(p, id, 'echo served')).toBe('served\n')
    // Continued, each reads the request it was sent, its cancel and its closed stdin, and exits.
    expect(asRoot(id, `kill -CONT ${first.pid} ${second.pid}`).status).toBe(0)
    const gone = `test ! -e /proc/${first.pid} && test ! -e /proc/${second.pid}`
    await waitFor(() => asRoot(id, gone).status === 0, 10_000, 'the continued agents to exit')
    expect(asRoot(id, `ls ${id}/late.txt 2>&1`).status).not.toBe(0)
    expect(await ok(p, id, 'echo again')).toBe('again\n')
  })

  test("its command's supervisor stopped by a root workload: the call is given up by the timeout plus 8 s and says so; the agent serves on; continued, the supervisor kills the command", async () => {
    const stopped = await timed(() =>
      p.exec({
        sandboxId: id,
        command: 'echo $PPID > supervisor.pid; kill -STOP $PPID; sleep 3021',
        timeoutSeconds: 3,
      }),
    )
    expect(stopped.ms).toBeLessThan(3000 + 8000 + 4000)
    expect(stopped.value).toEqual({
      success: false,
      error: expect.stringMatching(
        /agent still answers .* command cancelled, but its end is not verified: it may still be running/,
      ),
    })
    expect(processes(id, /sleep 3021/)).toHaveLength(1)
    expect(await ok(p, id, 'echo fine')).toBe('fine\n')
    expect(asRoot(id, `kill -CONT $(cat ${id}/supervisor.pid)`).status).toBe(0)
    await waitFor(
      () => processes(id, /sleep 3021/).length === 0,
      10_000,
      'the continued supervisor to kill the command',
    )
  })

  test('a command runs under a spare shepherd the agent kept ready, which takes the next command only if this one left nothing running', async () => {
    const agent = await agentOf(p, id)
    // `<agent binary> shepherd <flags> <name>`, a child of the agent.
    const spares = () =>
      processes(id, /\/trueforge-agent-\S+ shepherd \d /)
        .map((l) => l.split(' ')[0])
        .filter((pid) => asRoot(id, `cat /proc/${pid}/stat`).stdout.split(') ')[1]?.split(' ')[1] === String(agent.pid))
    await ok(p, id, 'true')
    await waitFor(() => spares().length >= 1, 10_000, 'a spare shepherd')
    const ready = spares()
    // The shepherd is the command's parent; its command left nothing, so it waits again where
    // it is a subreaper (would be the parent of anything left). Under gVisor, which has no
    // subreaper, it ends, and another waits in its place.
    const used = (await ok(p, id, 'echo $PPID')).trim()
    expect(ready).toContain(used)
    if (agent.subreaper) expect(spares()).toContain(used)
    else await waitFor(() => spares().length >= 1 && !spares().includes(used), 10_000, 'the next spare')
    // One whose command left a process running ends, as before: that process is not the next
    // command's.
    const left = (await ok(p, id, 'sleep 3031 >/dev/null 2>&1 & echo $PPID')).trim()
    await waitFor(() => asRoot(id, `test -e /proc/${left}`).status !== 0, 10_000, 'the shepherd to end')
    expect(spares()).not.toContain(left)
    await waitFor(() => processes(id, /sleep 3031/).length === 1, 10_000, 'the command left behind')
    const sleeping = processes(id, /sleep 3031/)
    expect(asRoot(id, `kill ${sleeping[0].split(' ')[0]}`).status).toBe(0)
    // What a spare runs, fresh or reused, is the command as a forked shepherd would: its user,
    // directory, environment, exit code and output.
    for (let i = 0; i < 2; i++) {
      const r = await run(p, id, 'echo "$(id -u) $(pwd) $FOO"; echo err >&2; exit 7', { env: { FOO: 'bar' } })
      expect(r).toEqual(expect.objectContaining({ exitCode: 7, result: `0 ${id} bar\nerr\n` }))
    }
  })

  test('commands one after another each find a spare shepherd ready or on its way, not a fork of the agent', async () => {
    // The next spare starts when a command takes one, and a command that comes while it is
    // still starting waits for it. A spare started only once the answer was sent was not ready
    // for a third of a loop's commands on runc, and for most of them under gVisor.
    await ok(p, id, 'true')
    const parents: string[] = []
    for (let i = 0; i < 20; i++) parents.push(await ok(p, id, `tr '\\0' ' ' < /proc/$PPID/cmdline`))
    // Each command's parent is a shepherd: the agent's binary, as a spare or as a fork.
    expect(parents.filter((c) => !/trueforge-agent/.test(c))).toEqual([])
    const forked = parents.filter((c) => !/ shepherd \d+ /.test(c))
    // A spare that starts far slower than the ones before it (a loaded machine) is not waited
    // for past twice their time: a few forks are allowed, a loop of them is not.
    expect(forked.length <= 4 ? [] : forked).toEqual([])
  })

  test('a second server process starts its own agent and reaches the sandbox as fast', async () => {
    const script = `
      const { DockerSandboxProvider } = require(${JSON.stringify(require.resolve('..'))})
      const p = new DockerSandboxProvider({ image: ${JSON.stringify(BUSYBOX)}, namespace: ${JSON.stringify(namespace)}, network: 'none' })
      ;(async () => {
        const id = ${JSON.stringify(id)}
        await p.exec({ sandboxId: id, command: 'true' })
        const ms = []
        for (let i = 0; i < 20; i++) { const t = process.hrtime.bigint(); await p.exec({ sandboxId: id, command: 'true' }); ms.push(Number(process.hrtime.bigint() - t) / 1e6) }
        ms.sort((a, b) => a - b)
        console.log(JSON.stringify({ status: await p.agentStatus(id), p50: ms[10] }))
        await p.dispose()
      })().catch((e) => { console.error(e); process.exit(1) })
    `
    const out = await new Promise<string>((resolve, reject) => {
      const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] })
      let text = ''
      child.stdout.on('data', (d) => (text += d))
      child.on('exit', (code) => (code === 0 ? resolve(text) : reject(new Error(`child exited ${code}`))))
    })
    const { status, p50 } = JSON.parse(out.trim().split('\n').pop()!)
    const mine = await agentOf(p, id)
    expect(status.mode).toBe('agent')
    expect(status.pid).not.toBe(mine.pid)
    // Its agent links to it too, through the sandbox's same directory.
    expect(status.linked).toBe(!onRunsc)
    // gVisor's ptrace platform makes every exec cost 30-60 ms, whoever started the agent.
    expect(p50).toBeLessThan(onRunsc ? 150 : 20)
  })

  test('a sandbox whose container is removed: its agent connection goes with it', async () => {
    const q = provider({ image: BUSYBOX })
    const sb = await tracker.create(q)
    await agentOf(q, sb)
    expect(await q.removeSandbox(sb)).toBe(true)
    const e = await rejection(q.exec({ sandboxId: sb, command: 'true' }))
    expect(e.name).toBe('SandboxNotAvailableError')
  })
})

describe('the agent linked to this process', () => {
  // gVisor's sandboxes cannot reach a socket of the host: under runtime runsc none gets a link.
  const linking = onRunsc ? test.skip : test
  const underGvisor = onRunsc ? test : test.skip
  /** The host directory a sandbox mounts at /.trueforge-link, with how it is mounted. */
  function linkMount(sandboxId: string): { Source: string; RW: boolean } | undefined {
    const mounts = inspectContainer(containerNameFor(namespace, sandboxId)).Mounts as any[]
    return mounts.find((m) => m.Destination === '/.trueforge-link')
  }

  linking(
    "a sandbox on a local engine mounts a directory of its own, read-only, and its agent's frames bypass the engine",
    async () => {
      const p = provider({ image: BUSYBOX, user: '65534:65534' })
      const id = await tracker.create(p)
      expect(await ok(p, id, 'echo linked')).toBe('linked\n')
      const m = linkMount(id)!
      expect(m.RW).toBe(false)
      expect(m.Source).toMatch(/\/trueforge-link-\d+\/[0-9a-f]{16}\/[0-9A-Z]{26}$/)
      const dir = statSync(m.Source)
      expect([dir.mode & 0o777, dir.uid]).toEqual([0o700, process.getuid!()])
      expect((await agentOf(p, id)).linked).toBe(true)
      // The socket's file goes once the agent has connected (or given up).
      expect(readdirSync(m.Source)).toEqual([])
      // The sandbox's user cannot look inside.
      const look = await run(p, id, 'ls /.trueforge-link 2>&1')
      expect([look.exitCode, look.result]).toEqual([1, expect.stringMatching(/Permission denied/)])
      expect(await p.removeSandbox(id)).toBe(true)
      expect(existsSync(m.Source)).toBe(false)
    },
  )

  linking(
    'an agent whose link directory is gone serves on its exec stream; the next start makes the directory again',
    async () => {
      const p = provider({ image: BUSYBOX })
      const id = await tracker.create(p)
      const first = await agentOf(p, id)
      const dir = linkMount(id)!.Source
      rmSync(dir, { recursive: true })
      expect(asRoot(id, `kill -9 ${first.pid}`).status).toBe(0)
      await waitFor(
        async () => (await p.agentStatus(id)).mode === 'agent' && (await agentOf(p, id)).pid !== first.pid,
        20_000,
        'a new agent',
      )
      expect((await agentOf(p, id)).linked).toBe(false)
      expect(await ok(p, id, 'echo unlinked')).toBe('unlinked\n')
      // Stopped, then started by the next call: a mount whose source is gone would fail the start.
      docker(['stop', '-t', '1', containerNameFor(namespace, id)])
      expect(await ok(p, id, 'echo again')).toBe('again\n')
      expect(existsSync(dir)).toBe(true)
      expect((await agentOf(p, id)).linked).toBe(true)
    },
  )

  linking('agentLink: false: sandboxes are made without a link, their agents on the exec stream', async () => {
    const p = provider({ image: BUSYBOX, agentLink: false })
    const id = await tracker.create(p)
    expect(linkMount(id)).toBeUndefined()
    expect(await ok(p, id, 'echo plain')).toBe('plain\n')
    expect((await agentOf(p, id)).linked).toBe(false)
  })

  underGvisor('under runtime runsc a sandbox gets no link, and its agent serves on the exec stream', async () => {
    const p = provider({ image: BUSYBOX })
    const id = await tracker.create(p)
    expect(linkMount(id)).toBeUndefined()
    expect(await ok(p, id, 'echo plain')).toBe('plain\n')
    expect((await agentOf(p, id)).linked).toBe(false)
  })
})

describe('sandboxes made without the agent', () => {
  test('made by a provider with agent: false (as an earlier version made them), used through the agent: the binary is placed, root-owned', async () => {
    const old = provider({ image: BUSYBOX, agent: false, autoStopIntervalInMinutes: 0.05 })
    const id = await tracker.create(old)
    const info = inspectContainer(containerNameFor(namespace, id))
    expect(info.Mounts ?? []).toEqual([])
    expect(await old.agentStatus(id)).toEqual({ mode: 'engine-exec', reason: 'the `agent` option is false' })
    expect(old.createCodeModeTransport().getClientInstall({ sandboxId: id }).pathBinSymlink).toBeUndefined()

    const now = provider({ image: BUSYBOX, autoStopIntervalInMinutes: 0.05 })
    const st = await agentOf(now, id)
    expect(st.path).toMatch(/^\/\.trueforge-agent\/[0-9.]+-[0-9a-f]{12}\/trueforge-agent-(x86_64|aarch64)$/)
    const placed = `/.trueforge-agent ${st.path.replace(/\/[^/]+$/, '')} ${st.path}`
    // find where stat fails: gVisor (runsc 20221219) answers GNU coreutils' statx with EINVAL.
    expect(
      asRoot(id, `stat -c '%u %a' ${placed} 2>/dev/null || find ${placed} -maxdepth 0 -printf '%U %m\\n'`).stdout,
    ).toBe('0 755\n0 755\n0 755')
    expect(await ok(now, id, 'echo through-agent')).toBe('through-agent\n')
    await now.uploadFile({ sandboxId: id, remotePath: 'f.txt', content: Buffer.from('ok') })
    expect(String(await now.downloadFile({ sandboxId: id, path: 'f.txt' }))).toBe('ok')
    // Its old init counts /trueforge/.activity: a long command through the agent keeps it alive.
    expect(await ok(now, id, 'sleep 6 && echo alive', { timeoutSeconds: 30 })).toBe('alive\n')
    expect(inspectContainer(containerNameFor(namespace, id)).State.Running).toBe(true)
  })

  test('one with a read-only root and no agent volume keeps the engine endpoints, with one warning', async () => {
    const old = provider({ image: BUSYBOX, agent: false, readOnlyRootfs: true })
    const id = await tracker.create(old)
    const warnings: unknown[] = []
    const logger = { debug() {}, info() {}, error() {}, warn: (m: string, meta: unknown) => warnings.push({ m, meta }) }
    const now = provider({ image: BUSYBOX, readOnlyRootfs: true, logger })
    expect(await ok(now, id, 'echo fallback')).toBe('fallback\n')
    expect(await ok(now, id, 'echo again')).toBe('again\n')
    await now.uploadFile({ sandboxId: id, remotePath: 'f.txt', content: Buffer.from('ok') })
    expect(String(await now.downloadFile({ sandboxId: id, path: 'f.txt' }))).toBe('ok')
    const st = await now.agentStatus(id)
    expect(st).toEqual({ mode: 'engine-exec', reason: expect.stringMatching(/read-only/) })
    expect(warnings).toEqual([
      { m: expect.stringMatching(/agent cannot run here/), meta: expect.objectContaining({ sandboxId: id }) },
    ])
  })
})

describe('every kind of sandbox is served by the agent', () => {
  async function served(p: Provider, id: string): Promise<void> {
    expect((await agentOf(p, id)).mode).toBe('agent')
    expect(await ok(p, id, 'echo hi')).toBe('hi\n')
    await p.uploadFile({ sandboxId: id, remotePath: 'k.bin', content: Buffer.from([0, 1, 2, 255]) })
    expect([...(await p.downloadFile({ sandboxId: id, path: 'k.bin' }))]).toEqual([0, 1, 2, 255])
  }

  test("network 'none' with a read-only root: the agent volume mounts there too", async () => {
    const p = provider({ image: BUSYBOX, readOnlyRootfs: true })
    const id = await tracker.create(p)
    await served(p, id)
    expect((await run(p, id, 'touch /etc/x')).exitCode).not.toBe(0)
    // A link planted to reach the read-only root writes nothing there.
    await ok(p, id, 'ln -sfn /etc d_etc')
    expect(
      (await rejection(p.uploadFile({ sandboxId: id, remotePath: 'd_etc/x', content: Buffer.from('x') }))).name,
    ).toBe('SandboxInvalidPathError')
    docker(['restart', '-t', '1', containerNameFor(namespace, id)])
    expect(asRoot(id, 'ls /etc/x 2>&1').status).not.toBe(0)
  })

  test('a non-root user option', async () => {
    const p = provider({ image: DEBIAN, user: '1000:1000' })
    const id = await tracker.create(p)
    await served(p, id)
    expect(await ok(p, id, "id -u; find k.bin -printf '%U\\n'")).toBe('1000\n1000\n')
  })

  test('a warm-pool member comes with its agent running: the first exec is immediate', async () => {
    const p = provider({ image: BUSYBOX, warmPool: { size: 1 } })
    await p.warmUp()
    await waitFor(
      async () =>
        docker([
          'ps',
          '-q',
          '--filter',
          `label=trueforge.sandbox.namespace=${namespace}`,
          '--filter',
          'label=trueforge.sandbox.pool',
        ]) !== '',
      60_000,
      'a pool member',
    )
    await sleep(1000)
    const { sandboxId } = await p.createSandbox()
    tracker.ids.add(sandboxId)
    expect(
      inspectContainer(containerNameFor(namespace, sandboxId)).Config.Labels['trueforge.sandbox.pool'],
    ).toBeDefined()
    const { ms } = await timed(() => ok(p, sandboxId, 'true'))
    // An exec through the agent costs 30-60 ms under gVisor's ptrace platform, a started one or not.
    expect(ms).toBeLessThan(onRunsc ? 150 : 50)
    await served(p, sandboxId)
  })

  test('a remote engine over TCP (loopback): the agent runs over the attached exec stream', async () => {
    const server: Server = createServer((client) => {
      const upstream = createConnection(engineSocket())
      client.pipe(upstream).pipe(client)
      client.on('error', () => upstream.destroy())
      upstream.on('error', () => client.destroy())
    })
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
    try {
      const p = provider({ image: BUSYBOX, dockerHost: `tcp://127.0.0.1:${(server.address() as any).port}` })
      const id = await tracker.create(p)
      await served(p, id)
    } finally {
      server.close()
    }
  })

  test('agent: false runs everything through the engine endpoints, as before', async () => {
    const p = provider({ image: BUSYBOX, agent: false })
    const id = await tracker.create(p)
    expect(await p.agentStatus(id)).toEqual({ mode: 'engine-exec', reason: 'the `agent` option is false' })
    expect(await ok(p, id, 'echo plain')).toBe('plain\n')
    expect(processes(id, /trueforge-agent/)).toEqual([])
  })
})
