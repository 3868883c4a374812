#!/usr/bin/env node
'use strict'

// The `trueforge-docker-sandbox` command: `reap`, `ls`, `rm` and `doctor`, one file each in
// this folder. A UsageError is printed with the command's usage and exits 2; any other error
// exits 1.

const { UsageError } = require('./common')

const COMMANDS = { reap: './reap.js', ls: './ls.js', rm: './rm.js', doctor: './doctor.js' }

// Output piped into `head` must not kill a command before it has cleaned up (doctor's test
// sandbox): a closed stdout is ignored.
process.stdout.on('error', (e) => {
  if (e.code !== 'EPIPE') throw e
})

async function main() {
  const [command, ...rest] = process.argv.slice(2)
  if (command === undefined || !Object.hasOwn(COMMANDS, command)) {
    const { USAGE } = require('./reap.js')
    console.error(`${USAGE}\n\nAlso: ls, rm, doctor (each with --help).`)
    process.exit(command === undefined || command === '-h' || command === '--help' ? 0 : 2)
  }
  const cmd = require(COMMANDS[command])
  try {
    process.exitCode = await cmd.run(rest, console)
  } catch (e) {
    const usage = e instanceof UsageError
    console.error(usage ? `${e.message}\n\n${cmd.USAGE}` : e instanceof Error ? e.message : String(e))
    process.exitCode = usage ? 2 : 1
  }
}

main().catch((e) => {
  console.error(e.message ?? e)
  process.exit(1)
})
