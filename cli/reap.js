'use strict'

// `trueforge-docker-sandbox reap`: removes sandboxes stopped for longer than the delete
// interval, for cron or a systemd timer when no server process runs the background reaper.

const { reapSandboxes } = require('../index.js')
const { parseArgs } = require('./common')

const USAGE = `usage: trueforge-docker-sandbox reap [--namespace N] [--docker-host H] [--older-than-minutes M] [--dry-run]

Removes this namespace's sandbox containers (label trueforge.sandbox.managed-by=trueforge-docker-sandbox)
that have been stopped for at least M minutes (default 7200, as autoDeleteIntervalInMinutes).
Running containers and containers that are not ours are never touched.`

/** @type {Record<string, 'string' | 'number' | 'boolean'>} */
const SPEC = {
  '--namespace': 'string',
  '--docker-host': 'string',
  '--older-than-minutes': 'number',
  '--dry-run': 'boolean',
}

async function run(argv, out) {
  const { _, help, ...opts } = parseArgs(argv, SPEC, {
    positionals: false,
    unknown: (_flag, arg) => `unknown argument ${arg}`,
    badNumber: (flag) => `${flag} needs a number of minutes >= 0`,
  })
  if (help) return (out.log(USAGE), 0)
  const { removed } = await reapSandboxes(opts)
  const verb = opts.dryRun ? 'would remove' : 'removed'
  out.log(`${verb} ${removed.length} sandbox(es) in namespace '${opts.namespace ?? 'default'}'`)
  for (const id of removed) out.log(`  ${id}`)
  return 0
}

module.exports = { run, USAGE }
