'use strict'

// `trueforge-docker-sandbox rm`: removes sandboxes of this package, by id or all stopped ones,
// and the image-work leases failed or interrupted pulls and builds left, by name or all of them.

const { native, UsageError, parseArgs, ADMIN_SPEC, adminOptions, LEASE_NAME } = require('./common')

const USAGE = `usage: trueforge-docker-sandbox rm [--namespace N | --all-namespaces] [--docker-host H] [--json] <sandbox-id | lease-name>...
       trueforge-docker-sandbox rm [--stopped] [--image-work] [--older-than-minutes M] [--namespace N | --all-namespaces] [--docker-host H] [--json]

Removes the given sandboxes (forced, with their volumes) and image-work leases (by container
name, trueforge-imagework-<hash>, as 'ls --all-namespaces' lists them); or, with --stopped,
every stopped sandbox (stopped for at least M minutes, default 0); with --image-work, every
image-work lease a failed or interrupted pull or build left (last written at least M minutes
ago). Leases belong to no namespace: --namespace does not apply to them. A lease whose pull or
build is in progress is never removed (reported as in use). Only containers this package made
are ever removed; an id or name that is not one of ours is reported as not found, and anything
not removed makes the exit code 1.`

/** @type {Record<string, 'string' | 'number' | 'boolean'>} */
const SPEC = { ...ADMIN_SPEC, '--stopped': 'boolean', '--image-work': 'boolean', '--older-than-minutes': 'number' }

function line(r) {
  if (r.kind !== 'image-work lease')
    return r.outcome === 'removed'
      ? `removed ${r.sandboxId}`
      : `not found ${r.sandboxId} (no sandbox of ours with that id)`
  if (r.outcome === 'removed') return `removed ${r.container} (image-work lease of ${r.image})`
  if (r.outcome === 'in-use') return `in use ${r.container} (the work on ${r.image} is in progress; left alone)`
  return `not found ${r.container} (no image-work lease of ours with that name)`
}

/** Removes what the sweeps name: stopped sandboxes and/or left image-work leases. */
async function sweep(opts, out) {
  if (opts._.length) throw new UsageError('give ids and lease names, or --stopped / --image-work, not both')
  const results = []
  if (opts.stopped) {
    const removed = await native.removeStoppedSandboxes(adminOptions(opts), opts.olderThanMinutes ?? 0)
    results.push(...removed.map((sandboxId) => ({ sandboxId, outcome: 'removed' })))
  }
  const leases = opts.imageWork
    ? await native.removeImageWorkLeases(adminOptions(opts), null, opts.olderThanMinutes ?? 0)
    : []
  results.push(...leases)
  if (opts.json) out.log(JSON.stringify(results, null, 2))
  else {
    for (const r of results) out.log(line(r))
    if (opts.stopped) out.log(`removed ${results.length - leases.length} stopped sandbox(es)`)
    if (opts.imageWork) out.log(`removed ${leases.length} image-work lease(s)`)
  }
  return 0
}

async function run(argv, out) {
  const opts = parseArgs(argv, SPEC)
  if (opts.help) return (out.log(USAGE), 0)
  if (opts.stopped || opts.imageWork) return sweep(opts, out)
  if (opts.olderThanMinutes !== undefined)
    throw new UsageError('--older-than-minutes goes with --stopped or --image-work')
  if (!opts._.length) throw new UsageError('give at least one sandbox id or lease name, or --stopped / --image-work')
  const names = opts._.filter((a) => LEASE_NAME.test(a))
  const ids = opts._.filter((a) => !LEASE_NAME.test(a))
  const sandboxes = ids.length ? await native.removeSandboxes(adminOptions(opts), ids) : []
  const leases = names.length ? await native.removeImageWorkLeases(adminOptions(opts), names, null) : []
  // In the order given.
  const results = opts._.map((a) => (LEASE_NAME.test(a) ? leases.shift() : sandboxes.shift()))
  if (opts.json) out.log(JSON.stringify(results, null, 2))
  else for (const r of results) out.log(line(r))
  return results.every((r) => r.outcome === 'removed') ? 0 : 1
}

module.exports = { run, USAGE }
