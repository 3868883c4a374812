// The bin's `ls`, `rm` and `doctor` commands against the real engine (the TLS engine's runs are
// in tls.test.ts), including an unreachable one. Output is read as a script would: `--json`, and
// the plain lines (no colour codes when stdout is not a terminal).

import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'

import { DockerSandboxProvider } from '../..'
import {
  BUSYBOX,
  cleanupNamespace,
  containerNameFor,
  docker,
  dockerTry,
  LABEL_TEST_NAMESPACE,
  uniqueNamespace,
} from '../helpers'

jest.setTimeout(90_000)

const CLI = path.resolve(__dirname, '..', '..', 'cli', 'index.js')
const namespace = uniqueNamespace('t-cmds')
const other = uniqueNamespace('t-cmds-other')
const provider = new DockerSandboxProvider({ image: BUSYBOX, namespace, tenantName: 'acme' })
const otherProvider = new DockerSandboxProvider({ image: BUSYBOX, namespace: other })

function cli(args: string[], env: Record<string, string | undefined> = {}) {
  const merged: Record<string, string> = {}
  for (const [k, v] of Object.entries({ ...process.env, ...env })) if (v !== undefined) merged[k] = v
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 60_000, env: merged })
  return { code: r.status, stdout: r.stdout, stderr: r.stderr }
}

afterAll(() => {
  provider.dispose()
  otherProvider.dispose()
  cleanupNamespace(namespace)
  cleanupNamespace(other)
})

test('ls lists our sandboxes with state, times, image, tenant, pool flag and size; rm removes ours only', async () => {
  const { sandboxId: running } = await provider.createSandbox()
  const { sandboxId: stopped } = await provider.createSandbox()
  const { sandboxId: elsewhere } = await otherProvider.createSandbox()
  await provider.exec({ sandboxId: running, command: 'head -c 100000 /dev/zero > big' })
  docker(['stop', '-t', '1', containerNameFor(namespace, stopped)])
  // A container that claims our labels but whose name does not derive from its id: not ours.
  const imposter = `tf-imposter-${namespace}`
  docker([
    'run',
    '-d',
    '--name',
    imposter,
    '--label',
    `${LABEL_TEST_NAMESPACE}=${namespace}`,
    '--label',
    'trueforge.sandbox.managed-by=trueforge-docker-sandbox',
    '--label',
    `trueforge.sandbox.namespace=${namespace}`,
    '--label',
    `trueforge.sandbox.id=${running}`,
    BUSYBOX,
    'sleep',
    '600',
  ])
  try {
    const ls = cli(['ls', '--namespace', namespace, '--json'])
    expect(ls.code).toBe(0)
    const list = JSON.parse(ls.stdout)
    expect(list.map((s: any) => s.sandboxId).sort()).toEqual([running, stopped].sort())
    const r = list.find((s: any) => s.sandboxId === running)
    expect(r).toMatchObject({ namespace, state: 'running', image: BUSYBOX, tenant: 'acme', poolMember: false })
    expect(r.created).toBeGreaterThan(Date.now() / 1000 - 120)
    expect(r.lastActivity).toBeGreaterThanOrEqual(r.created - 1)
    expect(r.sizeBytes).toBeGreaterThanOrEqual(100000)
    expect(list.find((s: any) => s.sandboxId === stopped).state).toBe('exited')

    const plain = cli(['ls', '--namespace', namespace])
    expect(plain.stdout).not.toContain('\u001b[')
    expect(plain.stdout.split('\n')[0]).toMatch(
      /^SANDBOX ID\s+NAMESPACE\s+STATE\s+CREATED\s+LAST ACTIVITY\s+IMAGE\s+TENANT\s+POOL\s+SIZE$/,
    )
    expect(plain.stdout).toContain(running)

    const all = JSON.parse(cli(['ls', '--all-namespaces', '--json']).stdout)
    expect(all.map((s: any) => s.sandboxId)).toEqual(expect.arrayContaining([running, stopped, elsewhere]))

    // rm --stopped removes the stopped one only, in this namespace only.
    const rmStopped = cli(['rm', '--stopped', '--namespace', namespace])
    expect(rmStopped.code).toBe(0)
    expect(rmStopped.stdout).toContain(`removed ${stopped}`)
    // rm by id: ours goes, the imposter with the same id label stays; an unknown id is exit 1.
    const rm = cli(['rm', '--namespace', namespace, running, '/workspace/01ZZZZZZZZZZZZZZZZZZZZZZZZ'])
    expect(rm.code).toBe(1)
    expect(rm.stdout).toContain(`removed ${running}`)
    expect(rm.stdout).toContain('not found /workspace/01ZZZZZZZZZZZZZZZZZZZZZZZZ')
    expect(JSON.parse(cli(['ls', '--namespace', namespace, '--json']).stdout)).toEqual([])
    expect(dockerTry(['inspect', imposter]).status).toBe(0)
    // The other namespace was never touched.
    expect((await otherProvider.exec({ sandboxId: elsewhere, command: 'true' })).success).toBe(true)
    // Bad usage is exit 2 with the usage.
    const bad = cli(['rm'])
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain('usage: trueforge-docker-sandbox rm')
  } finally {
    dockerTry(['rm', '-f', imposter])
  }
})

test('doctor on the local engine: every check a line, a real test sandbox, exit 0; --json', () => {
  const r = cli(['doctor', '--image', BUSYBOX, '--namespace', namespace])
  expect(r.stdout).not.toContain('\u001b[')
  for (const name of [
    'endpoint',
    'engine reachable',
    'version',
    'rootless',
    'cgroups',
    'storage',
    'seccomp',
    'runtimes',
    'network',
    'gpu',
    'egress',
    'image',
    'agent',
    'test sandbox',
  ]) {
    expect(r.stdout).toMatch(new RegExp(`^(ok  |warn|fail)  ${name}: `, 'm'))
  }
  expect(r.stdout).toMatch(/^ok {4}endpoint: socket: unix:\/\/\/var\/run\/docker.sock/m)
  // The default egress policy, and no engine network for it.
  expect(r.stdout).toMatch(/^ok {4}egress: egress policy: allow \*; deny nothing; /m)
  expect(r.stdout).toMatch(/^ok {4}network: sandboxes join no engine network/m)
  expect(r.stdout).toMatch(
    /^ok {4}test sandbox: create \d+ ms, exec \d+ ms, upload \d+ ms, download \d+ ms, remove \d+ ms$/m,
  )
  // The test sandbox's calls went through the in-sandbox agent, as root.
  expect(r.stdout).toMatch(
    /^ok {4}agent: in-sandbox agent [0-9.]+ \((x86_64|aarch64)\) at \/\.trueforge-agent\/\S+, as root, commands and files as the sandbox user; timeouts: (subreaper|session guard), files: (fs|thread) ids, paths: (openat2|one component at a time), stream: (linked socket|engine exec)$/m,
  )
  expect(r.code).toBe(0)
  const j = cli(['doctor', '--image', BUSYBOX, '--namespace', namespace, '--json'])
  const report = JSON.parse(j.stdout)
  expect(report.ok).toBe(true)
  expect(report.checks.find((c: any) => c.name === 'version').detail).toMatch(/API 1\.\d+/)
  // The busybox image lacks what TrueForge needs: a warning with the probe's words, not a failure.
  expect(report.checks.find((c: any) => c.name === 'image')).toMatchObject({ status: 'warn' })
  // Nothing left behind.
  expect(JSON.parse(cli(['ls', '--namespace', namespace, '--json']).stdout)).toEqual([])
})

test('doctor --egress: the policy given, or a usage error', () => {
  const r = cli([
    'doctor',
    '--image',
    BUSYBOX,
    '--namespace',
    namespace,
    '--egress',
    '{"allow":["pkgs.example"],"deny":["bad.example"]}',
  ])
  expect(r.stdout).toMatch(/^ok {4}egress: egress policy: allow pkgs\.example; deny bad\.example; /m)
  expect(r.code).toBe(0)
  const bad = cli(['doctor', '--egress', 'closed'])
  expect(bad.code).toBe(2)
  expect(bad.stderr).toMatch(/^--egress: expected open, none or a policy as JSON/)
})

test('doctor names the CDI specs it finds and the devices they name (JSON and YAML)', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'tf-cdi-'))
  try {
    writeFileSync(
      path.join(dir, 'nvidia.json'),
      JSON.stringify({ cdiVersion: '0.5.0', kind: 'nvidia.com/gpu', devices: [{ name: '0' }, { name: 'all' }] }),
    )
    writeFileSync(
      path.join(dir, 'vendor.yaml'),
      'cdiVersion: "0.5.0"\nkind: "example.com/accel"\ndevices:\n  - name: a0\n    containerEdits: {}\n',
    )
    const r = cli(['doctor', '--image', BUSYBOX, '--namespace', namespace], { TRUEFORGE_CDI_DIRS: dir })
    expect(r.stdout).toMatch(
      /^ok {4}gpu: CDI specs .*nvidia\.json.*vendor\.yaml: nvidia\.com\/gpu=0, nvidia\.com\/gpu=all, example\.com\/accel=a0$/m,
    )
    const none = cli(['doctor', '--image', BUSYBOX, '--namespace', namespace], {
      TRUEFORGE_CDI_DIRS: path.join(dir, 'missing'),
    })
    expect(none.stdout).toMatch(/^warn {2}gpu: no nvidia runtime and no CDI specs/m)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})

test('ls marks unclaimed warm-pool members', async () => {
  const ns = uniqueNamespace('t-cmds-pool')
  const pooled = new DockerSandboxProvider({ image: BUSYBOX, namespace: ns, network: 'none', warmPool: { size: 1 } })
  try {
    await pooled.warmUp()
    let list: any[] = []
    for (let i = 0; i < 100 && !list.some((s) => s.poolMember && s.state === 'running'); i++) {
      await new Promise((r) => setTimeout(r, 200))
      list = JSON.parse(cli(['ls', '--namespace', ns, '--json']).stdout)
    }
    expect(list).toEqual([expect.objectContaining({ namespace: ns, poolMember: true, state: 'running' })])
    expect(list[0].container).toMatch(/-pool$/)
  } finally {
    pooled.dispose()
    cleanupNamespace(ns)
  }
})

test('doctor, ls and rm against an unreachable engine: fail lines naming the host and the fix, exit 1', () => {
  const host = 'unix:///var/run/tf-no-such-engine.sock'
  const d = cli(['doctor', '--docker-host', host])
  expect(d.code).toBe(1)
  expect(d.stdout).toMatch(/^fail {2}engine reachable: ENGINE_UNREACHABLE: .*tf-no-such-engine\.sock.* — fix: /m)
  const j = JSON.parse(cli(['doctor', '--docker-host', host, '--json']).stdout)
  expect(j.ok).toBe(false)
  const ls = cli(['ls', '--docker-host', host])
  expect(ls.code).toBe(1)
  expect(ls.stderr).toContain('tf-no-such-engine.sock')
  expect(cli(['rm', '--docker-host', host, '--stopped']).code).toBe(1)
  // A context that does not exist fails at the first line.
  const ctx = cli(['doctor'], { DOCKER_CONTEXT: 'tf-no-such-context', DOCKER_HOST: undefined })
  expect(ctx.code).toBe(1)
  expect(ctx.stdout).toMatch(/^fail {2}endpoint: .*tf-no-such-context/m)
})
