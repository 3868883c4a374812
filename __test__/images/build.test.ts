// Builds from a local context through the Engine build API: buildImage() → pending (with the
// current step) → ready; sandboxes see the COPYed file and the RUN output; the tag follows the
// content (stable when nothing changes, new after a file or build-arg change); a failing RUN
// ends `failed` with the build log's last lines, and a later buildImage() retries.
//
// RUN steps of the engine's classic builder start a container on the default bridge network;
// an engine whose docker0 bridge is gone cannot run them (beforeAll reports that plainly).

import { DockerSandboxProvider } from '../..'
import { BUSYBOX, docker, dockerTry, ok, SandboxTracker, uniqueNamespace } from '../helpers'
import { Build, BUILD_REASON, bridgeWorks, ImageTracker, pollUntil, SAVE_AGAIN, writeFiles } from './support'

jest.setTimeout(90_000)

const namespace = uniqueNamespace('t-img-build')
const images = new ImageTracker(namespace)
const sandboxes = new SandboxTracker(namespace)
const TAG = /^trueforge-sandbox-build:[0-9a-f]{16}$/

const DOCKERFILE = `FROM ${BUSYBOX}
ARG FLAVOR=plain
COPY greeting.txt /opt/tf/greeting.txt
RUN echo "ran-$(cat /opt/tf/greeting.txt)" > /opt/tf/run.txt && echo "flavor-$FLAVOR" > /opt/tf/flavor.txt
`

let ctx: string
let bridge = { ok: true, detail: '' }

function provider(extra: Record<string, unknown> = {}, context = ctx) {
  return new DockerSandboxProvider({
    image: 'unused-when-building:1',
    namespace,
    network: 'none',
    build: { context, ...extra },
  })
}

/** buildImage(), then status reads until it settles; every tag seen is tracked for cleanup. */
async function buildToEnd(p: InstanceType<typeof DockerSandboxProvider>) {
  const first = (await p.buildImage()) as Build
  if (first.metadata?.image) images.ref(first.metadata.image)
  const { last, seen } = await pollUntil(p, (b) => b.status !== 'pending', 60_000)
  return { first, last, seen: [first, ...seen] }
}

beforeAll(() => {
  bridge = bridgeWorks()
  ctx = images.tempDir('tf-build-ctx')
  writeFiles(ctx, { Dockerfile: DOCKERFILE, 'greeting.txt': `hello-${namespace}\n` })
})

afterAll(async () => {
  const p = new DockerSandboxProvider({ image: BUSYBOX, namespace })
  await sandboxes.cleanup(p)
  p.dispose()
  images.cleanup()
})

function requireBridge() {
  if (!bridge.ok) {
    throw new Error(
      `the engine cannot start containers on its default bridge, so RUN steps cannot run: ${bridge.detail}`,
    )
  }
}

let firstTag = ''
let firstId = ''

test('buildImage builds the context in the background: pending with the step, then ready', async () => {
  requireBridge()
  const p = provider()
  const before = (await p.getImageBuildStatus()) as Build
  expect(before.status).toBe('failed')
  expect(before.reason).toMatch(SAVE_AGAIN)
  expect(before.reason).toMatch(/no build is running/)
  expect(before.metadata!.image).toMatch(TAG)
  expect(before.metadata!.buildContext).toBe(ctx)

  const t0 = Date.now()
  const { first, last, seen } = await buildToEnd(p)
  expect(Date.now() - t0).toBeLessThan(60_000)
  expect(first.status).toBe('pending')
  expect(first.reason).toMatch(BUILD_REASON)
  for (const b of seen.slice(0, -1)) {
    expect(b.status).toBe('pending')
    expect(b.reason).toMatch(BUILD_REASON)
    expect(b.metadata).toEqual({ image: before.metadata!.image, buildContext: ctx })
  }
  // The step counter moved through the Dockerfile while we watched (4 instructions; the engine
  // may count a step more for the labels it adds).
  const steps = seen.map((b) => /: Step (\d+)\/(\d+)$/.exec(b.reason ?? '')).filter((m) => m !== null)
  expect(steps.length).toBeGreaterThan(0)
  for (const m of steps) expect(Number(m![2])).toBeGreaterThanOrEqual(4)

  expect(last.status).toBe('ready')
  expect(last.metadata!.image).toBe(before.metadata!.image)
  expect(last.metadata!.buildContext).toBe(ctx)
  firstTag = last.metadata!.image
  firstId = docker(['image', 'inspect', '--format', '{{.Id}}', firstTag])
  expect(last.metadata!.imageId).toBe(firstId)
  expect(last.metadata).toMatchObject({ sh: 'yes', python3: 'no', git: 'no' })
  // Built images carry the managed-by label.
  expect(
    docker(['image', 'inspect', '--format', '{{index .Config.Labels "trueforge.sandbox.managed-by"}}', firstTag]),
  ).toBe('trueforge-docker-sandbox')
  // No build container is left behind.
  expect(docker(['ps', '-aq', '--filter', `ancestor=${firstTag}`])).toBe('')
  p.dispose()
})

test('a sandbox from the built image sees the COPYed file and the RUN output', async () => {
  requireBridge()
  expect(firstTag).toMatch(TAG)
  const p = provider()
  const id = await sandboxes.create(p)
  expect(await ok(p, id, 'cat /opt/tf/greeting.txt')).toBe(`hello-${namespace}\n`)
  expect(await ok(p, id, 'cat /opt/tf/run.txt')).toBe(`ran-hello-${namespace}\n`)
  expect(await ok(p, id, 'cat /opt/tf/flavor.txt')).toBe('flavor-plain\n')
  await p.removeSandbox(id)
  p.dispose()
})

test('the same context gives the same tag and is ready at once, with no rebuild', async () => {
  requireBridge()
  expect(firstTag).toMatch(TAG)
  const created = docker(['image', 'inspect', '--format', '{{.Created}}', firstTag])
  const p = provider()
  const st = (await p.getImageBuildStatus()) as Build
  expect(st.status).toBe('ready')
  expect(st.metadata!.image).toBe(firstTag)
  const t0 = Date.now()
  const b = (await p.buildImage()) as Build
  expect(Date.now() - t0).toBeLessThan(5000)
  expect(b.status).toBe('ready')
  expect(b.metadata!.image).toBe(firstTag)
  expect(b.metadata!.imageId).toBe(firstId)
  expect(docker(['image', 'inspect', '--format', '{{.Id}} {{.Created}}', firstTag])).toBe(`${firstId} ${created}`)
  p.dispose()
})

test('changing a file gives a new tag, which builds to a new image', async () => {
  requireBridge()
  expect(firstTag).toMatch(TAG)
  const ctx2 = images.tempDir('tf-build-ctx2')
  writeFiles(ctx2, { Dockerfile: DOCKERFILE, 'greeting.txt': `hello-${namespace}\n` })
  const p = provider({}, ctx2)
  // A copy of the context elsewhere: same content, same tag (the path is not hashed).
  expect(((await p.getImageBuildStatus()) as Build).metadata!.image).toBe(firstTag)
  writeFiles(ctx2, { 'greeting.txt': `changed-${namespace}\n` })
  const st = (await p.getImageBuildStatus()) as Build
  expect(st.metadata!.image).toMatch(TAG)
  expect(st.metadata!.image).not.toBe(firstTag)
  expect(st.status).toBe('failed')
  expect(st.reason).toMatch(SAVE_AGAIN)
  const { last } = await buildToEnd(p)
  expect(last.status).toBe('ready')
  expect(last.metadata!.image).toBe(st.metadata!.image)
  expect(last.metadata!.imageId).not.toBe(firstId)
  const id = await sandboxes.create(p)
  expect(await ok(p, id, 'cat /opt/tf/run.txt')).toBe(`ran-changed-${namespace}\n`)
  await p.removeSandbox(id)
  // The old tag is still there (and still what the unchanged context maps to).
  expect(dockerTry(['image', 'inspect', firstTag]).status).toBe(0)
  p.dispose()
})

test('build args and the dockerfile name are part of the tag, and args reach the build', async () => {
  requireBridge()
  expect(firstTag).toMatch(TAG)
  const spicy = provider({ args: { FLAVOR: 'spicy' } })
  const spicyTag = ((await spicy.getImageBuildStatus()) as Build).metadata!.image
  expect(spicyTag).toMatch(TAG)
  expect(spicyTag).not.toBe(firstTag)
  expect(((await provider({ args: { FLAVOR: 'spicy' } }).getImageBuildStatus()) as Build).metadata!.image).toBe(
    spicyTag,
  )
  const mild = ((await provider({ args: { FLAVOR: 'mild' } }).getImageBuildStatus()) as Build).metadata!.image
  expect(mild).not.toBe(spicyTag)
  expect(mild).not.toBe(firstTag)
  // Naming the default Dockerfile explicitly is the same build; another file name is not.
  expect(((await provider({ dockerfile: 'Dockerfile' }).getImageBuildStatus()) as Build).metadata!.image).toBe(firstTag)
  const alt = images.tempDir('tf-build-alt')
  writeFiles(alt, { Dockerfile: DOCKERFILE, 'Alt.Dockerfile': DOCKERFILE, 'greeting.txt': `hello-${namespace}\n` })
  const altTags = new Set([
    ((await provider({}, alt).getImageBuildStatus()) as Build).metadata!.image,
    ((await provider({ dockerfile: 'Alt.Dockerfile' }, alt).getImageBuildStatus()) as Build).metadata!.image,
  ])
  expect(altTags.size).toBe(2)

  const { last } = await buildToEnd(spicy)
  expect(last.status).toBe('ready')
  expect(last.metadata!.image).toBe(spicyTag)
  const id = await sandboxes.create(spicy)
  expect(await ok(spicy, id, 'cat /opt/tf/flavor.txt')).toBe('flavor-spicy\n')
  await spicy.removeSandbox(id)
  spicy.dispose()
})

test('a failing RUN ends failed with the last build log lines; buildImage retries', async () => {
  requireBridge()
  const bad = images.tempDir('tf-build-bad')
  // The marker is computed, so it is in the command's output but not in the Dockerfile text.
  writeFiles(bad, {
    Dockerfile: `FROM ${BUSYBOX}\nRUN echo "boom-$((6*7))-marker-${namespace}" && exit 3\n`,
  })
  const p = provider({}, bad)
  const { first, last } = await buildToEnd(p)
  expect(['pending', 'failed']).toContain(first.status)
  expect(last.status).toBe('failed')
  const tag = last.metadata!.image
  expect(tag).toMatch(TAG)
  expect(last.reason).toContain(`building ${tag} failed`)
  expect(last.reason).toContain(`boom-42-marker-${namespace}`)
  expect(last.reason).toMatch(/non-zero code: 3/)
  expect(last.metadata!.buildContext).toBe(bad)
  expect(dockerTry(['image', 'inspect', tag]).status).not.toBe(0)
  // Sticky for reads, and no build container is left.
  expect(await p.getImageBuildStatus()).toEqual(last)

  // A later buildImage runs the build again (pending again, or failed again at once).
  const again = (await p.buildImage()) as Build
  expect(['pending', 'failed']).toContain(again.status)
  if (again.status === 'pending') expect(again.reason).toMatch(BUILD_REASON)
  const { last: last2 } = await pollUntil(p, (b) => b.status !== 'pending', 60_000)
  expect(last2.status).toBe('failed')
  expect(last2.reason).toContain(`boom-42-marker-${namespace}`)
  p.dispose()
})

test('a context that is not a directory is refused as an invalid option, by the constructor', () => {
  let e: any = null
  try {
    provider({}, '/nonexistent/tf-build-context').dispose()
  } catch (err) {
    e = err
  }
  expect(e).toBeInstanceOf(TypeError)
  expect(e.code).toBe('INVALID_OPTION')
  expect(e.option).toBe('build.context')
  expect(String(e.message)).toMatch(/\/nonexistent\/tf-build-context: not a readable directory/)
})
