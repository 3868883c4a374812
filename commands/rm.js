'use strict'

// `trueforge-docker-sandbox rm`: removes sandboxes of this package, by id or all stopped ones.

const { native, parseArgs, ADMIN_SPEC, adminOptions } = require('./common')

const USAGE = `usage: trueforge-docker-sandbox rm [--namespace N | --all-namespaces] [--docker-host H] [--json] <sandbox-id>...
       trueforge-docker-sandbox rm --stopped [--older-than-minutes M] [--namespace N | --all-namespaces] [--docker-host H] [--json]

Removes the given sandboxes (forced, with their volumes), or every stopped one (stopped for at
least M minutes, default 0). Only containers this package made are ever removed; an id that is
not one of ours is reported as not found (exit code 1).`

const SPEC = { ...ADMIN_SPEC, '--stopped': 'boolean', '--older-than-minutes': 'number' }

async function run(argv, out) {
  const opts = parseArgs(argv, SPEC)
  if (opts.help) return (out.log(USAGE), 0)
  if (opts.stopped) {
    if (opts._.length) throw new Error('give ids or --stopped, not both')
    const removed = await native.removeStoppedSandboxes(adminOptions(opts), opts.olderThanMinutes ?? 0)
    if (opts.json)
      out.log(
        JSON.stringify(
          removed.map((sandboxId) => ({ sandboxId, outcome: 'removed' })),
          null,
          2,
        ),
      )
    else {
      for (const id of removed) out.log(`removed ${id}`)
      out.log(`removed ${removed.length} stopped sandbox(es)`)
    }
    return 0
  }
  if (opts.olderThanMinutes !== undefined) throw new Error('--older-than-minutes goes with --stopped')
  if (!opts._.length) throw new Error('give at least one sandbox id, or --stopped')
  const results = await native.removeSandboxes(adminOptions(opts), opts._)
  if (opts.json) out.log(JSON.stringify(results, null, 2))
  else
    for (const r of results)
      out.log(
        r.outcome === 'removed'
          ? `removed ${r.sandboxId}`
          : `not found ${r.sandboxId} (no sandbox of ours with that id)`,
      )
  return results.every((r) => r.outcome === 'removed') ? 0 : 1
}

module.exports = { run, USAGE }
