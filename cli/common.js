'use strict'

// Shared by the commands: argument parsing, the binding with its coded errors turned into the
// package's error classes (as the provider throws them), and output that is coloured only on a
// terminal (plain lines otherwise, and never with NO_COLOR).

const util = require('node:util')

const binding = require('../lib/loader.js')
const { translated } = require('../lib/errors.js')

const ADMIN_FUNCTIONS = [
  'listSandboxes',
  'removeSandboxes',
  'removeStoppedSandboxes',
  'listImageWorkLeases',
  'removeImageWorkLeases',
  'describeEndpoint',
  'engineReport',
]
const native = Object.fromEntries(
  ADMIN_FUNCTIONS.map((name) => [name, (...args) => translated(() => binding[name](...args))]),
)

/** A mistake in how a command was called: printed with its usage, exit code 2 (other errors: 1). */
class UsageError extends Error {
  name = 'UsageError'
}

/**
 * Parses `argv` by `spec` ({ '--flag': 'string' | 'number' | 'boolean' }) with node:util's
 * parseArgs; `-h`/`--help` are always known. Options land camel-cased, positionals in `_`. A string
 * option takes the next argument whatever it is, or `--flag=value`; the last one given wins.
 * Anything else is a UsageError: an unknown option (a short group such as `-hx` is one unknown
 * option, as is `--`), a missing value, a number that is not >= 0, and, with `positionals:
 * false`, any positional. `unknown` and `badNumber` word those messages.
 * @param {string[]} argv
 * @param {Record<string, 'string' | 'number' | 'boolean'>} spec
 */
function parseArgs(
  argv,
  spec,
  {
    positionals = true,
    unknown = (/** @type {string} */ flag, /** @type {string} */ _arg) => `unknown option ${flag}`,
    badNumber = (/** @type {string} */ flag) => `${flag} needs a number >= 0`,
  } = {},
) {
  /** @type {Record<string, { type: 'string' | 'boolean', short?: string }>} */
  const options = { help: { type: 'boolean', short: 'h' } }
  for (const [flag, kind] of Object.entries(spec)) {
    options[flag.slice(2)] = { type: kind === 'boolean' ? 'boolean' : 'string' }
  }
  // Not strict: the tokens say what was given, and the checks below word each mistake.
  const { tokens } = util.parseArgs({ args: argv, options, strict: false, allowPositionals: true, tokens: true })
  /** @type {Record<string, any> & { _: string[] }} */
  const opts = { _: [] }
  let last = -1
  for (const token of tokens) {
    // A short group (`-hx`) is several tokens of one argument: the first decides.
    if (token.index === last) continue
    last = token.index
    const arg = argv[token.index]
    const eq = arg.indexOf('=')
    const flag = eq > 0 ? arg.slice(0, eq) : arg
    if (token.kind === 'positional') {
      if (!positionals) throw new UsageError(unknown(arg, arg))
      opts._.push(token.value)
      continue
    }
    if (token.kind !== 'option' || token.rawName !== flag || !Object.hasOwn(options, token.name)) {
      throw new UsageError(unknown(flag, arg))
    }
    const key = token.name.replace(/-([a-z])/g, (_, c) => c.toUpperCase())
    const kind = token.name === 'help' ? 'boolean' : spec[`--${token.name}`]
    if (kind === 'boolean') {
      opts[key] = true
      continue
    }
    if (token.value === undefined) throw new UsageError(`${flag} needs a value`)
    if (kind === 'number') {
      const n = Number(token.value)
      if (!Number.isFinite(n) || n < 0) throw new UsageError(badNumber(flag))
      opts[key] = n
    } else opts[key] = token.value
  }
  return opts
}

/** The flags `ls` and `rm` share: which engine and namespaces, output, deadline (`adminOptions`). */
/** @type {Record<string, 'string' | 'number' | 'boolean'>} */
const ADMIN_SPEC = {
  '--namespace': 'string',
  '--all-namespaces': 'boolean',
  '--docker-host': 'string',
  '--json': 'boolean',
  '--timeout-ms': 'number',
}

function adminOptions(opts) {
  return {
    dockerHost: opts.dockerHost,
    namespace: opts.namespace,
    allNamespaces: opts.allNamespaces,
    timeoutMs: opts.timeoutMs,
  }
}

const tty = Boolean(process.stdout.isTTY) && !process.env.NO_COLOR
const paint = (code) => (s) => (tty ? `\u001b[${code}m${s}\u001b[0m` : s)
const colour = { green: paint('32'), yellow: paint('33'), red: paint('31'), dim: paint('2'), bold: paint('1') }

/** Left-aligned columns, two spaces apart. */
function table(rows) {
  if (rows.length === 0) return ''
  const widths = rows[0].map((_, i) => Math.max(...rows.map((r) => String(r[i]).length)))
  return rows
    .map((r) => r.map((c, i) => (i === r.length - 1 ? String(c) : String(c).padEnd(widths[i]))).join('  '))
    .join('\n')
}

function iso(epochSeconds) {
  return epochSeconds == null ? '-' : new Date(epochSeconds * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z')
}

/** A duration in seconds as `45s`, `3m`, `2h5m` or `1d3h`. */
function ago(seconds) {
  const s = Math.max(0, Math.floor(seconds))
  if (s < 60) return `${s}s`
  if (s < 3600) return `${Math.floor(s / 60)}m`
  if (s < 86400) return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60) || ''}${s % 3600 >= 60 ? 'm' : ''}`
  return `${Math.floor(s / 86400)}d${Math.floor((s % 86400) / 3600) || ''}${s % 86400 >= 3600 ? 'h' : ''}`
}

/** One line, at most `max` characters. */
function short(text, max = 100) {
  const line = String(text ?? '').replace(/\s+/g, ' ')
  return line.length > max ? `${line.slice(0, max - 1)}…` : line
}

/** The container name of an image-work lease (src/images/work.rs `lease_name`). */
const LEASE_NAME = /^trueforge-imagework-[0-9a-f]{32}$/

function bytes(n) {
  if (n == null) return '-'
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let i = 0
  let v = n
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024
    i++
  }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`
}

module.exports = {
  native,
  UsageError,
  parseArgs,
  ADMIN_SPEC,
  adminOptions,
  colour,
  table,
  iso,
  ago,
  short,
  bytes,
  tty,
  LEASE_NAME,
}
