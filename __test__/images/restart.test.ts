// Restart safety: what getImageBuildStatus says from a new provider object and from a brand-new
// Node process (a server restart, as far as the addon knows). Present images are `ready` there
// too; absent ones with nothing in flight are `failed` with advice to save the settings again,
// never `pending` for work that is not happening.

import { DockerSandboxProvider } from '../..'
import { BUSYBOX, docker, uniqueNamespace } from '../helpers'
import {
  Build,
  ensureRegistries,
  ImageTracker,
  PLAIN,
  pollUntil,
  pushAndForget,
  Registries,
  repoName,
  SAVE_AGAIN,
  statusInFreshProcess,
  writeFiles,
} from './support'

jest.setTimeout(90_000)

const namespace = uniqueNamespace('t-img-restart')
const images = new ImageTracker(namespace)
let registries: Registries
let ctx: string

beforeAll(() => {
  registries = ensureRegistries()
  ctx = images.tempDir('tf-restart-ctx')
  // COPY only: no RUN step, so no build container is needed.
  writeFiles(ctx, {
    Dockerfile: `FROM ${BUSYBOX}\nCOPY note.txt /opt/note.txt\n`,
    'note.txt': `restart-${namespace}\n`,
  })
}, 120_000)

afterAll(() => {
  images.cleanup(registries)
})

test('a built image is ready from a new provider object and from a new process', async () => {
  const opts = { image: 'unused-when-building:1', namespace, build: { context: ctx } }
  const p = new DockerSandboxProvider(opts)
  const first = (await p.buildImage()) as Build
  images.ref(first.metadata!.image)
  const { last } = await pollUntil(p, (b) => b.status !== 'pending', 60_000)
  expect(last.status).toBe('ready')
  p.dispose()

  const again = new DockerSandboxProvider(opts)
  const same = (await again.getImageBuildStatus()) as Build
  expect(same.status).toBe('ready')
  expect(same.metadata).toEqual(last.metadata)
  again.dispose()

  const fresh = statusInFreshProcess(opts)
  expect(fresh.status).toBe('ready')
  expect(fresh.reason).toBe(last.reason)
  expect(fresh.metadata).toEqual(last.metadata)
  expect(fresh.metadata!.imageId).toBe(docker(['image', 'inspect', '--format', '{{.Id}}', last.metadata!.image]))
})

test('a pulled image is ready from a new process, with the same image id', async () => {
  const ref = images.ref(`${repoName(PLAIN, namespace, 'pulled')}:1`)
  pushAndForget(BUSYBOX, ref)
  const p = new DockerSandboxProvider({ image: ref, namespace })
  await p.buildImage()
  const { last } = await pollUntil(p, (b) => b.status !== 'pending', 30_000)
  expect(last.status).toBe('ready')
  p.dispose()
  const fresh = statusInFreshProcess({ image: ref, namespace })
  expect(fresh.status).toBe('ready')
  expect(fresh.metadata!.image).toBe(ref)
  expect(fresh.metadata!.imageId).toBe(last.metadata!.imageId)
})

test('an absent image with nothing in flight is failed with save-again advice, here and in a new process', async () => {
  const ref = `${repoName(PLAIN, namespace, 'never-pushed')}:1`
  const opts = { image: ref, namespace }
  const here = (await new DockerSandboxProvider(opts).getImageBuildStatus()) as Build
  expect(here.status).toBe('failed')
  expect(here.reason).toContain(ref)
  expect(here.reason).toMatch(/no pull is running/)
  expect(here.reason).toMatch(SAVE_AGAIN)
  expect(here.metadata).toEqual({ image: ref })
  const fresh = statusInFreshProcess(opts)
  expect(fresh).toEqual(here)
})

test('an unbuilt context with nothing in flight is failed with save-again advice in a new process', async () => {
  const ctx2 = images.tempDir('tf-restart-unbuilt')
  writeFiles(ctx2, {
    Dockerfile: `FROM ${BUSYBOX}\nCOPY note.txt /opt/note.txt\n`,
    'note.txt': `unbuilt-${namespace}\n`,
  })
  const opts = { image: 'unused-when-building:1', namespace, build: { context: ctx2 } }
  const fresh = statusInFreshProcess(opts)
  expect(fresh.status).toBe('failed')
  expect(fresh.reason).toMatch(/no build is running/)
  expect(fresh.reason).toMatch(SAVE_AGAIN)
  expect(fresh.metadata!.image).toMatch(/^trueforge-sandbox-build:[0-9a-f]{16}$/)
  expect(fresh.metadata!.buildContext).toBe(ctx2)
  // The read built nothing.
  expect((await new DockerSandboxProvider(opts).getImageBuildStatus()).status).toBe('failed')
})
