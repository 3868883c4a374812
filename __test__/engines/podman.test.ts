// The security baseline and the warm pool on Podman, where its Docker API differs from Docker's
// (docs/podman.md):
// run by the podman jest project with DOCKER_HOST at the socket of scripts/engines/podman-engine.sh (rootful)
// or scripts/engines/podman-rootless-engine.sh (rootless); skipped in the default run (the same properties are checked on Docker by __test__/security.test.ts,
// whose inspect-format assertions — docker-init, PidMode "", CapDrop ["ALL"], the `bridge`
// network's gateway — are Docker's spellings and do not apply to Podman).

import { DockerSandboxProvider } from '../..'
import {
  TRUEFORGE,
  BUSYBOX,
  containerNameFor,
  containersInNamespace,
  DEBIAN,
  docker,
  LABEL_TEST_NAMESPACE,
  ok,
  rejection,
  run,
  SandboxTracker,
  sleep,
  uniqueNamespace,
} from '../helpers'

const onPodman = (process.env.DOCKER_HOST ?? '').endsWith('podman.sock')
const suite = onPodman ? describe : describe.skip

const namespace = uniqueNamespace('t-podsec')
const tracker = new SandboxTracker(namespace)
const providers: InstanceType<typeof DockerSandboxProvider>[] = []
const provider = (extra: Record<string, unknown>) => {
  const p = new DockerSandboxProvider({ image: BUSYBOX, namespace, network: 'none', ...extra })
  providers.push(p)
  return p
}

afterAll(async () => {
  if (onPodman) await tracker.cleanup(provider({}))
  for (const p of providers) p.dispose()
})

/** The capability sets of the exec'd shell, as hex masks. */
async function caps(p: InstanceType<typeof DockerSandboxProvider>, id: string) {
  const out = await ok(p, id, 'grep -E "^(CapEff|CapAmb|NoNewPrivs)" /proc/self/status')
  return Object.fromEntries(
    out
      .trim()
      .split('\n')
      .map((l) => l.split(/:\s+/)),
  )
}

suite('on Podman (skipped unless DOCKER_HOST is the Podman test socket: npm run test:podman)', () => {
  jest.setTimeout(90_000)

  test('a root sandbox keeps exactly the eight default capabilities, none ambient, no-new-privileges, podman-init as PID 1', async () => {
    const p = provider({})
    const id = await tracker.create(p)
    // CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID NET_BIND_SERVICE = 0x4fb
    expect(await caps(p, id)).toEqual({ CapEff: '00000000000004fb', CapAmb: '0000000000000000', NoNewPrivs: '1' })
    expect(await ok(p, id, 'cat /proc/1/comm')).toBe('podman-init\n')
    // No engine socket inside.
    expect((await run(p, id, 'ls /var/run/docker.sock /run/podman/podman.sock /run/tf-podman')).exitCode).not.toBe(0)
  })

  test.each([
    ['busybox, user nobody', BUSYBOX, 'nobody', '65534'],
    ['debian, user 1000:1000', DEBIAN, '1000:1000', '1000'],
  ])(
    '%s: no capability at all (Podman would make them ambient), cannot write outside what it owns',
    async (_l, image, user, uid) => {
      const p = provider({ image, user })
      const id = await tracker.create(p)
      expect(await caps(p, id)).toEqual({ CapEff: '0000000000000000', CapAmb: '0000000000000000', NoNewPrivs: '1' })
      for (const path of ['/etc/x', '/root/x', '/usr/x', '/x']) {
        const r = await run(p, id, `touch ${path}`)
        expect({ path, refused: r.exitCode !== 0 }).toEqual({ path, refused: true })
      }
      await p.uploadFile({ sandboxId: id, remotePath: 'up.txt', content: Buffer.from('hello') })
      expect(await ok(p, id, `stat -c %u up.txt && touch ${p.getFileUploadsDir(id)}/w && echo writable`)).toBe(
        `${uid}\nwritable\n`,
      )
      // With no capability to switch users, the agent runs as that user and serves all of it.
      expect(await p.agentStatus(id)).toMatchObject({ mode: 'agent', asUser: true, uid: Number(uid) })
    },
  )

  test('an image whose USER is not root (the default image runs as agent): no capability at all, none ambient', async () => {
    const p = provider({ image: TRUEFORGE })
    const id = await tracker.create(p)
    expect(await ok(p, id, 'id -un')).toBe('agent\n')
    expect(await caps(p, id)).toEqual({ CapEff: '0000000000000000', CapAmb: '0000000000000000', NoNewPrivs: '1' })
    expect((await run(p, id, 'touch /etc/x')).exitCode).not.toBe(0)
    expect(await p.agentStatus(id)).toMatchObject({ mode: 'agent', asUser: true })
    // The same image with `user: 'root'` keeps the default set: the option wins over USER.
    const asRoot = provider({ image: TRUEFORGE, user: 'root' })
    const rootId = await tracker.create(asRoot)
    expect(await caps(asRoot, rootId)).toEqual({
      CapEff: '00000000000004fb',
      CapAmb: '0000000000000000',
      NoNewPrivs: '1',
    })
  })

  test("runtime: 'runsc' is refused at create (Podman's Docker API ignores the runtime) and leaves no container", async () => {
    const ns = uniqueNamespace('t-podrt')
    const p = new DockerSandboxProvider({ image: BUSYBOX, namespace: ns, network: 'none', runtime: 'runsc' })
    providers.push(p)
    const e = await rejection(p.createSandbox())
    expect(e.code).toBe('CREATE_FAILED')
    expect(e.message).toMatch(/Podman.*runsc.*containers\.conf/)
    expect(containersInNamespace(ns)).toEqual([])
  })

  test('warmPool: off on Podman (renames are not atomic there), sandboxes are created on demand and work', async () => {
    const ns = uniqueNamespace('t-podpool')
    const logs: string[] = []
    const p = new DockerSandboxProvider({
      image: BUSYBOX,
      namespace: ns,
      network: 'none',
      warmPool: { size: 2 },
      logger: { warn: (m: string) => logs.push(m) },
    })
    providers.push(p)
    await p.warmUp()
    expect(logs.join('\n')).toMatch(/warm pool disabled: the engine is Podman/)
    const { sandboxId } = await p.createSandbox()
    try {
      expect(await ok(p, sandboxId, 'pwd')).toBe(`${sandboxId}\n`)
      await sleep(1000)
      expect(
        docker(['ps', '-a', '--format', '{{.Names}}', '--filter', `name=trueforge-${ns}-`])
          .split('\n')
          .filter((n) => n.endsWith('-pool')),
      ).toEqual([])
    } finally {
      await p.removeSandbox(sandboxId)
    }
  })

  test('readOnlyRootfs: the root is read-only, the sandbox and the layout stay writable', async () => {
    const p = provider({ readOnlyRootfs: true })
    const id = await tracker.create(p)
    expect((await run(p, id, 'touch /etc/x')).exitCode).not.toBe(0)
    expect(await ok(p, id, 'echo w > f && cat f && touch /trueforge/uploads/u /tmp/t && echo ok')).toBe('w\nok\n')
  })

  test('Code Mode on a stopped sandbox starts it first (Podman refuses an exec there with a 500, not a 409)', async () => {
    const p = provider({ image: DEBIAN })
    const id = await tracker.create(p)
    const install = p.createCodeModeTransport().getClientInstall({ sandboxId: id })
    const dir = install.remotePath.replace(/\/[^/]+$/, '')
    await ok(p, id, `mkdir -p ${dir}/bin`)
    await p.uploadFile({ sandboxId: id, remotePath: install.remotePath, content: Buffer.from(install.content) })
    await ok(p, id, `chmod 0555 ${install.remotePath} && ln -sf ../mcp_client.py ${dir}/bin/mcp-client`)
    docker(['stop', '-t', '1', containerNameFor(namespace, id)])
    const transport = p.createCodeModeTransport()
    const dispatcher = {
      close() {},
      async dispatch({ request }: { request: { op: string } }) {
        if (request.op === 'list_tools')
          return { ok: true, result: { tools: [{ name: 'ping', annotations: { readOnlyHint: true } }] } }
        return { ok: true, result: { structuredContent: { pong: true } } }
      },
    }
    try {
      const { env } = await transport.start({
        codeModeDispatcher: dispatcher as any,
        sandboxId: id,
        requestTimeoutSeconds: 30,
      })
      const servers = Buffer.from(JSON.stringify({ demo: { allowed_tools: [] } })).toString('base64')
      const out = await ok(p, id, "mcp-client call-tool demo ping '{}'", {
        env: { ...env, PYTHONPATH: dir, TFY_MCP_SERVERS: servers, TFY_ENABLE_AGENT_APPROVALS: 'true' },
      })
      expect(JSON.parse(out)).toEqual({ pong: true })
    } finally {
      await transport.stop()
    }
  })

  test("reapStale() works (Podman refuses the whole list for a status filter of 'dead'): the stale sandbox goes, a forged one stays", async () => {
    const p = provider({ autoDeleteIntervalInMinutes: 1 / 60 })
    const id = await tracker.create(p)
    docker(['stop', '-t', '1', containerNameFor(namespace, id)])
    const forged = `tf-podsec-forged-${namespace}`
    const forgedId = `/workspace/0${'A'.repeat(25)}`
    docker([
      'create',
      '--name',
      forged,
      '--label',
      `${LABEL_TEST_NAMESPACE}=${namespace}`,
      '--label',
      'trueforge.sandbox.managed-by=trueforge-docker-sandbox',
      '--label',
      `trueforge.sandbox.namespace=${namespace}`,
      '--label',
      `trueforge.sandbox.id=${forgedId}`,
      BUSYBOX,
      'true',
    ])
    await sleep(1200)
    expect((await p.reapStale()).removed).toEqual([id])
    expect(docker(['inspect', '-f', '{{.State.Status}}', forged])).toBe('created')
  })
})
