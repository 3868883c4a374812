'use strict'

// Wiring for the TrueForge agent server: turns a stored `type: 'docker'` sandbox-provider manifest
// (snake_case, as TrueForge keeps its provider settings) and what the server knows at construction
// time (tenant, its error classes, its logger, its download limit) into DockerSandboxProvider
// options. Pure: it reaches no engine. Bad fields are refused the way the constructor refuses bad
// options (a TypeError with code 'INVALID_OPTION'), with `option` naming the manifest's field.
//
//   const provider = new DockerSandboxProvider(fromTrueForgeManifest(record.manifest, context))

const { optionError } = require('./errors.js')

// Manifest field -> constructor option.
const MANIFEST_FIELDS = {
  type: null,
  image: 'image',
  exec_timeout_ms: 'execTimeoutMs',
  auto_stop_interval_in_minutes: 'autoStopIntervalInMinutes',
  auto_delete_interval_in_minutes: 'autoDeleteIntervalInMinutes',
  gpus: 'gpus',
  namespace: 'namespace',
  egress: 'egress',
}

// Context key -> constructor option.
const CONTEXT_KEYS = {
  tenantName: 'tenantName',
  errors: 'errors',
  logger: 'logger',
  fileMaxBytesForDownload: 'fileMaxBytes',
  dockerHost: 'dockerHost',
}

// The constructor's own limits for the fields whose names differ between the two spellings, so a
// refusal always names the field the operator wrote.
const MAX_EXEC_TIMEOUT_MS = 7 * 24 * 3600 * 1000
const MAX_MINUTES = 5_256_000
const MAX_FILE_BYTES = 1024 * 1024 * 1024

function isPlainObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v)
}

function describe(v) {
  if (typeof v === 'string') return JSON.stringify(v)
  if (typeof v === 'number' || typeof v === 'boolean' || v === null) return String(v)
  return Array.isArray(v) ? 'an array' : `a ${typeof v}`
}

function wholePositive(field, v, max) {
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0 || !Number.isInteger(v)) {
    throw optionError(field, `expected a positive whole number of milliseconds, got ${describe(v)}`)
  }
  if (v > max) throw optionError(field, `${v} is above the maximum ${max}`)
  return v
}

function minutes(field, v) {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0 || v > MAX_MINUTES) {
    throw optionError(field, `expected minutes from 0 (never) to ${MAX_MINUTES}, got ${describe(v)}`)
  }
  return v
}

/**
 * Maps a TrueForge `type: 'docker'` sandbox-provider manifest and the server's context to
 * DockerSandboxProvider options.
 */
function fromTrueForgeManifest(manifest, context) {
  if (!isPlainObject(manifest)) {
    throw optionError('manifest', "expected an object such as { type: 'docker', image: 'trueforge-sandbox:2' }")
  }
  for (const key of Object.keys(manifest)) {
    if (!Object.hasOwn(MANIFEST_FIELDS, key)) {
      throw optionError(
        key,
        `unknown field of a docker manifest; known ones are ${Object.keys(MANIFEST_FIELDS).join(', ')}`,
      )
    }
  }
  if (manifest.type !== 'docker') {
    throw optionError('type', `expected 'docker', got ${describe(manifest.type)}`)
  }

  const options = {}
  const present = (k) => manifest[k] !== undefined && manifest[k] !== null

  if (!present('image')) throw optionError('image', 'required: the image every sandbox runs')
  if (typeof manifest.image !== 'string') {
    throw optionError('image', `expected a string such as 'trueforge-sandbox:2', got ${describe(manifest.image)}`)
  }
  options.image = manifest.image
  if (present('exec_timeout_ms')) {
    options.execTimeoutMs = wholePositive('exec_timeout_ms', manifest.exec_timeout_ms, MAX_EXEC_TIMEOUT_MS)
  }
  for (const field of ['auto_stop_interval_in_minutes', 'auto_delete_interval_in_minutes']) {
    if (present(field)) options[MANIFEST_FIELDS[field]] = minutes(field, manifest[field])
  }
  if (present('gpus')) {
    const g = manifest.gpus
    const ok = g === 'all' || typeof g === 'number' || (Array.isArray(g) && g.every((d) => typeof d === 'string'))
    if (!ok) throw optionError('gpus', `expected 'all', a count or a list of device ids, got ${describe(g)}`)
    // Range and device-id rules are the constructor's; it names the same field, `gpus`.
    options.gpus = Array.isArray(g) ? [...g] : g
  }
  if (present('namespace')) {
    if (typeof manifest.namespace !== 'string') {
      throw optionError(
        'namespace',
        `expected a string of [a-z0-9-], 1 to 32 long, got ${describe(manifest.namespace)}`,
      )
    }
    options.namespace = manifest.namespace
  }
  if (present('egress')) {
    // Passed through as given ('open', 'none' or a policy object); the constructor checks its shape
    // and every entry, and names `egress` when it refuses one. Copied, so the options share no
    // array or object with the stored manifest.
    options.egress = structuredClone(manifest.egress)
  }

  if (context === undefined || context === null) return options
  if (!isPlainObject(context)) throw optionError('context', 'expected an object such as { tenantName, errors, logger }')
  for (const [key, value] of Object.entries(context)) {
    if (!Object.hasOwn(CONTEXT_KEYS, key)) {
      throw optionError(`context.${key}`, `unknown context key; known ones are ${Object.keys(CONTEXT_KEYS).join(', ')}`)
    }
    if (value === undefined || value === null) continue
    if (key === 'tenantName' && typeof value !== 'string') {
      throw optionError('context.tenantName', `expected a string, got ${describe(value)}`)
    }
    if (key === 'dockerHost' && typeof value !== 'string') {
      throw optionError('context.dockerHost', `expected a string, got ${describe(value)}`)
    }
    if (key === 'fileMaxBytesForDownload') {
      if (typeof value !== 'number' || !Number.isInteger(value) || value <= 0 || value > MAX_FILE_BYTES) {
        throw optionError(
          'context.fileMaxBytesForDownload',
          `expected a whole number of bytes from 1 to ${MAX_FILE_BYTES}, got ${describe(value)}`,
        )
      }
    }
    // `errors` and `logger` are checked by the constructor, which names them the same way.
    options[CONTEXT_KEYS[key]] = value
  }
  return options
}

module.exports = { fromTrueForgeManifest }
