'use strict'

// The docker CLI through child processes, one process per operation (as a shell script or a
// naive Node wrapper would do it):
//   create   = docker run -d --init (same keep-alive command)
//   exec     = docker exec CONTAINER sh -c COMMAND
//   upload   = docker cp - CONTAINER:DIR, a tar on stdin
//   download = docker cp CONTAINER:FILE -, a tar on stdout

const { spawn } = require('node:child_process')

const {
  SOCKET,
  IMAGE,
  NETWORK,
  KEEPALIVE_SCRIPT,
  KEEPALIVE_ARGS,
  benchLabels,
  tarHeader,
  tarTrailer,
  SingleFileReader,
  splitPath,
  layoutTar,
} = require('./common')

/**
 * Runs `docker args…`. `feed(stdin)` writes stdin (else it is closed at once); `onStdout`
 * consumes stdout as it arrives (else it is collected). Resolves { code, stdout, stderr }.
 */
function docker(args, { feed, onStdout, env } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn('docker', args, { stdio: ['pipe', 'pipe', 'pipe'], env })
    const out = []
    const err = []
    child.stdout.on('data', (c) => (onStdout ? onStdout(c) : out.push(c)))
    child.stderr.on('data', (c) => err.push(c))
    child.on('error', reject)
    child.stdin.on('error', () => {}) // a failed command may close stdin early; the exit code tells
    child.on('close', (code) =>
      resolve({ code, stdout: Buffer.concat(out), stderr: Buffer.concat(err).toString('utf8') }),
    )
    if (feed) feed(child.stdin)
    else child.stdin.end()
  })
}

async function must(args, opts) {
  const r = await docker(args, opts)
  if (r.code !== 0) throw new Error(`docker ${args[0]} exited ${r.code}: ${r.stderr.trim()}`)
  return r
}

function create({ socket = SOCKET } = {}) {
  const env = { ...process.env, DOCKER_HOST: `unix://${socket}` }
  const run = (args, opts = {}) => docker(args, { ...opts, env })
  const runOk = (args, opts = {}) => must(args, { ...opts, env })
  const made = new Set()
  let seq = 0
  const labelArgs = Object.entries(benchLabels('cli')).flatMap(([k, v]) => ['--label', `${k}=${v}`])
  if (NETWORK) labelArgs.push('--network', NETWORK)

  async function createSandbox() {
    // Named by us, so a `docker run` that fails after creating the container (at start, say)
    // still leaves something cleanup can name.
    const name = `trueforge-bench-cli-${process.pid}-${(seq++).toString(36)}-${Math.random().toString(36).slice(2, 8)}`
    made.add(name)
    // create, copy the layout in, start: what `docker run` alone cannot do.
    const r = await runOk([
      'create',
      '--init',
      '--name',
      name,
      ...labelArgs,
      '--entrypoint',
      '/bin/sh',
      IMAGE,
      '-c',
      KEEPALIVE_SCRIPT,
      ...KEEPALIVE_ARGS,
    ])
    const id = r.stdout.toString().trim()
    await runOk(['cp', '-', `${id}:/`], { feed: (stdin) => stdin.end(layoutTar()) })
    await runOk(['start', id])
    made.delete(name)
    made.add(id)
    return id
  }

  async function exec(id, command) {
    const r = await run(['exec', id, 'sh', '-c', command])
    // The CLI reports its own failures as 125/126/127 with a message on stderr.
    if (r.code === 125) throw new Error(`docker exec failed: ${r.stderr.trim()}`)
    return { exitCode: r.code, output: r.stdout.toString('utf8') + r.stderr }
  }

  async function upload(id, remotePath, content) {
    const { dir, name } = splitPath(remotePath)
    await runOk(['cp', '-', `${id}:${dir}`], {
      feed: (stdin) => {
        stdin.write(tarHeader(name, content.length))
        stdin.write(content)
        stdin.end(tarTrailer(content.length))
      },
    })
  }

  async function download(id, remotePath) {
    const reader = new SingleFileReader()
    let parseError = null
    await runOk(['cp', `${id}:${remotePath}`, '-'], {
      onStdout: (c) => {
        if (parseError || reader.done) return
        try {
          reader.push(c)
        } catch (e) {
          parseError = e
        }
      },
    })
    if (parseError) throw parseError
    return reader.result()
  }

  async function remove(id) {
    const r = await run(['rm', '-f', '-v', id])
    if (r.code !== 0 && !/No such container/i.test(r.stderr)) throw new Error(`docker rm: ${r.stderr.trim()}`)
    made.delete(id)
  }

  async function cleanup() {
    await Promise.allSettled([...made].map((id) => remove(id)))
  }

  return { name: 'cli', createSandbox, exec, upload, download, remove, cleanup }
}

module.exports = { create }
