// The readiness probe: an image without /bin/sh is `failed`; one with a shell but without what
// TrueForge's skill init needs is `ready` with a reason naming what is missing; the realistic
// images report every tool. Also checks the recommended image trueforge-sandbox:1
// (images/trueforge/Dockerfile, made offline by scripts/ensure-images.sh) end to end.

import { execFileSync } from 'node:child_process'
import path from 'node:path'

import { DockerSandboxProvider } from '../..'
import { BUSYBOX, DEBIAN, docker, ok, SandboxTracker, uniqueNamespace } from '../helpers'
import { Build, bridgeWorks, ImageTracker, pollUntil, ROOT, writeFiles } from './support'

jest.setTimeout(90_000)

const TRUEFORGE = 'trueforge-sandbox:1'
const namespace = uniqueNamespace('t-img-probe')
const images = new ImageTracker(namespace)
const sandboxes = new SandboxTracker(namespace)

beforeAll(() => {
  // Reuses present images; makes trueforge-sandbox:1 (about 30 s) when it is missing.
  execFileSync('bash', [path.join(ROOT, 'scripts', 'ensure-images.sh'), 'all'], { stdio: 'ignore', timeout: 170_000 })
}, 180_000)

afterAll(async () => {
  const p = new DockerSandboxProvider({ image: BUSYBOX, namespace })
  await sandboxes.cleanup(p)
  p.dispose()
  images.cleanup()
})

/** No probe container of this image is left (only for images no other test file uses). */
function noProbeLeft(image: string) {
  expect(docker(['ps', '-aq', '--filter', 'label=trueforge.sandbox.probe', '--filter', `ancestor=${image}`])).toBe('')
}

test('an image without /bin/sh is failed, with a reason saying so', async () => {
  const ctx = images.tempDir('tf-probe-scratch')
  writeFiles(ctx, { Dockerfile: 'FROM scratch\nCOPY somefile /somefile\n', somefile: `no shell here ${namespace}\n` })
  const p = new DockerSandboxProvider({ image: 'unused-when-building:1', namespace, build: { context: ctx } })
  const first = (await p.buildImage()) as Build
  const tag = images.ref(first.metadata!.image)
  const { last } = await pollUntil(p, (b) => b.status !== 'pending', 60_000)
  expect(last.status).toBe('failed')
  expect(last.reason).toContain(tag)
  expect(last.reason).toMatch(/\/bin\/sh/)
  expect(last.metadata).toMatchObject({ image: tag, sh: 'no', bash: 'no', python3: 'no', pydantic: 'no', git: 'no' })
  expect(last.metadata!.imageId).toBe(docker(['image', 'inspect', '--format', '{{.Id}}', tag]))
  // buildImage on the present image answers the same, without building again.
  expect(await p.buildImage()).toEqual(last)
  noProbeLeft(tag)
  p.dispose()
})

test('busybox has a shell but no python3 or git: ready, and the reason names what is missing', async () => {
  const b = (await new DockerSandboxProvider({ image: BUSYBOX, namespace }).getImageBuildStatus()) as Build
  expect(b.status).toBe('ready')
  expect(b.metadata).toMatchObject({ image: BUSYBOX, sh: 'yes', bash: 'no', python3: 'no', pydantic: 'no', git: 'no' })
  expect(b.reason).toContain(BUSYBOX)
  expect(b.reason).toMatch(/python3/)
  expect(b.reason).toMatch(/git/)
})

test('python3 without pydantic, and no git: ready, and the reason names pydantic and git', async () => {
  const bridge = bridgeWorks()
  if (!bridge.ok) throw new Error(`the engine cannot run RUN steps (default bridge unusable): ${bridge.detail}`)
  const ctx = images.tempDir('tf-probe-nopydantic')
  writeFiles(ctx, {
    Dockerfile: `FROM ${DEBIAN}\nRUN rm -rf /usr/lib/python3/dist-packages/pydantic /usr/bin/git && echo ${namespace} > /etc/tf-probe\n`,
  })
  const p = new DockerSandboxProvider({ image: 'unused-when-building:1', namespace, build: { context: ctx } })
  const first = (await p.buildImage()) as Build
  images.ref(first.metadata!.image)
  const { last } = await pollUntil(p, (b) => b.status !== 'pending', 60_000)
  expect(last.status).toBe('ready')
  expect(last.metadata).toMatchObject({ sh: 'yes', bash: 'yes', python3: 'yes', pydantic: 'no', git: 'no' })
  expect(last.reason).toMatch(/pydantic/)
  expect(last.reason).toMatch(/git/)
  p.dispose()
})

test.each([DEBIAN, TRUEFORGE])('%s reports every tool and no reason', async (image) => {
  const p = new DockerSandboxProvider({ image, namespace })
  for (const b of [(await p.getImageBuildStatus()) as Build, (await p.buildImage()) as Build]) {
    expect(b.status).toBe('ready')
    expect(b.reason).toBeNull()
    expect(b.metadata).toMatchObject({ image, sh: 'yes', bash: 'yes', python3: 'yes', pydantic: 'yes', git: 'yes' })
    expect(b.metadata!.imageId).toBe(docker(['image', 'inspect', '--format', '{{.Id}}', image]))
  }
  p.dispose()
})

test('trueforge-sandbox:1 works as a sandbox: user agent, bash, python3 + pydantic, git, rg, jq, curl', async () => {
  const config = JSON.parse(docker(['image', 'inspect', '--format', '{{json .Config}}', TRUEFORGE]))
  expect(config.User).toBe('agent')
  expect(config.WorkingDir).toBe('/home/agent')
  expect(config.Env).toEqual(expect.arrayContaining(['LANG=C.UTF-8']))

  const p = new DockerSandboxProvider({ image: TRUEFORGE, namespace, network: 'none' })
  const id = await sandboxes.create(p)
  // Commands start in the sandbox root, as the image's user.
  expect((await ok(p, id, 'pwd')).trim()).toBe(id)
  expect((await ok(p, id, 'id -un; id -u; id -gn')).trim().split('\n')).toEqual(['agent', '1000', 'agent'])
  expect((await ok(p, id, 'echo "$HOME"')).trim()).toBe('/home/agent')
  expect((await ok(p, id, 'echo "${BASH_VERSION:-none}"')).trim()).toMatch(/^5\.2\./)
  expect((await ok(p, id, `python3 -c 'import pydantic; print(pydantic.VERSION)'`)).trim()).toBe('1.10.4')
  expect(await ok(p, id, 'git --version')).toMatch(/^git version 2\.39\.5/)
  expect(await ok(p, id, 'rg --version')).toMatch(/^ripgrep 13\.0\.0/)
  expect((await ok(p, id, 'jq --version')).trim()).toBe('jq-1.6')
  expect(await ok(p, id, 'curl --version')).toMatch(/^curl 7\.88\.1/)
  expect(await ok(p, id, 'ps -o pid= -p $$')).toMatch(/\d+/)
  expect(await ok(p, id, 'test -s /etc/ssl/certs/ca-certificates.crt && echo certs')).toContain('certs')
  // The agent owns its sandbox root and can write there and in its home.
  expect((await ok(p, id, 'echo hi > made.txt && stat -c %U made.txt && touch ~/x && echo home-ok')).trim().split('\n')).toEqual([
    'agent',
    'home-ok',
  ])
  expect((await ok(p, id, `printf 'a\\nneedle\\n' | rg -c needle; echo '{"k":7}' | jq .k`)).trim().split('\n')).toEqual(['1', '7'])
  await p.removeSandbox(id)
  p.dispose()
})

test('the Dockerfile and the offline image agree on the package pins', () => {
  // ensure-images.sh installs exactly the Dockerfile's pins; the image must hold those versions.
  const dockerfile = require('node:fs').readFileSync(path.join(ROOT, 'images', 'trueforge', 'Dockerfile'), 'utf8') as string
  const pins = [...dockerfile.matchAll(/^\s+([a-z0-9][a-z0-9.+-]*)=(\S+) \\$/gm)].map((m) => [m[1], m[2]])
  expect(pins.map((p) => p[0]).sort()).toEqual(
    ['bash', 'ca-certificates', 'curl', 'git', 'jq', 'procps', 'python3', 'python3-pydantic', 'ripgrep'].sort(),
  )
  expect(dockerfile).toMatch(/^FROM debian:12\.\d+-slim$/m)
  expect(dockerfile).toMatch(/^USER agent$/m)
  expect(dockerfile).toMatch(/^WORKDIR \/home\/agent$/m)
  const installed = docker([
    'run',
    '--rm',
    '--network',
    'none',
    '--label',
    `trueforge-test.namespace=${namespace}`,
    TRUEFORGE,
    'dpkg-query',
    '-W',
    '-f',
    '${Package}=${Version}\\n',
    ...pins.map((p) => p[0]),
  ])
    .split('\n')
    .sort()
  expect(installed).toEqual(pins.map((p) => `${p[0]}=${p[1]}`).sort())
})
