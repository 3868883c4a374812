'use strict'

// Small statistics helpers: percentiles by linear interpolation between closest ranks (the
// usual "type 7"), so p50 of an even count is the mean of the middle two and p95 of 5 samples
// lies between the two slowest.

function percentile(values, p) {
  if (!values.length) return NaN
  const s = [...values].sort((a, b) => a - b)
  const pos = (s.length - 1) * (p / 100)
  const lo = Math.floor(pos)
  const hi = Math.ceil(pos)
  return s[lo] + (s[hi] - s[lo]) * (pos - lo)
}

function summarize(values) {
  return {
    n: values.length,
    p50: percentile(values, 50),
    p95: percentile(values, 95),
    min: values.length ? Math.min(...values) : NaN,
    max: values.length ? Math.max(...values) : NaN,
  }
}

/** Decimal megabytes per second for `bytes` moved in `ms`. */
function mbps(bytes, ms) {
  return bytes / 1e6 / (ms / 1000)
}

function fmtMs(ms) {
  if (!Number.isFinite(ms)) return '-'
  return ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2)
}

function fmtNum(x, digits = 1) {
  return Number.isFinite(x) ? x.toFixed(digits) : '-'
}

function fmtRatio(x) {
  return Number.isFinite(x) ? `${x.toFixed(2)}×` : '-'
}

/** A difference with its sign, `+` or `−` (a bare `+` before a negative number reads `+-`). */
function fmtSigned(x, fmt = String) {
  if (!Number.isFinite(Number(x))) return '-'
  return Number(x) < 0 ? `−${fmt(-Number(x))}` : `+${fmt(Number(x))}`
}

function fmtBytes(b) {
  if (!Number.isFinite(b)) return '-'
  const mib = b / (1024 * 1024)
  return `${mib.toFixed(1)} MiB`
}

module.exports = { percentile, summarize, mbps, fmtMs, fmtNum, fmtRatio, fmtSigned, fmtBytes }
