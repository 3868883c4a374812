// Image readiness: getImageBuildStatus is read-only; buildImage starts a background pull that,
// with no registry reachable here, ends as 'failed' with a reason.

import { DockerSandboxProvider, SandboxError } from '..'
import {
  BUSYBOX,
  containersInNamespace,
  docker,
  dockerTry,
  rejection,
  SandboxTracker,
  sleep,
  TRUEFORGE,
  uniqueNamespace,
} from './helpers'

const namespace = uniqueNamespace('t-image')
const tracker = new SandboxTracker(namespace)
// A fresh name per run, so no earlier pull state in this process can answer for it.
const absent = `trueforge-sandbox-absent-${namespace}:never`
const present = new DockerSandboxProvider({ image: BUSYBOX, namespace })
const missing = new DockerSandboxProvider({ image: absent, namespace })

afterAll(async () => {
  await tracker.cleanup(present)
})

test('a present image is ready, from both calls, with metadata.image and the probe', async () => {
  const imageId = docker(['image', 'inspect', '--format', '{{.Id}}', BUSYBOX])
  for (const b of [await present.getImageBuildStatus(), await present.buildImage()]) {
    expect(b.status).toBe('ready')
    expect(b.metadata).not.toBeNull()
    expect(b.metadata!.image).toBe(BUSYBOX)
    expect(b.metadata!.imageId).toBe(imageId)
    // The busybox image has a shell but nothing TrueForge's skill init needs: still ready (no
    // reason), with a warning naming what is missing.
    expect(b.metadata).toMatchObject({ sh: 'yes', bash: 'no', python3: 'no', pydantic: 'no', git: 'no' })
    expect(b.reason).toBeNull()
    expect(b.metadata!.warning).toMatch(/python3/)
    expect(b.metadata!.warning).toMatch(/git/)
  }
})

test('the TrueForge-ready image is ready with no reason, no warning and every tool present', async () => {
  const b = await new DockerSandboxProvider({ image: TRUEFORGE, namespace }).getImageBuildStatus()
  expect(b.status).toBe('ready')
  expect(b.reason).toBeNull()
  expect(b.metadata).toMatchObject({ sh: 'yes', python3: 'yes', pydanticV2: 'yes' })
  expect(b.metadata!.warning).toBeUndefined()
  for (const tool of ['bash', 'python', 'pydantic', 'git', 'genson']) expect(b.metadata![tool]).toMatch(/^\d+\.\d+/)
})

test('an absent image is not ready, and reading the status never starts a pull', async () => {
  expect(dockerTry(['image', 'inspect', absent]).status).not.toBe(0)
  const first = await missing.getImageBuildStatus()
  expect(['failed', 'pending']).toContain(first.status)
  expect(first.status).not.toBe('ready')
  expect(typeof first.reason).toBe('string')
  expect(first.reason!.length).toBeGreaterThan(0)
  expect(first.reason).toContain(absent)
  expect(first.metadata?.image).toBe(absent)
  await sleep(300)
  const second = await new DockerSandboxProvider({ image: absent, namespace }).getImageBuildStatus()
  expect(second).toEqual(first)
})

test('creating a sandbox from an absent image fails clearly and leaves no container', async () => {
  const e = await rejection(missing.createSandbox())
  expect(e).toBeInstanceOf(SandboxError)
  expect(e.code).toBe('IMAGE_NOT_AVAILABLE')
  expect(e.message).toContain(absent)
  expect(containersInNamespace(namespace)).toEqual([])
})

test('buildImage on an absent image is pending or failed, and ends failed with a reason', async () => {
  const started = Date.now()
  const b = await missing.buildImage()
  expect(Date.now() - started).toBeLessThan(5000) // returns at once, the pull runs in the background
  expect(['pending', 'failed']).toContain(b.status)
  expect(b.reason).toEqual(expect.any(String))
  expect(b.reason!.length).toBeGreaterThan(0)

  let last = b
  const deadline = Date.now() + 20_000
  while (last.status !== 'failed' && Date.now() < deadline) {
    await sleep(250)
    last = await missing.getImageBuildStatus()
  }
  expect(last.status).toBe('failed')
  expect(last.reason).toEqual(expect.any(String))
  expect(last.reason!.length).toBeGreaterThan(0)
  // The failure is sticky until the next buildImage, and the same for every provider object.
  expect(await new DockerSandboxProvider({ image: absent, namespace }).getImageBuildStatus()).toEqual(last)
  // buildImage again is idempotent: it retries, and (still no registry) fails again.
  const again = await missing.buildImage()
  expect(['pending', 'failed']).toContain(again.status)
  expect(again.reason).toEqual(expect.any(String))
})
