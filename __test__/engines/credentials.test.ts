// Registry credentials from the Docker config when `registryAuth` names none for the registry:
// plain `auths` (as `docker login` writes them), and a `credHelpers` entry running a tiny
// `docker-credential-*` helper written here; an unusable helper is an error naming it. Against
// the loopback registry with htpasswd (scripts/engines/ensure-registry.sh, 127.0.0.1:5001). Each case
// runs in a fresh process with its own DOCKER_CONFIG (the addon reads the real environment).

import { execFileSync, spawnSync } from 'node:child_process'
import { chmodSync, readFileSync, writeFileSync } from 'node:fs'
import path from 'node:path'

import { BUSYBOX, uniqueNamespace } from '../helpers'
import { AUTH, ensureRegistries, ImageTracker, pushAndForget, Registries, repoName } from '../images/support'

jest.setTimeout(90_000)

const namespace = uniqueNamespace('t-creds')
const images = new ImageTracker(namespace)
const CHILD = path.join(__dirname, 'child.js')
const ENV_KEYS = [
  'DOCKER_HOST',
  'DOCKER_TLS_VERIFY',
  'DOCKER_TLS',
  'DOCKER_CERT_PATH',
  'DOCKER_CONTEXT',
  'DOCKER_CONFIG',
]
let registries: Registries
const ref = (name: string) => images.ref(`${repoName(AUTH, namespace, name)}:1`)
let VIA_AUTHS = ''
let VIA_HELPER = ''
let VIA_BROKEN = ''
let VIA_STORE = ''

beforeAll(() => {
  registries = ensureRegistries()
  VIA_AUTHS = ref('via-auths')
  VIA_HELPER = ref('via-helper')
  VIA_BROKEN = ref('via-broken')
  VIA_STORE = ref('via-store')
  for (const r of [VIA_AUTHS, VIA_HELPER, VIA_BROKEN, VIA_STORE])
    pushAndForget(BUSYBOX, r, { user: registries.user, password: registries.password })
}, 180_000)

afterAll(() => {
  images.cleanup(registries)
})

/** createSandbox + exec + transfer + remove of `image` in a fresh process with `env`. */
function inChild(image: string, env: Record<string, string>) {
  const base = { ...process.env }
  for (const k of ENV_KEYS) delete base[k]
  const r = spawnSync(process.execPath, [CHILD, JSON.stringify({ image, namespace, network: 'none' })], {
    env: { ...base, ...env },
    encoding: 'utf8',
    timeout: 60_000,
  })
  const result = JSON.parse(r.stdout.trim().split('\n').pop()!)
  // Never a secret in anything the provider said: results, errors, logs.
  expect(r.stdout).not.toContain(registries.password)
  expect(r.stderr).not.toContain(registries.password)
  return result
}

test('plain `auths` written by `docker login` into DOCKER_CONFIG pull a private image', () => {
  const cfg = images.tempDir('tf-creds-auths')
  execFileSync('docker', ['--config', cfg, 'login', '-u', registries.user, '--password-stdin', AUTH], {
    input: registries.password,
    stdio: ['pipe', 'ignore', 'ignore'],
  })
  expect(JSON.parse(readFileSync(path.join(cfg, 'config.json'), 'utf8')).auths[AUTH].auth).toBeTruthy()
  const r = inChild(VIA_AUTHS, { DOCKER_CONFIG: cfg })
  expect(r.error).toBeUndefined()
  expect(r.downloaded).toBe('tls bytes')
  // Without the config the same kind of pull is refused by the registry (the config did it).
  const none = inChild(VIA_BROKEN, { DOCKER_CONFIG: images.tempDir('tf-creds-empty') })
  expect(none.error?.message).toMatch(/no basic auth credentials|unauthorized|authentication required/i)
})

test('a credHelpers entry runs docker-credential-<name> get with the registry on stdin', () => {
  const cfg = images.tempDir('tf-creds-helper')
  const bin = images.tempDir('tf-creds-bin')
  const calls = path.join(bin, 'calls.log')
  const helper = path.join(bin, 'docker-credential-tftest')
  writeFileSync(
    helper,
    `#!/bin/sh\nread server\necho "$1 $server" >> ${calls}\nprintf '{"ServerURL":"%s","Username":"%s","Secret":"%s"}' "$server" "$TF_USER" "$TF_SECRET"\n`,
  )
  chmodSync(helper, 0o755)
  // credsStore names a helper that does not exist: credHelpers wins for this registry.
  writeFileSync(
    path.join(cfg, 'config.json'),
    JSON.stringify({ credsStore: 'not-installed', credHelpers: { [AUTH]: 'tftest' } }),
  )
  const r = inChild(VIA_HELPER, {
    DOCKER_CONFIG: cfg,
    PATH: `${bin}:${process.env.PATH}`,
    TF_USER: registries.user,
    TF_SECRET: registries.password,
  })
  expect(r.error).toBeUndefined()
  expect(r.exec.success).toBe(true)
  expect(readFileSync(calls, 'utf8')).toBe(`get ${AUTH}\n`)
})

test('credsStore: the one helper for every registry credHelpers does not name', () => {
  const cfg = images.tempDir('tf-creds-store')
  const bin = images.tempDir('tf-creds-store-bin')
  const helper = path.join(bin, 'docker-credential-tfstore')
  writeFileSync(
    helper,
    `#!/bin/sh\nread server\n[ "$1" = get ] && [ "$server" = "${AUTH}" ] || exit 1\nprintf '{"Username":"%s","Secret":"%s"}' "$TF_USER" "$TF_SECRET"\n`,
  )
  chmodSync(helper, 0o755)
  writeFileSync(
    path.join(cfg, 'config.json'),
    JSON.stringify({ credsStore: 'tfstore', credHelpers: { 'other.example:5000': 'not-installed' } }),
  )
  const r = inChild(VIA_STORE, {
    DOCKER_CONFIG: cfg,
    PATH: `${bin}:${process.env.PATH}`,
    TF_USER: registries.user,
    TF_SECRET: registries.password,
  })
  expect(r.error).toBeUndefined()
  expect(r.downloaded).toBe('tls bytes')
})

test('an unusable helper is a clear error naming it (missing, or failing)', () => {
  const cfg = images.tempDir('tf-creds-broken')
  const bin = images.tempDir('tf-creds-broken-bin')
  writeFileSync(path.join(cfg, 'config.json'), JSON.stringify({ credHelpers: { [AUTH]: 'tfmissing' } }))
  const missing = inChild(VIA_BROKEN, { DOCKER_CONFIG: cfg, PATH: `${bin}:${process.env.PATH}` })
  expect(missing.error?.message).toContain('docker-credential-tfmissing')
  expect(missing.error?.message).toContain(AUTH)

  const failing = path.join(bin, 'docker-credential-tffails')
  writeFileSync(failing, '#!/bin/sh\necho "the keyring is locked" >&2\nexit 4\n')
  chmodSync(failing, 0o755)
  writeFileSync(path.join(cfg, 'config.json'), JSON.stringify({ credHelpers: { [AUTH]: 'tffails' } }))
  const failed = inChild(VIA_BROKEN, { DOCKER_CONFIG: cfg, PATH: `${bin}:${process.env.PATH}` })
  expect(failed.error?.message).toContain('docker-credential-tffails')
  expect(failed.error?.message).toContain('the keyring is locked')
})
