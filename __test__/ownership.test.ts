// Only our containers are ever touched (issue 20, item 1), and the leases failed pulls leave are
// seen and removable (item 9), on real engines.
//
// Bystanders are containers carrying our labels that are not ours to remove: forged
// `trueforge.sandbox.*` labels on names that do not derive from them (stopped and running), copies
// made with `docker commit` of a sandbox then `docker create`/`run` (they inherit the labels, not
// the name), running containers with the probe labels in another namespace, and canary sandboxes
// in another namespace. Every destructive path runs with a witness it must remove (a stale
// sandbox, a probe a crash left, a stale lease), so it is seen to have run, and then every
// bystander must be there, in the same state, with the same id.
//
// The main engine is shared with other test runs: the paths that act on the whole engine
// (`rm --stopped --all-namespaces`, `rm --image-work`, the GPU lock, leases that look hours old,
// which any reaper on the engine may remove) run on an engine of our own,
// scripts/engines/scratch-engine.sh, which has no network (sandboxes there use `network: 'none'`).

import { spawnSync } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'

import { DockerSandboxProvider, reapSandboxes } from '..'
import {
  BUSYBOX,
  cleanupNamespace,
  containerNameFor,
  dockerTry,
  LABEL_CREATED_AT,
  LABEL_ID,
  LABEL_MANAGED_BY,
  LABEL_NAMESPACE,
  LABEL_TEST_NAMESPACE,
  MANAGED_BY,
  randomUlid,
  sleep,
  uniqueNamespace,
  waitFor,
} from './helpers'
import { ensureRegistries, pollUntil, PLAIN, repoName } from './images/support'

jest.setTimeout(120_000)

const ROOT = path.resolve(__dirname, '..')
const CLI = path.join(ROOT, 'cli', 'index.js')
const SCRATCH = path.join(ROOT, 'scripts', 'engines', 'scratch-engine.sh')
const SCRATCH_HOST = 'unix:///var/run/docker-scratch.sock'
const LABEL_PROBE = 'trueforge.sandbox.probe'
const LABEL_IMAGEWORK = 'trueforge.sandbox.imagework'
const LABEL_POOL = 'trueforge.sandbox.pool'
const LABEL_GPUS = 'trueforge.sandbox.gpus'
const LABEL_GPU_LOCK = 'trueforge.sandbox.gpu-lock'
const LABEL_GPU_LOCK_AT = 'trueforge.sandbox.gpu-lock-at'
/** `autoDeleteIntervalInMinutes` of one second. */
const TINY = 1 / 60
const HOUR = 3600_000

const namespace = uniqueNamespace('t-own')
const other = uniqueNamespace('t-own-canary')
const tmp = mkdtempSync(path.join(tmpdir(), 'tf-own-'))
const images: string[] = []
const providers: DockerSandboxProvider[] = []

// ---- engines and the CLI ----

/** The docker CLI against `host` (the main engine when undefined); throws with stderr. */
function dk(host: string | undefined, args: string[]): string {
  const r = spawnSync('docker', host ? ['-H', host, ...args] : args, { encoding: 'utf8', timeout: 60_000 })
  if (r.status !== 0) throw new Error(`docker ${args.join(' ')} failed: ${r.stderr}`)
  return r.stdout.trim()
}

function cli(args: string[]) {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 90_000 })
  return { code: r.status, stdout: r.stdout, stderr: r.stderr }
}

function provider(options: Record<string, unknown>): DockerSandboxProvider {
  const p = new DockerSandboxProvider({ image: BUSYBOX, namespace, autoDeleteIntervalInMinutes: 0, ...options })
  providers.push(p)
  return p
}

// ---- names the addon derives (src/util/ids.rs, src/images/work.rs) ----

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ'

/** A ULID made at `ms`, as a process would have made it then. */
function ulidAt(ms: number): string {
  let time = ''
  for (let i = 0, t = ms; i < 10; i++, t = Math.floor(t / 32)) time = CROCKFORD[t % 32] + time
  const rnd = randomBytes(16)
  return time + [...rnd].map((b) => CROCKFORD[b % 32]).join('')
}

const probeName = (ns: string, ulid: string) => `trueforge-${ns}.probe-${ulid.toLowerCase()}`
const leaseName = (image: string) =>
  `trueforge-imagework-${createHash('sha256').update(image).digest('hex').slice(0, 32)}`
const randomId = () => `/workspace/${randomUlid()}`

// ---- containers made with the CLI ----

type State = 'created' | 'exited' | 'running'
interface Made {
  name: string
  id: string
  state: State
  host?: string
}

/** Our labels for a sandbox `sandboxId` of `ns`, as our creates set them. */
function ours(ns: string, sandboxId: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    [LABEL_MANAGED_BY]: MANAGED_BY,
    [LABEL_NAMESPACE]: ns,
    [LABEL_ID]: sandboxId,
    [LABEL_CREATED_AT]: new Date().toISOString(),
    ...extra,
  }
}

/** A container named `name` with `labels`, left `state`; the test's namespace label added for cleanup. */
function make(
  name: string,
  labels: Record<string, string>,
  state: State,
  o: { host?: string; image?: string; entrypoint?: string } = {},
): Made {
  const labelArgs = Object.entries({ ...labels, [LABEL_TEST_NAMESPACE]: namespace }).flatMap(([k, v]) => [
    '--label',
    `${k}=${v}`,
  ])
  const cmd = state === 'running' ? ['sleep 600'] : ['true']
  const head = state === 'created' ? ['create'] : ['run', '-d']
  const entry = ['--entrypoint', o.entrypoint ?? '/bin/sh']
  dk(o.host, [...head, '--name', name, '--network', 'none', ...labelArgs, ...entry, o.image ?? BUSYBOX, '-c', ...cmd])
  if (state === 'exited') dk(o.host, ['wait', name])
  return { name, id: dk(o.host, ['inspect', '-f', '{{.Id}}', name]), state, host: o.host }
}

/** `name id state` of each container now ("… gone" when it is not there). */
function now(made: Made[]): string[] {
  return made.map((m) => {
    const r = spawnSync(
      'docker',
      [...(m.host ? ['-H', m.host] : []), 'inspect', '-f', '{{.Id}} {{.State.Status}}', m.name],
      {
        encoding: 'utf8',
      },
    )
    return r.status === 0 ? `${m.name} ${r.stdout.trim()}` : `${m.name} gone`
  })
}

const was = (made: Made[]) => made.map((m) => `${m.name} ${m.id} ${m.state}`)

function gone(name: string, host?: string): boolean {
  return spawnSync('docker', [...(host ? ['-H', host] : []), 'inspect', name], { encoding: 'utf8' }).status !== 0
}

/** Writes an image-work record into a lease-like container (as its holder would). */
function writeRecord(name: string, record: { state: string; beatMs: number; reason?: string }, host?: string): void {
  const file = path.join(tmp, `${name}.json`)
  writeFileSync(
    file,
    JSON.stringify({ kind: 'pull', progress: '', reason: record.reason ?? null, holder: 'tf-test-host:1', ...record }),
  )
  dk(host, ['cp', file, `${name}:/lease.json`])
}

/** A lease as a crashed or failed process leaves it: never started, named after `image`. */
function lease(image: string, record: { state: string; beatMs: number; reason?: string }, host?: string): Made {
  const m = make(leaseName(image), { [LABEL_MANAGED_BY]: MANAGED_BY, [LABEL_IMAGEWORK]: image }, 'created', { host })
  writeRecord(m.name, record, host)
  return m
}

/** A probe as a process that crashed `ageMs` ago leaves it (stopped) in `ns`. */
function leftProbe(ns: string, ageMs: number, state: State = 'created', host?: string): Made {
  const ulid = ulidAt(Date.now() - ageMs)
  return make(
    probeName(ns, ulid),
    { [LABEL_MANAGED_BY]: MANAGED_BY, [LABEL_NAMESPACE]: ns, [LABEL_PROBE]: ulid },
    state,
    { host },
  )
}

/** A real sandbox of `p`, stopped a little over a second ago (stale for `TINY`). */
async function staleSandbox(p: DockerSandboxProvider, ns = namespace, host?: string): Promise<string> {
  const { sandboxId } = await p.createSandbox()
  dk(host, ['stop', '-t', '1', containerNameFor(ns, sandboxId)])
  await sleep(1200)
  return sandboxId
}

// ---- the bystanders on the main engine ----

const bystanders: Made[] = []
let canaryRunning = ''
let canaryStopped = ''
/** A real sandbox of `namespace` that the commits copy; `rm <id>` removes it in the end. */
let source = ''
let forgedIds: string[] = []

beforeAll(async () => {
  ensureRegistries()
  const canary = provider({ namespace: other })
  canaryRunning = (await canary.createSandbox()).sandboxId
  canaryStopped = (await canary.createSandbox()).sandboxId
  dk(undefined, ['stop', '-t', '1', containerNameFor(other, canaryStopped)])
  const main = provider({})
  source = (await main.createSandbox()).sandboxId
  const commit = `tf-own-commit-${namespace}:1`
  images.push(commit)
  dk(undefined, ['commit', containerNameFor(namespace, source), commit])
  const old = Date.now() - HOUR
  const exited = make(`tf-own-forged-exited-${namespace}`, ours(namespace, randomId()), 'exited')
  const created = make(`tf-own-forged-created-${namespace}`, ours(namespace, randomId()), 'created')
  const running = make(`tf-own-forged-running-${namespace}`, ours(namespace, randomId()), 'running')
  forgedIds = [exited, created, running].map(
    (m) => JSON.parse(dk(undefined, ['inspect', m.name]))[0].Config.Labels[LABEL_ID],
  )
  bystanders.push(
    exited,
    created,
    running,
    // Copies of a sandbox through its image: its labels (namespace, id), a name of their own.
    make(`tf-own-committed-${namespace}`, {}, 'created', { image: commit }),
    make(`tf-own-committed-exited-${namespace}`, {}, 'exited', { image: commit }),
    make(`tf-own-committed-running-${namespace}`, {}, 'running', { image: commit }),
    // The probe labels on running containers of another namespace: as probes used to be
    // labelled, and as they are now (under the name they derive).
    make(
      `tf-own-probe-old-${namespace}`,
      { [LABEL_MANAGED_BY]: MANAGED_BY, [LABEL_PROBE]: '1', [LABEL_NAMESPACE]: other },
      'running',
    ),
    leftProbe(other, HOUR, 'running'),
    // A probe of another namespace a crash left: its own namespace's reaper's, not ours.
    leftProbe(other, HOUR, 'exited'),
    // Ours by name and labels, but running: never removed.
    leftProbe(namespace, HOUR, 'running'),
    // A stopped copy of an old probe under another name.
    make(
      `tf-own-probe-copy-${namespace}`,
      { [LABEL_MANAGED_BY]: MANAGED_BY, [LABEL_NAMESPACE]: namespace, [LABEL_PROBE]: ulidAt(old) },
      'exited',
    ),
    // A lease that failed a moment ago: the reaper leaves it an hour, so every process reports why.
    lease(repoName(PLAIN, namespace, 'fresh-failure') + ':1', {
      state: 'failed',
      beatMs: Date.now(),
      reason: 'forged failure',
    }),
    { name: containerNameFor(other, canaryRunning), id: '', state: 'running' },
    { name: containerNameFor(other, canaryStopped), id: '', state: 'exited' },
  )
  for (const b of bystanders) if (!b.id) b.id = dk(undefined, ['inspect', '-f', '{{.Id}}', b.name])
  expect(now(bystanders)).toEqual(was(bystanders))
}, 180_000)

afterAll(async () => {
  await Promise.all(providers.map((p) => p.dispose()))
  cleanupNamespace(namespace)
  cleanupNamespace(other)
  for (const i of images) dockerTry(['rmi', '-f', i])
  rmSync(tmp, { recursive: true, force: true })
})

describe('every destructive path on the main engine touches only what is ours', () => {
  test('reapStale() removes the stale sandbox and the probe a crash left, and nothing else', async () => {
    const p = provider({ autoDeleteIntervalInMinutes: TINY })
    const stale = await staleSandbox(p)
    const probe = leftProbe(namespace, HOUR)
    const { removed } = await p.reapStale()
    expect(now(bystanders)).toEqual(was(bystanders))
    for (const id of [...forgedIds, canaryRunning, canaryStopped, source]) expect(removed).not.toContain(id)
    expect(removed).toContain(stale)
    expect(gone(containerNameFor(namespace, stale))).toBe(true)
    expect(gone(probe.name)).toBe(true)
    await p.dispose()
  })

  test('the background reaper of a provider (tiny autoDeleteIntervalInMinutes) does the same', async () => {
    const maker = provider({})
    const stale = await staleSandbox(maker)
    const probe = leftProbe(namespace, HOUR)
    // Its first call starts the reaper, which runs at once.
    const p = provider({ autoDeleteIntervalInMinutes: TINY })
    await p.getImageBuildStatus()
    await waitFor(() => gone(containerNameFor(namespace, stale)), 30_000, 'the background reaper')
    expect(now(bystanders)).toEqual(was(bystanders))
    await waitFor(() => gone(probe.name), 5_000, 'the background reaper to remove the probe')
    await p.dispose()
  })

  test('reapSandboxes() does the same', async () => {
    const stale = await staleSandbox(provider({}))
    const probe = leftProbe(namespace, HOUR)
    const { removed } = await reapSandboxes({ namespace, olderThanMinutes: TINY })
    expect(now(bystanders)).toEqual(was(bystanders))
    expect(removed).toEqual([stale])
    expect(gone(probe.name)).toBe(true)
  })

  test('rm --stopped does the same', async () => {
    const stale = await staleSandbox(provider({}))
    const probe = leftProbe(namespace, HOUR)
    const r = cli(['rm', '--stopped', '--namespace', namespace, '--json'])
    expect(r.code).toBe(0)
    expect(now(bystanders)).toEqual(was(bystanders))
    expect(JSON.parse(r.stdout)).toEqual([{ sandboxId: stale, outcome: 'removed' }])
    expect(gone(probe.name)).toBe(true)
  })

  test('rm <id> and rm --all-namespaces <id> remove the sandbox, never the forged or committed containers with its id', async () => {
    // The committed copies carry the source sandbox's id; a twin with forged labels carries the other's.
    const second = (await provider({}).createSandbox()).sandboxId
    const twin = make(`tf-own-twin-${namespace}`, ours(namespace, second), 'running')
    const r = cli(['rm', '--namespace', namespace, '--json', source, ...forgedIds])
    expect(r.code).toBe(1)
    expect(JSON.parse(r.stdout)).toEqual([
      { sandboxId: source, outcome: 'removed' },
      ...forgedIds.map((sandboxId) => ({ sandboxId, outcome: 'not-found' })),
    ])
    const all = cli(['rm', '--all-namespaces', '--json', second, ...forgedIds])
    expect(JSON.parse(all.stdout)).toEqual([
      { sandboxId: second, outcome: 'removed' },
      ...forgedIds.map((sandboxId) => ({ sandboxId, outcome: 'not-found' })),
    ])
    expect([gone(containerNameFor(namespace, source)), gone(containerNameFor(namespace, second))]).toEqual([true, true])
    expect(now([...bystanders, twin])).toEqual(was([...bystanders, twin]))
  })

  test('the warm pool claims and refills only members it made; forged and committed members stay', async () => {
    const ns = uniqueNamespace('t-own-pool')
    const pooled = new DockerSandboxProvider({
      image: BUSYBOX,
      namespace: ns,
      network: 'none',
      warmPool: { size: 1 },
      autoDeleteIntervalInMinutes: 0,
    })
    providers.push(pooled)
    const members = () =>
      dk(undefined, [
        'ps',
        '--filter',
        `label=${LABEL_NAMESPACE}=${ns}`,
        '--filter',
        `label=${LABEL_POOL}`,
        '--format',
        '{{.Names}}',
      ])
        .split('\n')
        .filter((n) => /^trueforge-.*-pool$/.test(n))
    try {
      await pooled.warmUp()
      await waitFor(() => members().length === 1, 60_000, 'a warm pool member')
      const [member] = members()
      const info = JSON.parse(dk(undefined, ['inspect', member]))[0]
      const fp = info.Config.Labels[LABEL_POOL]
      const memberId = info.Config.Labels[LABEL_ID]
      const commit = `tf-own-pool-commit-${ns}:1`
      images.push(commit)
      dk(undefined, ['commit', member, commit])
      const forged = [
        make(`tf-own-forged-${ns}-pool`, ours(ns, randomId(), { [LABEL_POOL]: fp }), 'running'),
        make(`tf-own-forged-exited-${ns}-pool`, ours(ns, randomId(), { [LABEL_POOL]: fp }), 'exited'),
        make(`tf-own-pool-copy-${ns}`, {}, 'running', { image: commit }),
        make(`tf-own-pool-copy-exited-${ns}-pool`, {}, 'exited', { image: commit }),
      ]
      // Claims take the real members only, and each claim's refill makes a new one.
      const first = (await pooled.createSandbox()).sandboxId
      expect(first).toBe(memberId)
      await waitFor(() => members().length === 1, 60_000, 'the refill after the first claim')
      const [refilled] = members()
      const second = (await pooled.createSandbox()).sandboxId
      expect(containerNameFor(ns, second) + '-pool').toBe(refilled)
      await waitFor(() => members().length === 1, 60_000, 'the refill after the second claim')
      expect(now(forged)).toEqual(was(forged))
      expect(now(bystanders)).toEqual(was(bystanders))
    } finally {
      await pooled.dispose()
      cleanupNamespace(ns)
    }
  })
})

// ---- the engine of our own ----

describe('on an engine of our own: every namespace, the leases, the GPU lock and what GPU moves leave', () => {
  const host = SCRATCH_HOST
  const onScratch: DockerSandboxProvider[] = []
  const scratch = (options: Record<string, unknown>) => {
    const p = new DockerSandboxProvider({
      image: BUSYBOX,
      namespace,
      autoDeleteIntervalInMinutes: 0,
      dockerHost: host,
      network: 'none',
      ...options,
    })
    onScratch.push(p)
    return p
  }
  const image = (name: string) => repoName(PLAIN, namespace, name) + ':1'
  const held: Made[] = []

  beforeAll(() => {
    const r = spawnSync('bash', [SCRATCH, 'start'], { encoding: 'utf8', timeout: 120_000 })
    if (r.status !== 0) throw new Error(`scripts/engines/scratch-engine.sh start failed: ${r.stderr}`)
  }, 180_000)

  afterAll(async () => {
    await Promise.all(onScratch.map((p) => p.dispose()))
    spawnSync('bash', [SCRATCH, 'teardown'], { encoding: 'utf8', timeout: 120_000 })
  }, 180_000)

  test('rm --stopped --all-namespaces removes stopped sandboxes of every namespace, and only sandboxes', async () => {
    const mine = await staleSandbox(scratch({}), namespace, host)
    const theirs = await staleSandbox(scratch({ namespace: other }), other, host)
    const canary = (await scratch({ namespace: other }).createSandbox()).sandboxId
    const stay = [
      make(`tf-own-forged-exited-${namespace}`, ours(namespace, randomId()), 'exited', { host }),
      make(`tf-own-forged-running-${other}`, ours(other, randomId()), 'running', { host }),
      make(
        `tf-own-probe-old-${namespace}`,
        { [LABEL_MANAGED_BY]: MANAGED_BY, [LABEL_PROBE]: '1', [LABEL_NAMESPACE]: other },
        'running',
        { host },
      ),
      leftProbe(namespace, HOUR, 'running', host),
      { name: containerNameFor(other, canary), id: '', state: 'running' as State, host },
    ]
    stay[4].id = dk(host, ['inspect', '-f', '{{.Id}}', stay[4].name])
    const r = cli(['rm', '--stopped', '--all-namespaces', '--docker-host', host, '--json'])
    expect(r.code).toBe(0)
    expect(now(stay)).toEqual(was(stay))
    expect(
      JSON.parse(r.stdout)
        .map((x: any) => x.sandboxId)
        .sort(),
    ).toEqual([mine, theirs].sort())
  })

  test("the reaper and buildImage() remove only never-started leases under their image's name; a running one stays", async () => {
    const witness = lease(image('stale'), { state: 'failed', beatMs: Date.now() - 2 * HOUR, reason: 'forged' }, host)
    // A running container under a lease's name, with an old failed record: somebody's, not a lease.
    const runningImage = image('running')
    const running = make(
      leaseName(runningImage),
      { [LABEL_MANAGED_BY]: MANAGED_BY, [LABEL_IMAGEWORK]: runningImage },
      'running',
      { host },
    )
    writeRecord(running.name, { state: 'failed', beatMs: Date.now() - 2 * HOUR, reason: 'forged' }, host)
    // A stopped container with a lease's labels under another name.
    const copy = make(
      `tf-own-lease-copy-${namespace}`,
      { [LABEL_MANAGED_BY]: MANAGED_BY, [LABEL_IMAGEWORK]: image('copy') },
      'created',
      { host },
    )
    writeRecord(copy.name, { state: 'failed', beatMs: Date.now() - 2 * HOUR }, host)
    const fresh = lease(image('fresh'), { state: 'failed', beatMs: Date.now(), reason: 'forged' }, host)
    held.push(running, copy, fresh)
    await scratch({ autoDeleteIntervalInMinutes: TINY }).reapStale()
    expect(now(held)).toEqual(was(held))
    expect(gone(witness.name, host)).toBe(true)
    // buildImage() of the image whose lease name the running container holds: the pull runs
    // (and fails: nothing is reachable from this engine) without a lease; the container stays.
    const p = scratch({ image: runningImage })
    await p.buildImage()
    const { last } = await pollUntil(p, (b) => b.status !== 'pending', 60_000)
    expect(last.status).toBe('failed')
    expect(now(held)).toEqual(was(held))
  })

  test('rm --image-work removes the leases failed or dead pulls left, never one at work; ls and rm by name', async () => {
    const failed = image('failed')
    const p = scratch({ image: failed })
    await p.buildImage()
    const { last } = await pollUntil(p, (b) => b.status !== 'pending', 60_000)
    expect(last.status).toBe('failed')
    const real = {
      name: leaseName(failed),
      id: dk(host, ['inspect', '-f', '{{.Id}}', leaseName(failed)]),
      state: 'created' as State,
      host,
    }
    const old = lease(image('old'), { state: 'failed', beatMs: Date.now() - 2 * HOUR, reason: 'long ago' }, host)
    const silent = lease(image('silent'), { state: 'running', beatMs: Date.now() - 5 * 60_000 }, host)
    const busy = lease(image('busy'), { state: 'running', beatMs: Date.now() + 10 * 60_000 }, host)
    const ls = JSON.parse(cli(['ls', '--all-namespaces', '--docker-host', host, '--json']).stdout)
    const rows = ls.filter((r: any) => r.kind === 'image-work lease')
    expect(rows.map((r: any) => [r.container, r.state]).sort()).toEqual(
      [
        [real.name, 'failed'],
        [old.name, 'failed'],
        [silent.name, 'silent'],
        [busy.name, 'running'],
        // The fresh failed lease of the test before.
        [leaseName(image('fresh')), 'failed'],
      ].sort(),
    )
    expect(rows.find((r: any) => r.container === real.name)).toMatchObject({
      image: failed,
      work: 'pull',
      reason: expect.stringContaining(failed),
    })
    // With an age: only the old one.
    const aged = cli(['rm', '--image-work', '--older-than-minutes', '60', '--docker-host', host, '--json'])
    expect(JSON.parse(aged.stdout)).toEqual([
      { kind: 'image-work lease', container: old.name, image: image('old'), outcome: 'removed' },
    ])
    // By name: one at work is left alone (exit 1).
    const named = cli(['rm', '--docker-host', host, busy.name, silent.name])
    expect(named.code).toBe(1)
    expect(named.stdout).toContain(`in use ${busy.name}`)
    expect(named.stdout).toContain(`removed ${silent.name} (image-work lease of ${image('silent')})`)
    // Every left one, engine-wide.
    const all = cli(['rm', '--image-work', '--docker-host', host])
    expect(all.code).toBe(0)
    expect(all.stdout).toContain(`removed ${real.name} (image-work lease of ${failed})`)
    expect(gone(real.name, host)).toBe(true)
    expect(gone(busy.name, host)).toBe(false)
    held.splice(
      held.findIndex((h) => h.name === leaseName(image('fresh'))),
      1,
    )
    expect(now(held)).toEqual(was(held))
  })

  test('GPU leftovers: only stopped set-aside containers of the removed sandbox go; a running lock that is not our claim stops rm', async () => {
    const gpuSandbox = (ns = namespace) => {
      const id = randomId()
      make(containerNameFor(ns, id), ours(ns, id, { [LABEL_GPUS]: '0' }), 'created', { host })
      return id
    }
    const lockLabels = (at: number) => ({
      [LABEL_MANAGED_BY]: MANAGED_BY,
      [LABEL_GPU_LOCK]: 'tf-test-host:1',
      [LABEL_GPU_LOCK_AT]: String(at),
    })
    // A running container under the lock's name with lock labels a minute old: not our claim.
    const target = gpuSandbox()
    const squatter = make('trueforge-gpu-lock', lockLabels(Date.now() - 60_000), 'running', { host })
    const refused = cli(['rm', '--namespace', namespace, '--docker-host', host, target])
    expect(refused.code).toBe(1)
    expect(refused.stderr).toMatch(/trueforge-gpu-lock that is not our GPU allocation lock/)
    expect(now([squatter])).toEqual(was([squatter]))
    dk(host, ['rm', '-f', squatter.name])
    // Our claim, never started, a minute old: its holder died; it is broken.
    make('trueforge-gpu-lock', lockLabels(Date.now() - 60_000), 'created', { host })
    expect(cli(['rm', '--namespace', namespace, '--docker-host', host, target]).code).toBe(0)
    expect(gone('trueforge-gpu-lock', host)).toBe(true)

    // rm: a running set-aside container of the sandbox, and a stopped one labelled for another namespace, stay.
    const first = gpuSandbox()
    const name = containerNameFor(namespace, first)
    const stay = [
      make(`${name}.gpu-move`, ours(namespace, first, { [LABEL_GPUS]: '1' }), 'running', { host }),
      make(`${name}.gpu-moved`, ours(other, first, { [LABEL_GPUS]: '0' }), 'exited', { host }),
    ]
    expect(cli(['rm', '--namespace', namespace, '--docker-host', host, first]).code).toBe(0)
    expect(gone(name, host)).toBe(true)
    // The reaper: the stopped set-aside container of the sandbox goes; one labelled for another sandbox stays.
    const second = gpuSandbox()
    const name2 = containerNameFor(namespace, second)
    const left = make(`${name2}.gpu-moved`, ours(namespace, second, { [LABEL_GPUS]: '0' }), 'exited', { host })
    stay.push(make(`${name2}.gpu-move`, ours(namespace, first, { [LABEL_GPUS]: '1' }), 'created', { host }))
    await sleep(1200)
    const { removed } = await scratch({ autoDeleteIntervalInMinutes: TINY }).reapStale()
    expect(now(stay)).toEqual(was(stay))
    expect(removed).toContain(second)
    expect(gone(name2, host)).toBe(true)
    expect(gone(left.name, host)).toBe(true)
  })
})

describe('leases failed pulls leave: seen and removable (main engine, the loopback registry)', () => {
  test("ls --all-namespaces lists a failed pull's lease as what it is, doctor reports it, rm takes it by name", async () => {
    const missing = repoName(PLAIN, namespace, 'missing') + ':1'
    const name = leaseName(missing)
    const p = provider({ image: missing })
    await p.buildImage()
    const { last } = await pollUntil(p, (b) => b.status !== 'pending', 60_000)
    expect(last.status).toBe('failed')
    expect(last.reason).toMatch(/manifest unknown|not found/)
    expect(dk(undefined, ['inspect', '-f', '{{.State.Status}}', name])).toBe('created')

    const rows = JSON.parse(cli(['ls', '--all-namespaces', '--json']).stdout)
    expect(rows.find((r: any) => r.container === name)).toEqual({
      kind: 'image-work lease',
      container: name,
      image: missing,
      work: 'pull',
      state: 'failed',
      holder: expect.stringMatching(/^.+:\d+$/),
      reason: last.reason,
      created: expect.any(Number),
      ageSeconds: expect.any(Number),
    })
    // Sandbox rows say what they are too; a namespace's listing has no leases (they have none).
    expect(rows.filter((r: any) => r.kind === 'sandbox').every((r: any) => r.sandboxId)).toBe(true)
    expect(
      JSON.parse(cli(['ls', '--namespace', namespace, '--json']).stdout).some((r: any) => r.container === name),
    ).toBe(false)
    const plain = cli(['ls', '--all-namespaces']).stdout
    expect(plain).toMatch(/^IMAGE-WORK LEASE\s+STATE\s+WORK\s+IMAGE\s+HOLDER\s+CREATED\s+LAST HEARD\s+REASON$/m)
    expect(plain).toMatch(new RegExp(`^${name}\\s+failed\\s+pull\\s+${missing.replace(/[.]/g, '\\.')}\\s`, 'm'))

    const doctor = cli(['doctor', '--image', BUSYBOX, '--namespace', namespace])
    expect(doctor.stdout).toMatch(
      new RegExp(
        `^warn {2}image-work leases: \\d+ left by failed or interrupted pulls and builds: .*${name} \\(pull of `,
        'm',
      ),
    )
    expect(doctor.stdout).toContain('fix: `trueforge-docker-sandbox rm --image-work` removes them')
    const report = JSON.parse(cli(['doctor', '--image', BUSYBOX, '--namespace', namespace, '--json']).stdout)
    expect(report.checks.find((c: any) => c.name === 'image-work leases')).toMatchObject({ status: 'warn' })

    const rm = cli(['rm', name])
    expect(rm.code).toBe(0)
    expect(rm.stdout).toBe(`removed ${name} (image-work lease of ${missing})\n`)
    expect(gone(name)).toBe(true)
    const again = cli(['rm', '--json', name])
    expect(again.code).toBe(1)
    expect(JSON.parse(again.stdout)).toEqual([{ kind: 'image-work lease', container: name, outcome: 'not-found' }])
    expect(now(bystanders)).toEqual(was(bystanders))
  })
})
