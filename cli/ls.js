'use strict'

// `trueforge-docker-sandbox ls`: this package's sandboxes on one engine, and with
// --all-namespaces the image-work leases too (they belong to no namespace).

const { native, UsageError, parseArgs, ADMIN_SPEC, adminOptions, table, iso, ago, short, bytes } = require('./common')

const USAGE = `usage: trueforge-docker-sandbox ls [--namespace N | --all-namespaces] [--docker-host H] [--json]

Lists the sandboxes of namespace N (default 'default') or of every namespace: id, state, created,
last activity, image, tenant, whether it is an unclaimed warm-pool member, and the size of its
writable layer when the engine says. With --all-namespaces, also the image-work leases: the
engine-wide record of a pull or build (container trueforge-imagework-<hash>), which a failed or
interrupted one leaves behind: state (running, failed, silent: its server process died), work,
image, holder, when its holder last wrote it, and why it failed ('rm --image-work' removes the
left ones). Only containers this package made are listed. In --json, every row has a 'kind':
'sandbox' or 'image-work lease'.`

const SPEC = ADMIN_SPEC

async function run(argv, out) {
  const opts = parseArgs(argv, SPEC)
  if (opts.help) return (out.log(USAGE), 0)
  if (opts._.length) throw new UsageError(`unexpected argument ${opts._[0]}`)
  const list = await native.listSandboxes(adminOptions(opts))
  const leases = opts.allNamespaces ? await native.listImageWorkLeases(adminOptions(opts)) : []
  if (opts.json) {
    out.log(JSON.stringify([...list.map((s) => ({ kind: 'sandbox', ...s })), ...leases], null, 2))
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
  if (leases.length) {
    const lines = [['IMAGE-WORK LEASE', 'STATE', 'WORK', 'IMAGE', 'HOLDER', 'CREATED', 'LAST HEARD', 'REASON']]
    for (const l of leases) {
      lines.push([
        l.container,
        l.state,
        l.work,
        l.image,
        l.holder,
        iso(l.created),
        `${ago(l.ageSeconds)} ago`,
        short(l.reason ?? '-'),
      ])
    }
    out.log(`\n${table(lines)}`)
  }
  return 0
}

module.exports = { run, USAGE }
