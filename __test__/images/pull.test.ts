// Pulls through a real registry on loopback (scripts/engines/ensure-registry.sh, 127.0.0.1:5000):
// buildImage() starts one background pull and reports its progress, status reads never start
// another, a missing tag fails with the registry's reason and a later buildImage() retries, and
// createSandbox() on an absent image pulls it first.

import { DockerSandboxProvider } from '../..'
import { BUSYBOX, docker, dockerTry, ok, SandboxTracker, sleep, uniqueNamespace, waitFor } from '../helpers'
import {
  Build,
  ensureRegistries,
  ImageTracker,
  layerDigests,
  makeRandomLayerImage,
  manifestHeads,
  PLAIN,
  pollUntil,
  PULL_REASON,
  PullEvents,
  pushAndForget,
  Registries,
  removeBlobs,
  repoName,
  SAVE_AGAIN,
} from './support'

jest.setTimeout(90_000)

const namespace = uniqueNamespace('t-img-pull')
const images = new ImageTracker(namespace)
const sandboxes = new SandboxTracker(namespace)
let registries: Registries
const repo = (name: string) => repoName(PLAIN, namespace, name)
const repoPath = (name: string) => `tf-test/${namespace}/${name}`

// An image with a 24 MiB random layer on top of busybox: its pull really downloads.
const BIG = `${repo('big')}:1`
let bigLayers = 0
let bigBlobs: string[] = []
// Reasons seen while BIG was pulled (for the progress-text test).
const bigReasons: string[] = []

beforeAll(() => {
  registries = ensureRegistries()
  expect(registries.plain).toBe(PLAIN)
  const local = images.ref(`tf-test-local-${namespace}/big:1`)
  makeRandomLayerImage(BUSYBOX, local, 24, namespace)
  bigLayers = Number(docker(['image', 'inspect', '--format', '{{len .RootFS.Layers}}', local]))
  images.ref(BIG)
  pushAndForget(local, BIG)
  docker(['rmi', local]) // its random layer goes with it: the pull must download it again
  bigBlobs = layerDigests(PLAIN, repoPath('big'), '1')
}, 180_000)

afterAll(async () => {
  const p = new DockerSandboxProvider({ image: BUSYBOX, namespace })
  await sandboxes.cleanup(p)
  p.dispose()
  images.cleanup(registries)
  // The random layer is this file's alone; the busybox layer is shared and stays.
  if (registries && bigBlobs.length > 1) removeBlobs(registries.plainLog, bigBlobs.slice(1))
})

test('buildImage starts one background pull, reports progress, and status reads never start another', async () => {
  expect(dockerTry(['image', 'inspect', BIG]).status).not.toBe(0)
  const events = new PullEvents(BIG)
  const provider = new DockerSandboxProvider({ image: BIG, namespace })
  const other = new DockerSandboxProvider({ image: BIG, namespace })

  // Nothing in flight yet: a read says so and starts nothing.
  const before = (await provider.getImageBuildStatus()) as Build
  expect(before.status).toBe('failed')
  expect(before.reason).toMatch(SAVE_AGAIN)
  expect(manifestHeads(registries.plainLog, repoPath('big'), '1')).toBe(0)

  // Several callers at once, from two provider objects: one pull between them.
  const t0 = Date.now()
  const firsts = (await Promise.all([provider.buildImage(), other.buildImage(), provider.buildImage()])) as Build[]
  expect(Date.now() - t0).toBeLessThan(3000) // returns at once
  for (const b of firsts) expect(b.status).toBe('pending')
  const first = firsts[0]
  expect(first.status).toBe('pending')
  expect(first.reason).toMatch(PULL_REASON)
  expect(first.reason).toContain(BIG)
  expect(first.metadata).toEqual({ image: BIG })

  // While it runs: many reads, and buildImage again from this and another provider object.
  const seen: Build[] = [first]
  let i = 0
  let last = first
  const deadline = Date.now() + 60_000
  while (last.status === 'pending' && Date.now() < deadline) {
    i++
    last = (
      i % 4 === 0 ? await (i % 8 === 0 ? other : provider).buildImage() : await provider.getImageBuildStatus()
    ) as Build
    seen.push(last)
    await sleep(10)
  }
  for (const b of seen.slice(0, -1)) {
    expect(b.status).toBe('pending')
    expect(b.reason).toMatch(PULL_REASON)
    expect(b.metadata).toEqual({ image: BIG })
  }
  bigReasons.push(...seen.filter((b) => b.status === 'pending').map((b) => b.reason!))
  expect(last.status).toBe('ready')

  const imageId = docker(['image', 'inspect', '--format', '{{.Id}}', BIG])
  expect(last.metadata!.image).toBe(BIG)
  expect(last.metadata!.imageId).toBe(imageId)
  expect(last.metadata!.digest).toMatch(new RegExp(`^${repo('big').replace(/[.]/g, '\\.')}@sha256:[0-9a-f]{64}$`))
  expect(last.metadata).toMatchObject({ sh: 'yes', python3: 'no', git: 'no' })

  // Exactly one pull: one engine pull event, one manifest request at the registry.
  expect(await events.stop()).toBe(1)
  expect(manifestHeads(registries.plainLog, repoPath('big'), '1')).toBe(1)
  // Ready stays ready, and more calls pull nothing.
  expect(((await other.buildImage()) as Build).status).toBe('ready')
  expect(manifestHeads(registries.plainLog, repoPath('big'), '1')).toBe(1)
  provider.dispose()
  other.dispose()
})

test('pull progress counts the layers of the image and shows bytes downloaded', () => {
  // Needs the first test's observations.
  expect(bigReasons.length).toBeGreaterThan(0)
  const layerReasons = bigReasons
    .map((r) => /: (\d+)\/(\d+) layers done, (\d+\.\d) MiB of (\d+\.\d) MiB downloaded$/.exec(r))
    .filter((m): m is RegExpExecArray => m !== null)
  // The 24 MiB layer takes long enough on loopback that some per-layer progress is seen.
  expect(layerReasons.length).toBeGreaterThan(0)
  for (const m of layerReasons) {
    const [done, total] = [Number(m[1]), Number(m[2])]
    // "n/m layers done": m counts the layers the engine has announced so far (it announces them
    // one by one right after the manifest), never more than the image has, and never the tag.
    expect({ reason: m[0], total: Math.min(total, bigLayers) }).toEqual({ reason: m[0], total })
    expect(done).toBeLessThanOrEqual(total)
  }
  // Once all are announced, m is the image's layer count (busybox + the random layer).
  expect(layerReasons.some((m) => Number(m[2]) === bigLayers)).toBe(true)
  // Some download was visible: a nonzero total of at least the random layer's size.
  expect(layerReasons.some((m) => Number(m[4]) >= 20)).toBe(true)
})

test('a missing tag fails with the registry reason; reads do not retry, a later buildImage does', async () => {
  const ref = images.ref(`${repo('late')}:1`)
  const heads = () => manifestHeads(registries.plainLog, repoPath('late'), '1')
  const provider = new DockerSandboxProvider({ image: ref, namespace })

  const b = (await provider.buildImage()) as Build
  expect(['pending', 'failed']).toContain(b.status)
  const { last: failed } = await pollUntil(provider, (x) => x.status !== 'pending', 30_000)
  expect(failed.status).toBe('failed')
  expect(failed.reason).toContain(ref)
  expect(failed.reason).toMatch(/manifest unknown|not found/)
  expect(failed.metadata).toEqual({ image: ref })
  expect(heads()).toBe(1)

  // Sticky: reads (from any provider object) report the failure and start nothing.
  await sleep(300)
  expect(await provider.getImageBuildStatus()).toEqual(failed)
  expect(await new DockerSandboxProvider({ image: ref, namespace }).getImageBuildStatus()).toEqual(failed)
  expect(heads()).toBe(1)

  // buildImage retries: a second request reaches the registry, and it fails again.
  const again = (await provider.buildImage()) as Build
  expect(['pending', 'failed']).toContain(again.status)
  await waitFor(() => heads() === 2, 20_000, 'the retried pull at the registry', 25)
  const { last: failedAgain } = await pollUntil(provider, (x) => x.status !== 'pending', 30_000)
  expect(failedAgain.status).toBe('failed')
  expect(failedAgain.reason).toMatch(/manifest unknown|not found/)

  // Once the tag exists, the next buildImage pulls it.
  pushAndForget(BUSYBOX, ref)
  const third = (await provider.buildImage()) as Build
  expect(['pending', 'ready']).toContain(third.status)
  const { last: ready } = await pollUntil(provider, (x) => x.status !== 'pending', 30_000)
  expect(ready.status).toBe('ready')
  expect(heads()).toBe(3)
  provider.dispose()
})

test('createSandbox on an image not yet pulled pulls it first (one pull) and succeeds', async () => {
  const ref = images.ref(`${repo('lazy')}:1`)
  pushAndForget(BUSYBOX, ref)
  const provider = new DockerSandboxProvider({ image: ref, namespace, network: 'none' })
  const st = (await provider.getImageBuildStatus()) as Build
  expect(st.status).toBe('failed')
  expect(st.reason).toMatch(SAVE_AGAIN)

  const events = new PullEvents(ref)
  const id = await sandboxes.create(provider)
  expect(await ok(provider, id, 'echo from-pulled-image')).toContain('from-pulled-image')
  expect(dockerTry(['image', 'inspect', ref]).status).toBe(0)
  expect(await events.stop()).toBe(1)
  expect(manifestHeads(registries.plainLog, repoPath('lazy'), '1')).toBe(1)
  expect(((await provider.getImageBuildStatus()) as Build).status).toBe('ready')
  // A second sandbox needs no pull.
  const id2 = await sandboxes.create(provider)
  expect(await ok(provider, id2, 'echo second')).toContain('second')
  expect(manifestHeads(registries.plainLog, repoPath('lazy'), '1')).toBe(1)
  await provider.removeSandbox(id)
  await provider.removeSandbox(id2)
  provider.dispose()
})

test('metadata.digest is the digest of the configured repository, even when the image has several', async () => {
  // The same content pushed to two repositories: after both are pulled, one image has two
  // RepoDigests. Each provider must report its own repository's digest.
  const a = images.ref(`${repo('twin-a')}:1`)
  const b = images.ref(`${repo('twin-b')}:1`)
  pushAndForget(BUSYBOX, a)
  pushAndForget(BUSYBOX, b)
  const digests: Record<string, string> = {}
  for (const ref of [a, b]) {
    const p = new DockerSandboxProvider({ image: ref, namespace })
    await p.buildImage()
    const { last } = await pollUntil(p, (x) => x.status !== 'pending', 30_000)
    expect(last.status).toBe('ready')
    p.dispose()
  }
  for (const ref of [a, b]) {
    const last = (await new DockerSandboxProvider({ image: ref, namespace }).getImageBuildStatus()) as Build
    digests[ref] = last.metadata!.digest
  }
  const repoOf = (ref: string) => ref.slice(0, ref.lastIndexOf(':'))
  expect(digests[a].startsWith(`${repoOf(a)}@sha256:`) ? 'own repository' : digests[a]).toBe('own repository')
  expect(digests[b].startsWith(`${repoOf(b)}@sha256:`) ? 'own repository' : digests[b]).toBe('own repository')
})
