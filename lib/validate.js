'use strict'

// Every check of what a caller hands the provider, before anything reaches the binding. Each
// failure is the TypeError of errors.js (`INVALID_OPTION` naming the option, `INVALID_ARGUMENT`),
// except exec's, which the contract reports as `{ success: false, error }`.

const { CONTRACT_ERROR_NAMES, onHostBase, optionError, argumentError, fromNative } = require('./errors.js')

const LOG_LEVELS = ['debug', 'info', 'warn', 'error']

/**
 * The first value JSON cannot carry (NaN, ±Infinity, undefined or a hole in an array, a symbol,
 * a function, a bigint), as [path, description]; null when there is none.
 *
 * @param {unknown} value
 * @param {string} path
 * @returns {[string, string] | null}
 */
function unrepresentable(value, path) {
  switch (typeof value) {
    case 'number':
      return Number.isFinite(value) ? null : [path, String(value)]
    case 'symbol':
    case 'function':
    case 'bigint':
      return [path, `a ${typeof value}`]
    case 'object': {
      if (value === null) return null
      if (Array.isArray(value)) {
        for (let i = 0; i < value.length; i++) {
          if (!(i in value) || value[i] === undefined) return [`${path}[${i}]`, 'undefined']
          const bad = unrepresentable(value[i], `${path}[${i}]`)
          if (bad) return bad
        }
        return null
      }
      for (const [k, v] of Object.entries(value)) {
        if (v === undefined) continue
        const bad = unrepresentable(v, path ? `${path}.${k}` : k)
        if (bad) return bad
      }
      return null
    }
    default:
      return null
  }
}

/**
 * The classes to throw, by name. `injected` may be an object of constructors or a whole module
 * namespace (`import * as sandboxErrors from …`): the names we know are taken, other keys
 * ignored. A `SandboxError` in it is the host's base class: our request-error classes that the
 * host did not give are then rebuilt on it, so they are `instanceof` the host's base too.
 *
 * @param {unknown} injected
 * @returns {Record<string, import('./errors').ErrorClass>}
 */
function pickErrors(injected) {
  if (injected === undefined || injected === null) return {}
  if (typeof injected !== 'object' && typeof injected !== 'function') {
    throw optionError('errors', 'expected an object of error constructors, or the module that exports them')
  }
  const given = /** @type {Record<string, unknown>} */ (injected)
  const known = [...CONTRACT_ERROR_NAMES, 'SandboxError']
  /** @type {Record<string, any>} */
  const out = {}
  for (const name of known) {
    const ctor = given[name]
    if (ctor === undefined) continue
    if (typeof ctor !== 'function') throw optionError(`errors.${name}`, 'expected a constructor')
    out[name] = ctor
  }
  if (Object.keys(out).length === 0) {
    const first = Object.keys(given)[0]
    if (first !== undefined) {
      throw optionError(`errors.${first}`, `unknown error class; known ones are ${known.join(', ')}`)
    }
  }
  const { SandboxError: HostBase, ...classes } = out
  return HostBase ? { ...onHostBase(HostBase), ...classes } : classes
}

/**
 * @param {unknown} logger
 * @returns {import('../index').SandboxLogger | undefined}
 */
function pickLogger(logger) {
  if (logger === undefined || logger === null) return undefined
  if (typeof logger !== 'object' && typeof logger !== 'function') {
    throw optionError('logger', 'expected an object with debug/info/warn/error methods')
  }
  const methods = /** @type {Record<string, unknown>} */ (logger)
  for (const level of LOG_LEVELS) {
    if (methods[level] !== undefined && typeof methods[level] !== 'function') {
      throw optionError(`logger.${level}`, 'expected a function')
    }
  }
  return /** @type {import('../index').SandboxLogger} */ (logger)
}

/**
 * What is wrong with exec's parameters, as the `error` of a `{ success: false }`; null when
 * nothing is.
 *
 * @param {unknown} params
 * @returns {string | null}
 */
function execParamsError(params) {
  if (params === null || typeof params !== 'object') {
    return 'exec: expected { sandboxId, command, cwd?, env?, timeoutSeconds? }'
  }
  const { sandboxId, command, cwd, env, timeoutSeconds } = /** @type {Record<string, unknown>} */ (params)
  if (typeof sandboxId !== 'string') return 'exec: `sandboxId` must be a string'
  if (typeof command !== 'string') return 'exec: `command` must be a string'
  if (cwd !== undefined && cwd !== null && typeof cwd !== 'string') return 'exec: `cwd` must be a string'
  if (env !== undefined && env !== null) {
    if (typeof env !== 'object' || Array.isArray(env)) return 'exec: `env` must be an object of strings'
    for (const [k, v] of Object.entries(env)) {
      if (typeof v !== 'string') return `exec: env value of ${JSON.stringify(k)} must be a string`
    }
  }
  if (timeoutSeconds !== undefined && timeoutSeconds !== null) {
    if (typeof timeoutSeconds !== 'number' || !Number.isFinite(timeoutSeconds) || timeoutSeconds <= 0) {
      return 'exec: `timeoutSeconds` must be a positive number'
    }
  }
  return null
}

/**
 * Throws `INVALID_ARGUMENT` for the first of `fields` that is not a string.
 *
 * @param {Record<string, unknown>} fields
 */
function requireStrings(fields) {
  for (const [k, v] of Object.entries(fields)) {
    if (typeof v !== 'string') throw argumentError(`\`${k}\` must be a string, got ${typeof v}`)
  }
}

// A UTF-16 code unit from U+D800 to U+DFFF that is not half of a pair. In `u` mode a regular
// expression reads pairs as one code point, so this matches only lone halves.
const LONE_SURROGATE = /\p{Cs}/u

/**
 * The path error (`SandboxInvalidPathError`, or the class the host gave for it) for a path
 * holding a lone UTF-16 surrogate: Rust strings cannot carry one, so it would reach the sandbox
 * silently replaced by U+FFFD, naming another file. Null when the path is well formed.
 *
 * @param {string} path
 * @param {Record<string, import('./errors').ErrorClass>} injected
 * @returns {unknown}
 */
function malformedPathError(path, injected) {
  if (!LONE_SURROGATE.test(path)) return null
  const message = `Invalid path ${JSON.stringify(path)}: it holds a lone UTF-16 surrogate (half of a pair, U+D800 to U+DFFF), which no file name can carry; pass well-formed Unicode`
  return fromNative({ code: 'INVALID_PATH', message, path }, injected)
}

function isNonEmptyString(v) {
  return typeof v === 'string' && v.length > 0
}

/**
 * TrueForge's Code Mode request shapes; null when the value is not one of them.
 *
 * @param {any} v
 * @returns {import('../index').CodeModeRequest | null}
 */
function parseCodeModeRequest(v) {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return null
  if (v.op === 'list_tools') {
    return isNonEmptyString(v.server) ? { op: 'list_tools', server: v.server } : null
  }
  if (v.op === 'call_tool') {
    if (!isNonEmptyString(v.server) || !isNonEmptyString(v.tool)) return null
    const args = v.arguments
    if (args === undefined) return { op: 'call_tool', server: v.server, tool: v.tool }
    if (args === null || typeof args !== 'object' || Array.isArray(args)) return null
    return { op: 'call_tool', server: v.server, tool: v.tool, arguments: args }
  }
  return null
}

module.exports = {
  unrepresentable,
  pickErrors,
  pickLogger,
  execParamsError,
  requireStrings,
  malformedPathError,
  parseCodeModeRequest,
}
