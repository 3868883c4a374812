'use strict'

// `trueforge-docker-sandbox ls`: this package's sandboxes on one engine.

const { native, parseArgs, ADMIN_SPEC, adminOptions, table, iso, bytes } = require('./common')

const USAGE = `usage: trueforge-docker-sandbox ls [--namespace N | --all-namespaces] [--docker-host H] [--json]

Lists the sandboxes of namespace N (default 'default') or of every namespace: id, state, created,
last activity, image, tenant, whether it is an unclaimed warm-pool member, and the size of its
writable layer when the engine says. Only containers this package made are listed.`

const SPEC = ADMIN_SPEC

async function run(argv, out) {
  const opts = parseArgs(argv, SPEC)
  if (opts.help) return (out.log(USAGE), 0)
  if (opts._.length) throw new Error(`unexpected argument ${opts._[0]}`)
  const list = await native.listSandboxes(adminOptions(opts))
  if (opts.json) {
    out.log(JSON.stringify(list, null, 2))
    return 0
  }
  const rows = [['SANDBOX ID', 'NAMESPACE', 'STATE', 'CREATED', 'LAST ACTIVITY', 'IMAGE', 'TENANT', 'POOL', 'SIZE']]
  for (const s of list) {
    rows.push([
      s.sandboxId,
      s.namespace,
      s.state,
      iso(s.created),
      iso(s.lastActivity),
      s.image,
      s.tenant ?? '-',
      s.poolMember ? 'yes' : 'no',
      bytes(s.sizeBytes),
    ])
  }
  out.log(list.length ? table(rows) : 'no sandboxes')
  return 0
}

module.exports = { run, USAGE }
