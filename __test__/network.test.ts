// The network sandboxes join with `egress: 'open'`: one of ours per namespace and tenant, with
// inter-container communication off on Docker (isolated from every other network on Podman).
// Under an egress policy (the default) a sandbox joins none (egress.test.ts).
// Checked by inspecting what the engine was told and, on a local Docker engine, the firewall
// rules it installed. No traffic is sent to container addresses.

import { spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import { DockerSandboxProvider } from '..'
import {
  BUSYBOX,
  cleanupNamespace,
  containerNameFor,
  docker,
  dockerTry,
  inspectContainer,
  ok,
  rejection,
  SandboxTracker,
  uniqueNamespace,
  waitFor,
} from './helpers'

jest.setTimeout(90_000)

const onPodman = (process.env.DOCKER_HOST ?? '').endsWith('podman.sock')
const namespace = uniqueNamespace('t-net')
const other = uniqueNamespace('t-net2')
const foreign = uniqueNamespace('t-net3')
const tracker = new SandboxTracker(namespace)
const otherTracker = new SandboxTracker(other)
const providers: DockerSandboxProvider[] = []
/** Whether this engine shares a network among sandboxes safely (Podman; Docker 20.10.27, 23 and later). */
const engineVersion = docker(['version', '--format', '{{.Server.Version}}']).trim()
const safeEngine = (() => {
  if (onPodman) return true
  const [a, b, c] = engineVersion.split(/[.+~-]/).map(Number)
  return a >= 23 || (a === 20 && b === 10 && c >= 27)
})()
const logs: string[] = []
/** Providers on the network of ours: the default where the engine is safe, `'isolated'` elsewhere. */
const provider = (ns: string, extra: Record<string, unknown> = {}) => {
  const p = new DockerSandboxProvider({
    image: BUSYBOX,
    namespace: ns,
    network: 'isolated',
    logger: { warn: (m: string) => logs.push(m) },
    ...extra,
  })
  providers.push(p)
  return p
}

afterAll(async () => {
  await tracker.cleanup(provider(namespace))
  await otherTracker.cleanup(provider(other))
  cleanupNamespace(foreign)
  dockerTry(['network', 'rm', `trueforge-${foreign}`])
  for (const p of providers) await p.dispose()
})

/** The one network a sandbox's container joins, by name (the provider names its own by id). */
const networkOf = (ns: string, id: string): string =>
  Object.keys(inspectContainer(containerNameFor(ns, id)).NetworkSettings.Networks)[0]
const inspectNetwork = (name: string): any => JSON.parse(docker(['network', 'inspect', name]))[0]

/** The host's iptables rules of one table, when this process can read them (a local rootful engine). */
function rules(table: string): string | null {
  if (onPodman || process.getuid?.() !== 0) return null
  const r = spawnSync('iptables', ['-t', table, '-S'], { encoding: 'utf8' })
  return r.status === 0 ? r.stdout : null
}

test('by default (an egress policy) a sandbox joins no network, and none is made for it', async () => {
  const ns = uniqueNamespace('t-net4')
  const p = new DockerSandboxProvider({ image: BUSYBOX, namespace: ns })
  providers.push(p)
  const t = new SandboxTracker(ns)
  try {
    const id = await t.create(p)
    const info = inspectContainer(containerNameFor(ns, id))
    expect(info.HostConfig.NetworkMode).toBe('none')
    // Docker lists the `none` network; Podman lists nothing.
    expect(Object.keys(info.NetworkSettings.Networks ?? {}).filter((n) => n !== 'none')).toEqual([])
    expect(dockerTry(['network', 'inspect', `trueforge-${ns}`]).status).not.toBe(0)
  } finally {
    await t.cleanup(p)
  }
})

test("with egress 'open', sandboxes join ours where the engine is safe with it, else the default bridge, saying why", async () => {
  // A fresh process: the warning is said once per engine and process.
  const dir = mkdtempSync(join(tmpdir(), 'tf-net-default-'))
  const go = join(dir, 'go')
  writeFileSync(go, '')
  try {
    const r = spawnSync(process.execPath, [join(__dirname, 'fixtures', 'create-one.js'), namespace, go, '', 'open'], {
      encoding: 'utf8',
      timeout: 60_000,
    })
    expect(r.status).toBe(0)
    const lines = r.stdout.trim().split('\n')
    const id = lines[lines.length - 1]
    tracker.ids.add(id)
    if (safeEngine) {
      expect(networkOf(namespace, id)).toBe(`trueforge-${namespace}`)
    } else {
      expect(networkOf(namespace, id)).toBe('bridge')
      expect(lines.filter((l) => l.startsWith('WARN ')).join('\n')).toMatch(
        /known deadlock with many containers on one user-defined network \(moby issue 46661/,
      )
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})

test('sandboxes join their namespace network, made by the provider, labelled as ours, with isolation on', async () => {
  const p = provider(namespace)
  const a = await tracker.create(p)
  const b = await tracker.create(p)
  const name = `trueforge-${namespace}`
  expect(networkOf(namespace, a)).toBe(name)
  expect(networkOf(namespace, b)).toBe(name)
  const n = inspectNetwork(name)
  // Named by id in the container's definition: Docker lets two networks share a name.
  if (!onPodman) expect(inspectContainer(containerNameFor(namespace, a)).HostConfig.NetworkMode).toBe(n.Id)
  expect(n.Labels).toEqual(
    expect.objectContaining({
      'trueforge.sandbox.managed-by': 'trueforge-docker-sandbox',
      'trueforge.sandbox.namespace': namespace,
    }),
  )
  expect(n.Driver).toBe('bridge')
  expect(n.Internal).toBe(false) // the outside stays reachable
  // Podman applies `isolate` but its Docker API does not show it back (docs/podman.md).
  if (!onPodman) expect(n.Options).toEqual(expect.objectContaining({ 'com.docker.network.bridge.enable_icc': 'false' }))
  // Commands work there as on any network.
  expect(await ok(p, a, 'echo hi')).toBe('hi\n')
})

test('on a local Docker engine, the rules it installed drop traffic between the sandboxes and masquerade the rest', () => {
  const filter = rules('filter')
  const nat = rules('nat')
  if (filter === null || nat === null) {
    console.warn('network.test.ts: iptables checks SKIPPED (Podman, not root, or no iptables)')
    return
  }
  const n = inspectNetwork(`trueforge-${namespace}`)
  const bridge = `br-${(n.Id as string).slice(0, 12)}`
  const subnet = n.IPAM.Config[0].Subnet as string
  // Between two sandboxes of the network: dropped.
  expect(filter).toContain(`-A FORWARD -i ${bridge} -o ${bridge} -j DROP`)
  // From the network out: forwarded, and masqueraded behind the host.
  expect(filter).toContain(`-A FORWARD -i ${bridge} ! -o ${bridge} -j ACCEPT`)
  expect(nat).toContain(`-A POSTROUTING -s ${subnet} ! -o ${bridge} -j MASQUERADE`)
  // The engine's default bridge, for comparison, allows it.
  expect(filter).not.toContain(`-A FORWARD -i docker0 -o docker0 -j DROP`)
})

test('another namespace and another tenant get networks of their own', async () => {
  const inOther = await otherTracker.create(provider(other))
  expect(networkOf(other, inOther)).toBe(`trueforge-${other}`)
  const tenant = provider(namespace, { tenantName: 'acme' })
  const t = await tracker.create(tenant)
  const net = networkOf(namespace, t)
  expect(net).toMatch(new RegExp(`^trueforge-${namespace}-t[0-9a-f]{12}$`))
  expect(inspectNetwork(net).Labels['trueforge.sandbox.tenant']).toBe('acme')
})

test("the `network` option still picks another one ('bridge', 'none')", async () => {
  const onBridge = await tracker.create(provider(namespace, { network: 'bridge' }))
  expect(networkOf(namespace, onBridge)).toEqual(onPodman ? expect.stringMatching(/^(bridge|podman)$/) : 'bridge')
  const none = await tracker.create(provider(namespace, { network: 'none' }))
  // Podman lists no network at all for 'none'.
  expect(networkOf(namespace, none)).toBe(onPodman ? undefined : 'none')
})

test('processes racing to make the network end on one (Docker allows two of one name)', async () => {
  const ns = uniqueNamespace('t-net4')
  const dir = mkdtempSync(join(tmpdir(), 'tf-net-race-'))
  const go = join(dir, 'go')
  try {
    const children = Array.from({ length: 3 }, () =>
      spawn(process.execPath, [join(__dirname, 'fixtures', 'create-one.js'), ns, go, 'isolated'], {
        stdio: ['ignore', 'pipe', 'pipe'],
      }),
    )
    const ready = children.map(() => false)
    const outputs = children.map(
      (c, i) =>
        new Promise<string>((resolve, reject) => {
          let out = ''
          let err = ''
          c.stdout.on('data', (d) => {
            out += d
            if (out.includes('READY')) ready[i] = true
          })
          c.stderr.on('data', (d) => (err += d))
          c.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`child exited ${code}: ${err}`))))
        }),
    )
    // All three ready, then all go at once: each makes the network it does not find.
    await waitFor(() => ready.every(Boolean), 30_000, 'the children to load the addon')
    writeFileSync(go, '')
    const ids = (await Promise.all(outputs)).map((o) => o.trim().split('\n').pop() as string)
    const nets = new Set(ids.map((id) => networkOf(ns, id)))
    expect(nets.size).toBe(1)
    expect(
      docker(['network', 'ls', '-q', '--filter', `label=trueforge.sandbox.namespace=${ns}`])
        .split('\n')
        .filter(Boolean),
    ).toHaveLength(1)
  } finally {
    cleanupNamespace(ns)
    rmSync(dir, { recursive: true, force: true })
  }
})

test('a network of that name the provider did not make is refused, not joined', async () => {
  dockerTry(['network', 'create', `trueforge-${foreign}`])
  const e = await rejection(provider(foreign).createSandbox())
  expect(e.code).toBe('CREATE_FAILED')
  expect(e.message).toMatch(new RegExp(`network named trueforge-${foreign} exists that this package did not make`))
  expect(docker(['ps', '-aq', '--filter', `label=trueforge.sandbox.namespace=${foreign}`])).toBe('')
})

test('a network removed while no sandbox used it is made again by the next create', async () => {
  const ns = other
  const p = provider(ns)
  const first = await otherTracker.create(p)
  await p.removeSandbox(first)
  otherTracker.ids.delete(first)
  // Another process (or an operator) removes it; this provider still believes it exists.
  for (const id of docker(['ps', '-aq', '--filter', `network=trueforge-${ns}`])
    .split('\n')
    .filter(Boolean)) {
    docker(['rm', '-f', '-v', id])
  }
  docker(['network', 'rm', `trueforge-${ns}`])
  const again = await otherTracker.create(p)
  expect(networkOf(ns, again)).toBe(`trueforge-${ns}`)
  expect(await ok(p, again, 'echo back')).toBe('back\n')
})
