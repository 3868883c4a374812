// registryAuth against a real registry with htpasswd basic auth on loopback
// (scripts/engines/ensure-registry.sh, 127.0.0.1:5001): without credentials, and with wrong ones, the
// pull fails with the registry's reason; with them it succeeds (buildImage and createSandbox).

import { DockerSandboxProvider } from '../..'
import { BUSYBOX, dockerTry, ok, SandboxTracker, uniqueNamespace } from '../helpers'
import {
  AUTH,
  Build,
  ensureRegistries,
  ImageTracker,
  manifestHeads,
  pollUntil,
  PULL_REASON,
  pushAndForget,
  Registries,
  repoName,
} from './support'

jest.setTimeout(90_000)

const namespace = uniqueNamespace('t-img-auth')
const images = new ImageTracker(namespace)
const sandboxes = new SandboxTracker(namespace)
let registries: Registries
const REF = `${repoName(AUTH, namespace, 'private')}:1`
const LAZY = `${repoName(AUTH, namespace, 'private-lazy')}:1`

beforeAll(() => {
  registries = ensureRegistries()
  expect(registries.auth).toBe(AUTH)
  for (const r of [REF, LAZY]) {
    images.ref(r)
    pushAndForget(BUSYBOX, r, { user: registries.user, password: registries.password })
  }
}, 120_000)

afterAll(async () => {
  const p = new DockerSandboxProvider({ image: BUSYBOX, namespace })
  await sandboxes.cleanup(p)
  p.dispose()
  images.cleanup(registries)
})

test('the registry really requires credentials', () => {
  const r = dockerTry(['pull', REF])
  expect(r.status).not.toBe(0)
  expect(r.stderr).toMatch(/no basic auth credentials|unauthorized|authentication required/i)
})

test('without registryAuth the pull fails, naming the missing authorization', async () => {
  const provider = new DockerSandboxProvider({ image: REF, namespace })
  await provider.buildImage()
  const { last } = await pollUntil(provider, (b) => b.status !== 'pending', 30_000)
  expect(last.status).toBe('failed')
  expect(last.reason).toContain(REF)
  expect(last.reason).toMatch(/no basic auth credentials|unauthorized|authentication required/i)
  expect(dockerTry(['image', 'inspect', REF]).status).not.toBe(0)
  provider.dispose()
})

test('with a wrong password the pull fails as unauthorized', async () => {
  const provider = new DockerSandboxProvider({
    image: REF,
    namespace,
    registryAuth: { [AUTH]: { username: registries.user, password: 'not-the-password' } },
  })
  await provider.buildImage()
  const { last } = await pollUntil(provider, (b) => b.status !== 'pending', 30_000)
  expect(last.status).toBe('failed')
  expect(last.reason).toMatch(/unauthorized|authentication required/i)
  expect(dockerTry(['image', 'inspect', REF]).status).not.toBe(0)
  provider.dispose()
})

test('with registryAuth { host: { username, password } } the pull succeeds', async () => {
  const provider = new DockerSandboxProvider({
    image: REF,
    namespace,
    registryAuth: { [AUTH]: { username: registries.user, password: registries.password } },
  })
  const headsBefore = manifestHeads(registries.authLog, `tf-test/${namespace}/private`, '1')
  const first = (await provider.buildImage()) as Build
  // The earlier failure is retried: the new attempt is in flight (or already done).
  expect(['pending', 'ready']).toContain(first.status)
  if (first.status === 'pending') expect(first.reason).toMatch(PULL_REASON)
  const { last } = await pollUntil(provider, (b) => b.status !== 'pending', 30_000)
  expect(last.status).toBe('ready')
  expect(last.metadata!.image).toBe(REF)
  expect(dockerTry(['image', 'inspect', REF]).status).toBe(0)
  // One more (authenticated) attempt reached the registry.
  expect(manifestHeads(registries.authLog, `tf-test/${namespace}/private`, '1')).toBeGreaterThan(headsBefore)
  provider.dispose()
})

test('credentials may be keyed with a scheme and a trailing slash, and createSandbox uses them', async () => {
  const provider = new DockerSandboxProvider({
    image: LAZY,
    namespace,
    network: 'none',
    registryAuth: { [`http://${AUTH}/`]: { username: registries.user, password: registries.password } },
  })
  const id = await sandboxes.create(provider)
  expect(await ok(provider, id, 'echo private-ok')).toContain('private-ok')
  expect(((await provider.getImageBuildStatus()) as Build).status).toBe('ready')
  await provider.removeSandbox(id)
  provider.dispose()
})
