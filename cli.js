#!/usr/bin/env node
'use strict'

// `trueforge-docker-sandbox reap`: removes sandboxes stopped for longer than the delete
// interval, for cron or a systemd timer when no server process runs the background reaper.

const { reapSandboxes } = require('./index.js')

const USAGE = `usage: trueforge-docker-sandbox reap [--namespace N] [--docker-host H] [--older-than-minutes M] [--dry-run]

Removes this namespace's sandbox containers (label trueforge.sandbox.managed-by=trueforge-docker-sandbox)
that have been stopped for at least M minutes (default 7200, as autoDeleteIntervalInMinutes).
Running containers and containers that are not ours are never touched.`

function parse(argv) {
  const opts = {}
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]
    const eq = arg.indexOf('=')
    const flag = eq > 0 ? arg.slice(0, eq) : arg
    const value = () => {
      if (eq > 0) return arg.slice(eq + 1)
      if (i + 1 >= argv.length) throw new Error(`${flag} needs a value`)
      return argv[++i]
    }
    switch (flag) {
      case '--namespace':
        opts.namespace = value()
        break
      case '--docker-host':
        opts.dockerHost = value()
        break
      case '--older-than-minutes': {
        const v = Number(value())
        if (!Number.isFinite(v) || v < 0) throw new Error('--older-than-minutes needs a number of minutes >= 0')
        opts.olderThanMinutes = v
        break
      }
      case '--dry-run':
        opts.dryRun = true
        break
      case '-h':
      case '--help':
        opts.help = true
        break
      default:
        throw new Error(`unknown argument ${arg}`)
    }
  }
  return opts
}

// The other commands live in commands/, one file each.
const COMMANDS = { ls: './commands/ls.js', rm: './commands/rm.js', doctor: './commands/doctor.js' }

// Output piped into `head` must not kill a command before it has cleaned up (doctor's test
// sandbox): a closed stdout is ignored.
process.stdout.on('error', (e) => {
  if (e.code !== 'EPIPE') throw e
})

async function main() {
  const [command, ...rest] = process.argv.slice(2)
  if (COMMANDS[command]) {
    const cmd = require(COMMANDS[command])
    let code
    try {
      code = await cmd.run(rest, console)
    } catch (e) {
      const message = e instanceof Error ? e.message : String(e)
      const usage = /^(unknown option|unexpected argument|give |--)/.test(message) || / needs /.test(message)
      console.error(usage ? `${message}\n\n${cmd.USAGE}` : message)
      code = usage ? 2 : 1
    }
    process.exitCode = code
    return
  }
  if (command !== 'reap') {
    console.error(`${USAGE}\n\nAlso: ls, rm, doctor (each with --help).`)
    process.exit(command === undefined || command === '-h' || command === '--help' ? 0 : 2)
  }
  let opts
  try {
    opts = parse(rest)
  } catch (e) {
    console.error(`${e.message}\n\n${USAGE}`)
    process.exit(2)
  }
  if (opts.help) {
    console.log(USAGE)
    return
  }
  const { removed } = await reapSandboxes(opts)
  const verb = opts.dryRun ? 'would remove' : 'removed'
  console.log(`${verb} ${removed.length} sandbox(es) in namespace '${opts.namespace ?? 'default'}'`)
  for (const id of removed) console.log(`  ${id}`)
}

main().catch((e) => {
  console.error(e.message ?? e)
  process.exit(1)
})
