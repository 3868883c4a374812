// ssh:// engines as the Docker CLI reaches them: the system ssh running `docker system
// dial-stdio` on the remote side. An sshd on 127.0.0.1 with its own host key, config and
// authorized key (all made here, in a temp dir) fronts the main engine; ssh is pointed at the
// test's ssh config with TRUEFORGE_SSH_COMMAND (git's GIT_SSH_COMMAND, for us), and the key is
// served by an ssh-agent (the user's agent is honoured). The full contract runs over it; an
// untrusted host key and an unknown key are typed ENGINE_SSH errors, fast.

import { ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync, chmodSync, readFileSync } from 'node:fs'
import net from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'

import { BUSYBOX, cleanupNamespace, uniqueNamespace } from '../helpers'

jest.setTimeout(90_000)

const namespace = uniqueNamespace('t-ssh')
const CHILD = path.join(__dirname, 'child.js')
const CLI = path.resolve(__dirname, '..', '..', 'cli', 'index.js')
const ENV_KEYS = [
  'DOCKER_HOST',
  'DOCKER_TLS_VERIFY',
  'DOCKER_TLS',
  'DOCKER_CERT_PATH',
  'DOCKER_CONTEXT',
  'DOCKER_CONFIG',
  'SSH_AUTH_SOCK',
  'TRUEFORGE_SSH_COMMAND',
]
let dir = ''
let port = 0
let sshd: ChildProcess | undefined
let agentPid = 0
let agentSock = ''

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer()
    s.listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port
      s.close(() => resolve(p))
    })
    s.on('error', reject)
  })
}

beforeAll(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'tf-ssh-'))
  port = await freePort()
  const f = (n: string) => path.join(dir, n)
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', f('host_key')])
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', f('user_key')])
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', f('stranger_key')])
  writeFileSync(f('authorized_keys'), readFileSync(f('user_key.pub')))
  chmodSync(f('authorized_keys'), 0o600)
  writeFileSync(
    f('sshd_config'),
    [
      `Port ${port}`,
      'ListenAddress 127.0.0.1',
      `HostKey ${f('host_key')}`,
      `AuthorizedKeysFile ${f('authorized_keys')}`,
      `PidFile ${f('sshd.pid')}`,
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'PermitRootLogin prohibit-password',
      'UsePAM no',
      'StrictModes no',
      'Subsystem sftp internal-sftp',
      '',
    ].join('\n'),
  )
  execFileSync('mkdir', ['-p', '/run/sshd'])
  sshd = spawn('/usr/sbin/sshd', ['-D', '-e', '-f', f('sshd_config')], { stdio: ['ignore', 'ignore', 'pipe'] })
  // The client side: known_hosts holding the test host key, and a config for 127.0.0.1.
  const hostPub = readFileSync(f('host_key.pub'), 'utf8').trim().split(' ').slice(0, 2).join(' ')
  writeFileSync(f('known_hosts'), `[127.0.0.1]:${port} ${hostPub}\n`)
  writeFileSync(f('empty_known_hosts'), '')
  writeFileSync(
    f('ssh_config'),
    `Host 127.0.0.1\n  User root\n  UserKnownHostsFile ${f('known_hosts')}\n  IdentitiesOnly no\n  IdentityFile none\n`,
  )
  writeFileSync(
    f('ssh_config_untrusted'),
    `Host 127.0.0.1\n  User root\n  UserKnownHostsFile ${f('empty_known_hosts')}\n  IdentityFile none\n`,
  )
  // An agent holding the user key: ssh uses it through SSH_AUTH_SOCK, as for a real user.
  agentSock = f('agent.sock')
  const agent = execFileSync('ssh-agent', ['-a', agentSock], { encoding: 'utf8' })
  agentPid = Number(/SSH_AGENT_PID=(\d+)/.exec(agent)![1])
  execFileSync('ssh-add', ['-q', f('user_key')], { env: { ...process.env, SSH_AUTH_SOCK: agentSock } })
  // Wait until sshd answers.
  for (let i = 0; i < 100; i++) {
    const r = spawnSync(
      'ssh',
      ['-F', f('ssh_config'), '-o', 'BatchMode=yes', '-p', String(port), '127.0.0.1', 'true'],
      {
        env: { ...process.env, SSH_AUTH_SOCK: agentSock },
        timeout: 10_000,
      },
    )
    if (r.status === 0) return
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error('sshd did not come up')
}, 60_000)

afterAll(() => {
  if (sshd && sshd.exitCode === null) sshd.kill('SIGTERM')
  if (agentPid) {
    try {
      process.kill(agentPid, 'SIGTERM')
    } catch {}
  }
  cleanupNamespace(namespace)
  if (dir) rmSync(dir, { recursive: true, force: true })
})

function sshEnv(config = 'ssh_config', agent = true): Record<string, string> {
  const base: Record<string, string> = {}
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !ENV_KEYS.includes(k)) base[k] = v
  base.TRUEFORGE_SSH_COMMAND = `ssh -F ${path.join(dir, config)}`
  if (agent) base.SSH_AUTH_SOCK = agentSock
  return base
}

function inChild(env: Record<string, string>, options: Record<string, unknown> = {}) {
  const opts = { image: BUSYBOX, namespace, engineTimeoutMs: 20_000, ...options }
  const out = execFileSync(process.execPath, [CHILD, JSON.stringify(opts)], { env, encoding: 'utf8', timeout: 60_000 })
  return JSON.parse(out.trim().split('\n').pop()!)
}

test('the contract over ssh://root@127.0.0.1:PORT: create, exec, upload, download, remove; DOCKER_HOST too', () => {
  const host = `ssh://root@127.0.0.1:${port}`
  const r = inChild(sshEnv(), { dockerHost: host })
  expect(r.error).toBeUndefined()
  expect(r.dockerHost).toBe(host)
  expect(r.exec).toEqual({ success: true, response: { exitCode: 0, result: `over-tls\n${r.sandboxId}\n` } })
  expect(r.downloaded).toBe('tls bytes')
  const viaEnv = inChild({ ...sshEnv(), DOCKER_HOST: `ssh://127.0.0.1:${port}` })
  expect(viaEnv.error).toBeUndefined()
  expect(viaEnv.exec.success).toBe(true)
})

test('the TrueForge contract suite (contract.test.ts) passes over ssh://, the docker CLI of its cleanup included', () => {
  // An `ssh` on PATH that reads the test's ssh config: what a user's ~/.ssh/config does for
  // both the docker CLI and the provider, which run the system ssh.
  const bin = path.join(dir, 'bin')
  execFileSync('mkdir', ['-p', bin])
  writeFileSync(path.join(bin, 'ssh'), `#!/bin/sh\nexec /usr/bin/ssh -F ${path.join(dir, 'ssh_config')} "$@"\n`)
  chmodSync(path.join(bin, 'ssh'), 0o755)
  const env = sshEnv()
  delete env.TRUEFORGE_SSH_COMMAND
  env.PATH = `${bin}:${env.PATH}`
  env.DOCKER_HOST = `ssh://root@127.0.0.1:${port}`
  const jest = path.resolve(__dirname, '..', '..', 'node_modules', 'jest', 'bin', 'jest.js')
  const r = spawnSync(process.execPath, [jest, '--ci', '__test__/contract.test.ts'], {
    cwd: path.resolve(__dirname, '..', '..'),
    env,
    encoding: 'utf8',
    timeout: 120_000,
  })
  expect(r.stderr).toMatch(/Tests:\s+4 passed, 4 total/)
  expect(r.status).toBe(0)
}, 150_000)

test('an untrusted host key and a key the server does not accept: ENGINE_SSH naming the host and the fix, fast', () => {
  const host = `ssh://root@127.0.0.1:${port}`
  const untrusted = inChild(sshEnv('ssh_config_untrusted'), { dockerHost: host })
  expect(untrusted.error.code).toBe('ENGINE_SSH')
  expect(untrusted.error.name).toBe('SandboxEngineError')
  expect(untrusted.error.message).toContain(host)
  expect(untrusted.error.message).toMatch(/Host key verification failed.*Fix: the host key is not trusted/)
  expect(untrusted.ms).toBeLessThan(10_000)
  const noKey = inChild(sshEnv('ssh_config', false), { dockerHost: host })
  expect(noKey.error.code).toBe('ENGINE_SSH')
  expect(noKey.error.message).toMatch(/Permission denied.*Fix: .*ssh-add/)
})

test('doctor over SSH says how it connected and runs the test sandbox', () => {
  const r = spawnSync(
    process.execPath,
    [CLI, 'doctor', '--docker-host', `ssh://root@127.0.0.1:${port}`, '--image', BUSYBOX, '--namespace', namespace],
    {
      env: sshEnv(),
      encoding: 'utf8',
      timeout: 60_000,
    },
  )
  expect(r.stdout).toMatch(/^ok {4}endpoint: SSH: ssh:\/\/root@127\.0\.0\.1:\d+/m)
  expect(r.stdout).toMatch(/^ok {4}test sandbox: create \d+ ms/m)
  expect(r.status).toBe(0)
})
