// The readiness probe: an image without /bin/sh is `failed`; any other image is `ready` with
// `reason: null`, and what it lacks for TrueForge (python >= 3.9 with the pydantic v2 API and
// git for the skill init; genson, curl, jq, ripgrep for the agent) is a `metadata.warning` and a
// logged warning; tool versions are recorded. Also checks the recommended image
// trueforge-sandbox:2 (images/trueforge/Dockerfile, made offline by scripts/images/ensure-images.sh) end
// to end, and that it holds exactly the pins of the Dockerfile and requirements.txt.

import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import path from 'node:path'

import { DockerSandboxProvider } from '../..'
import { BUSYBOX, DEBIAN, docker, ok, SandboxTracker, TRUEFORGE, uniqueNamespace, waitFor } from '../helpers'
import { Build, bridgeWorks, ImageTracker, pollUntil, ROOT, writeFiles } from './support'

jest.setTimeout(90_000)

const namespace = uniqueNamespace('t-img-probe')
const images = new ImageTracker(namespace)
const sandboxes = new SandboxTracker(namespace)

beforeAll(() => {
  // Reuses present images; makes trueforge-sandbox:2 (about 90 s) when it is missing or stale.
  execFileSync('bash', [path.join(ROOT, 'scripts', 'images', 'ensure-images.sh'), 'all'], {
    stdio: 'ignore',
    timeout: 170_000,
  })
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

/** A logger that records what the provider logs. */
function recordingLogger() {
  const lines: Array<{ level: string; message: string; meta: any }> = []
  const at = (level: string) => (message: string, meta: any) => lines.push({ level, message, meta })
  return { lines, logger: { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') } }
}

test('busybox has a shell but no python3 or git: ready, reason null, a warning names what is missing', async () => {
  const b = (await new DockerSandboxProvider({ image: BUSYBOX, namespace }).getImageBuildStatus()) as Build
  expect(b.status).toBe('ready')
  expect(b.reason).toBeNull()
  expect(b.metadata).toMatchObject({
    image: BUSYBOX,
    sh: 'yes',
    bash: 'no',
    python3: 'no',
    python: 'no',
    pydantic: 'no',
    pydanticV2: 'no',
    git: 'no',
    genson: 'no',
  })
  expect(b.metadata!.warning).toContain(BUSYBOX)
  expect(b.metadata!.warning).toMatch(/lacks python3, git, which TrueForge's skill init needs/)
  expect(b.metadata!.warning).toMatch(/also lacks bash, genson, curl, jq, rg/)
})

test('python3 without pydantic, and no git: ready, reason null, warned once in metadata and the log', async () => {
  const bridge = bridgeWorks()
  if (!bridge.ok) throw new Error(`the engine cannot run RUN steps (default bridge unusable): ${bridge.detail}`)
  const ctx = images.tempDir('tf-probe-nopydantic')
  writeFiles(ctx, {
    Dockerfile: `FROM ${DEBIAN}\nRUN rm -rf /usr/lib/python3/dist-packages/pydantic /usr/bin/git && echo ${namespace} > /etc/tf-probe\n`,
  })
  const { lines, logger } = recordingLogger()
  const p = new DockerSandboxProvider({ image: 'unused-when-building:1', namespace, build: { context: ctx }, logger })
  const first = (await p.buildImage()) as Build
  const tag = images.ref(first.metadata!.image)
  const { last } = await pollUntil(p, (b) => b.status !== 'pending', 60_000)
  expect(last.status).toBe('ready')
  expect(last.reason).toBeNull()
  expect(last.metadata).toMatchObject({
    sh: 'yes',
    python3: 'yes',
    python: '3.11.2',
    pydantic: 'no',
    pydanticV2: 'no',
    git: 'no',
  })
  expect(last.metadata!.bash).toMatch(/^5\.2\./)
  const w = last.metadata!.warning
  expect(w).toContain(tag)
  expect(w).toMatch(/pydantic v2 API \(.*none is installed\)/)
  expect(w).toMatch(/, git, which TrueForge's skill init needs/)
  // Logged as a warning, once for this image however often the status is read.
  expect(await p.getImageBuildStatus()).toEqual(last)
  await waitFor(() => lines.some((l) => l.level === 'warn'), 5_000, 'the logged warning', 25)
  const warned = lines.filter((l) => l.level === 'warn' && l.message === w)
  expect(warned).toHaveLength(1)
  expect(warned[0].meta).toMatchObject({ image: tag })
  p.dispose()
})

test('Debian 12 (pydantic 1.10): ready, reason null, a warning that the pydantic v2 API is missing, versions recorded', async () => {
  const p = new DockerSandboxProvider({ image: DEBIAN, namespace })
  for (const b of [(await p.getImageBuildStatus()) as Build, (await p.buildImage()) as Build]) {
    expect(b.status).toBe('ready')
    expect(b.reason).toBeNull()
    expect(b.metadata).toMatchObject({
      image: DEBIAN,
      sh: 'yes',
      python3: 'yes',
      python: '3.11.2',
      pydantic: '1.10.4',
      pydanticV2: 'no',
      git: '2.39.5',
      genson: 'no',
    })
    expect(b.metadata!.warning).toBe(
      `image ${DEBIAN} lacks the pydantic v2 API (from pydantic import field_validator, ConfigDict; pydantic 1.10.4 is installed), ` +
        "which TrueForge's skill init needs: sessions with skills will fail at init; " +
        "it also lacks genson, curl, jq, rg (ripgrep) that TrueForge's exec tool tells the agent about",
    )
    expect(b.metadata!.imageId).toBe(docker(['image', 'inspect', '--format', '{{.Id}}', DEBIAN]))
  }
  p.dispose()
})

test(`${TRUEFORGE} is ready with no reason and no warning, and records every version`, async () => {
  const { lines, logger } = recordingLogger()
  const p = new DockerSandboxProvider({ image: TRUEFORGE, namespace, logger })
  for (const b of [(await p.getImageBuildStatus()) as Build, (await p.buildImage()) as Build]) {
    expect(b.status).toBe('ready')
    expect(b.reason).toBeNull()
    expect(b.metadata).toEqual({
      image: TRUEFORGE,
      imageId: docker(['image', 'inspect', '--format', '{{.Id}}', TRUEFORGE]),
      sh: 'yes',
      bash: '5.2.37',
      python3: 'yes',
      python: '3.13.5',
      pydantic: '2.12.5',
      pydanticV2: 'yes',
      git: '2.47.3',
      genson: '1.4.0',
      curl: '8.14.1',
      jq: '1.7',
      rg: '14.1.1',
    })
  }
  expect(lines.filter((l) => l.level === 'warn')).toEqual([])
  p.dispose()
})

test(`${TRUEFORGE} works as a sandbox: user agent, bash, python3.13 + pydantic 2, git, rg, jq, curl, genson`, async () => {
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
  expect((await ok(p, id, 'echo "${BASH_VERSION:-none}"')).trim()).toMatch(/^5\.2\.37/)
  expect(
    (await ok(p, id, `python3 -c 'import sys, pydantic; print(sys.version.split()[0], pydantic.VERSION)'`)).trim(),
  ).toBe('3.13.5 2.12.5')
  expect(await ok(p, id, 'git --version')).toMatch(/^git version 2\.47\.3/)
  expect(await ok(p, id, 'rg --version')).toMatch(/^ripgrep 14\.1\.1/)
  expect((await ok(p, id, 'jq --version')).trim()).toBe('jq-1.7')
  expect(await ok(p, id, 'curl --version')).toMatch(/^curl 8\.14\.1/)
  expect((await ok(p, id, 'command -v genson python3 pip; genson --version')).trim().split('\n')).toEqual([
    '/usr/local/bin/genson',
    '/usr/bin/python3',
    '/usr/bin/pip',
    'genson 1.4.0',
  ])
  expect(await ok(p, id, 'ps -o pid= -p $$')).toMatch(/\d+/)
  expect(await ok(p, id, 'test -s /etc/ssl/certs/ca-certificates.crt && echo certs')).toContain('certs')
  // The agent owns its sandbox root and can write there and in its home.
  expect(
    (await ok(p, id, 'echo hi > made.txt && stat -c %U made.txt && touch ~/x && echo home-ok')).trim().split('\n'),
  ).toEqual(['agent', 'home-ok'])
  expect((await ok(p, id, `printf 'a\\nneedle\\n' | rg -c needle; echo '{"k":7}' | jq .k`)).trim().split('\n')).toEqual(
    ['1', '7'],
  )
  await p.removeSandbox(id)
  p.dispose()
})

test('the Dockerfile and the offline image agree on the package pins, Debian and Python', () => {
  // ensure-images.sh installs exactly the Dockerfile's apt pins and requirements.txt's pins; the
  // image must hold those versions.
  const dir = path.join(ROOT, 'images', 'trueforge')
  const dockerfile = readFileSync(path.join(dir, 'Dockerfile'), 'utf8')
  const pins = [...dockerfile.matchAll(/^\s+([a-z0-9][a-z0-9.+-]*)=(\S+) \\$/gm)].map((m) => [m[1], m[2]])
  expect(pins.map((p) => p[0]).sort()).toEqual(
    [
      'bash',
      'ca-certificates',
      'curl',
      'git',
      'jq',
      'procps',
      'python3',
      'python3-pip',
      'ripgrep',
      'tree',
      'unzip',
      'zip',
    ].sort(),
  )
  expect(dockerfile).toMatch(/^FROM debian:13\.\d+-slim$/m)
  expect(dockerfile).toMatch(/^COPY requirements\.txt /m)
  expect(dockerfile).toMatch(/--require-hashes -r \/tmp\/requirements\.txt/)
  expect(dockerfile).toMatch(/^USER agent$/m)
  expect(dockerfile).toMatch(/^WORKDIR \/home\/agent$/m)
  const run = (...cmd: string[]) =>
    docker(['run', '--rm', '--network', 'none', '--label', `trueforge-test.namespace=${namespace}`, TRUEFORGE, ...cmd])
  const installed = run('dpkg-query', '-W', '-f', '${Package}=${Version}\\n', ...pins.map((p) => p[0]))
    .split('\n')
    .sort()
  expect(installed).toEqual(pins.map((p) => `${p[0]}=${p[1]}`).sort())

  const requirements = readFileSync(path.join(dir, 'requirements.txt'), 'utf8')
  const wheels = [...requirements.matchAll(/^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) --hash=sha256:[0-9a-f]{64}$/gm)].map(
    (m) => [m[1], m[2]],
  )
  // Every non-comment line is an exact, hashed pin.
  expect(wheels).toHaveLength(requirements.split('\n').filter((l) => l.trim() && !l.startsWith('#')).length)
  expect(Object.fromEntries(wheels)).toMatchObject({ pydantic: '2.12.5', genson: '1.4.0' })
  expect(wheels.map((w) => w[0])).toEqual(expect.arrayContaining(['pydantic-core', 'requests', 'aiohttp']))
  const script = 'import sys, importlib.metadata as m\nfor n in sys.argv[1:]: print(n + "==" + m.version(n))'
  const versions = run('python3', '-c', script, ...wheels.map((w) => w[0])).split('\n')
  expect(versions).toEqual(wheels.map((w) => `${w[0]}==${w[1]}`))
})
